/* memreclaim._core: module glue.
 *
 * Method table, module state, result types (PyStructSequence) and argument checks. The work is
 * done by procfs.c (RSS) and alloc.c (the allocator backends), which never touch Python objects.
 * Built for each interpreter (no limited API: free-threaded builds reject it), and safe without
 * the GIL and under per-interpreter GILs: the module state is written only by exec and read-only
 * after, the kept statm descriptor has its own lock (procfs.c), and the process-wide parts
 * (allocator detection, fork generation) are set once under pthread_once.
 */
#include "memreclaim.h"
#include "diag.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    PyTypeObject *trim_result_type;
    PyTypeObject *memory_stats_type;
    PyTypeObject *heap_stats_type;
    PyObject *unsupported_error; /* memreclaim.UnsupportedAllocatorError */
    PyObject *allocator_name;    /* str */
    const mr_backend *backend;
    mr_statm statm;  /* procfs.c locks it: the GIL does not serialise it on free-threaded builds */
    int statm_ready; /* set by exec: a zeroed state has fd 0, which is not ours */
} core_state;

static inline core_state *get_state(PyObject *module)
{
    return (core_state *)PyModule_GetState(module);
}

/* ---- result types --------------------------------------------------------------------------- */

static PyStructSequence_Field trim_result_fields[] = {
    {"released", "bytes given back: anonymous RSS before minus after, never negative "
                 "(None if /proc could not be read)"},
    {"rss_before", "resident bytes before the trim (None if /proc could not be read)"},
    {"rss_after", "resident bytes after the trim (None if /proc could not be read)"},
    {"anon_before", "anonymous resident bytes before the trim (None if unreadable)"},
    {"anon_after", "anonymous resident bytes after the trim (None if unreadable)"},
    {"seconds", "wall-clock seconds the trim took"},
    {"allocator", "the allocator serving malloc: glibc, jemalloc, mimalloc, tcmalloc or unknown"},
    {"method", "the call that was made, or 'none' when the allocator has no purge call"},
    {"pools_released", "empty pymalloc pools given back (0 unless pools=True)"},
    {"pools_bytes", "bytes given back from empty pymalloc pools (0 unless pools=True)"},
    {"via", "the forwarding LD_PRELOAD wrapper through which malloc reaches glibc, or None"},
    {"reason", "why trim() could not act (method 'none'), or None when it did"},
    {"parts", "dict: bytes each allocator gave back, measured around its own call: the process "
              "allocator's name, 'pymalloc' with pools=True, and one per library released "
              "(e.g. 'pyarrow'; None where /proc could not be read)"},
    {"thp_mode", "the transparent-huge-page mode read at this trim: 'always', 'madvise', "
                 "'never', or None when the kernel has no THP or the mode could not be read"},
    {"thp_marked", "bytes of the allocators' heap mappings marked MADV_NOHUGEPAGE after the trim "
                   "(whole mappings, those marked by earlier trims again): 0 unless thp_mode is "
                   "'always', None when they could not be marked (thp_reason says why)"},
    {"thp_reason", "why the heap was not marked under THP 'always' (or the mode could not be "
                   "read), else None"},
    {NULL, NULL},
};

static PyStructSequence_Desc trim_result_desc = {
    "memreclaim.TrimResult",
    "The outcome of trim(): what was given back to the kernel, measured from RSS.",
    trim_result_fields,
    16,
};

static PyStructSequence_Field memory_stats_fields[] = {
    {"rss", "resident bytes (VmRSS)"},
    {"rss_anon", "anonymous resident bytes (RssAnon): the heap lives here"},
    {"rss_file", "file-backed resident bytes (RssFile)"},
    {"rss_shmem", "shared-memory resident bytes (RssShmem)"},
    {"peak_rss", "the high-water mark of resident bytes (VmHWM); it never falls"},
    {"swap", "swapped-out bytes (VmSwap)"},
    {"traced_current", "bytes traced by tracemalloc now, or None when it is not tracing"},
    {"traced_peak", "peak bytes traced by tracemalloc, or None when it is not tracing"},
    {"allocator", "the allocator serving malloc"},
    {"heap", "HeapStats when stats(heap=True) was asked, else None"},
    {"via", "the forwarding LD_PRELOAD wrapper through which malloc reaches glibc, or None"},
    {"reason", "why memreclaim cannot act on the allocator serving malloc, or None"},
    {"libraries",
     "dict: the allocators inside already-imported libraries, by library: whether "
     "memreclaim can release them and what they report (memreclaim.stats() fills it in)"},
    {"thp_mode", "the transparent-huge-page mode for 2 MiB pages: 'always', 'madvise', 'never', "
                 "or None when the kernel has no THP (or its mode file could not be read: a "
                 "RuntimeWarning says why, once)"},
    {"anon_huge_pages", "anonymous bytes mapped as 2 MiB huge pages (AnonHugePages of "
                        "/proc/self/smaps_rollup) when stats(heap=True) was asked, else None "
                        "(also None when the kernel has no THP or no smaps_rollup)"},
    {NULL, NULL},
};

static PyStructSequence_Desc memory_stats_desc = {
    "memreclaim.MemoryStats",
    "A breakdown of this process's memory: RSS from /proc/self/status, tracemalloc's totals, and "
    "optionally the allocator's own figures.",
    memory_stats_fields,
    15,
};

static PyStructSequence_Field heap_stats_fields[] = {
    {"allocator", "the allocator these figures come from"},
    {"in_use", "bytes handed out to the program, or None when the allocator does not say"},
    {"free", "bytes held by the allocator but not handed out, or None"},
    {"mapped", "bytes the allocator obtained from the kernel, or None"},
    {"figures", "dict of the allocator's own figures under its own names"},
    {NULL, NULL},
};

static PyStructSequence_Desc heap_stats_desc = {
    "memreclaim.HeapStats",
    "The allocator's own figures (glibc mallinfo2, jemalloc stats.*, mimalloc mi_process_info, "
    "tcmalloc numeric properties).",
    heap_stats_fields,
    5,
};

/* ---- helpers -------------------------------------------------------------------------------- */

static PyObject *int_or_none(int64_t value)
{
    if (value < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong((long long)value);
}

/* Fill slots [first, first + count) of a struct sequence from `values`; steals nothing. Returns
 * -1 with an exception set. */
static int set_ints(PyObject *result, Py_ssize_t first, const int64_t *values, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = int_or_none(values[i]);
        if (item == NULL) {
            return -1;
        }
        PyStructSequence_SetItem(result, first + i, item);
    }
    return 0;
}

static double monotonic_seconds(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* OSError with errno, filename naming the /proc file we could not read. */
static PyObject *raise_proc_error(int err, const char *path)
{
    PyObject *args = Py_BuildValue("(iss)", err, strerror(err), path);
    if (args != NULL) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

static PyObject *raise_unsupported(core_state *state, const char *function)
{
    PyErr_Format(state->unsupported_error,
                 "%s() needs glibc's malloc, but this process's malloc is served by %U", function,
                 state->allocator_name);
    return NULL;
}

/* glibc serves malloc but `symbol` was not found in it (hidden, or interposed by a tool). */
static PyObject *raise_missing(core_state *state, const char *function, const char *symbol)
{
    PyErr_Format(state->unsupported_error,
                 "%s() needs %s(), which the %U allocator serving malloc in this process does "
                 "not provide",
                 function, symbol, state->allocator_name);
    return NULL;
}

/* Keyword-only boolean flag: True/False only, so a typo like heap="no" is a TypeError. */
static int parse_flag(PyObject *value, const char *name, int *out)
{
    if (value == NULL) {
        *out = 0;
        return 0;
    }
    if (!PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be True or False, not %R", name,
                     (PyObject *)Py_TYPE(value));
        return -1;
    }
    *out = value == Py_True;
    return 0;
}

/* An int argument in [min, max]: TypeError for non-ints (bool included), ValueError or
 * OverflowError naming the accepted range. */
static int parse_bounded_int(PyObject *value, const char *name, long long min, long long max,
                             long long *out)
{
    int overflow = 0;
    long long v;
    if (!PyLong_Check(value) || PyBool_Check(value)) {
        PyErr_Format(PyExc_TypeError, "%s must be an int, not %R", name,
                     (PyObject *)Py_TYPE(value));
        return -1;
    }
    v = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (v == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow != 0) {
        PyErr_Format(PyExc_OverflowError, "%s must be between %lld and %lld, got %R", name, min,
                     max, value);
        return -1;
    }
    if (v < min || v > max) {
        PyErr_Format(PyExc_ValueError, "%s must be between %lld and %lld, got %lld", name, min, max,
                     v);
        return -1;
    }
    *out = v;
    return 0;
}

/* Looked up on every trim(pools=True), not cached in the module state: a cached pointer written
 * by whichever thread comes first would be shared mutable state without the GIL, and the lookup
 * (a sys.modules hit and an attribute) costs microseconds next to a trim. */
static const mr_pools_capi *get_pools(core_state *Py_UNUSED(state))
{
    const mr_pools_capi *capi = (const mr_pools_capi *)PyCapsule_Import(MR_POOLS_CAPSULE, 0);
    if (capi == NULL) {
        return NULL;
    }
    if (capi->version != MR_POOLS_CAPI_VERSION) {
        PyErr_Format(PyExc_RuntimeError,
                     "memreclaim._pools speaks C API version %d, _core expects %d: "
                     "reinstall memreclaim",
                     capi->version, MR_POOLS_CAPI_VERSION);
        return NULL;
    }
    return capi;
}

/* ---- allocators inside libraries ----------------------------------------------------------- */

/* str from a C string, or None for NULL. */
static PyObject *str_or_none(const char *text)
{
    if (text == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(text);
}

/* The `libraries` argument of trim(): a tuple of (name, release) pairs, each a str and a
 * callable, that the Python layer builds for the already-imported libraries whose own allocator
 * memreclaim can release (the C core names no Python package). Returns 0, or -1 with TypeError
 * set, before anything is released. */
static int check_libraries(PyObject *libraries)
{
    if (!PyTuple_Check(libraries)) {
        PyErr_Format(PyExc_TypeError, "trim() libraries must be a tuple, not %.100s",
                     Py_TYPE(libraries)->tp_name);
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(libraries); i++) {
        PyObject *pair = PyTuple_GET_ITEM(libraries, i);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0)) ||
            !PyCallable_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_Format(PyExc_TypeError,
                         "trim() libraries[%zd] must be a (str, callable) pair, not %.100s", i,
                         Py_TYPE(pair)->tp_name);
            return -1;
        }
        if (PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 0)) == NULL) { /* cached for the parts */
            return -1;
        }
    }
    return 0;
}

/* parts[key] = bytes, or None when either reading failed. Returns -1 with an exception set. */
static int set_part(PyObject *parts, const char *key, int before_err, const mr_rss_sample *before,
                    int after_err, const mr_rss_sample *after)
{
    int64_t bytes = -1;
    int rc;
    PyObject *value;
    if (before_err == 0 && after_err == 0) {
        bytes = before->anon > after->anon ? before->anon - after->anon : 0;
    }
    value = int_or_none(bytes);
    if (value == NULL) {
        return -1;
    }
    rc = PyDict_SetItemString(parts, key, value);
    Py_DECREF(value);
    return rc;
}

/* ---- transparent huge pages ------------------------------------------------------------------ */

/* Process-wide, like the heap it is about: whether trim() marks the heap under THP "always"
 * (set_thp_marking), and whether trim() and stats() have warned that they could not read or mark
 * (each says why once). */
static atomic_int thp_marking = 1;
static atomic_int thp_warned_trim = 0;
static atomic_int thp_warned_stats = 0;

typedef struct {
    mr_thp_mode mode;
    int mode_err;                 /* reading the mode */
    char failed[MR_THP_PATH_MAX]; /* the file that could not be read */
    int attempted;                /* the marking ran */
    int mark_err;                 /* its errno */
    mr_thp_marked marked;
} thp_outcome;

/* One RuntimeWarning per process and flag saying why THP could not be dealt with. -1 if it
 * raised. */
static int thp_warn_once(atomic_int *warned, PyObject *reason)
{
    int expected = 0;
    if (!atomic_compare_exchange_strong(warned, &expected, 1)) {
        return 0;
    }
    return PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "%U", reason);
}

/* After the allocator's trim: read the THP mode (two small sysfs reads) and, under "always",
 * mark the heap mappings MADV_NOHUGEPAGE, with the GIL released; the time is added to *seconds. */
static void thp_after_trim(thp_outcome *thp, double *seconds)
{
    double started;
    memset(thp, 0, sizeof(*thp));
    Py_BEGIN_ALLOW_THREADS
    started = monotonic_seconds();
    thp->mode_err = mr_thp_mode_read(&thp->mode, thp->failed, sizeof(thp->failed));
    if (thp->mode_err == 0 && thp->mode == MR_THP_ALWAYS && atomic_load(&thp_marking)) {
        thp->attempted = 1;
        thp->mark_err = mr_thp_mark_heap(&thp->marked);
    }
    *seconds += monotonic_seconds() - started;
    Py_END_ALLOW_THREADS
}

/* TrimResult's thp_* fields from *thp (first: the index of thp_mode). -1 with an exception. */
static int set_thp_fields(PyObject *result, Py_ssize_t first, const thp_outcome *thp)
{
    PyObject *mode, *marked, *reason = NULL;
    int64_t bytes = 0;
    const char *name = thp->mode_err == 0 ? mr_thp_mode_name(thp->mode) : NULL;

    if (thp->mode_err != 0) {
        bytes = -1;
        reason = PyUnicode_FromFormat("cannot read %s (%s): the THP mode is unknown, so the heap "
                                      "was not marked MADV_NOHUGEPAGE",
                                      thp->failed, strerror(thp->mode_err));
    } else if (thp->mode == MR_THP_ALWAYS && !thp->attempted) {
        bytes = -1;
        reason = PyUnicode_FromString("THP is 'always' but heap marking is turned off "
                                      "(set_thp_marking(False)): khugepaged may collapse what "
                                      "the trim gave back");
    } else if (thp->attempted && thp->mark_err != 0) {
        bytes = -1;
        reason = PyUnicode_FromFormat("THP is 'always' but the heap could not be marked "
                                      "MADV_NOHUGEPAGE (%s, after %lld mappings): khugepaged may "
                                      "collapse what the trim gave back",
                                      strerror(thp->mark_err), (long long)thp->marked.ranges);
    } else if (thp->attempted) {
        bytes = thp->marked.bytes;
    }
    if (bytes < 0 && reason == NULL) {
        return -1;
    }
    /* Turned off on purpose is said in the result, not warned about. */
    int warn = thp->mode_err != 0 || (thp->attempted && thp->mark_err != 0);
    if (warn && thp_warn_once(&thp_warned_trim, reason) < 0) {
        Py_DECREF(reason);
        return -1;
    }
    if ((mode = str_or_none(name)) == NULL) {
        Py_XDECREF(reason);
        return -1;
    }
    PyStructSequence_SetItem(result, first, mode);
    if ((marked = int_or_none(bytes)) == NULL) {
        Py_XDECREF(reason);
        return -1;
    }
    PyStructSequence_SetItem(result, first + 1, marked);
    if (reason == NULL) {
        Py_INCREF(Py_None);
        reason = Py_None;
    }
    PyStructSequence_SetItem(result, first + 2, reason);
    return 0;
}

/* ---- trim ----------------------------------------------------------------------------------- */

PyDoc_STRVAR(trim_doc,
             "trim(*, pools=False, libraries=()) -> TrimResult\n\n"
             "Give free memory back to the kernel with the live allocator's own call\n"
             "(glibc malloc_trim(0), jemalloc arena purge, mimalloc mi_collect(true),\n"
             "tcmalloc ReleaseFreeMemory; nothing for an unknown allocator, and then\n"
             "TrimResult.reason says why). The GIL is released during that call. `libraries`\n"
             "is a tuple of (name, release) pairs: each callable is called first, with the\n"
             "GIL held, and what it gave back is parts[name] (memreclaim.trim() passes the\n"
             "already-imported libraries' pools, such as pyarrow's). With pools=True, empty\n"
             "pymalloc pools are given back too (needs memreclaim.enable_pool_reclaim()).\n"
             "TrimResult.parts says what each allocator gave back.");

static PyObject *core_trim(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"pools", "libraries", NULL};
    core_state *state = get_state(module);
    PyObject *pools_arg = NULL, *libraries = NULL, *parts = NULL, *result = NULL, *item;
    const mr_pools_capi *pools = NULL;
    const mr_backend *backend = state->backend;
    mr_pools_result pools_result = {0, 0};
    thp_outcome thp;
    mr_rss_sample before, mark, after;
    int with_pools, before_err, mark_err, after_err, trim_err;
    double started, seconds;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OO:trim", keywords, &pools_arg, &libraries) ||
        parse_flag(pools_arg, "pools", &with_pools) < 0 ||
        (libraries != NULL && check_libraries(libraries) < 0)) {
        return NULL;
    }
    if (with_pools && (pools = get_pools(state)) == NULL) {
        return NULL;
    }
    parts = PyDict_New();
    if (parts == NULL) {
        goto error;
    }

    /* The statm reads keep the GIL: they take about a microsecond (procfs.c locks the kept
     * descriptor itself, so free-threaded builds need no GIL for them). */
    before_err = mr_statm_read(&state->statm, &before);
    mark = before;
    mark_err = before_err;
    started = monotonic_seconds();
    /* Allocators inside libraries (pyarrow bundles jemalloc or mimalloc): their memory is not
     * malloc's, so only their own call gives it back. Each release is a Python callable. */
    for (Py_ssize_t i = 0; libraries != NULL && i < PyTuple_GET_SIZE(libraries); i++) {
        PyObject *pair = PyTuple_GET_ITEM(libraries, i);
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 0)); /* checked above */
        item = PyObject_CallNoArgs(PyTuple_GET_ITEM(pair, 1));
        if (item == NULL || name == NULL) {
            Py_XDECREF(item);
            goto error;
        }
        Py_DECREF(item);
        after_err = mr_statm_read(&state->statm, &after);
        if (set_part(parts, name, mark_err, &mark, after_err, &after) < 0) {
            goto error;
        }
        mark = after;
        mark_err = after_err;
    }
    /* Pool reclaim walks pymalloc's structures: it needs the GIL held. */
    if (pools != NULL) {
        if (pools->reclaim(&pools_result) < 0) {
            goto error;
        }
        after_err = mr_statm_read(&state->statm, &after);
        if (set_part(parts, "pymalloc", mark_err, &mark, after_err, &after) < 0) {
            goto error;
        }
        mark = after;
        mark_err = after_err;
    }
    seconds = monotonic_seconds() - started;
    /* The clock is read inside the released region: waiting to get the GIL back afterwards is
     * not the trim's cost. */
    Py_BEGIN_ALLOW_THREADS
    started = monotonic_seconds();
    trim_err = backend->trim();
    seconds += monotonic_seconds() - started;
    Py_END_ALLOW_THREADS
    after_err = mr_statm_read(&state->statm, &after);

    if (trim_err != 0) {
        errno = trim_err;
        PyErr_SetFromErrno(PyExc_OSError);
        goto error;
    }
    thp_after_trim(&thp, &seconds); /* under THP "always": keep what was given back given back */
    if (backend->kind != MR_ALLOC_UNKNOWN &&
        set_part(parts, backend->name, mark_err, &mark, after_err, &after) < 0) {
        goto error;
    }
    result = PyStructSequence_New(state->trim_result_type);
    if (result == NULL) {
        goto error;
    }
    int64_t measured[5] = {-1, -1, -1, -1, -1};
    if (before_err == 0 && after_err == 0) {
        measured[0] = before.anon > after.anon ? before.anon - after.anon : 0;
    }
    if (before_err == 0) {
        measured[1] = before.resident;
        measured[3] = before.anon;
    }
    if (after_err == 0) {
        measured[2] = after.resident;
        measured[4] = after.anon;
    }
    if (set_ints(result, 0, measured, 5) < 0) {
        goto error;
    }
    item = PyFloat_FromDouble(seconds);
    if (item == NULL) {
        goto error;
    }
    PyStructSequence_SetItem(result, 5, item);
    Py_INCREF(state->allocator_name);
    PyStructSequence_SetItem(result, 6, state->allocator_name);
    item = PyUnicode_FromString(backend->trim_method);
    if (item == NULL) {
        goto error;
    }
    PyStructSequence_SetItem(result, 7, item);
    int64_t pool_figures[2] = {pools_result.pools_released, pools_result.bytes_released};
    if (set_ints(result, 8, pool_figures, 2) < 0) {
        goto error;
    }
    if ((item = str_or_none(mr_backend_via())) == NULL) {
        goto error;
    }
    PyStructSequence_SetItem(result, 10, item);
    if ((item = str_or_none(mr_backend_reason())) == NULL) {
        goto error;
    }
    PyStructSequence_SetItem(result, 11, item);
    if (set_thp_fields(result, 13, &thp) < 0) {
        goto error;
    }
    PyStructSequence_SetItem(result, 12, parts); /* the result owns it now */
    return result;
error:
    /* `parts` is handed to the result only on success, as its last step. */
    Py_XDECREF(parts);
    Py_XDECREF(result);
    return NULL;
}

/* ---- rss ------------------------------------------------------------------------------------ */

PyDoc_STRVAR(rss_doc,
             "rss() -> int\n\n"
             "Resident bytes of this process now (not the high-water mark that\n"
             "resource.getrusage reports). Cheap: one pread on a kept descriptor, reopened\n"
             "after fork(). Raises OSError when /proc/self/statm cannot be read.");

static PyObject *core_rss(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    mr_rss_sample sample;
    /* GIL kept: a pread of a few bytes, shorter than a release/acquire pair. */
    int err = mr_statm_read(&get_state(module)->statm, &sample);
    if (err != 0) {
        return raise_proc_error(err, "/proc/self/statm");
    }
    return PyLong_FromLongLong((long long)sample.resident);
}

/* ---- heap stats ----------------------------------------------------------------------------- */

static PyObject *build_heap_stats(core_state *state)
{
    mr_heap_stats raw;
    int err;
    PyObject *result, *figures;
    const mr_backend *backend = state->backend;

    raw.in_use = raw.free = raw.mapped = -1;
    raw.nfigures = 0;
    /* glibc's mallinfo2 walks every free chunk under the arena lock: release the GIL. */
    Py_BEGIN_ALLOW_THREADS
    err = backend->heap_stats(&raw);
    Py_END_ALLOW_THREADS
    if (err == ENOTSUP) {
        PyErr_Format(state->unsupported_error, "the allocator %U offers no statistics interface",
                     state->allocator_name);
        return NULL;
    }
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    figures = PyDict_New();
    if (figures == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < raw.nfigures; i++) {
        PyObject *value = PyLong_FromLongLong((long long)raw.figures[i].value);
        if (value == NULL || PyDict_SetItemString(figures, raw.figures[i].name, value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(figures);
            return NULL;
        }
        Py_DECREF(value);
    }
    result = PyStructSequence_New(state->heap_stats_type);
    if (result == NULL) {
        Py_DECREF(figures);
        return NULL;
    }
    Py_INCREF(state->allocator_name);
    PyStructSequence_SetItem(result, 0, state->allocator_name);
    PyStructSequence_SetItem(result, 4, figures);
    int64_t totals[3] = {raw.in_use, raw.free, raw.mapped};
    if (set_ints(result, 1, totals, 3) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

PyDoc_STRVAR(heap_stats_doc,
             "heap_stats() -> HeapStats\n\n"
             "The allocator's own figures. On glibc this calls mallinfo2(), which walks every\n"
             "free chunk under the arena lock (milliseconds on a fragmented heap): keep it off\n"
             "hot paths. Raises UnsupportedAllocatorError when the allocator has no statistics.");

static PyObject *core_heap_stats(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return build_heap_stats(get_state(module));
}

/* ---- stats ---------------------------------------------------------------------------------- */

/* (current, peak) traced by tracemalloc, or None for both when it is not tracing. */
static int traced_memory(PyObject **current, PyObject **peak)
{
    PyObject *tracemalloc, *tracing, *pair;
    *current = *peak = NULL;
    tracemalloc = PyImport_ImportModule("_tracemalloc");
    if (tracemalloc == NULL && PyErr_ExceptionMatches(PyExc_ImportError)) {
        /* 3.13+ isolated subinterpreters refuse _tracemalloc (single-phase init): it cannot be
         * asked from here, so report it as not tracing. */
        PyErr_Clear();
        Py_INCREF(Py_None);
        Py_INCREF(Py_None);
        *current = *peak = Py_None;
        return 0;
    }
    if (tracemalloc == NULL) {
        return -1;
    }
    tracing = PyObject_CallMethod(tracemalloc, "is_tracing", NULL);
    if (tracing == NULL) {
        Py_DECREF(tracemalloc);
        return -1;
    }
    if (tracing != Py_True) {
        Py_DECREF(tracing);
        Py_DECREF(tracemalloc);
        Py_INCREF(Py_None);
        Py_INCREF(Py_None);
        *current = *peak = Py_None;
        return 0;
    }
    Py_DECREF(tracing);
    pair = PyObject_CallMethod(tracemalloc, "get_traced_memory", NULL);
    Py_DECREF(tracemalloc);
    if (pair == NULL) {
        return -1;
    }
    if (!PyTuple_Check(pair) || PyTuple_Size(pair) != 2) {
        Py_DECREF(pair);
        PyErr_SetString(PyExc_RuntimeError, "tracemalloc.get_traced_memory() returned no pair");
        return -1;
    }
    *current = PyTuple_GetItem(pair, 0);
    *peak = PyTuple_GetItem(pair, 1);
    Py_INCREF(*current);
    Py_INCREF(*peak);
    Py_DECREF(pair);
    return 0;
}

/* stats()'s THP mode and AnonHugePages (new references in *mode and *huge), None where the kernel
 * has no THP or no smaps_rollup, and AnonHugePages None too unless `with_heap` (it walks the page
 * tables); a file that exists but cannot be read gives None and a RuntimeWarning, once, saying
 * why. -1 with an exception set. */
static int thp_stats(PyObject **mode, PyObject **huge, int with_heap)
{
    mr_thp_mode thp;
    mr_rollup rollup;
    char failed[MR_THP_PATH_MAX];
    int thp_err, rollup_err = ENOENT;
    PyObject *why = NULL;

    *mode = *huge = NULL;
    thp_err = mr_thp_mode_read(&thp, failed, sizeof(failed));
    if (with_heap && (thp_err != 0 || thp != MR_THP_NONE)) {
        /* smaps_rollup walks the page tables: ~25 us per MiB resident. */
        Py_BEGIN_ALLOW_THREADS
        rollup_err = mr_rollup_read(0, &rollup);
        Py_END_ALLOW_THREADS
    }
    if (thp_err != 0) {
        why = PyUnicode_FromFormat("cannot read %s (%s): stats().thp_mode is None", failed,
                                   strerror(thp_err));
    } else if (rollup_err != 0 && rollup_err != ENOENT) {
        why = PyUnicode_FromFormat("cannot read /proc/self/smaps_rollup (%s): "
                                   "stats().anon_huge_pages is None",
                                   strerror(rollup_err));
    }
    if ((thp_err != 0 || (rollup_err != 0 && rollup_err != ENOENT)) &&
        (why == NULL || thp_warn_once(&thp_warned_stats, why) < 0)) {
        Py_XDECREF(why);
        return -1;
    }
    Py_XDECREF(why);
    *mode = str_or_none(thp_err == 0 ? mr_thp_mode_name(thp) : NULL);
    *huge = int_or_none(rollup_err == 0 ? rollup.anon_huge_pages : -1);
    if (*mode == NULL || *huge == NULL) {
        Py_CLEAR(*mode);
        Py_CLEAR(*huge);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(
    stats_doc,
    "stats(*, heap=False, libraries=None) -> MemoryStats\n\n"
    "RSS broken down from /proc/self/status, tracemalloc's traced totals (None when\n"
    "not tracing), the allocator's name (with the wrapper it is reached through, and\n"
    "why memreclaim cannot act on it, if so), and `libraries`: the figures of allocators\n"
    "inside already-imported libraries: a copy of the dict the Python layer passes in\n"
    "(empty when None; the C core names no Python package). heap=True adds the\n"
    "allocator's own figures (see heap_stats(); on glibc that walks the heap) and AnonHugePages\n"
    "(read from /proc/self/smaps_rollup, which walks the page tables, about 25 us per\n"
    "MiB resident, with the GIL released). thp_mode says how transparent huge pages\n"
    "stand. Raises OSError when /proc/self/status cannot be read.");

static PyObject *core_stats(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"heap", "libraries", NULL};
    core_state *state = get_state(module);
    PyObject *heap_arg = NULL, *heap = NULL, *current = NULL, *peak = NULL, *result = NULL;
    PyObject *via = NULL, *reason = NULL, *libraries = NULL, *libraries_arg = NULL;
    PyObject *thp_mode = NULL, *huge = NULL;
    mr_status status;
    int with_heap, err;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OO:stats", keywords, &heap_arg,
                                     &libraries_arg) ||
        parse_flag(heap_arg, "heap", &with_heap) < 0) {
        return NULL;
    }
    if (libraries_arg != NULL && libraries_arg != Py_None && !PyDict_Check(libraries_arg)) {
        PyErr_Format(PyExc_TypeError, "stats() libraries must be a dict or None, not %.100s",
                     Py_TYPE(libraries_arg)->tp_name);
        return NULL;
    }
    err = mr_status_read(0, &status);
    if (err != 0) {
        return raise_proc_error(err, "/proc/self/status");
    }
    if (with_heap) {
        heap = build_heap_stats(state);
        if (heap == NULL) {
            return NULL;
        }
    } else {
        Py_INCREF(Py_None);
        heap = Py_None;
    }
    if (traced_memory(&current, &peak) < 0 || (via = str_or_none(mr_backend_via())) == NULL ||
        (reason = str_or_none(mr_backend_reason())) == NULL ||
        (libraries = (libraries_arg == NULL || libraries_arg == Py_None)
                         ? PyDict_New()
                         : PyDict_Copy(libraries_arg)) == NULL ||
        thp_stats(&thp_mode, &huge, with_heap) < 0) {
        goto error;
    }
    result = PyStructSequence_New(state->memory_stats_type);
    if (result == NULL) {
        goto error;
    }
    /* The struct sequence owns these from here on, and frees them with itself. */
    PyStructSequence_SetItem(result, 6, current);
    PyStructSequence_SetItem(result, 7, peak);
    Py_INCREF(state->allocator_name);
    PyStructSequence_SetItem(result, 8, state->allocator_name);
    PyStructSequence_SetItem(result, 9, heap);
    PyStructSequence_SetItem(result, 10, via);
    PyStructSequence_SetItem(result, 11, reason);
    PyStructSequence_SetItem(result, 12, libraries);
    PyStructSequence_SetItem(result, 13, thp_mode);
    PyStructSequence_SetItem(result, 14, huge);
    int64_t figures[6] = {status.rss,       status.rss_anon, status.rss_file,
                          status.rss_shmem, status.peak_rss, status.swap};
    if (set_ints(result, 0, figures, 6) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
error:
    Py_XDECREF(heap);
    Py_XDECREF(current);
    Py_XDECREF(peak);
    Py_XDECREF(via);
    Py_XDECREF(reason);
    Py_XDECREF(libraries);
    Py_XDECREF(thp_mode);
    Py_XDECREF(huge);
    return NULL;
}

/* ---- another process's /proc ---------------------------------------------------------------- */

/* The pid argument of the process_* functions: a positive int. */
static int parse_pid(PyObject *arg, int *pid)
{
    long value;
    if (!PyLong_Check(arg) || PyBool_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "pid must be an int, not %.100s", Py_TYPE(arg)->tp_name);
        return -1;
    }
    value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred()) {
        if (!PyErr_ExceptionMatches(PyExc_OverflowError)) {
            return -1; /* not an out-of-range pid: let it through */
        }
        PyErr_Clear(); /* out of range: the ValueError below */
    }
    if (value < 1 || value > INT_MAX) {
        PyErr_Format(PyExc_ValueError, "pid must be a positive process ID, got %R", arg);
        return -1;
    }
    *pid = (int)value;
    return 0;
}

/* OSError (its errno subclass: ProcessLookupError, PermissionError ...) naming /proc/PID/name. */
static PyObject *raise_pid_error(int err, int pid, const char *name)
{
    char path[64];
    (void)snprintf(path, sizeof(path), "/proc/%d/%s", pid, name);
    errno = err;
    return PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
}

/* Add key: int_or_none(value) to dict; -1 with an exception set. */
static int set_item_int(PyObject *dict, const char *key, int64_t value)
{
    PyObject *item = int_or_none(value);
    int rc;
    if (item == NULL) {
        return -1;
    }
    rc = PyDict_SetItemString(dict, key, item);
    Py_DECREF(item);
    return rc;
}

PyDoc_STRVAR(process_status_doc,
             "process_status(pid, /) -> dict\n\n"
             "Process pid's figures from /proc/PID/status: 'name', 'threads', and in bytes 'rss',\n"
             "'rss_anon', 'rss_file', 'rss_shmem', 'swap', 'peak_rss' (VmHWM), 'virtual'\n"
             "(VmSize); None where the kernel does not report one. The file is readable by\n"
             "anyone. Raises ProcessLookupError (ESRCH) when there is no such process,\n"
             "PermissionError when the file is not readable, other OSErrors with their errno;\n"
             "TypeError/ValueError for a pid that is not a positive int.");

static PyObject *core_process_status(PyObject *module, PyObject *arg)
{
    mr_status status;
    PyObject *result, *name;
    int pid, err;
    (void)module;

    if (parse_pid(arg, &pid) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    err = mr_status_read(pid, &status);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        return raise_pid_error(err, pid, "status");
    }
    result = PyDict_New();
    if (result == NULL) {
        return NULL;
    }
    name = PyUnicode_DecodeUTF8(status.name, (Py_ssize_t)strlen(status.name), "replace");
    if (name == NULL || PyDict_SetItemString(result, "name", name) < 0 ||
        set_item_int(result, "threads", status.threads) < 0 ||
        set_item_int(result, "rss", status.rss) < 0 ||
        set_item_int(result, "rss_anon", status.rss_anon) < 0 ||
        set_item_int(result, "rss_file", status.rss_file) < 0 ||
        set_item_int(result, "rss_shmem", status.rss_shmem) < 0 ||
        set_item_int(result, "swap", status.swap) < 0 ||
        set_item_int(result, "peak_rss", status.peak_rss) < 0 ||
        set_item_int(result, "virtual", status.virtual_size) < 0) {
        Py_XDECREF(name);
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(name);
    return result;
}

PyDoc_STRVAR(process_rollup_doc,
             "process_rollup(pid, /) -> dict\n\n"
             "Process pid's /proc/PID/smaps_rollup, in bytes: 'pss', 'private_dirty',\n"
             "'shared_clean', 'anonymous', 'anon_huge_pages' (None where absent). Needs ptrace\n"
             "access to the process (its user, or CAP_SYS_PTRACE): PermissionError otherwise;\n"
             "ProcessLookupError when there is no such process; FileNotFoundError on kernels\n"
             "before 4.14 (no smaps_rollup).");

static PyObject *core_process_rollup(PyObject *module, PyObject *arg)
{
    mr_rollup rollup;
    PyObject *result;
    int pid, err;
    (void)module;

    if (parse_pid(arg, &pid) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    err = mr_rollup_read(pid, &rollup);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        return raise_pid_error(err, pid, "smaps_rollup");
    }
    result = PyDict_New();
    if (result == NULL) {
        return NULL;
    }
    if (set_item_int(result, "pss", rollup.pss) < 0 ||
        set_item_int(result, "private_dirty", rollup.private_dirty) < 0 ||
        set_item_int(result, "shared_clean", rollup.shared_clean) < 0 ||
        set_item_int(result, "anonymous", rollup.anonymous) < 0 ||
        set_item_int(result, "anon_huge_pages", rollup.anon_huge_pages) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

PyDoc_STRVAR(process_heap_mapping_doc,
             "process_heap_mapping(pid, /) -> int | None\n\n"
             "Size in bytes of process pid's [heap] mapping (the brk heap of glibc's main\n"
             "arena) from /proc/PID/maps, or None when it has none. Errors as process_rollup().");

static PyObject *core_process_heap_mapping(PyObject *module, PyObject *arg)
{
    int64_t size;
    int pid, err;
    (void)module;

    if (parse_pid(arg, &pid) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    err = mr_heap_mapping_read(pid, &size);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        return raise_pid_error(err, pid, "maps");
    }
    return int_or_none(size);
}

/* ---- allocator ------------------------------------------------------------------------------ */

PyDoc_STRVAR(allocator_doc, "allocator() -> str\n\n"
                            "Which allocator serves malloc in this process: 'glibc', 'jemalloc',\n"
                            "'mimalloc', 'tcmalloc', or 'unknown' (musl, or an LD_PRELOADed\n"
                            "allocator with no purge interface we know).");

static PyObject *core_allocator(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyObject *name = get_state(module)->allocator_name;
    Py_INCREF(name);
    return name;
}

PyDoc_STRVAR(allocator_version_doc, "allocator_version() -> str | None\n\n"
                                    "The live allocator's version as it reports it, or None.");

static PyObject *core_allocator_version(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    const char *version = mr_backend_version();
    if (version == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(version);
}

/* ---- glibc knobs ---------------------------------------------------------------------------- */

static PyObject *set_mallopt(PyObject *module, PyObject *value, const char *function,
                             const char *name, int param, long long min, long long max)
{
    core_state *state = get_state(module);
    long long v;
    int err;
    /* Check the argument first, so a bad value raises the same error on every allocator. */
    if (parse_bounded_int(value, name, min, max, &v) < 0) {
        return NULL;
    }
    if (state->backend->kind != MR_ALLOC_GLIBC) {
        return raise_unsupported(state, function);
    }
    /* GIL kept: mallopt takes the main arena's lock for a few instructions. */
    err = mr_glibc_mallopt(param, (int)v);
    if (err == ENOTSUP) {
        return raise_missing(state, function, "mallopt");
    }
    if (err != 0) {
        PyErr_Format(PyExc_ValueError, "glibc refused %s=%lld", name, v);
        return NULL;
    }
    Py_RETURN_NONE;
}

PyDoc_STRVAR(pin_mmap_threshold_doc,
             "pin_mmap_threshold(nbytes) -> None\n\n"
             "mallopt(M_MMAP_THRESHOLD, nbytes): blocks of at least nbytes get their own mmap and\n"
             "go back to the kernel when freed. This also turns off glibc's adaptive threshold,\n"
             "which otherwise rises to the size of every large block freed (up to 32 MiB).\n"
             "nbytes: 1 to 33554432 (32 MiB) on 64-bit. glibc only.");

static PyObject *core_pin_mmap_threshold(PyObject *module, PyObject *value)
{
    return set_mallopt(module, value, "pin_mmap_threshold", "nbytes", MR_M_MMAP_THRESHOLD, 1,
                       MR_MMAP_THRESHOLD_MAX);
}

PyDoc_STRVAR(set_trim_threshold_doc,
             "set_trim_threshold(nbytes) -> None\n\n"
             "mallopt(M_TRIM_THRESHOLD, nbytes): free memory at the top of the main heap above\n"
             "nbytes is given back by free() itself. It governs only the top of the heap, not\n"
             "holes in the middle (trim() handles those). nbytes: 0 to 2147483647. glibc only.");

static PyObject *core_set_trim_threshold(PyObject *module, PyObject *value)
{
    return set_mallopt(module, value, "set_trim_threshold", "nbytes", MR_M_TRIM_THRESHOLD, 0,
                       INT32_MAX);
}

PyDoc_STRVAR(set_arena_max_doc,
             "set_arena_max(n) -> None\n\n"
             "mallopt(M_ARENA_MAX, n): the most malloc arenas glibc creates for threads. glibc\n"
             "fixes its limit the first time a thread needs a new arena past the first eight\n"
             "(or past a limit already set), and never frees arenas: call it at start-up.\n"
             "n: 1 to 2147483647. glibc only. (memreclaim.set_arena_max warns when it is late.)");

static PyObject *core_set_arena_max(PyObject *module, PyObject *value)
{
    return set_mallopt(module, value, "set_arena_max", "n", MR_M_ARENA_MAX, 1, INT32_MAX);
}

PyDoc_STRVAR(malloc_info_doc,
             "malloc_info() -> str\n\n"
             "glibc's malloc_info(0, ...) XML: per-arena free-chunk histograms and\n"
             "totals. It locks each arena in turn; the GIL is released meanwhile.\n"
             "glibc only (UnsupportedAllocatorError otherwise).");

static PyObject *core_malloc_info(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    core_state *state = get_state(module);
    char *text = NULL;
    size_t size = 0;
    int err;
    PyObject *result;

    if (state->backend->kind != MR_ALLOC_GLIBC) {
        return raise_unsupported(state, "malloc_info");
    }
    Py_BEGIN_ALLOW_THREADS
    err = mr_glibc_malloc_info(&text, &size);
    Py_END_ALLOW_THREADS
    if (err == ENOTSUP) {
        return raise_missing(state, "malloc_info", "malloc_info");
    }
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    result = PyUnicode_DecodeUTF8(text, (Py_ssize_t)size, "replace");
    free(text);
    return result;
}

/* ---- mimalloc's heap walk -------------------------------------------------------------------- */

#define MR_MI_MAX_ADDRESSES 4096

PyDoc_STRVAR(mimalloc_areas_doc,
             "mimalloc_areas(small_max, max_areas, /) -> dict\n\n"
             "The calling thread's mimalloc heap, page by page (mi_heap_visit_blocks, walked in\n"
             "C with the GIL released): 'small' and 'large' in-use bytes (pages of blocks up to\n"
             "small_max bytes are small), 'committed' bytes, 'areas' (pages visited) and\n"
             "'addresses' (start of the first 4096 pages). Raises UnsupportedAllocatorError when\n"
             "the allocator is not mimalloc or does not export the walk, OSError (EOVERFLOW)\n"
             "when the walk passes max_areas pages, TypeError/ValueError/OverflowError for\n"
             "arguments that are not non-negative ints / positive ints.");

static PyObject *core_mimalloc_areas(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    core_state *state = get_state(module);
    mr_mi_areas walk;
    size_t small_max, max_areas;
    int err;
    PyObject *result, *addresses;

    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "mimalloc_areas() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        if (!PyLong_Check(args[i]) || PyBool_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "mimalloc_areas() argument %d must be int, not %.100s",
                         i + 1, Py_TYPE(args[i])->tp_name);
            return NULL;
        }
    }
    small_max = PyLong_AsSize_t(args[0]);
    if (small_max == (size_t)-1 && PyErr_Occurred()) {
        return NULL; /* OverflowError, also for a negative value */
    }
    max_areas = PyLong_AsSize_t(args[1]);
    if (max_areas == (size_t)-1 && PyErr_Occurred()) {
        return NULL;
    }
    if (max_areas == 0) {
        PyErr_SetString(PyExc_ValueError, "mimalloc_areas() max_areas must be positive");
        return NULL;
    }
    memset(&walk, 0, sizeof(walk));
    walk.small_max = small_max;
    walk.max_areas = max_areas;
    walk.max_addresses = MR_MI_MAX_ADDRESSES;
    walk.addresses = PyMem_RawMalloc(MR_MI_MAX_ADDRESSES * sizeof(uintptr_t));
    if (walk.addresses == NULL) {
        return PyErr_NoMemory();
    }
    /* The walk's buffer is allocated before it starts: a malloc or free during the walk changes
     * the page queues it follows. */
    Py_BEGIN_ALLOW_THREADS
    err = mr_mimalloc_areas(&walk);
    Py_END_ALLOW_THREADS
    if (err == ENOTSUP) {
        PyMem_RawFree(walk.addresses);
        return raise_missing(state, "mimalloc_areas", "mi_heap_visit_blocks");
    }
    if (err != 0) {
        PyMem_RawFree(walk.addresses);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    addresses = PyTuple_New((Py_ssize_t)walk.naddresses);
    if (addresses == NULL) {
        PyMem_RawFree(walk.addresses);
        return NULL;
    }
    for (size_t i = 0; i < walk.naddresses; i++) {
        PyObject *item = PyLong_FromSize_t(walk.addresses[i]);
        if (item == NULL) {
            PyMem_RawFree(walk.addresses);
            Py_DECREF(addresses);
            return NULL;
        }
        PyTuple_SET_ITEM(addresses, (Py_ssize_t)i, item);
    }
    PyMem_RawFree(walk.addresses);
    result = PyDict_New();
    if (result == NULL || set_item_int(result, "small", (int64_t)walk.small_used) < 0 ||
        set_item_int(result, "large", (int64_t)walk.large_used) < 0 ||
        set_item_int(result, "committed", (int64_t)walk.committed) < 0 ||
        set_item_int(result, "areas", (int64_t)walk.areas) < 0 ||
        PyDict_SetItemString(result, "addresses", addresses) < 0) {
        Py_XDECREF(result);
        Py_DECREF(addresses);
        return NULL;
    }
    Py_DECREF(addresses);
    return result;
}

/* ---- purge delay and the calling thread's share (issue 22) ---------------------------------- */

PyDoc_STRVAR(set_purge_delay_doc,
             "set_purge_delay(milliseconds, /) -> int\n\n"
             "How long the allocator keeps memory freed in whole pages before it gives it back to\n"
             "the kernel: 0 gives it back as soon as a page is free, -1 never (until a trim).\n"
             "Returns the delay before the call. mimalloc only: mi_option_set(purge_delay) (the\n"
             "option MIMALLOC_PURGE_DELAY sets; 2.0's decommit_delay, MIMALLOC_RESET_DELAY). Like\n"
             "pin_mmap_threshold, call it at start-up: mimalloc 2.0 decommits a page freed under\n"
             "a delay only when its thread later uses that segment again, which trim() cannot\n"
             "bring about. 0 costs an madvise per freed page. glibc, jemalloc and tcmalloc raise\n"
             "UnsupportedAllocatorError saying what governs them instead; TypeError, ValueError\n"
             "(outside -1 to 2147483647) and OverflowError for a bad value, before anything is\n"
             "set.");

static PyObject *core_set_purge_delay(PyObject *module, PyObject *value)
{
    core_state *state = get_state(module);
    long long ms;
    long previous = 0;
    const char *reason;
    int err;

    if (parse_bounded_int(value, "milliseconds", -1, INT32_MAX, &ms) < 0) {
        return NULL;
    }
    switch (state->backend->kind) {
    case MR_ALLOC_GLIBC:
        PyErr_SetString(state->unsupported_error,
                        "set_purge_delay() needs mimalloc: glibc gives pages back on free() only "
                        "at the top of a heap (set_trim_threshold) or for mmapped blocks "
                        "(pin_mmap_threshold), and trim() does the rest");
        return NULL;
    case MR_ALLOC_JEMALLOC:
        PyErr_SetString(state->unsupported_error,
                        "set_purge_delay() needs mimalloc: jemalloc's delay is its decay time, "
                        "set at start with MALLOC_CONF=dirty_decay_ms:0,muzzy_decay_ms:0");
        return NULL;
    case MR_ALLOC_TCMALLOC:
        PyErr_SetString(state->unsupported_error,
                        "set_purge_delay() needs mimalloc: gperftools tcmalloc has no delay, only "
                        "a release rate (TCMALLOC_RELEASE_RATE)");
        return NULL;
    case MR_ALLOC_UNKNOWN:
        reason = mr_backend_reason();
        PyErr_Format(state->unsupported_error,
                     "set_purge_delay() needs mimalloc, but this process's malloc is served by "
                     "%U: %s",
                     state->allocator_name,
                     reason ? reason : "an allocator memreclaim does not know");
        return NULL;
    case MR_ALLOC_MIMALLOC:
        break;
    }
    /* GIL released: the option lock may be held by a trim's mi_collect in another thread. */
    Py_BEGIN_ALLOW_THREADS
    err = mr_mimalloc_purge_delay((long)ms, true, &previous);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        reason = mr_mimalloc_purge_delay_reason();
        PyErr_Format(state->unsupported_error, "set_purge_delay() cannot set mimalloc %s: %s",
                     mr_backend_version() ? mr_backend_version() : "(version unknown)",
                     reason ? reason : "its option is not known");
        return NULL;
    }
    return PyLong_FromLong(previous);
}

PyDoc_STRVAR(collect_thread_doc,
             "collect_thread(*, abandon=False) -> dict\n\n"
             "The calling thread's share of giving memory back, for what only the owning thread\n"
             "can do (run it in each worker: trim() from one thread does not reach another live\n"
             "thread's heap or cache). mimalloc: mi_collect(true) with the purge delay at 0 for\n"
             "the call; with abandon=True on mimalloc 2.x, outside the main thread, also\n"
             "mi_thread_done(): the heap is handed over as an exited thread's is (its blocks stay\n"
             "valid; the thread gets a new heap at its next malloc; a mi_heap_new() heap of this\n"
             "thread would be deleted) and the next trim() from any thread gives back its free\n"
             "pages. jemalloc: mallctl thread.idle (else thread.tcache.flush). tcmalloc:\n"
             "MallocExtension_MarkThreadIdle. glibc: nothing (malloc_trim reaches every arena).\n"
             "The GIL is released during the call. Returns {'method': what was called ('none'),\n"
             "'anon_before', 'anon_after': anonymous resident bytes around it (None if\n"
             "unreadable), 'seconds': the call's time}. TypeError when abandon is not a bool.");

static PyObject *core_collect_thread(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"abandon", NULL};
    core_state *state = get_state(module);
    PyObject *abandon_arg = NULL, *result, *item;
    mr_rss_sample before, after;
    int abandon, before_err, after_err;
    const char *method = "none";
    double started, seconds;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$O:collect_thread", keywords, &abandon_arg) ||
        parse_flag(abandon_arg, "abandon", &abandon) < 0) {
        return NULL;
    }
    before_err = mr_statm_read(&state->statm, &before);
    Py_BEGIN_ALLOW_THREADS
    started = monotonic_seconds();
    (void)mr_thread_collect(abandon != 0, &method);
    seconds = monotonic_seconds() - started;
    Py_END_ALLOW_THREADS
    after_err = mr_statm_read(&state->statm, &after);

    result = PyDict_New();
    if (result == NULL) {
        return NULL;
    }
    item = PyUnicode_FromString(method);
    if (item == NULL || PyDict_SetItemString(result, "method", item) < 0) {
        Py_XDECREF(item);
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(item);
    if (set_item_int(result, "anon_before", before_err == 0 ? before.anon : -1) < 0 ||
        set_item_int(result, "anon_after", after_err == 0 ? after.anon : -1) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    item = PyFloat_FromDouble(seconds);
    if (item == NULL || PyDict_SetItemString(result, "seconds", item) < 0) {
        Py_XDECREF(item);
        Py_DECREF(result);
        return NULL;
    }
    Py_DECREF(item);
    return result;
}

/* ---- transparent huge pages: settings, heap marking ------------------------------------------ */

static int set_item_str(PyObject *dict, const char *key, const char *value)
{
    PyObject *item = str_or_none(value != NULL && value[0] != '\0' ? value : NULL);
    int rc;
    if (item == NULL) {
        return -1;
    }
    rc = PyDict_SetItemString(dict, key, item);
    Py_DECREF(item);
    return rc;
}

/* The settings under dir (NULL: the system's) as a dict; OSError naming the file. */
static PyObject *thp_settings_dict(const char *dir)
{
    mr_thp_settings settings;
    char failed[MR_THP_PATH_MAX];
    PyObject *result;
    int err;

    Py_BEGIN_ALLOW_THREADS
    err = mr_thp_settings_read(dir, &settings, failed, sizeof(failed));
    Py_END_ALLOW_THREADS
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrnoWithFilename(PyExc_OSError, failed);
    }
    result = PyDict_New();
    if (result == NULL ||
        set_item_str(result, "mode", mr_thp_mode_name(mr_thp_settings_mode(&settings))) < 0 ||
        set_item_str(result, "enabled", settings.enabled) < 0 ||
        set_item_str(result, "pmd_enabled", settings.pmd_enabled) < 0 ||
        set_item_str(result, "defrag", settings.defrag) < 0 ||
        set_item_int(result, "pmd_size", settings.pmd_size) < 0 ||
        set_item_int(result, "max_ptes_none", settings.max_ptes_none) < 0 ||
        set_item_int(result, "scan_sleep_millisecs", settings.scan_sleep_millisecs) < 0) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
}

PyDoc_STRVAR(thp_settings_doc,
             "thp_settings() -> dict\n\n"
             "The transparent-huge-page settings under /sys/kernel/mm/transparent_hugepage:\n"
             "'enabled' and 'defrag' (the bracketed words), 'pmd_enabled' (the word of\n"
             "hugepages-2048kB/enabled on kernels with per-size settings, 6.8+), 'mode' (the one\n"
             "governing 2 MiB pages: pmd_enabled unless it is 'inherit', else enabled),\n"
             "'pmd_size' (bytes), and khugepaged's 'max_ptes_none' and 'scan_sleep_millisecs'.\n"
             "None where the kernel has no such file (all of them without THP). Raises OSError\n"
             "naming the file when one exists but cannot be read or is not what it should be.");

static PyObject *core_thp_settings(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return thp_settings_dict(NULL);
}

PyDoc_STRVAR(thp_settings_at_doc, "_thp_settings_at(directory, /) -> dict\n\n"
                                  "thp_settings() read from another directory laid out like\n"
                                  "/sys/kernel/mm/transparent_hugepage (for the tests).");

static PyObject *core_thp_settings_at(PyObject *Py_UNUSED(module), PyObject *arg)
{
    PyObject *path = NULL, *result;
    if (!PyUnicode_FSConverter(arg, &path)) {
        return NULL;
    }
    result = thp_settings_dict(PyBytes_AS_STRING(path));
    Py_DECREF(path);
    return result;
}

/* _thp_heap_ranges's callback: append (start, end) to the list ctx; ENOMEM with an exception. */
static int append_range(void *ctx, uint64_t start, uint64_t end)
{
    PyObject *pair = Py_BuildValue("(KK)", (unsigned long long)start, (unsigned long long)end);
    int rc = pair == NULL ? -1 : PyList_Append((PyObject *)ctx, pair);
    Py_XDECREF(pair);
    return rc < 0 ? ENOMEM : 0;
}

PyDoc_STRVAR(thp_heap_ranges_doc,
             "_thp_heap_ranges(maps_path, pmd_size, /) -> list[tuple[int, int]]\n\n"
             "The [start, end) ranges that trim() would mark MADV_NOHUGEPAGE under THP 'always',\n"
             "chosen from a file laid out like /proc/self/maps (for the tests); marks nothing.");

static PyObject *core_thp_heap_ranges(PyObject *Py_UNUSED(module), PyObject *const *args,
                                      Py_ssize_t nargs)
{
    PyObject *path = NULL, *ranges;
    long long pmd_size;
    int err;

    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "_thp_heap_ranges() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (parse_bounded_int(args[1], "pmd_size", 4096, (long long)1 << 40, &pmd_size) < 0) {
        return NULL;
    }
    if ((pmd_size & (pmd_size - 1)) != 0) {
        PyErr_Format(PyExc_ValueError, "pmd_size must be a power of two, got %lld", pmd_size);
        return NULL;
    }
    if (!PyUnicode_FSConverter(args[0], &path)) {
        return NULL;
    }
    ranges = PyList_New(0);
    if (ranges == NULL) {
        Py_DECREF(path);
        return NULL;
    }
    /* GIL kept: the callback builds Python objects (a test entry point, not a hot path). */
    err = mr_thp_heap_ranges(PyBytes_AS_STRING(path), (uint64_t)pmd_size, append_range, ranges);
    if (err != 0) {
        Py_DECREF(ranges);
        if (!PyErr_Occurred()) {
            errno = err;
            PyErr_SetFromErrnoWithFilenameObject(PyExc_OSError, args[0]);
        }
        Py_DECREF(path);
        return NULL;
    }
    Py_DECREF(path);
    return ranges;
}

PyDoc_STRVAR(thp_mark_heap_doc,
             "_thp_mark_heap() -> dict\n\n"
             "Mark the allocators' heap mappings MADV_NOHUGEPAGE now, whatever the THP mode\n"
             "(what trim() does after the allocator's trim under THP 'always'; for the tests):\n"
             "'ranges' and 'bytes' marked, 'skipped' (unmapped meanwhile). OSError on failure.");

static PyObject *core_thp_mark_heap(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    mr_thp_marked marked = {0, 0, 0};
    PyObject *result;
    int err;

    Py_BEGIN_ALLOW_THREADS
    err = mr_thp_mark_heap(&marked);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    result = PyDict_New();
    if (result == NULL || set_item_int(result, "ranges", marked.ranges) < 0 ||
        set_item_int(result, "bytes", marked.bytes) < 0 ||
        set_item_int(result, "skipped", marked.skipped) < 0) {
        Py_XDECREF(result);
        return NULL;
    }
    return result;
}

PyDoc_STRVAR(set_thp_marking_doc,
             "set_thp_marking(enabled, /) -> bool\n\n"
             "Whether trim() marks the allocators' heap mappings MADV_NOHUGEPAGE when THP is\n"
             "'always' (the default: True), for the whole process; returns the previous setting.\n"
             "Off, khugepaged may collapse what a trim gave back into huge pages again, and\n"
             "TrimResult.thp_reason says so. TypeError unless enabled is a bool.");

static PyObject *core_set_thp_marking(PyObject *Py_UNUSED(module), PyObject *arg)
{
    if (!PyBool_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "enabled must be True or False, not %R",
                     (PyObject *)Py_TYPE(arg));
        return NULL;
    }
    return PyBool_FromLong(atomic_exchange(&thp_marking, arg == Py_True));
}

/* ---- module --------------------------------------------------------------------------------- */

static PyMethodDef core_methods[] = {
    {"trim", (PyCFunction)(void (*)(void))core_trim, METH_VARARGS | METH_KEYWORDS, trim_doc},
    {"rss", core_rss, METH_NOARGS, rss_doc},
    {"stats", (PyCFunction)(void (*)(void))core_stats, METH_VARARGS | METH_KEYWORDS, stats_doc},
    {"heap_stats", core_heap_stats, METH_NOARGS, heap_stats_doc},
    {"allocator", core_allocator, METH_NOARGS, allocator_doc},
    {"allocator_version", core_allocator_version, METH_NOARGS, allocator_version_doc},
    {"pin_mmap_threshold", core_pin_mmap_threshold, METH_O, pin_mmap_threshold_doc},
    {"set_trim_threshold", core_set_trim_threshold, METH_O, set_trim_threshold_doc},
    {"set_arena_max", core_set_arena_max, METH_O, set_arena_max_doc},
    {"malloc_info", core_malloc_info, METH_NOARGS, malloc_info_doc},
    {"process_status", core_process_status, METH_O, process_status_doc},
    {"process_rollup", core_process_rollup, METH_O, process_rollup_doc},
    {"process_heap_mapping", core_process_heap_mapping, METH_O, process_heap_mapping_doc},
    {"mimalloc_areas", (PyCFunction)(void (*)(void))core_mimalloc_areas, METH_FASTCALL,
     mimalloc_areas_doc},
    {"set_purge_delay", core_set_purge_delay, METH_O, set_purge_delay_doc},
    {"collect_thread", (PyCFunction)(void (*)(void))core_collect_thread,
     METH_VARARGS | METH_KEYWORDS, collect_thread_doc},
    {"thp_settings", core_thp_settings, METH_NOARGS, thp_settings_doc},
    {"set_thp_marking", core_set_thp_marking, METH_O, set_thp_marking_doc},
    {"_thp_settings_at", core_thp_settings_at, METH_O, thp_settings_at_doc},
    {"_thp_heap_ranges", (PyCFunction)(void (*)(void))core_thp_heap_ranges, METH_FASTCALL,
     thp_heap_ranges_doc},
    {"_thp_mark_heap", core_thp_mark_heap, METH_NOARGS, thp_mark_heap_doc},
    {NULL, NULL, 0, NULL},
};

static int add_type(PyObject *module, PyTypeObject **slot, PyStructSequence_Desc *desc)
{
    *slot = PyStructSequence_NewType(desc);
    if (*slot == NULL) {
        return -1;
    }
    Py_INCREF(*slot);
    if (PyModule_AddObject(module, strrchr(desc->name, '.') + 1, (PyObject *)*slot) < 0) {
        Py_DECREF(*slot);
        return -1;
    }
    return 0;
}

static int core_exec(PyObject *module)
{
    core_state *state = get_state(module);

    mr_statm_init(&state->statm);
    state->statm_ready = 1;
    mr_procfs_global_init();
    state->backend = mr_backend_detect();
    state->allocator_name = PyUnicode_InternFromString(state->backend->name);
    if (state->allocator_name == NULL) {
        return -1;
    }
    if (add_type(module, &state->trim_result_type, &trim_result_desc) < 0 ||
        add_type(module, &state->memory_stats_type, &memory_stats_desc) < 0 ||
        add_type(module, &state->heap_stats_type, &heap_stats_desc) < 0) {
        return -1;
    }
    state->unsupported_error = PyErr_NewExceptionWithDoc(
        "memreclaim.UnsupportedAllocatorError",
        "The call needs an allocator interface that the allocator serving malloc lacks.",
        PyExc_RuntimeError, NULL);
    if (state->unsupported_error == NULL) {
        return -1;
    }
    Py_INCREF(state->unsupported_error);
    if (PyModule_AddObject(module, "UnsupportedAllocatorError", state->unsupported_error) < 0) {
        Py_DECREF(state->unsupported_error);
        return -1;
    }
    if (PyModule_AddIntConstant(module, "MMAP_THRESHOLD_MAX", (long)MR_MMAP_THRESHOLD_MAX) < 0) {
        return -1;
    }
    if (PyModule_AddFunctions(module, mr_diag_methods) < 0) {
        return -1;
    }
    return 0;
}

static int core_traverse(PyObject *module, visitproc visit, void *arg)
{
    core_state *state = get_state(module);
    Py_VISIT(state->trim_result_type);
    Py_VISIT(state->memory_stats_type);
    Py_VISIT(state->heap_stats_type);
    Py_VISIT(state->unsupported_error);
    return 0;
}

static int core_clear(PyObject *module)
{
    core_state *state = get_state(module);
    Py_CLEAR(state->trim_result_type);
    Py_CLEAR(state->memory_stats_type);
    Py_CLEAR(state->heap_stats_type);
    Py_CLEAR(state->unsupported_error);
    Py_CLEAR(state->allocator_name);
    return 0;
}

static void core_free(void *module)
{
    core_state *state = get_state((PyObject *)module);
    (void)core_clear((PyObject *)module);
    if (state != NULL && state->statm_ready) {
        mr_statm_close(&state->statm);
    }
}

static PyModuleDef_Slot core_slots[] = {
    {Py_mod_exec, (void *)core_exec},
/* Each slot is guarded by the macro that defines its VALUE: from 3.15 the slot names are always
 * defined while the values stay hidden where they were added (3.12, 3.13). */
#ifdef Py_MOD_PER_INTERPRETER_GIL_SUPPORTED
    /* Each interpreter gets its own module state (no static PyObject*, no static type); the
     * process-wide parts (the detected backend, the fork generation, the statm lock) are C data
     * set once under pthread_once or guarded by their own lock. */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_MOD_GIL_NOT_USED
    /* Nothing here relies on the GIL: the module state is read-only after exec, the kept statm
     * descriptor is locked in procfs.c, the pools capsule is looked up per call, and alloc.c
     * detects once under pthread_once. tools/freethreaded_build.sh checks this slot. */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    "memreclaim._core",
    "memreclaim's C core: trim, rss, stats, allocator detection and knobs.",
    sizeof(core_state),
    core_methods,
    core_slots,
    core_traverse,
    core_clear,
    core_free,
};

PyMODINIT_FUNC PyInit__core(void)
{
    return PyModuleDef_Init(&core_module);
}

/* memreclaim._core: trim, rss, stats and heap_stats: the allocator's trim with the GIL released,
 * the releases of library pools and pymalloc pools around it, the THP marking after it, each
 * measured from /proc/self/statm; and the allocator's and the kernel's figures for stats().
 */
#include "memreclaim.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Looked up on every trim(pools=True), not cached in the module state: a cached pointer written
 * by whichever thread comes first would be shared mutable state without the GIL, and the lookup
 * (a sys.modules hit and an attribute) costs microseconds next to a trim. */
static const mr_pools_capi *get_pools(mr_core_state *Py_UNUSED(state))
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

/* ---- allocators inside libraries ------------------------------------------------------------- */

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

/* The drop in anonymous resident bytes from one statm reading to another, never negative; -1
 * when either reading failed (its errno is not 0). */
static int64_t anon_drop(int before_err, const mr_rss_sample *before, int after_err,
                         const mr_rss_sample *after)
{
    if (before_err != 0 || after_err != 0) {
        return -1;
    }
    return before->anon > after->anon ? before->anon - after->anon : 0;
}

/* parts[key] = bytes, or None when either reading failed. Returns -1 with an exception set. */
static int set_part(PyObject *parts, const char *key, int before_err, const mr_rss_sample *before,
                    int after_err, const mr_rss_sample *after)
{
    int rc;
    PyObject *value = mr_int_or_none(anon_drop(before_err, before, after_err, after));
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
    started = mr_monotonic_seconds();
    thp->mode_err = mr_thp_mode_read(&thp->mode, thp->failed, sizeof(thp->failed));
    if (thp->mode_err == 0 && thp->mode == MR_THP_ALWAYS && atomic_load(&thp_marking)) {
        thp->attempted = 1;
        thp->mark_err = mr_thp_mark_heap(&thp->marked);
    }
    *seconds += mr_monotonic_seconds() - started;
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
    if ((mode = mr_str_or_none(name)) == NULL) {
        Py_XDECREF(reason);
        return -1;
    }
    PyStructSequence_SetItem(result, first, mode);
    if ((marked = mr_int_or_none(bytes)) == NULL) {
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

PyDoc_STRVAR(set_thp_marking_doc,
             "set_thp_marking($module, enabled, /)\n--\n\n"
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

/* ---- process totals -------------------------------------------------------------------------- */

/* Upper bounds (seconds) of the trim-duration histogram; a last bucket holds the rest. */
static const double seconds_bounds[] = {0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5};
#define MR_NBOUNDS (sizeof(seconds_bounds) / sizeof(seconds_bounds[0]))

/* What every trim in this process added up to since it started, or since the fork that made it:
 * one account for the process (every interpreter's trims count), counted by trim() itself, so no
 * caller can bypass it. Its lock is held for a few additions; the fork handlers take it, so a
 * child never inherits it held, and the child starts from zero (its parent's trims are not its
 * own). */
static struct {
    long long trims, unproductive, released;
    double seconds;
    long long buckets[MR_NBOUNDS + 1];
} account;
static pthread_mutex_t totals_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t totals_once = PTHREAD_ONCE_INIT;
static int totals_once_err;

static void totals_before_fork(void)
{
    (void)pthread_mutex_lock(&totals_lock);
}

static void totals_after_fork_in_parent(void)
{
    (void)pthread_mutex_unlock(&totals_lock);
}

static void totals_after_fork_in_child(void)
{
    memset(&account, 0, sizeof(account));
    (void)pthread_mutex_unlock(&totals_lock);
}

static void totals_init_once(void)
{
    totals_once_err =
        pthread_atfork(totals_before_fork, totals_after_fork_in_parent, totals_after_fork_in_child);
}

int mr_totals_init(void)
{
    (void)pthread_once(&totals_once, totals_init_once);
    return totals_once_err;
}

/* Count one trim that gave back `released` bytes (< 0: unknown) in `seconds`. Pure C. */
static void totals_add(int64_t released, double seconds)
{
    size_t slot = 0;
    while (slot < MR_NBOUNDS && !(seconds <= seconds_bounds[slot])) {
        slot++;
    }
    (void)pthread_mutex_lock(&totals_lock);
    account.trims++;
    account.seconds += seconds;
    account.buckets[slot]++;
    if (released < MR_UNPRODUCTIVE_BELOW) {
        account.unproductive++;
    }
    if (released > 0) {
        account.released += released;
    }
    (void)pthread_mutex_unlock(&totals_lock);
}

static PyObject *bound_item(const void *bounds, size_t i)
{
    return PyFloat_FromDouble(((const double *)bounds)[i]);
}

int mr_totals_add_constants(PyObject *module)
{
    PyObject *bounds = mr_tuple_of(seconds_bounds, MR_NBOUNDS, bound_item);
    if (bounds == NULL) {
        return -1;
    }
    if (PyModule_AddObject(module, "SECONDS_BUCKETS", bounds) < 0) {
        Py_DECREF(bounds);
        return -1;
    }
    return PyModule_AddIntConstant(module, "UNPRODUCTIVE_BELOW", (long)MR_UNPRODUCTIVE_BELOW);
}

PyDoc_STRVAR(totals_doc,
             "totals() -> TrimTotals\n\n"
             "What every trim() in this process added up to since it started (or since the fork\n"
             "that made it): trims, the unproductive ones (under UNPRODUCTIVE_BELOW bytes, 1 MiB,\n"
             "or an unknown amount given back), released_bytes, seconds, and seconds_buckets (how\n"
             "many took at most each SECONDS_BUCKETS bound, then the rest). trim() counts itself,\n"
             "whoever calls it; a consistent copy.");

static PyObject *core_totals(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyObject *result;
    int64_t counts[3], buckets[MR_NBOUNDS + 1];
    double seconds;

    (void)pthread_mutex_lock(&totals_lock);
    counts[0] = account.trims;
    counts[1] = account.unproductive;
    counts[2] = account.released;
    seconds = account.seconds;
    for (size_t i = 0; i <= MR_NBOUNDS; i++) {
        buckets[i] = account.buckets[i];
    }
    (void)pthread_mutex_unlock(&totals_lock);
    result = mr_new_result_ints(module, MR_TRIM_TOTALS, 0, counts, 3);
    if (result == NULL || mr_result_put(result, 3, PyFloat_FromDouble(seconds)) < 0 ||
        mr_result_put(result, 4, mr_tuple_of_ints(buckets, MR_NBOUNDS + 1)) < 0) {
        return NULL;
    }
    return result;
}

PyDoc_STRVAR(record_trim_doc,
             "_record_trim(released, seconds, /) -> None\n\n"
             "Count a trim made outside trim() in totals(): released bytes (None: unknown) in\n"
             "seconds. TypeError/ValueError (released a negative int, seconds negative or not\n"
             "finite) before anything is counted.");

static PyObject *core_record_trim(PyObject *Py_UNUSED(module), PyObject *const *args,
                                  Py_ssize_t nargs)
{
    long long released = -1;
    double seconds;

    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "_record_trim() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    if (args[0] != Py_None &&
        mr_parse_bounded_int(args[0], "released", 0, LLONG_MAX, &released) < 0) {
        return NULL;
    }
    if (PyBool_Check(args[1]) || (!PyFloat_Check(args[1]) && !PyLong_Check(args[1]))) {
        PyErr_Format(PyExc_TypeError, "seconds must be a float, not %.100s",
                     Py_TYPE(args[1])->tp_name);
        return NULL;
    }
    seconds = PyFloat_AsDouble(args[1]);
    if (seconds == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (!isfinite(seconds) || seconds < 0) {
        PyErr_Format(PyExc_ValueError, "seconds must be finite and not negative, got %R", args[1]);
        return NULL;
    }
    totals_add((int64_t)released, seconds);
    Py_RETURN_NONE;
}

/* ---- trim ------------------------------------------------------------------------------------ */

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

/* One trim() call: the readings around each release, and what the result reports. */
typedef struct {
    mr_core_state *state;
    PyObject *parts; /* dict: bytes each allocator gave back */
    mr_rss_sample before, mark, after;
    int before_err, mark_err, after_err; /* 0 or the errno of that statm reading */
    double seconds;
    mr_pools_result pools;
    thp_outcome thp;
} trim_run;

/* TrimResult.released: the drop in anonymous resident bytes, never negative; -1 when either
 * reading failed. */
static int64_t run_released(const trim_run *run)
{
    return anon_drop(run->before_err, &run->before, run->after_err, &run->after);
}

/* Read statm now, set parts[key] to the drop since the mark, and move the mark here. The statm
 * reads keep the GIL: about a microsecond (procfs.c locks the kept descriptor itself, so
 * free-threaded builds need no GIL for them). -1 with an exception set. */
static int trim_mark(trim_run *run, const char *key)
{
    run->after_err = mr_statm_read(&run->state->statm, &run->after);
    if (set_part(run->parts, key, run->mark_err, &run->mark, run->after_err, &run->after) < 0) {
        return -1;
    }
    run->mark = run->after;
    run->mark_err = run->after_err;
    return 0;
}

/* Allocators inside libraries (pyarrow bundles jemalloc or mimalloc): their memory is not
 * malloc's, so only their own call gives it back. Each release is a Python callable, called with
 * the GIL held; `libraries` was checked by check_libraries. */
static int release_libraries(trim_run *run, PyObject *libraries)
{
    for (Py_ssize_t i = 0; libraries != NULL && i < PyTuple_GET_SIZE(libraries); i++) {
        PyObject *pair = PyTuple_GET_ITEM(libraries, i);
        const char *name = PyUnicode_AsUTF8(PyTuple_GET_ITEM(pair, 0)); /* cached: checked */
        PyObject *item = PyObject_CallNoArgs(PyTuple_GET_ITEM(pair, 1));
        if (item == NULL || name == NULL) {
            Py_XDECREF(item);
            return -1;
        }
        Py_DECREF(item);
        if (trim_mark(run, name) < 0) {
            return -1;
        }
    }
    return 0;
}

/* The allocator's own trim, with the GIL released; then, under THP "always", the heap marking that
 * keeps what was given back given back. The clock is read inside the released region: waiting to
 * get the GIL back afterwards is not the trim's cost. -1 with OSError set. */
static int trim_allocator(trim_run *run)
{
    const mr_backend *backend = run->state->backend;
    double started, seconds;
    int err;

    Py_BEGIN_ALLOW_THREADS
    started = mr_monotonic_seconds();
    err = backend->trim();
    seconds = mr_monotonic_seconds() - started;
    Py_END_ALLOW_THREADS
    run->seconds += seconds;
    run->after_err = mr_statm_read(&run->state->statm, &run->after);
    if (err != 0) {
        errno = err;
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    thp_after_trim(&run->thp, &run->seconds);
    /* Counted here, once per trim made, whoever called: the released bytes are the result's. */
    totals_add(run_released(run), run->seconds);
    if (backend->kind == MR_ALLOC_UNKNOWN) {
        return 0;
    }
    return set_part(run->parts, backend->name, run->mark_err, &run->mark, run->after_err,
                    &run->after);
}

/* TrimResult's first five fields: released, rss_before, rss_after, anon_before, anon_after. */
static int set_measured(PyObject *result, const trim_run *run)
{
    int64_t measured[5] = {run_released(run), -1, -1, -1, -1};
    if (run->before_err == 0) {
        measured[1] = run->before.resident;
        measured[3] = run->before.anon;
    }
    if (run->after_err == 0) {
        measured[2] = run->after.resident;
        measured[4] = run->after.anon;
    }
    return mr_set_ints(result, 0, measured, 5);
}

/* The TrimResult of `run`; it takes run->parts (NULL there after) on success only. */
static PyObject *trim_result(trim_run *run)
{
    mr_core_state *state = run->state;
    PyObject *result = PyStructSequence_New(state->types[MR_TRIM_RESULT]), *item;
    int64_t pool_figures[2] = {run->pools.pools_released, run->pools.bytes_released};

    if (result == NULL || set_measured(result, run) < 0 ||
        (item = PyFloat_FromDouble(run->seconds)) == NULL) {
        Py_XDECREF(result);
        return NULL;
    }
    PyStructSequence_SetItem(result, 5, item);
    Py_INCREF(state->allocator_name);
    PyStructSequence_SetItem(result, 6, state->allocator_name);
    if ((item = PyUnicode_FromString(state->backend->trim_method)) == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    PyStructSequence_SetItem(result, 7, item);
    if (mr_set_ints(result, 8, pool_figures, 2) < 0 ||
        (item = mr_str_or_none(mr_backend_via())) == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    PyStructSequence_SetItem(result, 10, item);
    if ((item = mr_str_or_none(mr_backend_reason())) == NULL) {
        Py_DECREF(result);
        return NULL;
    }
    PyStructSequence_SetItem(result, 11, item);
    if (set_thp_fields(result, 13, &run->thp) < 0) {
        Py_DECREF(result);
        return NULL;
    }
    PyStructSequence_SetItem(result, 12, run->parts); /* the result owns it now */
    run->parts = NULL;
    return result;
}

static PyObject *core_trim(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"pools", "libraries", NULL};
    PyObject *pools_arg = NULL, *libraries = NULL, *result = NULL;
    const mr_pools_capi *pools = NULL;
    trim_run run;
    int with_pools;
    double started;

    memset(&run, 0, sizeof(run));
    run.state = mr_state(module);
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OO:trim", keywords, &pools_arg, &libraries) ||
        mr_parse_flag(pools_arg, "pools", &with_pools) < 0 ||
        (libraries != NULL && check_libraries(libraries) < 0) ||
        (with_pools && (pools = get_pools(run.state)) == NULL) ||
        (run.parts = PyDict_New()) == NULL) {
        return NULL;
    }
    run.before_err = mr_statm_read(&run.state->statm, &run.before);
    run.mark = run.before;
    run.mark_err = run.before_err;
    started = mr_monotonic_seconds();
    if (release_libraries(&run, libraries) < 0) {
        goto done;
    }
    /* Pool reclaim walks pymalloc's structures: it needs the GIL held. */
    if (pools != NULL && (pools->reclaim(&run.pools) < 0 || trim_mark(&run, "pymalloc") < 0)) {
        goto done;
    }
    run.seconds = mr_monotonic_seconds() - started;
    if (trim_allocator(&run) == 0) {
        result = trim_result(&run);
    }
done:
    Py_XDECREF(run.parts); /* handed to the result only on success, as its last step */
    return result;
}

/* ---- rss ------------------------------------------------------------------------------------- */

PyDoc_STRVAR(rss_doc,
             "rss() -> int\n\n"
             "Resident bytes of this process now (not the high-water mark that\n"
             "resource.getrusage reports). Cheap: one pread on a kept descriptor, reopened\n"
             "after fork(). Raises OSError when /proc/self/statm cannot be read.");

static PyObject *core_rss(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    mr_rss_sample sample;
    /* GIL kept: a pread of a few bytes, shorter than a release/acquire pair. */
    int err = mr_statm_read(&mr_state(module)->statm, &sample);
    if (err != 0) {
        return mr_raise_proc_error(err, "/proc/self/statm");
    }
    return PyLong_FromLongLong((long long)sample.resident);
}

PyDoc_STRVAR(sample_doc,
             "sample() -> Sample\n\n"
             "This process's resident, anonymous resident and mapped bytes, from one read of\n"
             "/proc/self/statm (the descriptor rss() keeps): a runner tick's reading. Raises\n"
             "OSError when /proc/self/statm cannot be read.");

static PyObject *core_sample(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    mr_rss_sample sample;
    int64_t figures[3];
    /* GIL kept, as in rss(). */
    int err = mr_statm_read(&mr_state(module)->statm, &sample);
    if (err != 0) {
        return mr_raise_proc_error(err, "/proc/self/statm");
    }
    figures[0] = sample.resident;
    figures[1] = sample.anon;
    figures[2] = sample.vsize;
    return mr_new_result_ints(module, MR_SAMPLE, 0, figures, 3);
}

/* ---- heap stats ------------------------------------------------------------------------------ */

static PyObject *build_heap_stats(mr_core_state *state)
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
    result = PyStructSequence_New(state->types[MR_HEAP_STATS]);
    if (result == NULL) {
        Py_DECREF(figures);
        return NULL;
    }
    Py_INCREF(state->allocator_name);
    PyStructSequence_SetItem(result, 0, state->allocator_name);
    PyStructSequence_SetItem(result, 4, figures);
    int64_t totals[3] = {raw.in_use, raw.free, raw.mapped};
    if (mr_set_ints(result, 1, totals, 3) < 0) {
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
    return build_heap_stats(mr_state(module));
}

/* ---- stats ----------------------------------------------------------------------------------- */

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
    *mode = mr_str_or_none(thp_err == 0 ? mr_thp_mode_name(thp) : NULL);
    *huge = mr_int_or_none(rollup_err == 0 ? rollup.anon_huge_pages : -1);
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
    mr_core_state *state = mr_state(module);
    PyObject *heap_arg = NULL, *heap = NULL, *current = NULL, *peak = NULL, *result = NULL;
    PyObject *via = NULL, *reason = NULL, *libraries = NULL, *libraries_arg = NULL;
    PyObject *thp_mode = NULL, *huge = NULL;
    mr_status status;
    int with_heap, err;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$OO:stats", keywords, &heap_arg,
                                     &libraries_arg) ||
        mr_parse_flag(heap_arg, "heap", &with_heap) < 0) {
        return NULL;
    }
    if (libraries_arg != NULL && libraries_arg != Py_None && !PyDict_Check(libraries_arg)) {
        PyErr_Format(PyExc_TypeError, "stats() libraries must be a dict or None, not %.100s",
                     Py_TYPE(libraries_arg)->tp_name);
        return NULL;
    }
    err = mr_status_read(0, &status);
    if (err != 0) {
        return mr_raise_proc_error(err, "/proc/self/status");
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
    if (traced_memory(&current, &peak) < 0 || (via = mr_str_or_none(mr_backend_via())) == NULL ||
        (reason = mr_str_or_none(mr_backend_reason())) == NULL ||
        (libraries = (libraries_arg == NULL || libraries_arg == Py_None)
                         ? PyDict_New()
                         : PyDict_Copy(libraries_arg)) == NULL ||
        thp_stats(&thp_mode, &huge, with_heap) < 0) {
        goto error;
    }
    result = PyStructSequence_New(state->types[MR_MEMORY_STATS]);
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
    if (mr_set_ints(result, 0, figures, 6) < 0) {
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

/* ---- method table ---------------------------------------------------------------------------- */

PyMethodDef mr_heap_methods[] = {
    {"trim", (PyCFunction)(void (*)(void))core_trim, METH_VARARGS | METH_KEYWORDS, trim_doc},
    {"rss", core_rss, METH_NOARGS, rss_doc},
    {"sample", core_sample, METH_NOARGS, sample_doc},
    {"stats", (PyCFunction)(void (*)(void))core_stats, METH_VARARGS | METH_KEYWORDS, stats_doc},
    {"heap_stats", core_heap_stats, METH_NOARGS, heap_stats_doc},
    {"set_thp_marking", core_set_thp_marking, METH_O, set_thp_marking_doc},
    {"totals", core_totals, METH_NOARGS, totals_doc},
    {"_record_trim", (PyCFunction)(void (*)(void))core_record_trim, METH_FASTCALL, record_trim_doc},
    {NULL, NULL, 0, NULL},
};

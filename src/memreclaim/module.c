/* memreclaim._core: the module (state, result types, method tables, multi-phase init) and the
 * Python glue every other file of the module shares (conversions, argument checks, errors).
 *
 * The work is done by procfs.c (/proc readers), detect.c and backends.c (the allocator) and thp.c,
 * which never touch Python objects; heap.c (trim, stats, totals), inspect.c (readers of this and
 * other processes) and knobs.c (allocator settings, a thread's share) speak Python. Built for each
 * interpreter (no limited API: free-threaded builds reject it), and safe without the GIL and under
 * per-interpreter GILs: the module state is written only by exec and read-only after, the kept
 * statm descriptor has its own lock (procfs.c), and the process-wide parts (allocator detection,
 * fork generation) are set once under pthread_once.
 */
#include "memreclaim.h"
#include "diag.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- result types ---------------------------------------------------------------------------- */

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

static PyStructSequence_Field trim_totals_fields[] = {
    {"trims", "trims made in this process since it started (or since the fork that made it)"},
    {"unproductive", "those that gave back less than UNPRODUCTIVE_BELOW bytes (1 MiB) or an "
                     "unknown amount"},
    {"released_bytes", "bytes they gave back (the sum of TrimResult.released; unknown counts 0)"},
    {"seconds", "seconds they took (the sum of TrimResult.seconds)"},
    {"seconds_buckets", "tuple: how many took at most each SECONDS_BUCKETS bound (not counted in "
                        "the earlier ones), then how many took longer"},
    {NULL, NULL},
};

static PyStructSequence_Desc trim_totals_desc = {
    "memreclaim.TrimTotals",
    "What every trim() in this process added up to since it started (or since the fork that made "
    "it); totals() returns it.",
    trim_totals_fields,
    5,
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

static PyStructSequence_Field collect_result_fields[] = {
    {"method", "what was called for the calling thread ('none' when nothing)"},
    {"anon_before", "anonymous resident bytes before the call (None if unreadable)"},
    {"anon_after", "anonymous resident bytes after the call (None if unreadable)"},
    {"seconds", "seconds the call took"},
    {NULL, NULL},
};

static PyStructSequence_Desc collect_result_desc = {
    "memreclaim.CollectResult",
    "The outcome of collect_thread(): the calling thread's share of giving memory back.",
    collect_result_fields,
    4,
};

static PyStructSequence_Field process_status_fields[] = {
    {"name", "the command (Name)"},
    {"threads", "threads (Threads), or None"},
    {"rss", "resident bytes (VmRSS), or None"},
    {"rss_anon", "anonymous resident bytes (RssAnon), or None"},
    {"rss_file", "file-backed resident bytes (RssFile), or None"},
    {"rss_shmem", "shared-memory resident bytes (RssShmem), or None"},
    {"swap", "swapped-out bytes (VmSwap), or None"},
    {"peak_rss", "the high-water mark of resident bytes (VmHWM), or None"},
    {"virtual", "virtual size in bytes (VmSize), or None"},
    {NULL, NULL},
};

static PyStructSequence_Desc process_status_desc = {
    "memreclaim._core.ProcessStatus",
    "A process's figures from /proc/PID/status (process_status()); None where the kernel does "
    "not report one.",
    process_status_fields,
    9,
};

static PyStructSequence_Field process_rollup_fields[] = {
    {"pss", "proportional set size in bytes (Pss), or None"},
    {"private_dirty", "bytes (Private_Dirty), or None"},
    {"shared_clean", "bytes (Shared_Clean), or None"},
    {"anonymous", "anonymous bytes (Anonymous), or None"},
    {"anon_huge_pages", "anonymous bytes in huge pages (AnonHugePages), or None"},
    {NULL, NULL},
};

static PyStructSequence_Desc process_rollup_desc = {
    "memreclaim._core.ProcessRollup",
    "A process's /proc/PID/smaps_rollup in bytes (process_rollup()); None where absent.",
    process_rollup_fields,
    5,
};

static PyStructSequence_Field proc_identity_fields[] = {
    {"uid", "the effective uid (the second number of the Uid: line of /proc/PID/status)"},
    {"start_time", "when it started, in clock ticks after boot (field 22 of /proc/PID/stat)"},
    {NULL, NULL},
};

static PyStructSequence_Desc proc_identity_desc = {
    "memreclaim._core.ProcessIdentity",
    "Who a process is (process_identity()): its owner and its start time, which tells a pid "
    "reused by a later process apart.",
    proc_identity_fields,
    2,
};

static PyStructSequence_Field mimalloc_areas_fields[] = {
    {"small", "in-use bytes in pages of small blocks"},
    {"large", "in-use bytes in pages of larger blocks"},
    {"committed", "committed bytes of the pages visited"},
    {"areas", "pages visited"},
    {"addresses", "tuple: the start addresses of the first pages visited (at most 4096)"},
    {NULL, NULL},
};

static PyStructSequence_Desc mimalloc_areas_desc = {
    "memreclaim._core.MimallocAreas",
    "The calling thread's mimalloc heap, page by page (mimalloc_areas()).",
    mimalloc_areas_fields,
    5,
};

static PyStructSequence_Field thp_settings_fields[] = {
    {"mode", "the mode governing 2 MiB pages: 'always', 'madvise', 'never' (pmd_enabled unless it "
             "is 'inherit', else enabled), or None"},
    {"enabled", "the bracketed word of enabled, or None"},
    {"pmd_enabled", "the bracketed word of hugepages-2048kB/enabled (6.8+), or None"},
    {"defrag", "the bracketed word of defrag, or None"},
    {"pmd_size", "hpage_pmd_size in bytes, or None"},
    {"max_ptes_none", "khugepaged/max_ptes_none, or None"},
    {"scan_sleep_millisecs", "khugepaged/scan_sleep_millisecs, or None"},
    {NULL, NULL},
};

static PyStructSequence_Desc thp_settings_desc = {
    "memreclaim.ThpSettings",
    "The transparent-huge-page settings (thp_settings()); None where the kernel has no such "
    "file.",
    thp_settings_fields,
    7,
};

static PyStructSequence_Field thp_marked_fields[] = {
    {"ranges", "heap ranges marked MADV_NOHUGEPAGE"},
    {"bytes", "bytes in them"},
    {"skipped", "ranges unmapped meanwhile by another thread"},
    {NULL, NULL},
};

static PyStructSequence_Desc thp_marked_desc = {
    "memreclaim._core.ThpMarked",
    "What _thp_mark_heap() marked.",
    thp_marked_fields,
    3,
};

static PyStructSequence_Field sample_fields[] = {
    {"rss", "resident bytes"},
    {"anon", "anonymous resident bytes (resident minus file-backed and shared)"},
    {"vsize", "the mapped address space in bytes (VmSize)"},
    {NULL, NULL},
};

static PyStructSequence_Desc sample_desc = {
    "memreclaim._core.Sample",
    "This process's memory in one read of /proc/self/statm (sample()).",
    sample_fields,
    3,
};

/* Each result type's description, by its mr_type_id. */
static PyStructSequence_Desc *const result_descs[MR_NTYPES] = {
    [MR_TRIM_RESULT] = &trim_result_desc,
    [MR_MEMORY_STATS] = &memory_stats_desc,
    [MR_HEAP_STATS] = &heap_stats_desc,
    [MR_TRIM_TOTALS] = &trim_totals_desc,
    [MR_COLLECT_RESULT] = &collect_result_desc,
    [MR_PROCESS_STATUS] = &process_status_desc,
    [MR_PROCESS_ROLLUP] = &process_rollup_desc,
    [MR_MIMALLOC_AREAS] = &mimalloc_areas_desc,
    [MR_THP_SETTINGS] = &thp_settings_desc,
    [MR_THP_MARKED] = &thp_marked_desc,
    [MR_SAMPLE] = &sample_desc,
    [MR_PROC_IDENTITY] = &proc_identity_desc,
};

/* ---- shared Python glue (declared in memreclaim.h) ------------------------------------------- */

PyObject *mr_int_or_none(int64_t value)
{
    if (value < 0) {
        Py_RETURN_NONE;
    }
    return PyLong_FromLongLong((long long)value);
}

/* Fill slots [first, first + count) of a struct sequence from `values`; steals nothing. Returns
 * -1 with an exception set. */
int mr_set_ints(PyObject *result, Py_ssize_t first, const int64_t *values, Py_ssize_t count)
{
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = mr_int_or_none(values[i]);
        if (item == NULL) {
            return -1;
        }
        PyStructSequence_SetItem(result, first + i, item);
    }
    return 0;
}

PyObject *mr_tuple_of(const void *items, size_t count, mr_item_maker item)
{
    PyObject *tuple = PyTuple_New((Py_ssize_t)count);
    if (tuple == NULL) {
        return NULL;
    }
    for (size_t i = 0; i < count; i++) {
        PyObject *made = item(items, i);
        if (made == NULL) {
            Py_DECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, (Py_ssize_t)i, made);
    }
    return tuple;
}

static PyObject *int_item(const void *values, size_t i)
{
    return mr_int_or_none(((const int64_t *)values)[i]);
}

static PyObject *address_item(const void *values, size_t i)
{
    return PyLong_FromSize_t((size_t)((const uintptr_t *)values)[i]);
}

PyObject *mr_tuple_of_ints(const int64_t *values, size_t count)
{
    return mr_tuple_of(values, count, int_item);
}

PyObject *mr_tuple_of_addresses(const uintptr_t *values, size_t count)
{
    return mr_tuple_of(values, count, address_item);
}

PyObject *mr_new_result_ints(PyObject *module, mr_type_id id, Py_ssize_t first,
                             const int64_t *values, Py_ssize_t count)
{
    PyObject *result = mr_new_result(module, id);
    if (result != NULL && mr_set_ints(result, first, values, count) < 0) {
        Py_CLEAR(result);
    }
    return result;
}

int mr_result_put(PyObject *result, Py_ssize_t i, PyObject *item)
{
    if (item == NULL) {
        Py_DECREF(result);
        return -1;
    }
    PyStructSequence_SetItem(result, i, item);
    return 0;
}

double mr_monotonic_seconds(void)
{
    struct timespec ts;
    (void)clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* OSError with errno, filename naming the /proc file we could not read. */
PyObject *mr_raise_proc_error(int err, const char *path)
{
    PyObject *args = Py_BuildValue("(iss)", err, strerror(err), path);
    if (args != NULL) {
        PyErr_SetObject(PyExc_OSError, args);
        Py_DECREF(args);
    }
    return NULL;
}

PyObject *mr_raise_unsupported(mr_core_state *state, const char *function)
{
    PyErr_Format(state->unsupported_error,
                 "%s() needs glibc's malloc, but this process's malloc is served by %U", function,
                 state->allocator_name);
    return NULL;
}

/* glibc serves malloc but `symbol` was not found in it (hidden, or interposed by a tool). */
PyObject *mr_raise_missing(mr_core_state *state, const char *function, const char *symbol)
{
    PyErr_Format(state->unsupported_error,
                 "%s() needs %s(), which the %U allocator serving malloc in this process does "
                 "not provide",
                 function, symbol, state->allocator_name);
    return NULL;
}

/* Keyword-only boolean flag: True/False only, so a typo like heap="no" is a TypeError. */
int mr_parse_flag(PyObject *value, const char *name, int *out)
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
int mr_parse_bounded_int(PyObject *value, const char *name, long long min, long long max,
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

/* str from a C string, or None for NULL. */
PyObject *mr_str_or_none(const char *text)
{
    if (text == NULL) {
        Py_RETURN_NONE;
    }
    return PyUnicode_FromString(text);
}

/* ---- allocator ------------------------------------------------------------------------------- */

PyDoc_STRVAR(allocator_doc, "allocator() -> str\n\n"
                            "Which allocator serves malloc in this process: 'glibc', 'jemalloc',\n"
                            "'mimalloc', 'tcmalloc', or 'unknown' (musl, or an LD_PRELOADed\n"
                            "allocator with no purge interface we know).");

static PyObject *core_allocator(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyObject *name = mr_state(module)->allocator_name;
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

PyDoc_STRVAR(symbol_object_doc,
             "_symbol_object(name, /) -> str | None\n\n"
             "The path of the loaded shared object that defines the function or data symbol\n"
             "name (its dynamic symbol table; the object calls are bound to when several do),\n"
             "or None when no loaded object defines it. The diagnosis names the library of a\n"
             "native leak's allocating function with it.");

static PyObject *core_symbol_object(PyObject *Py_UNUSED(module), PyObject *arg)
{
    char path[PATH_MAX];
    const char *name;
    Py_ssize_t length;
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "name must be a str, not %.80s", Py_TYPE(arg)->tp_name);
        return NULL;
    }
    name = PyUnicode_AsUTF8AndSize(arg, &length);
    if (name == NULL) {
        return NULL;
    }
    if (length == 0 || strlen(name) != (size_t)length) {
        PyErr_SetString(PyExc_ValueError, "name must be a non-empty symbol name without NUL");
        return NULL;
    }
    if (!mr_symbol_definer(name, path, sizeof(path))) {
        Py_RETURN_NONE;
    }
    return PyUnicode_DecodeFSDefault(path);
}

PyDoc_STRVAR(keep_forever_doc,
             "_keep_forever(obj, /) -> None\n\n"
             "Take one reference to obj that is never released, so that it outlives the\n"
             "interpreter's teardown: its finalizer never runs. For an epoll or socket object\n"
             "whose descriptor number the program closed under us and reused for a file of its\n"
             "own (closing ours would close the program's).");

static PyObject *core_keep_forever(PyObject *Py_UNUSED(module), PyObject *obj)
{
    Py_INCREF(obj); /* deliberately never released: see the docstring */
    Py_RETURN_NONE;
}

/* ---- module ---------------------------------------------------------------------------------- */

static PyMethodDef core_methods[] = {
    {"allocator", core_allocator, METH_NOARGS, allocator_doc},
    {"allocator_version", core_allocator_version, METH_NOARGS, allocator_version_doc},
    {"_keep_forever", core_keep_forever, METH_O, keep_forever_doc},
    {"_symbol_object", core_symbol_object, METH_O, symbol_object_doc},
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
    mr_core_state *state = mr_state(module);

    mr_statm_init(&state->statm);
    state->statm_ready = 1;
    mr_procfs_global_init();
    errno = mr_totals_init();
    if (errno != 0) {
        PyErr_SetFromErrno(PyExc_OSError); /* pthread_atfork: ENOMEM */
        return -1;
    }
    state->backend = mr_backend_detect();
    state->allocator_name = PyUnicode_InternFromString(state->backend->name);
    if (state->allocator_name == NULL) {
        return -1;
    }
    if (PyModule_AddFunctions(module, mr_heap_methods) < 0 ||
        PyModule_AddFunctions(module, mr_inspect_methods) < 0 ||
        PyModule_AddFunctions(module, mr_knobs_methods) < 0) {
        return -1;
    }
    for (int i = 0; i < MR_NTYPES; i++) {
        if (add_type(module, &state->types[i], result_descs[i]) < 0) {
            return -1;
        }
    }
    if (mr_totals_add_constants(module) < 0) {
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
    mr_core_state *state = mr_state(module);
    for (int i = 0; i < MR_NTYPES; i++) {
        Py_VISIT(state->types[i]);
    }
    Py_VISIT(state->unsupported_error);
    return 0;
}

static int core_clear(PyObject *module)
{
    mr_core_state *state = mr_state(module);
    for (int i = 0; i < MR_NTYPES; i++) {
        Py_CLEAR(state->types[i]);
    }
    Py_CLEAR(state->unsupported_error);
    Py_CLEAR(state->allocator_name);
    return 0;
}

static void core_free(void *module)
{
    mr_core_state *state = mr_state((PyObject *)module);
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
     * process-wide parts (the detected backend, the fork generation, the statm lock, the trim
     * totals) are C data set once under pthread_once or guarded by their own lock. */
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
#ifdef Py_MOD_GIL_NOT_USED
    /* Nothing here relies on the GIL: the module state is read-only after exec, the kept statm
     * descriptor is locked in procfs.c and the process totals in heap.c, the pools capsule is
     * looked up per call, and detect.c detects once under pthread_once. tools/freethreaded_build.sh
     * checks this slot. */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    "memreclaim._core",
    "memreclaim's C core: trim, rss, stats, allocator detection and knobs.",
    sizeof(mr_core_state),
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

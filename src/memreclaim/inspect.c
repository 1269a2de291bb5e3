/* memreclaim._core: readers for inspection: another process's /proc (status, who it is,
 * smaps_rollup, the [heap] mapping), the calling thread's mimalloc heap page by page, and the
 * transparent-huge-page settings and heap ranges (the last two also from files laid out like
 * them, for the tests).
 */
#include "memreclaim.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- another process's /proc ----------------------------------------------------------------- */

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

PyDoc_STRVAR(process_status_doc,
             "process_status($module, pid, /)\n--\n\n"
             "Process pid's figures from /proc/PID/status: name, threads, and in bytes rss,\n"
             "rss_anon, rss_file, rss_shmem, swap, peak_rss (VmHWM), virtual (VmSize); None\n"
             "where the kernel does not report one. The file is readable by\n"
             "anyone. Raises ProcessLookupError (ESRCH) when there is no such process,\n"
             "PermissionError when the file is not readable, other OSErrors with their errno;\n"
             "TypeError/ValueError for a pid that is not a positive int.");

static PyObject *core_process_status(PyObject *module, PyObject *arg)
{
    mr_status status;
    PyObject *result;
    int pid, err;

    if (parse_pid(arg, &pid) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    err = mr_status_read(pid, &status);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        return raise_pid_error(err, pid, "status");
    }
    const int64_t figures[] = {status.threads,   status.rss,  status.rss_anon, status.rss_file,
                               status.rss_shmem, status.swap, status.peak_rss, status.virtual_size};
    result = mr_new_result_ints(module, MR_PROCESS_STATUS, 1, figures, 8);
    if (result == NULL ||
        mr_result_put(
            result, 0,
            PyUnicode_DecodeUTF8(status.name, (Py_ssize_t)strlen(status.name), "replace")) < 0) {
        return NULL;
    }
    return result;
}

PyDoc_STRVAR(process_identity_doc,
             "process_identity($module, pid, /)\n--\n\n"
             "Who process pid is: uid, its effective uid (the Uid: line of /proc/PID/status),\n"
             "and start_time, when it started in clock ticks after boot (field 22 of\n"
             "/proc/PID/stat; a later process given the same pid has a later one). Both files\n"
             "are read through one open /proc/PID, so both figures are of the same process.\n"
             "Readable by anyone (unless /proc is mounted with hidepid). Raises\n"
             "ProcessLookupError (ESRCH) when there is no such process (or it exits meanwhile),\n"
             "PermissionError when the files are not readable, OSError(EIO) when one is not\n"
             "what the kernel writes; TypeError/ValueError for a pid that is not a positive int.");

static PyObject *core_process_identity(PyObject *module, PyObject *arg)
{
    mr_identity identity;
    const char *failed;
    int pid, err;

    if (parse_pid(arg, &pid) < 0) {
        return NULL;
    }
    /* The GIL is kept: two reads of a few hundred bytes, like the statm reads. */
    err = mr_identity_read(pid, &identity, &failed);
    if (err != 0 && failed != NULL) {
        return raise_pid_error(err, pid, failed);
    }
    if (err != 0) {
        char path[32];
        (void)snprintf(path, sizeof(path), "/proc/%d", pid);
        return mr_raise_proc_error(err, path);
    }
    const int64_t figures[] = {identity.uid, identity.start_time};
    return mr_new_result_ints(module, MR_PROC_IDENTITY, 0, figures, 2);
}

PyDoc_STRVAR(process_rollup_doc,
             "process_rollup($module, pid, /)\n--\n\n"
             "Process pid's /proc/PID/smaps_rollup, in bytes: pss, private_dirty,\n"
             "shared_clean, anonymous, anon_huge_pages (None where absent). Needs ptrace\n"
             "access to the process (its user, or CAP_SYS_PTRACE): PermissionError otherwise;\n"
             "ProcessLookupError when there is no such process; FileNotFoundError on kernels\n"
             "before 4.14 (no smaps_rollup).");

static PyObject *core_process_rollup(PyObject *module, PyObject *arg)
{
    mr_rollup rollup;
    int pid, err;

    if (parse_pid(arg, &pid) < 0) {
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS
    err = mr_rollup_read(pid, &rollup);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        return raise_pid_error(err, pid, "smaps_rollup");
    }
    const int64_t figures[] = {rollup.pss, rollup.private_dirty, rollup.shared_clean,
                               rollup.anonymous, rollup.anon_huge_pages};
    return mr_new_result_ints(module, MR_PROCESS_ROLLUP, 0, figures, 5);
}

PyDoc_STRVAR(process_heap_mapping_doc,
             "process_heap_mapping($module, pid, /)\n--\n\n"
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
    return mr_int_or_none(size);
}

/* ---- mimalloc's heap walk -------------------------------------------------------------------- */

#define MR_MI_MAX_ADDRESSES 4096

PyDoc_STRVAR(mimalloc_areas_doc,
             "mimalloc_areas(small_max, max_areas, /) -> MimallocAreas\n\n"
             "The calling thread's mimalloc heap, page by page (mi_heap_visit_blocks, walked in\n"
             "C with the GIL released): small and large in-use bytes (pages of blocks up to\n"
             "small_max bytes are small), committed bytes, areas (pages visited) and\n"
             "addresses (start of the first 4096 pages). Raises UnsupportedAllocatorError when\n"
             "the allocator is not mimalloc or does not export the walk, OSError (EOVERFLOW)\n"
             "when the walk passes max_areas pages, TypeError/ValueError/OverflowError for\n"
             "arguments that are not non-negative ints / positive ints.");

/* mimalloc_areas()'s two arguments: small_max a non-negative int, max_areas a positive one. */
static int parse_areas_args(PyObject *const *args, Py_ssize_t nargs, size_t *small_max,
                            size_t *max_areas)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "mimalloc_areas() takes 2 arguments (%zd given)", nargs);
        return -1;
    }
    for (int i = 0; i < 2; i++) {
        if (!PyLong_Check(args[i]) || PyBool_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "mimalloc_areas() argument %d must be int, not %.100s",
                         i + 1, Py_TYPE(args[i])->tp_name);
            return -1;
        }
    }
    *small_max = PyLong_AsSize_t(args[0]);
    if (*small_max == (size_t)-1 && PyErr_Occurred()) {
        return -1; /* OverflowError, also for a negative value */
    }
    *max_areas = PyLong_AsSize_t(args[1]);
    if (*max_areas == (size_t)-1 && PyErr_Occurred()) {
        return -1;
    }
    if (*max_areas == 0) {
        PyErr_SetString(PyExc_ValueError, "mimalloc_areas() max_areas must be positive");
        return -1;
    }
    return 0;
}

/* What mimalloc_areas() returns for a finished walk. */
static PyObject *areas_result(PyObject *module, const mr_mi_areas *walk)
{
    const int64_t figures[] = {(int64_t)walk->small_used, (int64_t)walk->large_used,
                               (int64_t)walk->committed, (int64_t)walk->areas};
    PyObject *result = mr_new_result_ints(module, MR_MIMALLOC_AREAS, 0, figures, 4);

    if (result == NULL ||
        mr_result_put(result, 4, mr_tuple_of_addresses(walk->addresses, walk->naddresses)) < 0) {
        return NULL;
    }
    return result;
}

static PyObject *core_mimalloc_areas(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    mr_mi_areas walk;
    size_t small_max, max_areas;
    int err;
    PyObject *result;

    if (parse_areas_args(args, nargs, &small_max, &max_areas) < 0) {
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
        result = mr_raise_missing(mr_state(module), "mimalloc_areas", "mi_heap_visit_blocks");
    } else if (err != 0) {
        errno = err;
        result = PyErr_SetFromErrno(PyExc_OSError);
    } else {
        result = areas_result(module, &walk);
    }
    PyMem_RawFree(walk.addresses);
    return result;
}

/* ---- transparent huge pages: settings, heap marking ------------------------------------------ */

/* The settings under dir (NULL: the system's) as a ThpSettings; OSError naming the file. */
static PyObject *thp_settings_result(PyObject *module, const char *dir)
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
    const char *words[] = {mr_thp_mode_name(mr_thp_settings_mode(&settings)), settings.enabled,
                           settings.pmd_enabled, settings.defrag};
    const int64_t numbers[] = {settings.pmd_size, settings.max_ptes_none,
                               settings.scan_sleep_millisecs};
    result = mr_new_result_ints(module, MR_THP_SETTINGS, 4, numbers, 3);
    for (Py_ssize_t i = 0; result != NULL && i < 4; i++) {
        const char *word = words[i] != NULL && words[i][0] != '\0' ? words[i] : NULL;
        if (mr_result_put(result, i, mr_str_or_none(word)) < 0) {
            return NULL;
        }
    }
    return result;
}

PyDoc_STRVAR(thp_settings_doc,
             "thp_settings() -> ThpSettings\n\n"
             "The transparent-huge-page settings under /sys/kernel/mm/transparent_hugepage:\n"
             "mode (the one governing 2 MiB pages: pmd_enabled unless it is 'inherit', else\n"
             "enabled), enabled and defrag (the bracketed words), pmd_enabled (the word of\n"
             "hugepages-2048kB/enabled on kernels with per-size settings, 6.8+), pmd_size\n"
             "(bytes), and khugepaged's max_ptes_none and scan_sleep_millisecs.\n"
             "None where the kernel has no such file (all of them without THP). Raises OSError\n"
             "naming the file when one exists but cannot be read or is not what it should be.");

static PyObject *core_thp_settings(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return thp_settings_result(module, NULL);
}

PyDoc_STRVAR(thp_settings_at_doc, "_thp_settings_at(directory, /) -> ThpSettings\n\n"
                                  "thp_settings() read from another directory laid out like\n"
                                  "/sys/kernel/mm/transparent_hugepage (for the tests).");

static PyObject *core_thp_settings_at(PyObject *module, PyObject *arg)
{
    PyObject *path = NULL, *result;
    if (!PyUnicode_FSConverter(arg, &path)) {
        return NULL;
    }
    result = thp_settings_result(module, PyBytes_AS_STRING(path));
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
    if (mr_parse_bounded_int(args[1], "pmd_size", 4096, (long long)1 << 40, &pmd_size) < 0) {
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
             "_thp_mark_heap() -> ThpMarked\n\n"
             "Mark the allocators' heap mappings MADV_NOHUGEPAGE now, whatever the THP mode\n"
             "(what trim() does after the allocator's trim under THP 'always'; for the tests):\n"
             "ranges and bytes marked, skipped (unmapped meanwhile). OSError on failure.");

static PyObject *core_thp_mark_heap(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    mr_thp_marked marked = {0, 0, 0};
    int err;

    Py_BEGIN_ALLOW_THREADS
    err = mr_thp_mark_heap(&marked);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    const int64_t figures[] = {marked.ranges, marked.bytes, marked.skipped};
    return mr_new_result_ints(module, MR_THP_MARKED, 0, figures, 3);
}

/* ---- method table ---------------------------------------------------------------------------- */

PyMethodDef mr_inspect_methods[] = {
    {"process_status", core_process_status, METH_O, process_status_doc},
    {"process_identity", core_process_identity, METH_O, process_identity_doc},
    {"process_rollup", core_process_rollup, METH_O, process_rollup_doc},
    {"process_heap_mapping", core_process_heap_mapping, METH_O, process_heap_mapping_doc},
    {"mimalloc_areas", (PyCFunction)(void (*)(void))core_mimalloc_areas, METH_FASTCALL,
     mimalloc_areas_doc},
    {"thp_settings", core_thp_settings, METH_NOARGS, thp_settings_doc},
    {"_thp_settings_at", core_thp_settings_at, METH_O, thp_settings_at_doc},
    {"_thp_heap_ranges", (PyCFunction)(void (*)(void))core_thp_heap_ranges, METH_FASTCALL,
     thp_heap_ranges_doc},
    {"_thp_mark_heap", core_thp_mark_heap, METH_NOARGS, thp_mark_heap_doc},
    {NULL, NULL, 0, NULL},
};

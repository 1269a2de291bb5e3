/* memreclaim._pools: give back the pages of empty pymalloc pools inside live arenas.
 *
 * pymalloc returns a 1 MiB arena to the OS only when every one of its 16 KiB pools is empty, so
 * a few survivors pin whole arenas. This module releases the body pages of empty pools (see
 * _pools_reclaim.c). That relies on a private layout, so everything is gated (see
 * docs/pool-reclaim.md):
 *   - CPython 3.11 to 3.15, default (GIL) build, not Py_DEBUG, pymalloc compiled in; the layout
 *     of each minor version is in _pools_layout.h;
 *   - 64-bit Linux, 4 KiB pages;
 *   - pymalloc serving PyObject_Malloc (PYTHONMALLOC=malloc or mimalloc is refused);
 *   - the main interpreter, and from 3.12 no other interpreter alive (it may have its own
 *     obmalloc state and GIL);
 *   - our arena-allocator wrapper is the live arena allocator before every slice;
 *   - a self-test in a forked child proves the layout and the release/reuse path first.
 *
 * The one way to reclaim is memreclaim.trim(pools=True): _core calls the capsule exported here.
 * Not limited API (PyObject_{Get,Set}ArenaAllocator, interpreter list): a module of its own.
 */
#include "_pools.h"

#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Longest GIL hold of one slice of a pass; the GIL is released between slices. */
#define MRP_SLICE_NS 2000000LL

#define NOT_ENABLED "pool reclaim is not enabled: call memreclaim.enable_pool_reclaim() first"
#define REPLACED                                                                                   \
    "the arena allocator was replaced after enable(): the arena table can no longer be "           \
    "trusted, pool reclaim is disabled"

void mrp_set_reason(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(mrp_proc.reason, sizeof(mrp_proc.reason), fmt, args);
    va_end(args);
}

/* ---- gates ---------------------------------------------------------------------------------- */

/* Gates that do not change while the process lives; NULL when all pass. */
static const char *static_gate(void)
{
#if defined(Py_GIL_DISABLED)
    return "free-threaded CPython is not supported: objects live in CPython's mimalloc heaps, "
           "not in pymalloc pools";
#elif !defined(__linux__)
    return "pool reclaim needs Linux (mincore, madvise)";
#elif PY_VERSION_HEX < MRP_MIN_VERSION
    return "CPython before 3.11 is not supported: its pymalloc layout was not read";
#elif PY_VERSION_HEX >= MRP_END_VERSION
    return "this CPython is newer than 3.15: its pymalloc layout was not read";
#elif defined(Py_DEBUG)
    return "debug builds of CPython (Py_DEBUG) are not supported";
#elif !defined(WITH_PYMALLOC)
    return "this CPython was built without pymalloc";
#elif defined(PYMALLOC_USE_HUGEPAGES)
    return "this CPython was built with PYMALLOC_USE_HUGEPAGES: arenas are 2 MiB huge pages, "
           "no page of which can be given back alone";
#else
    static char message[200];
    if ((Py_Version >> 16) != (PY_VERSION_HEX >> 16)) {
        snprintf(message, sizeof(message),
                 "memreclaim._pools was built for CPython %d.%d but runs on %lu.%lu",
                 PY_MAJOR_VERSION, PY_MINOR_VERSION, (Py_Version >> 24) & 0xff,
                 (Py_Version >> 16) & 0xff);
        return message;
    }
    long page = sysconf(_SC_PAGESIZE);
    if (page != (long)MRP_PAGE_SIZE) {
        snprintf(message, sizeof(message), "the page size is %ld bytes, not %lu", page,
                 (unsigned long)MRP_PAGE_SIZE);
        return message;
    }
    return NULL;
#endif
}

/* Interpreters other than the main one. From 3.12 one may have its own obmalloc state and GIL
 * (and whether it does is not public), so pool reclaim waits until none is alive. Called with
 * the main interpreter's GIL held: no other interpreter can then be created, since creating one
 * needs a thread of the main interpreter (GIL held) or of an existing other interpreter. */
static int other_interpreters(void)
{
    int count = 0;
#if MRP_OBMALLOC_PER_INTERPRETER
    PyInterpreterState *main_interp = PyInterpreterState_Main();
    for (PyInterpreterState *interp = PyInterpreterState_Head(); interp != NULL;
         interp = PyInterpreterState_Next(interp)) {
        count += interp != main_interp;
    }
#endif
    return count;
}

static PyObject *error_type(void)
{
    return mrp_proc.error_type != NULL ? mrp_proc.error_type : PyExc_RuntimeError;
}

static void raise_unavailable(void)
{
    PyErr_SetString(error_type(), mrp_proc.reason[0] ? mrp_proc.reason : NOT_ENABLED);
}

static void fail_for_good(const char *reason)
{
    mrp_proc.enabled = 0;
    mrp_proc.failed = 1;
    mrp_set_reason("%s", reason);
}

/* Gates checked before every slice. 0, or -1 with an exception set. */
static int slice_gate(void)
{
    if (!mrp_proc.enabled) {
        if (!mrp_proc.failed) {
            mrp_set_reason(NOT_ENABLED);
        }
        raise_unavailable();
        return -1;
    }
    if (!PyGILState_Check()) {
        PyErr_SetString(PyExc_RuntimeError, "pool reclaim needs the GIL");
        return -1;
    }
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        PyErr_SetString(error_type(), "pool reclaim runs in the main interpreter only");
        return -1;
    }
    if (!mrp_allocator_is_ours()) {
        fail_for_good(REPLACED);
        raise_unavailable();
        return -1;
    }
    int others = other_interpreters();
    if (others > 0) {
        PyErr_Format(error_type(),
                     "%d other interpreter(s) alive: from CPython 3.12 an interpreter may have "
                     "its own pymalloc state and GIL, so pool reclaim waits until none is left",
                     others);
        return -1;
    }
    return 0;
}

/* ---- module state --------------------------------------------------------------------------- */

typedef struct {
    PyObject *unavailable; /* PoolReclaimUnavailable */
} mrp_state;

static inline mrp_state *get_state(PyObject *module)
{
    return (mrp_state *)PyModule_GetState(module);
}

/* ---- enable ------------------------------------------------------------------------------- */

/* Why enable() cannot proceed now, or NULL. Sets mrp_proc.reason; *for_good when permanent. */
static int enable_gates(int *for_good)
{
    *for_good = 1;
    const char *gate = static_gate();
    if (gate != NULL) {
        mrp_set_reason("%s", gate);
        return -1;
    }
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        *for_good = 0;
        mrp_set_reason("pool reclaim can be enabled in the main interpreter only");
        return -1;
    }
    int others = other_interpreters();
    if (others > 0) {
        *for_good = 0;
        mrp_set_reason("%d other interpreter(s) alive: from CPython 3.12 an interpreter may "
                       "have its own pymalloc state and GIL; enable pool reclaim before creating "
                       "any",
                       others);
        return -1;
    }
    const char *(*allocator_name)(void) =
        (const char *(*)(void))dlsym(RTLD_DEFAULT, "_PyMem_GetCurrentAllocatorName");
    const char *name = allocator_name ? allocator_name() : NULL;
    if (name != NULL && strcmp(name, "pymalloc") != 0 && strcmp(name, "pymalloc_debug") != 0) {
        mrp_set_reason("pymalloc is not active (memory allocator: %s, e.g. PYTHONMALLOC=%s): "
                       "there are no pymalloc pools to reclaim",
                       name, name);
        return -1;
    }
    if (mrp_allocator_is_ours()) {
        mrp_set_reason("internal error: the wrapper is installed but not enabled");
        return -1;
    }
    PyObjectArenaAllocator current;
    PyObject_GetArenaAllocator(&current);
    if (!mrp_in_cpython((const void *)(uintptr_t)current.alloc)) {
        Dl_info info;
        const char *owner = "unknown code";
        if (dladdr((const void *)(uintptr_t)current.alloc, &info) != 0 && info.dli_fname) {
            owner = info.dli_fname;
        }
        mrp_set_reason("the arena allocator was already replaced (by %s): only CPython's own "
                       "arena allocator is supported",
                       owner);
        return -1;
    }
    return 0;
}

static PyObject *mrp_enable(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    if (mrp_proc.enabled) {
        if (slice_gate() < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (mrp_proc.failed) {
        raise_unavailable();
        return NULL;
    }
    if (mrp_proc.busy) {
        PyErr_SetString(PyExc_RuntimeError, "enable() is already running in another thread");
        return NULL;
    }
    int for_good;
    if (enable_gates(&for_good) < 0) {
        mrp_proc.failed = for_good;
        raise_unavailable();
        if (!for_good) {
            mrp_proc.reason[0] = '\0';
        }
        return NULL;
    }
    PyObjectArenaAllocator current;
    PyObject_GetArenaAllocator(&current);
    mrp_proc.busy = 1;
    mrp_install_wrapper(&current);
    mrp_report report;
    int rc = mrp_run_selftest(&report);
    mrp_proc.busy = 0;
    if (rc == 0 && !mrp_allocator_is_ours()) {
        mrp_set_reason("the arena allocator was replaced while the self-test ran");
        rc = -1;
    }
    if (rc != 0) {
        mrp_remove_wrapper();
        mrp_proc.failed = 1;
        raise_unavailable();
        return NULL;
    }
    mrp_proc.arena_caller = report.caller;
    mrp_table_keep_caller(mrp_proc.arena_caller);
    mrp_proc.selftest_pools_released = report.pools_released;
    mrp_proc.reason[0] = '\0';
    mrp_proc.enabled = 1;
    Py_RETURN_NONE;
}

/* ---- estimate and status -------------------------------------------------------------------- */

static PyObject *mrp_estimate(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    mrp_pass pass;
    if (mrp_run_pass(1, MRP_SLICE_NS, slice_gate, &pass) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(pass.bytes_released);
}

static int dict_set(PyObject *dict, const char *key, PyObject *value)
{
    if (value == NULL) {
        return -1;
    }
    int rc = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *mrp_status(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    if (mrp_proc.enabled && !mrp_allocator_is_ours()) {
        fail_for_good(REPLACED);
    }
    const char *gate = static_gate();
    const char *reason = NULL;
    if (!mrp_proc.enabled) {
        reason = mrp_proc.reason[0] ? mrp_proc.reason : gate != NULL ? gate : NOT_ENABLED;
    }
    pthread_mutex_lock(&mrp_proc.lock);
    size_t tracked = mrp_proc.narenas;
    unsigned long long table[4] = {mrp_proc.arenas_recorded, mrp_proc.arenas_forgotten,
                                   mrp_proc.foreign_blocks, mrp_proc.table_errors};
    pthread_mutex_unlock(&mrp_proc.lock);
    PyObject *dict = PyDict_New();
    if (dict == NULL) {
        return NULL;
    }
    if (dict_set(dict, "enabled", PyBool_FromLong(mrp_proc.enabled)) < 0 ||
        dict_set(dict, "available", PyBool_FromLong(gate == NULL && !mrp_proc.failed)) < 0 ||
        dict_set(dict, "reason", reason ? PyUnicode_FromString(reason) : Py_NewRef(Py_None)) < 0 ||
        dict_set(dict, "arenas_tracked", PyLong_FromSize_t(tracked)) < 0 ||
        dict_set(dict, "arenas_recorded", PyLong_FromUnsignedLongLong(table[0])) < 0 ||
        dict_set(dict, "arenas_forgotten", PyLong_FromUnsignedLongLong(table[1])) < 0 ||
        dict_set(dict, "foreign_blocks", PyLong_FromUnsignedLongLong(table[2])) < 0 ||
        dict_set(dict, "table_errors", PyLong_FromUnsignedLongLong(table[3])) < 0 ||
        dict_set(dict, "reclaim_calls", PyLong_FromLongLong(mrp_proc.reclaim_calls)) < 0 ||
        dict_set(dict, "pools_released", PyLong_FromLongLong(mrp_proc.pools_released)) < 0 ||
        dict_set(dict, "bytes_released", PyLong_FromLongLong(mrp_proc.bytes_released)) < 0 ||
        dict_set(dict, "used_pools_trimmed", PyLong_FromLongLong(mrp_proc.used_pools_trimmed)) <
            0 ||
        dict_set(dict, "used_bytes_released", PyLong_FromLongLong(mrp_proc.used_bytes_released)) <
            0 ||
        dict_set(dict, "arenas_skipped", PyLong_FromLongLong(mrp_proc.arenas_skipped)) < 0 ||
        dict_set(dict, "last_reclaim_ns", PyLong_FromLongLong(mrp_proc.last_ns)) < 0 ||
        dict_set(dict, "total_reclaim_ns", PyLong_FromLongLong(mrp_proc.total_ns)) < 0 ||
        dict_set(dict, "max_hold_ns", PyLong_FromLongLong(mrp_proc.max_hold_ns)) < 0 ||
        dict_set(dict, "max_hold_cpu_ns", PyLong_FromLongLong(mrp_proc.max_hold_cpu_ns)) < 0 ||
        dict_set(dict, "self_test_pools_released",
                 PyLong_FromLongLong(mrp_proc.selftest_pools_released)) < 0) {
        Py_DECREF(dict);
        return NULL;
    }
    return dict;
}

/* ---- capsule: the core's trim(pools=True) --------------------------------------------------- */

/* Called by memreclaim._core with the GIL held: one pass over every recorded arena, in slices,
 * the GIL released between them. */
static int capi_reclaim(mr_pools_result *out)
{
    if (out == NULL) {
        PyErr_SetString(PyExc_ValueError, "mr_pools_result pointer is NULL");
        return -1;
    }
    out->pools_released = 0;
    out->bytes_released = 0;
    mrp_pass pass;
    int rc = mrp_run_pass(0, MRP_SLICE_NS, slice_gate, &pass);
    if (pass.slices > 0) { /* a pass stopped by a gate still released what it released */
        mrp_proc.reclaim_calls++;
        mrp_proc.pools_released += pass.pools_released;
        mrp_proc.bytes_released += pass.bytes_released;
        mrp_proc.used_pools_trimmed += pass.used_pools_trimmed;
        mrp_proc.used_bytes_released += pass.used_bytes_released;
        mrp_proc.arenas_skipped += pass.arenas_skipped;
        mrp_proc.last_ns = pass.elapsed_ns;
        mrp_proc.total_ns += pass.elapsed_ns;
        if (pass.max_hold_ns > mrp_proc.max_hold_ns) {
            mrp_proc.max_hold_ns = pass.max_hold_ns;
        }
        if (pass.max_hold_cpu_ns > mrp_proc.max_hold_cpu_ns) {
            mrp_proc.max_hold_cpu_ns = pass.max_hold_cpu_ns;
        }
    }
    if (rc < 0) {
        return -1;
    }
    out->pools_released = pass.pools_released;
    out->bytes_released = pass.bytes_released;
    return 0;
}

static const mr_pools_capi capi = {
    .version = MR_POOLS_CAPI_VERSION,
    .reclaim = capi_reclaim,
};

/* ---- module definition ---------------------------------------------------------------------- */

PyDoc_STRVAR(mrp_enable_doc,
             "enable()\n--\n\n"
             "Install the arena-allocator wrapper and turn pool reclaim on, after checking every\n"
             "gate and running the self-test in a forked child. Call it early: only arenas\n"
             "allocated afterwards are reclaimed. Raises PoolReclaimUnavailable with the reason\n"
             "when a gate fails. Idempotent.");

PyDoc_STRVAR(mrp_estimate_doc,
             "estimate()\n--\n\n"
             "Bytes that trim(pools=True) would give back from empty pools now, without\n"
             "writing anything (the resident body pages of empty pools in tracked arenas).");

PyDoc_STRVAR(mrp_status_doc,
             "status()\n--\n\n"
             "A dict: enabled, available, reason (None when enabled), arenas "
             "tracked, totals and timings (keys: memreclaim.pools.PoolReclaimStatus).");

static PyMethodDef mrp_methods[] = {
    {"enable", mrp_enable, METH_NOARGS, mrp_enable_doc},
    {"estimate", mrp_estimate, METH_NOARGS, mrp_estimate_doc},
    {"status", mrp_status, METH_NOARGS, mrp_status_doc},
    {NULL, NULL, 0, NULL},
};

static int mrp_exec(PyObject *module)
{
    mrp_state *state = get_state(module);
    if (mrp_proc.cpython_base == 0) {
        Dl_info info;
        if (dladdr((const void *)(uintptr_t)&PyObject_Malloc, &info) != 0) {
            mrp_proc.cpython_base = (uintptr_t)info.dli_fbase;
        }
    }
    state->unavailable = PyErr_NewExceptionWithDoc(
        "memreclaim._pools.PoolReclaimUnavailable",
        "Pool reclaim cannot be used in this process; the message says which gate failed.",
        PyExc_RuntimeError, NULL);
    if (state->unavailable == NULL ||
        PyModule_AddObjectRef(module, "PoolReclaimUnavailable", state->unavailable) < 0) {
        return -1;
    }
    if (mrp_proc.error_type == NULL && PyInterpreterState_Get() == PyInterpreterState_Main()) {
        mrp_proc.error_type = Py_NewRef(state->unavailable);
    }
    PyObject *capsule = PyCapsule_New((void *)&capi, MR_POOLS_CAPSULE, NULL);
    if (capsule == NULL) {
        return -1;
    }
    if (PyModule_AddObject(module, "_C_API", capsule) < 0) {
        Py_DECREF(capsule);
        return -1;
    }
    if (PyModule_AddIntConstant(module, "ARENA_SIZE", (long)MRP_ARENA_SIZE) < 0 ||
        PyModule_AddIntConstant(module, "POOL_SIZE", (long)MRP_POOL_SIZE) < 0 ||
        PyModule_AddIntConstant(module, "SLICE_NS", (long)MRP_SLICE_NS) < 0) {
        return -1;
    }
    return 0;
}

static int mrp_traverse(PyObject *module, visitproc visit, void *arg)
{
    Py_VISIT(get_state(module)->unavailable);
    return 0;
}

static int mrp_clear(PyObject *module)
{
    Py_CLEAR(get_state(module)->unavailable);
    return 0;
}

static void mrp_free(void *module)
{
    mrp_clear((PyObject *)module);
}

static PyModuleDef_Slot mrp_slots[] = {
    {Py_mod_exec, mrp_exec},
#ifdef Py_MOD_MULTIPLE_INTERPRETERS_SUPPORTED
    /* The arena table is the process's: not in an interpreter with its own GIL. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_SUPPORTED},
#endif
#ifdef Py_MOD_GIL_NOT_USED
    /* Free-threaded builds: enable() always refuses, so nothing here needs the GIL there. */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

PyDoc_STRVAR(mrp_module_doc,
             "Reclaim the pages of empty pymalloc pools inside live arenas (CPython 3.11-3.15, "
             "opt-in); reached through memreclaim.trim(pools=True).");

static struct PyModuleDef mrp_module = {
    PyModuleDef_HEAD_INIT,       .m_name = "memreclaim._pools", .m_doc = mrp_module_doc,
    .m_size = sizeof(mrp_state), .m_methods = mrp_methods,      .m_slots = mrp_slots,
    .m_traverse = mrp_traverse,  .m_clear = mrp_clear,          .m_free = mrp_free,
};

PyMODINIT_FUNC PyInit__pools(void)
{
    return PyModuleDef_Init(&mrp_module);
}

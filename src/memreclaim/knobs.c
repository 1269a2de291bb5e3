/* memreclaim._core: the allocator's settings (glibc's mallopt knobs and malloc_info, mimalloc's
 * purge delay) and the calling thread's share of giving memory back (collect_thread).
 */
#include "memreclaim.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- glibc knobs ----------------------------------------------------------------------------- */

/* One glibc mallopt knob: the Python function, its argument's name, the mallopt parameter and
 * the accepted range. */
typedef struct {
    const char *function;
    const char *name;
    int param;
    long long min, max;
} mallopt_knob;

static const mallopt_knob mmap_threshold_knob = {"pin_mmap_threshold", "nbytes",
                                                 MR_M_MMAP_THRESHOLD, 1, MR_MMAP_THRESHOLD_MAX};
static const mallopt_knob trim_threshold_knob = {"set_trim_threshold", "nbytes",
                                                 MR_M_TRIM_THRESHOLD, 0, INT32_MAX};
static const mallopt_knob arena_max_knob = {"set_arena_max", "n", MR_M_ARENA_MAX, 1, INT32_MAX};

static PyObject *set_mallopt(PyObject *module, PyObject *value, const mallopt_knob *knob)
{
    mr_core_state *state = mr_state(module);
    long long v;
    int err;
    /* Check the argument first, so a bad value raises the same error on every allocator. */
    if (mr_parse_bounded_int(value, knob->name, knob->min, knob->max, &v) < 0) {
        return NULL;
    }
    if (state->backend->kind != MR_ALLOC_GLIBC) {
        return mr_raise_unsupported(state, knob->function);
    }
    /* GIL kept: mallopt takes the main arena's lock for a few instructions. */
    err = mr_glibc_mallopt(knob->param, (int)v);
    if (err == ENOTSUP) {
        return mr_raise_missing(state, knob->function, "mallopt");
    }
    if (err != 0) {
        PyErr_Format(PyExc_ValueError, "glibc refused %s=%lld", knob->name, v);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *core_pin_mmap_threshold(PyObject *module, PyObject *value)
{
    return set_mallopt(module, value, &mmap_threshold_knob);
}

static PyObject *core_set_trim_threshold(PyObject *module, PyObject *value)
{
    return set_mallopt(module, value, &trim_threshold_knob);
}

static PyObject *core_set_arena_max(PyObject *module, PyObject *value)
{
    return set_mallopt(module, value, &arena_max_knob);
}

PyDoc_STRVAR(pin_mmap_threshold_doc,
             "pin_mmap_threshold($module, nbytes, /)\n--\n\n"
             "mallopt(M_MMAP_THRESHOLD, nbytes): blocks of at least nbytes get their own mmap and\n"
             "go back to the kernel when freed. This also turns off glibc's adaptive threshold,\n"
             "which otherwise rises to the size of every large block freed (up to 32 MiB).\n"
             "nbytes: 1 to 33554432 (32 MiB) on 64-bit. glibc only.");

PyDoc_STRVAR(set_trim_threshold_doc,
             "set_trim_threshold($module, nbytes, /)\n--\n\n"
             "mallopt(M_TRIM_THRESHOLD, nbytes): free memory at the top of the main heap above\n"
             "nbytes is given back by free() itself. It governs only the top of the heap, not\n"
             "holes in the middle (trim() handles those). nbytes: 0 to 2147483647. glibc only.");

PyDoc_STRVAR(set_arena_max_doc,
             "set_arena_max($module, n, /)\n--\n\n"
             "mallopt(M_ARENA_MAX, n): the most malloc arenas glibc creates for threads. glibc\n"
             "fixes its limit the first time a thread needs a new arena past the first eight\n"
             "(or past a limit already set), and never frees arenas: call it at start-up.\n"
             "n: 1 to 2147483647. glibc only. (memreclaim.set_arena_max warns when it is late.)");

PyDoc_STRVAR(malloc_info_doc,
             "malloc_info() -> str\n\n"
             "glibc's malloc_info(0, ...) XML: per-arena free-chunk histograms and\n"
             "totals. It locks each arena in turn; the GIL is released meanwhile.\n"
             "glibc only (UnsupportedAllocatorError otherwise).");

static PyObject *core_malloc_info(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    mr_core_state *state = mr_state(module);
    char *text = NULL;
    size_t size = 0;
    int err;
    PyObject *result;

    if (state->backend->kind != MR_ALLOC_GLIBC) {
        return mr_raise_unsupported(state, "malloc_info");
    }
    Py_BEGIN_ALLOW_THREADS
    err = mr_glibc_malloc_info(&text, &size);
    Py_END_ALLOW_THREADS
    if (err == ENOTSUP) {
        return mr_raise_missing(state, "malloc_info", "malloc_info");
    }
    if (err != 0) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    result = PyUnicode_DecodeUTF8(text, (Py_ssize_t)size, "replace");
    free(text);
    return result;
}

/* ---- purge delay and the calling thread's share (issue 22) ----------------------------------- */

PyDoc_STRVAR(set_purge_delay_doc,
             "set_purge_delay($module, milliseconds, /)\n--\n\n"
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
    mr_core_state *state = mr_state(module);
    long long ms;
    long previous = 0;
    const char *reason;
    int err;

    if (mr_parse_bounded_int(value, "milliseconds", -1, INT32_MAX, &ms) < 0) {
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
             "collect_thread(*, abandon=False) -> CollectResult\n\n"
             "The calling thread's share of giving memory back, for what only the owning thread\n"
             "can do (run it in each worker: trim() from one thread does not reach another live\n"
             "thread's heap or cache). mimalloc: mi_collect(true) with the purge delay at 0 for\n"
             "the call; with abandon=True on mimalloc 2.x, outside the main thread, also\n"
             "mi_thread_done(): the heap is handed over as an exited thread's is (its blocks stay\n"
             "valid; the thread gets a new heap at its next malloc; a mi_heap_new() heap of this\n"
             "thread would be deleted) and the next trim() from any thread gives back its free\n"
             "pages. jemalloc: mallctl thread.idle (else thread.tcache.flush). tcmalloc:\n"
             "MallocExtension_MarkThreadIdle. glibc: nothing (malloc_trim reaches every arena).\n"
             "The GIL is released during the call. Returns a CollectResult: method (what was\n"
             "called, 'none' for nothing), anon_before and anon_after (anonymous resident bytes\n"
             "around it, None if unreadable), seconds (the call's time). TypeError when abandon\n"
             "is not a bool.");

static PyObject *core_collect_thread(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *keywords[] = {"abandon", NULL};
    mr_core_state *state = mr_state(module);
    PyObject *abandon_arg = NULL, *result;
    mr_rss_sample before, after;
    int abandon, before_err, after_err;
    const char *method = "none";
    double started, seconds;

    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|$O:collect_thread", keywords, &abandon_arg) ||
        mr_parse_flag(abandon_arg, "abandon", &abandon) < 0) {
        return NULL;
    }
    before_err = mr_statm_read(&state->statm, &before);
    Py_BEGIN_ALLOW_THREADS
    started = mr_monotonic_seconds();
    (void)mr_thread_collect(abandon != 0, &method);
    seconds = mr_monotonic_seconds() - started;
    Py_END_ALLOW_THREADS
    after_err = mr_statm_read(&state->statm, &after);

    const int64_t anon[] = {before_err == 0 ? before.anon : -1, after_err == 0 ? after.anon : -1};
    result = mr_new_result_ints(module, MR_COLLECT_RESULT, 1, anon, 2);
    if (result == NULL || mr_result_put(result, 0, PyUnicode_FromString(method)) < 0 ||
        mr_result_put(result, 3, PyFloat_FromDouble(seconds)) < 0) {
        return NULL;
    }
    return result;
}

/* ---- method table ---------------------------------------------------------------------------- */

PyMethodDef mr_knobs_methods[] = {
    {"pin_mmap_threshold", core_pin_mmap_threshold, METH_O, pin_mmap_threshold_doc},
    {"set_trim_threshold", core_set_trim_threshold, METH_O, set_trim_threshold_doc},
    {"set_arena_max", core_set_arena_max, METH_O, set_arena_max_doc},
    {"malloc_info", core_malloc_info, METH_NOARGS, malloc_info_doc},
    {"set_purge_delay", core_set_purge_delay, METH_O, set_purge_delay_doc},
    {"collect_thread", (PyCFunction)(void (*)(void))core_collect_thread,
     METH_VARARGS | METH_KEYWORDS, collect_thread_doc},
    {NULL, NULL, 0, NULL},
};

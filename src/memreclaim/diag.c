/* memreclaim._core's readers for the diagnosis engine (memreclaim.diagnosis).
 *
 * Each function reads one figure the diagnosis needs and that no other part of the core gives:
 * jemalloc's small/large split and its thread-cache flush, the bytes held in glibc's thread
 * cache, mimalloc's collect, where malloc puts a block, the anonymous
 * mappings of /proc/self/smaps with their resident bytes, blocks held for tracemalloc's
 * calibration, and pymalloc's arena figures (CPython's _PyObject_DebugMallocStats, with the
 * object allocator swapped back from tracemalloc's hook in C, GIL held, no Python code in the
 * window). Allocator symbols come from mr_alloc_symbol (the object serving malloc); the GIL is
 * released only around the slow libc work (the tcache probe, mi_collect, the smaps read).
 */
#include "diag.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*mr_mallctl_fn)(const char *, void *, size_t *, void *, size_t);

/* The allocator symbols the readers call, resolved once (mr_alloc_symbol walks the link map):
 * NULL where the object serving malloc has no such name or is another allocator. */
static struct {
    void *mallctl, *mallinfo2, *mi_collect;
} diag_sym;
static pthread_once_t diag_sym_once = PTHREAD_ONCE_INIT;

static void diag_sym_resolve(void)
{
    mr_alloc_kind kind = mr_backend_detect()->kind;
    diag_sym.mallctl = kind == MR_ALLOC_JEMALLOC ? mr_alloc_symbol("mallctl") : NULL;
    diag_sym.mallinfo2 = kind == MR_ALLOC_GLIBC ? mr_alloc_symbol("mallinfo2") : NULL;
    diag_sym.mi_collect = kind == MR_ALLOC_MIMALLOC ? mr_alloc_symbol("mi_collect") : NULL;
}

/* A field of diag_sym, the symbols resolved on first use. */
static void *diag_symbol(void *const *field)
{
    (void)pthread_once(&diag_sym_once, diag_sym_resolve);
    return *field;
}

/* ---- jemalloc ------------------------------------------------------------------------------- */

static mr_mallctl_fn jemalloc_ctl(void)
{
    mr_mallctl_fn ctl = NULL;
    void *symbol = diag_symbol(&diag_sym.mallctl);
    memcpy(&ctl, &symbol, sizeof(ctl));
    return ctl;
}

PyDoc_STRVAR(
    diag_jemalloc_flush_doc,
    "diag_jemalloc_flush() -> bool\n\n"
    "jemalloc: flush the calling thread's cache (thread.tcache.flush), so that its cached\n"
    "blocks are not counted as allocated. False when malloc is not jemalloc or the\n"
    "thread has no cache.");

static PyObject *diag_jemalloc_flush(PyObject *module, PyObject *unused)
{
    mr_mallctl_fn ctl = jemalloc_ctl();
    (void)module;
    (void)unused;
    return PyBool_FromLong(ctl != NULL && ctl("thread.tcache.flush", NULL, NULL, NULL, 0) == 0);
}

PyDoc_STRVAR(diag_jemalloc_parts_doc,
             "diag_jemalloc_parts() -> (small, large) | None\n\n"
             "jemalloc: bytes allocated in small (slab) and large (extent) allocations over every\n"
             "arena (stats.arenas.4096.{small,large}.allocated, of the current epoch). None when\n"
             "malloc is not jemalloc or it was built without statistics.");

static PyObject *diag_jemalloc_parts(PyObject *module, PyObject *unused)
{
    static const char *const names[2] = {"stats.arenas.4096.small.allocated",
                                         "stats.arenas.4096.large.allocated"};
    mr_mallctl_fn ctl = jemalloc_ctl();
    size_t values[2];
    (void)module;
    (void)unused;
    if (ctl == NULL) {
        Py_RETURN_NONE;
    }
    for (int i = 0; i < 2; i++) {
        size_t size = sizeof(values[i]);
        if (ctl(names[i], &values[i], &size, NULL, 0) != 0) {
            Py_RETURN_NONE;
        }
    }
    return Py_BuildValue("(nn)", (Py_ssize_t)values[0], (Py_ssize_t)values[1]);
}

/* ---- glibc's thread cache ------------------------------------------------------------------- */

/* glibc's struct mallinfo2 (2.33+): ten size_t fields, uordblks the eighth. Declared here so the
 * build does not need a new glibc; an array has the struct's layout and return convention. */
typedef struct {
    // cppcheck-suppress unusedStructMember
    size_t fields[10];
} mr_mallinfo2;

#define MR_UORDBLKS 7

typedef mr_mallinfo2 (*mr_mallinfo2_fn)(void);

#define MR_TCACHE_BINS 64          /* bins of chunks of 32..1040 bytes (the default tcache_max) */
#define MR_TCACHE_MAX_PER_BIN 1024 /* glibc.malloc.tcache_count: 16 by default, 65535 at most */

/* Bytes the calling thread's tcache holds: each bin's chunks are taken (malloc) until one comes
 * from the arena (uordblks moves), then all are freed. Pure C, no Python object. */
static long long tcache_probe(mr_mallinfo2_fn info, void **taken)
{
    size_t start = info().fields[MR_UORDBLKS];
    long long held = 0;
    for (int index = 0; index < MR_TCACHE_BINS; index++) {
        size_t chunk = 32 + 16 * (size_t)index;
        size_t used = info().fields[MR_UORDBLKS];
        int count = 0;
        while (count <= MR_TCACHE_MAX_PER_BIN) {
            taken[count] = malloc(chunk - 8);
            count++;
            if (taken[count - 1] == NULL || info().fields[MR_UORDBLKS] != used) {
                break;
            }
            held += (long long)chunk;
        }
        for (int i = count - 1; i >= 0; i--) {
            free(taken[i]);
        }
    }
    return held + (long long)info().fields[MR_UORDBLKS] - (long long)start;
}

PyDoc_STRVAR(diag_glibc_tcache_doc,
             "diag_glibc_tcache() -> int | None\n\n"
             "glibc: bytes held by the calling thread's tcache (counted as in use by mallinfo2),\n"
             "read by emptying each bin into malloc'd chunks and freeing them again (the probe's\n"
             "own chunks put back are counted). None when malloc is not glibc or glibc has no\n"
             "mallinfo2 (before 2.33). Tenths of a second on a fragmented heap.");

static PyObject *diag_glibc_tcache(PyObject *module, PyObject *unused)
{
    void **taken;
    long long held;
    mr_mallinfo2_fn info = NULL;
    void *symbol;
    (void)module;
    (void)unused;
    if ((symbol = diag_symbol(&diag_sym.mallinfo2)) == NULL) {
        Py_RETURN_NONE;
    }
    memcpy(&info, &symbol, sizeof(info));
    taken = PyMem_RawMalloc((MR_TCACHE_MAX_PER_BIN + 1) * sizeof(void *));
    if (taken == NULL) {
        return PyErr_NoMemory();
    }
    Py_BEGIN_ALLOW_THREADS
    held = tcache_probe(info, taken);
    Py_END_ALLOW_THREADS
    PyMem_RawFree(taken);
    return PyLong_FromLongLong(held);
}

/* ---- mimalloc ------------------------------------------------------------------------------- */

PyDoc_STRVAR(diag_mimalloc_collect_doc,
             "diag_mimalloc_collect(force, /) -> bool\n\n"
             "mimalloc: mi_collect(force) (force: freed pages are purged now, not after the\n"
             "purge delay). False when malloc is not mimalloc.");

static PyObject *diag_mimalloc_collect(PyObject *module, PyObject *arg)
{
    void (*collect)(bool) = NULL;
    void *symbol;
    int force;
    (void)module;
    if (!PyBool_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "diag_mimalloc_collect() force must be bool, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    force = arg == Py_True;
    if ((symbol = diag_symbol(&diag_sym.mi_collect)) == NULL) {
        Py_RETURN_FALSE;
    }
    memcpy(&collect, &symbol, sizeof(collect));
    Py_BEGIN_ALLOW_THREADS
    collect(force != 0);
    Py_END_ALLOW_THREADS
    Py_RETURN_TRUE;
}

/* ---- where malloc puts a block -------------------------------------------------------------- */

PyDoc_STRVAR(diag_probe_address_doc,
             "diag_probe_address(size, /) -> int\n\n"
             "The address malloc(size) returns (the block is freed at once), 0 when it fails:\n"
             "tells which mappings hold the allocator's memory.");

static PyObject *diag_probe_address(PyObject *module, PyObject *arg)
{
    size_t size;
    void *block;
    uintptr_t address;
    (void)module;
    if (!PyLong_Check(arg) || PyBool_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "diag_probe_address() size must be int, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    size = PyLong_AsSize_t(arg);
    if (size == (size_t)-1 && PyErr_Occurred()) {
        return NULL; /* OverflowError, a negative size too */
    }
    if (size == 0 || size > ((size_t)1 << 40)) {
        PyErr_SetString(PyExc_ValueError, "diag_probe_address() size must be in 1..2**40");
        return NULL;
    }
    block = malloc(size);
    address = (uintptr_t)block;
    free(block);
    return PyLong_FromSize_t((size_t)address);
}

/* ---- anonymous mappings of /proc/self/smaps ------------------------------------------------- */

typedef struct {
    unsigned long long start, end, rss;
} mr_mapping;

typedef struct {
    mr_mapping *items;
    size_t count, room;
} mr_mappings;

static int mappings_push(mr_mappings *maps, unsigned long long start, unsigned long long end)
{
    if (maps->count == maps->room) {
        size_t room = maps->room ? 2 * maps->room : 256;
        mr_mapping *grown = realloc(maps->items, room * sizeof(*grown));
        if (grown == NULL) {
            return ENOMEM;
        }
        maps->items = grown;
        maps->room = room;
    }
    maps->items[maps->count].start = start;
    maps->items[maps->count].end = end;
    maps->items[maps->count].rss = 0;
    maps->count++;
    return 0;
}

typedef struct {
    mr_mappings *maps;
    bool anonymous; /* the mapping whose fields come now is anonymous and unnamed */
} smaps_walk;

/* One line of smaps: a mapping's header (procfs.c's maps layout) or one of its "Key: n kB" fields
 * (capitalised). An anonymous mapping without a name is kept, with its Rss. */
static int smaps_line(void *ctx, const char *line, size_t len)
{
    smaps_walk *walk = ctx;
    mr_maps_entry entry;
    int64_t rss;
    if (line == NULL) { /* longer than the buffer: a header with a long path */
        walk->anonymous = false;
        return 0;
    }
    if (len > 0 && line[0] >= 'A' && line[0] <= 'Z') {
        if (walk->anonymous && mr_kb_line(line, len, "Rss:", &rss) == 0) {
            walk->maps->items[walk->maps->count - 1].rss = (unsigned long long)rss;
        }
        return 0;
    }
    if (mr_maps_parse(line, len, &entry) != 0) {
        return 0; /* neither: skipped */
    }
    walk->anonymous = entry.name_len == 0;
    return walk->anonymous ? mappings_push(walk->maps, entry.start, entry.end) : 0;
}

/* Pure C: read the anonymous mappings of /proc/self/smaps (path NULL) or of the smaps-format file
 * at path, and their Rss. Returns 0 or an errno. */
static int read_anon_mappings(const char *path, mr_mappings *maps)
{
    char buf[4096];
    smaps_walk walk = {maps, false};
    return mr_self_lines("smaps", path, buf, sizeof(buf), smaps_line, &walk);
}

static PyObject *mapping_item(const void *items, size_t i)
{
    const mr_mapping *map = (const mr_mapping *)items + i;
    return Py_BuildValue("(KKK)", map->start, map->end, map->rss);
}

static PyObject *mappings_tuple(const mr_mappings *maps)
{
    return mr_tuple_of(maps->items, maps->count, mapping_item);
}

PyDoc_STRVAR(diag_anon_mappings_doc,
             "diag_anon_mappings(path=None, /) -> tuple[(start, end, rss), ...]\n\n"
             "Each anonymous mapping (no path, not named) of /proc/self/smaps (or of the smaps-\n"
             "format file at path) with its resident bytes. OSError when the file cannot be\n"
             "read.");

static PyObject *diag_anon_mappings(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    mr_mappings maps = {NULL, 0, 0};
    PyObject *encoded = NULL, *result;
    const char *path = NULL;
    int err;
    (void)module;
    if (nargs > 1) {
        PyErr_Format(PyExc_TypeError, "diag_anon_mappings() takes at most 1 argument (%zd given)",
                     nargs);
        return NULL;
    }
    if (nargs == 1 && args[0] != Py_None) {
        if (!PyUnicode_FSConverter(args[0], &encoded)) {
            return NULL;
        }
        path = PyBytes_AS_STRING(encoded);
    }
    Py_BEGIN_ALLOW_THREADS
    err = read_anon_mappings(path, &maps);
    Py_END_ALLOW_THREADS
    if (err != 0) {
        free(maps.items);
        errno = err;
        result =
            PyErr_SetFromErrnoWithFilename(PyExc_OSError, path == NULL ? "/proc/self/smaps" : path);
        Py_XDECREF(encoded);
        return result;
    }
    Py_XDECREF(encoded);
    result = mappings_tuple(&maps);
    free(maps.items);
    return result;
}

/* ---- blocks held for tracemalloc's calibration ---------------------------------------------- */

#define MR_HELD_CAPSULE "memreclaim._core.held_blocks"

typedef struct {
    size_t count;
    void *blocks[];
} mr_held;

static void held_release(PyObject *capsule)
{
    mr_held *held = PyCapsule_GetPointer(capsule, MR_HELD_CAPSULE);
    if (held == NULL) {
        PyErr_Clear();
        return;
    }
    for (size_t i = 0; i < held->count; i++) {
        free(held->blocks[i]);
    }
    PyMem_RawFree(held);
}

PyDoc_STRVAR(diag_hold_blocks_doc,
             "diag_hold_blocks(count, size, /) -> capsule\n\n"
             "malloc `count` blocks of `size` bytes (1..1 MiB each, at most 1,000,000 blocks),\n"
             "untraced by tracemalloc; they are freed when the returned object is released.\n"
             "MemoryError when malloc fails (nothing is kept then).");

static PyObject *diag_hold_blocks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t count, size;
    mr_held *held;
    PyObject *capsule;
    (void)module;
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "diag_hold_blocks() takes 2 arguments (%zd given)", nargs);
        return NULL;
    }
    for (int i = 0; i < 2; i++) {
        if (!PyLong_Check(args[i]) || PyBool_Check(args[i])) {
            PyErr_Format(PyExc_TypeError, "diag_hold_blocks() argument %d must be int, not %.100s",
                         i + 1, Py_TYPE(args[i])->tp_name);
            return NULL;
        }
    }
    count = PyLong_AsSsize_t(args[0]);
    size = PyLong_AsSsize_t(args[1]);
    if ((count == -1 || size == -1) && PyErr_Occurred()) {
        return NULL;
    }
    if (count < 1 || count > 1000000 || size < 1 || size > (1 << 20)) {
        PyErr_SetString(PyExc_ValueError,
                        "diag_hold_blocks() needs 1 <= count <= 1000000 and 1 <= size <= 1 MiB");
        return NULL;
    }
    held = PyMem_RawMalloc(sizeof(mr_held) + (size_t)count * sizeof(void *));
    if (held == NULL) {
        return PyErr_NoMemory();
    }
    for (held->count = 0; held->count < (size_t)count; held->count++) {
        held->blocks[held->count] = malloc((size_t)size);
        if (held->blocks[held->count] == NULL) {
            break;
        }
    }
    capsule = PyCapsule_New(held, MR_HELD_CAPSULE, held_release);
    if (capsule == NULL) {
        for (size_t i = 0; i < held->count; i++) {
            free(held->blocks[i]);
        }
        PyMem_RawFree(held);
        return NULL;
    }
    if (held->count < (size_t)count) {
        Py_DECREF(capsule); /* frees what was taken */
        return PyErr_NoMemory();
    }
    return capsule;
}

/* ---- pymalloc's arenas ---------------------------------------------------------------------- */

typedef int (*mr_dump_fn)(FILE *);

/* The base of the object holding address, or NULL. */
static void *object_base(const void *address)
{
    Dl_info info;
    if (address == NULL || !dladdr(address, &info)) {
        return NULL;
    }
    return info.dli_fbase;
}

/* The allocator tracemalloc's hook wraps (its ctx), when it is CPython's own (ctx NULL, in the
 * object that defines PyMem_Malloc): 0 and *out set; -1 when another hook is installed. */
static int unhooked_allocator(const PyMemAllocatorEx *hooked, PyMemAllocatorEx *out)
{
    void *(*pymem_malloc)(size_t) = PyMem_Malloc;
    const PyMemAllocatorEx *wrapped = hooked->ctx;
    void *home, *inner;
    if (wrapped == NULL || wrapped->ctx != NULL || wrapped->malloc == NULL) {
        return -1;
    }
    memcpy(&home, &pymem_malloc, sizeof(home));
    memcpy(&inner, &wrapped->malloc, sizeof(inner));
    if (object_base(inner) == NULL || object_base(inner) != object_base(home)) {
        return -1;
    }
    *out = *wrapped;
    return 0;
}

/* Parse the dump: "N arenas * M bytes/arena" and "# bytes in allocated blocks = 1,234". */
static int parse_dump(const char *text, unsigned long long *arena_bytes,
                      unsigned long long *allocated)
{
    int found = 0;
    for (const char *line = text; line != NULL && *line != '\0';) {
        unsigned long long count, size;
        const char *key = "# bytes in allocated blocks";
        if (sscanf(line, "%llu arenas * %llu bytes/arena", &count, &size) == 2) {
            *arena_bytes = count * size;
            found |= 1;
        } else if (strncmp(line, key, strlen(key)) == 0 && strchr(line, '=') != NULL) {
            unsigned long long value = 0;
            const char *p = strchr(line, '=') + 1;
            while (*p == ' ') {
                p++;
            }
            for (; (*p >= '0' && *p <= '9') || *p == ','; p++) {
                if (*p != ',') {
                    value = value * 10 + (unsigned long long)(*p - '0');
                }
            }
            *allocated = value;
            found |= 2;
        }
        line = strchr(line, '\n');
        line = line != NULL ? line + 1 : NULL;
    }
    return found == 3 ? 0 : -1;
}

/* Run the dump into an in-memory stream, with `original` installed as the object allocator for
 * the call when not NULL. GIL held throughout: no Python code runs in the window. Returns 1 when
 * pymalloc answered, 0 when not, -1 when the stream could not be opened (errno). */
static int run_dump(mr_dump_fn dump, PyMemAllocatorEx *original, PyMemAllocatorEx *hooked,
                    char **buf, size_t *size)
{
    FILE *stream = open_memstream(buf, size);
    int active;
    if (stream == NULL) {
        return -1;
    }
    if (original != NULL) {
        PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, original);
    }
    active = dump(stream);
    if (original != NULL) {
        PyMem_SetAllocator(PYMEM_DOMAIN_OBJ, hooked);
    }
    fclose(stream);
    return active != 0;
}

PyDoc_STRVAR(diag_pymalloc_doc,
             "diag_pymalloc(tracing, /) -> (arena_bytes, allocated_bytes) | None\n\n"
             "Bytes in pymalloc's arenas and in its allocated blocks, from CPython's\n"
             "_PyObject_DebugMallocStats.\n\n"
             "tracing: tracemalloc hooks the object allocator; the allocator its hook wraps is\n"
             "put back for the call (in C, the GIL held, no Python code in between) when it is\n"
             "CPython's own.\n\n"
             "None without pymalloc (PYTHONMALLOC=malloc, another hook, a free-threaded\n"
             "build). OSError when no\n"
             "in-memory stream can be opened.");

/* CPython's own dump function (not an allocator symbol), looked up: its declaration is private.
 * NULL on free-threaded builds: they serve objects from mimalloc, not pymalloc, and no GIL keeps
 * other threads out of the allocator swap around the dump. */
static void *pymalloc_dump_symbol(void)
{
#ifdef Py_GIL_DISABLED
    return NULL;
#else
    return dlsym(RTLD_DEFAULT, "_PyObject_DebugMallocStats");
#endif
}

static PyObject *diag_pymalloc(PyObject *module, PyObject *arg)
{
    mr_dump_fn dump = NULL;
    void *symbol = pymalloc_dump_symbol();
    PyMemAllocatorEx hooked = {NULL, NULL, NULL, NULL, NULL}, original = hooked;
    char *buf = NULL;
    size_t size = 0;
    unsigned long long arena_bytes = 0, allocated = 0;
    int active, parsed;
    (void)module;
    if (!PyBool_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "diag_pymalloc() tracing must be bool, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    if (symbol == NULL) {
        Py_RETURN_NONE;
    }
    memcpy(&dump, &symbol, sizeof(dump));
    if (arg == Py_True) {
        PyMem_GetAllocator(PYMEM_DOMAIN_OBJ, &hooked);
        if (unhooked_allocator(&hooked, &original) < 0) {
            Py_RETURN_NONE;
        }
    }
    active = run_dump(dump, arg == Py_True ? &original : NULL, &hooked, &buf, &size);
    if (active < 0) {
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    parsed = active && buf != NULL ? parse_dump(buf, &arena_bytes, &allocated) : -1;
    free(buf);
    if (parsed < 0) {
        Py_RETURN_NONE;
    }
    return Py_BuildValue("(KK)", arena_bytes, allocated);
}

/* ---- the method table ----------------------------------------------------------------------- */

PyMethodDef mr_diag_methods[] = {
    {"diag_jemalloc_flush", diag_jemalloc_flush, METH_NOARGS, diag_jemalloc_flush_doc},
    {"diag_jemalloc_parts", diag_jemalloc_parts, METH_NOARGS, diag_jemalloc_parts_doc},
    {"diag_glibc_tcache", diag_glibc_tcache, METH_NOARGS, diag_glibc_tcache_doc},
    {"diag_mimalloc_collect", diag_mimalloc_collect, METH_O, diag_mimalloc_collect_doc},
    {"diag_probe_address", diag_probe_address, METH_O, diag_probe_address_doc},
    {"diag_anon_mappings", (PyCFunction)(void (*)(void))diag_anon_mappings, METH_FASTCALL,
     diag_anon_mappings_doc},
    {"diag_hold_blocks", (PyCFunction)(void (*)(void))diag_hold_blocks, METH_FASTCALL,
     diag_hold_blocks_doc},
    {"diag_pymalloc", diag_pymalloc, METH_O, diag_pymalloc_doc},
    {NULL, NULL, 0, NULL},
};

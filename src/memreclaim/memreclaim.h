/* Shared declarations of the memreclaim C core (the extension memreclaim._core), one section per
 * file (see docs/architecture.md):
 *
 *   pure C, no Python objects: raw numbers (bytes) and errno values, callable with the GIL
 *   released unless a declaration says otherwise
 *     procfs.c    every /proc and sysfs reader: /proc/self/statm through a kept descriptor
 *                 (fork-aware), /proc/PID/status, smaps_rollup, who a process is (stat's
 *                 start time, status's uid), the lines and fields of maps (pid 0: self); the
 *                 transparent-huge-page settings under /sys/kernel/mm/transparent_hugepage
 *     thp.c       which maps ranges are the allocators' heaps; marks them MADV_NOHUGEPAGE after a
 *                 trim (THP=always)
 *     detect.c    which loaded object serves malloc, and the one symbol rule (mr_alloc_symbol)
 *     backends.c  one backend per allocator (trim, stats, the thread's share, knobs) behind a
 *                 table of function pointers
 *   Python glue: call with the GIL held (an attached thread state) unless a declaration says
 *   otherwise; each returns NULL or -1 with an exception set on failure
 *     module.c    module state, result types, method tables, multi-phase init, shared helpers
 *     heap.c      trim (and the process totals it keeps), rss, stats, heap_stats
 *     inspect.c   process_*, the mimalloc heap walk, the THP readers' entry points
 *     knobs.c     glibc's mallopt knobs and malloc_info, mimalloc's purge delay, collect_thread
 *
 * The pool reclaim of memreclaim._pools (_pools*.c) is its own extension, reached through a
 * capsule (the last section).
 */
#ifndef MEMRECLAIM_H
#define MEMRECLAIM_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- capability macros ----------------------------------------------------------------------- */

/* glibc's mallopt() parameter numbers (malloc.h); defined here so the build does not depend on
 * the header of the C library it happens to be built against. */
#define MR_M_TRIM_THRESHOLD (-1)
#define MR_M_MMAP_THRESHOLD (-3)
#define MR_M_ARENA_MAX (-8)

/* glibc refuses an mmap threshold above HEAP_MAX_SIZE / 2, which is 32 MiB on 64-bit systems
 * (4 * 1024 * 1024 * sizeof(long)). */
#define MR_MMAP_THRESHOLD_MAX ((long long)4 * 1024 * 1024 * (long long)sizeof(long))

/* jemalloc: MALLCTL_ARENAS_ALL is 4096, so this purges every arena. */
#define MR_JEMALLOC_PURGE_ALL "arena.4096.purge"

/* ---- procfs.c: pure C, GIL released or held -------------------------------------------------- */

/* A kept descriptor on /proc/self/statm. The descriptor names the process that opened it, so it
 * is reopened when the fork generation changes (a child must read its own figures). The program
 * may close the descriptor behind our back (a daemoniser closing every descriptor) and reuse its
 * number: when a read fails or is not statm, device and inode tell whether it is still ours; one
 * that is not is forgotten (never closed) and statm reopened. */
typedef struct {
    /* Guarded by procfs.c's statm lock, inside mr_statm_read/mr_statm_close only. */
    int fd;                   /* -1 when not open */
    unsigned long generation; /* mr_fork_generation() when fd was opened */
    uint64_t dev, ino;        /* fstat() of fd when it was opened */
} mr_statm;

typedef struct {
    int64_t resident; /* bytes */
    int64_t anon;     /* bytes: resident - shared (file-backed and shmem) */
    int64_t vsize;    /* bytes: the mapped address space (statm's size, VmSize) */
} mr_rss_sample;

/* Fields of /proc/PID/status, in bytes (threads: a count); -1 where the kernel does not report
 * one. */
typedef struct {
    int64_t rss;          /* VmRSS */
    int64_t rss_anon;     /* RssAnon */
    int64_t rss_file;     /* RssFile */
    int64_t rss_shmem;    /* RssShmem */
    int64_t peak_rss;     /* VmHWM */
    int64_t swap;         /* VmSwap */
    int64_t virtual_size; /* VmSize */
    int64_t threads;      /* Threads */
    char name[64];        /* Name (the command, as the kernel escapes it); "" if absent */
} mr_status;

/* Fields of /proc/PID/smaps_rollup, in bytes; -1 where absent. */
typedef struct {
    int64_t pss;             /* Pss */
    int64_t private_dirty;   /* Private_Dirty */
    int64_t shared_clean;    /* Shared_Clean */
    int64_t anonymous;       /* Anonymous */
    int64_t anon_huge_pages; /* AnonHugePages */
} mr_rollup;

/* Who a process is, from /proc/PID/status and /proc/PID/stat. */
typedef struct {
    int64_t uid;        /* effective uid: the second number of status's Uid: line */
    int64_t start_time; /* clock ticks after boot: field 22 of stat (a reused pid's is later) */
} mr_identity;

void mr_procfs_global_init(void);
unsigned long mr_fork_generation(void);
void mr_statm_init(mr_statm *statm);
void mr_statm_close(mr_statm *statm);
/* Returns 0, or an errno value (and leaves *out unspecified). Thread-safe without the GIL: every
 * use of a kept descriptor (read, reopen, close) holds one process-wide lock in procfs.c, which
 * fork handlers take and release so a child never inherits it held. Call with the GIL held or
 * not: the lock is held only around a pread (or an open/close). */
int mr_statm_read(mr_statm *statm, mr_rss_sample *out);
/* Readers of /proc/PID/...: pid 0 reads /proc/self. Each returns 0, or an errno value: ESRCH when
 * process pid does not exist (or exits while read), EACCES/EPERM when its files are not readable
 * (smaps_rollup and maps need ptrace access), EIO when the file is not what we understand. */
int mr_status_read(int pid, mr_status *out);
int mr_rollup_read(int pid, mr_rollup *out);
/* Both files read through one open /proc/PID directory, so both figures are of one process (a
 * pid reused in between is ESRCH). On an error *failed names the file ("stat", "status"), or is
 * NULL when /proc/PID itself could not be opened. Errors as above. */
int mr_identity_read(int pid, mr_identity *out, const char **failed);
/* *out: the size of the [heap] (brk) mapping in bytes, -1 when the process has none. */
int mr_heap_mapping_read(int pid, int64_t *out);

/* Read fd line by line through buf[0:size] and call fn(ctx, line, len) on each (without its
 * newline); a line longer than buf is dropped, and fn is called with line NULL for it. Returns 0,
 * the errno of a read, or the first non-zero value fn returns (which stops the walk). Pure C. */
typedef int (*mr_line_fn)(void *ctx, const char *line, size_t len);
int mr_lines_read(int fd, char *buf, size_t size, mr_line_fn fn, void *ctx);
/* mr_lines_read over /proc/self/NAME, or over the file at path when it is not NULL (a test's
 * fixture in the same format). Returns 0, an errno of the open or a read, or fn's value. Pure C. */
int mr_self_lines(const char *name, const char *path, char *buf, size_t size, mr_line_fn fn,
                  void *ctx);
/* A "Key:   123 kB" line (key with its colon, the whole key matched): 0 with *bytes, else -1. */
int mr_kb_line(const char *line, size_t len, const char *key, int64_t *bytes);
/* The main program's path (/proc/self/exe), NUL-terminated in out[0:size]: 0 or an errno. */
int mr_self_exe(char *out, size_t size);

/* One line of /proc/PID/maps: "start-end perms offset dev inode [name]". */
typedef struct {
    uint64_t start, end; /* [start, end) */
    char perms[4];       /* "rw-p", "---p", ... (not terminated) */
    bool anonymous;      /* device 00:00 and inode 0 */
    const char *name;    /* what follows the inode, in the line (may be empty) */
    size_t name_len;
} mr_maps_entry;

/* 0, or EIO when the line is not laid out like that. Pure C, no allocation. */
int mr_maps_parse(const char *line, size_t len, mr_maps_entry *out);

/* Transparent huge pages (procfs.c reads the settings, thp.c marks the heap). */
#define MR_THP_SYSFS "/sys/kernel/mm/transparent_hugepage"
/* Room for the path of a THP file that could not be read (a directory of up to 511 bytes). */
#define MR_THP_PATH_MAX 600

typedef enum {
    MR_THP_NONE = 0, /* the kernel has no THP (no transparent_hugepage/enabled) */
    MR_THP_NEVER,
    MR_THP_MADVISE,
    MR_THP_ALWAYS,
    MR_THP_OTHER, /* a word this build does not know */
} mr_thp_mode;

/* The THP settings; "" / -1 where the kernel has no such file. */
typedef struct {
    char enabled[16];             /* the bracketed word of enabled: always, madvise, never */
    char defrag[24];              /* of defrag: always, defer, defer+madvise, madvise, never */
    char pmd_enabled[16];         /* of hugepages-<PMD>kB/enabled (6.8+): ... or inherit */
    int64_t pmd_size;             /* hpage_pmd_size, bytes */
    int64_t max_ptes_none;        /* khugepaged/max_ptes_none */
    int64_t scan_sleep_millisecs; /* khugepaged/scan_sleep_millisecs */
} mr_thp_settings;

/* Read the settings under dir (NULL: MR_THP_SYSFS; tests pass a directory of their own). A missing
 * file leaves its field ""/-1; any other failure returns its errno (EIO: not the format we know)
 * with the file's path in failed. */
int mr_thp_settings_read(const char *dir, mr_thp_settings *out, char *failed, size_t failed_size);
/* The mode that governs PMD-size (2 MiB) huge pages: hugepages-<PMD>kB/enabled unless it is
 * "inherit" or absent, else enabled; MR_THP_NONE when enabled is absent. */
mr_thp_mode mr_thp_settings_mode(const mr_thp_settings *settings);
/* The same mode read from MR_THP_SYSFS: two small sysfs reads, a good reading kept for a second
 * (the per-size file's name is found once per process). 0 or an errno with the file's path in
 * failed. */
int mr_thp_mode_read(mr_thp_mode *mode, char *failed, size_t failed_size);
/* hpage_pmd_size under MR_THP_SYSFS (read once per process: fixed at boot), -1 if unknown. */
int64_t mr_thp_pmd_size(void);
/* "always", "madvise", "never", "other"; NULL for MR_THP_NONE. */
const char *mr_thp_mode_name(mr_thp_mode mode);

/* ---- thp.c: pure C, no allocation; GIL released ---------------------------------------------- */

/* Called with each heap range [start, end) chosen; returns 0 to go on or an errno to stop. */
typedef int (*mr_range_fn)(void *ctx, uint64_t start, uint64_t end);
/* Walk maps_path (NULL: /proc/self/maps) and call fn on each range of the allocators' heaps:
 * anonymous private read-write mappings (unnamed, [heap], glibc's "[anon: glibc: malloc...]")
 * that hold a whole aligned huge page of pmd_size bytes, leaving out stacks ([stack], a mapping
 * right above a small PROT_NONE guard unless it starts on a glibc heap boundary, and the one
 * holding the caller's own stack). Pure C, no allocation. Returns 0, an errno of the read, EIO
 * for a line we do not understand, or fn's errno. */
int mr_thp_heap_ranges(const char *maps_path, uint64_t pmd_size, mr_range_fn fn, void *ctx);

typedef struct {
    int64_t ranges;  /* ranges marked */
    int64_t bytes;   /* bytes in them */
    int64_t skipped; /* ranges unmapped meanwhile by another thread (madvise ENOMEM) */
} mr_thp_marked;

/* madvise(MADV_NOHUGEPAGE) every range mr_thp_heap_ranges chooses in /proc/self/maps. Pure C:
 * call with the GIL released. Returns 0 or an errno (out says what was marked before it). */
int mr_thp_mark_heap(mr_thp_marked *out);

/* ---- detect.c and backends.c: the allocator's types (pure C) --------------------------------- */

typedef enum {
    MR_ALLOC_UNKNOWN = 0,
    MR_ALLOC_GLIBC,
    MR_ALLOC_JEMALLOC,
    MR_ALLOC_MIMALLOC,
    MR_ALLOC_TCMALLOC,
} mr_alloc_kind;

#define MR_MAX_FIGURES 12

/* Raw allocator figures: every field in bytes (counts where the name says so), -1 = unknown. */
typedef struct {
    int64_t in_use; /* bytes handed out to the program */
    int64_t free;   /* bytes the allocator holds but has not handed out */
    int64_t mapped; /* bytes the allocator has obtained from the kernel */
    size_t nfigures;
    struct {
        const char *name;
        int64_t value;
    } figures[MR_MAX_FIGURES]; /* the allocator's own names and numbers */
} mr_heap_stats;

typedef struct mr_backend {
    mr_alloc_kind kind;
    const char *name;        /* "glibc", "jemalloc", "mimalloc", "tcmalloc", "unknown" */
    const char *trim_method; /* what trim() calls, for humans; "none" when nothing */
    /* Give free memory back. Pure C: called with the GIL released. Returns 0 or an errno. */
    int (*trim)(void);
    /* Fill *out. Pure C, may walk the heap. Returns 0, ENOTSUP when the allocator has no
     * statistics interface, or another errno. */
    int (*heap_stats)(mr_heap_stats *out);
    /* Called once, by detection, when it picks this backend (mr_sym filled): writes the
     * allocator's version into version[0:size] (left "" when it does not say) and sets up what the
     * backend needs for the process (mimalloc: fork handlers for its option lock). Pure C. */
    void (*detected)(char *version, size_t size);
} mr_backend;

/* glibc's struct mallinfo2 (2.33+) and struct mallinfo, declared here so that the build does not
 * depend on the C library's headers. */
struct mr_mallinfo2 {
    /* usmblks is unused (always 0), but it is part of the layout. */
    // cppcheck-suppress unusedStructMember
    size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};
struct mr_mallinfo {
    // cppcheck-suppress unusedStructMember
    int arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};

/* detect.c -> backends.c: the interface of the object serving malloc, as detection resolved it
 * (mr_alloc_symbol's rule); NULL where that object has no such name, glibc's names NULL unless
 * glibc serves malloc. Written once under detection's pthread_once, read-only after: read it only
 * after mr_backend_detect() (every backend call is made after it). */
typedef struct {
    /* glibc */
    int (*malloc_trim)(size_t);
    struct mr_mallinfo2 (*mallinfo2)(void);
    struct mr_mallinfo (*mallinfo)(void);
    int (*mallopt)(int, int);
    int (*malloc_info)(int, FILE *);
    const char *(*gnu_get_libc_version)(void);
    /* jemalloc */
    int (*mallctl)(const char *, void *, size_t *, void *, size_t);
    /* mimalloc */
    void (*mi_collect)(bool);
    void (*mi_process_info)(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *,
                            size_t *);
    int (*mi_version)(void);
    void *(*mi_heap_get_backing)(void);
    bool (*mi_heap_visit_blocks)(const void *, bool,
                                 bool (*)(const void *, const void *, void *, size_t, void *),
                                 void *);
    long (*mi_option_get)(int);
    void (*mi_option_set)(int, long);
    void (*mi_thread_done)(void);
    void (*mi_thread_init)(void);
    /* gperftools tcmalloc */
    void (*tc_release)(void);
    int (*tc_numeric_property)(const char *, size_t *);
    const char *(*tc_version)(int *, int *, const char **);
    void (*tc_mark_thread_idle)(void);
} mr_alloc_syms;

/* ---- detect.c: which object serves malloc; pure C, GIL released or held ---------------------- */

extern mr_alloc_syms mr_sym;

/* Resolve the optional symbols (once per process; idempotent and thread-safe) and return the
 * backend serving malloc in this process. Never NULL. */
const mr_backend *mr_backend_detect(void);
/* The address of `name` as the program's calls to it reach the object that serves malloc (the
 * allocator below a forwarding wrapper), by the rule detection applies to its own names: the
 * object's dynamic symbol table (not a PLT stub), and only when calls to `name` go to that object
 * (a library bundling a private copy does not count); glibc's own names (malloc_trim, mallinfo2,
 * mallinfo, mallopt, malloc_info) only when glibc serves malloc. NULL when absent, when `name` is
 * NULL or when the allocator is unknown. Runs detection first if needed. Thread-safe, pure C, with
 * or without the GIL (it walks the link map under the dynamic loader's lock); not cached: call it
 * once and keep the answer. A function's address is converted with
 * *(void **)(&fn) = mr_alloc_symbol("name"). */
void *mr_alloc_symbol(const char *name);
/* The path of the loaded object whose definition of `name` the program's calls reach (the rule
 * above: its dynamic symbol table, not a PLT stub; for a name no call is bound to, such as a
 * function of an extension loaded RTLD_LOCAL, the first definer in link-map order), copied into
 * `path` (truncated to `size`). False when no loaded object defines `name`. Pure C, with or
 * without the GIL (it walks the link map under the dynamic loader's lock). */
bool mr_symbol_definer(const char *name, char *path, size_t size);
/* The detected allocator's version string (read at detection), or NULL when it does not say. */
const char *mr_backend_version(void);
/* The forwarding wrapper (path of the object defining malloc) when malloc is glibc's reached
 * through it, else NULL. */
const char *mr_backend_via(void);
/* Why memreclaim cannot act on the allocator (the backend is "unknown"), else NULL. */
const char *mr_backend_reason(void);

/* ---- backends.c: one backend per allocator; pure C, GIL released or held --------------------- */

/* The backends, indexed by mr_alloc_kind. */
extern const mr_backend mr_backends[];

/* mimalloc: the in-use bytes of the calling thread's heap, page by page (mi_heap_visit_blocks
 * over mi_heap_get_backing(), both optional: 3.6 no longer exports the latter). */
typedef struct {
    size_t small_max;     /* in: pages of blocks up to this size count as small */
    size_t max_areas;     /* in: the walk stops after this many pages (EOVERFLOW) */
    uintptr_t *addresses; /* in: room for the first max_addresses pages' start addresses */
    size_t max_addresses;
    size_t small_used, large_used, committed; /* out: bytes */
    size_t areas, naddresses;                 /* out: pages visited, addresses stored */
    bool truncated;
} mr_mi_areas;

/* Pure C, no allocation: call with the GIL released. Returns 0, ENOTSUP when the allocator is not
 * mimalloc or does not export the walk, EOVERFLOW when the walk passed max_areas. */
int mr_mimalloc_areas(mr_mi_areas *out);

/* mimalloc's purge delay (mi_option_purge_delay, 2.0's decommit_delay), in ms: *previous gets
 * the value before, and with `set` it becomes `value`. Returns 0, or ENOTSUP when the allocator
 * is not mimalloc, lacks mi_option_get/set, or is a version whose option numbers memreclaim has
 * not checked (mr_mimalloc_purge_delay_reason() says which). Pure C. */
int mr_mimalloc_purge_delay(long value, bool set, long *previous);
const char *mr_mimalloc_purge_delay_reason(void);

/* The calling thread's share of giving memory back, for the live allocator: mimalloc
 * mi_collect(true) with the purge delay at 0 (and with `abandon`, on 2.x and not in the main
 * thread, mi_thread_done(): the thread's heap is handed over as an exited thread's is, for the
 * next trim from any thread to decommit); jemalloc thread.idle, else thread.tcache.flush;
 * tcmalloc MallocExtension_MarkThreadIdle; glibc and unknown: nothing. *method: what was
 * called ("none" when nothing, a static string). Pure C: call with the GIL released. Returns 0.
 */
int mr_thread_collect(bool abandon, const char **method);

/* glibc knobs. Return 0, ENOTSUP when the live allocator is not glibc or lacks the call, or
 * EINVAL when glibc refused the value. */
int mr_glibc_mallopt(int param, int value);
/* glibc malloc_info(0, ...) into a malloc'd buffer (*text, *size); the caller frees *text with
 * free(). Pure C: call with the GIL released. Returns 0 or an errno. */
int mr_glibc_malloc_info(char **text, size_t *size);

/* ---- module.c: the module's state and the Python glue its files share ------------------------
 *
 * Everything below speaks Python: call it with the GIL held (an attached thread state), except
 * where a function says otherwise. Each returns NULL or -1 with an exception set on failure. */

/* The module's result types (struct sequences), by their index in mr_core_state.types; module.c
 * holds one description per index. */
typedef enum {
    MR_TRIM_RESULT,    /* TrimResult: trim() */
    MR_MEMORY_STATS,   /* MemoryStats: stats() */
    MR_HEAP_STATS,     /* HeapStats: heap_stats(), stats(heap=True).heap */
    MR_TRIM_TOTALS,    /* TrimTotals: totals() */
    MR_COLLECT_RESULT, /* CollectResult: collect_thread() */
    MR_PROCESS_STATUS, /* _core.ProcessStatus: process_status() */
    MR_PROCESS_ROLLUP, /* _core.ProcessRollup: process_rollup() */
    MR_PROC_IDENTITY,  /* _core.ProcessIdentity: process_identity() */
    MR_MIMALLOC_AREAS, /* _core.MimallocAreas: mimalloc_areas() */
    MR_THP_SETTINGS,   /* ThpSettings: thp_settings() */
    MR_THP_MARKED,     /* _core.ThpMarked: _thp_mark_heap() */
    MR_SAMPLE,         /* _core.Sample: sample() */
    MR_NTYPES
} mr_type_id;

typedef struct {
    PyTypeObject *types[MR_NTYPES];
    PyObject *unsupported_error; /* memreclaim.UnsupportedAllocatorError */
    PyObject *allocator_name;    /* str */
    const mr_backend *backend;
    mr_statm statm;  /* procfs.c locks it: the GIL does not serialise it on free-threaded builds */
    int statm_ready; /* set by exec: a zeroed state has fd 0, which is not ours */
} mr_core_state;

static inline mr_core_state *mr_state(PyObject *module)
{
    return (mr_core_state *)PyModule_GetState(module);
}

/* A new, unfilled instance of the module's result type `id`. */
static inline PyObject *mr_new_result(PyObject *module, mr_type_id id)
{
    return PyStructSequence_New(mr_state(module)->types[id]);
}

/* int for value >= 0, None for a negative (unknown) value. */
PyObject *mr_int_or_none(int64_t value);
/* str from a C string, None for NULL. */
PyObject *mr_str_or_none(const char *text);
/* Slots [first, first + count) of a struct sequence from `values` (mr_int_or_none each). */
int mr_set_ints(PyObject *result, Py_ssize_t first, const int64_t *values, Py_ssize_t count);
/* A new result of type `id` with slots [first, first + count) from `values` (mr_set_ints); the
 * others are the caller's to fill (mr_result_put). */
PyObject *mr_new_result_ints(PyObject *module, mr_type_id id, Py_ssize_t first,
                             const int64_t *values, Py_ssize_t count);
/* Slot i of a new result = item (stolen). item NULL (its exception set): the result is released
 * and -1 returned, so a builder can chain these with || and return NULL. */
int mr_result_put(PyObject *result, Py_ssize_t i, PyObject *item);
/* A tuple of `count` items, item i made by item(items, i) (a new reference, or NULL with an
 * exception set: then the tuple is released and NULL returned). */
typedef PyObject *(*mr_item_maker)(const void *items, size_t i);
PyObject *mr_tuple_of(const void *items, size_t count, mr_item_maker item);
/* mr_tuple_of for an array of int64_t (mr_int_or_none each) / of uintptr_t. */
PyObject *mr_tuple_of_ints(const int64_t *values, size_t count);
PyObject *mr_tuple_of_addresses(const uintptr_t *values, size_t count);
/* CLOCK_MONOTONIC in seconds. Pure C: with or without the GIL. */
double mr_monotonic_seconds(void);
/* OSError(err) naming the /proc file `path`; returns NULL. */
PyObject *mr_raise_proc_error(int err, const char *path);
/* UnsupportedAllocatorError: `function` needs glibc's malloc / needs `symbol`, which the
 * allocator serving malloc lacks. Return NULL. */
PyObject *mr_raise_unsupported(mr_core_state *state, const char *function);
PyObject *mr_raise_missing(mr_core_state *state, const char *function, const char *symbol);
/* A keyword-only flag: True or False only (NULL: absent, False), else TypeError. */
int mr_parse_flag(PyObject *value, const char *name, int *out);
/* An int in [min, max]: TypeError for a non-int (bool included), ValueError/OverflowError naming
 * the range. */
int mr_parse_bounded_int(PyObject *value, const char *name, long long min, long long max,
                         long long *out);

/* ---- heap.c: trim (and its process totals), rss, stats, heap_stats; GIL held ----------------- */

extern PyMethodDef mr_heap_methods[];

/* The process totals of trim() (TrimTotals). A trim that gives back less than this many
 * bytes, or an unknown amount, is unproductive. */
#define MR_UNPRODUCTIVE_BELOW ((int64_t)1 << 20)
/* Register the fork handlers that reset the totals in a child (once per process; pure C, any
 * thread, GIL or not). 0 or the errno of pthread_atfork. */
int mr_totals_init(void);
/* Add SECONDS_BUCKETS (tuple of the histogram's bounds) and UNPRODUCTIVE_BELOW to the module. */
int mr_totals_add_constants(PyObject *module);

/* ---- inspect.c: process_*, mimalloc_areas, the THP readers; GIL held ------------------------- */

/* Its functions (module.c's exec adds each file's table to the module). Each releases the GIL
 * around its /proc read, heap walk or madvise only; process_identity keeps it (two reads of a
 * few hundred bytes, like the statm reads). */
extern PyMethodDef mr_inspect_methods[];

/* ---- knobs.c: mallopt, malloc_info, set_purge_delay, collect_thread; GIL held ---------------- */

extern PyMethodDef mr_knobs_methods[];

/* ---- pool reclaim (memreclaim._pools), reached through a capsule ----------------------------- */

#define MR_POOLS_CAPSULE "memreclaim._pools._C_API"
#define MR_POOLS_CAPI_VERSION 1

typedef struct {
    long long pools_released; /* empty pymalloc pools whose pages were given back */
    long long bytes_released; /* bytes given back (madvised) */
} mr_pools_result;

typedef struct {
    int version; /* MR_POOLS_CAPI_VERSION */
    /* Called with the GIL held (it walks pymalloc's structures). Returns 0 and fills *out, or -1
     * with a Python exception set (for instance when pool reclaim is not enabled). */
    int (*reclaim)(mr_pools_result *out);
} mr_pools_capi;

#endif /* MEMRECLAIM_H */

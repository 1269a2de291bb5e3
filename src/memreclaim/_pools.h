/* Private declarations of memreclaim._pools (give back the pages of empty pymalloc pools).
 *
 * Files, one concern each:
 *   _pools_layout.h    pymalloc's layout per CPython minor version
 *   _pools_table.c     the arena table and the arena-allocator wrapper that fills it
 *   _pools_validate.c  header-by-header validation of one arena (reads only)
 *   _pools_reclaim.c   release of one arena; a pass in time slices, GIL released between them
 *   _pools_selftest.c  the self-test run in a forked child by enable()
 *   _pools.c           gates, module state, the Python functions and the capsule for _core
 */
#ifndef MEMRECLAIM_POOLS_H
#define MEMRECLAIM_POOLS_H

#include "memreclaim.h"

#include "_pools_layout.h"

#include <pthread.h>

/* ---- process-wide state ------------------------------------------------------------------- */

/* The arena allocator is process-wide and outlives any module instance, and the capsule call
 * from _core has no module: this state is therefore the process's, not a module's. Everything
 * but the table is touched with the main interpreter's GIL held; the table also takes `lock`,
 * because from 3.12 an interpreter with its own GIL may call the arena allocator. */

typedef struct {
    uintptr_t base;   /* address returned by the arena allocator */
    uintptr_t caller; /* return address of the request */
} mrp_arena;

typedef struct {
    int installed; /* our wrapper was put in place by enable() */
    int enabled;   /* every gate passed; reclaim may run */
    int failed;    /* a gate failed for good: reason says why */
    int busy;      /* enable() in progress (it releases the GIL while the self-test runs) */
    char reason[400];
    PyObjectArenaAllocator prev; /* the allocator we wrap */
    uintptr_t cpython_base;      /* dli_fbase of libpython (or the executable) */
    uintptr_t arena_caller;      /* pymalloc's arena call site, learnt by the self-test */
    uintptr_t last_caller;       /* call site of the latest recorded arena */
    PyObject *error_type;        /* PoolReclaimUnavailable of the main interpreter's module */
    /* the table, sorted by base, guarded by lock */
    pthread_mutex_t lock;
    mrp_arena *arenas;
    size_t narenas;
    size_t capacity;
    unsigned long long arenas_recorded;
    unsigned long long arenas_forgotten;
    unsigned long long foreign_blocks;
    unsigned long long table_errors;
    /* totals of completed passes */
    long long reclaim_calls;
    long long pools_released;
    long long bytes_released;
    long long used_pools_trimmed;
    long long used_bytes_released;
    long long arenas_skipped;
    long long last_ns;
    long long total_ns;
    long long max_hold_ns;     /* longest single GIL hold of any slice */
    long long max_hold_cpu_ns; /* the same in this thread's CPU time (no preemption) */
    long long selftest_pools_released;
} mrp_process;

extern mrp_process mrp_proc;

/* ---- _pools_table.c ----------------------------------------------------------------------- */

void mrp_table_keep_caller(uintptr_t caller);
/* The first recorded arena whose base is >= from; 0 when there is none. */
uintptr_t mrp_table_next(uintptr_t from);
int mrp_table_contains(uintptr_t address);
int mrp_in_cpython(const void *address);
void mrp_install_wrapper(const PyObjectArenaAllocator *current);
void mrp_remove_wrapper(void);
int mrp_allocator_is_ours(void);

/* ---- _pools_validate.c -------------------------------------------------------------------- */

/* Validate every carved pool of the arena at base (resident[] from mincore over the arena).
 * Returns the number of carved pools, or -1 when something does not look like pymalloc's. */
long mrp_validate_arena(uintptr_t base, const unsigned char *resident);
uintptr_t mrp_first_pool(uintptr_t base);

/* ---- _pools_reclaim.c --------------------------------------------------------------------- */

typedef struct {
    long long pools_released;      /* empty pools; with dry_run: pools that would be released */
    long long bytes_released;      /* from empty pools and from pools holding live blocks */
    long long used_pools_trimmed;  /* pools holding live blocks with pages dropped */
    long long used_bytes_released; /* the bytes of those pages */
    long long arenas_scanned;
    long long arenas_skipped;
    long long slices;
    long long max_hold_ns;     /* longest slice, wall clock (preemption included) */
    long long max_hold_cpu_ns; /* longest slice, this thread's CPU time */
    long long elapsed_ns;
} mrp_pass;

/* Check before a slice; 0, or -1 with an exception set (the pass stops). */
typedef int (*mrp_gate_fn)(void);

/* One pass over every recorded arena, with the GIL held, in slices of at most slice_ns
 * (< 0: one slice), releasing the GIL between slices and calling gate() before each one.
 * With dry_run, nothing is written. Returns 0, or -1 with an exception set by gate(). */
int mrp_run_pass(int dry_run, long long slice_ns, mrp_gate_fn gate, mrp_pass *pass);
long long mrp_now_ns(void);
long long mrp_thread_cpu_ns(void);

/* ---- _pools_selftest.c -------------------------------------------------------------------- */

typedef struct {
    int ok;
    uintptr_t caller;
    long long pools_released;
    char message[300];
} mrp_report;

/* Fork, run the self-test in the child, wait (GIL released) for its report. 0, or -1 with the
 * reason in mrp_proc.reason. */
int mrp_run_selftest(mrp_report *report);

void mrp_set_reason(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* MEMRECLAIM_POOLS_H */

/* One backend per allocator: glibc, jemalloc, mimalloc, tcmalloc and none, each a section with its
 * trim, its statistics, the calling thread's share (mr_thread_collect) and its knobs, behind the
 * table of function pointers that detection (detect.c) picks from. Every call goes through the
 * symbols detection resolved in the object serving malloc (mr_sym), NULL where it has none.
 *
 * Pure C, no Python objects.
 */
#define _GNU_SOURCE
#include "memreclaim.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

/* ---- glibc ----------------------------------------------------------------------------------- */

static int glibc_trim(void)
{
    (void)mr_sym.malloc_trim(0); /* 1 if memory was released, 0 if not: we measure RSS instead */
    return 0;
}

static void glibc_detected(char *version, size_t size)
{
    (void)snprintf(version, size, "%s", mr_sym.gnu_get_libc_version());
}

static void add_figure(mr_heap_stats *out, const char *name, int64_t value)
{
    if (out->nfigures < MR_MAX_FIGURES) {
        out->figures[out->nfigures].name = name;
        out->figures[out->nfigures].value = value;
        out->nfigures++;
    }
}

static int glibc_heap_stats(mr_heap_stats *out)
{
    struct mr_mallinfo2 mi;
    if (mr_sym.mallinfo2 != NULL) {
        mi = mr_sym.mallinfo2();
    } else if (mr_sym.mallinfo != NULL) {
        /* Before glibc 2.33 only the int version exists; its fields wrap past 2 GiB. */
        struct mr_mallinfo old = mr_sym.mallinfo();
        mi.arena = (unsigned)old.arena;
        mi.ordblks = (unsigned)old.ordblks;
        mi.smblks = (unsigned)old.smblks;
        mi.hblks = (unsigned)old.hblks;
        mi.hblkhd = (unsigned)old.hblkhd;
        mi.fsmblks = (unsigned)old.fsmblks;
        mi.uordblks = (unsigned)old.uordblks;
        mi.fordblks = (unsigned)old.fordblks;
        mi.keepcost = (unsigned)old.keepcost;
    } else {
        return ENOTSUP;
    }
    add_figure(out, "arena", (int64_t)mi.arena);
    add_figure(out, "ordblks", (int64_t)mi.ordblks);
    add_figure(out, "smblks", (int64_t)mi.smblks);
    add_figure(out, "hblks", (int64_t)mi.hblks);
    add_figure(out, "hblkhd", (int64_t)mi.hblkhd);
    add_figure(out, "fsmblks", (int64_t)mi.fsmblks);
    add_figure(out, "uordblks", (int64_t)mi.uordblks);
    add_figure(out, "fordblks", (int64_t)mi.fordblks);
    add_figure(out, "keepcost", (int64_t)mi.keepcost);
    out->in_use = (int64_t)(mi.uordblks + mi.hblkhd);
    out->free = (int64_t)mi.fordblks;
    out->mapped = (int64_t)(mi.arena + mi.hblkhd);
    return 0;
}

/* ---- jemalloc -------------------------------------------------------------------------------- */

static int jemalloc_trim(void)
{
    /* Flush this thread's cache first so its cached blocks can be purged too; a failure (tcache
     * disabled) is not an error. */
    (void)mr_sym.mallctl("thread.tcache.flush", NULL, NULL, NULL, 0);
    return mr_sym.mallctl(MR_JEMALLOC_PURGE_ALL, NULL, NULL, NULL, 0);
}

static void jemalloc_detected(char *version, size_t size)
{
    const char *text = NULL;
    size_t len = sizeof(text);
    if (mr_sym.mallctl("version", &text, &len, NULL, 0) == 0 && text != NULL) {
        (void)snprintf(version, size, "%s", text);
    }
}

static int jemalloc_heap_stats(mr_heap_stats *out)
{
    static const char *const names[] = {"stats.allocated", "stats.active", "stats.resident",
                                        "stats.mapped", "stats.retained"};
    int64_t values[5];
    uint64_t epoch = 1;
    size_t len = sizeof(epoch);
    int err;

    /* Statistics are cached; writing the epoch refreshes them. */
    err = mr_sym.mallctl("epoch", &epoch, &len, &epoch, len);
    if (err != 0) {
        return err;
    }
    for (size_t i = 0; i < 5; i++) {
        size_t value = 0;
        len = sizeof(value);
        err = mr_sym.mallctl(names[i], &value, &len, NULL, 0);
        if (err != 0) {
            return err == ENOENT ? ENOTSUP : err; /* built without --enable-stats */
        }
        values[i] = (int64_t)value;
        add_figure(out, names[i] + 6, values[i]);
    }
    out->in_use = values[0];
    out->free = values[2] > values[0] ? values[2] - values[0] : 0;
    out->mapped = values[3];
    return 0;
}

/* ---- mimalloc -------------------------------------------------------------------------------- */

/* mimalloc's option that holds how long freed memory waits before it is given back, in ms:
 * mi_option_decommit_delay in 1.7-2.0 (env MIMALLOC_RESET_DELAY / MIMALLOC_DECOMMIT_DELAY),
 * mi_option_purge_delay from 2.1 and in 3.x (MIMALLOC_PURGE_DELAY). Options are numbered by an
 * enum that keeps deprecated entries for binary compatibility: this one is 15 from 1.7 (179) to
 * 3.4 (30403) in each tag's mimalloc.h, and mi_option_get(15) reads back MIMALLOC_PURGE_DELAY
 * (RESET_DELAY) under 2.0.9, 3.0.1 and 3.6.0. 1.6 numbered it 13; versions outside what was
 * checked are not guessed at. Defaults: 25 ms (2.0), 10 (2.1-2.4), 2500 (3.0.1), 1000 (3.0.3+).
 */
#define MR_MI_OPTION_PURGE_DELAY 15
/* mi_option_abandoned_page_decommit (2.0), abandoned_page_purge (2.1-3.1): 12 in every 2.x. */
#define MR_MI_OPTION_ABANDONED_PURGE 12
#define MR_MI_CHECKED_MIN 179
#define MR_MI_CHECKED_MAX 30699

/* Serialises the save/zero/collect/restore of the purge delay in trim and the knob: two trims
 * interleaved would otherwise restore each other's zero for good. Taken around fork. */
static pthread_mutex_t mi_option_lock = PTHREAD_MUTEX_INITIALIZER;

static void mi_option_lock_take(void)
{
    (void)pthread_mutex_lock(&mi_option_lock);
}

static void mi_option_lock_give(void)
{
    (void)pthread_mutex_unlock(&mi_option_lock);
}

static bool mimalloc_has_purge_delay(void)
{
    int v;
    if (mr_sym.mi_option_get == NULL || mr_sym.mi_option_set == NULL || mr_sym.mi_version == NULL) {
        return false;
    }
    v = mr_sym.mi_version();
    return v >= MR_MI_CHECKED_MIN && v <= MR_MI_CHECKED_MAX;
}

/* mi_collect(true), made to reach what it can (measured, docs/threads.md):
 * - mimalloc 2.x keeps free spans in segments (32 MiB, one owner thread); with a delay, a span
 *   freed is queued for a decommit that only a later use of the segment carries out, and
 *   mi_collect on the main thread reclaims exited threads' segments and queues their spans again
 *   (a trim then gave back nothing of a spike freed by an exited thread). With the delay at 0 for
 *   the call they are decommitted at once (2.0.9: 416 -> 191 MiB).
 * - From 2.1 and in 3.x freed pages also wait in arenas, and mi_collect(true) force-purges them
 *   whatever their expiry, but skips the purge altogether when the delay is 0 or less (nothing
 *   would have been scheduled): that pass runs with the delay at least 1 (3.0.1: a trim with it
 *   at 0 gave back nothing, with it untouched 236 MiB).
 * - A thread whose mimalloc heap is not initialised (one that never called malloc) collects
 *   nothing: mi_thread_init() first.
 * The delay is restored after, under a lock: mi_collect never calls back here. */
static void mimalloc_collect_now(void)
{
    int v = mr_sym.mi_version != NULL ? mr_sym.mi_version() : 0;
    if (mr_sym.mi_thread_init != NULL) {
        mr_sym.mi_thread_init();
    }
    if (!mimalloc_has_purge_delay()) {
        mr_sym.mi_collect(true);
        return;
    }
    mi_option_lock_take();
    long saved = mr_sym.mi_option_get(MR_MI_OPTION_PURGE_DELAY);
    if (v >= 200 && v < 300 && mr_sym.mi_option_get(MR_MI_OPTION_ABANDONED_PURGE) == 0) {
        /* Left on: a thread that exits from now on decommits its queued spans as it abandons
         * its segments. Python's join() returns before the thread's TLS destructors run, so a
         * thread "exited" may abandon its heap after this collect (then its spans were queued
         * with a delay for good: one run in eight gave back nothing). */
        mr_sym.mi_option_set(MR_MI_OPTION_ABANDONED_PURGE, 1);
    }
    if (v < 300) {
        mr_sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, 0);
        mr_sym.mi_collect(true);
    }
    if (v >= 210) {
        mr_sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, saved > 0 ? saved : 1);
        mr_sym.mi_collect(true);
    }
    mr_sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, saved);
    mi_option_lock_give();
}

static int mimalloc_trim(void)
{
    mimalloc_collect_now();
    return 0;
}

int mr_mimalloc_purge_delay(long value, bool set, long *previous)
{
    if (mr_backend_detect()->kind != MR_ALLOC_MIMALLOC || !mimalloc_has_purge_delay()) {
        return ENOTSUP;
    }
    mi_option_lock_take();
    *previous = mr_sym.mi_option_get(MR_MI_OPTION_PURGE_DELAY);
    if (set) {
        mr_sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, value);
    }
    mi_option_lock_give();
    return 0;
}

const char *mr_mimalloc_purge_delay_reason(void)
{
    if (mr_backend_detect()->kind != MR_ALLOC_MIMALLOC) {
        return NULL;
    }
    if (mr_sym.mi_option_get == NULL || mr_sym.mi_option_set == NULL || mr_sym.mi_version == NULL) {
        return "this mimalloc does not export mi_option_get/mi_option_set/mi_version";
    }
    if (!mimalloc_has_purge_delay()) {
        return "memreclaim knows mimalloc's option numbers from 1.7 to 3.6 only";
    }
    return NULL;
}

static void mimalloc_detected(char *version, size_t size)
{
    /* A fork while another thread holds the purge-delay lock must not leave it held. */
    (void)pthread_atfork(mi_option_lock_take, mi_option_lock_give, mi_option_lock_give);
    if (mr_sym.mi_version != NULL) {
        /* 1.x, 2.x and 3.0 encode x.y.z as x*100 + y*10 + z (209 = 2.0.9, 301 = 3.0.1); later
         * 3.x releases as x*10000 + y*100 + z (30600 = 3.6.0). */
        int v = mr_sym.mi_version();
        if (v >= 10000) {
            (void)snprintf(version, size, "%d.%d.%d", v / 10000, v / 100 % 100, v % 100);
        } else if (v >= 1000) {
            /* 3.0.10 to 3.2.8 said x*1000 + y*100 + z (3010 = 3.0.10, 3208 = 3.2.8). */
            (void)snprintf(version, size, "%d.%d.%d", v / 1000, v / 100 % 10, v % 100);
        } else {
            (void)snprintf(version, size, "%d.%d.%d", v / 100, v / 10 % 10, v % 10);
        }
    }
}

static int mimalloc_heap_stats(mr_heap_stats *out)
{
    size_t elapsed, user, sys, rss, peak_rss, commit, peak_commit, faults;
    if (mr_sym.mi_process_info == NULL) {
        return ENOTSUP;
    }
    mr_sym.mi_process_info(&elapsed, &user, &sys, &rss, &peak_rss, &commit, &peak_commit, &faults);
    add_figure(out, "current_rss", (int64_t)rss);
    add_figure(out, "peak_rss", (int64_t)peak_rss);
    add_figure(out, "current_commit", (int64_t)commit);
    add_figure(out, "peak_commit", (int64_t)peak_commit);
    add_figure(out, "page_faults", (int64_t)faults);
    out->mapped = (int64_t)commit;
    return 0;
}

/* The leading fields of mimalloc's mi_heap_area_t, the same from 1.x to 3.x. */
struct mr_mi_area {
    void *blocks;
    // cppcheck-suppress unusedStructMember
    size_t reserved;
    size_t committed;
    size_t used;
    size_t block_size;
};

/* Called by mi_heap_visit_blocks for each page of the heap. It only adds numbers: nothing here
 * may allocate or free, since that would change the page queues being walked (a Python callback
 * can; a walk made with one was once seen never ending in CI). */
static bool mimalloc_area(const void *heap, const void *area, void *block, size_t block_size,
                          void *arg)
{
    const struct mr_mi_area *a = area;
    mr_mi_areas *out = arg;
    (void)heap;
    (void)block;
    (void)block_size;
    if (out->areas >= out->max_areas) {
        out->truncated = true;
        return false;
    }
    out->areas++;
    if (a->block_size <= out->small_max) {
        out->small_used += a->used * a->block_size;
    } else {
        out->large_used += a->used * a->block_size;
    }
    out->committed += a->committed;
    if (out->naddresses < out->max_addresses && a->blocks != NULL) {
        out->addresses[out->naddresses++] = (uintptr_t)a->blocks;
    }
    return true;
}

int mr_mimalloc_areas(mr_mi_areas *out)
{
    void *heap;
    if (mr_backend_detect()->kind != MR_ALLOC_MIMALLOC || mr_sym.mi_heap_get_backing == NULL ||
        mr_sym.mi_heap_visit_blocks == NULL) {
        return ENOTSUP;
    }
    out->small_used = out->large_used = out->committed = 0;
    out->areas = out->naddresses = 0;
    out->truncated = false;
    heap = mr_sym.mi_heap_get_backing();
    if (heap == NULL) {
        return ENOTSUP;
    }
    (void)mr_sym.mi_heap_visit_blocks(heap, false, mimalloc_area, out);
    return out->truncated ? EOVERFLOW : 0;
}

/* ---- tcmalloc (gperftools) ------------------------------------------------------------------- */

static int tcmalloc_trim(void)
{
    mr_sym.tc_release();
    return 0;
}

static void tcmalloc_detected(char *version, size_t size)
{
    if (mr_sym.tc_version != NULL) {
        const char *text = mr_sym.tc_version(NULL, NULL, NULL);
        if (text != NULL) {
            (void)snprintf(version, size, "%s", text);
        }
    }
}

static int tcmalloc_heap_stats(mr_heap_stats *out)
{
    static const char *const names[] = {
        "generic.current_allocated_bytes",   "generic.heap_size",
        "tcmalloc.pageheap_free_bytes",      "tcmalloc.pageheap_unmapped_bytes",
        "tcmalloc.central_cache_free_bytes", "tcmalloc.thread_cache_free_bytes"};
    int64_t values[6];
    if (mr_sym.tc_numeric_property == NULL) {
        return ENOTSUP;
    }
    for (size_t i = 0; i < 6; i++) {
        size_t value = 0;
        if (!mr_sym.tc_numeric_property(names[i], &value)) {
            return ENOTSUP;
        }
        values[i] = (int64_t)value;
        add_figure(out, strchr(names[i], '.') + 1, values[i]);
    }
    out->in_use = values[0];
    out->free = values[2] + values[4] + values[5];
    out->mapped = values[1] - values[3];
    return 0;
}

/* ---- the calling thread's share -------------------------------------------------------------- */

static bool is_main_thread(void)
{
    return (pid_t)syscall(SYS_gettid) == getpid();
}

int mr_thread_collect(bool abandon, const char **method)
{
    const mr_backend *backend = mr_backend_detect();
    *method = "none";
    switch (backend->kind) {
    case MR_ALLOC_MIMALLOC: {
        int v = mr_sym.mi_version != NULL ? mr_sym.mi_version() : 0;
        mimalloc_collect_now();
        *method = "mi_collect(true)";
        /* mimalloc 2.x keeps a live thread's freed spans queued for a decommit that only that
         * thread's later page allocations or frees carry out, and mi_collect does not: handing
         * the heap over as an exiting thread does (mi_thread_done: its segments are abandoned,
         * the blocks in them stay valid and any thread may free them) lets the next trim
         * decommit them. The thread's next malloc makes it a new heap (2.x allocates fresh
         * thread data for it; 3.x keeps a pointer to the freed data, so never there). The main
         * thread's heap is never abandoned by mimalloc. */
        if (abandon && v >= 200 && v < 300 && mr_sym.mi_thread_done != NULL && !is_main_thread()) {
            if (mimalloc_has_purge_delay()) {
                /* With abandoned_page_decommit (2.1+: abandoned_page_purge, option 12) on,
                 * abandoning decommits the queued spans here and now: a thread that takes the
                 * segments over first (any malloc needing a page may) would queue them again. */
                mi_option_lock_take();
                long saved = mr_sym.mi_option_get(MR_MI_OPTION_PURGE_DELAY);
                long saved_abandoned = mr_sym.mi_option_get(MR_MI_OPTION_ABANDONED_PURGE);
                mr_sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, 0);
                mr_sym.mi_option_set(MR_MI_OPTION_ABANDONED_PURGE, 1);
                mr_sym.mi_thread_done();
                mr_sym.mi_option_set(MR_MI_OPTION_ABANDONED_PURGE, saved_abandoned);
                mr_sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, saved);
                mi_option_lock_give();
            } else {
                mr_sym.mi_thread_done();
            }
            *method = "mi_collect(true); mi_thread_done()";
        }
        return 0;
    }
    case MR_ALLOC_JEMALLOC:
        /* thread.idle (5.2+): flush this thread's cache and purge its arena if it is the
         * thread's own; else the cache flush alone (fails when caching is off: nothing held). */
        if (mr_sym.mallctl("thread.idle", NULL, NULL, NULL, 0) == 0) {
            *method = "mallctl(\"thread.idle\")";
        } else if (mr_sym.mallctl("thread.tcache.flush", NULL, NULL, NULL, 0) == 0) {
            *method = "mallctl(\"thread.tcache.flush\")";
        }
        return 0;
    case MR_ALLOC_TCMALLOC:
        if (mr_sym.tc_mark_thread_idle != NULL) {
            mr_sym.tc_mark_thread_idle(); /* this thread's cache back to the central lists */
            *method = "MallocExtension_MarkThreadIdle()";
        }
        return 0;
    case MR_ALLOC_GLIBC:
    case MR_ALLOC_UNKNOWN:
        break;
    }
    return 0;
}

/* ---- none ------------------------------------------------------------------------------------ */

static int no_trim(void)
{
    return 0;
}

static int no_heap_stats(mr_heap_stats *out)
{
    (void)out;
    return ENOTSUP;
}

static void no_detected(char *version, size_t size)
{
    (void)version;
    (void)size;
}

const mr_backend mr_backends[] = {
    {MR_ALLOC_UNKNOWN, "unknown", "none", no_trim, no_heap_stats, no_detected},
    {MR_ALLOC_GLIBC, "glibc", "malloc_trim(0)", glibc_trim, glibc_heap_stats, glibc_detected},
    {MR_ALLOC_JEMALLOC, "jemalloc", "mallctl(\"" MR_JEMALLOC_PURGE_ALL "\")", jemalloc_trim,
     jemalloc_heap_stats, jemalloc_detected},
    {MR_ALLOC_MIMALLOC, "mimalloc", "mi_collect(true)", mimalloc_trim, mimalloc_heap_stats,
     mimalloc_detected},
    {MR_ALLOC_TCMALLOC, "tcmalloc", "MallocExtension_ReleaseFreeMemory()", tcmalloc_trim,
     tcmalloc_heap_stats, tcmalloc_detected},
};

int mr_glibc_mallopt(int param, int value)
{
    if (mr_sym.mallopt == NULL) {
        return ENOTSUP;
    }
    return mr_sym.mallopt(param, value) == 1 ? 0 : EINVAL;
}

int mr_glibc_malloc_info(char **text, size_t *size)
{
    FILE *stream;
    int err = 0;

    *text = NULL;
    *size = 0;
    if (mr_sym.malloc_info == NULL) {
        return ENOTSUP;
    }
    stream = open_memstream(text, size);
    if (stream == NULL) {
        return errno;
    }
    if (mr_sym.malloc_info(0, stream) != 0) {
        err = errno ? errno : EIO;
    }
    if (fclose(stream) != 0 && err == 0) {
        err = errno;
    }
    if (err != 0) {
        free(*text);
        *text = NULL;
        *size = 0;
    }
    return err;
}

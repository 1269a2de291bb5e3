/* Release of empty pools and of the free pages of other pools, one arena at a time, in time
 * slices with the GIL released between.
 *
 * An empty pool (ref.count == 0) sits on its arena's free-pool list and its body is dead memory.
 * Under the GIL, its szidx is set to DUMMY_SIZE_IDX (so pymalloc re-initialises it on reuse
 * instead of trusting a free list that lived in the dropped pages) and the pages after its first
 * are dropped with madvise(MADV_DONTNEED); the first page holds the header and the free-pool link
 * and stays. A pool that holds live blocks gives back the pages that hold none of them, after
 * the free blocks on them were taken off its free list (trim_used_pool). One arena is validated and
 * released within one GIL hold; between slices the heap may change, so a pass resumes from an
 * address (the next recorded arena above the last one done), never from a table index.
 */
#include "_pools.h"

#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* Sleep with the GIL released between slices, so a thread woken by the release gets the GIL
 * before this one takes it back. */
#define MRP_YIELD_NS 50000L

long long mrp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

long long mrp_thread_cpu_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* The pages of a pool holding live blocks that hold none of them (pages 1 to 3; the first one
 * holds the header). Validates the pool's free list first: every link a block boundary of the
 * carved part, on a resident page, no block twice, no more free blocks than carved minus
 * allocated; anything else leaves the pool untouched. Then takes the free blocks that start on
 * those pages off the free list (the list keeps at least one block, so the pool stays where
 * pymalloc keeps pools with free blocks) and drops the pages. The blocks taken off are not used
 * again until the pool empties (a pass then re-initialises it): capacity, not correctness.
 * pymalloc extends a pool into never-carved space by writing each block's link first, so those
 * pages may be dropped as they are. Returns the bytes dropped (or, with dry_run, droppable). */
static long long trim_used_pool(uintptr_t pool, const unsigned char *resident, int dry_run)
{
    mrp_pool_header *header = (mrp_pool_header *)pool;
    if (header->freeblock == NULL || header->szidx >= MRP_NB_SIZE_CLASSES) {
        return 0; /* full: nothing free to give back */
    }
    uintptr_t size = mrp_class_size(header->szidx);
    uintptr_t nextoffset = header->nextoffset;
    size_t carved = (size_t)((nextoffset - MRP_POOL_OVERHEAD) / size);
    unsigned char is_free[MRP_POOL_BODY / MRP_ALIGNMENT];
    memset(is_free, 0, carved);
    size_t nfree = 0;
    for (uintptr_t p = (uintptr_t)header->freeblock; p != 0; p = *(const uintptr_t *)p) {
        if (p < pool + MRP_POOL_OVERHEAD || p >= pool + nextoffset ||
            (p - pool - MRP_POOL_OVERHEAD) % size != 0 ||
            !(resident[(p - pool) / MRP_PAGE_SIZE] & 1)) {
            return 0;
        }
        size_t index = (size_t)((p - pool - MRP_POOL_OVERHEAD) / size);
        if (is_free[index] || ++nfree + header->ref.count > carved) {
            return 0; /* a cycle, or more free blocks than there can be */
        }
        is_free[index] = 1;
    }
    /* busy[page]: an allocated block overlaps it (or it is the header page). */
    int busy[MRP_POOL_PAGES] = {1, 0, 0, 0};
    for (size_t j = 0; j < carved; j++) {
        if (!is_free[j]) {
            uintptr_t start = MRP_POOL_OVERHEAD + j * size;
            for (uintptr_t page = start / MRP_PAGE_SIZE; page <= (start + size - 1) / MRP_PAGE_SIZE;
                 page++) {
                busy[page] = 1;
            }
        }
    }
    /* The free list must keep a block: keep the page of one that starts on a busy page, or else
     * the page of the list head. */
    int kept_block = 0;
    for (uintptr_t p = (uintptr_t)header->freeblock; p != 0 && !kept_block;
         p = *(const uintptr_t *)p) {
        kept_block = busy[(p - pool) / MRP_PAGE_SIZE];
    }
    if (!kept_block) {
        busy[((uintptr_t)header->freeblock - pool) / MRP_PAGE_SIZE] = 1;
    }
    long long dropped = 0;
    for (size_t page = 1; page < MRP_POOL_PAGES; page++) {
        dropped += !busy[page] && (resident[page] & 1);
    }
    if (dropped == 0 || dry_run) {
        return dropped * (long long)MRP_PAGE_SIZE;
    }
    /* Unlink the free blocks that start on a page about to be dropped (writes only to kept
     * pages: the header and the links of kept blocks). */
    unsigned char **link = &header->freeblock;
    for (uintptr_t p = (uintptr_t)header->freeblock; p != 0;) {
        uintptr_t next = *(const uintptr_t *)p;
        if (busy[(p - pool) / MRP_PAGE_SIZE]) {
            *link = (unsigned char *)p;
            link = (unsigned char **)p;
        }
        p = next;
    }
    *link = NULL;
    dropped = 0;
    for (size_t page = 1; page < MRP_POOL_PAGES; page++) {
        if (!busy[page] && (resident[page] & 1) &&
            madvise((void *)(pool + page * MRP_PAGE_SIZE), MRP_PAGE_SIZE, MADV_DONTNEED) == 0) {
            dropped++;
        }
    }
    return dropped * (long long)MRP_PAGE_SIZE;
}

/* Release (or, with dry_run, count) the resident body pages of the arena's empty pools
 * and the pages of its other pools that hold no live block, until the clock passes deadline (< 0:
 * none). Returns 0 when done, 1 when stopped at the deadline (the next slice validates the arena
 * again and goes on: released pools are no longer resident), or -1 when the arena was left
 * untouched. Called with the GIL held. */
static int reclaim_arena(uintptr_t base, int dry_run, long long deadline, mrp_pass *pass)
{
    unsigned char resident[MRP_ARENA_PAGES];
    if ((base & (MRP_PAGE_SIZE - 1)) != 0 || mincore((void *)base, MRP_ARENA_SIZE, resident) != 0) {
        return -1;
    }
    long ncarved = mrp_validate_arena(base, resident);
    if (ncarved < 0) {
        return -1;
    }
    uintptr_t first = mrp_first_pool(base);
    long done = 0;
    for (long i = 0; i < ncarved; i++) {
        uintptr_t pool = first + (uintptr_t)i * MRP_POOL_SIZE;
        mrp_pool_header *header = (mrp_pool_header *)pool;
        size_t page = (pool - base) / MRP_PAGE_SIZE;
        long long body = 0;
        for (size_t p = 1; p < MRP_POOL_PAGES; p++) {
            body += resident[page + p] & 1;
        }
        if (body == 0) {
            continue;
        }
        if (done > 0 && deadline >= 0 && mrp_now_ns() >= deadline) {
            return 1; /* at least one pool per call: every slice makes progress */
        }
        if (header->ref.count != 0) {
            long long bytes = trim_used_pool(pool, &resident[page], dry_run);
            if (bytes > 0) {
                done++;
                pass->used_pools_trimmed++;
                pass->used_bytes_released += bytes;
                pass->bytes_released += bytes;
            }
            continue;
        }
        if (!dry_run) {
            /* Essential: an empty pool that still names its size class is reused through its
             * old free list, which lives in the pages about to be dropped. */
            header->szidx = MRP_DUMMY_SIZE_IDX;
            if (madvise((void *)(pool + MRP_PAGE_SIZE), MRP_POOL_SIZE - MRP_PAGE_SIZE,
                        MADV_DONTNEED) != 0) {
                continue;
            }
        }
        done++;
        pass->pools_released++;
        pass->bytes_released += body * (long long)MRP_PAGE_SIZE;
    }
    return 0;
}

static void yield_gil(void)
{
    PyThreadState *tstate = PyEval_SaveThread();
    struct timespec pause = {0, MRP_YIELD_NS};
    nanosleep(&pause, NULL);
    PyEval_RestoreThread(tstate);
}

int mrp_run_pass(int dry_run, long long slice_ns, mrp_gate_fn gate, mrp_pass *pass)
{
    memset(pass, 0, sizeof(*pass));
    long long start = mrp_now_ns();
    uintptr_t from = 0;
    int more = 1;
    while (more) {
        if (pass->slices > 0) {
            yield_gil();
        }
        if (gate != NULL && gate() < 0) {
            pass->elapsed_ns = mrp_now_ns() - start;
            return -1;
        }
        long long slice_start = mrp_now_ns(), now = slice_start;
        long long cpu_start = mrp_thread_cpu_ns();
        pass->slices++;
        do {
            uintptr_t base = mrp_table_next(from);
            if (base == 0) {
                more = 0;
                break;
            }
            /* A dry run writes nothing, so it cannot resume inside an arena without counting
             * twice: it finishes each one (no madvise, a few µs). */
            long long deadline = slice_ns < 0 || dry_run ? -1 : slice_start + slice_ns;
            int rc = reclaim_arena(base, dry_run, deadline, pass);
            now = mrp_now_ns();
            if (rc == 1) {
                break; /* this arena again, in the next slice */
            }
            from = base + 1;
            pass->arenas_skipped += rc < 0;
            pass->arenas_scanned++;
        } while (slice_ns < 0 || now - slice_start < slice_ns);
        if (now - slice_start > pass->max_hold_ns) {
            pass->max_hold_ns = now - slice_start;
        }
        long long cpu = mrp_thread_cpu_ns() - cpu_start;
        if (cpu > pass->max_hold_cpu_ns) {
            pass->max_hold_cpu_ns = cpu;
        }
    }
    pass->elapsed_ns = mrp_now_ns() - start;
    return 0;
}

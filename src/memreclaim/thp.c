/* Transparent huge pages: after a trim under THP "always", mark the allocators' heap mappings
 * MADV_NOHUGEPAGE, so khugepaged does not collapse the ranges the trim gave back into whole huge
 * pages again (with max_ptes_none at its default, 511, one resident 4 KiB page is enough for
 * khugepaged to make a 2 MiB page of its range).
 *
 * Which mappings: the anonymous private read-write ones (no file, no name, or [heap], or glibc's
 * own "[anon: glibc: malloc...]" names): glibc's brk heap and thread-arena heaps, the mmapped
 * chunks of every allocator, jemalloc's extents, mimalloc's segments, tcmalloc's spans and
 * pymalloc's arenas all live there. Left out: stacks (the [stack] mapping, a mapping right above a
 * small PROT_NONE guard, as pthread lays out thread stacks, and the caller's own stack), shared
 * mappings (shmem has its own THP setting), executable ones (JIT code) and mappings that cannot
 * hold one aligned huge page (khugepaged never collapses those).
 *
 * MADV_NOHUGEPAGE does not split the huge pages a mapping already has: a live array keeps its
 * huge pages; only new faults and khugepaged's collapses in that mapping stop making them.
 *
 * Pure C, no Python objects, no allocation: called with the GIL released.
 */
#define _GNU_SOURCE
#include "memreclaim.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#ifndef MADV_NOHUGEPAGE
#define MADV_NOHUGEPAGE 15
#endif

/* pthread puts a guard of guardsize bytes (one page unless the program asks) right below each
 * thread stack; a PROT_NONE mapping up to this size right below a read-write one is taken for a
 * guard. */
#define MR_GUARD_MAX ((uint64_t)1 << 20)
/* glibc's thread-arena heaps start on multiples of HEAP_MAX_SIZE (2 * the largest mmap threshold,
 * 64 MiB on 64-bit), and the PROT_NONE tail of the heap below may be small: a mapping starting on
 * such a boundary is a heap, not a stack. */
#define MR_HEAP_ALIGN ((uint64_t)(2 * MR_MMAP_THRESHOLD_MAX))

typedef struct {
    uint64_t start, end;
    int valid;
    int guard; /* anonymous, unnamed, ---p */
} prev_mapping;

/* Whether a mapping's name (what follows the inode; may be empty) is an allocator's heap. */
static int heap_name(const char *name, size_t len)
{
    static const char brk_heap[] = "[heap]";
    static const char glibc_malloc[] = "[anon: glibc: malloc";
    if (len == 0) {
        return 1;
    }
    if (len == sizeof(brk_heap) - 1 && memcmp(name, brk_heap, len) == 0) {
        return 1;
    }
    return len >= sizeof(glibc_malloc) - 1 &&
           memcmp(name, glibc_malloc, sizeof(glibc_malloc) - 1) == 0;
}

typedef struct {
    uint64_t pmd_size;
    uint64_t own_stack; /* an address on the caller's stack */
    mr_range_fn fn;
    void *ctx;
    prev_mapping prev;
} walk_state;

/* mr_lines_read's line: call fn if it is a heap range. 0, EIO or fn's errno. A dropped line (too
 * long to be an allocator's) is no guard. */
static int maps_line(void *ctx, const char *line, size_t len)
{
    walk_state *walk = ctx;
    mr_maps_entry entry;
    prev_mapping prev = walk->prev;

    walk->prev.valid = 0;
    if (line == NULL) {
        return 0;
    }
    if (mr_maps_parse(line, len, &entry) != 0) {
        return EIO;
    }
    walk->prev.start = entry.start;
    walk->prev.end = entry.end;
    walk->prev.valid = 1;
    walk->prev.guard =
        entry.anonymous && entry.name_len == 0 && memcmp(entry.perms, "---p", 4) == 0;
    if (entry.anonymous && memcmp(entry.perms, "rw-p", 4) == 0 &&
        heap_name(entry.name, entry.name_len)) {
        uint64_t first = (entry.start + walk->pmd_size - 1) & ~(walk->pmd_size - 1);
        int below_guard = prev.valid && prev.guard && prev.end == entry.start &&
                          prev.end - prev.start <= MR_GUARD_MAX && entry.start % MR_HEAP_ALIGN != 0;
        int own_stack = walk->own_stack >= entry.start && walk->own_stack < entry.end;
        if (first >= entry.start && first + walk->pmd_size <= entry.end && !below_guard &&
            !own_stack) {
            return walk->fn(walk->ctx, entry.start, entry.end);
        }
    }
    return 0;
}

int mr_thp_heap_ranges(const char *maps_path, uint64_t pmd_size, mr_range_fn fn, void *ctx)
{
    char buf[4096];
    walk_state walk;

    if (pmd_size == 0 || (pmd_size & (pmd_size - 1)) != 0) {
        return EINVAL;
    }
    walk.pmd_size = pmd_size;
    walk.own_stack = (uint64_t)(uintptr_t)&walk;
    walk.fn = fn;
    walk.ctx = ctx;
    walk.prev.valid = 0;
    return mr_self_lines("maps", maps_path, buf, sizeof(buf), maps_line, &walk);
}

typedef struct {
    mr_thp_marked *out;
    uint64_t marked_end; /* a mapping merged with one marked before shows again: count it once */
} mark_state;

static int mark_range(void *ctx, uint64_t start, uint64_t end)
{
    mark_state *mark = ctx;
    if (madvise((void *)(uintptr_t)start, (size_t)(end - start), MADV_NOHUGEPAGE) != 0) {
        if (errno == ENOMEM) { /* unmapped (part of it) since maps was read: the rest is marked */
            mark->out->skipped++;
            return 0;
        }
        return errno;
    }
    if (start < mark->marked_end) {
        start = mark->marked_end < end ? mark->marked_end : end;
    }
    if (end > start) {
        mark->out->ranges++;
        mark->out->bytes += (int64_t)(end - start);
    }
    if (end > mark->marked_end) {
        mark->marked_end = end;
    }
    return 0;
}

int mr_thp_mark_heap(mr_thp_marked *out)
{
    mark_state mark = {out, 0};
    int64_t pmd_size = mr_thp_pmd_size();

    out->ranges = out->bytes = out->skipped = 0;
    if (pmd_size <= 0 || (pmd_size & (pmd_size - 1)) != 0) {
        pmd_size = 2 << 20; /* x86-64's; the kernel did not say (no THP: nothing is collapsed) */
    }
    return mr_thp_heap_ranges(NULL, (uint64_t)pmd_size, mark_range, &mark);
}

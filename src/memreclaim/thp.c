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

static int hex_u64(const char **p, const char *end, char stop, uint64_t *out)
{
    uint64_t value = 0;
    const char *q = *p;
    if (q >= end || *q == stop) {
        return -1;
    }
    for (; q < end && *q != stop; q++) {
        int digit;
        if (*q >= '0' && *q <= '9') {
            digit = *q - '0';
        } else if (*q >= 'a' && *q <= 'f') {
            digit = *q - 'a' + 10;
        } else {
            return -1;
        }
        value = value * 16 + (uint64_t)digit;
    }
    if (q >= end) {
        return -1;
    }
    *p = q + 1;
    *out = value;
    return 0;
}

/* Skip one blank-separated field and the blanks after it. */
static int skip_field(const char **p, const char *end)
{
    const char *q = *p;
    if (q >= end || *q == ' ') {
        return -1;
    }
    while (q < end && *q != ' ') {
        q++;
    }
    while (q < end && *q == ' ') {
        q++;
    }
    *p = q;
    return 0;
}

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

/* "start-end perms offset dev inode [name]": call fn if it is a heap range. 0, EIO or fn's errno.
 */
static int maps_line(walk_state *walk, const char *line, size_t len)
{
    const char *p = line, *end = line + len, *perms;
    uint64_t start, end_address, inode = 0;
    int anonymous, heap, err = 0;
    prev_mapping prev = walk->prev;

    walk->prev.valid = 0;
    if (hex_u64(&p, end, '-', &start) != 0 || hex_u64(&p, end, ' ', &end_address) != 0 ||
        end - p < 5 || end_address <= start) {
        return EIO;
    }
    perms = p;
    p += 4;
    if (*p != ' ' || (p++, skip_field(&p, end)) != 0) {
        return EIO; /* perms, offset */
    }
    anonymous = end - p >= 6 && memcmp(p, "00:00 ", 6) == 0;
    if (skip_field(&p, end) != 0) { /* dev */
        return EIO;
    }
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        inode = inode * 10 + (uint64_t)(*p - '0');
    }
    while (p < end && *p == ' ') {
        p++;
    }
    anonymous = anonymous && inode == 0;
    walk->prev.start = start;
    walk->prev.end = end_address;
    walk->prev.valid = 1;
    walk->prev.guard = anonymous && p == end && memcmp(perms, "---p", 4) == 0;
    heap = anonymous && memcmp(perms, "rw-p", 4) == 0 && heap_name(p, (size_t)(end - p));
    if (heap) {
        uint64_t first = (start + walk->pmd_size - 1) & ~(walk->pmd_size - 1);
        int below_guard = prev.valid && prev.guard && prev.end == start &&
                          prev.end - prev.start <= MR_GUARD_MAX && start % MR_HEAP_ALIGN != 0;
        int own_stack = walk->own_stack >= start && walk->own_stack < end_address;
        if (first >= start && first + walk->pmd_size <= end_address && !below_guard && !own_stack) {
            err = walk->fn(walk->ctx, start, end_address);
        }
    }
    return err;
}

int mr_thp_heap_ranges(const char *maps_path, uint64_t pmd_size, mr_range_fn fn, void *ctx)
{
    char buf[4096];
    size_t used = 0;
    int skipping = 0; /* inside a line longer than buf (a long path): not a heap, drop it */
    int fd, err = 0;
    walk_state walk;

    if (pmd_size == 0 || (pmd_size & (pmd_size - 1)) != 0) {
        return EINVAL;
    }
    walk.pmd_size = pmd_size;
    walk.own_stack = (uint64_t)(uintptr_t)&walk;
    walk.fn = fn;
    walk.ctx = ctx;
    walk.prev.valid = 0;
    fd = open(maps_path == NULL ? "/proc/self/maps" : maps_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    for (;;) {
        ssize_t n = read(fd, buf + used, sizeof(buf) - used);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            err = errno;
            break;
        }
        if (n == 0) {
            if (used > 0 && !skipping) {
                err = maps_line(&walk, buf, used);
            }
            break;
        }
        used += (size_t)n;
        const char *line = buf;
        const char *end = buf + used;
        const char *eol;
        while (err == 0 && (eol = memchr(line, '\n', (size_t)(end - line))) != NULL) {
            if (!skipping) {
                err = maps_line(&walk, line, (size_t)(eol - line));
            } else {
                walk.prev.valid = 0;
            }
            skipping = 0;
            line = eol + 1;
        }
        if (err != 0) {
            break;
        }
        used = (size_t)(end - line);
        if (used == sizeof(buf)) { /* no newline in a whole buffer */
            skipping = 1;
            used = 0;
        } else {
            memmove(buf, line, used);
        }
    }
    (void)close(fd);
    return err;
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

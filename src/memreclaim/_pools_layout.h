/* pymalloc's layout, per CPython minor version (private to memreclaim._pools).
 *
 * Read from each version's Objects/obmalloc.c (3.11) and Include/internal/pycore_obmalloc.h
 * (3.12 to 3.15): on 64-bit builds with the radix tree (the default), every one of them uses
 * 16-byte alignment, a 512-byte small-request threshold (32 size classes), 16 KiB pools,
 * 1 MiB arenas and the same 48-byte struct pool_header. What differs:
 *   - 3.12+: obmalloc state is per interpreter (an interpreter may have its own, with its own
 *     GIL), while the arena allocator stays process-wide;
 *   - 3.15: PYMALLOC_USE_HUGEPAGES (a configure option, in pyconfig.h) makes arenas 2 MiB huge
 *     pages, where no 4 KiB page can be given back: refused.
 * The self-test at enable() proves these figures on the running interpreter before anything is
 * written to a live arena.
 */
#ifndef MEMRECLAIM_POOLS_LAYOUT_H
#define MEMRECLAIM_POOLS_LAYOUT_H

#include <stdint.h>

#define MRP_MIN_VERSION 0x030B0000 /* 3.11 */
#define MRP_END_VERSION 0x03100000 /* first minor version whose layout was not read: 3.16 */

#if PY_VERSION_HEX >= 0x030C0000
#define MRP_OBMALLOC_PER_INTERPRETER 1
#else
#define MRP_OBMALLOC_PER_INTERPRETER 0
#endif

#define MRP_PAGE_SIZE ((uintptr_t)4096)
#define MRP_ARENA_SIZE ((uintptr_t)1 << 20) /* ARENA_BITS 20 */
#define MRP_POOL_SIZE ((uintptr_t)1 << 14)  /* POOL_BITS 14 */
#define MRP_POOL_MASK (MRP_POOL_SIZE - 1)
#define MRP_POOL_OVERHEAD 48u /* POOL_OVERHEAD: sizeof(struct pool_header) rounded to 16 */
#define MRP_POOL_BODY (MRP_POOL_SIZE - MRP_POOL_OVERHEAD) /* bytes for blocks in one pool */
#define MRP_ALIGNMENT 16u                                 /* ALIGNMENT: size class granularity */
#define MRP_NB_SIZE_CLASSES 32u                           /* SMALL_REQUEST_THRESHOLD / ALIGNMENT */
#define MRP_DUMMY_SIZE_IDX 0xffffu /* "pool never used": pymalloc re-initialises it on reuse */
#define MRP_ARENA_PAGES (MRP_ARENA_SIZE / MRP_PAGE_SIZE)
#define MRP_POOL_PAGES (MRP_POOL_SIZE / MRP_PAGE_SIZE)
#define MRP_MAX_ARENA_INDEX (1u << 26) /* far above any real arenas[] size */

/* struct pool_header, identical in 3.11 to 3.15 */
typedef struct mrp_pool_header {
    union {
        // cppcheck-suppress unusedStructMember ; it sizes the union as pymalloc's does
        unsigned char *padding;
        unsigned int count; /* allocated blocks */
    } ref;
    unsigned char *freeblock;         /* head of the pool's free list */
    struct mrp_pool_header *nextpool; /* next pool of the size class, or of the free-pool list */
    struct mrp_pool_header *prevpool;
    unsigned int arenaindex;    /* index into arenas[] */
    unsigned int szidx;         /* size class index */
    unsigned int nextoffset;    /* bytes to the first never-used block */
    unsigned int maxnextoffset; /* largest valid nextoffset */
} mrp_pool_header;

_Static_assert(sizeof(mrp_pool_header) == MRP_POOL_OVERHEAD, "pool_header is 48 bytes on 64-bit");
_Static_assert(sizeof(void *) == 8, "64-bit only");

static inline unsigned int mrp_class_size(unsigned int szidx)
{
    return (szidx + 1u) * MRP_ALIGNMENT; /* INDEX2SIZE */
}

#endif /* MEMRECLAIM_POOLS_LAYOUT_H */

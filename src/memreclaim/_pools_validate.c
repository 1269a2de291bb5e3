/* Validation of one recorded arena, header by header, before anything is written to it.
 *
 * Carved pools form a prefix of the arena (pymalloc carves at pool_address, upwards). Only
 * resident header pages are read (the caller passes mincore's answer), and every field of every
 * carved header must be one pymalloc can produce; any inconsistency leaves the arena untouched.
 */
#include "_pools.h"

static int header_is_blank(const mrp_pool_header *header)
{
    const unsigned char *bytes = (const unsigned char *)header;
    for (size_t i = 0; i < sizeof(*header); i++) {
        if (bytes[i] != 0) {
            return 0;
        }
    }
    return 1;
}

/* An empty pool's nextpool links the arena's free-pool list: NULL or a pool of this arena. */
static int free_link_valid(const mrp_pool_header *header, uintptr_t first, uintptr_t end)
{
    uintptr_t next = (uintptr_t)header->nextpool;
    return next == 0 || ((next & MRP_POOL_MASK) == 0 && next >= first && next < end);
}

/* An empty pool whose szidx we (or pymalloc, inside the carving call) set to DUMMY. */
static int released_header_valid(const mrp_pool_header *header, uintptr_t first, uintptr_t end)
{
    return header->ref.count == 0 && header->nextoffset <= MRP_POOL_SIZE &&
           free_link_valid(header, first, end);
}

/* Every field of one carved pool's header must be one pymalloc can produce. */
static int header_valid(const mrp_pool_header *header, uintptr_t pool, uintptr_t first,
                        uintptr_t end)
{
    if (header->arenaindex >= MRP_MAX_ARENA_INDEX) {
        return 0;
    }
    if (header->szidx == MRP_DUMMY_SIZE_IDX) {
        return released_header_valid(header, first, end);
    }
    if (header->szidx >= MRP_NB_SIZE_CLASSES) {
        return 0;
    }
    unsigned int size = mrp_class_size(header->szidx);
    unsigned int nblocks = (unsigned int)(MRP_POOL_BODY / size);
    unsigned int count = header->ref.count;
    unsigned int nextoffset = header->nextoffset;
    if (header->maxnextoffset != MRP_POOL_SIZE - size) {
        return 0;
    }
    if (nextoffset < MRP_POOL_OVERHEAD + 2 * size || nextoffset > MRP_POOL_SIZE ||
        (nextoffset - MRP_POOL_OVERHEAD) % size != 0) {
        return 0;
    }
    unsigned int carved = (nextoffset - MRP_POOL_OVERHEAD) / size;
    if (count > carved || count > nblocks) {
        return 0;
    }
    uintptr_t freeblock = (uintptr_t)header->freeblock;
    if (freeblock == 0) {
        /* The free list is empty only in a fully carved pool: full, or holding free blocks that
         * a pass took off the list with the pages they were on (_pools_reclaim.c). */
        if (nextoffset <= header->maxnextoffset) {
            return 0;
        }
    } else if (freeblock < pool + MRP_POOL_OVERHEAD || freeblock >= pool + nextoffset ||
               (freeblock - pool - MRP_POOL_OVERHEAD) % size != 0) {
        return 0;
    }
    return count != 0 || free_link_valid(header, first, end);
}

uintptr_t mrp_first_pool(uintptr_t base)
{
    return (base + MRP_POOL_MASK) & ~MRP_POOL_MASK;
}

long mrp_validate_arena(uintptr_t base, const unsigned char *resident)
{
    uintptr_t first = mrp_first_pool(base);
    uintptr_t end = first + ((base + MRP_ARENA_SIZE - first) / MRP_POOL_SIZE) * MRP_POOL_SIZE;
    size_t npools = (end - first) / MRP_POOL_SIZE;
    long ncarved = 0;
    unsigned int arenaindex = 0;
    for (size_t i = 0; i < npools; i++) {
        uintptr_t pool = first + i * MRP_POOL_SIZE;
        if (!(resident[(pool - base) / MRP_PAGE_SIZE] & 1)) {
            break; /* never read a page that is not resident */
        }
        const mrp_pool_header *header = (const mrp_pool_header *)pool;
        if (header_is_blank(header)) {
            break; /* never carved (resident only through a huge page) */
        }
        if (!header_valid(header, pool, first, end)) {
            return -1;
        }
        if (i == 0) {
            arenaindex = header->arenaindex;
        } else if (header->arenaindex != arenaindex) {
            return -1;
        }
        ncarved++;
    }
    return ncarved;
}

/* memreclaim._pools: give back the pages of empty pymalloc pools inside live arenas.
 *
 * pymalloc (CPython's small-object allocator) returns a 1 MiB arena to the OS only when every one
 * of its 16 KiB pools is empty, so a few survivors pin whole arenas. An empty pool sits on its
 * arena's free-pool list and its body is dead memory. Under the GIL this module marks such a pool
 * as "never used" (szidx = DUMMY_SIZE_IDX, so pymalloc re-initialises it on reuse instead of
 * trusting its old free list) and madvise(MADV_DONTNEED)s its pages after the first 4 KiB (the
 * first page holds the pool header and the free-pool link and stays).
 *
 * That relies on a private layout, so everything is gated (see docs/pool-reclaim.md):
 *   - CPython 3.11, exact micro versions on an allow-list; not free-threaded, not a debug build;
 *   - 64-bit Linux, 4 KiB pages; 1 MiB arenas and 16 KiB pools (proven by the self-test);
 *   - pymalloc serving PyObject_Malloc (PYTHONMALLOC=malloc is refused; pymalloc_debug is fine);
 *   - the main interpreter only;
 *   - our arena-allocator wrapper is the live arena allocator on every call;
 *   - a self-test in a forked child proves the layout and the release/reuse path first.
 *
 * Arenas are learnt through the public arena-allocator hook: a wrapper records exact 1 MiB
 * requests. The self-test learns the one call site in CPython that allocates pymalloc arenas
 * (new_arena); afterwards only requests from that call site are recorded, so other users of the
 * arena allocator (3.11's frame-stack chunks, third-party code) are ignored. Every arena is
 * validated header by header before anything is written; any inconsistency leaves it untouched.
 *
 * Not limited API (PyObject_{Get,Set}ArenaAllocator, PyStructSequence): a module of its own.
 */
#include "memreclaim.h"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* ---- pymalloc layout of CPython 3.11 on 64-bit (Objects/obmalloc.c) ------------------------- */

#define MRP_PAGE_SIZE ((uintptr_t)4096)
#define MRP_ARENA_SIZE ((size_t)1 << 20)   /* ARENA_BITS 20 (radix tree on) */
#define MRP_POOL_SIZE ((uintptr_t)1 << 14) /* POOL_BITS 14 */
#define MRP_POOL_MASK (MRP_POOL_SIZE - 1)
#define MRP_POOL_OVERHEAD 48u      /* sizeof(struct pool_header) rounded to 16 */
#define MRP_ALIGNMENT 16u          /* ALIGNMENT: size class granularity */
#define MRP_NB_SIZE_CLASSES 32u    /* SMALL_REQUEST_THRESHOLD / ALIGNMENT */
#define MRP_DUMMY_SIZE_IDX 0xffffu /* "pool never used" */
#define MRP_ARENA_PAGES (MRP_ARENA_SIZE / MRP_PAGE_SIZE)
#define MRP_POOL_PAGES (MRP_POOL_SIZE / MRP_PAGE_SIZE)
#define MRP_MAX_POOLS (MRP_ARENA_SIZE / MRP_POOL_SIZE)
#define MRP_MAX_ARENA_INDEX (1u << 26) /* far above any real arenas[] size */

/* struct pool_header */
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

/* CPython 3.11 micro versions (PY_VERSION_HEX of final releases) this module was tested on. */
static const unsigned long mrp_tested_versions[] = {
    0x030B07F0UL, /* 3.11.7 */
};

#define MRP_SELFTEST_TIMEOUT_MS 30000
#define MRP_LEARN_LIMIT ((size_t)64 << 20) /* bytes the self-test may allocate to see an arena */

/* ---- process-wide state ---------------------------------------------------------------------- */

/* The arena allocator is process-wide, so this state is too. Every access happens with the GIL
 * held (pymalloc and the frame stack call the arena allocator with the GIL held). */

typedef struct {
    uintptr_t base;   /* address returned by the arena allocator */
    uintptr_t caller; /* return address of the request */
} mrp_arena;

typedef struct {
    long long pools_released;
    long long bytes_released;
    long long arenas_scanned;
    long long arenas_skipped;
    int complete;
    long long elapsed_ns;
} mrp_pass;

static struct {
    int installed; /* our wrapper was put in place by enable() */
    int enabled;   /* every gate passed; reclaim may run */
    int failed;    /* a gate failed for good: reason says why */
    int busy;      /* enable() in progress (it releases the GIL while the self-test runs) */
    char reason[400];
    PyObjectArenaAllocator prev; /* the allocator we wrap */
    uintptr_t cpython_base;      /* dli_fbase of libpython (or the executable) */
    uintptr_t arena_caller;      /* pymalloc's arena call site, learnt by the self-test */
    uintptr_t last_caller;       /* call site of the latest recorded arena */
    /* arenas, sorted by base */
    mrp_arena *arenas;
    size_t narenas;
    size_t capacity;
    uintptr_t cursor; /* base of the last arena scanned by a budgeted call; 0 = start */
    /* counters */
    unsigned long long arenas_recorded;
    unsigned long long arenas_forgotten;
    unsigned long long foreign_blocks;
    unsigned long long table_errors;
    long long reclaim_calls;
    long long pools_released;
    long long bytes_released;
    long long arenas_skipped;
    long long last_ns;
    long long max_ns;
    long long total_ns;
    long long selftest_pools_released;
    PyObject *error_type; /* PoolReclaimUnavailable of the first module instance (strong) */
} g;

static void mrp_set_reason(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void mrp_set_reason(const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(g.reason, sizeof(g.reason), fmt, args);
    va_end(args);
}

static long long mrp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---- the arena table ------------------------------------------------------------------------- */

/* First index whose base is >= base. */
static size_t mrp_table_lower_bound(uintptr_t base)
{
    size_t lo = 0, hi = g.narenas;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (g.arenas[mid].base < base) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* Forget every recorded arena that overlaps [lo, hi). */
static void mrp_table_forget_range(uintptr_t lo, uintptr_t hi)
{
    uintptr_t from = lo > MRP_ARENA_SIZE ? lo - MRP_ARENA_SIZE + 1 : 0;
    size_t first = mrp_table_lower_bound(from);
    size_t last = first;
    while (last < g.narenas && g.arenas[last].base < hi) {
        last++;
    }
    if (last > first) {
        memmove(&g.arenas[first], &g.arenas[last], (g.narenas - last) * sizeof(mrp_arena));
        g.narenas -= last - first;
        g.arenas_forgotten += last - first;
    }
}

static void mrp_table_insert(uintptr_t base, uintptr_t caller)
{
    mrp_table_forget_range(base, base + MRP_ARENA_SIZE); /* never two entries for one range */
    if (g.narenas == g.capacity) {
        size_t capacity = g.capacity ? g.capacity * 2 : 256;
        mrp_arena *grown = realloc(g.arenas, capacity * sizeof(mrp_arena));
        if (grown == NULL) {
            g.table_errors++; /* this arena is simply not reclaimed */
            return;
        }
        g.arenas = grown;
        g.capacity = capacity;
    }
    size_t at = mrp_table_lower_bound(base);
    memmove(&g.arenas[at + 1], &g.arenas[at], (g.narenas - at) * sizeof(mrp_arena));
    g.arenas[at].base = base;
    g.arenas[at].caller = caller;
    g.narenas++;
    g.arenas_recorded++;
    g.last_caller = caller;
}

/* Keep only the arenas requested from pymalloc's call site. */
static void mrp_table_keep_caller(uintptr_t caller)
{
    size_t kept = 0;
    for (size_t i = 0; i < g.narenas; i++) {
        if (g.arenas[i].caller == caller) {
            g.arenas[kept++] = g.arenas[i];
        } else {
            g.arenas_forgotten++;
            g.foreign_blocks++;
        }
    }
    g.narenas = kept;
}

/* ---- the arena-allocator wrapper ------------------------------------------------------------- */

static int mrp_in_cpython(const void *address)
{
    Dl_info info;
    if (address == NULL || dladdr(address, &info) == 0) {
        return 0;
    }
    return (uintptr_t)info.dli_fbase == g.cpython_base;
}

static void *mrp_arena_alloc(void *ctx, size_t size)
{
    uintptr_t caller = (uintptr_t)__builtin_return_address(0);
    void *ptr = g.prev.alloc(g.prev.ctx, size);
    (void)ctx;
    if (ptr == NULL) {
        return NULL;
    }
    int is_arena = 0;
    if (size == MRP_ARENA_SIZE) {
        if (g.arena_caller != 0) {
            is_arena = caller == g.arena_caller;
        } else {
            is_arena = mrp_in_cpython((const void *)caller);
        }
    }
    if (is_arena) {
        mrp_table_insert((uintptr_t)ptr, caller);
    } else {
        /* Not a pymalloc arena (frame-stack chunk, third-party code): never scanned. */
        mrp_table_forget_range((uintptr_t)ptr, (uintptr_t)ptr + size);
        g.foreign_blocks++;
    }
    return ptr;
}

static void mrp_arena_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if (ptr != NULL) {
        mrp_table_forget_range((uintptr_t)ptr, (uintptr_t)ptr + (size ? size : 1));
    }
    g.prev.free(g.prev.ctx, ptr, size);
}

static int mrp_allocator_is_ours(void)
{
    PyObjectArenaAllocator current;
    PyObject_GetArenaAllocator(&current);
    return current.alloc == mrp_arena_alloc && current.free == mrp_arena_free;
}

/* ---- validation and release of one arena ----------------------------------------------------- */

static int mrp_header_is_blank(const mrp_pool_header *header)
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
static int mrp_free_link_valid(const mrp_pool_header *header, uintptr_t first, uintptr_t end)
{
    uintptr_t next = (uintptr_t)header->nextpool;
    return next == 0 || ((next & MRP_POOL_MASK) == 0 && next >= first && next < end);
}

/* Every field of one carved pool's header must be one pymalloc can produce. */
static int mrp_header_valid(const mrp_pool_header *header, uintptr_t pool, uintptr_t first,
                            uintptr_t end)
{
    unsigned int count = header->ref.count;
    if (header->arenaindex >= MRP_MAX_ARENA_INDEX) {
        return 0;
    }
    if (header->szidx == MRP_DUMMY_SIZE_IDX) {
        /* pymalloc leaves DUMMY only inside the carving call; outside it, we set it: an empty
         * pool released earlier. */
        return count == 0 && header->nextoffset <= MRP_POOL_SIZE &&
               mrp_free_link_valid(header, first, end);
    }
    if (header->szidx >= MRP_NB_SIZE_CLASSES) {
        return 0;
    }
    unsigned int size = mrp_class_size(header->szidx);
    unsigned int nblocks = (unsigned int)((MRP_POOL_SIZE - MRP_POOL_OVERHEAD) / size);
    if (header->maxnextoffset != MRP_POOL_SIZE - size) {
        return 0;
    }
    unsigned int nextoffset = header->nextoffset;
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
        /* The free list is empty only in a full pool. */
        if (count != nblocks) {
            return 0;
        }
    } else {
        if (freeblock < pool + MRP_POOL_OVERHEAD || freeblock >= pool + nextoffset ||
            (freeblock - pool - MRP_POOL_OVERHEAD) % size != 0) {
            return 0;
        }
    }
    if (count == 0 && !mrp_free_link_valid(header, first, end)) {
        return 0;
    }
    return 1;
}

/* Validate every carved pool of the arena at base, then release the resident body pages of its
 * empty pools (with dry_run, only count what would be released). Returns 0, or -1 when the
 * arena was left untouched because something did not look like a pymalloc arena. Called with
 * the GIL held. */
static int mrp_reclaim_arena(uintptr_t base, int dry_run, mrp_pass *pass)
{
    unsigned char resident[MRP_ARENA_PAGES];
    if ((base & (MRP_PAGE_SIZE - 1)) != 0) {
        return -1;
    }
    /* Never read a header page that is not resident: mincore first. */
    if (mincore((void *)base, MRP_ARENA_SIZE, resident) != 0) {
        return -1;
    }
    uintptr_t first = (base + MRP_POOL_MASK) & ~MRP_POOL_MASK;
    uintptr_t end = first + ((base + MRP_ARENA_SIZE - first) / MRP_POOL_SIZE) * MRP_POOL_SIZE;
    size_t npools = (end - first) / MRP_POOL_SIZE;

    /* Carved pools form a prefix of the arena (pymalloc carves at pool_address, upwards). */
    size_t ncarved = 0;
    unsigned int arenaindex = 0;
    for (size_t i = 0; i < npools; i++) {
        uintptr_t pool = first + i * MRP_POOL_SIZE;
        if (!(resident[(pool - base) / MRP_PAGE_SIZE] & 1)) {
            break;
        }
        const mrp_pool_header *header = (const mrp_pool_header *)pool;
        if (mrp_header_is_blank(header)) {
            break; /* never carved (resident only through a huge page) */
        }
        if (!mrp_header_valid(header, pool, first, end)) {
            return -1;
        }
        if (i == 0) {
            arenaindex = header->arenaindex;
        } else if (header->arenaindex != arenaindex) {
            return -1;
        }
        ncarved++;
    }

    /* Everything checked: now write. */
    for (size_t i = 0; i < ncarved; i++) {
        uintptr_t pool = first + i * MRP_POOL_SIZE;
        mrp_pool_header *header = (mrp_pool_header *)pool;
        if (header->ref.count != 0) {
            continue;
        }
        size_t page = (pool - base) / MRP_PAGE_SIZE;
        long long resident_body = 0;
        for (size_t p = 1; p < MRP_POOL_PAGES; p++) {
            resident_body += resident[page + p] & 1;
        }
        if (resident_body == 0) {
            continue;
        }
        if (dry_run) {
            pass->pools_released++;
            pass->bytes_released += resident_body * (long long)MRP_PAGE_SIZE;
            continue;
        }
        /* Essential: an empty pool that still names its size class is reused through its old
         * free list, which lives in the pages we are about to drop. DUMMY makes pymalloc
         * rebuild the pool inside its first page. */
        header->szidx = MRP_DUMMY_SIZE_IDX;
        if (madvise((void *)(pool + MRP_PAGE_SIZE), MRP_POOL_SIZE - MRP_PAGE_SIZE, MADV_DONTNEED) ==
            0) {
            pass->pools_released++;
            pass->bytes_released += resident_body * (long long)MRP_PAGE_SIZE;
        }
    }
    return 0;
}

/* One call's worth of work: every arena (budget < 0), or up to budget arenas after the cursor.
 * A dry run scans every arena, writes nothing and leaves the cursor alone. */
static void mrp_run(Py_ssize_t budget, int dry_run, mrp_pass *pass)
{
    memset(pass, 0, sizeof(*pass));
    long long start = mrp_now_ns();
    if (dry_run) {
        for (size_t i = 0; i < g.narenas; i++) {
            if (mrp_reclaim_arena(g.arenas[i].base, 1, pass) != 0) {
                pass->arenas_skipped++;
            }
            pass->arenas_scanned++;
        }
        pass->complete = 1;
        pass->elapsed_ns = mrp_now_ns() - start;
        return;
    }
    size_t i = budget < 0 ? 0 : mrp_table_lower_bound(g.cursor + 1);
    if (budget < 0) {
        g.cursor = 0;
    }
    Py_ssize_t done = 0;
    while (i < g.narenas && (budget < 0 || done < budget)) {
        uintptr_t base = g.arenas[i].base;
        if (mrp_reclaim_arena(base, 0, pass) != 0) {
            pass->arenas_skipped++;
        }
        pass->arenas_scanned++;
        done++;
        i++;
        if (budget >= 0) {
            g.cursor = base;
        }
    }
    pass->complete = i >= g.narenas;
    if (pass->complete) {
        g.cursor = 0;
    }
    pass->elapsed_ns = mrp_now_ns() - start;
}

/* ---- gates ----------------------------------------------------------------------------------- */

/* Gates that do not change while the process lives; NULL when all pass. */
static const char *mrp_static_gate(void)
{
#ifdef Py_GIL_DISABLED
    return "free-threaded CPython is not supported: it does not use pymalloc";
#elif !defined(__linux__)
    return "pool reclaim needs Linux (mincore, madvise)";
#elif PY_VERSION_HEX >= 0x030C0000
    return "CPython 3.12 and later are not supported: each interpreter has its own pymalloc "
           "state but the arena allocator is process-wide, and arenas are not tagged by owning "
           "interpreter, so a reclaim could race another interpreter's allocations";
#elif PY_VERSION_HEX < 0x030B0000
    return "CPython before 3.11 is not supported: its pymalloc layout was not validated";
#elif defined(Py_DEBUG)
    return "debug builds of CPython (Py_DEBUG) are not supported";
#elif !defined(WITH_PYMALLOC)
    return "this CPython was built without pymalloc";
#else
    static char message[200];
    int tested = 0;
    for (size_t i = 0; i < sizeof(mrp_tested_versions) / sizeof(mrp_tested_versions[0]); i++) {
        tested |= mrp_tested_versions[i] == Py_Version;
    }
    if (!tested || Py_Version != PY_VERSION_HEX) {
        snprintf(message, sizeof(message),
                 "CPython %lu.%lu.%lu (release level %lx) is not on the tested allow-list "
                 "(3.11.7)%s",
                 (Py_Version >> 24) & 0xff, (Py_Version >> 16) & 0xff, (Py_Version >> 8) & 0xff,
                 (Py_Version >> 4) & 0xf,
                 Py_Version != PY_VERSION_HEX ? ", or differs from the headers it was built with"
                                              : "");
        return message;
    }
    long page = sysconf(_SC_PAGESIZE);
    if (page != (long)MRP_PAGE_SIZE) {
        snprintf(message, sizeof(message), "the page size is %ld bytes, not 4096", page);
        return message;
    }
    return NULL;
#endif
}

/* ---- the self-test (runs in a forked child) -------------------------------------------------- */

typedef struct {
    int ok;
    uintptr_t caller;
    long long pools_released;
    char message[300];
} mrp_report;

typedef struct {
    unsigned char *ptr;
    size_t size;
    unsigned int seed;
} mrp_block;

static void mrp_fill(unsigned char *ptr, size_t size, unsigned int seed)
{
    for (size_t i = 0; i < size; i++) {
        ptr[i] = (unsigned char)(seed * 31u + i * 7u + 1u);
    }
}

static int mrp_check(const unsigned char *ptr, size_t size, unsigned int seed)
{
    for (size_t i = 0; i < size; i++) {
        if (ptr[i] != (unsigned char)(seed * 31u + i * 7u + 1u)) {
            return 0;
        }
    }
    return 1;
}

static int mrp_is_tracked(uintptr_t address)
{
    size_t at = mrp_table_lower_bound(address + 1);
    return at > 0 && address - g.arenas[at - 1].base < MRP_ARENA_SIZE;
}

static _Noreturn void mrp_child_exit(int fd, mrp_report *report, int ok, const char *fmt, ...)
    __attribute__((format(printf, 4, 5), noreturn));

static _Noreturn void mrp_child_exit(int fd, mrp_report *report, int ok, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(report->message, sizeof(report->message), fmt, args);
    va_end(args);
    report->ok = ok;
    ssize_t unused = write(fd, report, sizeof(*report));
    (void)unused;
    _exit(ok ? 0 : 1);
}

#define MRP_TEST_SIZES 30
#define MRP_MAX_RELEASED 8192

/* In the forked child, with the GIL held: learn pymalloc's arena call site, then prove the
 * layout and the release/reuse path on real pools. Never returns. */
static _Noreturn void mrp_selftest_child(int fd)
{
    mrp_report report;
    memset(&report, 0, sizeof(report));
    Py_ssize_t (*allocated_blocks)(void) =
        (Py_ssize_t(*)(void))dlsym(RTLD_DEFAULT, "_Py_GetAllocatedBlocks");

    /* 1. Use small blocks until pymalloc asks the arena allocator for a new arena. */
    unsigned long long recorded = g.arenas_recorded;
    void **learn_chain = NULL;
    size_t learnt = 0;
    while (g.arenas_recorded == recorded && learnt < MRP_LEARN_LIMIT) {
        void **block = PyObject_Malloc(256);
        if (block == NULL) {
            mrp_child_exit(fd, &report, 0, "self-test: PyObject_Malloc failed");
        }
        *block = learn_chain;
        learn_chain = block;
        learnt += 256;
    }
    if (g.arenas_recorded == recorded) {
        mrp_child_exit(fd, &report, 0,
                       "pymalloc is not serving PyObject_Malloc: no 1 MiB arena was requested "
                       "from CPython while the self-test allocated %zu MiB of small blocks (or "
                       "enable() was called after more than that had been freed)",
                       learnt >> 20);
    }
    report.caller = g.last_caller;
    g.arena_caller = g.last_caller;
    mrp_table_keep_caller(g.arena_caller);

    /* 2. Blocks of many size classes, each filling several pools, filled with patterns. The
     *    learning blocks stay allocated, so these land in recorded arenas. */
    size_t nblocks = 0;
    for (unsigned int k = 1; k <= MRP_TEST_SIZES; k++) {
        nblocks += 3 * (16336 / (16 * k)) + 5;
    }
    mrp_block *blocks = calloc(2 * nblocks, sizeof(mrp_block));
    uintptr_t *released = calloc(MRP_MAX_RELEASED, sizeof(uintptr_t));
    if (blocks == NULL || released == NULL) {
        mrp_child_exit(fd, &report, 0, "self-test: out of memory");
    }
    size_t n = 0;
    for (unsigned int k = 1; k <= MRP_TEST_SIZES; k++) {
        size_t count = 3 * (16336 / (16 * k)) + 5;
        for (size_t j = 0; j < count; j++) {
            size_t size = 16 * k - 8;
            unsigned char *ptr = PyObject_Malloc(size);
            if (ptr == NULL) {
                mrp_child_exit(fd, &report, 0, "self-test: PyObject_Malloc failed");
            }
            blocks[n].ptr = ptr;
            blocks[n].size = size;
            blocks[n].seed = (unsigned int)n;
            mrp_fill(ptr, size, blocks[n].seed);
            n++;
        }
    }
    /* The layout seen from live blocks: the header of a block's pool names a size class big
     * enough for the request, and the pool lies in a recorded arena. */
    size_t in_tracked = 0;
    for (size_t i = 0; i < n; i++) {
        uintptr_t pool = (uintptr_t)blocks[i].ptr & ~MRP_POOL_MASK;
        if (!mrp_is_tracked(pool)) {
            continue;
        }
        in_tracked++;
        const mrp_pool_header *header = (const mrp_pool_header *)pool;
        if (header->szidx >= MRP_NB_SIZE_CLASSES || header->ref.count == 0) {
            mrp_child_exit(fd, &report, 0,
                           "self-test: the pool header of a live block does not match the "
                           "3.11 layout (szidx %u, count %u)",
                           header->szidx, header->ref.count);
        }
        unsigned int size = mrp_class_size(header->szidx);
        uintptr_t offset = (uintptr_t)blocks[i].ptr - pool;
        uintptr_t block_start = MRP_POOL_OVERHEAD + (offset - MRP_POOL_OVERHEAD) / size * size;
        if (offset < MRP_POOL_OVERHEAD || header->maxnextoffset != MRP_POOL_SIZE - size ||
            offset + blocks[i].size > block_start + size) {
            mrp_child_exit(fd, &report, 0,
                           "self-test: pool size or block layout differs from 16 KiB pools "
                           "with a 48-byte header");
        }
    }
    if (in_tracked < n / 2) {
        mrp_child_exit(fd, &report, 0,
                       "self-test: only %zu of %zu test blocks are in recorded 1 MiB arenas",
                       in_tracked, n);
    }

    /* 3. Free every block of odd-numbered requests, every 5th survives of the others. */
    size_t kept = 0;
    for (size_t i = 0; i < n; i++) {
        size_t k = (blocks[i].size + 8) / 16;
        if (k % 2 == 1 || i % 5 != 0) {
            PyObject_Free(blocks[i].ptr);
        } else {
            blocks[kept++] = blocks[i];
        }
    }
    n = kept;

    /* 4. Release. */
    Py_ssize_t blocks_before = allocated_blocks ? allocated_blocks() : 0;
    mrp_pass pass;
    mrp_run(-1, 0, &pass);
    Py_ssize_t blocks_after = allocated_blocks ? allocated_blocks() : 0;
    if (pass.arenas_skipped != 0) {
        mrp_child_exit(fd, &report, 0, "self-test: %lld of %lld recorded arenas failed validation",
                       pass.arenas_skipped, pass.arenas_scanned);
    }
    if (pass.pools_released == 0) {
        mrp_child_exit(fd, &report, 0, "self-test: no empty pool was released");
    }
    if (blocks_before != blocks_after) {
        mrp_child_exit(fd, &report, 0, "self-test: the reclaim changed the allocated block count");
    }
    report.pools_released = pass.pools_released;
    for (size_t i = 0; i < n; i++) {
        if (!mrp_check(blocks[i].ptr, blocks[i].size, blocks[i].seed)) {
            mrp_child_exit(fd, &report, 0, "self-test: a surviving block changed");
        }
    }
    /* Released pools: marked, body gone, header page kept. */
    size_t nreleased = 0;
    for (size_t a = 0; a < g.narenas; a++) {
        uintptr_t first = (g.arenas[a].base + MRP_POOL_MASK) & ~MRP_POOL_MASK;
        unsigned char resident[MRP_ARENA_PAGES];
        if (mincore((void *)g.arenas[a].base, MRP_ARENA_SIZE, resident) != 0) {
            mrp_child_exit(fd, &report, 0, "self-test: mincore failed: %s", strerror(errno));
        }
        for (uintptr_t pool = first; pool + MRP_POOL_SIZE <= g.arenas[a].base + MRP_ARENA_SIZE;
             pool += MRP_POOL_SIZE) {
            size_t page = (pool - g.arenas[a].base) / MRP_PAGE_SIZE;
            if (!(resident[page] & 1)) {
                break;
            }
            const mrp_pool_header *header = (const mrp_pool_header *)pool;
            if (header->szidx != MRP_DUMMY_SIZE_IDX) {
                continue;
            }
            for (size_t p = 1; p < MRP_POOL_PAGES; p++) {
                if (resident[page + p] & 1) {
                    mrp_child_exit(fd, &report, 0, "self-test: a released pool is resident");
                }
            }
            if (nreleased < MRP_MAX_RELEASED) {
                released[nreleased++] = pool;
            }
        }
    }
    if (nreleased == 0) {
        mrp_child_exit(fd, &report, 0, "self-test: no pool is marked released");
    }

    /* 5. Allocate into the released pools again; everything must read back. */
    size_t reused = 0;
    for (unsigned int k = 1; k <= MRP_TEST_SIZES; k++) {
        size_t count = 3 * (16336 / (16 * k)) + 5;
        for (size_t j = 0; j < count && n < 2 * nblocks; j++) {
            size_t size = 16 * k - 8;
            unsigned char *ptr = PyObject_Malloc(size);
            if (ptr == NULL) {
                mrp_child_exit(fd, &report, 0, "self-test: PyObject_Malloc failed");
            }
            uintptr_t pool = (uintptr_t)ptr & ~MRP_POOL_MASK;
            for (size_t r = 0; r < nreleased; r++) {
                if (released[r] == pool) {
                    const mrp_pool_header *header = (const mrp_pool_header *)pool;
                    if (header->szidx >= MRP_NB_SIZE_CLASSES ||
                        header->maxnextoffset != MRP_POOL_SIZE - mrp_class_size(header->szidx)) {
                        mrp_child_exit(fd, &report, 0,
                                       "self-test: a reused pool was not re-initialised");
                    }
                    reused++;
                    break;
                }
            }
            blocks[n].ptr = ptr;
            blocks[n].size = size;
            blocks[n].seed = (unsigned int)(n + 7919);
            mrp_fill(ptr, size, blocks[n].seed);
            n++;
        }
    }
    if (reused == 0) {
        mrp_child_exit(fd, &report, 0, "self-test: no block was allocated in a released pool");
    }
    for (size_t i = 0; i < n; i++) {
        if (!mrp_check(blocks[i].ptr, blocks[i].size, blocks[i].seed)) {
            mrp_child_exit(fd, &report, 0, "self-test: a block changed after reuse");
        }
    }
    /* 6. A second pass after reuse must validate too, then free everything. */
    mrp_run(-1, 0, &pass);
    if (pass.arenas_skipped != 0) {
        mrp_child_exit(fd, &report, 0, "self-test: an arena failed validation after reuse");
    }
    for (size_t i = 0; i < n; i++) {
        if (!mrp_check(blocks[i].ptr, blocks[i].size, blocks[i].seed)) {
            mrp_child_exit(fd, &report, 0, "self-test: a block changed after the second pass");
        }
        PyObject_Free(blocks[i].ptr);
    }
    while (learn_chain != NULL) {
        void **next = *learn_chain;
        PyObject_Free(learn_chain);
        learn_chain = next;
    }
    mrp_child_exit(fd, &report, 1, "ok");
}

/* Fork, run the self-test in the child, wait (GIL released) for its report. 0 or -1 + reason. */
static int mrp_run_selftest(mrp_report *report)
{
    int fds[2];
    if (pipe(fds) != 0) {
        mrp_set_reason("self-test could not run: pipe() failed: %s", strerror(errno));
        return -1;
    }
    pid_t pid = fork();
    if (pid < 0) {
        int err = errno;
        close(fds[0]);
        close(fds[1]);
        mrp_set_reason("self-test could not run: fork() failed: %s", strerror(err));
        return -1;
    }
    if (pid == 0) {
        close(fds[0]);
        mrp_selftest_child(fds[1]);
    }
    close(fds[1]);
    memset(report, 0, sizeof(*report));
    ssize_t got = 0;
    int timed_out = 0, status = 0;
    Py_BEGIN_ALLOW_THREADS;
    struct pollfd pfd = {.fd = fds[0], .events = POLLIN};
    long long deadline = mrp_now_ns() + (long long)MRP_SELFTEST_TIMEOUT_MS * 1000000LL;
    while ((size_t)got < sizeof(*report)) {
        long long left_ms = (deadline - mrp_now_ns()) / 1000000LL;
        if (left_ms <= 0) {
            timed_out = 1;
            break;
        }
        int ready = poll(&pfd, 1, (int)left_ms);
        if (ready < 0 && errno == EINTR) {
            continue;
        }
        if (ready <= 0) {
            timed_out = ready == 0;
            break;
        }
        ssize_t r = read(fds[0], (char *)report + got, sizeof(*report) - (size_t)got);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            break;
        }
        got += r;
    }
    if (timed_out) {
        kill(pid, SIGKILL);
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    Py_END_ALLOW_THREADS;
    close(fds[0]);
    if (timed_out) {
        mrp_set_reason("self-test child did not finish within %d s",
                       MRP_SELFTEST_TIMEOUT_MS / 1000);
        return -1;
    }
    if (WIFSIGNALED(status)) {
        mrp_set_reason("self-test child died from signal %d: the pymalloc layout is not the "
                       "expected one",
                       WTERMSIG(status));
        return -1;
    }
    if ((size_t)got != sizeof(*report)) {
        mrp_set_reason("self-test child exited (status %d) without a report",
                       WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return -1;
    }
    report->message[sizeof(report->message) - 1] = '\0';
    if (!report->ok || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        mrp_set_reason("%s", report->message);
        return -1;
    }
    if (report->caller == 0 || !mrp_in_cpython((const void *)report->caller)) {
        mrp_set_reason("self-test: the arena call site it found is not in CPython");
        return -1;
    }
    return 0;
}

/* ---- module state and Python glue ------------------------------------------------------------ */

typedef struct {
    PyObject *unavailable; /* PoolReclaimUnavailable */
    PyTypeObject *result_type;
} mrp_state;

static inline mrp_state *mrp_get_state(PyObject *module)
{
    return (mrp_state *)PyModule_GetState(module);
}

static PyObject *mrp_error_type(void)
{
    return g.error_type != NULL ? g.error_type : PyExc_RuntimeError;
}

/* Raise PoolReclaimUnavailable with the current reason. */
static void mrp_raise_unavailable(void)
{
    PyErr_SetString(mrp_error_type(), g.reason[0] ? g.reason : "pool reclaim is not enabled");
}

static void mrp_fail_for_good(void)
{
    g.enabled = 0;
    g.failed = 1;
}

/* Gates checked on every call. 0, or -1 with the feature disabled and an exception set. */
static int mrp_check_call(void)
{
    if (!g.enabled) {
        if (!g.failed) {
            mrp_set_reason("pool reclaim is not enabled: call enable() first");
        }
        mrp_raise_unavailable();
        return -1;
    }
    if (!PyGILState_Check()) {
        PyErr_SetString(PyExc_RuntimeError, "pool reclaim needs the GIL");
        return -1;
    }
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        PyErr_SetString(mrp_error_type(), "pool reclaim runs in the main interpreter only");
        return -1;
    }
    if (!mrp_allocator_is_ours()) {
        mrp_fail_for_good();
        mrp_set_reason("the arena allocator was replaced after enable(): the arena table can no "
                       "longer be trusted, pool reclaim is disabled");
        mrp_raise_unavailable();
        return -1;
    }
    return 0;
}

static PyObject *mrp_enable(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    if (g.enabled) {
        if (mrp_check_call() < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    if (g.failed) {
        mrp_raise_unavailable();
        return NULL;
    }
    if (g.busy) {
        PyErr_SetString(PyExc_RuntimeError, "enable() is already running in another thread");
        return NULL;
    }
    const char *gate = mrp_static_gate();
    if (gate != NULL) {
        mrp_set_reason("%s", gate);
        mrp_fail_for_good();
        mrp_raise_unavailable();
        return NULL;
    }
    if (PyInterpreterState_Get() != PyInterpreterState_Main()) {
        PyErr_SetString(mrp_error_type(),
                        "pool reclaim can be enabled in the main interpreter only");
        return NULL;
    }
    const char *(*allocator_name)(void) =
        (const char *(*)(void))dlsym(RTLD_DEFAULT, "_PyMem_GetCurrentAllocatorName");
    const char *name = allocator_name ? allocator_name() : NULL;
    if (name != NULL && strcmp(name, "pymalloc") != 0 && strcmp(name, "pymalloc_debug") != 0) {
        mrp_set_reason("pymalloc is not active (memory allocator: %s, e.g. PYTHONMALLOC=%s): "
                       "there are no pymalloc pools to reclaim",
                       name, name);
        mrp_fail_for_good();
        mrp_raise_unavailable();
        return NULL;
    }
    PyObjectArenaAllocator current;
    PyObject_GetArenaAllocator(&current);
    if (current.alloc == mrp_arena_alloc) {
        mrp_set_reason("internal error: the wrapper is installed but not enabled");
        mrp_fail_for_good();
        mrp_raise_unavailable();
        return NULL;
    }
    if (!mrp_in_cpython((const void *)(uintptr_t)current.alloc)) {
        Dl_info info;
        const char *owner = "unknown code";
        if (dladdr((const void *)(uintptr_t)current.alloc, &info) != 0 && info.dli_fname) {
            owner = info.dli_fname;
        }
        mrp_set_reason("the arena allocator was already replaced (by %s): only CPython's own "
                       "arena allocator is supported",
                       owner);
        mrp_fail_for_good();
        mrp_raise_unavailable();
        return NULL;
    }

    g.busy = 1;
    g.prev = current;
    PyObjectArenaAllocator ours = {NULL, mrp_arena_alloc, mrp_arena_free};
    PyObject_SetArenaAllocator(&ours);
    g.installed = 1;

    mrp_report report;
    int rc = mrp_run_selftest(&report);
    g.busy = 0;
    if (rc == 0 && !mrp_allocator_is_ours()) {
        mrp_set_reason("the arena allocator was replaced while the self-test ran");
        rc = -1;
    }
    if (rc != 0) {
        if (mrp_allocator_is_ours()) {
            PyObject_SetArenaAllocator(&g.prev); /* nobody wrapped us: step out */
            g.installed = 0;
        }
        g.narenas = 0;
        mrp_fail_for_good();
        mrp_raise_unavailable();
        return NULL;
    }
    g.arena_caller = report.caller;
    mrp_table_keep_caller(g.arena_caller);
    g.selftest_pools_released = report.pools_released;
    g.reason[0] = '\0';
    g.enabled = 1;
    Py_RETURN_NONE;
}

static int mrp_parse_budget(PyObject *arg, Py_ssize_t *budget)
{
    if (arg == NULL || arg == Py_None) {
        *budget = -1;
        return 0;
    }
    if (PyBool_Check(arg) || !PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "budget_arenas must be None or an int, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return -1;
    }
    int overflow = 0;
    long long value = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (value == -1 && PyErr_Occurred()) {
        return -1;
    }
    if (overflow < 0 || (overflow == 0 && value < 1)) {
        PyErr_SetString(PyExc_ValueError,
                        "budget_arenas must be at least 1 (or None for every arena)");
        return -1;
    }
    *budget = (overflow > 0 || value > PY_SSIZE_T_MAX) ? PY_SSIZE_T_MAX : (Py_ssize_t)value;
    return 0;
}

static int mrp_reclaim_core(Py_ssize_t budget, mrp_pass *pass)
{
    if (mrp_check_call() < 0) {
        return -1;
    }
    mrp_run(budget, 0, pass);
    g.reclaim_calls++;
    g.pools_released += pass->pools_released;
    g.bytes_released += pass->bytes_released;
    g.arenas_skipped += pass->arenas_skipped;
    g.last_ns = pass->elapsed_ns;
    g.total_ns += pass->elapsed_ns;
    if (pass->elapsed_ns > g.max_ns) {
        g.max_ns = pass->elapsed_ns;
    }
    return 0;
}

static PyObject *mrp_result_new(mrp_state *state, const mrp_pass *pass)
{
    PyObject *result = PyStructSequence_New(state->result_type);
    if (result == NULL) {
        return NULL;
    }
    PyObject *items[6] = {
        PyLong_FromLongLong(pass->pools_released), PyLong_FromLongLong(pass->bytes_released),
        PyLong_FromLongLong(pass->arenas_scanned), PyLong_FromLongLong(pass->arenas_skipped),
        PyBool_FromLong(pass->complete),           PyLong_FromLongLong(pass->elapsed_ns),
    };
    int failed = 0;
    for (int i = 0; i < 6; i++) {
        if (items[i] == NULL) {
            failed = 1;
            items[i] = Py_NewRef(Py_None);
        }
        PyStructSequence_SetItem(result, i, items[i]);
    }
    if (failed) {
        Py_DECREF(result);
        return NULL;
    }
    return result;
}

static PyObject *mrp_estimate(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    mrp_pass pass;
    if (mrp_check_call() < 0) {
        return NULL;
    }
    mrp_run(-1, 1, &pass);
    return mrp_result_new(mrp_get_state(module), &pass);
}

/* METH_FASTCALL: no argument tuple is built, so a call allocates nothing that outlives it. */
static PyObject *mrp_reclaim(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                             PyObject *kwnames)
{
    PyObject *budget_arg = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (nargs + nkw > 1) {
        PyErr_Format(PyExc_TypeError, "reclaim() takes at most 1 argument (%zd given)",
                     nargs + nkw);
        return NULL;
    }
    if (nargs == 1) {
        budget_arg = args[0];
    } else if (nkw == 1) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, 0);
        if (!PyUnicode_Check(name) || PyUnicode_CompareWithASCIIString(name, "budget_arenas")) {
            PyErr_Format(PyExc_TypeError, "reclaim() got an unexpected keyword argument '%S'",
                         name);
            return NULL;
        }
        budget_arg = args[0];
    }
    Py_ssize_t budget;
    if (mrp_parse_budget(budget_arg, &budget) < 0) {
        return NULL;
    }
    mrp_pass pass;
    if (mrp_reclaim_core(budget, &pass) < 0) {
        return NULL;
    }
    return mrp_result_new(mrp_get_state(module), &pass);
}

static int mrp_dict_set(PyObject *dict, const char *key, PyObject *value)
{
    if (value == NULL) {
        return -1;
    }
    int rc = PyDict_SetItemString(dict, key, value);
    Py_DECREF(value);
    return rc;
}

static PyObject *mrp_status(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    (void)module;
    if (g.enabled && !mrp_allocator_is_ours()) {
        mrp_fail_for_good();
        mrp_set_reason("the arena allocator was replaced after enable(): the arena table can no "
                       "longer be trusted, pool reclaim is disabled");
    }
    const char *reason = NULL;
    if (!g.enabled) {
        const char *gate = mrp_static_gate();
        reason = g.failed || g.reason[0] ? g.reason
                 : gate != NULL          ? gate
                                         : "pool reclaim is not enabled: call enable() first";
    }
    PyObject *dict = PyDict_New();
    if (dict == NULL) {
        return NULL;
    }
    if (mrp_dict_set(dict, "enabled", PyBool_FromLong(g.enabled)) < 0 ||
        mrp_dict_set(dict, "available", PyBool_FromLong(mrp_static_gate() == NULL && !g.failed)) <
            0 ||
        mrp_dict_set(dict, "reason", reason ? PyUnicode_FromString(reason) : Py_NewRef(Py_None)) <
            0 ||
        mrp_dict_set(dict, "arenas_tracked", PyLong_FromSize_t(g.narenas)) < 0 ||
        mrp_dict_set(dict, "arenas_recorded", PyLong_FromUnsignedLongLong(g.arenas_recorded)) < 0 ||
        mrp_dict_set(dict, "arenas_forgotten", PyLong_FromUnsignedLongLong(g.arenas_forgotten)) <
            0 ||
        mrp_dict_set(dict, "foreign_blocks", PyLong_FromUnsignedLongLong(g.foreign_blocks)) < 0 ||
        mrp_dict_set(dict, "table_errors", PyLong_FromUnsignedLongLong(g.table_errors)) < 0 ||
        mrp_dict_set(dict, "reclaim_calls", PyLong_FromLongLong(g.reclaim_calls)) < 0 ||
        mrp_dict_set(dict, "pools_released", PyLong_FromLongLong(g.pools_released)) < 0 ||
        mrp_dict_set(dict, "bytes_released", PyLong_FromLongLong(g.bytes_released)) < 0 ||
        mrp_dict_set(dict, "arenas_skipped", PyLong_FromLongLong(g.arenas_skipped)) < 0 ||
        mrp_dict_set(dict, "last_reclaim_ns", PyLong_FromLongLong(g.last_ns)) < 0 ||
        mrp_dict_set(dict, "max_reclaim_ns", PyLong_FromLongLong(g.max_ns)) < 0 ||
        mrp_dict_set(dict, "total_reclaim_ns", PyLong_FromLongLong(g.total_ns)) < 0 ||
        mrp_dict_set(dict, "self_test_pools_released",
                     PyLong_FromLongLong(g.selftest_pools_released)) < 0) {
        Py_DECREF(dict);
        return NULL;
    }
    return dict;
}

/* ---- capsule: the core's trim(pools=True) ---------------------------------------------------- */

/* Called by memreclaim._core with the GIL held: one complete pass over every recorded arena. */
static int mrp_capi_reclaim(mr_pools_result *out)
{
    mrp_pass pass;
    if (out == NULL) {
        PyErr_SetString(PyExc_ValueError, "mr_pools_result pointer is NULL");
        return -1;
    }
    out->pools_released = 0;
    out->bytes_released = 0;
    if (mrp_reclaim_core(-1, &pass) < 0) {
        return -1;
    }
    out->pools_released = pass.pools_released;
    out->bytes_released = pass.bytes_released;
    return 0;
}

static const mr_pools_capi mrp_capi = {
    .version = MR_POOLS_CAPI_VERSION,
    .reclaim = mrp_capi_reclaim,
};

/* ---- module definition ----------------------------------------------------------------------- */

PyDoc_STRVAR(mrp_enable_doc,
             "enable()\n--\n\n"
             "Install the arena-allocator wrapper and turn pool reclaim on, after checking every\n"
             "gate and running the self-test in a forked child. Call it early: only arenas\n"
             "allocated afterwards are reclaimed. Raises PoolReclaimUnavailable with the reason\n"
             "when a gate fails. Idempotent.");

PyDoc_STRVAR(mrp_reclaim_doc,
             "reclaim(budget_arenas=None)\n--\n\n"
             "Give back the pages of empty pymalloc pools (GIL held). With budget_arenas=None,\n"
             "scan every recorded arena; with an int N >= 1, scan at most N arenas, continuing\n"
             "where the previous budgeted call stopped. Returns (pools_released, bytes_released,\n"
             "arenas_scanned, arenas_skipped, complete); the result also has elapsed_ns.");

PyDoc_STRVAR(mrp_estimate_doc,
             "estimate()\n--\n\n"
             "What reclaim() would give back now, without writing anything: a ReclaimResult\n"
             "whose pools_released and bytes_released count the empty pools with resident\n"
             "pages in every tracked arena. Does not move the budget cursor.");

PyDoc_STRVAR(mrp_status_doc, "status()\n--\n\n"
                             "A dict: enabled, available, reason (None when enabled), arenas "
                             "tracked, totals and timings.");

static PyMethodDef mrp_methods[] = {
    {"enable", mrp_enable, METH_NOARGS, mrp_enable_doc},
    {"reclaim", (PyCFunction)(void (*)(void))mrp_reclaim, METH_FASTCALL | METH_KEYWORDS,
     mrp_reclaim_doc},
    {"estimate", mrp_estimate, METH_NOARGS, mrp_estimate_doc},
    {"status", mrp_status, METH_NOARGS, mrp_status_doc},
    {NULL, NULL, 0, NULL},
};

static PyStructSequence_Field mrp_result_fields[] = {
    {"pools_released", "empty pools whose body pages were given back"},
    {"bytes_released", "bytes given back (resident pages dropped with MADV_DONTNEED)"},
    {"arenas_scanned", "arenas examined by this call"},
    {"arenas_skipped", "arenas left untouched because validation failed"},
    {"complete", "True when this call reached the end of the arena table"},
    {"elapsed_ns", "time spent in the scan, GIL held, in nanoseconds"},
    {NULL, NULL},
};

static PyStructSequence_Desc mrp_result_desc = {
    "memreclaim._pools.ReclaimResult",
    "Result of reclaim(): a 5-tuple (pools_released, bytes_released, arenas_scanned,\n"
    "arenas_skipped, complete), with elapsed_ns as an attribute.",
    mrp_result_fields,
    5,
};

static int mrp_exec(PyObject *module)
{
    mrp_state *state = mrp_get_state(module);
    if (g.cpython_base == 0) {
        Dl_info info;
        if (dladdr((const void *)(uintptr_t)&PyObject_Malloc, &info) != 0) {
            g.cpython_base = (uintptr_t)info.dli_fbase;
        }
    }
    state->unavailable = PyErr_NewExceptionWithDoc(
        "memreclaim._pools.PoolReclaimUnavailable",
        "Pool reclaim cannot be used in this process; the message says which gate failed.",
        PyExc_RuntimeError, NULL);
    if (state->unavailable == NULL) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, "PoolReclaimUnavailable", state->unavailable) < 0) {
        return -1;
    }
    if (g.error_type == NULL && PyInterpreterState_Get() == PyInterpreterState_Main()) {
        g.error_type = Py_NewRef(state->unavailable);
    }
    state->result_type = PyStructSequence_NewType(&mrp_result_desc);
    if (state->result_type == NULL) {
        return -1;
    }
    if (PyModule_AddObjectRef(module, "ReclaimResult", (PyObject *)state->result_type) < 0) {
        return -1;
    }
    PyObject *capsule = PyCapsule_New((void *)&mrp_capi, MR_POOLS_CAPSULE, NULL);
    if (capsule == NULL) {
        return -1;
    }
    if (PyModule_AddObject(module, "_C_API", capsule) < 0) {
        Py_DECREF(capsule);
        return -1;
    }
    PyObject *versions = PyTuple_New(sizeof(mrp_tested_versions) / sizeof(mrp_tested_versions[0]));
    if (versions == NULL) {
        return -1;
    }
    for (size_t i = 0; i < sizeof(mrp_tested_versions) / sizeof(mrp_tested_versions[0]); i++) {
        unsigned long v = mrp_tested_versions[i];
        PyObject *text = PyUnicode_FromFormat("%lu.%lu.%lu", (v >> 24) & 0xff, (v >> 16) & 0xff,
                                              (v >> 8) & 0xff);
        if (text == NULL) {
            Py_DECREF(versions);
            return -1;
        }
        PyTuple_SET_ITEM(versions, (Py_ssize_t)i, text);
    }
    if (PyModule_AddObject(module, "TESTED_VERSIONS", versions) < 0) {
        Py_DECREF(versions);
        return -1;
    }
    if (PyModule_AddIntConstant(module, "ARENA_SIZE", (long)MRP_ARENA_SIZE) < 0 ||
        PyModule_AddIntConstant(module, "POOL_SIZE", (long)MRP_POOL_SIZE) < 0) {
        return -1;
    }
    return 0;
}

static int mrp_traverse(PyObject *module, visitproc visit, void *arg)
{
    mrp_state *state = mrp_get_state(module);
    Py_VISIT(state->unavailable);
    Py_VISIT(state->result_type);
    return 0;
}

static int mrp_clear(PyObject *module)
{
    mrp_state *state = mrp_get_state(module);
    Py_CLEAR(state->unavailable);
    Py_CLEAR(state->result_type);
    return 0;
}

static void mrp_free(void *module)
{
    mrp_clear((PyObject *)module);
}

static PyModuleDef_Slot mrp_slots[] = {
    {Py_mod_exec, mrp_exec},
#ifdef Py_GIL_DISABLED
    /* Free-threaded builds: enable() always refuses, nothing here needs the GIL. */
    {Py_mod_gil, Py_MOD_GIL_NOT_USED},
#endif
    {0, NULL},
};

PyDoc_STRVAR(
    mrp_module_doc,
    "Reclaim the pages of empty pymalloc pools inside live arenas (CPython 3.11, opt-in).");

static struct PyModuleDef mrp_module = {
    PyModuleDef_HEAD_INIT,       .m_name = "memreclaim._pools", .m_doc = mrp_module_doc,
    .m_size = sizeof(mrp_state), .m_methods = mrp_methods,      .m_slots = mrp_slots,
    .m_traverse = mrp_traverse,  .m_clear = mrp_clear,          .m_free = mrp_free,
};

PyMODINIT_FUNC PyInit__pools(void)
{
    return PyModuleDef_Init(&mrp_module);
}

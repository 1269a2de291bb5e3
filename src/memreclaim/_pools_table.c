/* The arena table of memreclaim._pools and the arena-allocator wrapper that fills it.
 *
 * Arenas are learnt through the public arena-allocator hook: the wrapper records exact 1 MiB
 * requests. Before the self-test has found pymalloc's call site (new_arena), any 1 MiB request
 * from CPython's own code is recorded; afterwards only requests from that call site, so other
 * users of the arena allocator (3.11's frame-stack chunks, third-party code) are ignored.
 */
#include "_pools.h"

#include <dlfcn.h>
#include <string.h>

mrp_process mrp_proc = {.lock = PTHREAD_MUTEX_INITIALIZER};

/* First index whose base is >= base. Called with lock held. */
static size_t lower_bound(uintptr_t base)
{
    size_t lo = 0, hi = mrp_proc.narenas;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (mrp_proc.arenas[mid].base < base) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

/* Forget every recorded arena that overlaps [lo, hi). Called with lock held. */
static void forget_range(uintptr_t lo, uintptr_t hi)
{
    uintptr_t from = lo > MRP_ARENA_SIZE ? lo - MRP_ARENA_SIZE + 1 : 0;
    size_t first = lower_bound(from);
    size_t last = first;
    while (last < mrp_proc.narenas && mrp_proc.arenas[last].base < hi) {
        last++;
    }
    if (last > first) {
        memmove(&mrp_proc.arenas[first], &mrp_proc.arenas[last],
                (mrp_proc.narenas - last) * sizeof(mrp_arena));
        mrp_proc.narenas -= last - first;
        mrp_proc.arenas_forgotten += last - first;
    }
}

/* Called with lock held. */
static void insert(uintptr_t base, uintptr_t caller)
{
    forget_range(base, base + MRP_ARENA_SIZE); /* never two entries for one range */
    if (mrp_proc.narenas == mrp_proc.capacity) {
        size_t capacity = mrp_proc.capacity ? mrp_proc.capacity * 2 : 256;
        mrp_arena *grown = realloc(mrp_proc.arenas, capacity * sizeof(mrp_arena));
        if (grown == NULL) {
            mrp_proc.table_errors++; /* this arena is simply not reclaimed */
            return;
        }
        mrp_proc.arenas = grown;
        mrp_proc.capacity = capacity;
    }
    size_t at = lower_bound(base);
    memmove(&mrp_proc.arenas[at + 1], &mrp_proc.arenas[at],
            (mrp_proc.narenas - at) * sizeof(mrp_arena));
    mrp_proc.arenas[at].base = base;
    mrp_proc.arenas[at].caller = caller;
    mrp_proc.narenas++;
    mrp_proc.arenas_recorded++;
    mrp_proc.last_caller = caller;
}

void mrp_table_keep_caller(uintptr_t caller)
{
    pthread_mutex_lock(&mrp_proc.lock);
    size_t kept = 0;
    for (size_t i = 0; i < mrp_proc.narenas; i++) {
        if (mrp_proc.arenas[i].caller == caller) {
            mrp_proc.arenas[kept++] = mrp_proc.arenas[i];
        } else {
            mrp_proc.arenas_forgotten++;
            mrp_proc.foreign_blocks++;
        }
    }
    mrp_proc.narenas = kept;
    pthread_mutex_unlock(&mrp_proc.lock);
}

uintptr_t mrp_table_next(uintptr_t from)
{
    pthread_mutex_lock(&mrp_proc.lock);
    size_t at = lower_bound(from);
    uintptr_t base = at < mrp_proc.narenas ? mrp_proc.arenas[at].base : 0;
    pthread_mutex_unlock(&mrp_proc.lock);
    return base;
}

int mrp_table_contains(uintptr_t address)
{
    pthread_mutex_lock(&mrp_proc.lock);
    size_t at = lower_bound(address + 1);
    int found = at > 0 && address - mrp_proc.arenas[at - 1].base < MRP_ARENA_SIZE;
    pthread_mutex_unlock(&mrp_proc.lock);
    return found;
}

int mrp_in_cpython(const void *address)
{
    Dl_info info;
    if (address == NULL || dladdr(address, &info) == 0) {
        return 0;
    }
    return (uintptr_t)info.dli_fbase == mrp_proc.cpython_base;
}

/* ---- the wrapper -------------------------------------------------------------------------- */

static void *arena_alloc(void *ctx, size_t size)
{
    uintptr_t caller = (uintptr_t)__builtin_return_address(0);
    void *ptr = mrp_proc.prev.alloc(mrp_proc.prev.ctx, size);
    (void)ctx;
    if (ptr == NULL) {
        return NULL;
    }
    int is_arena = 0;
    if (size == MRP_ARENA_SIZE) {
        is_arena = mrp_proc.arena_caller != 0 ? caller == mrp_proc.arena_caller
                                              : mrp_in_cpython((const void *)caller);
    }
    pthread_mutex_lock(&mrp_proc.lock);
    if (is_arena) {
        insert((uintptr_t)ptr, caller);
    } else {
        /* Not a pymalloc arena (frame-stack chunk, third-party code): never scanned. */
        forget_range((uintptr_t)ptr, (uintptr_t)ptr + size);
        mrp_proc.foreign_blocks++;
    }
    pthread_mutex_unlock(&mrp_proc.lock);
    return ptr;
}

static void arena_free(void *ctx, void *ptr, size_t size)
{
    (void)ctx;
    if (ptr != NULL) {
        pthread_mutex_lock(&mrp_proc.lock);
        forget_range((uintptr_t)ptr, (uintptr_t)ptr + (size ? size : 1));
        pthread_mutex_unlock(&mrp_proc.lock);
    }
    mrp_proc.prev.free(mrp_proc.prev.ctx, ptr, size);
}

void mrp_install_wrapper(const PyObjectArenaAllocator *current)
{
    mrp_proc.prev = *current;
    PyObjectArenaAllocator ours = {NULL, arena_alloc, arena_free};
    PyObject_SetArenaAllocator(&ours);
    mrp_proc.installed = 1;
}

/* Step out, if nobody wrapped us since; the table is emptied either way. */
void mrp_remove_wrapper(void)
{
    if (mrp_allocator_is_ours()) {
        PyObject_SetArenaAllocator(&mrp_proc.prev);
        mrp_proc.installed = 0;
    }
    pthread_mutex_lock(&mrp_proc.lock);
    mrp_proc.narenas = 0;
    pthread_mutex_unlock(&mrp_proc.lock);
}

int mrp_allocator_is_ours(void)
{
    PyObjectArenaAllocator current;
    PyObject_GetArenaAllocator(&current);
    return current.alloc == arena_alloc && current.free == arena_free;
}

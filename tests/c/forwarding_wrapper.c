/* A forwarding LD_PRELOAD wrapper, as profilers and APM agents install one: it defines malloc and
 * friends, counts the calls, and passes each on with dlsym(RTLD_NEXT, ...). It exports no
 * allocator interface of its own, so the memory stays in the allocator below (glibc's arenas).
 *
 * Built by tests/test_detection.py: cc -shared -fPIC -O1 -o libfwdwrap.so forwarding_wrapper.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <string.h>

static void *(*next_malloc)(size_t);
static void (*next_free)(void *);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static int (*next_posix_memalign)(void **, size_t, size_t);
static void *(*next_aligned_alloc)(size_t, size_t);
static void *(*next_memalign)(size_t, size_t);
static unsigned long calls;

/* dlsym may calloc before the pointers are known: serve those few bytes from here. */
static _Alignas(16) char bootstrap[8192];
static size_t bootstrap_used;
static int initialising;

static int from_bootstrap(const void *p)
{
    return (const char *)p >= bootstrap && (const char *)p < bootstrap + sizeof(bootstrap);
}

static void init(void)
{
    if (next_malloc != NULL || initialising) {
        return;
    }
    initialising = 1;
    *(void **)&next_calloc = dlsym(RTLD_NEXT, "calloc");
    *(void **)&next_free = dlsym(RTLD_NEXT, "free");
    *(void **)&next_realloc = dlsym(RTLD_NEXT, "realloc");
    *(void **)&next_posix_memalign = dlsym(RTLD_NEXT, "posix_memalign");
    *(void **)&next_aligned_alloc = dlsym(RTLD_NEXT, "aligned_alloc");
    *(void **)&next_memalign = dlsym(RTLD_NEXT, "memalign");
    *(void **)&next_malloc = dlsym(RTLD_NEXT, "malloc");
    initialising = 0;
}

void *malloc(size_t n)
{
    init();
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return next_malloc(n);
}

void *calloc(size_t n, size_t size)
{
    if (next_calloc == NULL) {
        size_t bytes = (n * size + 15) & ~(size_t)15;
        if (initialising) {
            void *p;
            if (bootstrap_used + bytes > sizeof(bootstrap)) {
                return NULL;
            }
            p = bootstrap + bootstrap_used;
            bootstrap_used += bytes;
            return p; /* static storage: already zero */
        }
        init();
    }
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return next_calloc(n, size);
}

void free(void *p)
{
    if (p == NULL || from_bootstrap(p)) {
        return;
    }
    init();
    next_free(p);
}

void *realloc(void *p, size_t n)
{
    init();
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    if (from_bootstrap(p)) {
        void *q = next_malloc(n);
        size_t left = (size_t)(bootstrap + sizeof(bootstrap) - (char *)p);
        if (q != NULL) {
            memcpy(q, p, n < left ? n : left);
        }
        return q;
    }
    return next_realloc(p, n);
}

int posix_memalign(void **out, size_t align, size_t n)
{
    init();
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return next_posix_memalign(out, align, n);
}

void *aligned_alloc(size_t align, size_t n)
{
    init();
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return next_aligned_alloc(align, n);
}

void *memalign(size_t align, size_t n)
{
    init();
    __atomic_add_fetch(&calls, 1, __ATOMIC_RELAXED);
    return next_memalign(align, n);
}

/* How many allocations went through the wrapper (the test checks it was really in the path). */
unsigned long fwdwrap_calls(void)
{
    return __atomic_load_n(&calls, __ATOMIC_RELAXED);
}

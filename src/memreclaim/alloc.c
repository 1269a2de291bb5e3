/* Allocator detection and one backend per allocator.
 *
 * Every allocator-specific symbol is looked up with dlsym(RTLD_DEFAULT, ...) at run time, so one
 * binary loads on old glibc (no mallinfo2 before 2.33), on musl, and under any LD_PRELOADed
 * allocator. A symbol counts only when it lives in the same shared object as the `malloc` this
 * process calls: a library that bundles a private jemalloc is not taken for the process allocator.
 *
 * Pure C, no Python objects.
 */
#define _GNU_SOURCE
#include "memreclaim.h"

#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* glibc's struct mallinfo2 (2.33+) and struct mallinfo, declared here so that the build does not
 * depend on the C library's headers. */
struct mr_mallinfo2 {
    /* usmblks is unused (always 0), but it is part of the layout. */
    // cppcheck-suppress unusedStructMember
    size_t arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};
struct mr_mallinfo {
    // cppcheck-suppress unusedStructMember
    int arena, ordblks, smblks, hblks, hblkhd, usmblks, fsmblks, uordblks, fordblks, keepcost;
};

static struct {
    /* glibc */
    int (*malloc_trim)(size_t);
    struct mr_mallinfo2 (*mallinfo2)(void);
    struct mr_mallinfo (*mallinfo)(void);
    int (*mallopt)(int, int);
    int (*malloc_info)(int, FILE *);
    const char *(*gnu_get_libc_version)(void);
    /* jemalloc */
    int (*mallctl)(const char *, void *, size_t *, void *, size_t);
    /* mimalloc */
    void (*mi_collect)(bool);
    void (*mi_process_info)(size_t *, size_t *, size_t *, size_t *, size_t *, size_t *, size_t *,
                            size_t *);
    int (*mi_version)(void);
    /* gperftools tcmalloc */
    void (*tc_release)(void);
    int (*tc_numeric_property)(const char *, size_t *);
    const char *(*tc_version)(int *, int *, const char **);
} sym;

static pthread_once_t detect_once = PTHREAD_ONCE_INIT;
static const mr_backend *detected;
static char version_text[64];

/* Test seam for the fault tests: MEMRECLAIM_TEST_HIDE_SYMBOLS="mallinfo2,malloc_trim" makes
 * detection behave as if dlsym had not found those names. Read once, at detection. */
static bool hidden(const char *name)
{
    const char *list = getenv("MEMRECLAIM_TEST_HIDE_SYMBOLS");
    size_t len = strlen(name);
    while (list != NULL && *list != '\0') {
        const char *comma = strchr(list, ',');
        size_t item = comma ? (size_t)(comma - list) : strlen(list);
        if (item == len && strncmp(list, name, len) == 0) {
            return true;
        }
        list = comma ? comma + 1 : NULL;
    }
    return false;
}

/* The address of `name` if it is defined by the object that also defines malloc, else NULL. */
static void *lookup(const char *name, const void *malloc_base)
{
    Dl_info info;
    void *address;
    if (hidden(name)) {
        return NULL;
    }
    address = dlsym(RTLD_DEFAULT, name);
    if (address == NULL || malloc_base == NULL) {
        return NULL;
    }
    if (dladdr(address, &info) == 0 || info.dli_fbase != malloc_base) {
        return NULL;
    }
    return address;
}

/* Converting a data pointer from dlsym to a function pointer is what POSIX requires to work. */
#define LOOKUP(field, name) (*(void **)(&sym.field) = lookup(name, base))

/* ---- glibc ---------------------------------------------------------------------------------- */

static int glibc_trim(void)
{
    (void)sym.malloc_trim(0); /* 1 if memory was released, 0 if not: we measure RSS instead */
    return 0;
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
    if (sym.mallinfo2 != NULL) {
        mi = sym.mallinfo2();
    } else if (sym.mallinfo != NULL) {
        /* Before glibc 2.33 only the int version exists; its fields wrap past 2 GiB. */
        struct mr_mallinfo old = sym.mallinfo();
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

/* ---- jemalloc ------------------------------------------------------------------------------- */

static int jemalloc_trim(void)
{
    /* Flush this thread's cache first so its cached blocks can be purged too; a failure (tcache
     * disabled) is not an error. */
    (void)sym.mallctl("thread.tcache.flush", NULL, NULL, NULL, 0);
    return sym.mallctl(MR_JEMALLOC_PURGE_ALL, NULL, NULL, NULL, 0);
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
    err = sym.mallctl("epoch", &epoch, &len, &epoch, len);
    if (err != 0) {
        return err;
    }
    for (size_t i = 0; i < 5; i++) {
        size_t value = 0;
        len = sizeof(value);
        err = sym.mallctl(names[i], &value, &len, NULL, 0);
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

/* ---- mimalloc ------------------------------------------------------------------------------- */

static int mimalloc_trim(void)
{
    sym.mi_collect(true);
    return 0;
}

static int mimalloc_heap_stats(mr_heap_stats *out)
{
    size_t elapsed, user, sys, rss, peak_rss, commit, peak_commit, faults;
    if (sym.mi_process_info == NULL) {
        return ENOTSUP;
    }
    sym.mi_process_info(&elapsed, &user, &sys, &rss, &peak_rss, &commit, &peak_commit, &faults);
    add_figure(out, "current_rss", (int64_t)rss);
    add_figure(out, "peak_rss", (int64_t)peak_rss);
    add_figure(out, "current_commit", (int64_t)commit);
    add_figure(out, "peak_commit", (int64_t)peak_commit);
    add_figure(out, "page_faults", (int64_t)faults);
    out->mapped = (int64_t)commit;
    return 0;
}

/* ---- tcmalloc (gperftools) ------------------------------------------------------------------ */

static int tcmalloc_trim(void)
{
    sym.tc_release();
    return 0;
}

static int tcmalloc_heap_stats(mr_heap_stats *out)
{
    static const char *const names[] = {
        "generic.current_allocated_bytes",   "generic.heap_size",
        "tcmalloc.pageheap_free_bytes",      "tcmalloc.pageheap_unmapped_bytes",
        "tcmalloc.central_cache_free_bytes", "tcmalloc.thread_cache_free_bytes"};
    int64_t values[6];
    if (sym.tc_numeric_property == NULL) {
        return ENOTSUP;
    }
    for (size_t i = 0; i < 6; i++) {
        size_t value = 0;
        if (!sym.tc_numeric_property(names[i], &value)) {
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

/* ---- none ----------------------------------------------------------------------------------- */

static int no_trim(void)
{
    return 0;
}

static int no_heap_stats(mr_heap_stats *out)
{
    (void)out;
    return ENOTSUP;
}

static const mr_backend backends[] = {
    {MR_ALLOC_UNKNOWN, "unknown", "none", no_trim, no_heap_stats},
    {MR_ALLOC_GLIBC, "glibc", "malloc_trim(0)", glibc_trim, glibc_heap_stats},
    {MR_ALLOC_JEMALLOC, "jemalloc", "mallctl(\"" MR_JEMALLOC_PURGE_ALL "\")", jemalloc_trim,
     jemalloc_heap_stats},
    {MR_ALLOC_MIMALLOC, "mimalloc", "mi_collect(true)", mimalloc_trim, mimalloc_heap_stats},
    {MR_ALLOC_TCMALLOC, "tcmalloc", "MallocExtension_ReleaseFreeMemory()", tcmalloc_trim,
     tcmalloc_heap_stats},
};

static void detect(void)
{
    Dl_info info;
    const void *base = NULL;
    /* Test seam: MEMRECLAIM_TEST_MALLOC_SYMBOL=__libc_malloc takes the object defining that name
     * for the one serving malloc, so the glibc backend can run under ASan or valgrind (which
     * interpose malloc themselves). */
    const char *probe = getenv("MEMRECLAIM_TEST_MALLOC_SYMBOL");
    void *malloc_address = dlsym(RTLD_DEFAULT, probe != NULL && *probe != '\0' ? probe : "malloc");

    if (malloc_address != NULL && dladdr(malloc_address, &info) != 0) {
        base = info.dli_fbase;
    }
    LOOKUP(malloc_trim, "malloc_trim");
    LOOKUP(mallinfo2, "mallinfo2");
    LOOKUP(mallinfo, "mallinfo");
    LOOKUP(mallopt, "mallopt");
    LOOKUP(malloc_info, "malloc_info");
    LOOKUP(gnu_get_libc_version, "gnu_get_libc_version");
    LOOKUP(mallctl, "mallctl");
    LOOKUP(mi_collect, "mi_collect");
    LOOKUP(mi_process_info, "mi_process_info");
    LOOKUP(mi_version, "mi_version");
    LOOKUP(tc_release, "MallocExtension_ReleaseFreeMemory");
    LOOKUP(tc_numeric_property, "MallocExtension_GetNumericProperty");
    LOOKUP(tc_version, "tc_version");

    if (sym.mallctl != NULL) {
        detected = &backends[MR_ALLOC_JEMALLOC];
    } else if (sym.mi_collect != NULL) {
        detected = &backends[MR_ALLOC_MIMALLOC];
    } else if (sym.tc_release != NULL) {
        detected = &backends[MR_ALLOC_TCMALLOC];
    } else if (sym.gnu_get_libc_version != NULL && sym.malloc_trim != NULL) {
        detected = &backends[MR_ALLOC_GLIBC];
    } else {
        detected = &backends[MR_ALLOC_UNKNOWN];
    }

    /* Glibc's own symbols are only usable when glibc serves malloc. */
    if (detected->kind != MR_ALLOC_GLIBC) {
        sym.malloc_trim = NULL;
        sym.mallinfo2 = NULL;
        sym.mallinfo = NULL;
        sym.mallopt = NULL;
        sym.malloc_info = NULL;
    }

    switch (detected->kind) {
    case MR_ALLOC_GLIBC:
        (void)snprintf(version_text, sizeof(version_text), "%s", sym.gnu_get_libc_version());
        break;
    case MR_ALLOC_JEMALLOC: {
        const char *text = NULL;
        size_t len = sizeof(text);
        if (sym.mallctl("version", &text, &len, NULL, 0) == 0 && text != NULL) {
            (void)snprintf(version_text, sizeof(version_text), "%s", text);
        }
        break;
    }
    case MR_ALLOC_MIMALLOC:
        if (sym.mi_version != NULL) {
            int v = sym.mi_version(); /* e.g. 209 for 2.0.9 */
            (void)snprintf(version_text, sizeof(version_text), "%d.%d.%d", v / 100, v / 10 % 10,
                           v % 10);
        }
        break;
    case MR_ALLOC_TCMALLOC:
        if (sym.tc_version != NULL) {
            const char *text = sym.tc_version(NULL, NULL, NULL);
            if (text != NULL) {
                (void)snprintf(version_text, sizeof(version_text), "%s", text);
            }
        }
        break;
    case MR_ALLOC_UNKNOWN:
        break;
    }
}

const mr_backend *mr_backend_detect(void)
{
    (void)pthread_once(&detect_once, detect);
    return detected;
}

const char *mr_backend_version(void)
{
    return version_text[0] != '\0' ? version_text : NULL;
}

int mr_glibc_mallopt(int param, int value)
{
    if (sym.mallopt == NULL) {
        return ENOTSUP;
    }
    return sym.mallopt(param, value) == 1 ? 0 : EINVAL;
}

int mr_glibc_malloc_info(char **text, size_t *size)
{
    FILE *stream;
    int err = 0;

    *text = NULL;
    *size = 0;
    if (sym.malloc_info == NULL) {
        return ENOTSUP;
    }
    stream = open_memstream(text, size);
    if (stream == NULL) {
        return errno;
    }
    if (sym.malloc_info(0, stream) != 0) {
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

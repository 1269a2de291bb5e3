/* Allocator detection and one backend per allocator.
 *
 * Every allocator-specific symbol is resolved at run time, so one binary loads on old glibc (no
 * mallinfo2 before 2.33), on musl, and under any LD_PRELOADed allocator. Detection finds the object
 * that *defines* the malloc this process calls (reading each loaded object's dynamic symbol table,
 * so a non-PIE executable's PLT stub is not taken for it), and a symbol counts only when the
 * program's calls to it reach that same object: a library that bundles a private jemalloc is not
 * taken for the process allocator. When that object is a forwarding wrapper (it defines malloc but
 * no allocator interface) over glibc, and a block malloc'd through it shows up in glibc's arenas,
 * the backend is glibc's and the wrapper is reported as `via`. See docs/architecture.md.
 *
 * Pure C, no Python objects.
 */
#define _GNU_SOURCE
#include "memreclaim.h"

#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

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
    void *(*mi_heap_get_backing)(void);
    bool (*mi_heap_visit_blocks)(const void *, bool,
                                 bool (*)(const void *, const void *, void *, size_t, void *),
                                 void *);
    long (*mi_option_get)(int);
    void (*mi_option_set)(int, long);
    void (*mi_thread_done)(void);
    void (*mi_thread_init)(void);
    /* gperftools tcmalloc */
    void (*tc_release)(void);
    int (*tc_numeric_property)(const char *, size_t *);
    const char *(*tc_version)(int *, int *, const char **);
    void (*tc_mark_thread_idle)(void);
} sym;

static pthread_once_t detect_once = PTHREAD_ONCE_INIT;
static const mr_backend *detected;
static uintptr_t allocator_key; /* the object whose names `sym` holds; 0 when unknown */
static char version_text[64];
static char via_text[256];     /* the forwarding wrapper above glibc, or "" */
static char reason_text[1024]; /* why memreclaim cannot act on this allocator, or "" */

/* ---- finding the object that defines a symbol ------------------------------------------------
 *
 * dlsym(RTLD_DEFAULT, "malloc") is not enough: in a non-PIE executable that takes malloc's address
 * (Debian's /usr/bin/python3), the executable's dynamic symbol table carries an *undefined* malloc
 * whose value is its canonical PLT stub, and dlsym returns that stub. So each loaded object's own
 * dynamic symbol table is read (GNU hash or SysV hash), and only a *defined* entry counts
 * (st_shndx != SHN_UNDEF, not a hidden symbol version). Objects are visited with dl_iterate_phdr,
 * in link-map order, which is the global (interposition) order for everything loaded at start-up
 * (the executable, LD_PRELOADs, DT_NEEDED libraries breadth-first). */

typedef struct {
    ElfW(Addr) bias;
    const ElfW(Sym) * symtab;
    const char *strtab;
    const uint32_t *gnu_hash;
    const uint32_t *sysv_hash;
    const ElfW(Half) * versym;
} elf_object;

/* An object seen by a walk: identified by its program headers' address (unique per loaded object),
 * with the address of the symbol it defines. */
typedef struct {
    bool found;
    uintptr_t key;
    void *address;
    char path[256];
} mr_object;

static void elf_object_init(const struct dl_phdr_info *info, elf_object *obj)
{
    const ElfW(Dyn) *dyn = NULL;
    memset(obj, 0, sizeof(*obj));
    obj->bias = info->dlpi_addr;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC) {
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
        }
    }
    for (; dyn != NULL && dyn->d_tag != DT_NULL; dyn++) {
        /* glibc relocates these entries in place, musl and the vDSO do not. */
        ElfW(Addr) ptr = dyn->d_un.d_ptr;
        if (ptr < obj->bias) {
            ptr += obj->bias;
        }
        switch (dyn->d_tag) {
        case DT_SYMTAB:
            obj->symtab = (const ElfW(Sym) *)ptr;
            break;
        case DT_STRTAB:
            obj->strtab = (const char *)ptr;
            break;
        case DT_GNU_HASH:
            obj->gnu_hash = (const uint32_t *)ptr;
            break;
        case DT_HASH:
            obj->sysv_hash = (const uint32_t *)ptr;
            break;
        case DT_VERSYM:
            obj->versym = (const ElfW(Half) *)ptr;
            break;
        default:
            break;
        }
    }
}

/* Symbol `index` is `name`, defined here, global or weak, and not a hidden (non-default) version.
 */
static bool defines_at(const elf_object *obj, uint32_t index, const char *name)
{
    const ElfW(Sym) *sym = &obj->symtab[index];
    unsigned bind = (unsigned)sym->st_info >> 4; /* ELF32_ST_BIND == ELF64_ST_BIND */
    if (sym->st_shndx == SHN_UNDEF || sym->st_value == 0 ||
        (bind != STB_GLOBAL && bind != STB_WEAK)) {
        return false;
    }
    if (obj->versym != NULL && (obj->versym[index] & 0x8000) != 0) {
        return false;
    }
    return strcmp(obj->strtab + sym->st_name, name) == 0;
}

static const ElfW(Sym) * elf_lookup(const elf_object *obj, const char *name)
{
    if (obj->symtab == NULL || obj->strtab == NULL) {
        return NULL;
    }
    if (obj->gnu_hash != NULL) {
        const uint32_t nbuckets = obj->gnu_hash[0], symoffset = obj->gnu_hash[1];
        const uint32_t bloom_size = obj->gnu_hash[2], bloom_shift = obj->gnu_hash[3];
        const ElfW(Addr) *bloom = (const ElfW(Addr) *)(const void *)(obj->gnu_hash + 4);
        const uint32_t *buckets = (const uint32_t *)(const void *)(bloom + bloom_size);
        const uint32_t *chain = buckets + nbuckets;
        const unsigned bits = sizeof(ElfW(Addr)) * 8;
        uint32_t hash = 5381;
        for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++) {
            hash = hash * 33 + *c;
        }
        if (nbuckets == 0 || bloom_size == 0) {
            return NULL;
        }
        ElfW(Addr) word = bloom[(hash / bits) % bloom_size];
        ElfW(Addr) mask =
            ((ElfW(Addr))1 << (hash % bits)) | ((ElfW(Addr))1 << ((hash >> bloom_shift) % bits));
        if ((word & mask) != mask) {
            return NULL;
        }
        for (uint32_t index = buckets[hash % nbuckets]; index >= symoffset; index++) {
            uint32_t other = chain[index - symoffset];
            if ((hash | 1) == (other | 1) && defines_at(obj, index, name)) {
                return &obj->symtab[index];
            }
            if (other & 1) {
                break;
            }
        }
        return NULL;
    }
    if (obj->sysv_hash != NULL) {
        const uint32_t nbucket = obj->sysv_hash[0];
        const uint32_t *bucket = obj->sysv_hash + 2, *chain = bucket + nbucket;
        uint32_t hash = 0;
        for (const unsigned char *c = (const unsigned char *)name; *c != '\0'; c++) {
            uint32_t high;
            hash = (hash << 4) + *c;
            high = hash & 0xf0000000u;
            hash ^= high >> 24;
            hash &= ~high;
        }
        if (nbucket == 0) {
            return NULL;
        }
        for (uint32_t index = bucket[hash % nbucket]; index != STN_UNDEF; index = chain[index]) {
            if (defines_at(obj, index, name)) {
                return &obj->symtab[index];
            }
        }
    }
    return NULL;
}

static bool contains(const struct dl_phdr_info *info, const void *address)
{
    uintptr_t a = (uintptr_t)address;
    for (ElfW(Half) i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t start = info->dlpi_addr + ph->p_vaddr;
        if (ph->p_type == PT_LOAD && a >= start && a - start < ph->p_memsz) {
            return true;
        }
    }
    return false;
}

typedef struct {
    const char *symbol;
    const void *global; /* dlsym(RTLD_DEFAULT, symbol): taken before the walk */
    uintptr_t after;    /* 0, or the key of an object: `next` is the first definer after it */
    bool past_after;
    mr_object first; /* the first object in link-map order that defines symbol */
    mr_object bound; /* the object holding dlsym's answer, when it defines symbol */
    mr_object next;  /* the first definer after `after` */
    uintptr_t owner; /* 0, or the key of an object: does it define symbol itself? */
    bool owner_defines;
} definer_walk;

static void note(mr_object *out, const struct dl_phdr_info *info, void *address)
{
    out->found = true;
    out->key = (uintptr_t)info->dlpi_phdr;
    out->address = address;
    if (info->dlpi_name != NULL && info->dlpi_name[0] != '\0') {
        (void)snprintf(out->path, sizeof(out->path), "%s", info->dlpi_name);
    } else {
        /* The main program has no name in the link map. */
        ssize_t n = readlink("/proc/self/exe", out->path, sizeof(out->path) - 1);
        if (n <= 0) {
            (void)snprintf(out->path, sizeof(out->path), "the main program");
        } else {
            out->path[n] = '\0';
        }
    }
}

static int definer_visit(struct dl_phdr_info *info, size_t size, void *data)
{
    definer_walk *walk = data;
    elf_object obj;
    const ElfW(Sym) * sym;
    (void)size;
    elf_object_init(info, &obj);
    sym = elf_lookup(&obj, walk->symbol);
    if (sym != NULL) {
        /* dlsym's answer, when it lies here, is right even for an IFUNC; otherwise an IFUNC's
         * value is its resolver, not the function: no address then (none of ours is one). */
        void *address = NULL;
        if (walk->global != NULL && contains(info, walk->global)) {
            address = (void *)walk->global;
        } else if ((sym->st_info & 0xf) != STT_GNU_IFUNC) {
            address = (void *)(obj.bias + sym->st_value);
        }
        if (!walk->first.found) {
            note(&walk->first, info, address);
        }
        if (!walk->bound.found && walk->global != NULL && contains(info, walk->global)) {
            note(&walk->bound, info, address);
        }
        if (walk->past_after && !walk->next.found) {
            note(&walk->next, info, address);
        }
        if ((uintptr_t)info->dlpi_phdr == walk->owner) {
            walk->owner_defines = true;
        }
    }
    if (walk->after != 0 && (uintptr_t)info->dlpi_phdr == walk->after) {
        walk->past_after = true;
    }
    return 0;
}

/* Test seam for the fault tests: MEMRECLAIM_TEST_HIDE_SYMBOLS="mallinfo2,malloc_trim" makes
 * detection behave as if no object defined those names. Read at detection. */
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

/* The object whose definition of `symbol` the program calls: the one holding dlsym's answer if it
 * defines the name, else (dlsym's answer was a PLT stub) the first object that defines it. With
 * `after` != 0, also the first definer after that object (*next). */
static bool resolve(const char *symbol, uintptr_t after, mr_object *out, mr_object *next)
{
    definer_walk walk;
    memset(&walk, 0, sizeof(walk));
    memset(out, 0, sizeof(*out));
    if (hidden(symbol)) {
        return false;
    }
    walk.symbol = symbol;
    walk.global = dlsym(RTLD_DEFAULT, symbol); /* before the walk: never inside its lock */
    walk.after = after;
    (void)dl_iterate_phdr(definer_visit, &walk);
    *out = walk.bound.found ? walk.bound : walk.first;
    if (next != NULL) {
        *next = walk.next;
    }
    return out->found;
}

/* The address of `name` if the program's calls to it go to object `owner`, else NULL: a library
 * that bundles a private jemalloc, or a tool that interposes mallopt, is not the allocator. */
static void *lookup(const char *name, uintptr_t owner)
{
    mr_object where;
    if (!resolve(name, 0, &where, NULL) || where.key != owner) {
        return NULL;
    }
    return where.address;
}

/* Object `owner` itself defines `name` (whoever else is bound first). */
static bool defines(const char *name, uintptr_t owner)
{
    definer_walk walk;
    if (hidden(name)) {
        return false;
    }
    memset(&walk, 0, sizeof(walk));
    walk.symbol = name;
    walk.owner = owner;
    (void)dl_iterate_phdr(definer_visit, &walk);
    return walk.owner_defines;
}

/* Converting a data pointer to a function pointer is what POSIX requires to work. */
#define LOOKUP(field, name) (*(void **)(&sym.field) = lookup(name, owner))

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
    if (sym.mi_option_get == NULL || sym.mi_option_set == NULL || sym.mi_version == NULL) {
        return false;
    }
    v = sym.mi_version();
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
    int v = sym.mi_version != NULL ? sym.mi_version() : 0;
    if (sym.mi_thread_init != NULL) {
        sym.mi_thread_init();
    }
    if (!mimalloc_has_purge_delay()) {
        sym.mi_collect(true);
        return;
    }
    mi_option_lock_take();
    long saved = sym.mi_option_get(MR_MI_OPTION_PURGE_DELAY);
    if (v >= 200 && v < 300 && sym.mi_option_get(MR_MI_OPTION_ABANDONED_PURGE) == 0) {
        /* Left on: a thread that exits from now on decommits its queued spans as it abandons
         * its segments. Python's join() returns before the thread's TLS destructors run, so a
         * thread "exited" may abandon its heap after this collect (then its spans were queued
         * with a delay for good: one run in eight gave back nothing). */
        sym.mi_option_set(MR_MI_OPTION_ABANDONED_PURGE, 1);
    }
    if (v < 300) {
        sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, 0);
        sym.mi_collect(true);
    }
    if (v >= 210) {
        sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, saved > 0 ? saved : 1);
        sym.mi_collect(true);
    }
    sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, saved);
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
    *previous = sym.mi_option_get(MR_MI_OPTION_PURGE_DELAY);
    if (set) {
        sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, value);
    }
    mi_option_lock_give();
    return 0;
}

const char *mr_mimalloc_purge_delay_reason(void)
{
    if (mr_backend_detect()->kind != MR_ALLOC_MIMALLOC) {
        return NULL;
    }
    if (sym.mi_option_get == NULL || sym.mi_option_set == NULL || sym.mi_version == NULL) {
        return "this mimalloc does not export mi_option_get/mi_option_set/mi_version";
    }
    if (!mimalloc_has_purge_delay()) {
        return "memreclaim knows mimalloc's option numbers from 1.7 to 3.6 only";
    }
    return NULL;
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
    if (mr_backend_detect()->kind != MR_ALLOC_MIMALLOC || sym.mi_heap_get_backing == NULL ||
        sym.mi_heap_visit_blocks == NULL) {
        return ENOTSUP;
    }
    out->small_used = out->large_used = out->committed = 0;
    out->areas = out->naddresses = 0;
    out->truncated = false;
    heap = sym.mi_heap_get_backing();
    if (heap == NULL) {
        return ENOTSUP;
    }
    (void)sym.mi_heap_visit_blocks(heap, false, mimalloc_area, out);
    return out->truncated ? EOVERFLOW : 0;
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

/* ---- the calling thread's share ------------------------------------------------------------ */

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
        int v = sym.mi_version != NULL ? sym.mi_version() : 0;
        mimalloc_collect_now();
        *method = "mi_collect(true)";
        /* mimalloc 2.x keeps a live thread's freed spans queued for a decommit that only that
         * thread's later page allocations or frees carry out, and mi_collect does not: handing
         * the heap over as an exiting thread does (mi_thread_done: its segments are abandoned,
         * the blocks in them stay valid and any thread may free them) lets the next trim
         * decommit them. The thread's next malloc makes it a new heap (2.x allocates fresh
         * thread data for it; 3.x keeps a pointer to the freed data, so never there). The main
         * thread's heap is never abandoned by mimalloc. */
        if (abandon && v >= 200 && v < 300 && sym.mi_thread_done != NULL && !is_main_thread()) {
            if (mimalloc_has_purge_delay()) {
                /* With abandoned_page_decommit (2.1+: abandoned_page_purge, option 12) on,
                 * abandoning decommits the queued spans here and now: a thread that takes the
                 * segments over first (any malloc needing a page may) would queue them again. */
                mi_option_lock_take();
                long saved = sym.mi_option_get(MR_MI_OPTION_PURGE_DELAY);
                long saved_abandoned = sym.mi_option_get(MR_MI_OPTION_ABANDONED_PURGE);
                sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, 0);
                sym.mi_option_set(MR_MI_OPTION_ABANDONED_PURGE, 1);
                sym.mi_thread_done();
                sym.mi_option_set(MR_MI_OPTION_ABANDONED_PURGE, saved_abandoned);
                sym.mi_option_set(MR_MI_OPTION_PURGE_DELAY, saved);
                mi_option_lock_give();
            } else {
                sym.mi_thread_done();
            }
            *method = "mi_collect(true); mi_thread_done()";
        }
        return 0;
    }
    case MR_ALLOC_JEMALLOC:
        /* thread.idle (5.2+): flush this thread's cache and purge its arena if it is the
         * thread's own; else the cache flush alone (fails when caching is off: nothing held). */
        if (sym.mallctl("thread.idle", NULL, NULL, NULL, 0) == 0) {
            *method = "mallctl(\"thread.idle\")";
        } else if (sym.mallctl("thread.tcache.flush", NULL, NULL, NULL, 0) == 0) {
            *method = "mallctl(\"thread.tcache.flush\")";
        }
        return 0;
    case MR_ALLOC_TCMALLOC:
        if (sym.tc_mark_thread_idle != NULL) {
            sym.tc_mark_thread_idle(); /* this thread's cache back to the central lists */
            *method = "MallocExtension_MarkThreadIdle()";
        }
        return 0;
    case MR_ALLOC_GLIBC:
    case MR_ALLOC_UNKNOWN:
        break;
    }
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

/* Which backend object `owner` implements, judged by the names the program's calls reach there;
 * fills `sym` with them. */
static const mr_backend *classify(uintptr_t owner)
{
    memset(&sym, 0, sizeof(sym));
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
    LOOKUP(mi_heap_get_backing, "mi_heap_get_backing");
    LOOKUP(mi_heap_visit_blocks, "mi_heap_visit_blocks");
    LOOKUP(tc_release, "MallocExtension_ReleaseFreeMemory");
    LOOKUP(tc_numeric_property, "MallocExtension_GetNumericProperty");
    LOOKUP(tc_version, "tc_version");
    LOOKUP(mi_option_get, "mi_option_get");
    LOOKUP(mi_option_set, "mi_option_set");
    LOOKUP(mi_thread_done, "mi_thread_done");
    LOOKUP(mi_thread_init, "mi_thread_init");
    LOOKUP(tc_mark_thread_idle, "MallocExtension_MarkThreadIdle");

    if (sym.mallctl != NULL) {
        return &backends[MR_ALLOC_JEMALLOC];
    }
    if (sym.mi_collect != NULL) {
        return &backends[MR_ALLOC_MIMALLOC];
    }
    if (sym.tc_release != NULL) {
        return &backends[MR_ALLOC_TCMALLOC];
    }
    if (sym.gnu_get_libc_version != NULL && sym.malloc_trim != NULL) {
        return &backends[MR_ALLOC_GLIBC];
    }
    return &backends[MR_ALLOC_UNKNOWN];
}

/* An object that defines malloc and none of these only passes calls on (a profiler's or an APM
 * agent's LD_PRELOAD wrapper); one that defines any of them is an allocator in its own right. */
static bool exports_allocator_api(uintptr_t owner)
{
    static const char *const names[] = {
        "malloc_trim", "mallctl",   "mi_collect", "mi_version", "MallocExtension_ReleaseFreeMemory",
        "tc_version",  "tc_malloc", "je_malloc",  NULL};
    for (size_t i = 0; names[i] != NULL; i++) {
        if (defines(names[i], owner)) {
            return true;
        }
    }
    return false;
}

/* The in-use bytes `backend` reports, or -1 when it cannot say. */
static int64_t in_use(const mr_backend *backend)
{
    mr_heap_stats stats;
    memset(&stats, 0, sizeof(stats));
    stats.in_use = -1;
    if (backend->heap_stats(&stats) != 0) {
        return -1;
    }
    return stats.in_use;
}

/* A block from the program's malloc shows up in `backend`'s in-use bytes: the wrapper above it
 * really passes allocations on to it, so memory freed through the wrapper is that allocator's to
 * give back. (A wrapper could also call __libc_malloc directly, past the allocator below it.) */
static bool malloc_lands_in(const mr_backend *backend)
{
    enum { PROBE_BYTES = 4 << 20 };
    int64_t before = in_use(backend), during;
    void *volatile block;

    if (before < 0) {
        return false; /* mimalloc: mi_process_info has no in-use figure */
    }
    block = malloc(PROBE_BYTES); /* through the wrapper: the call the program makes */
    if (block == NULL) {
        return false;
    }
    during = in_use(backend);
    free(block);
    /* Allowance for the allocator's own bookkeeping moving meanwhile (jemalloc shows 32 bytes
     * less); a false positive would need megabytes allocated from it in these microseconds. */
    return during - before >= PROBE_BYTES / 4 * 3;
}

static void detect(void)
{
    /* Test seam: MEMRECLAIM_TEST_MALLOC_SYMBOL=__libc_malloc takes the object defining that name
     * for the one serving malloc, so the glibc backend can run under ASan or valgrind (which
     * interpose malloc themselves). */
    const char *probe = getenv("MEMRECLAIM_TEST_MALLOC_SYMBOL");
    mr_object server, ignored, below;
    uintptr_t detected_key;

    if (probe == NULL || *probe == '\0') {
        probe = "malloc";
    }
    detected = &backends[MR_ALLOC_UNKNOWN];
    if (!resolve(probe, 0, &server, NULL)) {
        (void)snprintf(reason_text, sizeof(reason_text),
                       "no loaded object defines %s, so memreclaim cannot tell which allocator "
                       "serves it: trim() does nothing",
                       probe);
        return;
    }
    detected = classify(server.key);
    detected_key = server.key;
    if (detected->kind == MR_ALLOC_UNKNOWN) {
        bool is_glibc = sym.gnu_get_libc_version != NULL;
        const mr_backend *next = &backends[MR_ALLOC_UNKNOWN];
        if (!exports_allocator_api(server.key) && resolve(probe, server.key, &ignored, &below) &&
            below.found) {
            next = classify(below.key);
        }
        if (next->kind != MR_ALLOC_UNKNOWN && malloc_lands_in(next)) {
            /* A forwarding wrapper: the memory is in the allocator below it. */
            detected = next;
            detected_key = below.key;
            (void)snprintf(via_text, sizeof(via_text), "%s", server.path);
        } else if (next->kind != MR_ALLOC_UNKNOWN) {
            (void)snprintf(reason_text, sizeof(reason_text),
                           "malloc is served by %s, which memreclaim does not know; it is followed "
                           "by %s (%s), but memreclaim could not see a block malloc'd in this "
                           "process land there: trim() does nothing",
                           server.path, below.path, next->name);
        } else if (is_glibc) {
            (void)snprintf(reason_text, sizeof(reason_text),
                           "malloc is served by glibc (%s), but memreclaim found no "
                           "malloc_trim() there: trim() does nothing",
                           server.path);
        } else {
            (void)snprintf(reason_text, sizeof(reason_text),
                           "malloc is served by %s, which memreclaim does not know: trim() does "
                           "nothing",
                           server.path);
        }
    }
    if (detected->kind == MR_ALLOC_UNKNOWN) {
        memset(&sym, 0, sizeof(sym));
        return;
    }
    allocator_key = detected_key;

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
        /* A fork while another thread holds the purge-delay lock must not leave it held. */
        (void)pthread_atfork(mi_option_lock_take, mi_option_lock_give, mi_option_lock_give);
        if (sym.mi_version != NULL) {
            /* 1.x, 2.x and 3.0 encode x.y.z as x*100 + y*10 + z (209 = 2.0.9, 301 = 3.0.1); later
             * 3.x releases as x*10000 + y*100 + z (30600 = 3.6.0). */
            int v = sym.mi_version();
            if (v >= 10000) {
                (void)snprintf(version_text, sizeof(version_text), "%d.%d.%d", v / 10000,
                               v / 100 % 100, v % 100);
            } else if (v >= 1000) {
                /* 3.0.10 to 3.2.8 said x*1000 + y*100 + z (3010 = 3.0.10, 3208 = 3.2.8). */
                (void)snprintf(version_text, sizeof(version_text), "%d.%d.%d", v / 1000,
                               v / 100 % 10, v % 100);
            } else {
                (void)snprintf(version_text, sizeof(version_text), "%d.%d.%d", v / 100, v / 10 % 10,
                               v % 10);
            }
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

/* Names of glibc's own interface: usable only when glibc serves malloc (another allocator's
 * object may define some of them for compatibility, with other meanings). */
static bool glibc_only(const char *name)
{
    static const char *const names[] = {"malloc_trim", "mallinfo2",   "mallinfo",
                                        "mallopt",     "malloc_info", NULL};
    for (size_t i = 0; names[i] != NULL; i++) {
        if (strcmp(names[i], name) == 0) {
            return true;
        }
    }
    return false;
}

void *mr_alloc_symbol(const char *name)
{
    const mr_backend *backend = mr_backend_detect();
    if (name == NULL || allocator_key == 0 ||
        (backend->kind != MR_ALLOC_GLIBC && glibc_only(name))) {
        return NULL;
    }
    return lookup(name, allocator_key);
}

const char *mr_backend_version(void)
{
    return version_text[0] != '\0' ? version_text : NULL;
}

const char *mr_backend_via(void)
{
    return via_text[0] != '\0' ? via_text : NULL;
}

const char *mr_backend_reason(void)
{
    return reason_text[0] != '\0' ? reason_text : NULL;
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

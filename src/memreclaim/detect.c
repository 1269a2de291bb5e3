/* Allocator detection: which loaded object serves malloc, and the symbols of its interface.
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
 * The backends themselves (trim, stats, knobs per allocator) are in backends.c. Pure C, no Python
 * objects.
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
#include <unistd.h>

/* The allocator's interface, resolved by detection (see memreclaim.h). */
mr_alloc_syms mr_sym;

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
        if (mr_self_exe(out->path, sizeof(out->path)) != 0) {
            (void)snprintf(out->path, sizeof(out->path), "the main program");
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
#define LOOKUP(field, name) (*(void **)(&mr_sym.field) = lookup(name, owner))

/* Which backend object `owner` implements, judged by the names the program's calls reach there;
 * fills `sym` with them. */
static const mr_backend *classify(uintptr_t owner)
{
    memset(&mr_sym, 0, sizeof(mr_sym));
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

    if (mr_sym.mallctl != NULL) {
        return &mr_backends[MR_ALLOC_JEMALLOC];
    }
    if (mr_sym.mi_collect != NULL) {
        return &mr_backends[MR_ALLOC_MIMALLOC];
    }
    if (mr_sym.tc_release != NULL) {
        return &mr_backends[MR_ALLOC_TCMALLOC];
    }
    if (mr_sym.gnu_get_libc_version != NULL && mr_sym.malloc_trim != NULL) {
        return &mr_backends[MR_ALLOC_GLIBC];
    }
    return &mr_backends[MR_ALLOC_UNKNOWN];
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
    detected = &mr_backends[MR_ALLOC_UNKNOWN];
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
        bool is_glibc = mr_sym.gnu_get_libc_version != NULL;
        const mr_backend *next = &mr_backends[MR_ALLOC_UNKNOWN];
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
        memset(&mr_sym, 0, sizeof(mr_sym));
        return;
    }
    allocator_key = detected_key;

    /* Glibc's own symbols are only usable when glibc serves malloc. */
    if (detected->kind != MR_ALLOC_GLIBC) {
        mr_sym.malloc_trim = NULL;
        mr_sym.mallinfo2 = NULL;
        mr_sym.mallinfo = NULL;
        mr_sym.mallopt = NULL;
        mr_sym.malloc_info = NULL;
    }

    detected->detected(version_text, sizeof(version_text));
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

bool mr_symbol_definer(const char *name, char *path, size_t size)
{
    mr_object where;
    if (name == NULL || size == 0 || !resolve(name, 0, &where, NULL)) {
        return false;
    }
    (void)snprintf(path, size, "%s", where.path);
    return true;
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

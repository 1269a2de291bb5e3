/* Every /proc and sysfs reader: /proc/self/statm through a kept descriptor, /proc/PID/status, and
 * for another process (or this one) /proc/PID/smaps_rollup, who it is (its effective uid and
 * start time, from /proc/PID/status and stat), the lines of /proc/PID/maps and their fields (the
 * [heap] mapping; thp.c chooses the heap ranges from them), and the THP settings under
 * /sys/kernel/mm/transparent_hugepage: the one place memreclaim parses /proc figures.
 *
 * Pure C, no Python objects: these functions return raw numbers in bytes and errno values.
 */
#define _GNU_SOURCE
#include "memreclaim.h"

#include <errno.h>
#include <stdio.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Bumped in every child after fork(). A kept /proc/self/statm descriptor keeps naming the parent
 * (the kernel resolves "self" at open), so readers compare generations and reopen. */
static atomic_ulong fork_generation = 1;
static pthread_once_t procfs_once = PTHREAD_ONCE_INIT;
static int64_t page_size = 4096;

/* Serialises every use of every kept statm descriptor (one per module instance, that is one per
 * interpreter). The GIL cannot do it: free-threaded builds have none, and interpreters with their
 * own GIL share nothing but this process. One process-wide lock rather than one per mr_statm, so
 * the fork handlers below can reach it: it is held around a pread of a few bytes (or an
 * open/close), never around a call that could wait for another lock. */
static pthread_mutex_t statm_lock = PTHREAD_MUTEX_INITIALIZER;

/* fork() while another thread holds statm_lock would leave the lock held forever in the child
 * (that thread does not exist there) and the mr_statm it was updating half-written. So the forking
 * thread takes the lock first (prepare) and both sides release it after: the child gets a
 * consistent mr_statm and a free lock. */
static void before_fork(void)
{
    (void)pthread_mutex_lock(&statm_lock);
}

static void after_fork_in_parent(void)
{
    (void)pthread_mutex_unlock(&statm_lock);
}

static void after_fork_in_child(void)
{
    atomic_fetch_add_explicit(&fork_generation, 1, memory_order_relaxed);
    (void)pthread_mutex_unlock(&statm_lock);
}

static void procfs_init_once(void)
{
    long size = sysconf(_SC_PAGESIZE);
    if (size > 0) {
        page_size = size;
    }
    /* If registration fails the kept descriptor could report the parent after a fork and the lock
     * could be inherited held; there is no way to report that here, so readers then never keep a
     * descriptor nor take the lock (see mr_statm_read). */
    if (pthread_atfork(before_fork, after_fork_in_parent, after_fork_in_child) != 0) {
        atomic_store(&fork_generation, 0);
    }
}

void mr_procfs_global_init(void)
{
    (void)pthread_once(&procfs_once, procfs_init_once);
}

unsigned long mr_fork_generation(void)
{
    return atomic_load_explicit(&fork_generation, memory_order_relaxed);
}

void mr_statm_init(mr_statm *statm)
{
    statm->fd = -1;
    statm->generation = 0;
    statm->dev = statm->ino = 0;
}

/* Whether statm->fd is still the descriptor we opened (not closed and its number reused). */
static int statm_is_ours(const mr_statm *statm)
{
    struct stat st;
    return fstat(statm->fd, &st) == 0 && (uint64_t)st.st_dev == statm->dev &&
           (uint64_t)st.st_ino == statm->ino;
}

static void statm_close_locked(mr_statm *statm)
{
    if (statm->fd >= 0 && statm_is_ours(statm)) {
        (void)close(statm->fd);
    }
    statm->fd = -1;
}

/* Parse an unsigned decimal number, skipping leading blanks; advances *cursor. */
static int parse_u64(const char **cursor, const char *end, uint64_t *out)
{
    const char *p = *cursor;
    uint64_t value = 0;
    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }
    if (p >= end || *p < '0' || *p > '9') {
        return -1;
    }
    while (p < end && *p >= '0' && *p <= '9') {
        value = value * 10 + (uint64_t)(*p - '0');
        p++;
    }
    *cursor = p;
    *out = value;
    return 0;
}

/* Open /proc/self/statm into *statm, recording what identifies it. Returns 0 or an errno. */
static int statm_open(mr_statm *statm, unsigned long generation)
{
    struct stat st;
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    if (fstat(fd, &st) != 0) {
        int saved = errno;
        (void)close(fd);
        return saved;
    }
    statm->fd = fd;
    statm->dev = (uint64_t)st.st_dev;
    statm->ino = (uint64_t)st.st_ino;
    statm->generation = generation;
    return 0;
}

/* "size resident shared text lib data dt\n", in pages: seven numbers and a newline, nothing else
 * (anything else is not statm). Returns 0 or -1. */
static int parse_statm(const char *buf, ssize_t n, uint64_t fields[7])
{
    const char *p = buf;
    const char *end = buf + n;
    for (int i = 0; i < 7; i++) {
        if (parse_u64(&p, end, &fields[i]) != 0) {
            return -1;
        }
    }
    return p + 1 == end && *p == '\n' ? 0 : -1;
}

/* mr_statm_read's work; the caller holds statm_lock (or keeps no descriptor: generation 0). */
static int statm_read_locked(mr_statm *statm, unsigned long generation, mr_rss_sample *out)
{
    char buf[160];
    uint64_t fields[7];
    int err = EIO;

    if (statm->fd >= 0 && (statm->generation != generation || generation == 0)) {
        statm_close_locked(statm);
    }
    /* The program may have closed our descriptor and reused its number (a daemon closing what
     * it inherited), even for a file that reads like statm: the descriptor's identity is checked
     * (one fstat) before every read. Not ours any more: forget it (never close it), open ours
     * again. */
    if (statm->fd >= 0 && !statm_is_ours(statm)) {
        statm->fd = -1;
    }
    if (statm->fd < 0 && (err = statm_open(statm, generation)) != 0) {
        return err;
    }
    ssize_t n;
    do {
        n = pread(statm->fd, buf, sizeof(buf), 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0 || parse_statm(buf, n, fields) != 0) {
        err = n < 0 ? errno : EIO;
        if (n < 0) {
            (void)close(statm->fd);
            statm->fd = -1;
        }
        return err;
    }
    out->resident = (int64_t)fields[1] * page_size;
    out->anon = fields[1] > fields[2] ? (int64_t)(fields[1] - fields[2]) * page_size : 0;
    out->vsize = (int64_t)fields[0] * page_size;
    if (generation == 0) {
        statm_close_locked(statm); /* no fork notification: never keep the descriptor */
    }
    return 0;
}

int mr_statm_read(mr_statm *statm, mr_rss_sample *out)
{
    unsigned long generation = mr_fork_generation();
    int err;
    if (generation == 0) {
        /* No fork handlers, so the lock could have been inherited held: take none, and share
         * nothing: this read opens and closes a descriptor of its own. */
        mr_statm own;
        mr_statm_init(&own);
        err = statm_read_locked(&own, generation, out);
        statm_close_locked(&own); /* an unparsable read returns with it open */
        return err;
    }
    (void)pthread_mutex_lock(&statm_lock);
    /* Read the generation again under the lock: a fork in between bumped it in the child. */
    err = statm_read_locked(statm, mr_fork_generation(), out);
    (void)pthread_mutex_unlock(&statm_lock);
    return err;
}

void mr_statm_close(mr_statm *statm)
{
    if (mr_fork_generation() == 0) {
        statm_close_locked(statm); /* never kept open: nothing shared, no lock taken */
        return;
    }
    (void)pthread_mutex_lock(&statm_lock);
    statm_close_locked(statm);
    (void)pthread_mutex_unlock(&statm_lock);
}

/* Where one of our /proc files is: /proc/self/NAME for pid 0, else /proc/PID/NAME. */
static void proc_path(char *out, size_t size, int pid, const char *name)
{
    if (pid == 0) {
        (void)snprintf(out, size, "/proc/self/%s", name);
    } else {
        (void)snprintf(out, size, "/proc/%d/%s", pid, name);
    }
}

/* Open a /proc file; 0 or an errno. A missing file of a missing process is ESRCH, not ENOENT, so
 * callers can tell "no such process" from "this kernel has no such file". */
static int proc_open(int pid, const char *name, int *fd)
{
    char path[64];
    proc_path(path, sizeof(path), pid, name);
    *fd = open(path, O_RDONLY | O_CLOEXEC);
    if (*fd >= 0) {
        return 0;
    }
    int err = errno;
    if (err == ENOENT && pid != 0) {
        struct stat st;
        (void)snprintf(path, sizeof(path), "/proc/%d", pid);
        if (stat(path, &st) != 0 && errno == ENOENT) {
            err = ESRCH;
        }
    }
    return err;
}

/* Read fd up to size - 1 bytes into buf (not terminated), *used the count; 0 or an errno. */
static int read_fd_small(int fd, char *buf, size_t size, size_t *used)
{
    *used = 0;
    while (*used < size - 1) {
        ssize_t n = read(fd, buf + *used, size - 1 - *used);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return errno;
        }
        if (n == 0) {
            break;
        }
        *used += (size_t)n;
    }
    return 0;
}

/* Read up to size - 1 bytes of a /proc file into buf, NUL-terminated; 0 or an errno. */
static int proc_read_small(int pid, const char *name, char *buf, size_t size, size_t *used)
{
    int fd, err = proc_open(pid, name, &fd);
    *used = 0;
    if (err != 0) {
        return err;
    }
    err = read_fd_small(fd, buf, size, used);
    (void)close(fd);
    buf[*used] = '\0';
    return err;
}

typedef struct {
    const char *key; /* with its colon */
    size_t len;
    size_t offset;    /* of an int64_t in the output struct */
    int64_t multiply; /* 1024 for "kB" figures (the kernel's kB are KiB), 1 for counts */
} field_key;

/* "Key:   123 kB" lines: set each field of `keys` found in buf[0:used] (others stay as they
 * were). The whole line is looked at, so "Pss:" does not match "Pss_Anon:". */
static void parse_fields(const char *buf, size_t used, const field_key *keys, size_t nkeys,
                         void *out)
{
    const char *end = buf + used;
    for (const char *line = buf; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL) {
            eol = end;
        }
        for (size_t i = 0; i < nkeys; i++) {
            if ((size_t)(eol - line) > keys[i].len && memcmp(line, keys[i].key, keys[i].len) == 0) {
                const char *p = line + keys[i].len;
                uint64_t value;
                if (parse_u64(&p, eol, &value) == 0) {
                    *(int64_t *)(void *)((char *)out + keys[i].offset) =
                        (int64_t)value * keys[i].multiply;
                }
                break;
            }
        }
        line = eol + 1;
    }
}

/* A field_key for "Key:" (with its colon) and member of struct type: in bytes (the kernel's kB are
 * KiB), or a count. */
#define KB_FIELD(key, type, member) {key, sizeof(key) - 1, offsetof(type, member), 1024}
#define COUNT_FIELD(key, type, member) {key, sizeof(key) - 1, offsetof(type, member), 1}

/* Read /proc/PID/name into buf[0:size] (*used bytes) and set each field of `keys` in out from it,
 * -1 where the file has none (or could not be read). 0 or an errno. */
static int proc_read_fields(int pid, const char *name, char *buf, size_t size, size_t *used,
                            const field_key *keys, size_t nkeys, void *out)
{
    int err;
    for (size_t i = 0; i < nkeys; i++) {
        *(int64_t *)(void *)((char *)out + keys[i].offset) = -1;
    }
    err = proc_read_small(pid, name, buf, size, used);
    if (err == 0) {
        parse_fields(buf, *used, keys, nkeys, out);
    }
    return err;
}

/* The fields we take from /proc/PID/status, in the order of mr_status. */
static const field_key status_keys[] = {
    KB_FIELD("VmRSS:", mr_status, rss),           KB_FIELD("RssAnon:", mr_status, rss_anon),
    KB_FIELD("RssFile:", mr_status, rss_file),    KB_FIELD("RssShmem:", mr_status, rss_shmem),
    KB_FIELD("VmHWM:", mr_status, peak_rss),      KB_FIELD("VmSwap:", mr_status, swap),
    KB_FIELD("VmSize:", mr_status, virtual_size), COUNT_FIELD("Threads:", mr_status, threads),
};

int mr_status_read(int pid, mr_status *out)
{
    char buf[8192]; /* the fields come first; a long Groups: line must not push Threads: out */
    size_t used;
    int err = proc_read_fields(pid, "status", buf, sizeof(buf), &used, status_keys,
                               sizeof(status_keys) / sizeof(status_keys[0]), out);

    out->name[0] = '\0';
    if (err != 0) {
        return err;
    }
    if (used > 5 && memcmp(buf, "Name:", 5) == 0) { /* always the first line */
        const char *p = buf + 5;
        const char *eol = memchr(p, '\n', used - 5);
        size_t len;
        while (*p == ' ' || *p == '\t') {
            p++;
        }
        len = eol == NULL || eol < p ? 0 : (size_t)(eol - p);
        if (len >= sizeof(out->name)) {
            len = sizeof(out->name) - 1;
        }
        memcpy(out->name, p, len);
        out->name[len] = '\0';
    }
    if (pid == 0 && out->rss < 0) {
        return EIO; /* not a status file we understand (another pid may be a kernel thread) */
    }
    return 0;
}

static const field_key rollup_keys[] = {
    KB_FIELD("Pss:", mr_rollup, pss),
    KB_FIELD("Private_Dirty:", mr_rollup, private_dirty),
    KB_FIELD("Shared_Clean:", mr_rollup, shared_clean),
    KB_FIELD("Anonymous:", mr_rollup, anonymous),
    KB_FIELD("AnonHugePages:", mr_rollup, anon_huge_pages),
};

int mr_rollup_read(int pid, mr_rollup *out)
{
    char buf[4096]; /* about 1 KiB: a header line and some 20 fields */
    size_t used;
    int err = proc_read_fields(pid, "smaps_rollup", buf, sizeof(buf), &used, rollup_keys,
                               sizeof(rollup_keys) / sizeof(rollup_keys[0]), out);

    if (err != 0) {
        return err;
    }
    return out->pss < 0 ? EIO : 0;
}

/* ---- /proc/PID/stat and status: who a process is --------------------------------------------- */

/* Read `name` under the open /proc/PID directory `dir` into buf[0:size], NUL-terminated (*used
 * bytes); 0 or an errno. A file missing under a process's directory means the process has gone:
 * ESRCH. */
static int proc_read_at(int dir, const char *name, char *buf, size_t size, size_t *used)
{
    int err, fd = openat(dir, name, O_RDONLY | O_CLOEXEC);
    *used = 0;
    buf[0] = '\0';
    if (fd < 0) {
        return errno == ENOENT ? ESRCH : errno;
    }
    err = read_fd_small(fd, buf, size, used);
    (void)close(fd);
    buf[*used] = '\0';
    return err;
}

/* Field 22 of /proc/PID/stat (starttime, in clock ticks after boot). The fields are counted after
 * the LAST ')': the command in parentheses (field 2) may hold ')', blanks and newlines. The field
 * must end in a blank (field 23 follows), so a cut read is not taken for a number. 0 or EIO. */
static int stat_start_time(const char *buf, size_t used, int64_t *out)
{
    const char *end = buf + used;
    const char *p = memrchr(buf, ')', used);
    uint64_t value;
    if (p == NULL) {
        return EIO;
    }
    p++;
    for (int field = 3; field < 22; field++) {
        while (p < end && *p == ' ') {
            p++;
        }
        if (p >= end || *p == '\n') {
            return EIO;
        }
        while (p < end && *p != ' ' && *p != '\n') {
            p++;
        }
    }
    if (parse_u64(&p, end, &value) != 0 || p >= end || *p != ' ' || value > INT64_MAX) {
        return EIO;
    }
    *out = (int64_t)value;
    return 0;
}

/* The effective uid: the second of the four numbers of status's "Uid:" line. 0 or EIO. */
static int status_effective_uid(const char *buf, size_t used, int64_t *out)
{
    const char *end = buf + used;
    for (const char *line = buf; line < end;) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        if (eol == NULL) {
            eol = end;
        }
        if (eol - line > 4 && memcmp(line, "Uid:", 4) == 0) {
            const char *p = line + 4;
            uint64_t real, effective;
            if (parse_u64(&p, eol, &real) != 0 || parse_u64(&p, eol, &effective) != 0 || p >= eol ||
                (*p != '\t' && *p != ' ') || effective > UINT32_MAX) {
                return EIO;
            }
            *out = (int64_t)effective;
            return 0;
        }
        line = eol + 1;
    }
    return EIO;
}

int mr_identity_read(int pid, mr_identity *out, const char **failed)
{
    char path[32], buf[4096]; /* stat is one line of some 300 bytes; Uid: is status's 9th line */
    size_t used;
    int dir, err;

    *failed = NULL;
    proc_path(path, sizeof(path), pid, ".");
    dir = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir < 0) {
        return errno == ENOENT ? ESRCH : errno;
    }
    /* Both files through the one directory descriptor: it stays bound to the process it was
     * opened for, so a pid reused between the two reads gives ESRCH, never two processes' mix. */
    *failed = "stat";
    err = proc_read_at(dir, "stat", buf, sizeof(buf), &used);
    if (err == 0) {
        err = stat_start_time(buf, used, &out->start_time);
    }
    if (err == 0) {
        *failed = "status";
        err = proc_read_at(dir, "status", buf, sizeof(buf), &used);
    }
    if (err == 0) {
        err = status_effective_uid(buf, used, &out->uid);
    }
    (void)close(dir);
    if (err == 0) {
        *failed = NULL;
    }
    return err;
}

/* ---- /proc/PID/maps: lines and their fields -------------------------------------------------- */

int mr_lines_read(int fd, char *buf, size_t size, mr_line_fn fn, void *ctx)
{
    size_t used = 0;
    int skipping = 0; /* inside a line longer than buf (a long path): it is dropped */

    for (;;) {
        ssize_t n = read(fd, buf + used, size - used);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0) {
            return errno;
        }
        if (n == 0) { /* a last line without its newline */
            return used > 0 ? fn(ctx, skipping ? NULL : buf, skipping ? 0 : used) : 0;
        }
        used += (size_t)n;
        const char *line = buf;
        const char *end = buf + used;
        const char *eol;
        while ((eol = memchr(line, '\n', (size_t)(end - line))) != NULL) {
            int err = fn(ctx, skipping ? NULL : line, skipping ? 0 : (size_t)(eol - line));
            if (err != 0) {
                return err;
            }
            skipping = 0;
            line = eol + 1;
        }
        used = (size_t)(end - line);
        if (used == size) { /* no newline in a whole buffer */
            skipping = 1;
            used = 0;
        } else {
            memmove(buf, line, used);
        }
    }
}

int mr_self_lines(const char *name, const char *path, char *buf, size_t size, mr_line_fn fn,
                  void *ctx)
{
    int fd, err;
    if (path != NULL) {
        fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            return errno;
        }
    } else if ((err = proc_open(0, name, &fd)) != 0) {
        return err;
    }
    err = mr_lines_read(fd, buf, size, fn, ctx);
    (void)close(fd);
    return err;
}

int mr_kb_line(const char *line, size_t len, const char *key, int64_t *bytes)
{
    size_t key_len = strlen(key);
    const char *p;
    uint64_t value;
    if (line == NULL || len <= key_len || memcmp(line, key, key_len) != 0) {
        return -1;
    }
    p = line + key_len;
    if (parse_u64(&p, line + len, &value) != 0 || value > (uint64_t)INT64_MAX / 1024) {
        return -1;
    }
    *bytes = (int64_t)value * 1024;
    return 0;
}

int mr_self_exe(char *out, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", out, size - 1);
    if (n < 0) {
        return errno;
    }
    out[n] = '\0';
    return n > 0 ? 0 : ENOENT;
}

/* A hexadecimal number ending at `stop` (which is consumed). */
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

int mr_maps_parse(const char *line, size_t len, mr_maps_entry *out)
{
    const char *p = line, *end = line + len;
    uint64_t inode = 0;
    int device_none;

    if (hex_u64(&p, end, '-', &out->start) != 0 || hex_u64(&p, end, ' ', &out->end) != 0 ||
        end - p < 5 || out->end <= out->start) {
        return EIO;
    }
    memcpy(out->perms, p, 4);
    p += 4;
    if (*p != ' ' || (p++, skip_field(&p, end)) != 0) {
        return EIO; /* perms, offset */
    }
    device_none = end - p >= 6 && memcmp(p, "00:00 ", 6) == 0;
    if (skip_field(&p, end) != 0) { /* dev */
        return EIO;
    }
    for (; p < end && *p >= '0' && *p <= '9'; p++) {
        inode = inode * 10 + (uint64_t)(*p - '0');
    }
    while (p < end && *p == ' ') {
        p++;
    }
    out->anonymous = device_none && inode == 0;
    out->name = p;
    out->name_len = (size_t)(end - p);
    return 0;
}

/* mr_heap_mapping_read's line: add the size of the [heap] mapping to *ctx. */
static int heap_line(void *ctx, const char *line, size_t len)
{
    static const char heap[] = "[heap]";
    int64_t *total = ctx;
    mr_maps_entry entry;

    if (line != NULL && mr_maps_parse(line, len, &entry) == 0 &&
        entry.name_len == sizeof(heap) - 1 && memcmp(entry.name, heap, sizeof(heap) - 1) == 0) {
        *total = (*total < 0 ? 0 : *total) + (int64_t)(entry.end - entry.start);
    }
    return 0; /* a line we do not understand is not the heap: the others still count */
}

int mr_heap_mapping_read(int pid, int64_t *out)
{
    char buf[8192];
    int fd, err = proc_open(pid, "maps", &fd);

    *out = -1;
    if (err != 0) {
        return err;
    }
    err = mr_lines_read(fd, buf, sizeof(buf), heap_line, out);
    (void)close(fd);
    return err;
}

/* ---- transparent huge pages: /sys/kernel/mm/transparent_hugepage ----------------------------- */

/* Read a small sysfs file (path = dir + "/" + name) into buf, NUL-terminated, trailing newline
 * dropped. Returns 0, ENOENT when the file does not exist, or another errno. */
static int sysfs_read_small(const char *dir, const char *name, char *buf, size_t size)
{
    char path[512];
    size_t used = 0;
    int fd, err;

    if ((size_t)snprintf(path, sizeof(path), "%s/%s", dir, name) >= sizeof(path)) {
        return ENAMETOOLONG;
    }
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        return errno;
    }
    err = read_fd_small(fd, buf, size, &used);
    (void)close(fd);
    while (used > 0 && (buf[used - 1] == '\n' || buf[used - 1] == ' ')) {
        used--;
    }
    buf[used] = '\0';
    return err;
}

/* The bracketed word of "always [madvise] never" into word (size bytes). 0, or EIO when there is
 * no bracketed word or it does not fit. */
static int bracketed_word(const char *text, char *word, size_t size)
{
    const char *open_bracket = strchr(text, '[');
    const char *close_bracket = open_bracket == NULL ? NULL : strchr(open_bracket, ']');
    size_t len;
    if (close_bracket == NULL) {
        return EIO;
    }
    len = (size_t)(close_bracket - open_bracket - 1);
    if (len == 0 || len >= size) {
        return EIO;
    }
    memcpy(word, open_bracket + 1, len);
    word[len] = '\0';
    return 0;
}

/* A bracketed-word file: 0 with *word set, 0 with word "" when the file is missing, or an errno
 * (the file's name copied to failed). */
static int thp_word(const char *dir, const char *name, char *word, size_t size, char *failed,
                    size_t failed_size)
{
    char buf[128];
    int err = sysfs_read_small(dir, name, buf, sizeof(buf));
    word[0] = '\0';
    if (err == ENOENT) {
        return 0;
    }
    if (err == 0) {
        err = bracketed_word(buf, word, size);
    }
    if (err != 0) {
        (void)snprintf(failed, failed_size, "%s/%s", dir, name);
    }
    return err;
}

/* A decimal file: 0 with *value set, 0 with -1 when the file is missing, or an errno. */
static int thp_number(const char *dir, const char *name, int64_t *value, char *failed,
                      size_t failed_size)
{
    char buf[64];
    uint64_t number;
    const char *p = buf;
    int err = sysfs_read_small(dir, name, buf, sizeof(buf));
    *value = -1;
    if (err == ENOENT) {
        return 0;
    }
    if (err == 0) {
        err = parse_u64(&p, buf + strlen(buf), &number) == 0 && *p == '\0' && number <= INT64_MAX
                  ? 0
                  : EIO;
    }
    if (err != 0) {
        (void)snprintf(failed, failed_size, "%s/%s", dir, name);
        return err;
    }
    *value = (int64_t)number;
    return 0;
}

/* The per-size directory of the PMD size ("hugepages-2048kB"), from hpage_pmd_size; "" when the
 * kernel has no per-size controls (before 6.8) or no hpage_pmd_size. */
static int pmd_enabled_name(const char *dir, int64_t *pmd_size, char *name, size_t size,
                            char *failed, size_t failed_size)
{
    int err = thp_number(dir, "hpage_pmd_size", pmd_size, failed, failed_size);
    name[0] = '\0';
    if (err == 0 && *pmd_size > 0) {
        (void)snprintf(name, size, "hugepages-%lldkB/enabled", (long long)(*pmd_size / 1024));
    }
    return err;
}

int mr_thp_settings_read(const char *dir, mr_thp_settings *out, char *failed, size_t failed_size)
{
    char pmd_name[64];
    int err;

    if (dir == NULL) {
        dir = MR_THP_SYSFS;
    }
    failed[0] = '\0';
    out->enabled[0] = out->defrag[0] = out->pmd_enabled[0] = '\0';
    out->pmd_size = out->max_ptes_none = out->scan_sleep_millisecs = -1;
    if ((err = thp_word(dir, "enabled", out->enabled, sizeof(out->enabled), failed, failed_size)) !=
            0 ||
        (err = thp_word(dir, "defrag", out->defrag, sizeof(out->defrag), failed, failed_size)) !=
            0 ||
        (err = thp_number(dir, "khugepaged/max_ptes_none", &out->max_ptes_none, failed,
                          failed_size)) != 0 ||
        (err = thp_number(dir, "khugepaged/scan_sleep_millisecs", &out->scan_sleep_millisecs,
                          failed, failed_size)) != 0 ||
        (err = pmd_enabled_name(dir, &out->pmd_size, pmd_name, sizeof(pmd_name), failed,
                                failed_size)) != 0) {
        return err;
    }
    if (pmd_name[0] != '\0') {
        err = thp_word(dir, pmd_name, out->pmd_enabled, sizeof(out->pmd_enabled), failed,
                       failed_size);
    }
    return err;
}

/* The mode governing PMD-size pages: the per-size word unless it is "inherit" (or absent). */
static mr_thp_mode mode_of(const char *enabled, const char *pmd_enabled)
{
    const char *word =
        pmd_enabled[0] != '\0' && strcmp(pmd_enabled, "inherit") != 0 ? pmd_enabled : enabled;
    if (enabled[0] == '\0') {
        return MR_THP_NONE; /* no transparent_hugepage/enabled: the kernel has no THP */
    }
    if (strcmp(word, "always") == 0) {
        return MR_THP_ALWAYS;
    }
    if (strcmp(word, "madvise") == 0) {
        return MR_THP_MADVISE;
    }
    return strcmp(word, "never") == 0 ? MR_THP_NEVER : MR_THP_OTHER;
}

mr_thp_mode mr_thp_settings_mode(const mr_thp_settings *settings)
{
    return mode_of(settings->enabled, settings->pmd_enabled);
}

/* hugepages-<PMD>kB/enabled under the default directory, found once: hpage_pmd_size is fixed at
 * boot. "" when the kernel has none (or it could not be read: then only `enabled` counts, which is
 * what the per-size file's default, "inherit", means). */
static char pmd_enabled_path[64];
static int64_t pmd_size_bytes = -1;
static pthread_once_t pmd_once = PTHREAD_ONCE_INIT;

static void pmd_init_once(void)
{
    char failed[MR_THP_PATH_MAX];
    (void)pmd_enabled_name(MR_THP_SYSFS, &pmd_size_bytes, pmd_enabled_path,
                           sizeof(pmd_enabled_path), failed, sizeof(failed));
}

int64_t mr_thp_pmd_size(void)
{
    (void)pthread_once(&pmd_once, pmd_init_once);
    return pmd_size_bytes;
}

/* The mode is read at every trim and stats(): a good reading is kept for a second (an
 * administrator's change shows a second late at most), so a trim costs no sysfs read. The two
 * atomics are not updated together: a reader may pair a new time with the mode before it, a
 * mode at most a second old. */
static _Atomic int64_t thp_mode_read_at = -1; /* CLOCK_MONOTONIC_COARSE ms, -1: none kept */
static _Atomic int thp_mode_kept = MR_THP_NONE;

static int64_t coarse_ms(void)
{
    struct timespec now;
    if (clock_gettime(CLOCK_MONOTONIC_COARSE, &now) != 0) {
        return -1;
    }
    return (int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

int mr_thp_mode_read(mr_thp_mode *mode, char *failed, size_t failed_size)
{
    char enabled[16], pmd_enabled[16] = "";
    int err;
    int64_t now = coarse_ms(), kept_at = atomic_load(&thp_mode_read_at);

    failed[0] = '\0';
    if (now >= 0 && kept_at >= 0 && now - kept_at < 1000) {
        *mode = (mr_thp_mode)atomic_load(&thp_mode_kept);
        return 0;
    }
    (void)pthread_once(&pmd_once, pmd_init_once);
    *mode = MR_THP_NONE;
    err = thp_word(MR_THP_SYSFS, "enabled", enabled, sizeof(enabled), failed, failed_size);
    if (err == 0 && enabled[0] != '\0' && pmd_enabled_path[0] != '\0') {
        err = thp_word(MR_THP_SYSFS, pmd_enabled_path, pmd_enabled, sizeof(pmd_enabled), failed,
                       failed_size);
    }
    if (err == 0) {
        *mode = mode_of(enabled, pmd_enabled);
        atomic_store(&thp_mode_kept, (int)*mode);
        atomic_store(&thp_mode_read_at, now);
    }
    return err;
}

const char *mr_thp_mode_name(mr_thp_mode mode)
{
    switch (mode) {
    case MR_THP_ALWAYS:
        return "always";
    case MR_THP_MADVISE:
        return "madvise";
    case MR_THP_NEVER:
        return "never";
    case MR_THP_OTHER:
        return "other";
    case MR_THP_NONE:
        break;
    }
    return NULL;
}

/* The self-test of memreclaim._pools, run by enable() in a forked child.
 *
 * With the wrapper installed, the child (1) allocates small blocks until pymalloc asks for an
 * arena, which teaches the wrapper pymalloc's arena call site; (2) fills pools of many size
 * classes with patterns and checks the pool headers of live blocks against the layout;
 * (3) frees most blocks, runs a pass and checks that survivors are intact, the allocated block
 * count unchanged, and released pools marked and no longer resident; (4) allocates into the
 * released pools again and checks everything; (5) runs a second pass. Any failure, crash or
 * hang of the child refuses enable() with the reason. The parent waits with the GIL released.
 */
#include "_pools.h"

#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define SELFTEST_TIMEOUT_MS 30000
#define LEARN_LIMIT ((size_t)64 << 20) /* bytes the child may allocate to see an arena */
#define LEARN_BLOCK 256
#define TEST_SIZES 30     /* size classes exercised: requests of 16k - 8 bytes, k = 1..30 */
#define POOLS_PER_SIZE 3  /* pools filled per size class */
#define MAX_RELEASED 8192 /* released pools remembered for the reuse check */

typedef struct {
    unsigned char *ptr;
    size_t size;
    unsigned int seed;
} test_block;

typedef struct {
    int fd;
    mrp_report report;
    test_block *blocks;
    size_t n, capacity;
    uintptr_t *released;
    size_t nreleased;
    void **learn_chain;
} child;

static _Noreturn void child_exit(child *c, int ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4), noreturn));

static _Noreturn void child_exit(child *c, int ok, const char *fmt, ...)
{
    va_list args;
    va_start(args, fmt);
    vsnprintf(c->report.message, sizeof(c->report.message), fmt, args);
    va_end(args);
    c->report.ok = ok;
    /* A whole copy: gcc -O1 with ASan takes &c->report for its first member and refuses the
     * write (-Wstringop-overread). One write of under PIPE_BUF bytes to a pipe is atomic. */
    mrp_report whole;
    memcpy(&whole, &c->report, sizeof(whole));
    ssize_t unused = write(c->fd, &whole, sizeof(whole));
    (void)unused;
    _exit(ok ? 0 : 1);
}

static unsigned char pattern(unsigned int seed, size_t i)
{
    return (unsigned char)(seed * 31u + i * 7u + 1u);
}

static void fill(const test_block *b)
{
    for (size_t i = 0; i < b->size; i++) {
        b->ptr[i] = pattern(b->seed, i);
    }
}

static int intact(const test_block *b)
{
    for (size_t i = 0; i < b->size; i++) {
        if (b->ptr[i] != pattern(b->seed, i)) {
            return 0;
        }
    }
    return 1;
}

static void check_all(child *c, const char *when)
{
    for (size_t i = 0; i < c->n; i++) {
        if (!intact(&c->blocks[i])) {
            child_exit(c, 0, "self-test: a block changed %s", when);
        }
    }
}

static size_t blocks_per_size(unsigned int k)
{
    return POOLS_PER_SIZE * (MRP_POOL_BODY / (MRP_ALIGNMENT * k)) + 5;
}

/* 1. Small blocks until pymalloc requests an arena: its call site is new_arena's. */
static void learn_arena_site(child *c)
{
    unsigned long long recorded = mrp_proc.arenas_recorded;
    size_t learnt = 0;
    while (mrp_proc.arenas_recorded == recorded && learnt < LEARN_LIMIT) {
        void **block = PyObject_Malloc(LEARN_BLOCK);
        if (block == NULL) {
            child_exit(c, 0, "self-test: PyObject_Malloc failed");
        }
        *block = c->learn_chain;
        c->learn_chain = block;
        learnt += LEARN_BLOCK;
    }
    if (mrp_proc.arenas_recorded == recorded) {
        child_exit(c, 0,
                   "pymalloc is not serving PyObject_Malloc: no 1 MiB arena was requested from "
                   "CPython while the self-test allocated %zu MiB of small blocks (or enable() "
                   "was called after more than that had been freed)",
                   learnt >> 20);
    }
    c->report.caller = mrp_proc.last_caller;
    mrp_proc.arena_caller = mrp_proc.last_caller;
    mrp_table_keep_caller(mrp_proc.arena_caller);
}

/* Allocate blocks of every test size, filled with patterns; returns those in released pools. */
static size_t allocate_round(child *c, unsigned int salt)
{
    size_t in_released = 0;
    for (unsigned int k = 1; k <= TEST_SIZES; k++) {
        for (size_t j = 0; j < blocks_per_size(k) && c->n < c->capacity; j++) {
            test_block *b = &c->blocks[c->n];
            b->size = MRP_ALIGNMENT * k - 8;
            b->ptr = PyObject_Malloc(b->size);
            if (b->ptr == NULL) {
                child_exit(c, 0, "self-test: PyObject_Malloc failed");
            }
            b->seed = (unsigned int)c->n + salt;
            fill(b);
            c->n++;
            uintptr_t pool = (uintptr_t)b->ptr & ~MRP_POOL_MASK;
            for (size_t r = 0; r < c->nreleased; r++) {
                if (c->released[r] == pool) {
                    const mrp_pool_header *header = (const mrp_pool_header *)pool;
                    if (header->szidx >= MRP_NB_SIZE_CLASSES ||
                        header->maxnextoffset != MRP_POOL_SIZE - mrp_class_size(header->szidx)) {
                        child_exit(c, 0, "self-test: a reused pool was not re-initialised");
                    }
                    in_released++;
                    break;
                }
            }
        }
    }
    return in_released;
}

/* 2. The header of a live block's pool names a size class that holds the request. */
static void check_layout(child *c)
{
    size_t tracked = 0;
    for (size_t i = 0; i < c->n; i++) {
        const test_block *b = &c->blocks[i];
        uintptr_t pool = (uintptr_t)b->ptr & ~MRP_POOL_MASK;
        if (!mrp_table_contains(pool)) {
            continue;
        }
        tracked++;
        const mrp_pool_header *header = (const mrp_pool_header *)pool;
        if (header->szidx >= MRP_NB_SIZE_CLASSES || header->ref.count == 0) {
            child_exit(c, 0,
                       "self-test: the pool header of a live block does not match the layout "
                       "(szidx %u, count %u)",
                       header->szidx, header->ref.count);
        }
        unsigned int size = mrp_class_size(header->szidx);
        uintptr_t offset = (uintptr_t)b->ptr - pool;
        uintptr_t start = MRP_POOL_OVERHEAD + (offset - MRP_POOL_OVERHEAD) / size * size;
        if (offset < MRP_POOL_OVERHEAD || header->maxnextoffset != MRP_POOL_SIZE - size ||
            offset + b->size > start + size) {
            child_exit(c, 0,
                       "self-test: pool size or block layout differs from %u KiB pools with a "
                       "%u-byte header",
                       (unsigned int)(MRP_POOL_SIZE >> 10), MRP_POOL_OVERHEAD);
        }
    }
    if (tracked < c->n / 2) {
        child_exit(c, 0, "self-test: only %zu of %zu test blocks are in recorded arenas", tracked,
                   c->n);
    }
}

/* 3. Free every block of odd size steps and 4 in 5 of the others (of every fourth size step,
 * only blocks on the first page of their pool stay, so pools holding live blocks have pages to
 * give back); release; check. */
static void free_and_release(child *c)
{
    size_t kept = 0;
    for (size_t i = 0; i < c->n; i++) {
        size_t k = (c->blocks[i].size + 8) / MRP_ALIGNMENT;
        int first_page = ((uintptr_t)c->blocks[i].ptr & MRP_POOL_MASK) < MRP_PAGE_SIZE;
        if (k % 2 == 1 || i % 5 != 0 || (k % 4 == 2 && !first_page)) {
            PyObject_Free(c->blocks[i].ptr);
        } else {
            c->blocks[kept++] = c->blocks[i];
        }
    }
    c->n = kept;
    Py_ssize_t (*allocated_blocks)(void) =
        (Py_ssize_t(*)(void))dlsym(RTLD_DEFAULT, "_Py_GetAllocatedBlocks");
    Py_ssize_t before = allocated_blocks ? allocated_blocks() : 0;
    mrp_pass pass;
    mrp_run_pass(0, -1, NULL, &pass);
    Py_ssize_t after = allocated_blocks ? allocated_blocks() : 0;
    if (pass.arenas_skipped != 0) {
        child_exit(c, 0, "self-test: %lld of %lld recorded arenas failed validation",
                   pass.arenas_skipped, pass.arenas_scanned);
    }
    if (pass.pools_released == 0) {
        child_exit(c, 0, "self-test: no empty pool was released");
    }
    if (pass.used_pools_trimmed == 0) {
        child_exit(c, 0, "self-test: no page of a pool holding live blocks was released");
    }
    if (before != after) {
        child_exit(c, 0, "self-test: the reclaim changed the allocated block count");
    }
    c->report.pools_released = pass.pools_released;
    check_all(c, "during the release");
}

/* Released pools are marked and their body is gone; remember them for the reuse check. */
static void check_one_released(child *c, uintptr_t base)
{
    unsigned char resident[MRP_ARENA_PAGES];
    if (mincore((void *)base, MRP_ARENA_SIZE, resident) != 0) {
        child_exit(c, 0, "self-test: mincore failed: %s", strerror(errno));
    }
    for (uintptr_t pool = mrp_first_pool(base); pool + MRP_POOL_SIZE <= base + MRP_ARENA_SIZE;
         pool += MRP_POOL_SIZE) {
        size_t page = (pool - base) / MRP_PAGE_SIZE;
        if (!(resident[page] & 1)) {
            break;
        }
        if (((const mrp_pool_header *)pool)->szidx != MRP_DUMMY_SIZE_IDX) {
            continue;
        }
        for (size_t p = 1; p < MRP_POOL_PAGES; p++) {
            if (resident[page + p] & 1) {
                child_exit(c, 0, "self-test: a released pool is still resident");
            }
        }
        if (c->nreleased < MAX_RELEASED) {
            c->released[c->nreleased++] = pool;
        }
    }
}

static void check_released(child *c)
{
    for (uintptr_t base = mrp_table_next(0); base != 0; base = mrp_table_next(base + 1)) {
        check_one_released(c, base);
    }
    if (c->nreleased == 0) {
        child_exit(c, 0, "self-test: no pool is marked released");
    }
}

/* Runs in the forked child with the GIL held. Never returns. */
static _Noreturn void run_child(int fd)
{
    child c;
    memset(&c, 0, sizeof(c));
    c.fd = fd;
    learn_arena_site(&c);
    for (unsigned int k = 1; k <= TEST_SIZES; k++) {
        c.capacity += 2 * blocks_per_size(k);
    }
    c.blocks = calloc(c.capacity, sizeof(test_block));
    c.released = calloc(MAX_RELEASED, sizeof(uintptr_t));
    if (c.blocks == NULL || c.released == NULL) {
        child_exit(&c, 0, "self-test: out of memory");
    }
    allocate_round(&c, 0);
    check_layout(&c);
    free_and_release(&c);
    check_released(&c);
    /* 4. Reuse. */
    if (allocate_round(&c, 7919) == 0) {
        child_exit(&c, 0, "self-test: no block was allocated in a released pool");
    }
    check_all(&c, "after reuse");
    /* 5. A second pass after reuse must validate too. */
    mrp_pass pass;
    mrp_run_pass(0, -1, NULL, &pass);
    if (pass.arenas_skipped != 0) {
        child_exit(&c, 0, "self-test: an arena failed validation after reuse");
    }
    check_all(&c, "after the second pass");
    for (size_t i = 0; i < c.n; i++) {
        PyObject_Free(c.blocks[i].ptr);
    }
    while (c.learn_chain != NULL) {
        void **next = *c.learn_chain;
        PyObject_Free(c.learn_chain);
        c.learn_chain = next;
    }
    child_exit(&c, 1, "ok");
}

/* Read the child's report until it is complete, the pipe closes, or the deadline passes.
 * Called with the GIL released. Returns the bytes read; *timed_out says why it stopped. */
static size_t read_report(int fd, mrp_report *report, int *timed_out)
{
    size_t got = 0;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    long long deadline = mrp_now_ns() + (long long)SELFTEST_TIMEOUT_MS * 1000000LL;
    *timed_out = 0;
    while (got < sizeof(*report)) {
        long long left_ms = (deadline - mrp_now_ns()) / 1000000LL;
        if (left_ms <= 0) {
            *timed_out = 1;
            break;
        }
        int ready = poll(&pfd, 1, (int)left_ms);
        if (ready < 0 && errno == EINTR) {
            continue;
        }
        if (ready <= 0) {
            *timed_out = ready == 0;
            break;
        }
        ssize_t r = read(fd, (char *)report + got, sizeof(*report) - got);
        if (r < 0 && errno == EINTR) {
            continue;
        }
        if (r <= 0) {
            break;
        }
        got += (size_t)r;
    }
    return got;
}

int mrp_run_selftest(mrp_report *report)
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
        run_child(fds[1]);
    }
    close(fds[1]);
    memset(report, 0, sizeof(*report));
    size_t got;
    int timed_out, status = 0;
    Py_BEGIN_ALLOW_THREADS;
    got = read_report(fds[0], report, &timed_out);
    if (timed_out) {
        kill(pid, SIGKILL);
    }
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    Py_END_ALLOW_THREADS;
    close(fds[0]);
    if (timed_out) {
        mrp_set_reason("self-test child did not finish within %d s", SELFTEST_TIMEOUT_MS / 1000);
        return -1;
    }
    if (WIFSIGNALED(status)) {
        mrp_set_reason("self-test child died from signal %d: the pymalloc layout is not the "
                       "expected one",
                       WTERMSIG(status));
        return -1;
    }
    if (got != sizeof(*report)) {
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

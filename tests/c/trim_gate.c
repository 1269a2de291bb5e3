/* A gate in malloc_trim, preloaded by tests/test_memory.py to prove that trim() lets other Python
 * threads run while the allocator works, without timing anything.
 *
 * With MEMRECLAIM_TEST_TRIM_GATE="ENTERED,ANSWER,TIMEOUT_MS" set, each malloc_trim call writes a
 * byte to fd ENTERED, then waits (poll, at most TIMEOUT_MS) for a byte on fd ANSWER before it
 * calls glibc's malloc_trim. The test's other Python thread blocks reading ENTERED and writes
 * ANSWER when it gets the byte: it can only do that if it can take the GIL, i.e. if the caller of
 * malloc_trim released it. A caller that keeps the GIL (the control: ctypes.PyDLL) makes the gate
 * time out; trim_gate_passed / trim_gate_timeouts count the outcomes and a time-out is also said
 * on stderr. Unset, malloc_trim passes straight through.
 *
 * memreclaim takes glibc's functions from the object that serves malloc; the test names this one
 * with the core's seam MEMRECLAIM_TEST_MALLOC_SYMBOL=malloc_trim (as tests/test_core_semantics.py
 * does), so it also passes gnu_get_libc_version on: detection then says "glibc" and trim() calls
 * this malloc_trim. (A library that merely interposes malloc_trim above glibc is not the
 * allocator, by design: without the seam, detection would say "unknown".)
 *
 * Built by tests/test_memory.py: cc -shared -fPIC -O1 -o libtrimgate.so trim_gate.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

int trim_gate_passed;
int trim_gate_timeouts;

/* glibc's definition of `name`: the next one after this library. */
static void *next(const char *name)
{
    void *address = dlsym(RTLD_NEXT, name);
    if (address == NULL) {
        fprintf(stderr, "trim_gate: no %s after this library\n", name);
        abort();
    }
    return address;
}

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Announce the call on `entered`, then wait for a byte on `answer` until the deadline. */
static void gate(int entered, int answer, int timeout_ms)
{
    long long deadline = now_ms() + timeout_ms;
    char byte = 'e';
    if (write(entered, &byte, 1) != 1) {
        perror("trim_gate: write to the entered fd");
        abort();
    }
    for (;;) {
        long long left = deadline - now_ms();
        struct pollfd ready = {.fd = answer, .events = POLLIN};
        int n = poll(&ready, 1, left > 0 ? (int)left : 0);
        if (n > 0) {
            if (read(answer, &byte, 1) == 1) {
                __atomic_add_fetch(&trim_gate_passed, 1, __ATOMIC_SEQ_CST);
                return;
            }
            perror("trim_gate: read from the answer fd");
            abort();
        }
        if (n < 0 && errno != EINTR) {
            perror("trim_gate: poll");
            abort();
        }
        if (n == 0 || now_ms() >= deadline) {
            __atomic_add_fetch(&trim_gate_timeouts, 1, __ATOMIC_SEQ_CST);
            fprintf(stderr,
                    "trim_gate: no answer within %d ms: no other thread ran while "
                    "malloc_trim was called\n",
                    timeout_ms);
            return;
        }
    }
}

int malloc_trim(size_t pad)
{
    const char *spec = getenv("MEMRECLAIM_TEST_TRIM_GATE");
    int entered, answer, timeout_ms;
    if (spec != NULL && sscanf(spec, "%d,%d,%d", &entered, &answer, &timeout_ms) == 3) {
        gate(entered, answer, timeout_ms);
    }
    return ((int (*)(size_t))next("malloc_trim"))(pad);
}

const char *gnu_get_libc_version(void)
{
    return ((const char *(*)(void))next("gnu_get_libc_version"))();
}

/* Seed 002 in C: 1,000,000 blocks of 100 bytes, free all but every KEEP-th, then malloc_trim(0).
 *
 *   cc -O2 -pthread -o shrink shrink.c && ./shrink THREADS KEEP TRIM
 *
 * THREADS threads each allocate and free their share of the blocks (so each gets its own glibc
 * arena). KEEP 0 frees every block. TRIM 1 calls malloc_trim(0) at the end. Prints one JSON line
 * with the resident bytes (from /proc/self/statm) after each step. Writes "MARK trim" and
 * "MARK done" to stderr around malloc_trim, so that an strace of madvise and write can count
 * the madvise calls made by the trim alone.
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCKS 1000000L
#define BLOCK_SIZE 100

static void **blocks;
static long keep_every;

struct slice {
    long start, end;
};

static long rss_bytes(void)
{
    long pages_total = 0, pages_resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f == NULL) {
        return -1;
    }
    if (fscanf(f, "%ld %ld", &pages_total, &pages_resident) != 2) {
        pages_resident = -1;
    }
    fclose(f);
    return pages_resident < 0 ? -1 : pages_resident * sysconf(_SC_PAGESIZE);
}

static void *allocate(void *arg)
{
    struct slice *s = arg;
    for (long i = s->start; i < s->end; i++) {
        blocks[i] = malloc(BLOCK_SIZE);
        if (blocks[i] == NULL) {
            abort();
        }
        memset(blocks[i], 1, BLOCK_SIZE);
    }
    return NULL;
}

static void *release(void *arg)
{
    struct slice *s = arg;
    for (long i = s->start; i < s->end; i++) {
        if (keep_every == 0 || i % keep_every != 0) {
            free(blocks[i]);
            blocks[i] = NULL;
        }
    }
    return NULL;
}

static void in_threads(int nthreads, void *(*fn)(void *), struct slice *slices)
{
    pthread_t tid[64];
    for (int t = 0; t < nthreads; t++) {
        if (pthread_create(&tid[t], NULL, fn, &slices[t]) != 0) {
            abort();
        }
    }
    for (int t = 0; t < nthreads; t++) {
        pthread_join(tid[t], NULL);
    }
}

int main(int argc, char **argv)
{
    if (argc != 4) {
        fprintf(stderr, "usage: %s THREADS KEEP_EVERY TRIM\n", argv[0]);
        return 2;
    }
    int nthreads = atoi(argv[1]);
    keep_every = atol(argv[2]);
    int trim = atoi(argv[3]);
    if (nthreads < 1 || nthreads > 64 || keep_every < 0) {
        fprintf(stderr, "THREADS must be 1..64 and KEEP_EVERY >= 0\n");
        return 2;
    }
    struct slice slices[64];
    for (int t = 0; t < nthreads; t++) {
        slices[t].start = BLOCKS * t / nthreads;
        slices[t].end = BLOCKS * (t + 1) / nthreads;
    }
    long start = rss_bytes();
    blocks = calloc(BLOCKS, sizeof(void *));
    if (blocks == NULL) {
        return 1;
    }
    /* Each thread frees what it allocated, in the same thread, as in the write-up. */
    in_threads(nthreads, allocate, slices);
    long after_malloc = rss_bytes();
    in_threads(nthreads, release, slices);
    long after_free = rss_bytes();
    long after_trim = after_free;
    if (trim) {
        static const char mark[] = "MARK trim\n", done[] = "MARK done\n";
        (void)!write(2, mark, sizeof mark - 1);
        malloc_trim(0);
        (void)!write(2, done, sizeof done - 1);
        after_trim = rss_bytes();
    }
    printf("{\"threads\": %d, \"keep_every\": %ld, \"start\": %ld, \"after_malloc\": %ld,"
           " \"after_free\": %ld, \"after_trim\": %ld}\n",
           nthreads, keep_every, start, after_malloc, after_free, after_trim);
    return 0;
}

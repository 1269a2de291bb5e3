/* A C library that leaks, for the leak-attribution tests (tests/test_diagnosis_native.py) and
 * benchmarks/bench_plugin_peers.py: leaky_call(count) makes count calls of leaky_keep_record,
 * which mallocs 1 KiB, fills it and never frees it.
 *
 * Built by both: cc -O1 -shared -fPIC -o libmrleaky.so mr_leaky.c
 */
#include <stdlib.h>
#include <string.h>
void *leaky_keep_record(size_t n)
{
    void *p = malloc(n);
    if (p)
        memset(p, 1, n);
    return p;
}
void leaky_call(int count)
{
    for (int i = 0; i < count; i++)
        leaky_keep_record(1024);
}

/* tool-membw: the machine's read bandwidth with the default thread count (or -t N), the
 * ceiling `make bench` divides by. Prints "bytes_s <bytes per second>" and a readable line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/kern.h"

int main(int argc, char **argv)
{
    int threads = 0;
    for (int i = 1; i + 1 < argc; i++)
        if (!strcmp(argv[i], "-t"))
            threads = atoi(argv[i + 1]);
    struct kern_pool *pool;
    if (kern_pool_new(&pool, threads) != 0)
        return 1;
    double gbs = kern_bench_bandwidth(pool, (size_t)512 << 20);
    printf("bytes_s %.0f\n", gbs * 1e9);
    fprintf(stderr, "read bandwidth %.2f GB/s with %d threads\n", gbs, kern_pool_threads(pool));
    kern_pool_free(pool);
    return gbs > 0 ? 0 : 1;
}

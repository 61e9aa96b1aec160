/* kern_bench_bandwidth: the machine's read bandwidth as the pool sees it, the ceiling that
 * per-token generation (every weight read once) cannot beat. */
#include <stdlib.h>
#include <time.h>

#include "kernels/internal.h"
#include "util/util.h"

struct bw_job {
    const uint64_t *buf;
    size_t words;
    uint64_t sink[64];
};

static void bw_task(void *ctx, int ith, int nth)
{
    struct bw_job *j = ctx;
    size_t a = j->words * ith / nth, b = j->words * (ith + 1) / nth;
    uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    for (size_t i = a; i + 4 <= b; i += 4) {
        s0 += j->buf[i];
        s1 += j->buf[i + 1];
        s2 += j->buf[i + 2];
        s3 += j->buf[i + 3];
    }
    j->sink[ith & 63] = s0 + s1 + s2 + s3;
}

double kern_bench_bandwidth(struct kern_pool *p, size_t bytes)
{
    if (bytes < (1 << 20))
        bytes = 1 << 20;
    uint64_t *buf = NULL;
    if (posix_memalign((void **)&buf, 4096, bytes) != 0)
        return 0;
    for (size_t i = 0; i < bytes / 8; i++)
        buf[i] = i;
    struct bw_job j = {.buf = buf, .words = bytes / 8};
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = util_now_s();
        kern__pool_run(p, bw_task, &j);
        double gbs = (double)bytes / (util_now_s() - t0) / 1e9;
        best = gbs > best ? gbs : best;
    }
    free(buf);
    return best;
}

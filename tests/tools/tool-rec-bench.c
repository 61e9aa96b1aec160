/* tool-rec-bench — what the ring's record layer costs: seal one frame of BYTES bytes (header
 * included) and open it again through a frame reader, as a link's two ends do, ITERS times.
 * Prints "ns_per_frame N" (seal + open, best of 5 rounds) for tests/bench.sh.
 *
 * usage: tool-rec-bench BYTES [ITERS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "net/net.h"
#include "ring/ring.h"
#include "util/err.h"
#include "util/util.h"

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: tool-rec-bench BYTES [ITERS]\n");
        return 2;
    }
    long bytes = atol(argv[1]), iters = argc > 2 ? atol(argv[2]) : 2000;
    if (bytes < (long)RING_HDR_LEN || bytes > (1l << 26) || iters < 1) {
        fprintf(stderr, "BYTES in [%u, 64 MiB], ITERS >= 1\n", RING_HDR_LEN);
        return 2;
    }
    uint8_t key[32] = {1};
    struct ring_rec *tx, *rx;
    if (ring_rec_new(&tx, key) < 0 || ring_rec_new(&rx, key) < 0)
        return 1;
    size_t plen = (size_t)bytes - RING_HDR_LEN;
    uint8_t *rec = malloc(RING_REC_OVERHEAD + (size_t)bytes), *frame = calloc(1, (size_t)bytes);
    struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_ACT, .n_tokens = 1,
                              .payload_len = (uint32_t)plen};
    ring_frame_hdr_encode(&h, frame);
    struct ring_frame_reader rd;
    ring_frame_reader_init(&rd, (uint32_t)plen);
    char err[KV_ERR_MAX];
    double best = 0;
    for (int round = 0; round < 5; round++) {
        uint64_t t0 = util_now_ns();
        for (long i = 0; i < iters; i++) {
            memcpy(rec + 4, frame, (size_t)bytes);   /* a link copies the frame in as well */
            ring_rec_seal(tx, rec, (size_t)bytes);
            ring_frame_reader_push(&rd, rec, RING_REC_OVERHEAD + (size_t)bytes);
            const uint8_t *pl;
            struct ring_frame_hdr g;
            if (ring_rec_next(rx, &rd, &g, &pl, err, sizeof err) != 1) {
                fprintf(stderr, "open failed: %s\n", err);
                return 1;
            }
        }
        double ns = (double)(util_now_ns() - t0) / (double)iters;
        if (best == 0 || ns < best)
            best = ns;
    }
    printf("ns_per_frame %.0f\n", best);
    ring_frame_reader_free(&rd);
    ring_rec_free(tx);
    ring_rec_free(rx);
    free(rec);
    free(frame);
    return 0;
}

/* fuzz-frame — libFuzzer target for what a ring peer controls: the frame decoder (streamed in
 * input-chosen pieces), HELLO/OPEN payload decoding, the handshake state machine (fed the
 * decoded frames as a stage would feed them), the manifest validator, and the record layer:
 * the peer's plaintext (u16 length-prefixed pieces) sealed under a fixed key and opened again
 * through a streaming reader, so whatever a keyed peer seals meets the frame decoder behind it.
 * The first byte picks the mode; the rest is the peer's byte stream (or the manifest).
 * fuzz-modules: util wtype net ring */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvd/kvd.h"
#include "ring/ring.h"
#include "net/net.h"
#include "tests/lib/fuzz_scratch.h"
#include "util/err.h"

static struct net_identity *id;

static void setup(void)
{
    if (id)
        return;
    char err[256];
    if (net_identity_load(&id, fuzz_scratch("frame"), err, sizeof err) < 0)
        abort();
}

/* Seal each u16-prefixed piece of data as one record, open the stream in step-byte pieces. */
static int fuzz_records(const uint8_t *data, size_t size, size_t step)
{
    static const uint8_t key[32] = {7};
    struct ring_rec *tx, *rx;
    if (ring_rec_new(&tx, key) < 0)
        return 0;
    if (ring_rec_new(&rx, key) < 0) {
        ring_rec_free(tx);
        return 0;
    }
    uint8_t *stream = malloc(size / 2 * RING_REC_OVERHEAD + size + RING_REC_OVERHEAD);
    size_t len = 0;
    for (size_t off = 0; stream && off + 2 <= size;) {
        size_t n = (size_t)(data[off] | data[off + 1] << 8);
        off += 2;
        if (n > size - off)
            n = size - off;
        memcpy(stream + len + 4, data + off, n);
        if (ring_rec_seal(tx, stream + len, n) < 0)
            break;
        len += RING_REC_OVERHEAD + n;
        off += n;
    }
    struct ring_frame_reader r;
    ring_frame_reader_init(&r, 4096);
    char err[KV_ERR_MAX];
    int rc = 0;
    for (size_t off = 0; stream && off < len && rc >= 0;) {
        size_t n = len - off < step ? len - off : step;
        if (ring_frame_reader_push(&r, stream + off, n) < 0)
            break;
        off += n;
        struct ring_frame_hdr h;
        const uint8_t *p;
        while ((rc = ring_rec_next(rx, &r, &h, &p, err, sizeof err)) == 1)
            if (h.type == RING_F_OPEN && h.payload_len >= RING_OPEN_LEN) {
                struct ring_open_params op;
                ring_open_decode(p, &op);
            }
    }
    ring_frame_reader_free(&r);
    free(stream);
    ring_rec_free(tx);
    ring_rec_free(rx);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    setup();
    uint8_t mode = data[0] % 4, step = (uint8_t)(data[1] | 1);
    data += 2;
    size -= 2;
    char err[KV_ERR_MAX];
    if (mode == 2) {
        struct ring_manifest m;
        ring_manifest_parse(&m, (const char *)data, size, err, sizeof err);
        return 0;
    }
    if (mode == 3)
        return fuzz_records(data, size, step);
    struct ring_frame_reader r;
    ring_frame_reader_init(&r, mode == 0 ? 1u << 16 : 4096);
    struct ring_handshake *hs = NULL;
    if (mode == 1) {
        struct ring_hello mine = {.version = RING_VERSION, .rank = 0, .n_ranks = 2};
        snprintf(mine.ring, sizeof mine.ring, "fuzz");
        struct ring_hs_expect x = {.rank = 1, .n_ranks = 2, .ring = "fuzz"};
        ring_handshake_new(&hs, id, &mine, &x, RING_HS_DOWN);
    }
    bool done = false;
    for (size_t off = 0; off < size && !done;) {
        size_t n = size - off < step ? size - off : step;
        if (ring_frame_reader_push(&r, data + off, n) < 0)
            break;
        off += n;
        struct ring_frame_hdr h;
        const uint8_t *p;
        int rc;
        while (!done && (rc = ring_frame_reader_next(&r, &h, &p, err, sizeof err)) == 1) {
            if (h.type == RING_F_HELLO) {
                struct ring_hello hello;
                ring_hello_decode(p, h.payload_len, &hello, err, sizeof err);
            } else if (h.type == RING_F_OPEN && h.payload_len >= RING_OPEN_LEN) {
                struct ring_open_params op;
                ring_open_decode(p, &op);
            }
            if (hs) {
                const uint8_t *out;
                size_t outlen;
                int hr = ring_handshake_feed(hs, &h, p, &out, &outlen, err, sizeof err);
                if (hr != 0)
                    done = true;
            }
        }
        if (rc < 0)
            break;
    }
    ring_handshake_free(hs);
    ring_frame_reader_free(&r);
    return 0;
}

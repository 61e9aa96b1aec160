/* fuzz-frame — libFuzzer target for what a ring peer controls: the frame decoder (streamed in
 * input-chosen pieces), HELLO/OPEN payload decoding, the handshake state machine (fed the
 * decoded frames as a stage would feed them) and the manifest validator.
 * The first byte picks the mode; the rest is the peer's byte stream (or the manifest). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvd/kvd.h"
#include "ringlib/ring.h"
#include "net/net.h"
#include "util/err.h"

static struct net_identity *id;

static void setup(void)
{
    if (id)
        return;
    char dir[64], err[256];
    snprintf(dir, sizeof dir, "/tmp/kv-fuzz-frame-%d", (int)getpid());
    if (net_identity_load(&id, dir, err, sizeof err) < 0)
        abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    setup();
    uint8_t mode = data[0] % 3, step = (uint8_t)(data[1] | 1);
    data += 2;
    size -= 2;
    char err[KV_ERR_MAX];
    if (mode == 2) {
        struct ring_manifest m;
        ring_manifest_parse(&m, (const char *)data, size, err, sizeof err);
        return 0;
    }
    struct net_frame_reader r;
    net_frame_reader_init(&r, mode == 0 ? 1u << 16 : 4096);
    struct net_handshake *hs = NULL;
    if (mode == 1) {
        struct net_hello mine = {.version = NET_VERSION, .rank = 0, .n_ranks = 2};
        snprintf(mine.ring, sizeof mine.ring, "fuzz");
        struct net_hs_expect x = {.rank = 1, .n_ranks = 2, .ring = "fuzz"};
        net_handshake_new(&hs, id, &mine, &x, NET_HS_DOWN);
    }
    bool done = false;
    for (size_t off = 0; off < size && !done;) {
        size_t n = size - off < step ? size - off : step;
        if (net_frame_reader_push(&r, data + off, n) < 0)
            break;
        off += n;
        struct net_frame_hdr h;
        const uint8_t *p;
        int rc;
        while (!done && (rc = net_frame_reader_next(&r, &h, &p, err, sizeof err)) == 1) {
            if (h.type == NET_F_HELLO) {
                struct net_hello hello;
                net_hello_decode(p, h.payload_len, &hello, err, sizeof err);
            } else if (h.type == NET_F_OPEN && h.payload_len >= NET_OPEN_LEN) {
                struct net_open_params op;
                net_open_decode(p, &op);
            }
            if (hs) {
                const uint8_t *out;
                size_t outlen;
                int hr = net_handshake_feed(hs, &h, p, &out, &outlen, err, sizeof err);
                if (hr != 0)
                    done = true;
            }
        }
        if (rc < 0)
            break;
    }
    net_handshake_free(hs);
    net_frame_reader_free(&r);
    return 0;
}

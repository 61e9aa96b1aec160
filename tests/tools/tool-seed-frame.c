/* tool-seed-frame DIR — seed inputs for fuzz-frame: a valid frame stream, a HELLO + AUTH
 * exchange (mode 1), a manifest (mode 2) and frames to seal as records (mode 3). */
#include <stdio.h>
#include <string.h>

#include "net/net.h"
#include "ring/ring.h"
#include "tests/lib/fuzz_seed.h"

static void put(const char *dir, const char *name, const uint8_t *b, size_t n)
{
    fuzz_seed_put(dir, name, NULL, 0, b, n);
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    static uint8_t b[8192];
    size_t n = 2;
    b[0] = 0;
    b[1] = 7;
    struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_PING, .payload_len = 8};
    ring_frame_hdr_encode(&h, b + n);
    n += RING_HDR_LEN + 8;
    struct ring_open_params op = {.temperature = 0.8f, .top_p = 0.9f, .n_ctx = 64};
    h = (struct ring_frame_hdr){.magic = RING_MAGIC, .type = RING_F_OPEN, .session = 5, .n_tokens = 2,
                               .payload_len = RING_OPEN_LEN + 8};
    ring_frame_hdr_encode(&h, b + n);
    ring_open_encode(&op, b + n + RING_HDR_LEN);
    n += RING_HDR_LEN + RING_OPEN_LEN + 8;
    h = (struct ring_frame_hdr){.magic = RING_MAGIC, .type = RING_F_ACT, .flags = RING_FL_LAST, .session = 5,
                               .n_tokens = 1, .payload_len = 256};
    ring_frame_hdr_encode(&h, b + n);
    n += RING_HDR_LEN + 256;
    put(argv[1], "stream", b, n);
    b[0] = 1;
    n = 2;
    struct ring_hello hello = {.version = RING_VERSION, .rank = 1, .n_ranks = 2};
    snprintf(hello.ring, sizeof hello.ring, "fuzz");
    h = (struct ring_frame_hdr){.magic = RING_MAGIC, .type = RING_F_HELLO, .payload_len = RING_HELLO_LEN};
    ring_frame_hdr_encode(&h, b + n);
    ring_hello_encode(&hello, b + n + RING_HDR_LEN);
    n += RING_HDR_LEN + RING_HELLO_LEN;
    h = (struct ring_frame_hdr){.magic = RING_MAGIC, .type = RING_F_AUTH, .payload_len = RING_AUTH_LEN};
    ring_frame_hdr_encode(&h, b + n);
    n += RING_HDR_LEN + RING_AUTH_LEN;
    put(argv[1], "handshake", b, n);
    const char *man = "\x02\x01{\"version\":1,\"ring\":\"r\",\"model\":{\"arch\":\"llama\",\"n_layers\":4,\"n_embd\":8},"
                      "\"ranks\":[{\"rank\":0,\"layers\":[0,4],\"endpoint\":\"tcp://1.2.3.4:5\"}]}";
    put(argv[1], "manifest", (const uint8_t *)man, strlen(man));
    /* mode 3: u16-prefixed frames, each sealed as one record: a PING and an OPEN */
    b[0] = 3;
    b[1] = 5;
    n = 2;
    h = (struct ring_frame_hdr){.magic = RING_MAGIC, .type = RING_F_PING, .payload_len = 8};
    b[n] = RING_HDR_LEN + 8;
    b[n + 1] = 0;
    ring_frame_hdr_encode(&h, b + n + 2);
    memset(b + n + 2 + RING_HDR_LEN, 0, 8);
    n += 2 + RING_HDR_LEN + 8;
    h = (struct ring_frame_hdr){.magic = RING_MAGIC, .type = RING_F_OPEN, .session = 5, .n_tokens = 1,
                               .payload_len = RING_OPEN_LEN + 4};
    b[n] = RING_HDR_LEN + RING_OPEN_LEN + 4;
    b[n + 1] = 0;
    ring_frame_hdr_encode(&h, b + n + 2);
    ring_open_encode(&op, b + n + 2 + RING_HDR_LEN);
    memset(b + n + 2 + RING_HDR_LEN + RING_OPEN_LEN, 0, 4);
    n += 2 + RING_HDR_LEN + RING_OPEN_LEN + 4;
    put(argv[1], "records", b, n);
    return 0;
}

/* tool-seed-frame DIR — seed inputs for fuzz-frame: a valid frame stream, a HELLO + AUTH
 * exchange (mode 1), a manifest (mode 2) and frames to seal as records (mode 3). */
#include <stdio.h>
#include <string.h>

#include "net/net.h"

static void put(const char *dir, const char *name, const uint8_t *b, size_t n)
{
    char p[512];
    snprintf(p, sizeof p, "%s/seed-%s", dir, name);
    FILE *f = fopen(p, "wb");
    if (f) {
        fwrite(b, 1, n, f);
        fclose(f);
    }
}

int main(int argc, char **argv)
{
    if (argc != 2)
        return 2;
    static uint8_t b[8192];
    size_t n = 2;
    b[0] = 0;
    b[1] = 7;
    struct net_frame_hdr h = {.magic = NET_MAGIC, .type = NET_F_PING, .payload_len = 8};
    net_frame_hdr_encode(&h, b + n);
    n += NET_HDR_LEN + 8;
    struct net_open_params op = {.temperature = 0.8f, .top_p = 0.9f, .n_ctx = 64};
    h = (struct net_frame_hdr){.magic = NET_MAGIC, .type = NET_F_OPEN, .session = 5, .n_tokens = 2,
                               .payload_len = NET_OPEN_LEN + 8};
    net_frame_hdr_encode(&h, b + n);
    net_open_encode(&op, b + n + NET_HDR_LEN);
    n += NET_HDR_LEN + NET_OPEN_LEN + 8;
    h = (struct net_frame_hdr){.magic = NET_MAGIC, .type = NET_F_ACT, .flags = NET_FL_LAST, .session = 5,
                               .n_tokens = 1, .payload_len = 256};
    net_frame_hdr_encode(&h, b + n);
    n += NET_HDR_LEN + 256;
    put(argv[1], "stream", b, n);
    b[0] = 1;
    n = 2;
    struct net_hello hello = {.version = NET_VERSION, .rank = 1, .n_ranks = 2};
    snprintf(hello.ring, sizeof hello.ring, "fuzz");
    h = (struct net_frame_hdr){.magic = NET_MAGIC, .type = NET_F_HELLO, .payload_len = NET_HELLO_LEN};
    net_frame_hdr_encode(&h, b + n);
    net_hello_encode(&hello, b + n + NET_HDR_LEN);
    n += NET_HDR_LEN + NET_HELLO_LEN;
    h = (struct net_frame_hdr){.magic = NET_MAGIC, .type = NET_F_AUTH, .payload_len = NET_AUTH_LEN};
    net_frame_hdr_encode(&h, b + n);
    n += NET_HDR_LEN + NET_AUTH_LEN;
    put(argv[1], "handshake", b, n);
    const char *man = "\x02\x01{\"version\":1,\"ring\":\"r\",\"model\":{\"arch\":\"llama\",\"n_layers\":4,\"n_embd\":8},"
                      "\"ranks\":[{\"rank\":0,\"layers\":[0,4],\"endpoint\":\"tcp://1.2.3.4:5\"}]}";
    put(argv[1], "manifest", (const uint8_t *)man, strlen(man));
    /* mode 3: u16-prefixed frames, each sealed as one record: a PING and an OPEN */
    b[0] = 3;
    b[1] = 5;
    n = 2;
    h = (struct net_frame_hdr){.magic = NET_MAGIC, .type = NET_F_PING, .payload_len = 8};
    b[n] = NET_HDR_LEN + 8;
    b[n + 1] = 0;
    net_frame_hdr_encode(&h, b + n + 2);
    memset(b + n + 2 + NET_HDR_LEN, 0, 8);
    n += 2 + NET_HDR_LEN + 8;
    h = (struct net_frame_hdr){.magic = NET_MAGIC, .type = NET_F_OPEN, .session = 5, .n_tokens = 1,
                               .payload_len = NET_OPEN_LEN + 4};
    b[n] = NET_HDR_LEN + NET_OPEN_LEN + 4;
    b[n + 1] = 0;
    net_frame_hdr_encode(&h, b + n + 2);
    net_open_encode(&op, b + n + 2 + NET_HDR_LEN);
    memset(b + n + 2 + NET_HDR_LEN + NET_OPEN_LEN, 0, 4);
    n += 2 + NET_HDR_LEN + NET_OPEN_LEN + 4;
    put(argv[1], "records", b, n);
    return 0;
}

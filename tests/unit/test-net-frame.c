/* test-net-frame — ring frames, the streaming reader (every truncation point), OPEN/HELLO
 * payloads, node identities, the handshake (success and every mismatch). The manifest
 * validator and the wire encoding are tested in test-ring-manifest.c and test-ring-wire.c. */
#include <errno.h>

#include "kvd/stage/internal.h"
#include "kvd/kvd.h"
#include "net/net.h"
#include "ring/ring.h"
#include "tests/lib/t.h"
#include "util/util.h"
#include "util/err.h"

static char err[KV_ERR_MAX];

T_CASE(hdr_roundtrip_and_checks)
{
    struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_ACT, .flags = RING_FL_LAST,
                              .session = 0x0123456789abcdefull, .pos = 7, .n_tokens = 3, .payload_len = 768};
    uint8_t b[RING_HDR_LEN], c[RING_HDR_LEN];
    ring_frame_hdr_encode(&h, b);
    T_CHECK(b[0] == 'K' && b[1] == 'V' && b[2] == 'R' && b[3] == '1', "magic bytes %02x%02x%02x%02x", b[0], b[1], b[2], b[3]);
    T_CHECK(b[8] == 0xef && b[15] == 0x01, "session little-endian");
    struct ring_frame_hdr g;
    T_ASSERT(ring_frame_hdr_decode(b, &g, 1024, err, sizeof err) == 0, "%s", err);
    T_CHECK(g.session == h.session && g.pos == 7 && g.n_tokens == 3 && g.payload_len == 768 &&
            g.type == RING_F_ACT && g.flags == RING_FL_LAST, "fields round trip");
    T_CHECK(ring_frame_hdr_decode(b, &g, 767, err, sizeof err) == -EMSGSIZE && strstr(err, "768") &&
            strstr(err, "767"), "cap: %s", err);
    memcpy(c, b, sizeof b);
    c[0] = 'X';
    T_CHECK(ring_frame_hdr_decode(c, &g, 1024, err, sizeof err) == -EPROTO && strstr(err, "magic"), "%s", err);
    memcpy(c, b, sizeof b);
    c[4] = 0;
    T_CHECK(ring_frame_hdr_decode(c, &g, 1024, err, sizeof err) == -EPROTO && strstr(err, "type 0"), "%s", err);
    c[4] = RING_F_MAX + 1;
    T_CHECK(ring_frame_hdr_decode(c, &g, 1024, err, sizeof err) == -EPROTO, "type past the last");
    memcpy(c, b, sizeof b);
    c[6] = 1;
    T_CHECK(ring_frame_hdr_decode(c, &g, 1024, err, sizeof err) == -EPROTO && strstr(err, "reserved"), "%s", err);
    memcpy(c, b, sizeof b);
    c[5] = 0x80;
    T_CHECK(ring_frame_hdr_decode(c, &g, 1024, err, sizeof err) == -EPROTO && strstr(err, "flags"), "%s", err);
    h.payload_len = 0xffffffffu;
    ring_frame_hdr_encode(&h, c);
    T_CHECK(ring_frame_hdr_decode(c, &g, 0xffffffffu, err, sizeof err) == -EMSGSIZE, "hard cap applies: %s", err);
}

/* Three frames; fed whole, byte by byte, and cut at every point. */
T_CASE(reader_every_split)
{
    uint8_t stream[3 * RING_HDR_LEN + 5 + 0 + 300];
    size_t off = 0;
    uint32_t lens[3] = {5, 0, 300};
    for (int i = 0; i < 3; i++) {
        struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_PING + (i == 1), .session = (uint64_t)i + 1,
                                  .payload_len = lens[i]};
        ring_frame_hdr_encode(&h, stream + off);
        off += RING_HDR_LEN;
        for (uint32_t k = 0; k < lens[i]; k++)
            stream[off++] = (uint8_t)(k * 7 + (unsigned)i);
    }
    T_ASSERT(off == sizeof stream, "stream size");
    for (size_t cut = 0; cut <= sizeof stream; cut++) {
        struct ring_frame_reader r;
        ring_frame_reader_init(&r, 4096);
        int got = 0;
        struct ring_frame_hdr h;
        const uint8_t *p;
        size_t parts[2][2] = {{0, cut}, {cut, sizeof stream - cut}};
        for (int part = 0; part < 2; part++) {
            T_ASSERT(ring_frame_reader_push(&r, stream + parts[part][0], parts[part][1]) == 0, "push");
            int rc;
            while ((rc = ring_frame_reader_next(&r, &h, &p, err, sizeof err)) == 1) {
                T_CHECK(h.session == (uint64_t)got + 1 && h.payload_len == lens[got], "frame %d at cut %zu", got, cut);
                for (uint32_t k = 0; k < h.payload_len; k++)
                    if (p[k] != (uint8_t)(k * 7 + (unsigned)got)) {
                        T_CHECK(0, "payload byte %u of frame %d at cut %zu", k, got, cut);
                        break;
                    }
                got++;
            }
            T_CHECK(rc == 0, "no error at cut %zu: %s", cut, err);
        }
        T_CHECK(got == 3, "3 frames at cut %zu, got %d", cut, got);
        ring_frame_reader_free(&r);
    }
    /* byte by byte */
    struct ring_frame_reader r;
    ring_frame_reader_init(&r, 4096);
    int got = 0;
    for (size_t i = 0; i < sizeof stream; i++) {
        struct ring_frame_hdr h;
        const uint8_t *p;
        ring_frame_reader_push(&r, stream + i, 1);
        while (ring_frame_reader_next(&r, &h, &p, err, sizeof err) == 1)
            got++;
    }
    T_CHECK(got == 3, "byte by byte: %d frames", got);
    ring_frame_reader_free(&r);
    /* an oversized frame is refused from its header alone */
    ring_frame_reader_init(&r, 100);
    struct ring_frame_hdr h;
    const uint8_t *p;
    ring_frame_reader_push(&r, stream + RING_HDR_LEN + 5 + RING_HDR_LEN, RING_HDR_LEN);
    T_CHECK(ring_frame_reader_next(&r, &h, &p, err, sizeof err) == -EMSGSIZE, "300 > cap 100: %s", err);
    ring_frame_reader_free(&r);
}

T_CASE(open_and_hello_payloads)
{
    struct ring_open_params a = {.seed = 0xfeedfacecafebeefull, .temperature = 0.8f, .top_p = 0.9f,
                                .min_p = 0.05f, .repeat_penalty = 1.1f, .top_k = 40, .penalty_last_n = 64,
                                .max_tokens = 99, .n_ctx = 512}, b;
    uint8_t buf[RING_OPEN_LEN];
    ring_open_encode(&a, buf);
    ring_open_decode(buf, &b);
    T_CHECK(b.seed == a.seed && b.temperature == a.temperature && b.top_p == a.top_p && b.min_p == a.min_p &&
            b.top_k == 40 && b.penalty_last_n == 64 && b.max_tokens == 99 && b.n_ctx == 512, "OPEN round trip");
    struct ring_hello h = {.version = RING_VERSION, .rank = 2, .n_ranks = 3}, g;
    snprintf(h.ring, sizeof h.ring, "ring-1");
    for (int i = 0; i < 32; i++)
        h.node_key[i] = (uint8_t)i, h.manifest_hash[i] = (uint8_t)(i + 1), h.nonce[i] = (uint8_t)(i + 2);
    uint8_t hb[RING_HELLO_LEN];
    ring_hello_encode(&h, hb);
    T_ASSERT(ring_hello_decode(hb, sizeof hb, &g, err, sizeof err) == 0, "%s", err);
    T_CHECK(!strcmp(g.ring, "ring-1") && g.rank == 2 && g.n_ranks == 3 && !memcmp(g.nonce, h.nonce, 32), "HELLO");
    T_CHECK(ring_hello_decode(hb, sizeof hb - 1, &g, err, sizeof err) == -EPROTO, "short HELLO");
    hb[12 + 10] = 'x';   /* a byte after the NUL padding starts */
    T_CHECK(ring_hello_decode(hb, sizeof hb, &g, err, sizeof err) == -EPROTO && strstr(err, "ring id"), "%s", err);
    hb[12 + 10] = 0;
    hb[12] = 0x07;
    T_CHECK(ring_hello_decode(hb, sizeof hb, &g, err, sizeof err) == -EPROTO, "control byte in the ring id");
}

T_CASE(identity)
{
    char d[300];
    snprintf(d, sizeof d, "%s/id1", t_tmpdir());
    struct net_identity *a, *b;
    T_ASSERT(net_identity_load(&a, d, err, sizeof err) == 0, "%s", err);
    T_ASSERT(net_identity_load(&b, d, err, sizeof err) == 0, "%s", err);
    T_CHECK(!memcmp(net_identity_pub(a), net_identity_pub(b), 32), "the key persists in the state dir");
    uint8_t sig[64];
    T_ASSERT(net_identity_sign(a, "hello", 5, sig) == 0, "sign");
    T_CHECK(net_sig_verify(net_identity_pub(b), "hello", 5, sig), "verify");
    T_CHECK(!net_sig_verify(net_identity_pub(b), "hellp", 5, sig), "altered message");
    sig[3] ^= 1;
    T_CHECK(!net_sig_verify(net_identity_pub(b), "hello", 5, sig), "altered signature");
    char hex[65];
    uint8_t back[32];
    util_hex_encode(net_identity_pub(a), 32, hex);
    T_CHECK(util_hex_decode(hex, back, 32) == 0 && !memcmp(back, net_identity_pub(a), 32), "hex round trip");
    T_CHECK(util_hex_decode("zz", back, 1) < 0 && util_hex_decode(hex, back, 31) < 0, "bad hex");
    net_identity_free(a);
    net_identity_free(b);
}

/* Run a handshake between A (rank 0, the up side) and B (rank 1, down) with A's HELLO
 * optionally altered. */
struct hs_pair {
    struct net_identity *ia, *ib;
    struct ring_handshake *a, *b;
    int ra, rb;
    char ea[KV_ERR_MAX], eb[KV_ERR_MAX];
    struct ring_link_keys ka, kb;     /* the session keys, when established */
    enum ring_hs_side side_b;         /* B's side (RING_HS_DOWN unless a case says otherwise) */
    const uint8_t *b_expect;         /* set: B expects this key instead, set before A's HELLO */
    int b_expect_late;               /* ring_handshake_expect_key on B after A's HELLO */
};

static int feed_frame(struct ring_handshake *to, const uint8_t *bytes, size_t len, const uint8_t **out,
                      size_t *outlen, char *e)
{
    struct ring_frame_hdr h;
    if (ring_frame_hdr_decode(bytes, &h, 4096, e, KV_ERR_MAX) < 0)
        return -EPROTO;
    return ring_handshake_feed(to, &h, bytes + RING_HDR_LEN, out, outlen, e, KV_ERR_MAX);
}

static void hs_run(struct hs_pair *p, const char *ring_a, uint32_t rank_a, int flip_hash, bool key_check,
                   bool tamper_auth)
{
    struct ring_hello ha = {.rank = rank_a, .n_ranks = 2};
    struct ring_hello hb = {.rank = 1, .n_ranks = 2};
    snprintf(ha.ring, sizeof ha.ring, "%s", ring_a);
    snprintf(hb.ring, sizeof hb.ring, "R");
    memset(ha.manifest_hash, 7, 32);
    memset(hb.manifest_hash, 7, 32);
    ha.manifest_hash[0] ^= (uint8_t)flip_hash;
    struct ring_hs_expect xa = {.rank = 1, .n_ranks = 2, .ring = "R"}, xb = {.rank = 0, .n_ranks = 2, .ring = "R"};
    memset(xa.manifest_hash, 7, 32);
    memset(xb.manifest_hash, 7, 32);
    if (key_check) {
        xb.check_key = true;
        memcpy(xb.node_key, net_identity_pub(p->ib), 32);   /* B expects its own key: A's is "unknown" */
    }
    ring_handshake_new(&p->a, p->ia, &ha, &xa, RING_HS_UP);
    ring_handshake_new(&p->b, p->ib, &hb, &xb, p->side_b ? p->side_b : RING_HS_DOWN);
    if (p->b_expect)
        ring_handshake_expect_key(p->b, p->b_expect);
    const uint8_t *hello_a, *hello_b, *out;
    size_t la, lb, ol;
    ring_handshake_hello(p->a, &hello_a, &la);
    ring_handshake_hello(p->b, &hello_b, &lb);
    p->rb = feed_frame(p->b, hello_a, la, &out, &ol, p->eb);   /* B gets A's HELLO, answers AUTH */
    uint8_t any[32] = {0};
    p->b_expect_late = ring_handshake_expect_key(p->b, any);   /* too late: the HELLO was checked */
    uint8_t auth_b[RING_HDR_LEN + RING_AUTH_LEN];
    size_t lab = ol;
    if (ol)
        memcpy(auth_b, out, ol);
    p->ra = feed_frame(p->a, hello_b, lb, &out, &ol, p->ea);
    uint8_t auth_a[RING_HDR_LEN + RING_AUTH_LEN];
    size_t laa = ol;
    if (ol)
        memcpy(auth_a, out, ol);
    if (tamper_auth && laa)
        auth_a[RING_HDR_LEN + 5] ^= 1;
    if (p->rb == 0 && laa)
        p->rb = feed_frame(p->b, auth_a, laa, &out, &ol, p->eb);
    if (p->ra == 0 && lab)
        p->ra = feed_frame(p->a, auth_b, lab, &out, &ol, p->ea);
    memset(&p->ka, 0, sizeof p->ka);
    memset(&p->kb, 0, sizeof p->kb);
    if (p->ra == 1)
        ring_handshake_keys(p->a, &p->ka);
    if (p->rb == 1)
        ring_handshake_keys(p->b, &p->kb);
    ring_handshake_free(p->a);
    ring_handshake_free(p->b);
}

T_CASE(handshake)
{
    struct hs_pair p;
    char d[300];
    snprintf(d, sizeof d, "%s/ida", t_tmpdir());
    T_ASSERT(net_identity_load(&p.ia, d, err, sizeof err) == 0, "%s", err);
    snprintf(d, sizeof d, "%s/idb", t_tmpdir());
    T_ASSERT(net_identity_load(&p.ib, d, err, sizeof err) == 0, "%s", err);
    p.side_b = 0;
    p.b_expect = NULL;
    hs_run(&p, "R", 0, 0, false, false);
    T_CHECK(p.ra == 1 && p.rb == 1, "established both ways: %d %d (%s / %s)", p.ra, p.rb, p.ea, p.eb);
    /* one key per direction, agreed by both ends, fresh for every handshake */
    T_CHECK(!memcmp(p.ka.tx, p.kb.rx, 32) && !memcmp(p.ka.rx, p.kb.tx, 32), "keys agree");
    T_CHECK(memcmp(p.ka.tx, p.ka.rx, 32) != 0, "a key per direction");
    struct ring_link_keys first = p.ka;
    hs_run(&p, "R", 0, 0, false, false);
    T_CHECK(p.ra == 1 && memcmp(first.tx, p.ka.tx, 32) != 0, "fresh keys per handshake");
    /* both sides claiming the same end: each AUTH is signed for the wrong side */
    p.side_b = RING_HS_UP;
    hs_run(&p, "R", 0, 0, false, false);
    T_CHECK(p.ra == -EPERM && p.rb == -EPERM && strstr(p.eb, "bad signature"), "same side: %d %d %s",
            p.ra, p.rb, p.eb);
    p.side_b = 0;
    hs_run(&p, "other", 0, 0, false, false);
    T_CHECK(p.rb == -EPERM && strstr(p.eb, "wrong ring"), "%s", p.eb);
    hs_run(&p, "R", 1, 0, false, false);
    T_CHECK(p.rb == -EPERM && strstr(p.eb, "wrong rank 1, expected 0"), "%s", p.eb);
    hs_run(&p, "R", 0, 1, false, false);
    T_CHECK(p.rb == -EPERM && strstr(p.eb, "manifest hash"), "%s", p.eb);
    hs_run(&p, "R", 0, 0, true, false);
    T_CHECK(p.rb == -EPERM && strstr(p.eb, "node key"), "%s", p.eb);
    /* The key expected changed before the peer's HELLO (a rank a standby may serve): the
     * peer's key is accepted; after the HELLO it can no longer change. */
    p.b_expect = net_identity_pub(p.ia);
    hs_run(&p, "R", 0, 0, true, false);
    T_CHECK(p.ra == 1 && p.rb == 1 && p.b_expect_late == -EALREADY, "expected key changed: %d %d %d (%s)",
            p.ra, p.rb, p.b_expect_late, p.eb);
    uint8_t other[32];
    memset(other, 0x5a, 32);
    p.b_expect = other;
    hs_run(&p, "R", 0, 0, false, false);
    T_CHECK(p.rb == -EPERM && strstr(p.eb, "node key"), "a key expected that the peer does not hold: %s", p.eb);
    p.b_expect = NULL;
    hs_run(&p, "R", 0, 0, false, true);
    T_CHECK(p.rb == -EPERM && strstr(p.eb, "bad signature"), "%s", p.eb);
    /* AUTH before HELLO, and an ERROR from the peer */
    struct ring_handshake *h;
    struct ring_hello me = {.n_ranks = 2};
    struct ring_hs_expect x = {.rank = 1, .n_ranks = 2, .ring = ""};
    ring_handshake_new(&h, p.ia, &me, &x, RING_HS_UP);
    uint8_t f[RING_HDR_LEN + 64] = {0};
    struct ring_frame_hdr fh = {.magic = RING_MAGIC, .type = RING_F_AUTH, .payload_len = 64};
    ring_frame_hdr_encode(&fh, f);
    const uint8_t *out;
    size_t ol;
    char e[KV_ERR_MAX];
    T_CHECK(feed_frame(h, f, sizeof f, &out, &ol, e) == -EPROTO && strstr(e, "expected HELLO"), "%s", e);
    ring_handshake_free(h);
    ring_handshake_new(&h, p.ia, &me, &x, RING_HS_UP);
    fh.type = RING_F_ERROR;
    fh.payload_len = 4 + 5;
    ring_frame_hdr_encode(&fh, f);
    memcpy(f + RING_HDR_LEN + 4, "nope!", 5);
    T_CHECK(feed_frame(h, f, RING_HDR_LEN + 9, &out, &ol, e) == -ECONNREFUSED && strstr(e, "nope!"), "%s", e);
    T_CHECK(ring_handshake_refusal(h) && !strcmp(ring_handshake_refusal(h), "nope!"), "the refusal kept");
    ring_handshake_free(h);
    /* A hostile refusal: control bytes and a message as long as an ERROR may be. What is kept
     * (and logged, and passed on to a client) is printable and at most RING_REFUSAL_MAX. */
    ring_handshake_new(&h, p.ia, &me, &x, RING_HS_UP);
    T_CHECK(ring_handshake_refusal(h) == NULL, "no refusal before an ERROR");
    uint8_t *big = calloc(1, RING_HDR_LEN + 4 + RING_ERRMSG_MAX);
    fh.payload_len = 4 + RING_ERRMSG_MAX;
    ring_frame_hdr_encode(&fh, big);
    memset(big + RING_HDR_LEN + 4, 'x', RING_ERRMSG_MAX);
    memcpy(big + RING_HDR_LEN + 4, "\x1b[2J\x07\n\xc2\x9b ok", 11);
    T_CHECK(feed_frame(h, big, RING_HDR_LEN + 4 + RING_ERRMSG_MAX, &out, &ol, e) == -ECONNREFUSED, "%s", e);
    const char *rf = ring_handshake_refusal(h);
    T_ASSERT(rf != NULL, "a refusal");
    T_CHECK(strlen(rf) == RING_REFUSAL_MAX && !strcmp(rf + RING_REFUSAL_MAX - 3, "..."), "cut: %zu", strlen(rf));
    T_CHECK(!strncmp(rf, "?[2J???? ok", 11), "cleaned: %.20s", rf);
    for (const char *c = rf; *c; c++)
        T_CHECK(*c >= 0x20 && *c < 0x7f, "printable at %td", c - rf);
    T_CHECK(strlen(e) < KV_ERR_MAX && !strchr(e, 0x1b), "the error is cleaned too");
    free(big);
    ring_handshake_free(h);
    /* an older peer's HELLO (version 1, 172 bytes): a clear word about the version */
    ring_handshake_new(&h, p.ia, &me, &x, RING_HS_UP);
    uint8_t old[RING_HDR_LEN + 172] = {0};
    fh = (struct ring_frame_hdr){.magic = RING_MAGIC, .type = RING_F_HELLO, .payload_len = 172};
    ring_frame_hdr_encode(&fh, old);
    old[RING_HDR_LEN] = 1;
    T_CHECK(feed_frame(h, old, sizeof old, &out, &ol, e) == -EPROTO && strstr(e, "version 1") &&
            strstr(e, "speaks 4"), "%s", e);
    ring_handshake_free(h);
    /* versions 2 (HELLO of today's size, TOKEN frames of one token) and 3 (TOKEN leaves of
     * raw payloads, which a version-4 peer's receipts would not agree with): refused the same way */
    for (uint8_t v = 2; v <= 3; v++) {
        ring_handshake_new(&h, p.ia, &me, &x, RING_HS_UP);
        uint8_t v2[RING_HDR_LEN + RING_HELLO_LEN] = {0};
        char want[32];
        fh = (struct ring_frame_hdr){.magic = RING_MAGIC, .type = RING_F_HELLO, .payload_len = RING_HELLO_LEN};
        ring_frame_hdr_encode(&fh, v2);
        v2[RING_HDR_LEN] = v;
        snprintf(want, sizeof want, "version %u", v);
        T_CHECK(feed_frame(h, v2, sizeof v2, &out, &ol, e) == -EPROTO && strstr(e, want) &&
                strstr(e, "speaks 4"), "%s", e);
        ring_handshake_free(h);
    }
    /* our own HELLO reflected back (a peer copying it): refused before anything is signed */
    struct ring_hs_expect self = {.rank = 0, .n_ranks = 2, .ring = ""};
    ring_handshake_new(&h, p.ia, &me, &self, RING_HS_UP);
    const uint8_t *mine;
    size_t ml;
    ring_handshake_hello(h, &mine, &ml);
    uint8_t copy[RING_HDR_LEN + RING_HELLO_LEN];
    memcpy(copy, mine, sizeof copy);
    T_CHECK(feed_frame(h, copy, sizeof copy, &out, &ol, e) == -EPERM && ol == 0 && strstr(e, "reflects"),
            "%s", e);
    ring_handshake_free(h);
    net_identity_free(p.ia);
    net_identity_free(p.ib);
}

T_CASE(text_clean)
{
    char o[8];
    T_CHECK(util_text_clean(o, sizeof o, (const uint8_t *)"abc", 3) == 3 && !strcmp(o, "abc"), "%s", o);
    T_CHECK(util_text_clean(o, sizeof o, (const uint8_t *)"a\x1b\x7f\x80z", 5) == 5 && !strcmp(o, "a???z"), "%s", o);
    T_CHECK(util_text_clean(o, sizeof o, (const uint8_t *)"1234567", 7) == 7 && !strcmp(o, "1234567"), "fits: %s", o);
    T_CHECK(util_text_clean(o, sizeof o, (const uint8_t *)"12345678", 8) == 7 && !strcmp(o, "1234..."), "cut: %s", o);
    T_CHECK(util_text_clean(o, sizeof o, (const uint8_t *)"", 0) == 0 && o[0] == 0, "empty");
    T_CHECK(util_text_clean(o, 2, (const uint8_t *)"abc", 3) == 0 && o[0] == 0, "no room");
}

/* Seal n frames of growing size with tx into one stream. */
static size_t seal_stream(struct ring_rec *tx, uint8_t *stream, int n, size_t *offs)
{
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        struct ring_frame_hdr h = {.magic = RING_MAGIC, .type = RING_F_PING, .session = (uint64_t)i,
                                  .payload_len = 8};
        uint8_t *r = stream + len;
        ring_frame_hdr_encode(&h, r + 4);
        memset(r + 4 + RING_HDR_LEN, 'a' + i, 8);
        T_CHECK(ring_rec_seal(tx, r, RING_HDR_LEN + 8) == 0, "seal %d", i);
        offs[i] = len;
        len += RING_REC_OVERHEAD + RING_HDR_LEN + 8;
    }
    return len;
}

/* Open the stream with a fresh rx: how many frames came out in order before the first failure
 * (or all of them), and that failure's code. */
static int open_stream(const uint8_t key[32], const uint8_t *stream, size_t len, size_t step, int *got,
                       char *e)
{
    struct ring_rec *rx;
    if (ring_rec_new(&rx, key) < 0)
        return -ENOMEM;
    struct ring_frame_reader rd;
    ring_frame_reader_init(&rd, 4096);
    int rc = 0;
    *got = 0;
    for (size_t off = 0; off < len && rc >= 0;) {
        size_t k = len - off < step ? len - off : step;
        ring_frame_reader_push(&rd, stream + off, k);
        off += k;
        struct ring_frame_hdr h;
        const uint8_t *pl;
        while ((rc = ring_rec_next(rx, &rd, &h, &pl, e, KV_ERR_MAX)) == 1) {
            T_CHECK(h.session == (uint64_t)*got && h.payload_len == 8 && pl[0] == 'a' + *got,
                    "frame %d in order, intact", *got);
            (*got)++;
        }
    }
    ring_frame_reader_free(&rd);
    ring_rec_free(rx);
    return rc;
}

T_CASE(records)
{
    uint8_t key[32], other[32];
    memset(key, 0x42, 32);
    memset(other, 0x43, 32);
    uint8_t s[8 * 64], t[8 * 64];
    size_t offs[8];
    struct ring_rec *tx;
    T_ASSERT(ring_rec_new(&tx, key) == 0, "tx");
    size_t len = seal_stream(tx, s, 5, offs);
    T_CHECK(ring_rec_seq(tx) == 5, "sequence %llu", (unsigned long long)ring_rec_seq(tx));
    ring_rec_free(tx);
    size_t rl = offs[1] - offs[0];
    char e[KV_ERR_MAX];
    int got;
    /* intact, at every split size */
    for (size_t step = 1; step <= len; step += step < 8 ? 1 : 17)
        T_CHECK(open_stream(key, s, len, step, &got, e) == 0 && got == 5, "step %zu: %d frames (%s)", step, got, e);
    /* no plaintext on the wire: the payload bytes 'aaaaaaaa' appear nowhere */
    T_CHECK(!memmem(s, len, "aaaaaaaa", 8) && !memmem(s, len, "\x4b\x56\x52\x31", 4), "sealed bytes hide the frames");
    /* the wrong key */
    T_CHECK(open_stream(other, s, len, len, &got, e) == -EBADMSG && got == 0 && strstr(e, "record 0"), "%s", e);
    /* every byte flipped in turn: the records before it open, that one fails */
    for (size_t i = 0; i < len; i++) {
        memcpy(t, s, len);
        t[i] ^= 0x10;
        int rc = open_stream(key, t, len, len, &got, e);
        int at = (int)(i / rl);
        T_CHECK(rc < 0 && got == at, "flip at %zu: rc %d after %d frames", i, rc, got);
        if (rc >= 0 || got != at)
            break;
    }
    /* a record dropped, replayed, two swapped: the first out-of-place record fails */
    memcpy(t, s, offs[2]);
    memcpy(t + offs[2], s + offs[3], len - offs[3]);
    T_CHECK(open_stream(key, t, len - rl, len, &got, e) == -EBADMSG && got == 2 && strstr(e, "record 2"),
            "drop: %d %s", got, e);
    memcpy(t, s, offs[3]);
    memcpy(t + offs[3], s + offs[2], rl);
    memcpy(t + offs[3] + rl, s + offs[3], len - offs[3]);
    T_CHECK(open_stream(key, t, len + rl, len + rl, &got, e) == -EBADMSG && got == 3, "replay: %d %s", got, e);
    memcpy(t, s, len);
    memcpy(t + offs[1], s + offs[2], rl);
    memcpy(t + offs[2], s + offs[1], rl);
    T_CHECK(open_stream(key, t, len, len, &got, e) == -EBADMSG && got == 1, "swap: %d %s", got, e);
    /* a length over the cap fails before anything is buffered */
    memcpy(t, s, len);
    t[3] = 0x7f;
    T_CHECK(open_stream(key, t, len, len, &got, e) == -EMSGSIZE && strstr(e, "length"), "%s", e);
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(hdr_roundtrip_and_checks);
    T_RUN(reader_every_split);
    T_RUN(open_and_hello_payloads);
    T_RUN(identity);
    T_RUN(handshake);
    T_RUN(text_clean);
    T_RUN(records);
    return T_DONE();
}

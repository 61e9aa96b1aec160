/* test-ring-manifest — the ring manifest validator: a good manifest's fields, and one
 * refusal per rule (layer gaps, overlaps and ends, wire dtype, rank order, embed/head flags,
 * endpoints, model sizes, memory past 2^64, ring and node names, not an object, truncated), the
 * figures `kvctl plan` writes beside a rank's fields (its device, the MTP blocks the last rank
 * holds after the main pass) read past, n_layers staying the main pass, and
 * the standby entries (keys required, never rank 0, who may serve which rank); and the writer:
 * write -> parse -> write gives the same bytes and fields, the bytes a market served before,
 * and nothing written that the parser refuses. */
#include <math.h>

#include <cjson/cJSON.h>

#include "ring/ring.h"
#include "tests/lib/t.h"
#include "util/err.h"

static char err[KV_ERR_MAX];

static const char *good_manifest =
    "{\"version\":1,\"ring\":\"abc\",\"model\":{\"name\":\"m\",\"arch\":\"llama\",\"n_layers\":5,\"n_embd\":64},"
    "\"wire\":{\"dtype\":\"f16\"},\"limits\":{\"n_ctx\":256,\"max_batch\":32},"
    "\"ranks\":[{\"rank\":0,\"layers\":[0,2],\"endpoint\":\"tcp://127.0.0.1:1\"},"
    "{\"rank\":1,\"layers\":[2,5],\"endpoint\":\"relay://r:443/b/x\"}]}";

static int parse_with(const char *from, const char *to)
{
    char buf[2048];
    const char *p = strstr(good_manifest, from);
    if (!p)
        return 99;
    snprintf(buf, sizeof buf, "%.*s%s%s", (int)(p - good_manifest), good_manifest, to, p + strlen(from));
    struct ring_manifest m;
    return ring_manifest_parse(&m, buf, strlen(buf), err, sizeof err);
}

T_CASE(manifest)
{
    struct ring_manifest m;
    T_ASSERT(ring_manifest_parse(&m, good_manifest, strlen(good_manifest), err, sizeof err) == 0, "%s", err);
    T_CHECK(m.n_ranks == 2 && m.ranks[1].first == 2 && m.ranks[1].last == 5 && m.wire_dsize == 2 &&
            m.n_ctx == 256 && m.max_batch == 32 && m.ranks[0].embed && m.ranks[1].head && !m.ranks[0].head,
            "fields");
    T_CHECK(parse_with("[2,5]", "[3,5]") < 0 && strstr(err, "must start at 2"), "gap: %s", err);
    T_CHECK(parse_with("[2,5]", "[1,5]") < 0, "overlap");
    T_CHECK(parse_with("[2,5]", "[2,4]") < 0 && strstr(err, "end at layer 4"), "short: %s", err);
    T_CHECK(parse_with("[2,5]", "[2,6]") < 0, "past n_layers");
    T_CHECK(parse_with("\"f16\"", "\"q8\"") < 0 && strstr(err, "q8"), "dtype: %s", err);
    T_CHECK(parse_with("\"rank\":1", "\"rank\":2") < 0, "rank order");
    T_CHECK(parse_with("\"rank\":1,", "\"rank\":1,\"embed\":true,") < 0 && strstr(err, "embed"), "embed: %s", err);
    T_CHECK(parse_with("\"tcp://127.0.0.1:1\"", "\"127.0.0.1:1\"") < 0 && strstr(err, "endpoint"), "%s", err);
    T_CHECK(parse_with("\"n_embd\":64", "\"n_embd\":-1") < 0 && strstr(err, "n_embd"), "%s", err);
    T_CHECK(parse_with("\"ring\":\"abc\"", "\"ring\":\"a b\"") < 0, "ring with a space");
    T_CHECK(parse_with("\"rank\":1,", "\"rank\":1,\"node\":\"12\",") < 0 && strstr(err, "node"), "%s", err);
    T_CHECK(parse_with("\"rank\":1,", "\"rank\":1,\"mem_bytes\":1e30,") < 0 && strstr(err, "mem_bytes 1e+30"),
            "mem_bytes past 2^64: %s", err);
    T_CHECK(parse_with("\"rank\":1,", "\"rank\":1,\"mem_bytes\":-1,") < 0 && strstr(err, "mem_bytes"),
            "negative mem_bytes: %s", err);
    T_CHECK(parse_with("\"rank\":1,", "\"rank\":1,\"mem_bytes\":1048576,") == 0, "mem_bytes: %s", err);
    T_CHECK(parse_with("\"rank\":1,", "\"rank\":1,\"device\":\"gpu\",\"compute_ms\":2.5,\"mtp_blocks\":1,"
                       "\"mtp_mem_bytes\":2082132220,") == 0, "the planner's figures, MTP blocks on the last rank: %s", err);
    T_CHECK(ring_manifest_parse(&m, "[]", 2, err, sizeof err) < 0, "not an object");
    T_CHECK(ring_manifest_parse(&m, "{", 1, err, sizeof err) < 0, "truncated");
}

#define K1 "1111111111111111111111111111111111111111111111111111111111111111"
#define K2 "2222222222222222222222222222222222222222222222222222222222222222"
#define K3 "3333333333333333333333333333333333333333333333333333333333333333"

/* Standby entries: who may serve which rank once a standby took it over. */
T_CASE(standby)
{
    struct ring_manifest m;
    char buf[2048];
#define WITH(rk0, standby) \
    snprintf(buf, sizeof buf, "%.*s%s", (int)(strstr(good_manifest, "\"layers\":[2,5]") - good_manifest), \
             good_manifest, "\"node\":\"" rk0 "\",\"layers\":[2,5],\"endpoint\":\"tcp://127.0.0.1:2\"}]," standby "}")
    WITH(K1, "\"standby\":[{\"node\":\"" K2 "\",\"endpoint\":\"tcp://127.0.0.1:3\"}]");
    T_ASSERT(ring_manifest_parse(&m, buf, strlen(buf), err, sizeof err) == 0, "%s: %s", buf, err);
    uint8_t k1[32], k2[32], k3[32];
    memset(k1, 0x11, 32);
    memset(k2, 0x22, 32);
    memset(k3, 0x33, 32);
    T_CHECK(m.n_standbys == 1 && m.standbys[0].ranks == 2u && !strcmp(m.standbys[0].endpoint, "tcp://127.0.0.1:3"),
            "fields: %u standbys, ranks %llx", m.n_standbys, (unsigned long long)m.standbys[0].ranks);
    T_CHECK(ring_manifest_may_serve(&m, 1, k1), "the rank's own key");
    T_CHECK(ring_manifest_may_serve(&m, 1, k2), "the standby's key");
    T_CHECK(!ring_manifest_may_serve(&m, 1, k3), "a key the manifest does not name");
    T_CHECK(!ring_manifest_may_serve(&m, 2, k2), "a rank past the ring");
    T_CHECK(ring_manifest_may_serve(&m, 0, k3), "rank 0 names no key: any");
    WITH(K1, "\"standby\":[{\"node\":\"" K3 "\",\"endpoint\":\"tcp://127.0.0.1:3\",\"ranks\":[1]}]");
    T_CHECK(ring_manifest_parse(&m, buf, strlen(buf), err, sizeof err) == 0 && m.standbys[0].ranks == 2u, "%s", err);
    WITH(K1, "\"standby\":[{\"node\":\"" K3 "\",\"endpoint\":\"tcp://127.0.0.1:3\",\"ranks\":[0]}]");
    T_CHECK(ring_manifest_parse(&m, buf, strlen(buf), err, sizeof err) < 0 && strstr(err, "rank 0"),
            "a standby for rank 0: %s", err);
    WITH(K1, "\"standby\":[{\"endpoint\":\"tcp://127.0.0.1:3\"}]");
    T_CHECK(ring_manifest_parse(&m, buf, strlen(buf), err, sizeof err) < 0 && strstr(err, "standby[0].node"),
            "a standby without a key: %s", err);
    WITH(K1, "\"standby\":[{\"node\":\"" K2 "\",\"endpoint\":\"tcp://127.0.0.1:2\"}]");
    T_CHECK(ring_manifest_parse(&m, buf, strlen(buf), err, sizeof err) < 0 && strstr(err, "rank 1's"),
            "a standby on a rank's endpoint: %s", err);
    WITH(K1, "\"standby\":{}");
    T_CHECK(ring_manifest_parse(&m, buf, strlen(buf), err, sizeof err) < 0 && strstr(err, "standby"), "%s", err);
#undef WITH
}

/* A manifest with every field the writer knows: three ranks (rank 1 names no node and no
 * backend), every limit, the estimates, and two standbys (one for every rank but 0, one for
 * rank 2 only). */
static void full_manifest(struct ring_manifest *m)
{
    memset(m, 0, sizeof *m);
    m->version = 1;
    m->stated = RING_STATED_N_CTX | RING_STATED_MAX_BATCH | RING_STATED_MAX_SESSIONS | RING_STATED_ESTIMATES;
    snprintf(m->ring, sizeof m->ring, "ring-1");
    snprintf(m->model_name, sizeof m->model_name, "a \"quoted\" name\\");
    snprintf(m->catalog, sizeof m->catalog, "%s", K3);
    snprintf(m->arch, sizeof m->arch, "qwen35moe");
    m->n_layers = 7;
    m->n_embd = 96;
    snprintf(m->dtype, sizeof m->dtype, "f16");
    m->wire_dsize = 2;
    m->n_ctx = 300;
    m->max_batch = 17;
    m->max_sessions = 5;
    m->n_ranks = 3;
    static const uint32_t bounds[] = {0, 2, 3, 7};
    for (uint32_t i = 0; i < 3; i++) {
        struct ring_rank_info *ri = &m->ranks[i];
        ri->rank = i;
        ri->first = bounds[i];
        ri->last = bounds[i + 1];
        ri->embed = i == 0;
        ri->head = i == 2;
        ri->has_node = i != 1;
        memset(ri->node, ri->has_node ? 0x11 * (int)(i + 1) : 0, 32);
        snprintf(ri->endpoint, sizeof ri->endpoint, "tcp://10.0.0.%u:7100", i + 1);
        snprintf(ri->backend, sizeof ri->backend, "%s", i == 2 ? "opencl" : i ? "" : "cpu");
        ri->mem_bytes = 1000000007ull * (i + 1);
        ri->est_ms_per_token = 1.25 + i / 3.0;
    }
    m->n_standbys = m->n_own_standbys = 2;
    memset(m->standbys[0].node, 0xab, 32);
    snprintf(m->standbys[0].endpoint, sizeof m->standbys[0].endpoint, "tcp://10.0.0.9:7100");
    m->standbys[0].ranks = 6;
    memset(m->standbys[1].node, 0xcd, 32);
    snprintf(m->standbys[1].endpoint, sizeof m->standbys[1].endpoint, "relay://r:443/b/s");
    m->standbys[1].ranks = 4;
}

/* write -> parse -> write: the same text and hash, and the parse gives every field back. */
T_CASE(write_round_trip)
{
    struct ring_manifest m, back;
    full_manifest(&m);
    char *a = NULL, *b = NULL;
    uint8_t ha[32], hb[32];
    T_ASSERT(ring_manifest_write(&a, ha, &m, err, sizeof err) == 0, "%s", err);
    T_ASSERT(ring_manifest_parse(&back, a, strlen(a), err, sizeof err) == 0, "%s: %s", a, err);
    T_CHECK(back.version == 1 && back.stated == m.stated && !strcmp(back.ring, m.ring) &&
            !strcmp(back.model_name, m.model_name) && !strcmp(back.catalog, m.catalog) &&
            !strcmp(back.arch, m.arch) && back.n_layers == m.n_layers && back.n_embd == m.n_embd &&
            !strcmp(back.dtype, m.dtype) && back.wire_dsize == 2 && back.n_ctx == m.n_ctx &&
            back.max_batch == m.max_batch && back.max_sessions == m.max_sessions && back.n_ranks == 3,
            "manifest fields: %s", a);
    for (uint32_t i = 0; i < 3; i++) {
        const struct ring_rank_info *x = &m.ranks[i], *y = &back.ranks[i];
        T_CHECK(y->rank == x->rank && y->first == x->first && y->last == x->last && y->embed == x->embed &&
                y->head == x->head && y->has_node == x->has_node && !memcmp(y->node, x->node, 32) &&
                !strcmp(y->endpoint, x->endpoint) && !strcmp(y->backend, x->backend) &&
                y->mem_bytes == x->mem_bytes && y->est_ms_per_token == x->est_ms_per_token,
                "ranks[%u] fields: %s", i, a);
    }
    T_CHECK(back.n_standbys == 2 && back.n_own_standbys == 2, "%u standbys", back.n_standbys);
    for (uint32_t i = 0; i < 2; i++)
        T_CHECK(!memcmp(back.standbys[i].node, m.standbys[i].node, 32) &&
                !strcmp(back.standbys[i].endpoint, m.standbys[i].endpoint) &&
                back.standbys[i].ranks == m.standbys[i].ranks, "standby[%u] fields: %s", i, a);
    T_CHECK(strstr(a, "\"ranks\":\t[2]") && !strstr(a, "\"ranks\":\t[1, 2]"),
            "a standby names its ranks only when they are not every rank but 0: %s", a);
    T_ASSERT(ring_manifest_write(&b, hb, &back, err, sizeof err) == 0, "%s", err);
    T_CHECK(!strcmp(a, b), "write -> parse -> write differs:\n%s\n%s", a, b);
    T_CHECK(!memcmp(ha, hb, 32), "the hashes differ");
    free(b);
    cJSON *t = NULL;
    T_ASSERT(ring_manifest_to_json(&t, &m, err, sizeof err) == 0 && t, "%s", err);
    b = cJSON_Print(t);
    T_CHECK(b && !strcmp(a, b), "the tree prints as ring_manifest_write writes");
    cJSON_Delete(t);
    free(b);
    free(a);

    /* what is not stated is not written, and reads back as not stated */
    m.stated = RING_STATED_N_CTX;
    m.n_own_standbys = m.n_standbys = 0;
    T_ASSERT(ring_manifest_write(&a, NULL, &m, err, sizeof err) == 0, "%s", err);
    T_CHECK(!strstr(a, "max_batch") && !strstr(a, "max_sessions") && !strstr(a, "mem_bytes") &&
            !strstr(a, "est_ms_per_token") && !strstr(a, "standby") && strstr(a, "\"n_ctx\":\t300"), "%s", a);
    T_ASSERT(ring_manifest_parse(&back, a, strlen(a), err, sizeof err) == 0, "%s", err);
    T_CHECK(back.stated == RING_STATED_N_CTX && back.max_batch == 64 && back.ranks[0].mem_bytes == 0,
            "stated %x, max_batch %u", back.stated, back.max_batch);
    free(a);
    m.stated = 0;
    T_ASSERT(ring_manifest_write(&a, NULL, &m, err, sizeof err) == 0, "%s", err);
    T_CHECK(!strstr(a, "limits"), "no limit stated, no limits object: %s", a);
    free(a);
    T_ASSERT(ring_manifest_parse(&back, good_manifest, strlen(good_manifest), err, sizeof err) == 0, "%s", err);
    T_CHECK(back.stated == (RING_STATED_N_CTX | RING_STATED_MAX_BATCH), "stated %x", back.stated);
}

/* The bytes kvd market served for this ring before the one writer: links check the
 * manifest's hash, so the same ring keeps the same bytes. */
T_CASE(write_bytes)
{
    static const char want[] =
    "{\n"
    "\t\"version\":\t1,\n"
    "\t\"ring\":\t\"mkt-aaaaaaaaaaaaaaaa\",\n"
    "\t\"model\":\t{\n"
    "\t\t\"name\":\t\"m\",\n"
    "\t\t\"catalog\":\t\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\",\n"
    "\t\t\"arch\":\t\"llama\",\n"
    "\t\t\"n_layers\":\t5,\n"
    "\t\t\"n_embd\":\t64\n"
    "\t},\n"
    "\t\"wire\":\t{\n"
    "\t\t\"dtype\":\t\"f32\"\n"
    "\t},\n"
    "\t\"ranks\":\t[{\n"
    "\t\t\t\"rank\":\t0,\n"
    "\t\t\t\"node\":\t\"1111111111111111111111111111111111111111111111111111111111111111\",\n"
    "\t\t\t\"layers\":\t[0, 2],\n"
    "\t\t\t\"embed\":\ttrue,\n"
    "\t\t\t\"head\":\tfalse,\n"
    "\t\t\t\"endpoint\":\t\"tcp://127.0.0.1:1\"\n"
    "\t\t}, {\n"
    "\t\t\t\"rank\":\t1,\n"
    "\t\t\t\"node\":\t\"2222222222222222222222222222222222222222222222222222222222222222\",\n"
    "\t\t\t\"layers\":\t[2, 5],\n"
    "\t\t\t\"embed\":\tfalse,\n"
    "\t\t\t\"head\":\ttrue,\n"
    "\t\t\t\"endpoint\":\t\"relay://r:443/b/x\"\n"
    "\t\t}]\n"
    "}";
    struct ring_manifest m;
    memset(&m, 0, sizeof m);
    m.version = 1;
    snprintf(m.ring, sizeof m.ring, "mkt-aaaaaaaaaaaaaaaa");
    snprintf(m.model_name, sizeof m.model_name, "m");
    memset(m.catalog, 'a', 64);
    snprintf(m.arch, sizeof m.arch, "llama");
    m.n_layers = 5;
    m.n_embd = 64;
    snprintf(m.dtype, sizeof m.dtype, "f32");
    m.n_ranks = 2;
    m.ranks[0] = (struct ring_rank_info){.rank = 0, .first = 0, .last = 2, .embed = true, .has_node = true,
                                         .endpoint = "tcp://127.0.0.1:1"};
    m.ranks[1] = (struct ring_rank_info){.rank = 1, .first = 2, .last = 5, .head = true, .has_node = true,
                                         .endpoint = "relay://r:443/b/x"};
    memset(m.ranks[0].node, 0x11, 32);
    memset(m.ranks[1].node, 0x22, 32);
    char *s = NULL;
    T_ASSERT(ring_manifest_write(&s, NULL, &m, err, sizeof err) == 0, "%s", err);
    T_CHECK(!strcmp(s, want), "the bytes changed:\n%s", s);
    free(s);
}

/* A manifest the parser would refuse is never written: one field at a time out of its rule. */
T_CASE(write_refuses)
{
    static const struct { const char *what, *in_err; } cases[] = {
        {"version 2", "version"}, {"ring id with a space", "ring id"}, {"empty ring id", "ring id"},
        {"n_embd 0", "n_embd"}, {"n_ctx 4", "n_ctx"}, {"max_sessions 5000", "max_sessions"},
        {"dtype q8", "q8"}, {"endpoint without a scheme", "endpoint"}, {"a gap between windows", "must start at"},
        {"windows short of n_layers", "end at layer"}, {"embed on rank 1", "embed"}, {"rank out of order", "rank"},
        {"65 ranks", "ranks"}, {"a standby for rank 0", "rank 0"}, {"a standby for no rank", "ranks"},
        {"a standby on a rank's endpoint", "rank 1's"}, {"est_ms_per_token NaN", "est_ms_per_token"},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        struct ring_manifest m;
        full_manifest(&m);
        switch (k) {
        case 0: m.version = 2; break;
        case 1: snprintf(m.ring, sizeof m.ring, "a b"); break;
        case 2: m.ring[0] = 0; break;
        case 3: m.n_embd = 0; break;
        case 4: m.n_ctx = 4; break;
        case 5: m.max_sessions = 5000; break;
        case 6: snprintf(m.dtype, sizeof m.dtype, "q8"); break;
        case 7: snprintf(m.ranks[1].endpoint, sizeof m.ranks[1].endpoint, "10.0.0.2:7100"); break;
        case 8: m.ranks[1].first = 3; break;
        case 9: m.ranks[2].last = 6; break;
        case 10: m.ranks[1].embed = true; break;
        case 11: m.ranks[1].rank = 2; break;
        case 12: m.n_ranks = RING_MAX_RANKS + 1; break;
        case 13: m.standbys[1].ranks = 1; break;
        case 14: m.standbys[1].ranks = 0; break;
        case 15: snprintf(m.standbys[0].endpoint, sizeof m.standbys[0].endpoint, "%s", m.ranks[1].endpoint); break;
        case 16: m.ranks[0].est_ms_per_token = NAN; break;
        }
        char *s = err;
        cJSON *t = (cJSON *)&m;
        err[0] = 0;
        T_CHECK(ring_manifest_write(&s, NULL, &m, err, sizeof err) == -EINVAL && !s && strstr(err, cases[k].in_err),
                "%s: written, or err '%s'", cases[k].what, err);
        T_CHECK(ring_manifest_to_json(&t, &m, err, sizeof err) == -EINVAL && !t, "%s: a tree", cases[k].what);
    }
}

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(manifest);
    T_RUN(standby);
    T_RUN(write_round_trip);
    T_RUN(write_bytes);
    T_RUN(write_refuses);
    return T_DONE();
}

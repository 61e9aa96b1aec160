/* test-ring-manifest — the ring manifest validator: a good manifest's fields, and one
 * refusal per rule (layer gaps, overlaps and ends, wire dtype, rank order, embed/head flags,
 * endpoints, model sizes, memory past 2^64, ring and node names, not an object, truncated), and
 * the standby entries (keys required, never rank 0, who may serve which rank). */
#include "ringlib/ring.h"
#include "tests/t.h"
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

int main(int argc, char **argv)
{
    t_init(argc, argv);
    T_RUN(manifest);
    T_RUN(standby);
    return T_DONE();
}

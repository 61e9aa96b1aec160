/* fuzz-audit — libFuzzer target for the audit answers a node sends the market (POST
 * /v1/leases/audit; kvd/market/audit.c, docs/market.md "Audits"): what a node under audit
 * controls once it holds a lease. The market's HTTP layer is fuzz-market's; this target goes
 * straight to the judge, with an audit pending on each of four nodes (tests/lib/audit_fixture.h:
 * rank 0 with the TOKENs it received, a middle rank, the last rank with TOKEN summaries and
 * logits, the last rank of a ring of protocol version 3), put back before every input. The
 * first byte picks the node; the rest is one or more answer bodies separated by NUL bytes,
 * judged in order against the same pending audit (so an answer in parts is reached). The
 * market must take or refuse each with one of the codes its API maps to 200/202, 400, 403 or
 * 409 (never a 503, which would be the market's own failure), a verdict it knows, and a reason
 * for every refusal. Without --verify-model the judge stops at the proofs and the checks that
 * need no weights (rank 0's ids against its TOKENs, the last rank's logits against their hash).
 * fuzz-modules: util wtype gguf net ring kernels gen/kern_cl model planner kvd/log kvd/market/a
 * fuzz-modules: kvd/sampling
 * fuzz-modules: gen/market_page kvd/market/c
 * fuzz-modules: kvd/market/h kvd/market/l kvd/market/mo kvd/market/man kvd/market/n
 * fuzz-modules: kvd/market/p kvd/market/r kvd/market/st */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <uv.h>

#include "kvd/kvd.h"
#include "kvd/market/internal.h"
#include "tests/lib/audit_fixture.h"
#include "tests/lib/fuzz_scratch.h"
#include "util/err.h"

static uv_loop_t loop;
static struct kvd_market_store *store;
static struct kvd_market_audit *au;
static struct af fx[AF_KINDS];
static char *saved[AF_KINDS];

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char db[160], err[KV_ERR_MAX];
    const char *dir = fuzz_scratch("audit");
    mkdir(dir, 0700);
    snprintf(db, sizeof db, "%s/market.db", dir);
    unlink(db);
    kvd_log_set_level(KVD_LOG_ERROR);
    struct kvd_market_config cfg;
    kvd_market__config_default(&cfg);
    cfg.db = db;
    cfg.audit_rate = 1;
    cfg.audit_answer_kib = 64;   /* the parts an answer may keep: 64 KiB and one request */
    uv_loop_init(&loop);
    if (kvd_market__store_open(&store, db, err, sizeof err) ||
        kvd_market__audit_new(&au, &loop, store, &cfg, NULL, NULL)) {
        fprintf(stderr, "fuzz-audit: %s\n", err);
        abort();
    }
    for (int k = 0; k < AF_KINDS; k++) {
        af_build(&fx[k], (enum af_kind)k);
        if (af_pending(store, au, &fx[k], 1000, &saved[k])) {
            fprintf(stderr, "fuzz-audit: the pending audit of kind %d: %s\n", k, store->err);
            abort();
        }
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 65536)
        return 0;
    const struct af *a = &fx[data[0] % AF_KINDS];
    if (af_restore(store, a, saved[a - fx]))
        abort();
    const uint8_t *p = data + 1, *end = data + size;
    for (int calls = 0; p <= end && calls < 8; calls++) {
        const uint8_t *z = memchr(p, 0, (size_t)(end - p));
        size_t n = z ? (size_t)(z - p) : (size_t)(end - p);
        cJSON *body = cJSON_ParseWithLength((const char *)p, n);
        p += n + 1;
        if (!body)
            continue;   /* the API refuses what is not JSON before the judge sees it */
        char why[512] = "";
        const char *verdict = NULL;
        bool settled = false;
        int rc = kvd_market__audit_answer(au, "m", a->node, body, 1001, &settled, &verdict, why,
                                          sizeof why);
        cJSON_Delete(body);
        if (rc != 0 && rc != -EINVAL && rc != -EBADMSG && rc != -ENOENT && rc != -EAGAIN) {
            fprintf(stderr, "fuzz-audit: node %s: code %d (the API would answer 503): %s\n",
                    a->node, rc, why);
            abort();
        }
        if (rc < 0 && !why[0]) {
            fprintf(stderr, "fuzz-audit: node %s: refused (%d) without a reason\n", a->node, rc);
            abort();
        }
        if (rc == 0 && (!verdict || (strcmp(verdict, "pass") && strcmp(verdict, "more") &&
                                     strcmp(verdict, "inconclusive") && strcmp(verdict, "verifying")))) {
            fprintf(stderr, "fuzz-audit: node %s: taken with the verdict %s\n", a->node,
                    verdict ? verdict : "(none)");
            abort();
        }
    }
    return 0;
}

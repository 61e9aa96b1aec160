/* admit.c — who may do what at the market, decided in memory before the store is asked: the
 * operator keys (they may change any model and keep the clients' accounts), the admission
 * allowlist (kvd market --admission allowlist FILE), and the claim rate limits per node key
 * and per address (token buckets: a burst of a minute's worth, refilled continuously).
 *
 * The buckets live in this process: several market instances on one PostgreSQL database each
 * hold their own, so the limits there are per instance (docs/market.md, "Admission"). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvd/market/internal.h"
#include "util/util.h"

#define KEYS_MAX 4096            /* node keys in an allowlist or operator file */
#define BUCKETS 8192             /* per table; a power of two */
#define PROBE 32                 /* slots looked at per lookup */

struct bucket {
    char k[68];                  /* a node key (64 hex) or an address key; "" free */
    double tokens, t;
};

struct kvd_market_admit {
    char (*ops)[65], (*allow)[65];
    size_t n_ops, n_allow;
    bool allowlist;
    double per_key, per_addr;    /* claims per minute (0: no limit) */
    struct bucket by_key[BUCKETS], by_addr[BUCKETS];
};

static int cmp_key(const void *a, const void *b) { return strcmp(a, b); }

/* Load a file of node keys (64 hex each, one a line; '#' comments, blank lines): sorted. */
static int keys_load(const char *path, const char *what, char (**out)[65], size_t *n, char *err,
                     size_t errlen)
{
    FILE *f = fopen(path, "r");
    if (!f) {
        util_seterr(err, errlen, "%s %s: %s", what, path, strerror(errno));
        return -errno;
    }
    *out = calloc(KEYS_MAX, 65);
    *n = 0;
    char line[256];
    unsigned lineno = 0;
    int rc = *out ? 0 : -ENOMEM;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        char *k = line;
        while (*k == ' ' || *k == '\t')
            k++;
        size_t l = strcspn(k, " \t\r\n#");
        if (!l)
            continue;
        bool hex = l == 64;
        for (size_t i = 0; hex && i < l; i++)
            hex = (k[i] >= '0' && k[i] <= '9') || (k[i] >= 'a' && k[i] <= 'f');
        if (!hex) {
            util_seterr(err, errlen, "%s %s, line %u: expected a node key (64 lowercase hex digits)",
                        what, path, lineno);
            rc = -EINVAL;
        } else if (*n == KEYS_MAX) {
            util_seterr(err, errlen, "%s %s: more than %d keys", what, path, KEYS_MAX);
            rc = -E2BIG;
        } else {
            memcpy((*out)[(*n)++], k, 64);
        }
    }
    fclose(f);
    if (rc == 0)
        qsort(*out, *n, 65, cmp_key);
    return rc;
}

int kvd_market__admit_new(struct kvd_market_admit **out, const struct kvd_market_config *cfg,
                          char *err, size_t errlen)
{
    struct kvd_market_admit *ad = calloc(1, sizeof *ad);
    if (!ad)
        return -ENOMEM;
    int rc = 0;
    if (cfg->operator_keys)
        rc = keys_load(cfg->operator_keys, "--operator-key", &ad->ops, &ad->n_ops, err, errlen);
    if (rc == 0 && cfg->allowlist) {
        ad->allowlist = true;
        rc = keys_load(cfg->allowlist, "--admission allowlist", &ad->allow, &ad->n_allow, err, errlen);
    }
    if (rc) {
        kvd_market__admit_free(ad);
        return rc;
    }
    ad->per_key = cfg->claims_per_min_key;
    ad->per_addr = cfg->claims_per_min_addr;
    *out = ad;
    return 0;
}

void kvd_market__admit_free(struct kvd_market_admit *ad)
{
    if (!ad)
        return;
    free(ad->ops);
    free(ad->allow);
    free(ad);
}

bool kvd_market__admit_operator(const struct kvd_market_admit *ad, const char *node)
{
    return ad->n_ops && bsearch(node, ad->ops, ad->n_ops, 65, cmp_key);
}

bool kvd_market__admit_allowed(const struct kvd_market_admit *ad, const char *node)
{
    return !ad->allowlist || (ad->n_allow && bsearch(node, ad->allow, ad->n_allow, 65, cmp_key));
}

/* The bucket of k in t: its own slot, a free one, or (the table crowded there) the slot
 * whose bucket is fullest, which forgets the least. */
static struct bucket *bucket_of(struct bucket *t, const char *k, double rate, double now)
{
    uint32_t h = 2166136261u;   /* FNV-1a */
    for (const char *c = k; *c; c++)
        h = (h ^ (uint8_t)*c) * 16777619u;
    struct bucket *best = NULL;
    double best_tokens = -1;
    for (uint32_t i = 0; i < PROBE; i++) {
        struct bucket *b = &t[(h + i) & (BUCKETS - 1)];
        if (!strcmp(b->k, k))
            return b;
        double full = b->k[0] ? b->tokens + (now - b->t) / 60.0 * rate : 1e300;
        if (full > best_tokens) {
            best_tokens = full;
            best = b;
        }
    }
    snprintf(best->k, sizeof best->k, "%s", k);
    best->tokens = rate;
    best->t = now;
    return best;
}

/* Take a token from k's bucket: true, or false with *wait the seconds until one is there. */
static bool take(struct bucket *t, const char *k, double rate, double now, double *wait)
{
    if (rate <= 0)
        return true;
    struct bucket *b = bucket_of(t, k, rate, now);
    b->tokens += (now - b->t) / 60.0 * rate;
    if (b->tokens > rate)
        b->tokens = rate;
    b->t = now;
    if (b->tokens >= 1) {
        b->tokens -= 1;
        return true;
    }
    *wait = (1 - b->tokens) * 60.0 / rate;
    return false;
}

int kvd_market__admit_claim(struct kvd_market_admit *ad, const char *node, const char *addr,
                            double now, char *why, size_t n)
{
    double wait = 0;
    if (!take(ad->by_addr, addr, ad->per_addr, now, &wait)) {
        util_seterr(why, n, "too many claims from address %s (at most %.0f a minute): try again in "
                    "%.0f s", addr, ad->per_addr, wait + 0.5);
        return -EAGAIN;
    }
    if (!take(ad->by_key, node, ad->per_key, now, &wait)) {
        util_seterr(why, n, "too many claims by node %.16s... (at most %.0f a minute): try again in "
                    "%.0f s", node, ad->per_key, wait + 0.5);
        return -EAGAIN;
    }
    return 0;
}

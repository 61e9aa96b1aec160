/* ring — what the daemon and the CLI share about a ring: the rank manifest every stage reads,
 * the client side of a stage's control socket, and the boundary's wire encoding.
 *
 * The manifest (JSON): version, ring, model {name, catalog, arch, n_layers, n_embd}, wire
 * {dtype f32|f16}, optional limits {n_ctx, max_batch, max_sessions}, ranks [{rank, node,
 * layers [first,last], embed, head, backend, endpoint, mem_bytes, est_ms_per_token}]
 * (docs/design.md, "The rank manifest"), and optional standbys [{node, endpoint, ranks}]: nodes
 * that hold no window until one takes over a dead rank (docs/ring.md, "Repair"). Every manifest
 * is written by ring_manifest_to_json or ring_manifest_write (kvctl plan, kvctl ring up, the
 * market) and read by ring_manifest_parse. */
#ifndef KV_RING_H
#define KV_RING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cJSON;

#define RING_MAX_RANKS 64
#define RING_ENDPOINT_MAX 256

struct ring_rank_info {
    uint32_t rank, first, last;
    bool embed, head, has_node;
    uint8_t node[32];                   /* Ed25519 public key (when has_node) */
    char endpoint[RING_ENDPOINT_MAX];    /* "tcp://host:port" or "relay://host:port/b/<id>" */
    char backend[16];
    uint64_t mem_bytes;
    double est_ms_per_token;
};

/* A standby node: its key, where its predecessor-to-be dials it, and the ranks it may take
 * over (never rank 0, whose sessions' history dies with it). */
#define RING_MAX_STANDBYS 16
struct ring_standby_info {
    uint8_t node[32];                   /* Ed25519 public key (required) */
    char endpoint[RING_ENDPOINT_MAX];
    uint64_t ranks;                     /* bit r: may serve rank r */
};

/* The optional fields a manifest states (struct ring_manifest's stated): the parser sets the bit
 * of each it read, the writer writes those whose bit is set (the others read as their defaults). */
#define RING_STATED_N_CTX        (1u << 0)  /* limits.n_ctx */
#define RING_STATED_MAX_BATCH    (1u << 1)  /* limits.max_batch */
#define RING_STATED_MAX_SESSIONS (1u << 2)  /* limits.max_sessions */
#define RING_STATED_ESTIMATES    (1u << 3)  /* the ranks' mem_bytes and est_ms_per_token */

struct ring_manifest {
    uint32_t version;
    uint32_t stated;                    /* RING_STATED_* */
    char ring[65];
    char model_name[128], catalog[65], arch[32];
    uint32_t n_layers, n_embd;
    char dtype[8];                      /* "f32" | "f16" */
    uint32_t wire_dsize;                /* bytes per boundary value: 4 or 2 */
    uint32_t n_ctx, max_batch, max_sessions;  /* limits (defaults filled in) */
    uint32_t n_ranks;
    struct ring_rank_info ranks[RING_MAX_RANKS];
    uint8_t hash[32];                   /* SHA-256 of the manifest bytes */
    uint32_t n_standbys;                /* the manifest's own, then a roster's */
    uint32_t n_own_standbys;            /* the manifest's own "standby" entries */
    struct ring_standby_info standbys[RING_MAX_STANDBYS];
};

/* Whether a node with Ed25519 key may serve rank: the key the manifest names for the rank (any
 * key when it names none), or a standby's that lists the rank. */
bool ring_manifest_may_serve(const struct ring_manifest *m, uint32_t rank, const uint8_t key[32]);

/* Parse and validate a manifest held in memory (windows contiguous, disjoint, covering
 * [0, n_layers); rank order; embed on rank 0 only, head on the last only). */
int ring_manifest_parse(struct ring_manifest *m, const char *json, size_t len, char *err,
                       size_t errlen);
/* The inverse of ring_manifest_parse, the one writer of manifests: m as a JSON object in *out
 * (the caller's, cJSON_Delete) with version, ring, model {name, catalog, arch, n_layers, n_embd},
 * wire {dtype}, the limits m->stated names, ranks [{rank, node (when has_node), layers, embed,
 * head, backend (when set), endpoint, mem_bytes and est_ms_per_token (RING_STATED_ESTIMATES)}]
 * and m's own standbys [{node, endpoint, ranks (unless every rank but 0)}]. A manifest the
 * parser would refuse is not written: -EINVAL, err naming the field; -ENOMEM. */
int ring_manifest_to_json(struct cJSON **out, const struct ring_manifest *m, char *err, size_t errlen);
/* The same as text in cJSON_Print's layout (every manifest's, so the same ring gives the same
 * bytes): *out malloc'd and NUL-terminated, the caller frees; hash, when not NULL, gets the
 * SHA-256 of those bytes. 0, -EINVAL or -ENOMEM as ring_manifest_to_json, -EIO. */
int ring_manifest_write(char **out, uint8_t hash[32], const struct ring_manifest *m, char *err,
                        size_t errlen);
/* Read, hash and parse a manifest file. */
int ring_manifest_load(struct ring_manifest *m, const char *path, char *err, size_t errlen);
/* A roster (docs/market.md, "Standbys"): standbys named beside a manifest rather than in it,
 * so that adding one changes nothing the links check. {"manifest": "<hex SHA-256 of the
 * manifest>", "standby": [entries as the manifest's]}: its entries replace the roster entries
 * taken before (they follow the manifest's own). 0; -ESTALE when it is for another manifest;
 * -EINVAL (err says why) leaving the standbys as they were. */
int ring_roster_apply(struct ring_manifest *m, const char *json, size_t len, char *err, size_t errlen);

/* Control client (kvctl): connect to a stage's control socket, send one JSON request line,
 * call on_line for every reply line until it returns non-zero or the daemon closes.
 * 0, or negative errno with err filled. */
typedef int (*ring_ctl_line_cb)(const char *line, void *ud);
int ring_ctl_request(const char *sock_path, const char *request, ring_ctl_line_cb on_line, void *ud,
                    int timeout_ms, char *err, size_t errlen);


/* The boundary on the wire: n values as little-endian f32 (dsize 4) or IEEE f16 rounded to
 * nearest even (dsize 2); out holds n * dsize bytes. */
void ring_wire_encode(const float *x, size_t n, uint32_t dsize, uint8_t *out);
/* The inverse: n * dsize bytes of in to n floats. */
void ring_wire_decode(const uint8_t *in, size_t n, uint32_t dsize, float *x);

/* ---- the market (docs/market.md): signed calls, shared by kvd's market and join roles and
 * kvctl market ----
 * A mutating call carries four headers: X-Kv-Node (the caller's Ed25519 public key, 64 hex),
 * X-Kv-Time (Unix seconds), X-Kv-Nonce (16 to 64 hex digits, never reused by that key) and
 * X-Kv-Signature (128 hex): Ed25519 over the canonical bytes ring_market_canon writes. */
#define RING_MARKET_CANON_MAX 2400   /* canonical bytes of a path up to 2048 bytes */
#define RING_MARKET_BODY_MAX (1u << 20) /* the largest request body the market takes */
struct net_identity;
/* The canonical bytes "KVMKT1\n" METHOD "\n" PATH "\n" hex(SHA-256(body)) "\n" TS "\n" NONCE
 * into out (RING_MARKET_CANON_MAX): their length, or -ENAMETOOLONG. */
int ring_market_canon(char *out, const char *method, const char *path, const void *body,
                     size_t len, int64_t ts, const char *nonce);
/* The CA certificate file (PEM) every later ring_market_call verifies an https:// market
 * with (borrowed: it must live as long); NULL: the system's store. Set once, at start-up. */
void ring_market_set_ca(const char *ca_file);
/* A JSON call to a market at base URL ("http://host:port" or "https://..."). id: sign it (NULL: unsigned).
 * body: JSON text or NULL (GET). *status gets the HTTP status, *resp the answer's body
 * (malloc'd, NUL-terminated; the caller frees). 0, or negative errno with err filled when no
 * answer came. timeout_ms bounds the whole call. */
int ring_market_call(const char *base, const char *method, const char *path, const char *body,
                    const struct net_identity *id, int timeout_ms, long *status, char **resp,
                    char *err, size_t errlen);

/* Client keys (docs/market.md, "Clients"): a paying client's API key is a secret string
 * ("kvc-" and 64 hex digits, made by kvctl market client add). The market knows the client by
 * its id, hex(SHA-256(key)), and holds its verifier, HMAC-SHA256(key, RING_CLIENT_VERIFIER_MSG);
 * rank 0, which the client gave its key, binds each session to the client with a proof,
 * HMAC-SHA256(verifier, "KVSESS1\n" model "\n" manifest "\n" session "\n" tokens), which only a
 * holder of the key or the market can make. */
#define RING_CLIENT_KEY_PREFIX "kvc-"
#define RING_CLIENT_KEY_LEN 68         /* the prefix and 64 hex digits */
#define RING_CLIENT_VERIFIER_MSG "kvasir client verifier v1"
#define RING_CLIENTS_LIST_MAX 16384    /* client ids a market lists as payable (GET /v1/clients) */
/* Whether key is a well-formed client key. */
bool ring_client_key_valid(const char *key);
/* A fresh client key into out (RING_CLIENT_KEY_LEN + 1 bytes): 0 or -EIO (no randomness). */
int ring_client_key_new(char out[RING_CLIENT_KEY_LEN + 1]);
/* The client's id: hex(SHA-256(key)). */
void ring_client_id(const char *key, char out[65]);
/* The verifier of key: 32 bytes. */
void ring_client_verifier(const char *key, uint8_t out[32]);
/* The proof binding session (16..64 hex) of ring generation manifest (64 hex) of model (64
 * hex), tokens [0, tokens), to the client whose verifier is v: 64 hex. */
void ring_client_proof(const uint8_t v[32], const char *model, const char *manifest,
                       const char *session, uint64_t tokens, char out[65]);

/* Known-answer probes (docs/market.md, "Probes"): boundary rows travel as base64 of
 * little-endian f16, the wire's own rounding. */
#define RING_PROBE_TOL 1e-3            /* NMSE a probe's answer may be off by */
#define RING_PROBE_BYTES_MAX (384u << 10) /* f16 bytes of every boundary of a probe set */
#define RING_PROBE_SEQS_MAX 8
#define RING_PROBE_TOKENS_MAX 16
/* base64 of x[n] as f16 (malloc'd, NUL-terminated; the caller frees), NULL when out of memory. */
char *ring_probe_rows_encode(const float *x, size_t n);
/* x[n] from base64 f16 text: 0, or -EINVAL when s is not base64 of exactly n f16 values. */
int ring_probe_rows_decode(const char *s, float *x, size_t n);
/* The normalised squared error sum((a-b)^2) / sum(b^2) of a against the expected b; a
 * non-finite a gives INFINITY. */
double ring_probe_nmse(const float *a, const float *b, size_t n);

/* ---- the Merkle tree of a session's boundary rows (docs/market.md, "Audits") ----
 * Leaves, one per position: SHA-256(0x00 || u32le pos || row bytes); an inner node:
 * SHA-256(0x01 || left || right); the odd last node of a level is promoted unchanged. A
 * receipt's digest is the root over the positions [t0, t1) of its range, leaf i being position
 * t0 + i (a position with no row, such as a prompt row the last rank sampled no token for, is
 * the leaf of an empty row). A proof is the sibling hashes from the leaf up, the promoted
 * levels skipped: at most RING_MERKLE_DEPTH_MAX of them. The root does not bind the leaf
 * count (a proof in a tree of 3 leaves also verifies as one in a tree of 4, the third leaf's
 * hash standing for the right half), so a verifier takes n from elsewhere: a receipt's range. */
#define RING_MERKLE_LEAVES_MAX (1u << 24)
#define RING_MERKLE_DEPTH_MAX 24
void ring_merkle_leaf(uint32_t pos, const void *row, size_t len, uint8_t out[32]);
void ring_merkle_node(const uint8_t l[32], const uint8_t r[32], uint8_t out[32]);
/* The root over leaves[n] (n = 0: SHA-256 of nothing): 0, -E2BIG past RING_MERKLE_LEAVES_MAX,
 * -ENOMEM. */
int ring_merkle_root(const uint8_t (*leaves)[32], size_t n, uint8_t root[32]);
/* The proof of leaf idx into path (room for RING_MERKLE_DEPTH_MAX), *len hashes: 0, -EINVAL
 * for idx past n, -E2BIG, -ENOMEM. */
int ring_merkle_proof(const uint8_t (*leaves)[32], size_t n, size_t idx,
                      uint8_t (*path)[32], size_t *len);
/* Whether leaf is leaf idx of a tree of n leaves with that root, by path[len]. */
bool ring_merkle_verify(const uint8_t leaf[32], size_t idx, size_t n, const uint8_t (*path)[32],
                        size_t len, const uint8_t root[32]);

#endif

/* ring — the ring's own protocol and what the daemon and the CLI share about a ring: frames,
 * the link handshake, sealed records, the session open parameters and the wire ERROR codes
 * (the protocol section below), links over net/'s streams, the rank manifest every stage
 * reads, the client side of a stage's control socket, and the boundary's wire encoding.
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

#include <uv.h>

#include "net/net.h"

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
/* An audit's answer goes to the market in parts of at most this many bytes each (docs/market.md,
 * "Audits"), well under the body cap. */
#define RING_AUDIT_PART_BYTES (256u << 10)
/* The arrays of an audit's answer, in the order its parts carry their items; "logits" holds
 * the last rank's TOKEN's first logits in pieces of RING_AUDIT_LOGITS_PIECE bytes (base64
 * strings), so that a large vocabulary's go in several parts. */
#define RING_AUDIT_ARRAYS {"outputs", "inputs", "received", "token_ids", "logits"}
#define RING_AUDIT_LOGITS_PIECE (96u << 10)
struct net_identity;
/* The canonical bytes "KVMKT1\n" METHOD "\n" PATH "\n" hex(SHA-256(body)) "\n" TS "\n" NONCE
 * into out (RING_MARKET_CANON_MAX): their length, or -ENAMETOOLONG. */
int ring_market_canon(char *out, const char *method, const char *path, const void *body,
                     size_t len, int64_t ts, const char *nonce);
/* The four headers of a call signed by id, "Name: value" without line ends, in lines: over
 * method, path, body, ts and nonce (16 to 64 hex). X-Kv-Node names as's key (NULL: id's own;
 * another's makes a wrong-key call, for tests). 0, or a negative errno. */
#define RING_MARKET_HDR_MAX 160
int ring_market_sign(const struct net_identity *id, const struct net_identity *as, const char *method,
                     const char *path, const void *body, size_t len, int64_t ts, const char *nonce,
                     char lines[4][RING_MARKET_HDR_MAX]);
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
/* The root that leaf, as leaf idx of a tree of n leaves, and path[len] lead to: false when the
 * path's length does not fit the tree. */
bool ring_merkle_root_from(const uint8_t leaf[32], size_t idx, size_t n,
                           const uint8_t (*path)[32], size_t len, uint8_t root[32]);
/* Whether leaf is leaf idx of a tree of n leaves with that root, by path[len]. */
bool ring_merkle_verify(const uint8_t leaf[32], size_t idx, size_t n, const uint8_t (*path)[32],
                        size_t len, const uint8_t root[32]);

/* ================================ protocol ================================ */
/* Ring links (docs/design.md, "The ring data path"). A link is a byte stream between two
 * stages (net/'s struct net_stream: TCP, or a WebSocket bridge through a relay for relay://
 * endpoints). On top of the stream go frames, all little-endian, with a 28-byte header:
 *
 *   off  0  u32 magic 'KVR1' (0x3152564b)   off 16  u32 pos
 *   off  4  u8  type                        off 20  u32 n_tokens
 *   off  5  u8  flags                       off 24  u32 payload_len (capped per link)
 *   off  6  u16 reserved (0)
 *   off  8  u64 session
 *
 * Payloads by type (the receiver checks every field against its manifest before use):
 *   HELLO  u32 version | u32 rank | u32 n_ranks | char ring[64] (NUL-padded) |
 *          u8 node_key[32] (Ed25519) | u8 manifest_sha256[32] | u8 nonce[32] |
 *          u8 ephemeral[32] (X25519, fresh per link)                             (204 B)
 *   AUTH   u8 sig[64]: Ed25519 over "KVR2-auth" | u8 signer's side | transcript[32]
 *   OPEN   struct ring_open_params (64 B) | i32 prompt tokens[n_tokens]
 *   ACT    n_tokens x n_embd boundary values in the wire dtype (flag LAST: sample after it;
 *          flag DRAFT with LAST: a verifying pass, the last rank samples at every row)
 *   TOKEN  i32 tokens[n_tokens] | f32 logprobs[n_tokens] | i32 drafts[n_drafts]
 *          [| f32 logits[n_tokens][n_vocab] with flag LOGITS]: the tokens sampled, at positions
 *          pos .. pos + n_tokens - 1 (1 .. RING_TOKENS_MAX), and the last rank's guesses of the
 *          ones after them (n_drafts, 0 .. RING_DRAFTS_MAX, from payload_len)
 *   CLOSE  empty
 *   ERROR  u32 code | UTF-8 message (<= RING_ERRMSG_MAX bytes; printable ASCII is all a
 *          receiver keeps: util_text_clean)
 *   PING / PONG  u64 sender's monotonic ns (echoed in PONG)
 *   STATUS one stage's status record, a JSON object (<= RING_STATUS_MAX bytes); session 0,
 *          n_tokens = the rank it describes, pos = its age in ms when sent; flags 0. Both
 *          directions of an established link carry it (docs/design.md, "The ring data path").
 *
 * Handshake (docs/security.md): each side sends HELLO with a fresh nonce and a fresh X25519
 * key as soon as the stream is up. On the peer's HELLO it checks everything (version, ring,
 * ranks, manifest hash, node key when the manifest names one) before it signs anything;
 * then it sends AUTH, a signature over the transcript hash
 *   transcript = SHA-256("KVR2-transcript" | HELLO of the up side | HELLO of the down side)
 * and its own side (RING_HS_UP: the predecessor's end, which sends the ring's data; RING_HS_DOWN:
 * the successor's end), so an AUTH is good for this one link, this direction and these two
 * HELLOs only. The link is established when the peer's AUTH verifies with the other side.
 * A mismatch sends ERROR with the reason (so both sides log it) and closes the link.
 *
 * Records: after AUTH every frame travels sealed (ring_rec below) with a key per direction,
 *   key(up -> down), key(down -> up) = HKDF-SHA256(X25519 secret, salt transcript,
 *                                                  info "KVR2 up->down" / "KVR2 down->up")
 *   record = u32 len (LE, bytes that follow) | ChaCha20-Poly1305(frame) | tag[16]
 * with the length as associated data and the nonce 0u32 | u64 sequence number (LE), counted
 * per direction from 0. A record that does not open (altered, replayed, reordered, dropped,
 * truncated) closes the link; so does a sequence number that would wrap. */


#define RING_MAGIC        0x3152564bu  /* "KVR1" little-endian */
#define RING_VERSION      4u
#define RING_HDR_LEN      28u
#define RING_HELLO_LEN    204u
#define RING_AUTH_LEN     64u
#define RING_RING_ID_MAX  64u          /* ring id bytes, NUL-padded on the wire */
#define RING_ERRMSG_MAX      1024u        /* ERROR message bytes */
#define RING_STATUS_MAX   1024u        /* STATUS record bytes (fits every link's payload cap) */
#define RING_PAYLOAD_HARD_MAX (256u << 20) /* no link accepts a payload above this */
#define RING_DRAFTS_MAX   14u          /* drafts a TOKEN carries and a verifying pass checks:
                                       * 15 rows, where every weight type is row-exact */
#define RING_TOKENS_MAX   (RING_DRAFTS_MAX + 1u)   /* tokens one TOKEN carries */

/* The receipts of the last edge (the last rank's sent side, rank 0's received side) commit to
 * the session's sampling as well as its rows (docs/market.md, "Audits"): their digest is
 * SHA-256(0x02 || SHA-256(sampling) || root), sampling the first RING_SAMPLING_LEN bytes of the
 * OPEN payload (seed, temperature, top_p, min_p, the penalties, top_k, penalty_last_n: what a
 * replay's OPEN repeats), so an audit judges the last rank's tokens by the parameters it
 * received, and rank 0 could not have sent it others. */
#define RING_SAMPLING_LEN 40u
void ring_receipt_fold(const uint8_t root[32], const uint8_t sampling[RING_SAMPLING_LEN],
                       uint8_t out[32]);

/* A TOKEN frame's Merkle leaf (docs/market.md, "Audits") is not its payload but a summary of
 * it that names its parts, so an audit opens a TOKEN's tokens without its logits:
 *   u32le RING_TOKEN_LEAF_MAGIC | u16le n_tokens | u16le n_drafts | i32 tokens[n] |
 *   f32 logprobs[n] | i32 drafts[d] [| u8 sha256[n][32]: SHA-256 of each token's row of
 *   logits (f32[n_vocab]), when the logits went along]
 * (all little-endian). No vocabulary reaches the magic as a token id, so a summary never
 * reads as a raw TOKEN payload, the leaf of protocol versions before 4. */
#define RING_TOKEN_LEAF_MAGIC 0x3254564bu   /* "KVT2" little-endian */
#define RING_TOKEN_LEAF_MAX (8u + 8u * RING_TOKENS_MAX + 4u * RING_DRAFTS_MAX + 32u * RING_TOKENS_MAX)
struct ring_token_leaf {
    uint32_t n, n_drafts;
    const uint8_t *tokens, *logprobs, *drafts;   /* little-endian i32 / f32 arrays */
    const uint8_t *logits_sha;                   /* [n][32], or NULL: no logits went along */
};
/* The summary of a TOKEN payload of n tokens (a vocabulary of n_vocab, which tells drafts from
 * logits) into out, *out_len bytes; *logits the offset of the logits in the payload (0: none).
 * 0, or -EINVAL for a payload that is no TOKEN of n tokens. */
int ring_token_leaf_make(const uint8_t *payload, size_t len, uint32_t n, uint32_t n_vocab,
                         uint8_t out[RING_TOKEN_LEAF_MAX], size_t *out_len, size_t *logits);
/* A summary read back: 0; -ENOENT for a row that is no summary (a raw payload of an older
 * protocol); -EINVAL for a malformed one. */
int ring_token_leaf_parse(const uint8_t *row, size_t len, struct ring_token_leaf *t);

enum ring_frame_type {
    RING_F_HELLO = 1, RING_F_AUTH = 2, RING_F_OPEN = 3, RING_F_ACT = 4, RING_F_TOKEN = 5,
    RING_F_CLOSE = 6, RING_F_ERROR = 7, RING_F_PING = 8, RING_F_PONG = 9, RING_F_STATUS = 10,
    RING_F_MAX = 10
};
/* ERROR codes, the u32 that opens an ERROR payload. */
enum ring_err_code {
    RING_ERR_SESSION = 1,     /* the session failed */
    RING_ERR_PROTO = 2,       /* session 0: a protocol violation or handshake failure; the
                              * sender closes the link */
    RING_ERR_LIMIT = 3,       /* a limit (too many sessions) */
    RING_ERR_RING = 4,        /* a ring link is down: rank 0 may pause the session until the
                              * ring is repaired and replay it (docs/ring.md, "Repair") */
    /* Link reports (docs/design.md, "The ring data path"): session 0, about the link rank
     * pos -> pos + 1, down (the message is why) or up again, sent by a stage about its out
     * link back over its in link and passed on by every stage back to rank 0. Unlike other
     * session-0 ERRORs they leave the link they travel on up. */
    RING_ERR_LINK_DOWN = 5,
    RING_ERR_LINK_UP = 6,
};
enum ring_frame_flag {
    RING_FL_LAST = 1,     /* ACT: the last chunk of a step: the last rank samples after it */
    RING_FL_LOGITS = 2,   /* OPEN: send logits with every TOKEN; TOKEN: logits follow */
    RING_FL_REPLAY = 4,   /* OPEN: a session replayed after a repair; its prompt is the whole
                          * history, which every stage recomputes */
    RING_FL_DRAFT = 8,    /* ACT (with LAST): rows of a verifying pass, the token sampled last
                          * and drafts after it; every stage keeps what it needs to drop the
                          * rows of rejected drafts, the last rank samples at every row */
};

struct ring_frame_hdr {
    uint32_t magic;
    uint8_t type, flags;
    uint16_t reserved;
    uint64_t session;
    uint32_t pos, n_tokens, payload_len;
};

/* OPEN payload head (64 bytes on the wire, little-endian, in this order). */
struct ring_open_params {
    uint64_t seed;
    float temperature, top_p, min_p, repeat_penalty, freq_penalty, presence_penalty;
    int32_t top_k, penalty_last_n;
    uint32_t max_tokens;      /* generated tokens rank 0 will ask for (informative) */
    uint32_t n_ctx;           /* context the session needs (prompt + generation) */
    uint32_t draws;           /* random draws the sampler made before (a replay after a repair:
                               * the generated tokens so far), so it continues its sequence */
    uint8_t draft_max;        /* drafts the last rank proposes with each TOKEN (0: none; at
                               * most RING_DRAFTS_MAX) */
    uint8_t draft_kind;       /* how it drafts (enum ring_draft_kind) */
    uint8_t reserved[10];
};
/* OPEN draft_kind: the last rank's drafter. Prompt lookup works for every model; the MTP
 * block only where the last window holds one (a session asking for it elsewhere fails with
 * an error saying so); auto takes the MTP block where there is one, else prompt lookup. */
enum ring_draft_kind {
    RING_DRAFT_LOOKUP = 0,
    RING_DRAFT_MTP = 1,
    RING_DRAFT_AUTO = 2,
    RING_DRAFT_KIND_MAX = 2,
};
#define RING_OPEN_LEN 64u

/* Name of a frame type ("ACT"), "?" when unknown. */
const char *ring_frame_type_name(uint32_t type);
/* Encode h into out[RING_HDR_LEN] (magic set by the caller or RING_MAGIC when 0). */
void ring_frame_hdr_encode(const struct ring_frame_hdr *h, uint8_t out[RING_HDR_LEN]);
/* Decode and check a header: magic, type range, reserved == 0, payload_len <= max_payload.
 * 0 or -EPROTO/-EMSGSIZE with err naming the field, value and limit. */
int ring_frame_hdr_decode(const uint8_t in[RING_HDR_LEN], struct ring_frame_hdr *h,
                         uint32_t max_payload, char *err, size_t errlen);

void ring_open_encode(const struct ring_open_params *p, uint8_t out[RING_OPEN_LEN]);
void ring_open_decode(const uint8_t in[RING_OPEN_LEN], struct ring_open_params *p);


/* Streaming frame reader: push bytes, pull whole frames. */
struct ring_frame_reader {
    struct util_buf buf;   /* bytes pushed; buf.p[0..off) were pulled already */
    size_t off;
    uint32_t max_payload;
};
void ring_frame_reader_init(struct ring_frame_reader *r, uint32_t max_payload);
void ring_frame_reader_free(struct ring_frame_reader *r);
int ring_frame_reader_push(struct ring_frame_reader *r, const void *data, size_t len);
/* 1 and a frame (payload borrowed until the next call), 0 when more bytes are needed, or a
 * negative code with err filled (the stream is then unusable). */
int ring_frame_reader_next(struct ring_frame_reader *r, struct ring_frame_hdr *h,
                          const uint8_t **payload, char *err, size_t errlen);


struct ring_hello {
    uint32_t version, rank, n_ranks;
    char ring[RING_RING_ID_MAX + 1];
    uint8_t node_key[32], manifest_hash[32], nonce[32], ephemeral[32];
};
void ring_hello_encode(const struct ring_hello *h, uint8_t out[RING_HELLO_LEN]);
int ring_hello_decode(const uint8_t *in, size_t len, struct ring_hello *h, char *err, size_t errlen);

/* What a side expects of its peer. */
struct ring_hs_expect {
    uint32_t rank, n_ranks;
    const char *ring;
    uint8_t manifest_hash[32];
    bool check_key;               /* the manifest names the peer's node key */
    uint8_t node_key[32];
};
/* Which end of a link a side is: up sends the ring's data (the predecessor; it dials over
 * TCP), down receives it (the successor; it accepts, or dials a relay as its down role). */
enum ring_hs_side { RING_HS_UP = 1, RING_HS_DOWN = 2 };
/* Session keys of an established link, as this side uses them. */
struct ring_link_keys {
    uint8_t tx[32], rx[32];
};
/* Handshake state machine over frames (no I/O: it hands back bytes to send). */
struct ring_handshake;
/* mine: own HELLO (version, node key, nonce and ephemeral key filled here); id: own key
 * (borrowed for the handshake's life); side: this side's end of the link. */
int ring_handshake_new(struct ring_handshake **out, const struct net_identity *id,
                      const struct ring_hello *mine, const struct ring_hs_expect *expect,
                      enum ring_hs_side side);
void ring_handshake_free(struct ring_handshake *hs);
/* The HELLO frame to send first: bytes borrowed from hs. */
void ring_handshake_hello(struct ring_handshake *hs, const uint8_t **bytes, size_t *len);
/* Feed one received frame. Returns 0 (go on), 1 (established) or a negative code with err
 * naming the mismatch. out, outlen: a frame to send now (borrowed; *outlen 0 when none). */
int ring_handshake_feed(struct ring_handshake *hs, const struct ring_frame_hdr *h,
                       const uint8_t *payload, const uint8_t **out, size_t *outlen,
                       char *err, size_t errlen);
/* The peer's HELLO (valid once it has been received). */
const struct ring_hello *ring_handshake_peer(const struct ring_handshake *hs);
/* Before the peer's HELLO is fed: expect node key key instead (a rank that several nodes may
 * serve, its own and standbys: the caller picks from the HELLO's claim). 0, or -EALREADY once
 * the peer's HELLO was taken. */
int ring_handshake_expect_key(struct ring_handshake *hs, const uint8_t key[32]);
/* The reason the peer gave when it refused the link (an ERROR during the handshake: feed
 * returned -ECONNREFUSED), cleaned with util_text_clean and at most RING_REFUSAL_MAX bytes;
 * NULL when it did not refuse. Borrowed from hs. */
#define RING_REFUSAL_MAX 300u
const char *ring_handshake_refusal(const struct ring_handshake *hs);
/* Whether the peer's HELLO arrived and passed every check. */
bool ring_handshake_hello_ok(const struct ring_handshake *hs);
/* The session keys: 0 once established (feed returned 1), -EAGAIN before. */
int ring_handshake_keys(const struct ring_handshake *hs, struct ring_link_keys *keys);

/* Records: one direction of a sealed link (a key and its sequence number). */
#define RING_REC_TAG      16u
#define RING_REC_OVERHEAD (4u + RING_REC_TAG)   /* length prefix + tag */
struct ring_rec;
/* A record direction with key[32], sequence 0. 0 or -ENOMEM/-EIO. */
int ring_rec_new(struct ring_rec **out, const uint8_t key[32]);
void ring_rec_free(struct ring_rec *r);
/* Seal in place: rec[0..4) gets the length, rec[4..4+len) holds the frame and is encrypted,
 * rec[4+len..4+len+RING_REC_TAG) gets the tag. 0, -EMSGSIZE, -EOVERFLOW (sequence spent), -EIO. */
int ring_rec_seal(struct ring_rec *r, uint8_t *rec, size_t len);
/* Take the next record from the reader's bytes, open it and decode its frame (header checked
 * against the reader's cap, payload_len against the record): 1 and a frame (payload borrowed
 * from r until the next call), 0 when more bytes are needed, or a negative code with err
 * filled (the stream is then unusable: the link must close). */
int ring_rec_next(struct ring_rec *r, struct ring_frame_reader *rd, struct ring_frame_hdr *h,
                 const uint8_t **payload, char *err, size_t errlen);
/* Records sealed or opened so far. */
uint64_t ring_rec_seq(const struct ring_rec *r);


/* ---- links ---- */
/* A ring link: frames over a net stream, sealed records once the owner installs the
 * handshake's keys (ring_link_set_keys). A frame that does not decode, or a record that does
 * not open, sends the peer an ERROR saying why and closes the link. */
struct ring_link;
struct ring_link_cbs {
    /* Dial finished: status 0 (stream up) or negative (the link then closes). */
    void (*on_open)(struct ring_link *l, int status);
    /* One whole frame (header checked against the link's payload cap). */
    void (*on_frame)(struct ring_link *l, const struct ring_frame_hdr *h, const uint8_t *payload);
    /* Last callback: the link is closed and freed after it returns. */
    void (*on_close)(struct ring_link *l, const char *reason);
};
/* Dial endpoint "tcp://host:port" (or a scheme registered with net_transport_register);
 * callbacks on the loop. 0, or a negative code with err filled when the dial cannot start (no
 * on_open then). */
int ring_link_dial(struct ring_link **out, uv_loop_t *loop, const char *endpoint,
                   const struct ring_link_cbs *cbs, void *ud, uint32_t max_payload, char *err,
                   size_t errlen);
/* Send one frame: h->payload_len is set from len; header and payload are copied (and sealed
 * once the link has keys). */
int ring_link_send(struct ring_link *l, const struct ring_frame_hdr *h, const void *payload,
                   size_t len);
/* Send raw bytes, never sealed (the handshake; tests and tools). */
int ring_link_send_raw(struct ring_link *l, const void *data, size_t len);
/* Seal every frame sent and open every record received from now on (bytes already received
 * and not yet taken as frames included). Called once, when the handshake is established. 0,
 * -EALREADY, -ENOMEM. */
int ring_link_set_keys(struct ring_link *l, const struct ring_link_keys *keys);
/* Close with a reason (logged by the owner in on_close). Safe from any callback; idempotent. */
void ring_link_close(struct ring_link *l, const char *reason);
void *ring_link_ud(const struct ring_link *l);
void ring_link_set_ud(struct ring_link *l, void *ud);
void ring_link_set_max_payload(struct ring_link *l, uint32_t max_payload);
const char *ring_link_peer(const struct ring_link *l);   /* "127.0.0.1:4100" */
bool ring_link_is_closing(const struct ring_link *l);
uint64_t ring_link_bytes_in(const struct ring_link *l);
uint64_t ring_link_bytes_out(const struct ring_link *l);
size_t ring_link_queued(const struct ring_link *l);      /* bytes handed to the transport, unwritten */

/* A TCP listener whose every accepted stream becomes a link with cbs (ud given to each). */
struct ring_listener;
typedef void (*ring_accept_cb)(struct ring_listener *ls, struct ring_link *l, void *ud);
/* addr "host:port" (port 0 picks one). */
int ring_listener_new(struct ring_listener **out, uv_loop_t *loop, const char *addr,
                      const struct ring_link_cbs *cbs, ring_accept_cb on_accept, void *ud,
                      uint32_t max_payload, char *err, size_t errlen);
int ring_listener_port(const struct ring_listener *ls);
/* Stop listening; ls is freed once its handle has closed, and done (may be NULL) runs then. */
void ring_listener_close(struct ring_listener *ls, void (*done)(void *ud), void *ud);

#endif

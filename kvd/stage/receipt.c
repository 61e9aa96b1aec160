/* receipt.c — the stage's receipts of work (docs/market.md, "Receipts and credit"): per
 * session, the positions this stage ran through its window and SHA-256 digests of the
 * boundary bytes it sent and received. When the session ends here, its receipts go as JSON
 * lines to the file kvd_stage_opts.receipts names (kvd join signs and submits them); without
 * that option nothing is kept.
 *
 * Every rank sees the same session end (rank 0 finishes it, CLOSE goes round), so the two
 * signers of one receipt cut it at the same place: the sender's "sent" side names the
 * positions it ran and the digest of what it sent; its successor's "received" side names the
 * positions it received and the digest of those bytes; rank 0 attests the last rank with the
 * positions rank 0 ran (every rank runs the same ones) and the digest of the TOKEN payloads. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "kvd/stage/internal.h"

struct kvd_receipt {
    EVP_MD_CTX *sent, *recv;
    uint32_t t0, t1;            /* positions this stage ran: [t0, t1) */
    uint32_t r0, r1;            /* positions of the boundaries received (ranks > 0) */
    bool ran, got;
};

/* The session's receipt, made on first use; NULL when receipts are off or memory is short. */
static struct kvd_receipt *receipt_of(struct stage *st, struct sess *s)
{
    if (!st->o.receipts)
        return NULL;
    if (!s->receipt) {
        struct kvd_receipt *r = calloc(1, sizeof *r);
        if (!r)
            return NULL;
        r->sent = EVP_MD_CTX_new();
        r->recv = EVP_MD_CTX_new();
        if (!r->sent || !r->recv || !EVP_DigestInit_ex(r->sent, EVP_sha256(), NULL) ||
            !EVP_DigestInit_ex(r->recv, EVP_sha256(), NULL)) {
            EVP_MD_CTX_free(r->sent);
            EVP_MD_CTX_free(r->recv);
            free(r);
            return NULL;
        }
        s->receipt = r;
    }
    return s->receipt;
}

static void extend(uint32_t *a, uint32_t *b, bool *any, uint32_t pos, uint32_t n)
{
    if (!*any || pos < *a)
        *a = pos;
    if (!*any || pos + n > *b)
        *b = pos + n;
    *any = true;
}

void kvd_receipt_ran(struct stage *st, struct sess *s, uint32_t pos, uint32_t n)
{
    struct kvd_receipt *r = receipt_of(st, s);
    if (r && n)
        extend(&r->t0, &r->t1, &r->ran, pos, n);
}

void kvd_receipt_sent(struct stage *st, struct sess *s, const void *payload, size_t len)
{
    struct kvd_receipt *r = receipt_of(st, s);
    if (r)
        EVP_DigestUpdate(r->sent, payload, len);
}

void kvd_receipt_received(struct stage *st, struct sess *s, uint32_t pos, uint32_t n,
                          const void *payload, size_t len)
{
    struct kvd_receipt *r = receipt_of(st, s);
    if (!r)
        return;
    EVP_DigestUpdate(r->recv, payload, len);
    if (st->rank != 0)
        extend(&r->r0, &r->r1, &r->got, pos, n);
    else
        r->got = true;
}

/* One line of this stage's receipts: the session's model and ring generation (the manifest's
 * SHA-256) come first, then what varies. */
static void put(struct stage *st, int fd, uint64_t session, const char *rest)
{
    char man[65], line[640];
    util_hex_encode(st->m.hash, 32, man);
    int n = snprintf(line, sizeof line, "{\"model\":\"%s\",\"manifest\":\"%s\",\"session\":\"%016"
                     PRIx64 "\",%s}\n", st->m.catalog, man, session, rest);
    /* one write per line on an O_APPEND file: a reader never sees half of one that was
     * written whole */
    if (n > 0 && (size_t)n < sizeof line && write(fd, line, (size_t)n) != n)
        kvd_log(KVD_LOG_WARN, "receipts %s: %s", st->o.receipts, strerror(errno));
}

static void put_line(struct stage *st, int fd, uint64_t session, uint32_t rank, uint32_t t0,
                     uint32_t t1, EVP_MD_CTX *md, const char *side)
{
    unsigned char dg[32];
    unsigned dl = 0;
    char hex[65], rest[256];
    if (!EVP_DigestFinal_ex(md, dg, &dl))
        return;
    util_hex_encode(dg, 32, hex);
    snprintf(rest, sizeof rest, "\"rank\":%u,\"tokens\":[%u,%u],\"digest\":\"%s\",\"side\":\"%s\"",
             rank, t0, t1, hex, side);
    put(st, fd, session, rest);
}

/* Rank 0's open side: the paying client that opened the session, and the proof (made with the
 * client's verifier, which only a holder of its key can make) binding it to the positions
 * [0, t1) of this session in this ring generation. */
static void put_open(struct stage *st, int fd, const struct sess *s, uint32_t t1)
{
    char man[65], sid[17], proof[65], rest[320];
    util_hex_encode(st->m.hash, 32, man);
    snprintf(sid, sizeof sid, "%016" PRIx64, s->id);
    ring_client_proof(s->client_v, st->m.catalog, man, sid, t1, proof);
    snprintf(rest, sizeof rest, "\"rank\":0,\"tokens\":[0,%u],\"side\":\"open\",\"client\":\"%s\","
             "\"proof\":\"%s\"", t1, s->client_id, proof);
    put(st, fd, s->id, rest);
}

void kvd_receipt_close(struct stage *st, struct sess *s)
{
    struct kvd_receipt *r = s->receipt;
    if (!r)
        return;
    s->receipt = NULL;
    int fd = open(st->o.receipts, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0) {
        kvd_log(KVD_LOG_WARN, "receipts %s: %s", st->o.receipts, strerror(errno));
    } else {
        if (r->ran && st->rank == 0 && s->has_client)
            put_open(st, fd, s, r->t1);
        if (r->ran)
            put_line(st, fd, s->id, st->rank, r->t0, r->t1, r->sent, "sent");
        /* rank 0 attests the last rank over the positions it ran itself */
        if (r->got && st->rank != 0)
            put_line(st, fd, s->id, st->pred, r->r0, r->r1, r->recv, "received");
        else if (r->got && r->ran)
            put_line(st, fd, s->id, st->pred, r->t0, r->t1, r->recv, "received");
        close(fd);
    }
    EVP_MD_CTX_free(r->sent);
    EVP_MD_CTX_free(r->recv);
    free(r);
}

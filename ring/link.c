/* link.c — ring links: frames over a net stream (net/stream.c), sealed records once the owner
 * installs the handshake's keys (record.c). A link lives as long as its stream: it is freed in
 * the stream's last callback, after its owner's on_close. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ring/ring.h"
#include "util/err.h"
#include "util/util.h"

/* A whole sealed frame of the largest payload is one write of the stream. */
_Static_assert((uint64_t)RING_PAYLOAD_HARD_MAX + RING_HDR_LEN + RING_REC_OVERHEAD <=
                   NET_STREAM_MSG_MAX,
               "a sealed ring frame must fit one stream message");

struct ring_link {
    struct net_stream *s;
    struct ring_link_cbs cbs;
    void *ud;
    struct ring_frame_reader rd;
    struct ring_rec *tx, *rx;    /* set by ring_link_set_keys: every frame sealed from then on */
};

struct ring_listener {
    struct net_listener *ls;
    struct ring_link_cbs cbs;
    ring_accept_cb on_accept;
    void *ud;
    uint32_t max_payload;
    void (*done)(void *ud);      /* ring_listener_close's callback */
    void *done_ud;
};

static struct ring_link *link_new(const struct ring_link_cbs *cbs, void *ud, uint32_t max_payload)
{
    struct ring_link *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->cbs = *cbs;
    l->ud = ud;
    ring_frame_reader_init(&l->rd, max_payload);
    return l;
}

static void link_free(struct ring_link *l)
{
    ring_frame_reader_free(&l->rd);
    ring_rec_free(l->tx);
    ring_rec_free(l->rx);
    free(l);
}

/* ---- the stream's callbacks ---- */

static void st_on_open(struct net_stream *s, int status)
{
    struct ring_link *l = net_stream_ud(s);
    if (l && l->cbs.on_open)
        l->cbs.on_open(l, status);
}

static void st_on_data(struct net_stream *s, const void *data, size_t len)
{
    struct ring_link *l = net_stream_ud(s);
    if (!l)
        return;
    if (ring_frame_reader_push(&l->rd, data, len) < 0) {
        net_stream_close(s, "out of memory buffering a frame");
        return;
    }
    struct ring_frame_hdr h;
    const uint8_t *payload;
    char err[KV_ERR_MAX];
    int rc;
    /* The owner may install keys inside on_frame (the handshake's end): the bytes after it
     * are records, so the kind of the next read is decided each time round. */
    while (!net_stream_is_closing(s) &&
           (rc = l->rx ? ring_rec_next(l->rx, &l->rd, &h, &payload, err, sizeof err)
                       : ring_frame_reader_next(&l->rd, &h, &payload, err, sizeof err)) != 0) {
        if (rc < 0) {
            char r[KV_ERR_MAX + 16];
            snprintf(r, sizeof r, "%s: %s", rc == -EBADMSG ? "bad record" : "bad frame", err);
            /* Tell the peer why before closing (an ERROR frame about the link: session 0). */
            uint8_t eb[4 + sizeof r];
            size_t n = strlen(r);
            util_le32_put(eb, RING_ERR_PROTO);
            memcpy(eb + 4, r, n);
            struct ring_frame_hdr eh = {.magic = RING_MAGIC, .type = RING_F_ERROR};
            ring_link_send(l, &eh, eb, 4 + n);
            net_stream_close(s, r);
            return;
        }
        l->cbs.on_frame(l, &h, payload);
    }
}

static void st_on_close(struct net_stream *s, const char *reason)
{
    struct ring_link *l = net_stream_ud(s);
    if (!l)
        return;
    if (l->cbs.on_close)
        l->cbs.on_close(l, reason);
    link_free(l);
}

static const struct net_stream_cbs stream_cbs = {
    .on_open = st_on_open, .on_data = st_on_data, .on_close = st_on_close,
};

/* ---- links ---- */

int ring_link_dial(struct ring_link **out, uv_loop_t *loop, const char *endpoint,
                   const struct ring_link_cbs *cbs, void *ud, uint32_t max_payload, char *err,
                   size_t errlen)
{
    struct ring_link *l = link_new(cbs, ud, max_payload);
    if (!l) {
        snprintf(err, errlen, "endpoint %s: out of memory", endpoint);
        return -ENOMEM;
    }
    int rc = net_stream_dial(&l->s, loop, endpoint, &stream_cbs, l, err, errlen);
    if (rc < 0) {
        link_free(l);
        return rc;
    }
    *out = l;
    return 0;
}

int ring_link_send_raw(struct ring_link *l, const void *data, size_t len)
{
    return net_stream_send(l->s, data, len);
}

int ring_link_send(struct ring_link *l, const struct ring_frame_hdr *h, const void *payload,
                   size_t len)
{
    if (net_stream_is_closing(l->s))
        return -EPIPE;
    if (len > RING_PAYLOAD_HARD_MAX)
        return -EMSGSIZE;
    size_t pre = l->tx ? 4 : 0, post = l->tx ? RING_REC_TAG : 0;
    uint8_t *b = malloc(pre + RING_HDR_LEN + len + post);
    if (!b)
        return -ENOMEM;
    struct ring_frame_hdr hh = *h;
    hh.payload_len = (uint32_t)len;
    ring_frame_hdr_encode(&hh, b + pre);
    if (len)
        memcpy(b + pre + RING_HDR_LEN, payload, len);
    if (l->tx) {
        int rc = ring_rec_seal(l->tx, b, RING_HDR_LEN + len);
        if (rc < 0) {
            free(b);
            return rc;
        }
    }
    return net_stream_write(l->s, b, pre + RING_HDR_LEN + len + post);
}

int ring_link_set_keys(struct ring_link *l, const struct ring_link_keys *keys)
{
    if (l->tx || l->rx)
        return -EALREADY;
    int rc = ring_rec_new(&l->tx, keys->tx);
    if (rc == 0 && (rc = ring_rec_new(&l->rx, keys->rx)) < 0) {
        ring_rec_free(l->tx);
        l->tx = NULL;
    }
    return rc;
}

void ring_link_close(struct ring_link *l, const char *reason) { net_stream_close(l->s, reason); }
void *ring_link_ud(const struct ring_link *l) { return l->ud; }
void ring_link_set_ud(struct ring_link *l, void *ud) { l->ud = ud; }
void ring_link_set_max_payload(struct ring_link *l, uint32_t m) { l->rd.max_payload = m; }
const char *ring_link_peer(const struct ring_link *l) { return net_stream_peer(l->s); }
bool ring_link_is_closing(const struct ring_link *l) { return net_stream_is_closing(l->s); }
uint64_t ring_link_bytes_in(const struct ring_link *l) { return net_stream_bytes_in(l->s); }
uint64_t ring_link_bytes_out(const struct ring_link *l) { return net_stream_bytes_out(l->s); }
size_t ring_link_queued(const struct ring_link *l) { return net_stream_queued(l->s); }

/* ---- listener ---- */

/* An accepted stream becomes a link before any of its bytes are read; a link that cannot be
 * made closes the stream (its callbacks then find no link and do nothing). */
static void ls_on_accept(struct net_listener *nls, struct net_stream *s, void *ud)
{
    (void)nls;
    struct ring_listener *ls = ud;
    struct ring_link *l = link_new(&ls->cbs, ls->ud, ls->max_payload);
    net_stream_set_ud(s, l);
    if (!l) {
        net_stream_close(s, "out of memory accepting a link");
        return;
    }
    l->s = s;
    ls->on_accept(ls, l, ls->ud);
}

int ring_listener_new(struct ring_listener **out, uv_loop_t *loop, const char *addr,
                      const struct ring_link_cbs *cbs, ring_accept_cb on_accept, void *ud,
                      uint32_t max_payload, char *err, size_t errlen)
{
    struct ring_listener *ls = calloc(1, sizeof *ls);
    if (!ls) {
        snprintf(err, errlen, "listen on %s: out of memory", addr);
        return -ENOMEM;
    }
    ls->cbs = *cbs;
    ls->on_accept = on_accept;
    ls->ud = ud;
    ls->max_payload = max_payload;
    int rc = net_listener_new(&ls->ls, loop, addr, &stream_cbs, ls_on_accept, ls, err, errlen);
    if (rc < 0) {
        free(ls);
        return rc;
    }
    *out = ls;
    return 0;
}

int ring_listener_port(const struct ring_listener *ls) { return net_listener_port(ls->ls); }

/* The net listener's handle is closed: the ring listener goes with it, then done runs. */
static void ls_on_closed(void *ud)
{
    struct ring_listener *ls = ud;
    void (*done)(void *) = ls->done;
    void *done_ud = ls->done_ud;
    free(ls);
    if (done)
        done(done_ud);
}

void ring_listener_close(struct ring_listener *ls, void (*done)(void *ud), void *ud)
{
    if (!ls)
        return;
    ls->done = done;
    ls->done_ud = ud;
    net_listener_close(ls->ls, ls_on_closed, ls);
}

/* The client's side of the WebSocket handshake (RFC 6455 section 4): the server's response
 * parsed by http-parser (the server side is net's HTTP server, ws_server.c), and the
 * Sec-WebSocket-Accept computation both sides use. Only the headers the handshake needs are
 * kept; the status line and all headers together are capped at 8 KiB. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <http_parser.h>
#include <openssl/evp.h>
#include <openssl/sha.h>

#include "net/ws_internal.h"

#define HTTP_MAX_HEAD 8192

static const char WS_GUID[] = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";

int net_ws_accept_key(const char *key, char out[29])
{
    out[0] = 0;
    if (!key)
        return -EINVAL;
    size_t kl = strlen(key);
    /* base64 of 16 bytes is 24 characters ending in "==" */
    if (kl != 24 || key[22] != '=' || key[23] != '=')
        return -EINVAL;
    unsigned char raw[18];
    if (EVP_DecodeBlock(raw, (const unsigned char *)key, 24) != 18)
        return -EINVAL;
    for (size_t i = 0; i < 22; i++)
        if (!isalnum((unsigned char)key[i]) && key[i] != '+' && key[i] != '/')
            return -EINVAL;
    char cat[24 + sizeof WS_GUID];
    memcpy(cat, key, 24);
    memcpy(cat + 24, WS_GUID, sizeof WS_GUID);
    unsigned char md[SHA_DIGEST_LENGTH];
    SHA1((const unsigned char *)cat, 24 + sizeof WS_GUID - 1, md);
    EVP_EncodeBlock((unsigned char *)out, md, SHA_DIGEST_LENGTH);
    return 0;
}

/* ---------------------------------------------------------------- parser glue */

enum { H_NONE, H_UPGRADE, H_CONNECTION, H_ACCEPT, H_COUNT };

struct net__http {
    http_parser p;
    size_t head_bytes;
    bool done, error, last_was_value;
    int cur;                 /* which header the current value belongs to */
    char field[64];
    size_t field_len;
    bool field_long;
    struct util_buf val[H_COUNT];
    char errmsg[96];
};

static int http_grow(struct net__http *h, struct util_buf *b, const char *at, size_t n)
{
    h->head_bytes += n;
    if (h->head_bytes > HTTP_MAX_HEAD) {
        snprintf(h->errmsg, sizeof h->errmsg, "request head over %d bytes", HTTP_MAX_HEAD);
        return -1;
    }
    return util_buf_append(b, at, n, HTTP_MAX_HEAD) < 0 ? -1 : 0;
}

static int header_id(const char *f)
{
    if (!strcasecmp(f, "upgrade")) return H_UPGRADE;
    if (!strcasecmp(f, "connection")) return H_CONNECTION;
    if (!strcasecmp(f, "sec-websocket-accept")) return H_ACCEPT;
    return H_NONE;
}

static int on_field(http_parser *p, const char *at, size_t n)
{
    struct net__http *h = p->data;
    h->head_bytes += n;
    if (h->head_bytes > HTTP_MAX_HEAD) {
        snprintf(h->errmsg, sizeof h->errmsg, "request head over %d bytes", HTTP_MAX_HEAD);
        return -1;
    }
    if (h->last_was_value) {
        h->field_len = 0;
        h->field_long = false;
        h->last_was_value = false;
    }
    if (h->field_len + n >= sizeof h->field) {
        h->field_long = true;
        return 0;
    }
    memcpy(h->field + h->field_len, at, n);
    h->field_len += n;
    h->field[h->field_len] = 0;
    return 0;
}

static int on_value(http_parser *p, const char *at, size_t n)
{
    struct net__http *h = p->data;
    if (!h->last_was_value) {
        h->last_was_value = true;
        h->cur = h->field_long ? H_NONE : header_id(h->field);
        /* a repeated header joins the list with a comma, as HTTP allows */
        if (h->cur != H_NONE && h->val[h->cur].p && http_grow(h, &h->val[h->cur], ",", 1))
            return -1;
    }
    if (h->cur == H_NONE) {
        h->head_bytes += n;
        if (h->head_bytes > HTTP_MAX_HEAD) {
            snprintf(h->errmsg, sizeof h->errmsg, "request head over %d bytes", HTTP_MAX_HEAD);
            return -1;
        }
        return 0;
    }
    return http_grow(h, &h->val[h->cur], at, n);
}

static int on_headers_complete(http_parser *p)
{
    struct net__http *h = p->data;
    h->done = true;
    return 1; /* no body expected for GET or 101; "skip body" */
}

static const http_parser_settings http_settings = {
    .on_header_field = on_field,
    .on_header_value = on_value,
    .on_headers_complete = on_headers_complete,
};

struct net__http *net__http_new(void)
{
    struct net__http *h = calloc(1, sizeof *h);
    if (!h)
        return NULL;
    http_parser_init(&h->p, HTTP_RESPONSE);
    h->p.data = h;
    h->last_was_value = true;
    return h;
}

void net__http_free(struct net__http *h)
{
    if (!h)
        return;
    for (int i = 0; i < H_COUNT; i++)
        util_buf_free(&h->val[i]);
    free(h);
}

int net__http_feed(struct net__http *h, const uint8_t *data, size_t len, size_t *used)
{
    *used = 0;
    if (h->done)
        return 1;
    size_t n = http_parser_execute(&h->p, &http_settings, (const char *)data, len);
    enum http_errno e = HTTP_PARSER_ERRNO(&h->p);
    if (h->done) {
        /* http-parser stops right after the head of an upgrade; on a plain request it may
         * report the "skip body" return as consumed: either way the head ends at n. */
        *used = n;
        return 1;
    }
    if (e != HPE_OK) {
        if (!h->errmsg[0])
            snprintf(h->errmsg, sizeof h->errmsg, "malformed HTTP: %s", http_errno_name(e));
        h->error = true;
        return -EPROTO;
    }
    *used = n;
    return 0;
}

const char *net__http_error(const struct net__http *h)
{
    return h->errmsg[0] ? h->errmsg : "malformed HTTP";
}

int net__http_status(const struct net__http *h)
{
    return h->p.status_code;
}

static const char *http_header(const struct net__http *h, int id)
{
    return h->val[id].s;
}

const char *net__http_accept(const struct net__http *h) { return http_header(h, H_ACCEPT); }

bool net__http_has_token(const char *v, const char *token)
{
    if (!v)
        return false;
    size_t tl = strlen(token);
    const char *s = v;
    while (*s) {
        while (*s == ' ' || *s == '\t' || *s == ',')
            s++;
        const char *e = s;
        while (*e && *e != ',')
            e++;
        const char *t = e;
        while (t > s && (t[-1] == ' ' || t[-1] == '\t'))
            t--;
        if ((size_t)(t - s) == tl && !strncasecmp(s, token, tl))
            return true;
        s = e;
    }
    return false;
}

bool net__http_upgrade_ws(const struct net__http *h)
{
    return net__http_has_token(http_header(h, H_UPGRADE), "websocket");
}

bool net__http_connection_upgrade(const struct net__http *h)
{
    return net__http_has_token(http_header(h, H_CONNECTION), "upgrade");
}

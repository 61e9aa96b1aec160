/* client.c — what rank 0 writes to its control-socket clients: one JSON object a line, each
 * line its own write (a client that is closing gets nothing more), and a client's memory freed
 * once its pipe has closed. session.c keeps the list of clients and their sessions. */
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/stage/internal.h"

void kvd_client_on_closed(uv_handle_t *h)
{
    struct client *c = h->data;
    util_buf_free(&c->buf);
    free(c);
}

struct wreq {
    uv_write_t req;
    uv_buf_t buf;
};

static void client_on_written(uv_write_t *req, int status)
{
    (void)status;
    struct wreq *w = (struct wreq *)req;
    free(w->buf.base);
    free(w);
}

void kvd_client_send(struct client *c, const char *line)
{
    if (c->closing)
        return;
    size_t n = strlen(line);
    struct wreq *w = malloc(sizeof *w);
    char *b = malloc(n + 1);
    if (!w || !b) {
        free(w);
        free(b);
        return;
    }
    memcpy(b, line, n);
    b[n] = '\n';
    w->buf = uv_buf_init(b, (unsigned)(n + 1));
    if (uv_write(&w->req, (uv_stream_t *)&c->pipe, &w->buf, 1, client_on_written) < 0) {
        free(b);
        free(w);
    }
}

void kvd_client_send_json(struct client *c, cJSON *o)
{
    char *s = cJSON_PrintUnformatted(o);
    if (s) {
        kvd_client_send(c, s);
        free(s);
    }
    cJSON_Delete(o);
}

void kvd_client_error(struct client *c, const char *msg)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "error", msg);
    kvd_client_send_json(c, o);
}

/* store.c — a market store by its URL: postgres:// or postgresql:// (libpq; several market
 * instances sharing one database) or a file path (SQLite, the embedded default); and its
 * blobs as JSON. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/market/internal.h"
#include "util/util.h"

int kvd_market__store_open(struct kvd_market_store **out, const char *url, char *err,
                           size_t errlen)
{
    *out = NULL;
    if (!strncmp(url, "postgres://", 11) || !strncmp(url, "postgresql://", 13)) {
        return kvd_market__pg_open(out, url, err, errlen);
    }
    return kvd_market__sqlite_open(out, url, err, errlen);
}

void kvd_market__store_close(struct kvd_market_store *s)
{
    if (!s)
        return;
    s->ops->close(s->impl);
    free(s);
}

cJSON *kvd_market__blob_load(struct kvd_market_store *s, const char *key)
{
    char *v = NULL;
    if (s->ops->blob_get(s->impl, key, &v))
        return NULL;
    cJSON *o = cJSON_Parse(v);
    free(v);
    return o;
}

int kvd_market__blob_save(struct kvd_market_store *s, const char *key, const cJSON *o)
{
    char *v = cJSON_PrintUnformatted(o);
    int rc = v ? s->ops->blob_put(s->impl, key, v) : -ENOMEM;
    free(v);
    return rc;
}

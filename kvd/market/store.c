/* store.c — a market store by its URL: postgres:// or postgresql:// (libpq; several market
 * instances sharing one database) or a file path (SQLite, the embedded default). */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

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

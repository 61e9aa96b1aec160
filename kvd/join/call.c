/* call.c — what every step of the join role shares: its calls to the market (JSON answers,
 * signed with the node key when asked), the stop flag its signals set, a sleep the flag cuts
 * short, random numbers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/rand.h>

#include "kvd/join/internal.h"
#include "util/err.h"
#include "util/util.h"

volatile sig_atomic_t kvd_join__stop_flag;
void kvd_join__on_stop(int sig) { (void)sig; kvd_join__stop_flag = 1; }

void kvd_join__sleep_ms(uint32_t ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) && !kvd_join__stop_flag)
        ;
}

uint32_t kvd_join__rand_u32(void)
{
    uint32_t v = 0;
    if (RAND_bytes((unsigned char *)&v, sizeof v) != 1)
        v = (uint32_t)getpid() * 2654435761u ^ (uint32_t)time(NULL);
    return v;
}

/* A call whose answer is JSON: the object (caller deletes) or NULL; *status the HTTP status
 * (0 when the market did not answer). signed_: with the node key. */
cJSON *kvd_join__call(struct join *j, const char *method, const char *path, cJSON *body, bool signed_,
                   long *status)
{
    char err[KV_ERR_MAX], *resp = NULL, *b = body ? cJSON_PrintUnformatted(body) : NULL;
    cJSON_Delete(body);
    int rc = ring_market_call(j->market, method, path, b, signed_ ? j->id : NULL, CALL_MS, status,
                              &resp, err, sizeof err);
    free(b);
    if (rc < 0) {
        kvd_log(KVD_LOG_WARN, "market: %s", err);
        *status = 0;
        return NULL;
    }
    cJSON *o = cJSON_Parse(resp);
    if (*status >= 400) {
        const cJSON *e = cJSON_GetObjectItemCaseSensitive(o, "error");
        kvd_log(KVD_LOG_WARN, "market: %s %s: HTTP %ld: %s", method, path, *status,
                cJSON_IsString(e) ? e->valuestring : resp);
    }
    free(resp);
    return o;
}

const char *kvd_join__jstr_or(const cJSON *o, const char *key, const char *def)
{
    const char *v = util_json_string(o, key);
    return v ? v : def;
}

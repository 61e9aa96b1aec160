/* pull.c — the claimed window onto this node: the model's catalog from the market, then just
 * that window pulled from the model's sources and verified against it, heartbeats keeping the
 * lease meanwhile. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "gguf/gguf.h"
#include "kvd/join/internal.h"
#include "seed/seed.h"
#include "util/err.h"
#include "util/util.h"

/* The model's catalog from the market into DIR, checked against the model id. */
int kvd_join__fetch_catalog(struct join *j)
{
    char path[128], err[KV_ERR_MAX], *resp = NULL, id[65];
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/catalog", j->model);
    if (ring_market_call(j->market, "GET", path, NULL, NULL, CALL_MS, &st, &resp, err, sizeof err) < 0 ||
        st != 200) {
        kvd_log(KVD_LOG_ERROR, "catalog of %s: %s", j->model, resp ? resp : err);
        free(resp);
        return -EIO;
    }
    struct gguf_catalog *c;
    int rc = gguf_catalog_from_json(&c, resp, strlen(resp), id, err, sizeof err);
    if (rc == 0 && strcmp(id, j->model)) {
        snprintf(err, sizeof err, "its SHA-256 is %s", id);
        rc = -EINVAL;
    }
    gguf_catalog_free(rc == 0 ? c : NULL);
    if (rc) {
        kvd_log(KVD_LOG_ERROR, "the market's catalog for %s: %s", j->model, err);
        free(resp);
        return rc;
    }
    snprintf(j->catalog_path, sizeof j->catalog_path, "%s/catalog-%.16s.json", j->dir, j->model);
    FILE *f = fopen(j->catalog_path, "w");
    if (!f || fwrite(resp, 1, strlen(resp), f) != strlen(resp) || fclose(f)) {
        kvd_log(KVD_LOG_ERROR, "%s: %s", j->catalog_path, strerror(errno));
        free(resp);
        return -EIO;
    }
    free(resp);
    return 0;
}

struct pull_job {
    struct seed_pull_opts o;
    int rc;
    volatile int done;
    char err[KV_ERR_MAX];
    struct seed_pull_stats st;
};

static void *pull_thread(void *ud)
{
    struct pull_job *p = ud;
    p->rc = seed_pull(&p->o, &p->st, p->err, sizeof p->err);
    __atomic_store_n(&p->done, 1, __ATOMIC_RELEASE);
    return NULL;
}

static void pull_log(void *ud, int kind, const char *line)
{
    (void)ud;
    if (kind == SEED_PULL_LINE)
        kvd_log(KVD_LOG_INFO, "%s", line);
}

/* Pull the claimed window from the model's sources (each in turn), heartbeating meanwhile:
 * 0, -EPERM when the lease was lost, or another negative code. */
int kvd_join__pull(struct join *j)
{
    snprintf(j->window_path, sizeof j->window_path, "%s/window-%u-%u.gguf", j->dir, j->first, j->last);
    struct stat sb;
    if (stat(j->window_path, &sb) == 0) {
        kvd_log(KVD_LOG_INFO, "window %s is here already", j->window_path);
        return 0;
    }
    char path[128];
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/sources", j->model);
    cJSON *src = kvd_join__call(j, "GET", path, NULL, false, &st);
    if (!cJSON_IsArray(src)) {
        cJSON_Delete(src);
        return -EAGAIN;
    }
    int rc = -ENOENT;
    const cJSON *s;
    cJSON_ArrayForEach(s, src) {
        if (!cJSON_IsString(s))
            continue;
        static volatile int cancel;
        cancel = 0;
        struct pull_job *p = calloc(1, sizeof *p);
        if (!p) {
            rc = -ENOMEM;
            break;
        }
        p->o = (struct seed_pull_opts){.url = s->valuestring, .first = j->first, .last = j->last,
                                       .catalog_path = j->catalog_path, .model_id = j->model,
                                       .out_path = j->window_path, .progress = 1, .log = pull_log,
                                       .cancel = &cancel};
        pthread_t t;
        if (pthread_create(&t, NULL, pull_thread, p)) {
            free(p);
            rc = -EAGAIN;
            break;
        }
        double next = 0;
        bool lost = false;
        while (!__atomic_load_n(&p->done, __ATOMIC_ACQUIRE)) {
            if (util_now_s() >= next) {
                if (kvd_join__heartbeat(j, NULL, 0) == -EPERM) {
                    lost = true;
                    cancel = 1;
                }
                next = util_now_s() + j->reserve_s / 4;
            }
            if (kvd_join__stop_flag)
                cancel = 1;
            kvd_join__sleep_ms(200);
        }
        pthread_join(t, NULL);
        rc = p->rc;
        if (rc == 0)
            kvd_log(KVD_LOG_INFO, "pulled window [%u, %u) from %s (%llu bytes), verified", j->first,
                    j->last, s->valuestring, (unsigned long long)p->st.bytes_fetched);
        else
            kvd_log(KVD_LOG_WARN, "pull from %s: %s", s->valuestring, p->err);
        free(p);
        if (lost)
            rc = -EPERM;
        if (rc == 0 || lost || kvd_join__stop_flag)
            break;
    }
    cJSON_Delete(src);
    return rc;
}

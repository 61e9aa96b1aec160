/* receipts.c — what the ring owes and whom it serves: the stage's receipts submitted to the
 * market (with backoff), and the paying clients' keys rank 0's API lets in. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvd/join/internal.h"
#include "util/err.h"
#include "util/util.h"

/* Submit the receipts the stage wrote (DIR/receipts.jsonl, one JSON line a side of a
 * session's receipt) past the offset kept in DIR/receipts.offset, each signed with the node
 * key. A receipt the market answered (2xx, or 4xx: refused, or 409: submitted before) is done;
 * one it did not answer (no answer, 5xx) is tried again later with backoff. The market never
 * credits a (session, rank, range, side) twice, so a resubmission after a timeout or after a
 * crash before the offset was saved is answered 409 and changes nothing: that key is the
 * receipt's idempotency key. Returns how many are still pending (0: all done). */
int kvd_join__receipts_submit(struct join *j)
{
    FILE *f = fopen(j->receipts_path, "r");
    if (!f)
        return 0;
    long off = 0;
    FILE *of = fopen(j->offset_path, "r");
    if (of) {
        if (fscanf(of, "%ld", &off) != 1 || off < 0)
            off = 0;
        fclose(of);
    }
    int pending = 0;
    char line[1024];
    if (fseek(f, off, SEEK_SET))
        off = 0;
    long start = off;
    while (fgets(line, sizeof line, f)) {
        size_t n = strlen(line);
        if (n == 0 || line[n - 1] != '\n') {
            pending++;   /* written in part so far */
            break;
        }
        cJSON *b = cJSON_Parse(line);
        if (!cJSON_IsObject(b)) {
            kvd_log(KVD_LOG_WARN, "%s: skipping a line that is not a receipt", j->receipts_path);
            cJSON_Delete(b);
            off += (long)n;
            continue;
        }
        if (!cJSON_GetObjectItemCaseSensitive(b, "model"))
            cJSON_AddStringToObject(b, "model", j->model);
        long st;
        cJSON *o = kvd_join__call(j, "POST", "/v1/receipts", b, true, &st);
        if (st >= 400 && st < 500 && st != 409) {
            const char *e = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "error"));
            kvd_log(KVD_LOG_WARN, "the market refused a receipt (%ld): %s", st, e ? e : "?");
        }
        cJSON_Delete(o);
        if (st == 0 || st >= 500) {
            pending++;
            break;
        }
        off += (long)n;
    }
    fclose(f);
    if (off != start) {
        char num[32];
        int k = snprintf(num, sizeof num, "%ld\n", off), wrc = util_file_replace(j->offset_path, num, (size_t)k);
        if (wrc)
            kvd_log(KVD_LOG_WARN, "%s: %s", j->offset_path, strerror(-wrc));
    }
    return pending;
}

/* Write DIR/clients.keys, the keys the ring's API lets in (the stage's API reads it again when
 * it changes): the market's paying clients as last fetched ("sha256:<client id>" lines) and
 * the lines of --api-key-file as they are now (plain keys or "sha256:" lines; the API checks
 * them). Written only when its text changed, through a rename. */
void kvd_join__clients_write(struct join *j)
{
    size_t cap = 1 << 20, n = 0;   /* the API caps its keys far below this */
    char *text = malloc(cap), line[600];
    if (!text)
        return;
    n = (size_t)snprintf(text, cap, "# the market's paying clients and --api-key-file's keys, "
                         "written by kvd join\n");
    if (j->market_clients) {
        size_t k = strlen(j->market_clients);
        if (n + k < cap) {
            memcpy(text + n, j->market_clients, k + 1);
            n += k;
        }
    }
    FILE *kf = j->api_keys ? fopen(j->api_keys, "r") : NULL;
    if (j->api_keys && !kf)
        kvd_log(KVD_LOG_WARN, "--api-key-file %s: %s (its keys are not let in now)", j->api_keys,
                strerror(errno));
    while (kf && fgets(line, sizeof line, kf)) {
        size_t k = strlen(line);
        if (k && line[k - 1] != '\n' && k + 1 < sizeof line)
            line[k++] = '\n', line[k] = 0;
        if (n + k + 1 >= cap)
            break;
        memcpy(text + n, line, k + 1);
        n += k;
    }
    if (kf)
        fclose(kf);
    FILE *old = fopen(j->clients_path, "r");
    bool same = false;
    if (old) {
        char *cur = malloc(n + 2);
        size_t got = cur ? fread(cur, 1, n + 1, old) : 0;
        same = cur && got == n && !memcmp(cur, text, n);
        free(cur);
        fclose(old);
    }
    int wrc = same ? 0 : util_file_replace(j->clients_path, text, n);
    if (wrc)
        kvd_log(KVD_LOG_WARN, "%s: %s", j->clients_path, strerror(-wrc));
    free(text);
}

/* The paying clients a market ring's API lets in: refreshed from the market every few
 * seconds (with --api-key-file's keys, clients_write); a market that does not answer leaves
 * its part as it was. */
void kvd_join__clients_refresh(struct join *j)
{
    if (!j->api || j->rank != 0 || util_now_s() < j->clients_next)
        return;   /* only rank 0 serves the API */
    j->clients_next = util_now_s() + CLIENTS_EVERY_S;
    long st;
    cJSON *o = kvd_join__call(j, "GET", "/v1/clients", NULL, false, &st);
    const cJSON *ids = cJSON_GetObjectItemCaseSensitive(o, "payable"), *id;
    if (st == 200 && cJSON_IsArray(ids)) {
        /* each line 72 bytes, at most RING_CLIENTS_LIST_MAX of them whatever the market sends */
        int cnt = cJSON_GetArraySize(ids);
        size_t cap = (size_t)(cnt < RING_CLIENTS_LIST_MAX ? cnt : RING_CLIENTS_LIST_MAX) * 72 + 1, n = 0;
        char *lines = malloc(cap);
        if (lines) {
            lines[0] = 0;
            cJSON_ArrayForEach(id, ids)
                if (cJSON_IsString(id) && strlen(id->valuestring) == 64 &&
                    strspn(id->valuestring, "0123456789abcdef") == 64 && n + 73 <= cap)
                    n += (size_t)snprintf(lines + n, cap - n, "sha256:%s\n", id->valuestring);
            free(j->market_clients);
            j->market_clients = lines;
        }
    }
    cJSON_Delete(o);
    kvd_join__clients_write(j);
}

/* Submit receipts when due: now, or after the backoff a market that did not answer set. */
void kvd_join__receipts_tick(struct join *j)
{
    /* a standby whose takeover the market has not recorded yet: its sides of the sessions it
     * ran would be refused as from a node that held no rank (they go once it has) */
    if (j->standby || util_now_s() < j->receipts_next)
        return;
    if (kvd_join__receipts_submit(j)) {
        j->receipts_backoff_ms = j->receipts_backoff_ms ? j->receipts_backoff_ms * 2 : 1000;
        if (j->receipts_backoff_ms > 30000)
            j->receipts_backoff_ms = 30000;
        j->receipts_next = util_now_s() + j->receipts_backoff_ms / 1000.0;
    } else {
        j->receipts_backoff_ms = 0;
        j->receipts_next = 0;
    }
}

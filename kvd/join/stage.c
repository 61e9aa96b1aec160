/* stage.c — the stage child: the endpoint listened on before the stage takes it over, the
 * stage of our rank started in a child process on each new manifest and stopped, the roster a
 * standby's stage reads, a standby's start and takeover. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>

#include "kvd/join/internal.h"
#include "util/err.h"
#include "util/util.h"

/* The roster of the ring the market serves (GET /v1/models/<id>/roster: standbys named beside
 * the manifest) into DIR/roster.json, which the stage re-reads when it changes. Written only
 * when its text changed, through a rename; a market that does not answer leaves it as it was. */
void kvd_join__roster_refresh(struct join *j)
{
    char path[128], err[KV_ERR_MAX], *resp = NULL;
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/roster", j->model);
    if (ring_market_call(j->market, "GET", path, NULL, NULL, CALL_MS, &st, &resp, err, sizeof err) < 0 ||
        st != 200) {
        free(resp);
        return;
    }
    cJSON *o = cJSON_Parse(resp);
    const char *sha = util_json_string(o, "manifest");
    bool me = false;
    const cJSON *e;
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(o, "standby"))
        me |= util_json_string(e, "node") && !strcmp(util_json_string(e, "node"), j->node);
    if (!sha || strlen(sha) != 64 || (j->roster_text && !strcmp(j->roster_text, resp))) {
        cJSON_Delete(o);
        free(resp);
        return;
    }
    int wrc = util_file_replace(j->roster_path, resp, strlen(resp));
    if (wrc) {
        kvd_log(KVD_LOG_WARN, "%s: %s", j->roster_path, strerror(-wrc));
        cJSON_Delete(o);
        free(resp);
        return;
    }
    snprintf(j->roster_sha, sizeof j->roster_sha, "%s", sha);
    j->roster_me = me;
    free(j->roster_text);
    j->roster_text = resp;
    cJSON_Delete(o);
}

/* A listening TCP socket on hostport (IPv4 HOST:PORT; PORT 0: any free one): its fd, with the
 * port bound in *port; a negative errno. */
int kvd_join__tcp_listen(const char *hostport, uint16_t *port)
{
    char host[256];
    const char *colon = strrchr(hostport, ':');
    if (!colon || (size_t)(colon - hostport) >= sizeof host)
        return -EINVAL;
    memcpy(host, hostport, (size_t)(colon - hostport));
    host[colon - hostport] = 0;
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
    socklen_t sl = sizeof sa;
    if (inet_pton(AF_INET, host, &sa.sin_addr) != 1)
        return -EINVAL;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0)
        return -errno;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) || listen(fd, 16) ||
        getsockname(fd, (struct sockaddr *)&sa, &sl)) {
        int e = -errno;
        close(fd);
        return e;
    }
    *port = ntohs(sa.sin_port);
    return fd;
}

/* Listen on the stage's address until the stage takes it over, so the market's probe finds
 * the endpoint answering (connections wait in the backlog, unanswered). An address still in
 * use (a stage of a node stopped a moment ago on this port) is tried again every second,
 * keeping the reservation meanwhile: 0, -EPERM when the lease was lost, or another negative
 * code. */
int kvd_join__probe_listen(struct join *j)
{
    if (j->relay || j->probe_fd >= 0)
        return 0;
    uint16_t port;
    double next_hb = util_now_s() + j->reserve_s / 4, logged = 0;
    for (;;) {
        int fd = kvd_join__tcp_listen(j->listen, &port);
        if (fd >= 0) {
            j->probe_fd = fd;
            return 0;
        }
        if (fd != -EADDRINUSE || kvd_join__stop_flag)
            return fd;
        if (util_now_s() - logged >= 10) {
            kvd_log(KVD_LOG_INFO, "listen on %s: address in use (a process stopped a moment ago "
                    "may still hold it); trying again every second", j->listen);
            logged = util_now_s();
        }
        kvd_join__sleep_ms(1000);
        if (util_now_s() >= next_hb) {
            if (kvd_join__heartbeat(j, NULL, 0) == -EPERM)
                return -EPERM;
            next_hb = util_now_s() + j->reserve_s / 4;
        }
    }
}

void kvd_join__probe_close(struct join *j)
{
    if (j->probe_fd >= 0)
        close(j->probe_fd);
    j->probe_fd = -1;
}

void kvd_join__stage_stop(struct join *j)
{
    if (j->stage <= 0)
        return;
    kill(j->stage, SIGTERM);
    for (int i = 0; i < 100; i++) {
        if (waitpid(j->stage, NULL, WNOHANG) == j->stage) {
            j->stage = 0;
            return;
        }
        kvd_join__sleep_ms(50);
    }
    kill(j->stage, SIGKILL);
    waitpid(j->stage, NULL, 0);
    j->stage = 0;
}

/* Run the stage of our rank in the manifest in a child that dies with us. */
static int stage_start(struct join *j, int rank)
{
    kvd_join__probe_close(j);
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1)
            _exit(1);
        signal(SIGTERM, SIG_DFL);
        signal(SIGINT, SIG_DFL);
        char prefix[32];
        snprintf(prefix, sizeof prefix, "join/stage %d", rank);
        kvd_log_set_prefix(prefix);
        struct kvd_stage_opts o = {.manifest = j->manifest_path, .rank = rank,
                                   .window = j->window_path, .state_dir = j->dir,
                                   .catalog = j->catalog_path, .n_threads = j->n_threads,
                                   .listen = j->relay ? NULL : j->listen,
                                   .receipts = j->receipts_path, .roster = j->roster_path,
                                   .rowlog_max = j->rowlog_max,
                                   .cl = KERN_CL_OPTS_INIT};
        if (rank < 0)   /* the roster's standby entry for our key, for our window's rank */
            o.is_standby = o.standby_by_key = true;
        if (rank == 0 && j->api) {   /* the ring's API: paying clients and --api-key-file's */
            o.api_listen = j->api;
            o.api_key_file = j->clients_path;
            o.api_keys_reload = true;
            o.chat_template = j->chat_template;
        }
        if (strcmp(j->backend, "cpu"))
            o.backend = j->backend;
        _exit(kvd_stage_run(&o) < 0 ? 1 : 0);
    }
    j->stage = pid;
    j->rank = rank;
    j->clients_next = 0;   /* rank 0's API wants the paying clients at once */
    if (rank < 0)
        kvd_log(KVD_LOG_INFO, "standby stage for rank %d (window %u) started (pid %d) on manifest "
                "%.16s...", j->standby_rank, j->window, (int)pid, j->manifest_sha);
    else
        kvd_log(KVD_LOG_INFO, "stage of rank %d started (pid %d) on manifest %.16s...", rank,
                (int)pid, j->manifest_sha);
    return 0;
}

/* Wait (long-poll) for a manifest other than the one we run: 1 when one came and the stage
 * was (re)started, 0 when none came, negative when it does not name us. */
int kvd_join__manifest_poll(struct join *j, double wait_s)
{
    char path[256], err[KV_ERR_MAX], *resp = NULL;
    long st;
    snprintf(path, sizeof path, "/v1/models/%s/manifest?after=%s&wait=%.0f", j->model,
             j->manifest_sha[0] ? j->manifest_sha : "none", wait_s);
    if (ring_market_call(j->market, "GET", path, NULL, NULL, (int)(wait_s * 1000) + CALL_MS, &st,
                         &resp, err, sizeof err) < 0) {
        kvd_log(KVD_LOG_WARN, "market: %s", err);
        return -EAGAIN;
    }
    if (st != 200) {
        free(resp);
        return 0;
    }
    struct ring_manifest *m = calloc(1, sizeof *m);
    int rc = m ? ring_manifest_parse(m, resp, strlen(resp), err, sizeof err) : -ENOMEM;
    int rank = -1;
    uint8_t me[32];
    util_hex_decode(j->node, me, 32);
    for (uint32_t r = 0; rc == 0 && r < m->n_ranks; r++)
        if (m->ranks[r].has_node && !memcmp(m->ranks[r].node, me, 32))
            rank = (int)r;
    free(m);
    /* as a standby we wait on the manifest whatever it names (a node back after its rank was
     * taken over is still named in it); a holder that it does not name took the rank over in
     * it, and the roster names us for that rank: either way the stage is the roster's standby */
    bool standby = j->standby || (rank < 0 && j->held);
    if (rc || (rank < 0 && !standby)) {
        kvd_log(KVD_LOG_WARN, "the market's manifest %s", rc ? err : "does not name this node");
        free(resp);
        return rc ? rc : -ENOENT;
    }
    int wrc = util_file_replace(j->manifest_path, resp, strlen(resp));
    if (wrc) {
        kvd_log(KVD_LOG_ERROR, "%s: %s", j->manifest_path, strerror(-wrc));
        free(resp);
        return -EIO;
    }
    unsigned char dg[32];
    unsigned dl = 32;
    EVP_Digest(resp, strlen(resp), dg, &dl, EVP_sha256(), NULL);
    util_hex_encode(dg, 32, j->manifest_sha);
    free(resp);
    kvd_join__stage_stop(j);
    if (standby) {   /* started once the roster names us (standby_tick) */
        j->rank = -1;
        kvd_log(KVD_LOG_INFO, "manifest %.16s... does not name this node: standing by for rank "
                "%d", j->manifest_sha, j->standby_rank);
        return 1;
    }
    if ((rc = stage_start(j, rank)))
        return rc;
    return 1;
}

/* A standby's part of the hold loop: its stage started once the roster for the manifest we
 * have names us; a takeover (the stage was dialled for its rank) reported to the market, which
 * makes us the window's holder. */
void kvd_join__standby_tick(struct join *j)
{
    if (!j->manifest_sha[0] || j->rank >= 0)
        return;
    if (j->stage <= 0) {
        if (j->roster_me && !strcmp(j->roster_sha, j->manifest_sha))
            stage_start(j, -1);
        return;
    }
    cJSON *s = kvd_join__stage_status(j);
    int rank = s ? (int)util_json_number(s, "rank", -1) : -1;
    bool waiting = !s || cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(s, "waiting"));
    cJSON_Delete(s);
    if (rank < 0 || waiting)
        return;
    int rc = j->standby ? kvd_join__standby_took(j, rank) : 1;
    if (rc == 1) {
        j->standby = false;
        j->held = true;
        j->rank = rank;
        j->clients_next = 0;
    }
}

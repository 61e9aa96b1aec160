/* service.c — kvd under a service manager: systemd's readiness protocol (sd_notify from
 * libsystemd, when the build found it: Type=notify units), and what SIGHUP means (a config
 * reload for a service, a hang-up for a foreground kvd started from a shell or adb). */
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

#include <uv.h>

#include "kvd/kvd.h"

#ifdef KV_HAVE_SYSTEMD
#include <systemd/sd-daemon.h>
#endif

static void notify(const char *state)
{
#ifdef KV_HAVE_SYSTEMD
    sd_notify(0, state);   /* does nothing without NOTIFY_SOCKET */
#else
    (void)state;
#endif
}

void kvd_service_ready(const char *status)
{
    char buf[512];
    snprintf(buf, sizeof buf, "READY=1\nSTATUS=%s", status ? status : "running");
    notify(buf);
}

void kvd_service_reloading(void) { notify("RELOADING=1"); }
void kvd_service_stopping(void) { notify("STOPPING=1"); }

/* A controlling terminal: opening /dev/tty succeeds only with one. */
static bool has_tty(void)
{
    int fd = open("/dev/tty", O_RDONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return false;
    close(fd);
    return true;
}

bool kvd_sighup_stops(void)
{
    if (!kvd_config_active() || has_tty())
        return true;
    kvd_service_reloading();
    kvd_config_reload();
    notify("READY=1");
    return false;
}

void kvd_port_file_write(const char *path, int port)
{
    FILE *fp = fopen(path, "w");
    if (!fp) {
        kvd_log(KVD_LOG_WARN, "port file %s: cannot write", path);
        return;
    }
    fprintf(fp, "%d\n", port);
    fclose(fp);
}

/* kvd_role_run's signals: one role runs in a process */
static uv_signal_t role_sig[3];
static const int role_signum[3] = {SIGINT, SIGTERM, SIGHUP};
static void (*role_stop)(void *ud);
static void *role_ud;

static void role_on_signal(uv_signal_t *h, int signum)
{
    (void)h;
    if (signum == SIGHUP && !kvd_sighup_stops())
        return;   /* a service's config reload */
    kvd_log(KVD_LOG_INFO, "shutting down: %s", signum == SIGTERM ? "SIGTERM" :
            signum == SIGHUP ? "SIGHUP (hang-up)" : "SIGINT");
    kvd_service_stopping();
    for (int i = 0; i < 3; i++) {
        uv_signal_stop(&role_sig[i]);
        uv_close((uv_handle_t *)&role_sig[i], NULL);
    }
    if (role_stop)
        role_stop(role_ud);
}

int kvd_role_run(uv_loop_t *loop, const char *status, void (*stop)(void *ud), void *ud)
{
    role_stop = stop;
    role_ud = ud;
    for (int i = 0; i < 3; i++) {
        uv_signal_init(loop, &role_sig[i]);
        uv_signal_start(&role_sig[i], role_on_signal, role_signum[i]);
    }
    kvd_service_ready(status);
    return uv_run(loop, UV_RUN_DEFAULT);
}

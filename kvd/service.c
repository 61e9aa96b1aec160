/* service.c — kvd under a service manager: systemd's readiness protocol (sd_notify from
 * libsystemd, when the build found it: Type=notify units), and what SIGHUP means (a config
 * reload for a service, a hang-up for a foreground kvd started from a shell or adb). */
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

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

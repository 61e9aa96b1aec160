#!/usr/bin/env python3
"""listen.py [--wait GOFILE] PORTFILE PORT[,PORT...] -- CMD ARG...: runs CMD with a listening
TCP socket on 127.0.0.1 for each PORT (0: a free one) that it binds first, handed over as
systemd's socket activation does (fds 3.., LISTEN_FDS, LISTEN_PID; kvd takes a handed-over
socket whose address is the one it is told to listen on, net/listen.c). The ports are written
to PORTFILE (space-separated, one line, written whole) and replace {PORT} (the first) and
{PORT0}, {PORT1}, ... in the arguments. The process keeps this one's pid (exec), so `$!` of
`listen.py ... &` is the daemon's. With --wait GOFILE it writes PORTFILE, then waits for
GOFILE to exist before it runs CMD: the ports can go into a manifest (or a plan) that CMD
reads.

Why: a test that picks a free port and then starts a daemon on it leaves a window in which
another program (another test, running side by side) can take the port; a socket bound here
and handed over has none."""
import fcntl
import os
import socket
import sys
import time


def main():
    argv = sys.argv[1:]
    gofile = None
    if len(argv) >= 2 and argv[0] == "--wait":
        gofile, argv = argv[1], argv[2:]
    if len(argv) < 4 or argv[2] != "--":
        sys.stderr.write("usage: listen.py [--wait GOFILE] PORTFILE PORT[,PORT...] -- CMD ARG...\n")
        return 2
    portfile, want, cmd = argv[0], [int(p) for p in argv[1].split(",")], argv[3:]
    n = len(want)
    socks = []
    for port in want:
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        s.listen(128)
        socks.append(s)
    ports = [str(s.getsockname()[1]) for s in socks]
    subst = {"{PORT}": ports[0] if ports else ""}
    for i, p in enumerate(ports):
        subst["{PORT%d}" % i] = p
    args = []
    for a in cmd:
        for k, v in subst.items():
            a = a.replace(k, v)
        args.append(a)
    # the sockets to fds 3..: first above any fd in use, then into place, inheritable
    high = [fcntl.fcntl(s.fileno(), fcntl.F_DUPFD, 100) for s in socks]
    for s in socks:
        s.close()
    for i, fd in enumerate(high):
        os.dup2(fd, 3 + i)
        os.close(fd)
    tmp = portfile + ".tmp"
    with open(tmp, "w") as f:
        f.write(" ".join(ports) + "\n")
    os.rename(tmp, portfile)
    # --wait: the ports are known (a manifest can name them) before CMD starts; it starts once
    # GOFILE exists (the sockets already listen: a peer that comes early waits in the backlog)
    while gofile and not os.path.exists(gofile):
        time.sleep(0.05)
    os.environ["LISTEN_FDS"] = str(n)
    os.environ["LISTEN_PID"] = str(os.getpid())
    os.environ.pop("LISTEN_FDNAMES", None)
    os.execvp(args[0], args)


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""ring_kill.py PID DELAY_MS CLIENT_PID:OUT_FILE:ERR_FILE... -- the repair tests' and the
bench's stopwatch (docs/ring.md, "Repair"): once every client has written its first bytes,
wait DELAY_MS, SIGKILL PID, then print the milliseconds until every client running at the kill
has said on stderr that it resumed (the note comes with its next token) or ended, and how many
were running: "MS N".
- KILL_RESTART=DIR (the node's directory, holding kvd.cmdline, one argument a line): the node
  is started again, as before, as soon as the killed process is dead.
- KILL_SIGNAL=STOP: SIGSTOP instead (a hung node: the links find it silent).
- KILL_OPEN_SOCK=SOCK (rank 0's control socket): wait instead until rank 0 holds as many
  sessions as there are clients (or one has ended).
- KILL_NEED_RUNNING=1: kill nothing when every client has ended by then (a loaded machine
  started some late) and print "0 0", so the caller can try again.
- The clients may be given as @FILE: their specs, read once FILE exists, so that this program
  is up and watching before they start (python starts slowly on a loaded machine)."""
import os, signal, sys, time
import kvd_ctl
def running(p):
    try:
        return open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
def resumed(f):
    with open(f, errors="replace") as fh:
        return "resumed:" in fh.read()
def open_sessions(sock):
    """The sessions rank 0 holds open now (its control socket's status), -1 on no answer."""
    try:
        return int(kvd_ctl.status(sock, 2).get("sessions", -1))
    except (OSError, ValueError):
        return -1
pid = int(sys.argv[1])
specs = sys.argv[3:]
if len(specs) == 1 and specs[0].startswith("@"):
    # the clients' specs come in a file the caller writes once it has started them, so this
    # program is up and watching before they are (python starts slowly on a loaded machine)
    t0 = time.time()
    while not os.path.exists(specs[0][1:]) and time.time() - t0 < 60:
        time.sleep(0.002)
    specs = open(specs[0][1:]).read().split()
cl = [tuple(a.split(":", 2)) for a in specs]
sock = os.environ.get("KILL_OPEN_SOCK")
t0 = time.time()
while time.time() - t0 < 30:
    if sock:   # every client's session open at rank 0 (or one has ended already)
        if open_sessions(sock) >= len(cl) or not all(running(p) for p, _, _ in cl):
            break
    elif not any(os.path.getsize(o) == 0 and running(p) for p, o, _ in cl):
        break
    time.sleep(0.005)
time.sleep(int(sys.argv[2]) / 1000)
if os.environ.get("KILL_NEED_RUNNING") and not any(running(p) for p, _, _ in cl):
    print(0, 0)   # every client had ended: no kill, the caller may try again
    sys.exit(0)
t0 = time.time()
os.kill(pid, signal.SIGSTOP if os.environ.get("KILL_SIGNAL") == "STOP" else signal.SIGKILL)
nd = os.environ.get("KILL_RESTART")
if nd:
    import subprocess
    # the dead node's listening socket closes only once its memory is unmapped (a second or
    # more for an ASan build under load): its successor binds the same endpoint after that
    while running(pid) and time.time() - t0 < 30:
        time.sleep(0.005)
    cmd = open(nd + "/kvd.cmdline").read().split("\n")[:-1]
    with open(nd + "/kvd.log", "ab") as log:
        p = subprocess.Popen(cmd, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    with open(nd + "/kvd.pid", "w") as f:
        f.write(f"{p.pid}\n")
pending = {c for c in cl if running(c[0])}
n = len(pending)
while pending and time.time() - t0 < 120:
    for c in list(pending):
        if resumed(c[2]) or not running(c[0]):
            pending.discard(c)
    time.sleep(0.005)
print(int((time.time() - t0) * 1000), n)

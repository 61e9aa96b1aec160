#!/usr/bin/env python3
"""ring_kill.py PID DELAY_MS CLIENT_PID:OUT_FILE:ERR_FILE... -- the repair tests' and the
bench's stopwatch (docs/ring.md, "Repair"): once every client has written its first bytes,
wait DELAY_MS, SIGKILL PID, then print the milliseconds until every client running at the kill
has said on stderr that it resumed (the note comes with its next token) or ended, and how many
were running: "MS N". With KILL_RESTART=DIR (the node's directory, holding kvd.cmdline, one
argument a line) the node is started again right after the kill, as before. KILL_SIGNAL=STOP
sends SIGSTOP instead (a hung node: the links find it silent)."""
import os, signal, sys, time
def running(p):
    try:
        return open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False
def resumed(f):
    with open(f, errors="replace") as fh:
        return "resumed:" in fh.read()
pid = int(sys.argv[1])
cl = [tuple(a.split(":", 2)) for a in sys.argv[3:]]
t0 = time.time()
while time.time() - t0 < 30 and any(os.path.getsize(o) == 0 and running(p) for p, o, _ in cl):
    time.sleep(0.005)
time.sleep(int(sys.argv[2]) / 1000)
t0 = time.time()
os.kill(pid, signal.SIGSTOP if os.environ.get("KILL_SIGNAL") == "STOP" else signal.SIGKILL)
nd = os.environ.get("KILL_RESTART")
if nd:
    import subprocess
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

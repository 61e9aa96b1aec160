#!/bin/bash
# kvctl ring down signals only its own ring's kvd: it asks each stage over its control socket
# to stop first, and a pid file naming another process (a recycled pid: a `sleep`, another
# ring's kvd, a kvd that started after the pid file was written) leaves that process alive,
# saying so.
. "$(dirname "$0")/../lib/lib.sh"
need_exec "$KVCTL" "$KVD"
M=$(need_model stories260K.gguf) || exit 1

# 1. A ring stops through its control sockets.
A=$T/a
ring_up "$A" --model "$M" --stages 2
PA0=$(rank_pid "$A" 0)
PA1=$(rank_pid "$A" 1)
"$KVCTL" ring down --dir "$A" > "$T/down.a" 2>&1 || fail "ring down: $(cat "$T/down.a")"
grep -q "^ring down: 2 stages stopped" "$T/down.a" || fail "ring down: '$(cat "$T/down.a")'"
for p in $PA0 $PA1; do
    wait_for 5 pid_gone $p || fail "pid $p still running after ring down"
done
grep -q "shutdown requested over the control socket" "$A/rank-0/kvd.log" ||
    fail "rank 0 was not asked over its control socket: $(tail -n 5 "$A/rank-0/kvd.log")"
echo "ok ring down through the control sockets"

# 2. A stale pid file naming a live process that is not kvd: left alone.
S=$T/stale
mkdir -p "$S/rank-0"
sleep 300 &
SLEEP=$!
PIDS="$PIDS $SLEEP"
echo $SLEEP > "$S/rank-0/kvd.pid"
"$KVCTL" ring down --dir "$S" > "$T/down.s" 2>&1 || fail "ring down (stale): $(cat "$T/down.s")"
kill -0 $SLEEP 2>/dev/null || fail "ring down killed the sleep named by a stale pid file"
grep -q "pid $SLEEP .*is not this ring's kvd (its executable is .*sleep.*not kvd): not signalled" "$T/down.s" ||
    fail "no refusal naming the pid: '$(cat "$T/down.s")'"
grep -q "0 stages stopped.*1 stale pid file named another process, left alone" "$T/down.s" ||
    fail "summary: '$(cat "$T/down.s")'"
echo "ok stale pid of a sleep left alive"

# 3. Another ring's kvd named by this ring's pid file: left alone (its command line names
#    the other ring), and the other ring keeps running.
B=$T/b
ring_up "$B" --model "$M" --stages 2
PB0=$(rank_pid "$B" 0)
C=$T/c
mkdir -p "$C/rank-0"
echo $PB0 > "$C/rank-0/kvd.pid"
"$KVCTL" ring down --dir "$C" > "$T/down.c" 2>&1 || fail "ring down (other ring): $(cat "$T/down.c")"
kill -0 $PB0 2>/dev/null || fail "ring down --dir C stopped ring B's rank 0"
grep -q "pid $PB0 .*its command line names neither" "$T/down.c" || fail "no refusal: '$(cat "$T/down.c")'"
wait_linked "$B" 2 10 || fail "ring B unlinked after another dir's ring down"
echo "ok another ring's kvd left alive"

# 4. This ring's own kvd, but the pid file is older than the process (the pid was recycled
#    by a kvd started later) and its control socket is gone: left alone.
touch -d "-1 hour" "$B/rank-0/kvd.pid"
mv "$B/rank-0/kvd.sock" "$B/rank-0/kvd.sock.away"
"$KVCTL" ring down --dir "$B" > "$T/down.b" 2>&1 || fail "ring down (old pid file): $(cat "$T/down.b")"
kill -0 $PB0 2>/dev/null || fail "ring down signalled a kvd that started after its pid file"
grep -q "pid $PB0 .*started .* after its pid file was written (a recycled pid)" "$T/down.b" ||
    fail "no refusal for the start time: '$(cat "$T/down.b")'"
grep -q "1 stage stopped" "$T/down.b" || fail "rank 1 of B not stopped: '$(cat "$T/down.b")'"
kill $PB0
wait_for 20 pid_gone $PB0 || fail "rank 0 of B did not stop on SIGTERM"
echo "ok a kvd younger than its pid file left alone"

finish

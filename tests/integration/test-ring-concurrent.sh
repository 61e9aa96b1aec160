#!/bin/bash
# 8 concurrent sessions with different prompts and lengths through a 3-stage ring each give
# exactly their one-process output (no session sees another's tokens), and every stage
# holds exactly two established ring connections (from /proc/net/tcp and its own fds).
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$(need_model stories260K.gguf) || exit 1
D=$TMP/ring
ring_up "$D" --model "$M" --stages 3
prompts=("1,400" "1,300,301,302" "1,257,258" "1,450,451,452,453,454" "1,280" "1,290,291" "1,310,311,312,313" "1,500")
lens=(40 25 60 33 50 20 45 55)
temps=(0 0 0 0.8 0 0.8 0 0)
for i in $(seq 0 7); do
    "$KVCTL" generate -m "$M" --ids --tokens ${prompts[$i]} -n ${lens[$i]} --temp ${temps[$i]} --seed $((i + 7)) \
        > "$TMP/one.$i" 2>/dev/null || fail "one-process generate $i"
done
pids=""
for i in $(seq 0 7); do
    "$KVCTL" generate --ring "$D" --ids --tokens ${prompts[$i]} -n ${lens[$i]} --temp ${temps[$i]} --seed $((i + 7)) \
        > "$TMP/ring.$i" 2>"$TMP/err.$i" &
    pids="$pids $!"
done
EXTRA_PIDS="$pids"

# While they run: two established TCP connections per stage, one in and one out.
for r in 0 1 2; do
    pid=$(rank_pid "$D" $r)
    inodes=$(ls -l /proc/$pid/fd 2>/dev/null | sed -n 's/.*socket:\[\([0-9]*\)\].*/\1/p' | sort -u)
    port=$(printf '%04X' $(rank_port "$D" $r))
    est=0 inb=0
    # only this stage's own sockets count (another program may hold a connection whose local
    # port has the same number on another address)
    for ino in $inodes; do
        awk -v ino=$ino '$4 == "01" && $10 == ino {found=1} END {exit !found}' /proc/net/tcp /proc/net/tcp6 2>/dev/null && est=$((est + 1))
        awk -v ino=$ino -v p=":$port" '$4 == "01" && $10 == ino && substr($2, length($2) - 4) == p {found=1} END {exit !found}' \
            /proc/net/tcp /proc/net/tcp6 2>/dev/null && inb=$((inb + 1))
    done
    [ $est -eq 2 ] || fail "rank $r (pid $pid) has $est established TCP connections, expected 2"
    [ $inb -eq 1 ] || fail "rank $r: $inb established connections into its port, expected 1"
done
echo "ok two established connections per stage"

for p in $pids; do wait $p || fail "a ring generate failed: $(cat "$TMP"/err.*)"; done
for i in $(seq 0 7); do
    cmp -s "$TMP/one.$i" "$TMP/ring.$i" || fail "session $i: ring '$(cat "$TMP/ring.$i")' vs one process '$(cat "$TMP/one.$i")'"
done
echo "ok 8 concurrent sessions equal their one-process outputs"

# The compute threads ran waiting steps of several sessions as one window run (batches), and
# the outputs above are still each session's own; the status reports the steps' waits. The
# test model's sessions take milliseconds, so on a loaded machine 8 clients may not overlap:
# another wave of the same 8 sessions runs until a batch was seen (5 waves at most).
batched() {
    "$KVCTL" status --ring "$D" --json > "$TMP/status" || return 2
    python3 - "$TMP/status" <<'PY'
import json, sys
runs = 0
for line in open(sys.argv[1]):
    s = json.loads(line)
    b = s["batches"]
    assert b["max_rows"] <= 15 and (b["runs"] == 0 or b["max_steps"] >= 2), b
    # every step's wait from being queued to its run: counted for each step the stage ran,
    # none longer than the whole test (no step left behind), the mean within the max
    assert b["wait_budget_ms"] == 0, b
    assert b["waited_steps"] >= s["steps"] > 0 and b["step_runs"] > 0, (s["steps"], b)
    assert 0 <= b["mean_wait_ms"] <= b["max_wait_ms"] < 60000, b
    assert 0 <= b["max_decode_wait_ms"] <= b["max_wait_ms"], b
    assert 0 < b["mean_run_ms"] <= b["max_run_ms"], b
    runs += b["runs"]
print("batched window runs:", runs)
sys.exit(0 if runs > 0 else 3)   # 3: no batch yet (1: a counter is wrong)
PY
}
wave() { # the 8 sessions at once again, each still its own one-process output
    local i p pids=""
    for i in $(seq 0 7); do
        "$KVCTL" generate --ring "$D" --ids --tokens ${prompts[$i]} -n ${lens[$i]} --temp ${temps[$i]} \
            --seed $((i + 7)) > "$TMP/ring.$i" 2>"$TMP/err.$i" &
        pids="$pids $!"
    done
    for p in $pids; do wait $p || fail "a ring generate failed: $(cat "$TMP"/err.*)"; done
    for i in $(seq 0 7); do
        cmp -s "$TMP/one.$i" "$TMP/ring.$i" || fail "session $i: ring '$(cat "$TMP/ring.$i")' vs one process '$(cat "$TMP/one.$i")'"
    done
}
waves=1
while :; do
    batched
    rc=$?
    if [ $rc = 0 ]; then
        echo "ok steps of several sessions were batched (in $waves wave(s) of 8 sessions)"
        break
    elif [ $rc != 3 ]; then
        fail "the batch counters are wrong: $(cat "$TMP/status")"
        break
    elif [ $waves -ge 5 ]; then
        fail "no window run took several sessions' steps in $waves waves: $(cat "$TMP/status")"
        break
    fi
    waves=$((waves + 1))
    wave
done
echo PASS

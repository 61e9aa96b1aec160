#!/bin/bash
# A dead stage costs no tokens (docs/ring.md, "Repair"): 8 concurrent generations (four greedy,
# four sampled at temperature 0.8 with fixed seeds: the last rank's sampler continues its draws
# after a replay) run through a 3-stage loopback ring (f32 wire) with three standby nodes; SIGKILL of the middle
# stage at a random point, then of the last one, then SIGSTOP of the middle one (a hung node,
# found by the default link deadline, 3 s on loopback, and passed over without a handshake
# timeout): a standby takes over each time, every
# session's text equals its one-process text, no client sees an error, each says on stderr
# that it resumed, and no stage keeps a session afterwards. The time from the kill to every
# running session's next token is printed (a figure, not a limit). Then SIGKILL of rank 0,
# which holds the sessions' history: every client ends with an error saying rank 0 died, and
# the other stages free the sessions.
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$(need_model TinyLLama-v0-q4_0.gguf) || exit 1
D=$TMP/ring
ring_up "$D" --model "$M" --stages 3 --standby 3
grep -q '"standby"' "$D/ring.json" || fail "no standby entries in the manifest"
"$KVCTL" status --ring "$D" | grep -q "^standby 1 .* waiting" || fail "standbys not shown: $("$KVCTL" status --ring "$D")"

prompts=("Once upon a time" "The little dog" "Lily and Tom went to the park" "One day, a bird"
         "Tim had a red ball" "The sun was hot" "Sue liked to draw" "A big bear")
lens=(260 220 240 200 260 210 250 230)
# sessions 4-7 sample: temperature 0.8, a seed each
samp=("--temp 0" "--temp 0" "--temp 0" "--temp 0" "--temp 0.8 --seed 11" "--temp 0.8 --seed 12"
      "--temp 0.8 --seed 13" "--temp 0.8 --seed 14")
for i in $(seq 0 7); do
    "$KVCTL" generate -m "$M" -p "${prompts[$i]}" -n ${lens[$i]} ${samp[$i]} --ignore-eos \
        > "$TMP/one.$i" 2>/dev/null || fail "one-process generate $i"
done

# rank_field RANK KEY: a figure of the status of the node serving RANK now
rank_field() {
    "$KVCTL" status --ring "$D" --json 2>/dev/null | python3 -c '
import json, sys
for l in sys.stdin:
    o = json.loads(l)
    if o.get("rank") == int(sys.argv[1]) and o.get("linked"):
        print(o[sys.argv[2]]); break' "$1" "$2"
}

# start_round: the 8 sessions of round $ROUND (kill_during's START)
start_round() {
    local i
    for i in $(seq 0 7); do
        "$KVCTL" generate --ring "$D" -p "${prompts[$i]}" -n ${lens[$i]} ${samp[$i]} --ignore-eos \
            > "$TMP/$ROUND.$i" 2> "$TMP/$ROUND.err.$i" &
        CLIENT_PIDS="$CLIENT_PIDS $!"
        CLIENT_ARGS="$CLIENT_ARGS $!:$TMP/$ROUND.$i:$TMP/$ROUND.err.$i"
    done
}

# round NAME RANK [STOP]: 8 sessions, RANK's node killed (or stopped) at a random point of
# them; all must resume.
round() {
    local name=$1 rank=$2 sig=${3:-KILL} i pids="" ms pid running
    pid=$(serving_pid "$D" "$rank")
    [ -n "$pid" ] || fail "$name: nobody serves rank $rank"
    # what the stages upstream of the dead rank recomputed for replays so far
    local r up_before=""
    for r in $(seq 0 $((rank - 1))); do up_before="$up_before $(rank_field "$r" replayed_positions)"; done
    local from_log0
    from_log0=$(rank_field 0 replays_from_log)
    ROUND=$name
    kill_during "$D/rank-0/kvd.sock" "$pid" 300 "$sig" start_round
    pids=$CLIENT_PIDS ms=$KILL_MS running=$KILL_RUNNING
    i=0
    for p in $pids; do
        wait "$p" || fail "$name: session $i failed: $(cat "$TMP/$name.err.$i")"
        ! grep -q "error" "$TMP/$name.err.$i" || fail "$name: session $i saw an error: $(cat "$TMP/$name.err.$i")"
        cmp -s "$TMP/one.$i" "$TMP/$name.$i" ||
            fail "$name: session $i differs from its one-process text:
one:  $(cat "$TMP/one.$i")
ring: $(cat "$TMP/$name.$i")
stderr: $(cat "$TMP/$name.err.$i")"
        i=$((i + 1))
    done
    local resumed
    resumed=$(cat "$TMP/$name".err.* | grep -c "resumed [0-9]* time")
    SAMPLED_RESUMED=$((SAMPLED_RESUMED + $(cat "$TMP/$name".err.[4-7] | grep -c "resumed [0-9]* time")))
    [ "$resumed" -ge 1 ] || fail "$name: no client said it resumed ($running were running at the kill)"
    echo "ok $name: rank $rank (pid $pid) SIG$sig with $running of 8 sessions running; every text as one process" \
         "($resumed said they resumed); kill -> every running session's next token: $ms ms (rank 0: the" \
         "break it saw -> next token $(rank0_repair "$D" last_resume_ms | cut -d. -f1) ms)"
    # Boundary logs: the stages upstream of the dead rank resent what they had sent and
    # recomputed nothing; rank 0 says so per session.
    local up_after=""
    for r in $(seq 0 $((rank - 1))); do up_after="$up_after $(rank_field "$r" replayed_positions)"; done
    [ "$up_after" = "$up_before" ] ||
        fail "$name: stages upstream of rank $rank recomputed replayed positions:$up_before ->$up_after"
    [ "$(rank_field 0 replays_from_log)" -gt "$from_log0" ] || fail "$name: rank 0 replayed nothing from its boundary log"
    grep -q "replay from the boundary log" "$D/rank-0/kvd.log" || fail "$name: rank 0's log does not say it replayed from its boundary log"
    echo "ok $name: upstream of rank $rank nothing recomputed (replayed positions:$up_after), the dead rank's replacement recomputed $(rank_field "$rank" replayed_positions)"
    wait_for 10 ring_idle "$D" || fail "$name: $(ring_sessions "$D") sessions left on the nodes"
    [ "$(rank0_repair "$D" paused_sessions)" = 0 ] || fail "$name: paused sessions left at rank 0"
}

SAMPLED_RESUMED=0
round middle 1
"$KVCTL" status --ring "$D" | grep -q "^standby 0 .* serves rank 1" ||
    fail "standby 0 does not serve rank 1: $("$KVCTL" status --ring "$D")"
round last 2
"$KVCTL" status --ring "$D" | grep -q "^standby 1 .* serves rank 2" ||
    fail "standby 1 does not serve rank 2: $("$KVCTL" status --ring "$D")"
stopped=$(serving_pid "$D" 1)
round stopped 1 STOP
kill -9 "$stopped"
"$KVCTL" status --ring "$D" | grep -q "^standby 2 .* serves rank 1" ||
    fail "standby 2 does not serve rank 1: $("$KVCTL" status --ring "$D")"
"$KVCTL" status --ring "$D" | grep -q "^repair: .* 3 ring breaks" || fail "repairs not shown: $("$KVCTL" status --ring "$D")"
"$KVCTL" status --ring "$D" | grep -q "^replayed on rank 0: [1-9][0-9]* sessions, 0 positions recomputed" ||
    fail "rank 0's replays from its log not shown: $("$KVCTL" status --ring "$D")"
"$KVCTL" status --ring "$D" | grep -q "^standby 2 .* [1-9][0-9]* replayed: [1-9][0-9]* positions recomputed" ||
    fail "what the standby recomputed not shown: $("$KVCTL" status --ring "$D")"
grep -q "replay recomputes its [0-9]* positions here (new to this stage)" "$D/standby-2/kvd.log" ||
    fail "the standby's log does not say it recomputed the replays"
"$KVCTL" status --ring "$D"

[ "$SAMPLED_RESUMED" -ge 1 ] || fail "no sampled session resumed in any round (the test's timing)"
echo "ok $SAMPLED_RESUMED sampled sessions resumed with the text of their uninterrupted runs"
# The same seen from rank 0's socket alone (its view over the ring's links): the standby that
# serves rank 1 now, the ring linked, and the repairs with the rank last repaired.
repaired() {
    "$KVCTL" status --ring "unix:$D/rank-0/kvd.sock" > "$TMP/st0" 2>&1 &&
        grep -q "^standby 2 .* serves rank 1" "$TMP/st0" && grep -Eq "; [3-9] repairs, the last at .* \(rank 1\)" "$TMP/st0" &&
        [ "$(grep -Ec "^[0-2] .* up +up " "$TMP/st0")" = 3 ]
}
wait_for 10 repaired || fail "rank 0's view lacks the standby, the repairs or 3 ranks up: $(cat "$TMP/st0")"
echo "ok rank 0's view: standby 2 serves rank 1, $(grep -o '[0-9]* repairs' "$TMP/st0")"

# Rank 0 dies: its sessions' history goes with it; the clients say so, the others free them.
pids=""
for i in 0 1 2 3; do
    "$KVCTL" generate --ring "$D" -p "${prompts[$i]}" -n 300 --temp 0 --ignore-eos > "$TMP/r0.$i" 2> "$TMP/r0.err.$i" &
    pids="$pids $!"
done
EXTRA_PIDS="$EXTRA_PIDS $pids"
wait_for 20 bash -c "for i in 0 1 2 3; do [ \$(stat -c %s $TMP/r0.\$i) -ge 20 ] || exit 1; done" ||
    fail "rank 0 round: the sessions did not start"
kill -9 "$(rank_pid "$D" 0)"
i=0
for p in $pids; do
    if wait "$p"; then fail "session $i ended well although rank 0 died"; fi
    grep -q "rank 0 .* died" "$TMP/r0.err.$i" || fail "session $i: no clear error: $(cat "$TMP/r0.err.$i")"
    i=$((i + 1))
done
echo "ok rank 0 killed: $(head -c 300 "$TMP/r0.err.0")"
free_all() {
    local n
    n=$("$KVCTL" status --ring "$D" --json 2>/dev/null | grep -v unreachable | python3 -c '
import json, sys
print(sum(json.loads(l).get("sessions", 0) for l in sys.stdin))')
    [ "$n" = 0 ]
}
wait_for 10 free_all || fail "sessions left on the other stages after rank 0 died: $("$KVCTL" status --ring "$D")"
echo "ok the other stages freed the sessions"
finish

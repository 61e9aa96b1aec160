#!/bin/bash
# test-weight: 2 (several stages computing at once)
# Repeated repairs (docs/ring.md, "Repair"): for about a minute, 4 concurrent greedy
# generations at a time through a 3-stage loopback ring with one standby, and every few
# seconds SIGKILL of whichever node serves rank 1 or 2 (its own node, or the standby that took
# it over), started again at once in its old role (a rank's node rejoins when its predecessor
# dials it again; a standby waits again). Every session's text equals its one-process text
# and no client sees an error; afterwards no node holds a session and rank 0 has none paused.
# The boundary logs are capped tiny (0.02 MiB a session, about 80 positions of this model).
# Odd rounds, the first among them, kill once rank 0 has dropped the logs of all four
# sessions (a position, not a time, which a slow machine reaches later): those replays
# recompute from rank 0, and the fallback is shown to give the same text too. Even rounds
# kill within 0.8 s of the first tokens, while the logs hold every position.
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$(need_model TinyLLama-v0-q4_0.gguf) || exit 1
D=$TMP/ring
ring_up "$D" --model "$M" --stages 3 --standby 1 --repair-wait 30 --link-timeout-ms 4000 \
    --boundary-log-mb 0.02
prompts=("Once upon a time" "The little dog" "Lily and Tom went to the park" "One day, a bird")
lens=(300 260 280 240)
for i in 0 1 2 3; do
    "$KVCTL" generate -m "$M" -p "${prompts[$i]}" -n ${lens[$i]} --temp 0 --ignore-eos \
        > "$TMP/one.$i" 2>/dev/null || fail "one-process generate $i"
done

# boundary logs rank 0 has dropped so far; all four sessions' since a count N
dropped() { grep -c "boundary log dropped" "$D/rank-0/kvd.log"; }
dropped_since() { [ "$(dropped)" -ge $(($1 + 4)) ]; }

SECS=${RESUME_REPEAT_SECS:-60}
end=$((SECONDS + SECS))
round=0 kills=0 resumed=0
while [ $SECONDS -lt $end ]; do
    round=$((round + 1))
    rank=$((1 + RANDOM % 2))
    wait_linked "$D" 3 20 || fail "round $round: the ring did not link again: $("$KVCTL" status --ring "$D")"
    pid=$(serving_pid "$D" "$rank")
    [ -n "$pid" ] || fail "round $round: nobody serves rank $rank: $("$KVCTL" status --ring "$D")"
    nd=$(dirname "$(grep -lx "$pid" "$D"/*/kvd.pid)")
    node_cmdline "$pid" > "$nd/kvd.cmdline"
    pids="" args=""
    drops=$(dropped)
    for i in 0 1 2 3; do
        "$KVCTL" generate --ring "$D" -p "${prompts[$i]}" -n ${lens[$i]} --temp 0 --ignore-eos \
            > "$TMP/r$round.$i" 2> "$TMP/r$round.err.$i" &
        pids="$pids $!"
        args="$args $!:$TMP/r$round.$i:$TMP/r$round.err.$i"
    done
    EXTRA_PIDS="$EXTRA_PIDS $pids"
    if [ $((round % 2)) -eq 1 ]; then   # (at most 60 s: the round goes on either way)
        wait_for 60 dropped_since "$drops" || true
    fi
    read -r ms running < <(KILL_RESTART=$nd kill_measure "$pid" $((RANDOM % 800)) $args)
    kills=$((kills + 1))
    i=0
    for p in $pids; do
        wait "$p" || fail "round $round: session $i failed: $(cat "$TMP/r$round.err.$i")"
        ! grep -q "error" "$TMP/r$round.err.$i" || fail "round $round: session $i saw an error: $(cat "$TMP/r$round.err.$i")"
        cmp -s "$TMP/one.$i" "$TMP/r$round.$i" || fail "round $round: session $i differs from its one-process text"
        grep -q "resumed [0-9]* time" "$TMP/r$round.err.$i" && resumed=$((resumed + 1))
        i=$((i + 1))
    done
    echo "round $round: rank $rank's node ($(basename "$nd"), pid $pid) killed with $running sessions running;" \
         "kill -> next token of every one: $ms ms; texts as one process"
done
[ "$resumed" -ge 1 ] || fail "no session resumed in $round rounds"
# Nothing left behind: no session on any node (a killed node's sessions die with it), none paused.
wait_for 15 ring_idle "$D" || fail "$(ring_sessions "$D") sessions left: $("$KVCTL" status --ring "$D")"
[ "$(rank0_repair "$D" paused_sessions)" = 0 ] || fail "paused sessions left at rank 0"
echo "ok $kills kills in $SECS s, $resumed sessions resumed, no session left on any node"
grep -q "boundary log dropped" "$D/rank-0/kvd.log" || fail "rank 0 never dropped a boundary log over the tiny cap"
recomputed=$(grep -c "replay recomputes all" "$D/rank-0/kvd.log")
[ "$recomputed" -ge 1 ] || fail "no replay fell back to recomputing from rank 0"
echo "ok $recomputed replays recomputed from rank 0 (logs dropped), $(grep -c "replay from the boundary log" "$D/rank-0/kvd.log") from rank 0's log; texts as one process either way"
"$KVCTL" status --ring "$D" | tail -3
finish

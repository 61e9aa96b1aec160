#!/bin/bash
# SIGKILL of a middle stage during a generation: the client gets a clear error naming the
# broken link within 5 s (whether rank 0 learns it from the session or from its own link
# state first, the message names the link); the other stages stay up and link into a ring again (and generate)
# once the stage is back. Uses the stand-in compute (--stub) so a generation lasts long
# enough to be interrupted on any machine.
. "$(dirname "$0")/../lib/ring_lib.sh"

D=$TMP/ring
ring_up "$D" --stub --layers 6 --embd 2048 --stages 3
"$KVCTL" generate --ring "$D" --ids --tokens 1,2,3 -n 4000 --temp 0 --ignore-eos > "$TMP/out" 2> "$TMP/err" &
GEN=$!
EXTRA_PIDS="$GEN"
for i in $(seq 100); do
    [ $(wc -w < "$TMP/out") -ge 5 ] && break
    sleep 0.05
done
[ $(wc -w < "$TMP/out") -ge 5 ] || fail "the generation did not start: $(cat "$TMP/err")"
PID1=$(rank_pid "$D" 1)
t0=$(date +%s%N)
kill -9 $PID1
wait $GEN
rc=$?
t1=$(date +%s%N)
ms=$(( (t1 - t0) / 1000000 ))
[ $rc -ne 0 ] || fail "the client exited 0 after the stage died"
grep -qE "ring link rank (0 -> rank 1|1 -> rank 2) .*broke|ring not linked: link rank (0 -> rank 1|1 -> rank 2) is down" "$TMP/err" || fail "the error does not name the broken link: $(cat "$TMP/err")"
[ $ms -lt 5000 ] || fail "the client waited $ms ms for the error"
echo "ok client error after $ms ms: $(cat "$TMP/err")"
kill -0 $(rank_pid "$D" 0) && kill -0 $(rank_pid "$D" 2) || fail "another stage died"

# The stage comes back (same key, same manifest, its port once the dead one has let it go):
# the ring links again and serves.
wait_for 30 pid_gone $PID1 || fail "rank 1 did not die"
"$KVD_STUB" stage --manifest "$D/ring.json" --rank 1 --stub --state-dir "$D/rank-1" >> "$D/rank-1/kvd.log" 2>&1 &
echo $! > "$D/rank-1/kvd.pid"
wait_linked "$D" 3 20 || fail "the ring did not link again: $("$KVCTL" status --ring "$D")"
out=$("$KVCTL" generate --ring "$D" --ids --tokens 1,2,3 -n 5 --temp 0 2>"$TMP/err") || fail "generate after recovery: $(cat "$TMP/err")"
[ $(echo "$out" | wc -w) -eq 5 ] || fail "after recovery: '$out'"
echo "ok ring back: $out"
# Sessions on the other stages were freed when the link broke (the last one's CLOSE goes
# round after its client heard "done": wait for it).
wait_for 10 ring_idle "$D" || fail "$(ring_sessions "$D") sessions left on the stages"
# A hole further down the ring: in a 4-stage ring without rank 2, rank 0's own links are up,
# so it starts the session; rank 1 cannot pass it on and sends the ERROR back: the client
# hears which link is missing at once instead of waiting for a timeout.
D4=$TMP/ring4
ring_up "$D4" --stub --layers 8 --embd 64 --stages 4
kill -9 $(rank_pid "$D4" 2)
out_down() { "$KVCTL" status --ring "$D4" --json 2>/dev/null | sed -n 2p | grep -q '"out":{[^}]*"state":"down"'; }
wait_for 20 out_down || fail "rank 1's out link is not down after rank 2 was killed: $("$KVCTL" status --ring "$D4")"
t0=$(date +%s%N)
if "$KVCTL" generate --ring "$D4" --ids --tokens 1,2,3 -n 5 --temp 0 > /dev/null 2> "$TMP/err4"; then
    fail "generate succeeded through a ring with a missing stage"
fi
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
grep -qE "ring not linked.*rank 1 -> rank 2|rank 3 is down|in link from rank 3" "$TMP/err4" || fail "unclear error: $(cat "$TMP/err4")"
[ $ms -lt 5000 ] || fail "the error took $ms ms"
echo "ok missing middle stage reported back in $ms ms: $(cat "$TMP/err4")"
# Rank 0's own in link down (the last stage gone, as while a ring is still linking): refused
# at once by rank 0, naming the link, no session started.
kill -9 $(rank_pid "$D4" 3)
in_down() { "$KVCTL" status --ring "$D4" --json 2>/dev/null | sed -n 1p | grep -q '"in":{[^}]*"state":"down"'; }
wait_for 20 in_down || fail "rank 0's in link is not down after rank 3 was killed: $("$KVCTL" status --ring "$D4")"
opens=$(grep -c "session .* opens" "$D4/rank-0/kvd.log")
t0=$(date +%s%N)
"$KVCTL" generate --ring "$D4" --ids --tokens 1,2,3 -n 5 --temp 0 > /dev/null 2> "$TMP/err5" &&
    fail "generate succeeded without the last stage"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
grep -q "ring not linked: .*in link from rank 3 is down" "$TMP/err5" || fail "unclear error: $(cat "$TMP/err5")"
[ $ms -lt 2000 ] || fail "the refusal took $ms ms"
[ "$(grep -c "session .* opens" "$D4/rank-0/kvd.log")" = "$opens" ] || fail "rank 0 opened a session without its in link"
echo "ok rank 0 refuses at once while its in link is down: $(cat "$TMP/err5")"
# The control socket's shutdown request stops a stage cleanly (exit status 0).
P0=$(rank_pid "$D4" 0)
reply=$(python3 -c 'import socket,sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1]); s.sendall(b"{\"op\":\"shutdown\"}\n")
print(s.makefile().readline().strip())' "$D4/rank-0/kvd.sock") || fail "shutdown request"
[ "$reply" = '{"ok":true}' ] || fail "shutdown reply '$reply'"
wait_for 30 pid_gone $P0 || fail "rank 0 still running after the shutdown request"
grep -q "shutting down: shutdown requested" "$D4/rank-0/kvd.log" || fail "no shutdown line in the log"
grep -q "INFO  stage 0/4: stopped$" "$D4/rank-0/kvd.log" || fail "rank 0 did not stop cleanly"
echo "ok shutdown over the control socket"
echo PASS

#!/bin/bash
# test-ring-handshake-slots: pending links whose HELLOs carry only public data cannot lock a
# restarted rank out. A 2-stage ring (stories260K); an attacker (tests/lib/ring_attack.py pending)
# holds 40 links at rank 0 from 8 loopback addresses (5 each: over the per-source cap of 4 and
# the cap of 32 in all), each with a valid HELLO claiming rank 1 with rank 1's key from
# ring.json (no AUTH can follow), reopening every link the stage closes. Rank 1 is killed and
# started again: it links with rank 0 while the attack goes on (the wait is printed; `make
# bench` reports the figure), the attacker still holds pending links, and the ring generates
# what one process does.
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$(need_model stories260K.gguf) || exit 1
ATTACK="python3 $(dirname "$0")/../lib/ring_attack.py"
D=$TMP/ring
ring_up "$D" --model "$M" --stages 2
wait_linked "$D" 2 10 || fail "the ring did not link"
P0=$(rank_port "$D" 0)
PROMPT=1,400,300,250,17,99
REF=$("$KVCTL" generate -m "$M" --ids --tokens $PROMPT -n 8 --temp 0 2>/dev/null)
[ -n "$REF" ] || fail "one-process generate"

SECS=${SLOTS_ATTACK_S:-40}
$ATTACK pending "127.0.0.1:$P0" "$D/ring.json" 1 8 5 "$SECS" --count-file "$TMP/held" > "$TMP/pending.out" 2>&1 &
APID=$!
at_exit "kill $APID 2>/dev/null"
held() { [ -s "$TMP/held" ] && [ "$(cat "$TMP/held")" -ge "$1" ]; }
wait_for 20 held 32 || fail "the attacker does not hold 32 pending links: $(cat "$TMP/held" "$TMP/pending.out" 2>/dev/null)"
echo "ok   the attacker holds $(cat "$TMP/held") pending links with valid HELLOs as rank 1 at rank 0"

LOG1=$D/rank-1/kvd.log
kill_dead "$(rank_pid "$D" 1)"
wait_for 10 bash -c "! '$KVCTL' status --ring '$D' 2>/dev/null | grep -q 'linked'" || true
t0=$(date +%s.%N)
"$KVD" stage --manifest "$D/ring.json" --rank 1 --model "$M" --catalog "$D/catalog.json" \
    --state-dir "$D/rank-1" >> "$LOG1" 2>&1 &
echo $! > "$D/rank-1/kvd.pid"
wait_linked "$D" 2 30 || fail "the restarted rank 1 did not link while the attack went on"
dt=$(python3 -c "import sys,time;print('%.2f' % (time.time()-float(sys.argv[1])))" "$t0")
echo "     the restarted rank 1 linked with rank 0 $dt s after its start"
kill -0 "$APID" 2>/dev/null || fail "the attacker stopped before the ring linked (raise SLOTS_ATTACK_S)"
held 16 || fail "the attacker no longer held pending links: $(cat "$TMP/held")"
echo "ok   rank 1 linked again in $dt s while the attacker held $(cat "$TMP/held") pending links"
out=$("$KVCTL" generate --ring "$D" --ids --tokens $PROMPT -n 8 --temp 0 2> "$TMP/gen.err") ||
    fail "generate during the attack: $(cat "$TMP/gen.err")"
[ "$out" = "$REF" ] || fail "the ring generated '$out', one process '$REF'"
echo "ok   the ring generates what one process does during the attack"
grep -q "no AUTH" "$D/rank-0/kvd.log" || fail "rank 0 did not log closing a link without AUTH"
lines=$(grep -c "link from 127.0.0" "$D/rank-0/kvd.log")
echo "     rank 0 logged $lines lines about the attacker's links"
kill "$APID" 2>/dev/null
wait "$APID" 2>/dev/null
cat "$TMP/pending.out"
ring_down "$D"
finish

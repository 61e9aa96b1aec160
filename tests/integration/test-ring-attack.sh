#!/bin/bash
# Attackers without a node key against a 2-stage ring (stories260K), each from
# tests/lib/ring_attack.py, while the ring must keep generating exactly what one process does:
#  (a) takeover by reflection: rank 1 restarts while an attacker hands rank 0's HELLO and AUTH
#      to it and rank 1's HELLO to rank 0 (the old handshake's signing oracle); every attempt
#      is refused, the real rank 0 links, and generation is right during and after;
#  (b) a man in the middle on the link rank 0 -> rank 1 flips a byte of a record, drops one,
#      replays one, swaps two: the session ends with an error naming the link, never a wrong
#      token, and the ring re-links and generates right afterwards;
#  (c) a passive proxy records every record it forwarded: neither the prompt's token ids
#      (int32 LE run) nor the generated ids appear in those bytes;
#  (d) idle TCP connections from the predecessor's address do not keep it from linking, and
#      the warnings about them stay few;
#  (e) a malicious relay (rank 1 behind relay+ws://) records and then tampers with the link it
#      bridges, with the same outcomes as (b) and (c).
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$(need_model stories260K.gguf) || exit 1
ATTACK="python3 $(dirname "$0")/../lib/ring_attack.py"
on_fatal_extra() {
    local f
    for f in "$TMP"/proxy.out "$TMP"/relay.out "$TMP"/gen.err; do
        [ -f "$f" ] && { echo "--- $f"; tail -n 8 "$f"; }
    done
}
MODES=${ATTACK_MODES:-flip drop replay reorder}   # ATTACK_MODES="flip": one attack, when debugging
D=$TMP/ring
ring_up "$D" --model "$M" --stages 2
wait_linked "$D" 2 10 || fail "the ring did not link"
P0=$(rank_port "$D" 0)
P1=$(rank_port "$D" 1)
LOG1=$D/rank-1/kvd.log
PROMPT=1,400,300,250,17,99
N=12
REF=$("$KVCTL" generate -m "$M" --ids --tokens $PROMPT -n $N --temp 0 2>/dev/null) || fail "one-process generate"
[ -n "$REF" ] || fail "no reference tokens"
# gen: the generated ids on stdout; the session's error, if any, in $TMP/gen.err
RING=$D   # the ring gen talks to
gen() { "$KVCTL" generate --ring "$RING" --ids --tokens $PROMPT -n $N --temp 0 2>"$TMP/gen.err"; }
out=$(gen) || fail "generate: $out"
[ "$out" = "$REF" ] || fail "ring generates '$out', one process '$REF'"
echo "ok reference: $REF"

# restart_rank1 [own]: kill -9 rank 1 and start it again, on its manifest endpoint or (own) on
# a port of its own, Q1 (a free one the first time, handed over: tests/lib/listen.py).
Q1=0
restart_rank1() {
    kill_dead "$(rank_pid "$D" 1)"
    if [ "${1:-}" = own ]; then
        rm -f "$TMP/q1.port"
        "$LISTEN" "$TMP/q1.port" "$Q1" -- "$KVD" stage --manifest "$D/ring.json" --rank 1 --model "$M" \
            --catalog "$D/catalog.json" --state-dir "$D/rank-1" --listen "127.0.0.1:{PORT}" >> "$LOG1" 2>&1 &
        echo $! > "$D/rank-1/kvd.pid"
        Q1=$(port_of "$TMP/q1.port") || fail "rank 1's launcher: $(tail -3 "$LOG1")"
    else
        "$KVD" stage --manifest "$D/ring.json" --rank 1 --model "$M" --catalog "$D/catalog.json" \
            --state-dir "$D/rank-1" >> "$LOG1" 2>&1 &
        echo $! > "$D/rank-1/kvd.pid"
    fi
}

# ---- (a) takeover by reflection ----
kill -9 "$(rank_pid "$D" 1)"
$ATTACK reflect 127.0.0.1:$P0 127.0.0.1:$P1 12 > "$TMP/reflect.out" 2>&1 &
RPID=$!
at_exit "kill $RPID 2>/dev/null"
sleep 0.5
restart_rank1
wait_linked "$D" 2 15 || fail "(a) the real rank 0 did not link with the restarted rank 1"
for i in 1 2 3; do
    out=$(gen) || fail "(a) generate during the attack: $(cat "$TMP/gen.err")"
    [ "$out" = "$REF" ] || fail "(a) during the attack the ring generated '$out', expected '$REF'"
done
wait $RPID
grep -q "^attempt" "$TMP/reflect.out" || fail "(a) the attacker made no attempt: $(cat "$TMP/reflect.out")"
grep -q "taken" "$TMP/reflect.out" && fail "(a) the attacker took a link: $(grep taken "$TMP/reflect.out" | head -3)"
grep -q "bad signature" "$TMP/reflect.out" || fail "(a) no attempt was refused for its signature: $(tail -5 "$TMP/reflect.out")"
grep -q "bad signature" "$LOG1" || fail "(a) rank 1's log does not name the bad signature"
out=$(gen) || fail "(a) generate after the attack: $out: $(cat "$TMP/gen.err")"
[ "$out" = "$REF" ] || fail "(a) after the attack the ring generated '$out'"
echo "ok (a) reflection refused ($(grep -c '^attempt' "$TMP/reflect.out") attempts), ring right during and after"

# no_clear_ids FILE: the recorded record bodies hold neither the prompt's ids as one int32 run
# nor any generated id ($out).
no_clear_ids() {
    python3 - "$1" "$PROMPT" "$out" <<'EOF'
import struct, sys
wire = open(sys.argv[1], "rb").read()
prompt = [int(x) for x in sys.argv[2].split(",")]
gen = [int(x) for x in sys.argv[3].split()]
assert len(wire) > 1000, "the attacker recorded only %d bytes" % len(wire)
run = b"".join(struct.pack("<i", t) for t in prompt)
assert run in b"xx" + run + b"yy"   # the search works: a frame in clear would be found
bad = ["the prompt's ids as one int32 run"] if run in wire else []
bad += ["generated id %d" % t for t in sorted(set(gen)) if struct.pack("<i", t) in wire]
if bad:
    print("found in %d recorded bytes: %s" % (len(wire), ", ".join(bad)))
    sys.exit(1)
print("%d recorded bytes hold no prompt run and none of the generated ids" % len(wire))
EOF
}

# tampered LOG MODE CMD...: run one attack (CMD puts the attacker in place), then the ring
# either generates the right tokens or the session fails, rank 1 closes the link naming it
# and the record, and the ring links again and generates right.
tampered() {
    local log=$1 mode=$2 before rc why out2
    shift 2
    before=$(grep -c "does not authenticate" "$log")
    "$@"
    wait_linked "$RING" 2 15 || fail "($mode) the ring did not link through the attacker"
    out=$(gen)
    rc=$?
    why=$(tail -1 "$TMP/gen.err")
    if [ $rc = 0 ]; then
        [ "$out" = "$REF" ] || fail "($mode) the ring generated '$out', expected '$REF' or an error"
    fi
    for i in $(seq 50); do [ "$(grep -c "does not authenticate" "$log")" -gt "$before" ] && break; sleep 0.1; done
    [ "$(grep -c "does not authenticate" "$log")" -gt "$before" ] ||
        fail "($mode) rank 1 did not close the link for a record that does not authenticate"
    grep "does not authenticate" "$log" | tail -1 | grep -q "ring link rank 0 -> rank 1" ||
        fail "($mode) the error does not name the link: $(grep "does not authenticate" "$log" | tail -1)"
    wait_linked "$RING" 2 30 || fail "($mode) the ring did not link again"
    out2=$(gen) || fail "($mode) generate after the attack: $(cat "$TMP/gen.err")"
    [ "$out2" = "$REF" ] || fail "($mode) after the attack the ring generated '$out2'"
    echo "  $mode: $( [ $rc = 0 ] && echo "right tokens" || echo "session failed: $why"), then right again"
}

# eavesdropped_and_tampered WHAT_READS WHAT_TAMPERS WIRE LOG START: with the attacker recording
# into WIRE, the ring generates right and WIRE holds no token id; then START MODE puts the
# attacker in place for each attack in turn (tampered).
eavesdropped_and_tampered() {
    local reads=$1 tampers=$2 wire=$3 log=$4 start=$5 mode
    out=$(gen) || fail "$reads: generate: $(cat "$TMP/gen.err")"
    [ "$out" = "$REF" ] || fail "$reads: the ring generated '$out'"
    no_clear_ids "$wire" || fail "$reads: token ids in clear"
    echo "ok $reads reads no token id"
    for mode in $MODES; do
        tampered "$log" "$mode" "$start" "$mode"
    done
    echo "ok $tampers tampering ends sessions, never changes a token"
}

# ---- (b), (c): a proxy on rank 1's endpoint; rank 1 itself listens elsewhere ----
PPID_=
proxy_start() {   # MODE [--record FILE]
    [ -n "$PPID_" ] && { kill "$PPID_" 2>/dev/null; wait "$PPID_" 2>/dev/null; }
    $ATTACK proxy "$P1" "127.0.0.1:$Q1" "$@" >> "$TMP/proxy.out" 2>&1 &
    PPID_=$!
    at_exit "kill $PPID_ 2>/dev/null"
    wait_port "$P1" 5 || fail "the proxy does not listen on $P1"
}
restart_rank1 own
proxy_start pass --record "$TMP/wire.bin"
wait_linked "$D" 2 15 || fail "the ring did not link through the proxy"
grep -q "link through the proxy" "$TMP/proxy.out" || fail "rank 0 -> rank 1 does not go through the proxy"
eavesdropped_and_tampered "(c) a passive proxy" "(b) a proxy" "$TMP/wire.bin" "$LOG1" proxy_start
if [ -z "${ATTACK_MODES:-}" ]; then   # ATTACK_MODES="flip": one attack, when debugging
    grep -q "flipped a byte" "$TMP/proxy.out" && grep -q "dropped a record" "$TMP/proxy.out" &&
        grep -q "replayed a record" "$TMP/proxy.out" && grep -q "reordered two records" "$TMP/proxy.out" ||
        fail "(b) the proxy did not make every attack: $(cat "$TMP/proxy.out")"
fi
kill "$PPID_" 2>/dev/null
wait "$PPID_" 2>/dev/null

# ---- (d) idle connections from the predecessor's address ----
restart_rank1
wait_linked "$D" 2 15 || fail "(d) the ring did not link without the proxy"
$ATTACK idle 127.0.0.1:$P1 40 8 > "$TMP/idle.out" 2>&1 &
IPID=$!
at_exit "kill $IPID 2>/dev/null"
sleep 1
lines0=$(wc -l < "$LOG1")
kill_dead "$(rank_pid "$D" 0)"
"$KVD" stage --manifest "$D/ring.json" --rank 0 --model "$M" --state-dir "$D/rank-0" \
    >> "$D/rank-0/kvd.log" 2>&1 &
echo $! > "$D/rank-0/kvd.pid"
wait_linked "$D" 2 6 || fail "(d) rank 0 did not link while idle connections were held"
out=$(gen) || fail "(d) generate with idle connections held: $out: $(cat "$TMP/gen.err")"
[ "$out" = "$REF" ] || fail "(d) the ring generated '$out'"
wait $IPID
lines=$(( $(wc -l < "$LOG1") - lines0 ))
[ "$lines" -lt 30 ] || fail "(d) rank 1 logged $lines lines while the idle connections came and went"
echo "ok (d) rank 0 linked past $(cat "$TMP/idle.out" | grep -o '[0-9]* idle') connections; rank 1 logged $lines lines"

# ---- (e) a malicious relay: rank 1's endpoint relay+ws://, the relay from ring_attack.py ----
ring_down "$D"
D2=$TMP/relayring
mkdir -p "$D2"
RING=$D2
RLOG1=$D2/rank-1/kvd.log
RPID_=
RP=0
relay_start() {   # MODE [--record FILE]: on a free port the first time (handed over), then on it
    [ -n "$RPID_" ] && { kill "$RPID_" 2>/dev/null; wait "$RPID_" 2>/dev/null; }
    rm -f "$TMP/relay.port"
    "$LISTEN" "$TMP/relay.port" "$RP" -- $ATTACK relay "{PORT}" "$@" >> "$TMP/relay.out" 2>&1 &
    RPID_=$!
    at_exit "kill $RPID_ 2>/dev/null"
    RP=$(port_of "$TMP/relay.port") || fail "the malicious relay's launcher failed"
    wait_port "$RP" 5 || fail "the malicious relay does not listen on $RP"
}
relay_start pass --record "$TMP/relay-wire.bin"
python3 - "$D/ring.json" "$D2/ring.json" "relay+ws://127.0.0.1:$RP/b/$(openssl rand -hex 16)" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["ranks"][1]["endpoint"] = sys.argv[3]
json.dump(m, open(sys.argv[2], "w"), indent=1)
EOF
for r in 0 1; do   # the same stages (their node keys), the manifest with the relay
    mkdir -p "$D2/rank-$r"
    cp "$D/rank-$r/node.key" "$D2/rank-$r/"
    "$KVD" stage --manifest "$D2/ring.json" --rank $r --model "$M" --state-dir "$D2/rank-$r" \
        >> "$D2/rank-$r/kvd.log" 2>&1 &
    echo $! > "$D2/rank-$r/kvd.pid"
done
RINGS="$RINGS $D2"
wait_linked "$D2" 2 20 || fail "(e) the ring did not link through the malicious relay"
grep -q "paired" "$TMP/relay.out" || fail "(e) the link does not go through the relay: $(cat "$TMP/relay.out")"
eavesdropped_and_tampered "(e) the relay" "(e) the relay" "$TMP/relay-wire.bin" "$RLOG1" relay_start
ring_down "$D2"
finish

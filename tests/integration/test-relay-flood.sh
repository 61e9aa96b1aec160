#!/bin/bash
# test-relay-flood.sh — WebSocket floods cannot grow the relay's memory, and its status
# shows what it holds. The attacker (tests/lib/http_attack.py, from 127.0.0.2) sends:
#   * messages in 1-byte fragments (each fragment used to cost the relay ~14 times its
#     size): closed with 1009 after --max-fragments, heap growth small;
#   * large fragments on several connections at once: the bytes being assembled stay under
#     --max-assembly (1013 past it), and the status shows them while they are held;
#   * large messages to ends with no partner: over --max-held per end (1009), over
#     --max-held-total for all (1013); held bytes shown while held, zero after.
# A legitimate bridge on 127.0.0.1 works during the floods and after them.
. "$(dirname "$0")/../lib/lib.sh"
need_exec "$KVD"
A="python3 tests/lib/http_attack.py"
check() { local out; out=$($A check "$@") || fail "$out"; }
# ASan's quarantine keeps freed memory (256 MB by default), which would hide what the
# target really holds: keep it small so the heap figures below mean the same there.
case "$B" in *asan*) export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=1" ;; esac

# The ends of the floods below have no partner: the pair timeout must outlast opening them all,
# sending and reading the status on a loaded machine (ASan, tests side by side), or the relay
# would close them before the status shows what they hold; once they are reported, it closes
# those still open.
"$KVD" --role relay --listen 127.0.0.1:0 --plain --max-fragments 64 --max-assembly 1048576 \
    --max-held 262144 --max-held-total 1048576 --pair-timeout 5000 --max-per-addr 32 \
    2> "$T/relay.log" &
RPID=$!
PIDS="$PIDS $RPID"
wait_for 10 grep -q "listening on" "$T/relay.log" || die "relay did not start: $(cat "$T/relay.log")"
RP=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$T/relay.log" | head -1)
S="http://127.0.0.1:$RP/v1/relay/status"
pair() { $A pair --port "$RP" --msgs 10 --size 20000 | check - 'd["ok"]' "a legitimate bridge failed $1"; }
pair "before the floods"
base=$($A rss --pid "$RPID" --field RssAnon)

# 1-byte fragments: 10 connections x 20000 fragments (the old ~14x cost: ~13 MB of heap)
$A frag --port "$RP" --src 127.0.0.2 -n 10 --frags 20000 --hold 0.3 --pid "$RPID" --stats "$S" \
    > "$T/frag.json" &
ap=$!
pair "during the 1-byte fragment flood"
wait $ap
echo "1-byte fragments (heap before: $base KiB): $(cat "$T/frag.json")"
check "$T/frag.json" \
    'd["codes"] == [1009] * 10' "1-byte fragment floods not closed with 1009" \
    "d['anon_kib'] - $base < 4096" "1-byte fragment floods grew the heap by 4 MiB or more"

# big fragments on 4 connections at once: 3 x 256 KiB each against a 1 MiB assembly cap
$A frag --port "$RP" --src 127.0.0.2 -n 4 --frags 3 --fragsize 262144 --hold 0.3 --stats "$S" \
    > "$T/asm.json"
echo "messages assembled at once: $(cat "$T/asm.json" | cut -c1-300)..."
check "$T/asm.json" \
    'd["codes"].count(1013) >= 2' "the bytes being assembled were not capped server-wide (1013)" \
    '0 < d["stats"]["assembling_bytes"] <= 1048576' "the status does not show the bytes being assembled, or they passed the cap"

# ends without a partner: one message over --max-held each, then many under it
$A unpaired --port "$RP" --src 127.0.0.2 -n 6 --size 300000 --hold 0.3 --pid "$RPID" --stats "$S" \
    > "$T/big.json" &
ap=$!
pair "during the unpaired flood"
wait $ap
echo "unpaired ends, 300000-byte messages: $(cat "$T/big.json" | cut -c1-300)..."
check "$T/big.json" \
    'd["codes"] == [1009] * 6' "messages over --max-held for an unpaired end were not closed with 1009" \
    "d['anon_kib'] - $base < 8192" "unpaired messages grew the heap by 8 MiB or more"
$A unpaired --port "$RP" --src 127.0.0.2 -n 7 --size 200000 --hold 0.3 --stats "$S" > "$T/many.json"
echo "unpaired ends, 200000 bytes each: $(cat "$T/many.json" | cut -c1-400)..."
check "$T/many.json" \
    'd["codes"].count(1013) >= 2 and 1009 not in d["codes"]' "--max-held-total was not enforced with 1013" \
    '0 < d["stats"]["held_bytes"] <= 1048576' "the status does not show the held bytes, or they passed the cap" \
    'd["stats"]["refused"]["held"] >= 6' "refusals for held bytes not counted"

pair "after the floods"
curl -s "$S" > "$T/after.json"
echo "status after: $(cat "$T/after.json")"
check "$T/after.json" \
    'd["held_bytes"] == 0 and d["assembling_bytes"] == 0 and d["queued_bytes"] == 0' "bytes still held after the floods"
curl -s "http://127.0.0.1:$RP/metrics" > "$T/metrics.txt"
grep -q 'kvasir_relay_held_bytes_by_kind{kind="assembling"} 0' "$T/metrics.txt" ||
    fail "metrics: no held bytes by kind"
grep -q 'kvasir_relay_addr_connections{addr="127.0.0.1"}' "$T/metrics.txt" ||
    fail "metrics: no per-address connection counts"
grep -q 'kvasir_relay_refused_total{reason="held"} [1-9]' "$T/metrics.txt" ||
    fail "metrics: no held-bytes refusals"
finish

#!/bin/bash
# test-weight: 2 (several stages computing at once)
# The WAN harness (docs/ring.md, "Over a WAN"): the delay proxy itself, then rings behind it.
#   - the proxy delays: a round trip through a `wan` proxy takes at least twice its delay less
#     the jitter (a lower bound only: a slow machine only adds);
#   - the rate limit queues: a stream through --rate takes at least its bytes over the rate,
#     and the proxy held no more than its --queue-max (plus one read) at once: backpressure;
#   - bytes are never reordered under jitter and loss (every byte of an echoed stream checked);
#   - a 3-stage ring of a real-text model behind a `wan` proxy on every link generates exactly
#     the one-process tokens, greedy and seeded, also 4 sessions at once, and its links' RTTs
#     say the proxies are on them;
#   - the same behind `phone` proxies with a loss every 20 segments: the same tokens, and the
#     proxies did lose segments;
#   - rank 1 behind a relay (WAN_RING_RELAY): the same tokens, with drafts too, and the relayed
#     hop's RTT two legs long.
. "$(dirname "$0")/../lib/ring_lib.sh"
need_exec "$TOOLS/tool-wan-proxy"
M=$(need_model TinyLLama-v0-q4_0.gguf) || exit 1
P=$TOOLS/tool-wan-proxy

on_fatal_extra() {
    local l
    for l in "$T"/*.log "$T"/*/wan-*.log; do [ -f "$l" ] && { echo "--- $l"; tail -n 8 "$l"; }; done
}

# start_proxy NAME ARGS...: a proxy whose port is then in $T/NAME.port
start_proxy() {
    local name=$1
    shift
    "$P" --port-file "$T/$name.port" "$@" > "$T/$name.log" 2>&1 &
    PIDS="$PIDS $!"
    wait_file "$T/$name.port" || fail "proxy $name did not start: $(cat "$T/$name.log")"
}
"$P" echo --port-file "$T/echo.port" 2> "$T/echo.log" &
PIDS="$PIDS $!"
wait_file "$T/echo.port" || fail "echo server did not start"
ECHO=127.0.0.1:$(cat "$T/echo.port")
# ge A B: A >= B (decimals)
ge() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 >= b + 0) }'; }

# The delay: 20 ms +- 2 ms each way, so no round trip under 36 ms.
start_proxy wan --to "$ECHO" --profile wan
out=$("$P" ping --to "127.0.0.1:$(cat "$T/wan.port")" --count 10) || fail "ping through the wan proxy"
echo "$out"
min=$(echo "$out" | sed -n 's/.*min \([0-9.]*\) ms.*/\1/p')
ge "$min" 36 || fail "a round trip through a 20 +- 2 ms proxy took $min ms (< 36)"

# The rate: 4 MiB through 2 MB/s (a 64 KiB bucket) take at least 2.06 s each way; the proxy
# holds at most its 256 KiB cap plus one 64 KiB read per direction.
start_proxy rate --to "$ECHO" --rate 2000000 --burst 64K --queue-max 256K
out=$("$P" stream --to "127.0.0.1:$(cat "$T/rate.port")" --bytes 4M) || fail "stream through the rate limit"
echo "$out"
s=$(echo "$out" | sed -n 's/.* in \([0-9.]*\) s:.*/\1/p')
ge "$s" "$(awk 'BEGIN { print (4194304 - 65536) / 2e6 }')" || fail "4 MiB through 2 MB/s in $s s"
wait_for 10 grep -q "closed" "$T/rate.log" || fail "the rate proxy did not log the closed connection"
held=$(sed -n 's/.*client->target.* at most \([0-9]*\) B held.*/\1/p' "$T/rate.log" | head -1)
[ -n "$held" ] && [ "$held" -le $((262144 + 65536)) ] ||
    fail "the proxy held ${held:-?} B in one direction, over its 256 KiB cap plus one read"

# Order: up to 4 ms of jitter on 2 ms, 2% loss with a 20 ms stall; every byte checked.
start_proxy jit --to "$ECHO" --delay-ms 2 --jitter-ms 2 --loss 0.02 --rto-min-ms 20
"$P" stream --to "127.0.0.1:$(cat "$T/jit.port")" --bytes 16M || fail "bytes reordered or lost through jitter and loss"
wait_for 10 grep -q "closed" "$T/jit.log" || fail "the jitter proxy did not log the closed connection"
grep -q "lost" "$T/jit.log" || fail "no segment was lost at 2%"
echo "ok proxy: delay, rate, backpressure, order"

# The one-process reference: greedy and seeded.
PROMPT="Once upon a time"
N=24
one=$("$KVCTL" generate -m "$M" --ids -p "$PROMPT" -n $N --temp 0 -t 1 2>/dev/null) || fail "one-process generate"
seeded=$("$KVCTL" generate -m "$M" --ids -p "$PROMPT" -n $N --temp 0.8 --top-p 0.9 --seed 42 -t 1 2>/dev/null) ||
    fail "one-process seeded generate"

# wan_ring DIR PROFILE [PROXY_OPTION...]: a 3-stage ring behind proxies, stopped on exit
wan_ring() {
    local d=$1
    shift
    RINGS="$RINGS $d"
    at_exit "tests/lib/wan_ring.sh down $d"
    KV_BUILD=$B WAN_RING_UP_OPTS="-t 1" tests/lib/wan_ring.sh up "$d" "$M" 3 "$@" || fail "wan_ring.sh up $*"
}
# same_tokens DIR LABEL: greedy and seeded generations through the ring equal one process's
same_tokens() {
    local d=$1 what=$2 out
    out=$("$KVCTL" generate --ring "$d" --ids -p "$PROMPT" -n $N --temp 0 2>"$T/err") || fail "$what: generate: $(cat "$T/err")"
    [ "$out" = "$one" ] || fail "$what: greedy tokens differ: ring '$out' vs one process '$one'"
    out=$("$KVCTL" generate --ring "$d" --ids -p "$PROMPT" -n $N --temp 0.8 --top-p 0.9 --seed 42 2>"$T/err") ||
        fail "$what: seeded generate: $(cat "$T/err")"
    [ "$out" = "$seeded" ] || fail "$what: seeded tokens differ: ring '$out' vs one process '$seeded'"
}

d=$T/wan
wan_ring "$d" wan
same_tokens "$d" "wan"
# the links' RTTs (PING/PONG through the proxies) are at least two one-way delays less jitter
rtts=$("$KVCTL" status --ring "$d" --json | python3 -c '
import json, sys
print(" ".join(str(json.loads(l)["out"]["rtt_ms"]) for l in sys.stdin))' 2>/dev/null) || rtts=""
echo "wan ring link RTTs: $rtts ms"
[ -n "$rtts" ] || fail "no RTT in the ring's status"
for r in $rtts; do ge "$r" 36 || fail "a link's RTT is $r ms through a 20 +- 2 ms proxy (< 36)"; done
# 4 sessions at once through the same links
for i in 1 2 3 4; do
    "$KVCTL" generate --ring "$d" --ids -p "$PROMPT" -n $N --temp 0 > "$T/c$i.out" 2> "$T/c$i.err" &
    eval "c$i=$!"
done
for i in 1 2 3 4; do
    eval "wait \$c$i" || fail "concurrent session $i: $(cat "$T/c$i.err")"
    [ "$(cat "$T/c$i.out")" = "$one" ] || fail "concurrent session $i: '$(cat "$T/c$i.out")' vs '$one'"
done
tests/lib/wan_ring.sh down "$d"
echo "ok 3-stage ring behind wan proxies: one-process tokens, greedy, seeded, 4 at once"

d=$T/phone
wan_ring "$d" phone --loss-every 20
same_tokens "$d" "phone with loss"
lost=$(cat "$d"/wan-*.log | grep -c "lost")
[ "$lost" -gt 0 ] || fail "the phone proxies lost no segment"
tests/lib/wan_ring.sh down "$d"
echo "ok 3-stage ring behind phone proxies, $lost segments lost: one-process tokens"

# A phone behind NAT: rank 1 accepts no connection, its in-link goes through a relay, and both
# legs of that hop cross its proxy (5 ms each way): the same tokens, with drafts too; rank 0's
# out link (through the relay) has an RTT of at least two legs' delays (lower bounds only: a
# busy machine only adds).
d=$T/relay
WAN_RING_RELAY=1 wan_ring "$d" none --delay-ms 5
same_tokens "$d" "relayed rank 1"
out=$("$KVCTL" generate --ring "$d" --ids -p "$PROMPT" -n $N --temp 0 --draft lookup 2>"$T/err") ||
    fail "relayed rank 1 with drafts: $(cat "$T/err")"
[ "$out" = "$one" ] || fail "relayed rank 1 with drafts: '$out' vs '$one'"
grep -q "in-link through the relay" "$d/rank-1/kvd.log" || fail "rank 1 did not take its in-link through the relay"
rtts=($("$KVCTL" status --ring "$d" --json | python3 -c '
import json, sys
print(" ".join(str(json.loads(l)["out"]["rtt_ms"]) for l in sys.stdin))' 2>/dev/null))
echo "relayed ring link RTTs: ${rtts[*]} ms"
[ "${#rtts[@]}" = 3 ] || fail "no RTTs in the ring's status"
ge "${rtts[0]}" 20 || fail "the relayed hop's RTT is ${rtts[0]} ms, under its two legs' 20 ms"
ge "${rtts[1]}" 10 || fail "a direct hop's RTT is ${rtts[1]} ms, under its leg's 10 ms"
tests/lib/wan_ring.sh down "$d"
echo "ok a relayed rank behind the proxies: one-process tokens, the relayed hop two legs long"
finish

#!/bin/bash
# test-log-format: every line a daemon writes has one format, TIME LEVEL ROLE: message
# (2026-12-02T01:02:03.456Z INFO  stage 1/3: ...), whatever the role: a seeder, three stages
# that pull their windows from it (no "pull: NN%" progress lines in a log: those are for
# terminals), and a relay carrying one bridge, whose log names each pairing and each closed
# end with its peer, duration and byte count (never the payload).
. "$(dirname "$0")/../lib/lib.sh"
M=$DATA/models/stories260K.gguf
need_data "$M"
need_exec "$B/kvd" "$B/kvctl"
PY=/usr/bin/python3   # Debian's, where python3-websockets is (a python3 earlier in PATH may lack it)
"$PY" -c "import websockets" 2>/dev/null || die "python3-websockets missing (scripts/setup.sh installs it)"
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; ring_down "$T/ring"; }
at_exit cleanup

"$B/kvd" seeder --serve "$M" --listen 127.0.0.1:0 --port-file "$T/seed.port" 2> "$T/seeder.log" &
spid=$!
pids="$pids $spid"
wait_file "$T/seed.port" 10 || die "seeder did not start: $(cat "$T/seeder.log")"
SP=$(cat "$T/seed.port")
ring_up "$T/ring" --model "$M" --stages 3 --window-from "http://127.0.0.1:$SP"
"$KVCTL" generate --ring "$T/ring" -p "Once upon a time" -n 8 --temp 0 > /dev/null 2>&1 || fail "generate through the pulled ring"
ring_down "$T/ring"

"$B/kvd" relay --listen 127.0.0.1:0 --plain 2> "$T/relay.log" &
rpid=$!
pids="$pids $rpid"
wait_for 10 grep -q "listening on" "$T/relay.log" || die "relay did not start: $(cat "$T/relay.log")"
RP=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$T/relay.log" | head -1)
"$PY" - "$RP" <<'PY' || fail "a bridge through the relay"
import asyncio, sys, websockets
async def main(port):
    url = f"ws://127.0.0.1:{port}/v1/bridge/0123456789abcdef0123456789abcdef"
    async with websockets.connect(url) as up, websockets.connect(url) as down:
        await up.send(b"\x01"); await down.send(b"\x02")
        await up.send(b"secret-payload-" * 100)
        got = await asyncio.wait_for(down.recv(), 5)
        assert got == b"secret-payload-" * 100
asyncio.run(main(int(sys.argv[1])))
PY
both_closed() { [ "$(grep -c "closed after" "$T/relay.log")" -ge 2 ]; }
wait_for 10 both_closed || fail "the relay did not log both ends' close: $(grep closed "$T/relay.log")"
curl -s "http://127.0.0.1:$RP/v1/relay/status" > /dev/null || fail "relay status"
kill -TERM "$spid" "$rpid"
wait "$spid" "$rpid" 2>/dev/null

re='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z (ERROR|WARN |INFO |DEBUG) [a-z][a-z0-9 /]*: .'
n=0
for f in "$T/seeder.log" "$T/relay.log" "$T"/ring/rank-*/kvd.log; do
    [ -s "$f" ] || { fail "$f is empty"; continue; }
    bad=$(grep -Ev "$re" "$f" | head -3)
    [ -z "$bad" ] || fail "$(basename "$(dirname "$f")")/$(basename "$f"): lines not TIME LEVEL ROLE: message: $bad"
    n=$((n + $(wc -l < "$f")))
done
echo "ok   $n daemon log lines, one format"
grep -q "INFO  seeder: listening on 127.0.0.1:0 port $SP" "$T/seeder.log" || fail "the seeder's listening line lacks its address: $(grep listening "$T/seeder.log")"
grep -q "shutting down: SIGTERM" "$T/seeder.log" || fail "the seeder does not log its stop"
# the seeder logs each request: address, method, path, status, bytes, time
grep -Eq "INFO  seeder: 127\.0\.0\.1:[0-9]+ GET /v1/windows/[0-9a-f]{64}/0-[0-9]+ 200 [0-9]+ bytes [0-9.]+ ms$" "$T/seeder.log" ||
    fail "the seeder does not log its window requests: $(grep GET "$T/seeder.log" | head -2)"
grep -Eq "INFO  relay: 127\.0\.0\.1:[0-9]+ GET /v1/relay/status 200 [0-9]+ bytes" "$T/relay.log" ||
    fail "the relay does not log its HTTP requests: $(grep GET "$T/relay.log" | head -2)"
grep -hq "pull: *[0-9]*%" "$T"/ring/rank-*/kvd.log && fail "progress lines in a stage log (not a terminal)"
[ "$(cat "$T"/ring/rank-*/kvd.log | grep -c "window pulled from http://127.0.0.1:$SP")" = 3 ] ||
    fail "the stages do not log their pulls: $(grep -h pull "$T"/ring/rank-*/kvd.log | head -3)"
grep -q "INFO  relay: bridge 0123456789ab paired: upstream 127.0.0.1[0-9:]*, downstream 127.0.0.1[0-9:]*" "$T/relay.log" ||
    fail "the relay does not log the pairing: $(grep -i bridge "$T/relay.log" | head -2)"
[ "$(grep -c "end of bridge 0123456789ab closed after [0-9.]* s: [0-9]* bytes" "$T/relay.log")" = 2 ] ||
    fail "the relay does not log both ends' close with bytes: $(grep closed "$T/relay.log")"
grep -q "upstream end of bridge 0123456789ab closed after [0-9.]* s: 1500 bytes in 1 messages" "$T/relay.log" ||
    fail "the upstream end's byte count: $(grep 'upstream end' "$T/relay.log")"
grep -q "secret-payload" "$T/relay.log" && fail "the relay logged payload bytes"
finish

#!/bin/bash
# A 3-stage ring whose middle stage accepts no connection: its endpoint is
# relay://127.0.0.1:PORT/b/<id>, so rank 0 dials the relay as the upstream end and rank 1
# dials it as the downstream end (certificate checked against the test CA). The ring must
# generate exactly the tokens of the direct TCP ring; after the relay is killed and
# restarted on the same port, the stages reconnect by themselves and generate them again.
cd "$(dirname "$0")/../.."
. tests/lib/relay/lib.sh
. tests/lib/relay/ring_relay.sh
M=$(need_model stories260K.gguf) || exit 1
PROMPT=1,400,300,200,100

# The direct ring: the reference tokens and the stages' identities.
D="$T/ring"
"$KVCTL" ring up --dir "$D" --model "$M" --stages 3 > "$T/up.log" 2>&1 || { cat "$T/up.log"; fail "direct ring up"; }
direct=$("$KVCTL" generate --ring "$D" --ids --tokens $PROMPT -n 24 --temp 0 2>"$T/gen.err") || fail "direct generate: $(cat "$T/gen.err")"
"$KVCTL" ring down --dir "$D" > /dev/null

make_cert
start_relay relay --tls-cert "$T/cert.pem" --tls-key "$T/key.pem" --pair-timeout 3000
RPORT=$PORT
bid=$(openssl rand -hex 16)
cp "$D/ring.json" "$T/direct.json"
relay_manifest "$T/direct.json" "$D/ring.json" 1 "relay://127.0.0.1:$RPORT/b/$bid"
export KV_RELAY_CA="$T/cert.pem"
for r in 0 1 2; do start_stage "$D" $r "$M"; done
wait_linked "$D" 3 30 || fail "relay ring did not link"
grep -q "in-link through the relay" "$D/rank-1/kvd.log" || fail "rank 1 did not use the relay for its in-link"
via=$("$KVCTL" generate --ring "$D" --ids --tokens $PROMPT -n 24 --temp 0 2>"$T/gen.err") || fail "relay generate: $(cat "$T/gen.err")"
[ "$via" = "$direct" ] || fail "tokens through the relay '$via' differ from the direct ring '$direct'"
echo "ok relay ring: $via"
st=$(curl -sk "https://127.0.0.1:$RPORT/v1/relay/status")
echo "$st" | grep -q '"paired":1' || fail "relay status does not show the bridge: $st"

# Kill the relay, restart it on the same port: the stages must find each other again.
kill "$RELAY_PID"
wait "$RELAY_PID" 2>/dev/null
unlinked() { ! lib_linked "$D" 3; }
wait_for 10 unlinked || fail "the stages still show their links up with the relay gone"
start_relay relay2 --listen "127.0.0.1:$RPORT" --tls-cert "$T/cert.pem" --tls-key "$T/key.pem"
wait_linked "$D" 3 30 || fail "stages did not reconnect through the restarted relay"
again=$("$KVCTL" generate --ring "$D" --ids --tokens $PROMPT -n 24 --temp 0 2>"$T/gen.err") || fail "generate after relay restart: $(cat "$T/gen.err")"
[ "$again" = "$direct" ] || fail "tokens after the relay restart '$again' differ from '$direct'"
echo "ok after relay restart"
"$KVCTL" ring down --dir "$D" > /dev/null
echo "PASS"

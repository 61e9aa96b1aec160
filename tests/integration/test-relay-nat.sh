#!/bin/bash
# NAT traversal in network namespaces made by this test (addresses from the TEST-NET
# documentation ranges, reachable only inside these namespaces):
#
#   pub   203.0.113.1  relay (TLS, :4443), rank 0 (:7100), rank 2 (:7102)
#   nat   203.0.113.2 / 198.51.100.1: a router that masquerades the phone's traffic and
#         drops every connection that starts on its public side (nftables)
#   phone 198.51.100.2  rank 1: its manifest endpoint is relay://203.0.113.1:4443/b/<id>
#
# The 3-stage ring must produce exactly the tokens of the direct loopback ring, and a direct
# dial from pub into the phone (to a listener that is up) must fail. Needs root, ip, nft.
cd "$(dirname "$0")/../.."
. tests/lib/relay/lib.sh
. tests/lib/relay/ring_relay.sh
. tests/lib/nat_lib.sh
M=$(need_model stories260K.gguf) || exit 1
PROMPT=1,400,300,200,100

S=$$
PUB=kvpub$S NAT=kvnat$S PHONE=kvph$S
nat_setup $PUB $NAT $PHONE

# The reference: a direct loopback ring (also gives each rank its node key).
D="$T/ring"
"$KVCTL" ring up --dir "$D" --model "$M" --stages 3 > "$T/up.log" 2>&1 || { cat "$T/up.log"; fail "direct ring up"; }
direct=$("$KVCTL" generate --ring "$D" --ids --tokens $PROMPT -n 24 --temp 0 2>"$T/gen.err") || fail "direct generate: $(cat "$T/gen.err")"
"$KVCTL" ring down --dir "$D" > /dev/null

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=relay \
    -addext "subjectAltName=IP:203.0.113.1" -keyout "$T/key.pem" -out "$T/cert.pem" 2>/dev/null || fail "certificate"
ip netns exec $PUB "$KVD" --role relay --listen 203.0.113.1:4443 --tls-cert "$T/cert.pem" --tls-key "$T/key.pem" \
    > "$T/relay.log" 2>&1 &
PIDS="$PIDS $!"
bid=$(openssl rand -hex 16)
cp "$D/ring.json" "$T/direct.json"
/usr/bin/python3 - "$T/direct.json" "$D/ring.json" "$bid" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
eps = ["tcp://203.0.113.1:7100", "relay://203.0.113.1:4443/b/" + sys.argv[3], "tcp://203.0.113.1:7102"]
for r, ep in zip(m["ranks"], eps):
    r["endpoint"] = ep
json.dump(m, open(sys.argv[2], "w"), indent=1)
PY
export KV_RELAY_CA="$T/cert.pem"
start_stage "$D" 0 "$M" ip netns exec $PUB
start_stage "$D" 1 "$M" ip netns exec $PHONE
start_stage "$D" 2 "$M" ip netns exec $PUB
wait_linked "$D" 3 30 || { cat "$T/relay.log"; fail "the NAT ring did not link"; }
via=$("$KVCTL" generate --ring "$D" --ids --tokens $PROMPT -n 24 --temp 0 2>"$T/gen.err") || fail "generate: $(cat "$T/gen.err")"
[ "$via" = "$direct" ] || fail "tokens through NAT + relay '$via' differ from the direct ring '$direct'"
echo "ok: ring with rank 1 behind NAT gives the direct ring's tokens: $via"
# rank 1's in-link came through the relay; its out-link left through the NAT (seen masqueraded)
grep -q "in-link through the relay" "$D/rank-1/kvd.log" || fail "rank 1 did not take its in-link from the relay"
grep "link in up: rank 1" "$D/rank-2/kvd.log" | grep -q "203.0.113.2" || fail "rank 2 did not see rank 1 behind the NAT address"
st=$(ip netns exec $PUB curl -s --cacert "$T/cert.pem" https://203.0.113.1:4443/v1/relay/status)
echo "$st" | grep -q '"paired":1' || fail "relay status: $st"

# A listener in the phone answers inside the phone, but a dial from pub does not get through.
nat_dial_blocked $PUB $PHONE 7101
echo "ok: a direct dial into the phone fails; the phone is reachable only through the relay"
"$KVCTL" ring down --dir "$D" > /dev/null
echo "PASS"

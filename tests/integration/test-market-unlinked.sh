#!/bin/bash
# test-market-unlinked.sh — a ring that cannot link is no ring on the map (docs/market.md,
# "The map"). Three `kvd join` nodes on loopback, one of them reached only through a TLS relay
# (--relay), every node told by --relay-ca to trust a CA that did not sign the relay's
# certificate: every window gets an active lease (probes travel over the market's API) and the
# market assembles the manifest, but the links through the relay fail their TLS handshake.
# The stages say so in their heartbeats: the coverage JSON lists no ring, the would-be ring is
# under "unlinked" with the reason (the certificate), and `kvctl market status` prints
# "rings 0" and that reason.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"

market_up
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=relay \
    -addext "subjectAltName=IP:127.0.0.1" -keyout "$T/key.pem" -out "$T/cert.pem" 2>/dev/null ||
    die "openssl cannot make the relay's certificate"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=other-ca \
    -keyout "$T/other.key" -out "$T/other.pem" 2>/dev/null || die "openssl cannot make another CA"
"$KVD" --role relay --listen 127.0.0.1:0 --tls-cert "$T/cert.pem" --tls-key "$T/key.pem" >"$T/relay.log" 2>&1 &
PIDS="$PIDS $!"
relay_port() { RPORT=$(sed -n 's/.*listening on .* port \([0-9]*\).*/\1/p' "$T/relay.log"); [ -n "$RPORT" ]; }
wait_for 10 relay_port || die "the relay did not start: $(cat "$T/relay.log")"

join() { # join NAME [options]
    local n=$1; shift
    "$KVD" join --market "$M" --model "$ID" --state-dir "$T/$n" --mem 1800000 -t 1 --jitter-ms 300 \
        --relay-ca "$T/other.pem" "$@" >"$T/join-$n.log" 2>&1 &
    PIDS="$PIDS $!"
}
join a --listen 127.0.0.1:0
join b --relay "relay://127.0.0.1:$RPORT"
join c --listen 127.0.0.1:0

unlinked() { # every window active, no ring, the would-be ring unlinked for its certificate
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 - "$T/cov.json" 2>/dev/null <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
ok = all(w["state"] == "active" for w in c["windows"]) and not c["rings"] and len(c["unlinked"]) == 1
ok = ok and "certificate" in c["unlinked"][0]["reason"] and not any(w["rings"] for w in c["windows"])
sys.exit(0 if ok else 1)
PY
}
wait_for 90 unlinked || fail "the map does not show the unlinked ring with its reason: $(cat "$T/cov.json")"
python3 -c 'import json,sys; print("       reason:", json.load(open(sys.argv[1]))["models"][0]["unlinked"][0]["reason"])' "$T/cov.json"
grep -q "relay://127.0.0.1:$RPORT/b/" "$T/cov.json" || fail "node b's endpoint is not the relay's: $(cat "$T/cov.json")"
echo "ok   every window active, the manifest assembled, and no ring on the map: the links through the relay fail"

"$KVCTL" market status "$M" >"$T/status.txt" || fail "kvctl market status failed"
grep -q "rings 0" "$T/status.txt" || fail "kvctl market status counts a ring: $(cat "$T/status.txt")"
grep -q "not a ring: mkt-.*certificate" "$T/status.txt" || fail "kvctl market status does not say why: $(cat "$T/status.txt")"
grep -q " down" "$T/status.txt" || fail "kvctl market status shows no stage's links down: $(cat "$T/status.txt")"
echo "ok   kvctl market status shows no ring and why:"
grep "not a ring" "$T/status.txt" | sed 's/^/     /'
finish

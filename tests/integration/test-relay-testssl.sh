#!/bin/bash
# testssl.sh (Debian package testssl.sh) against the relay: no protocol below TLS 1.2 is
# offered and client-initiated renegotiation is refused. Only the protocol and
# renegotiation checks run, to keep CI time down.
cd "$(dirname "$0")/../.."
. tests/lib/relay/lib.sh
TESTSSL=$(command -v testssl || command -v testssl.sh) || fail "testssl.sh missing (scripts/setup.sh installs it)"
make_cert
start_relay tls --tls-cert "$T/cert.pem" --tls-key "$T/key.pem" --quiet
timeout 240 "$TESTSSL" --protocols --renegotiation --quiet --color 0 --warnings off \
    --jsonfile "$T/testssl.json" "127.0.0.1:$PORT" > "$T/testssl.txt" 2>&1
grep -E 'SSLv|TLS 1|Renegotiation' "$T/testssl.txt"
/usr/bin/python3 - "$T/testssl.json" <<'PY' || fail "testssl findings"
import json, sys
f = {e["id"]: e["finding"] for e in json.load(open(sys.argv[1])) if "id" in e}
bad = []
for p in ("SSLv2", "SSLv3", "TLS1", "TLS1_1"):
    if not f.get(p, "").startswith("not offered"):
        bad.append(f"{p}: {f.get(p, 'no finding')!r}, expected 'not offered'")
if not f.get("TLS1_2", "").startswith("offered"):
    bad.append(f"TLS1_2: {f.get('TLS1_2', 'no finding')!r}, expected 'offered'")
if f.get("secure_client_renego") != "not vulnerable":
    bad.append(f"secure_client_renego: {f.get('secure_client_renego', 'no finding')!r}, expected 'not vulnerable'")
for b in bad:
    print("testssl:", b)
sys.exit(1 if bad else 0)
PY
echo "testssl: nothing below TLS 1.2, client-initiated renegotiation refused"
# plain ws:// only when asked for: no certificate and no --plain is refused, as is half a pair
"$KVD" relay --listen 127.0.0.1:0 > "$T/noplain.txt" 2>&1 & np=$!
( sleep 5; kill $np 2>/dev/null ) & w=$!
wait $np; rc=$?; kill $w 2>/dev/null
[ $rc = 2 ] && grep -q -- "--tls-cert and --tls-key are required (or --plain" "$T/noplain.txt" ||
    fail "a relay without a certificate or --plain: rc $rc: $(cat "$T/noplain.txt")"
timeout 5 "$KVD" relay --listen 127.0.0.1:0 --tls-cert "$T/cert.pem" > "$T/half.txt" 2>&1
rc=$?
[ $rc = 2 ] || fail "a relay with a certificate but no key: rc $rc: $(cat "$T/half.txt")"
echo "relay: TLS unless --plain is given"

#!/bin/bash
# A relay whose certificate the stages do not trust: the cause reaches the people who can fix
# it. Rank 1's endpoint is relay://127.0.0.1:PORT/b/<id>, so rank 0 dials the relay as the
# upstream end; KV_RELAY_CA names a CA that did not sign the relay's certificate. Rank 0's log
# and a client's `kvctl generate` error must both name the certificate problem (OpenSSL's
# words: "self-signed certificate") and the setting that fixes it (KV_RELAY_CA), each on one
# whole line (no reason cut short, no bare "tls:" line without time and level). Then a
# certificate for another address: "IP address mismatch". Stand-in compute (--stub).
cd "$(dirname "$0")/../.."
. tests/lib/relay/lib.sh
. tests/lib/relay/ring_relay.sh
need_exec "$KVD_STUB"

D="$T/ring"
KVD_BIN=$KVD_STUB "$KVCTL" ring up --dir "$D" --stub --layers 6 --embd 64 --stages 3 > "$T/up.log" 2>&1 ||
    { cat "$T/up.log"; fail "ring up"; }
KVD_BIN=$KVD_STUB "$KVCTL" ring down --dir "$D" > /dev/null
cp "$D/ring.json" "$T/direct.json"

make_cert
# another CA, which signed nothing the relay shows
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=some-other-ca -keyout "$T/other.key" -out "$T/other.pem" 2>/dev/null || fail "openssl"
start_relay relay --tls-cert "$T/cert.pem" --tls-key "$T/key.pem" --pair-timeout 3000
RPORT=$PORT
relay_manifest "$T/direct.json" "$D/ring.json" 1 "relay://127.0.0.1:$RPORT/b/$(openssl rand -hex 16)"

stub_stage() {   # stub_stage DIR RANK: like start_stage, with the stand-in compute
    mkdir -p "$1/rank-$2"
    "$KVD_STUB" stage --manifest "$1/ring.json" --rank "$2" --state-dir "$1/rank-$2" -t 1 --stub \
        > "$1/rank-$2/kvd.log" 2>&1 &
    echo $! > "$1/rank-$2/kvd.pid"
    PIDS="$PIDS $!"
}

# check_cause WHAT PATTERN: rank 0 logs the cause and a client's error names it.
check_cause() {
    local what=$1 pat=$2
    wait_for 10 grep -q "$pat" "$D/rank-0/kvd.log" ||
        { cat "$D/rank-0/kvd.log"; fail "$what: rank 0's log does not name the certificate problem"; }
    local line
    line=$(grep -m1 "$pat" "$D/rank-0/kvd.log")
    echo "$line" | grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z (INFO|WARN) ' ||
        fail "$what: the line has no time and level: $line"
    echo "$line" | grep -q "KV_RELAY_CA" || fail "$what: the line does not name KV_RELAY_CA: $line"
    echo "$line" | grep -q "holds)" || fail "$what: the line is cut short: $line"
    echo "$line" | grep -q "connection refused" && fail "$what: the cause is misreported: $line"
    grep -v '^[0-9]\{4\}-' "$D/rank-0/kvd.log" | grep -i "tls" && fail "$what: a bare tls line in rank 0's log"
    "$KVCTL" generate --ring "$D" --ids --tokens 1,2,3 -n 3 --temp 0 > /dev/null 2> "$T/gen.err" &&
        fail "$what: generate succeeded through a relay whose certificate is not trusted"
    grep -q "$pat" "$T/gen.err" || fail "$what: the client's error does not name the certificate problem: $(cat "$T/gen.err")"
    grep -q "KV_RELAY_CA" "$T/gen.err" || fail "$what: the client's error does not name KV_RELAY_CA: $(cat "$T/gen.err")"
    grep -q "link rank 0 -> rank 1 is down" "$T/gen.err" || fail "$what: the client's error does not name the link: $(cat "$T/gen.err")"
    echo "ok $what: $(cat "$T/gen.err")"
}

export KV_RELAY_CA="$T/other.pem"
for r in 0 1 2; do stub_stage "$D" $r; done
check_cause "untrusted relay certificate" "self-signed certificate"
# Rank 1 dials the same relay for its in-link: it names the problem in its log too.
wait_for 10 grep -q "self-signed certificate.*KV_RELAY_CA" "$D/rank-1/kvd.log" ||
    { cat "$D/rank-1/kvd.log"; fail "rank 1's log does not name the certificate problem"; }
# The same reason again and again is logged once (then once a minute), not every redial.
sleep 3
n=$(grep -c "self-signed certificate" "$D/rank-0/kvd.log")
[ "$n" -le 2 ] || fail "rank 0 logged the same certificate failure $n times in a few seconds"
KVD_BIN=$KVD_STUB "$KVCTL" ring down --dir "$D" > /dev/null

# The CA is right, but the certificate is for another address.
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=kvasir-other -addext "subjectAltName=IP:127.0.0.2" \
    -keyout "$T/k2.pem" -out "$T/c2.pem" 2>/dev/null || fail "openssl"
kill "$RELAY_PID"; wait "$RELAY_PID" 2>/dev/null
start_relay relay2 --tls-cert "$T/c2.pem" --tls-key "$T/k2.pem" --pair-timeout 3000
relay_manifest "$T/direct.json" "$D/ring.json" 1 "relay://127.0.0.1:$PORT/b/$(openssl rand -hex 16)"
export KV_RELAY_CA="$T/c2.pem"
for r in 0 1 2; do stub_stage "$D" $r; done
check_cause "relay certificate for another address" "IP address mismatch"
KVD_BIN=$KVD_STUB "$KVCTL" ring down --dir "$D" > /dev/null
echo PASS
KVD_BIN=$KVD_STUB "$KVCTL" ring down --dir "$D" > /dev/null
echo PASS

#!/bin/bash
# test-market-tls.sh — `kvd market --tls-cert C --tls-key K` serves its API over HTTPS (the
# project's HTTP server with TLS as its byte filter), and its clients verify it against a CA
# (docs/market.md, "Running a market"):
#  * kvctl market add/status/balance with --ca work; without it (a CA the system does not
#    know) they fail on the certificate, and a plain-HTTP request gets no answer;
#  * `kvd join --ca` enrols over HTTPS: claims, pulls and activates its lease, and the ring of
#    one it forms serves the one-process generation; without --ca it gets nowhere.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
    -subj /CN=kvasir-market -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
    -keyout "$T/key.pem" -out "$T/cert.pem" 2>/dev/null || die "openssl cannot make a certificate"
"$KVCTL" catalog "$S" -o "$T/cat.json" >/dev/null 2>&1 || die "kvctl catalog failed"
"$KVD" seeder --serve "$S" --listen 127.0.0.1:0 --port-file "$T/seeder.port" >"$T/seeder.log" 2>&1 &
PIDS="$PIDS $!"
"$KVD" market --tls-cert "$T/cert.pem" --tls-key "$T/key.pem" --db "$T/market.db" \
    --listen 127.0.0.1:0 --port-file "$T/market.port" >"$T/market.log" 2>&1 &
PIDS="$PIDS $!"
wait_file "$T/seeder.port" && wait_file "$T/market.port" || die "seeder or market did not start"
"$KVD" market --tls-cert "$T/cert.pem" --db "$T/x.db" >"$T/half.log" 2>&1
[ $? = 2 ] && grep -q "go together" "$T/half.log" || fail "--tls-cert without --tls-key: $(cat "$T/half.log")"
SEEDER=http://127.0.0.1:$(cat "$T/seeder.port")
M=https://127.0.0.1:$(cat "$T/market.port")
grep -q "(https)" "$T/market.log" || fail "the market does not say it serves https: $(cat "$T/market.log")"

# clients: a CA they are given, and none
"$KVCTL" market add "$M" --catalog "$T/cat.json" --source "$SEEDER" --state-dir "$T/admin" \
    >"$T/noca.out" 2>"$T/noca.err" && fail "kvctl market add trusted an unknown certificate"
grep -qi "certificate" "$T/noca.err" || fail "without --ca, no word of the certificate: $(cat "$T/noca.err")"
ID=$("$KVCTL" market add "$M" --ca "$T/cert.pem" --catalog "$T/cat.json" --source "$SEEDER" \
     --name stories --state-dir "$T/admin" 2>"$T/add.log") || { cat "$T/add.log"; fail "kvctl market add --ca failed"; }
[ "$ID" = "$(sha256sum "$T/cat.json" | cut -d' ' -f1)" ] || fail "model id $ID is not the catalog's SHA-256"
"$KVCTL" market status "$M" --ca "$T/cert.pem" >"$T/status.txt" || fail "kvctl market status --ca failed"
grep -q "stories" "$T/status.txt" || fail "status: $(cat "$T/status.txt")"
plain=$(curl -s -m 5 "http://127.0.0.1:$(cat "$T/market.port")/v1/models")
echo "$plain" | grep -q '"models"' && fail "the HTTPS port answered plain HTTP"
curl -sf -m 5 --cacert "$T/cert.pem" "$M/v1/models" | grep -q '"models"' || fail "curl over https failed"
echo "ok   kvctl market over https with --ca; without it the certificate is refused; no plain HTTP"

# a join node without the CA gets nowhere; with it, it enrols and serves
"$KVD" join --market "$M" --model "$ID" --state-dir "$T/x" --mem 64M -t 1 --jitter-ms 0 \
    >"$T/join-noca.log" 2>&1 &
NOCA=$!
PIDS="$PIDS $NOCA"
"$KVD" join --market "$M" --ca "$T/cert.pem" --model "$ID" --state-dir "$T/a" --mem 64M -t 1 \
    --jitter-ms 0 >"$T/join-a.log" 2>&1 &
PIDS="$PIDS $!"
wait_for 60 grep -q "waiting for the ring's manifest" "$T/join-a.log" ||
    fail "the join node did not get an active lease over https"
wait_for 20 grep -qi "certificate" "$T/join-noca.log" ||
    fail "the join node without --ca: $(tail -3 "$T/join-noca.log")"
grep -q "claimed" "$T/join-noca.log" && fail "the join node without --ca claimed a window"
kill "$NOCA"
want=$("$KVCTL" generate -m "$S" --tokens 1,50,100,200,300 -n 8 --temp 0 --ids 2>/dev/null)
serves() {
    got=$("$KVCTL" generate --ring "unix:$T/a/kvd.sock" --tokens 1,50,100,200,300 -n 8 --temp 0 \
          --ids 2>"$T/gen.err")
    [ -n "$got" ] && [ "$got" = "$want" ]
}
wait_for 40 serves || fail "the ring of one over an https market gives '$got' ($(cat "$T/gen.err")), want '$want'"
echo "ok   kvd join --ca enrols through an https market and its ring serves: $got"
finish

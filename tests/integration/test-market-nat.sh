#!/bin/bash
# test-market-nat.sh — the market's join flow with one node behind a NAT (docs/market.md),
# in network namespaces made by this test on the relay tests' topology (test-relay-nat.sh):
#
#   pub   203.0.113.1  market (:7490), seeder (:7480), relay (TLS, :4443), nodes a (:7100)
#         and c (:7102)
#   nat   203.0.113.2 / 198.51.100.1: a router that masquerades the phone's traffic and drops
#         every connection that starts on its public side (nftables)
#   phone 198.51.100.2  node b: `kvd join --relay relay://203.0.113.1:4443`, no inbound
#
# Three `kvd join` nodes (no manifest, no layer ranges) form one ring through the relay whose
# generation equals one process's; node b's manifest endpoint is a relay one and its in-link
# comes through the relay; node b's lease became active after a known-answer probe that
# travelled over the market's API; a direct dial into the phone fails; every node is credited
# the layer-tokens its stage computed. Needs root, ip, nft.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"
. "$(dirname "$0")/../lib/nat_lib.sh"

N=$$
PUB=kvmp$N NAT=kvmn$N PHONE=kvmh$N
nat_setup $PUB $NAT $PHONE
INPUB="ip netns exec $PUB"
INPHONE="ip netns exec $PHONE"
MKT_NS=$INPUB

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=relay \
    -addext "subjectAltName=IP:203.0.113.1" -keyout "$T/key.pem" -out "$T/cert.pem" 2>/dev/null ||
    die "certificate"
export KV_RELAY_CA="$T/cert.pem"
$INPUB "$KVD" --role relay --listen 203.0.113.1:4443 --tls-cert "$T/cert.pem" --tls-key "$T/key.pem" \
    >"$T/relay.log" 2>&1 &
PIDS="$PIDS $!"
"$KVCTL" catalog "$S" -o "$T/cat.json" >/dev/null 2>&1 || die "kvctl catalog failed"
$INPUB "$KVD" seeder --serve "$S" --listen 203.0.113.1:7480 >"$T/seeder.log" 2>&1 &
PIDS="$PIDS $!"
mkdir -p "$T/op"
"$KVD" stage --state-dir "$T/op" --print-key >"$T/operators.txt" || die "no operator key"
# a and c share the public host 203.0.113.1: two direct ranks from one address
$INPUB "$KVD" market --db "$T/market.db" --listen 203.0.113.1:7490 --lease-s 6 --grace-s 3 \
    --operator-key "$T/operators.txt" --max-ranks-per-addr 2 >"$T/market.log" 2>&1 &
PIDS="$PIDS $!"
M=http://203.0.113.1:7490
market_answers() { $INPUB curl -sf "$M/v1/models" >/dev/null; }
wait_for 10 market_answers || die "the market did not start"
ID=$($INPUB "$KVCTL" market add "$M" --catalog "$T/cat.json" --source http://203.0.113.1:7480 \
     --name stories --model "$S" --state-dir "$T/admin" 2>"$T/add.log") || { cat "$T/add.log"; die "kvctl market add failed"; }
CKEY=$($INPUB "$KVCTL" market client add "$M" --credit 1000 --state-dir "$T/op" 2>>"$T/add.log") ||
    { cat "$T/add.log"; die "kvctl market client add failed"; }

join() { # join NAME NETNS-PREFIX [kvd join options...]
    local name=$1 ns=$2; shift 2
    $ns "$KVD" join --market "$M" --model "$ID" --state-dir "$T/$name" --mem 1800000 -t 1 \
        --jitter-ms 300 "$@" >"$T/join-$name.log" 2>&1 &
    PIDS="$PIDS $!"
}
join a "$INPUB" --listen 203.0.113.1:7100
join b "$INPHONE" --relay relay://203.0.113.1:4443
join c "$INPUB" --listen 203.0.113.1:7102
wait_for 90 ring_ready || fail "no complete ring within 90 s: $(cat "$T/cov.json")"

want=$("$KVCTL" generate -m "$S" --tokens 1,50,100,200,300 -n 16 --temp 0 --ids 2>/dev/null)
[ -n "$want" ] || die "one-process generation failed"
serves() { # serves NAME: its kvd.sock (a Unix socket: any namespace reaches it) answers
    got=$("$KVCTL" generate --ring "unix:$T/$1/kvd.sock" --client-key "$CKEY" --tokens 1,50,100,200,300 -n 16 --temp 0 \
          --ids 2>"$T/gen.err")
    [ -n "$got" ] && [ "$got" = "$want" ]
}
wait_for 30 test -s "$T/a/manifest.json" -a -s "$T/b/manifest.json" -a -s "$T/c/manifest.json" ||
    fail "not every node got the manifest"
R0=$(rank0 a b c)
[ -n "$R0" ] || fail "no node runs rank 0"
wait_for 40 serves "$R0" ||
    fail "the ring through the relay gives '$got' ($(cat "$T/gen.err")), one process '$want'"
echo "ok   three joined nodes, one behind a NAT, serve the one-process generation: $got"

# node b's rank has a relay endpoint, its in-link came through the relay, its out-link left
# through the NAT (its successor saw the NAT's address)
RB=$(rank_of b)
python3 -c '
import json,sys
m=json.load(open(sys.argv[1])); ep=m["ranks"][int(sys.argv[2])]["endpoint"]
sys.exit(0 if ep.startswith("relay://203.0.113.1:4443/b/") else "rank %s endpoint %s" % (sys.argv[2], ep))' \
    "$T/b/manifest.json" "$RB" || fail "node b's manifest entry is not a relay endpoint"
grep -q "in-link through the relay" "$T/join-b.log" || fail "node b did not take its in-link from the relay"
SUCC=""
for n in a c; do [ "$(rank_of $n)" = $(( (RB + 1) % 3 )) ] && SUCC=$n; done
grep "link in up: rank $RB" "$T/join-$SUCC.log" | grep -q "203.0.113.2" ||
    fail "node $SUCC (rank $(( (RB + 1) % 3 ))) did not see node b behind the NAT's address"

# the node behind the NAT got its known-answer probe over the market's API (no inbound needed)
# and its lease became active only once the market found the answer right
grep -q "(activation) of window [0-9]*: the market found it right" "$T/join-b.log" ||
    fail "node b (relay endpoint) logged no passed activation probe"
grep -q "(activation) of window [0-9]* by node $(key_of b | cut -c1-16)\.\.\.: pass" "$T/market.log" ||
    fail "the market logged no passed activation probe of node b"
echo "ok   node b (relay endpoint) was activated by a known-answer probe over the market's API"

# a listener in the phone answers inside the phone, but a dial from pub does not get through
nat_dial_blocked $PUB $PHONE 7101
echo "ok   node b is reachable only through the relay (a direct dial into the phone fails)"

wait_for 30 credited a b c || fail "balances do not match the stages' work: $(cat "$T/credited.txt")"
echo "ok   every node, the one behind the NAT too, is credited the layer-tokens its stage computed:"
sed 's/^/       /' "$T/credited.txt"
finish

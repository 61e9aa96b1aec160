#!/bin/bash
# test-market-attack.sh — the market among strangers (docs/security.md, "Attacks"): each attack
# carried out as a hostile node would, with real signatures (tests/tools/tool-market-call.c) and
# from loopback addresses of its own, against a market where three honest `kvd join` nodes
# serve a paying client:
#  * a squatted reservation: heartbeats with progress and no endpoint keep a reservation only
#    until its fixed end, then the window is free and the squatter is refused it;
#  * a crowd of fresh identities from one address: the claim rate limit per address answers
#    429; by default a second identity from one address cannot take a second rank of the
#    model, and one that claimed as relay-reached (the looser cap) cannot show a direct endpoint;
#  * admission allowlist: a key not on it cannot claim;
#  * credit minted from nothing: receipts signed by a stranger for the live ring's ranks, for a
#    ring generation the market never published, and a whole ring's keys signing every side of
#    sessions no client opened (self-dealing), for made-up clients, with proofs made without
#    the client's key, and for 1e12 tokens: none is credited and demand does not rise;
#    self-dealing with a client account of one's own pays exactly what it costs;
#  * a stranger standing by for a window says it took the rank over while its holder serves:
#    the market waits for the rank before it to report its link up to the standby (202), and
#    the holder keeps its window (the last rank's as a middle one's); a standby lease on rank
#    0's window, and takeovers of another rank or generation, are refused;
#  * a model hijack: a stranger's re-registration and removal of a model are refused (403
#    naming the owner), the model keeps its sources and probes; its owner's re-registration is
#    idempotent;
# and the honest nodes keep their leases, their ring and exactly their credit throughout.
. "$(dirname "$0")/../lib/lib.sh"
CALL=$TOOLS/tool-market-call
need_exec "$CALL"
MARKET_CAPS="--max-ranks-per-addr 3 --claims-per-min-addr 20"
MARKET_ARGS="--reserve-s 8 --pull-min-rate 1e12 --lapse-refuse-s 600 --settle-wait-s 600"
. "$(dirname "$0")/../lib/market_lib.sh"
market_up

claim() { echo "{\"model\":\"$ID\",\"window\":$1}"; }
for n in x y q q2; do mkdir -p "$T/$n"; done
# three windows: the plan follows the first profiles (1.8 MB each, as the joins send)
for n in x y q; do
    expect "profile $n" 200 --key "$T/$n" --from 127.0.0.9 POST "$M" /v1/nodes "{\"model\":\"$ID\",\"mem_bytes\":1800000}"
done

# ---- a squatted reservation
expect "q claims window 0 (a reservation)" 201 --key "$T/q" --from 127.0.0.9 POST "$M" /v1/claims "$(claim 0)"
echo "$LAST" | grep -q '"reserve_ends_in":[0-9]' || fail "the claim does not say when the reservation ends: $LAST"
# q heartbeats with download progress and never shows an endpoint
hb_q() { "$CALL" --key "$T/q" --from 127.0.0.9 POST "$M" /v1/leases/heartbeat \
             "{\"model\":\"$ID\",\"window\":0,\"progress\":1000}"; }
t0=$(date +%s.%N)
lapsed() { hb_q | grep -q '^409 .*holds no lease'; }
wait_for 30 lapsed || fail "a reservation kept alive by progress heartbeats did not end: $(hb_q)"
el=$(echo "$(date +%s.%N) - $t0" | bc)
echo "ok   the squatter's reservation ended after ${el} s of heartbeats (its fixed end: 8 s after the claim)"
expect "q claims window 0 again" 403 --key "$T/q" --from 127.0.0.9 POST "$M" /v1/claims "$(claim 0)"
echo "$LAST" | grep -q "ran out" || fail "the refusal does not say why: $LAST"

# ---- a crowd of fresh identities from one address
mkdir -p "$T/crowd"
: >"$T/crowd.txt"
t0=$(date +%s.%N)
for i in $(seq 1 60); do
    "$CALL" --key "$T/crowd/$i" --from 127.0.0.10 POST "$M" /v1/claims "$(claim 2)" | cut -c1-3 >>"$T/crowd.txt"
done
# the bucket holds a minute's worth (20) and refills 20 a minute while the calls go on: on a
# slow machine a few more get through, never the crowd
el=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%d", b - a + 1 }')
[ "$el" -lt 60 ] || fail "60 claims took ${el} s: too slow to tell the rate limit from its refill"
want=$((60 - 20 - (el * 20 + 59) / 60))
# one reservation of window 2 at a time: one that never becomes active ends after --reserve-s
# (8 s), and a later claim of the crowd may take the window again
maxok=$((1 + el / 8))
n429=$(grep -c '^429' "$T/crowd.txt")
nok=$(grep -c '^20[01]' "$T/crowd.txt")
[ "$n429" -ge "$want" ] && [ "$nok" -le "$maxok" ] ||
    fail "60 fresh identities from one address in ${el} s: $n429 rate-limited (expected >= $want), $nok leases (expected <= $maxok): $(sort "$T/crowd.txt" | uniq -c)"
# (a token refilled just now lets one call through: the next one meets the empty bucket)
named() { "$CALL" --key "$T/crowd/61" --from 127.0.0.10 POST "$M" /v1/claims "$(claim 2)" |
              grep -q "too many claims from address 127.0.0.10"; }
named || named || fail "the rate limit does not name the address"
echo "ok   60 fresh identities from one address: $n429 refused with 429, $nok lease(s)"
# the crowd's one lease (if any) is a reservation that ends too; release it for the honest nodes
for i in $(seq 1 60); do
    "$CALL" --key "$T/crowd/$i" --from 127.0.0.11 POST "$M" /v1/leases/release "$(claim 2)" >/dev/null
done

# ---- the honest ring
declare -A JPID
join() { # join NAME
    "$KVD" join --market "$M" --model "$ID" --state-dir "$T/$1" --mem 1800000 -t 1 \
        --jitter-ms 300 >"$T/join-$1.log" 2>&1 &
    JPID[$1]=$!
    PIDS="$PIDS $!"
}
for n in a b c; do join $n; done
wait_for 90 ring_ready || fail "no complete honest ring within 90 s: $(cat "$T/cov.json")"
R0=$(rank0 a b c)
want=$("$KVCTL" generate -m "$S" --tokens 1,50,100,200,300 -n 8 --temp 0 --ids 2>/dev/null)
serves() {
    got=$("$KVCTL" generate --ring "unix:$T/$R0/kvd.sock" --client-key "$CKEY" --tokens 1,50,100,200,300 \
          -n 8 --temp 0 --ids 2>"$T/gen.err")
    [ -n "$got" ] && [ "$got" = "$want" ]
}
wait_for 30 serves || fail "the honest ring's tokens ($got; $(cat "$T/gen.err")) differ from one process's"
serves || fail "the second client session failed"
wait_for 40 credited a b c || fail "the honest nodes' balances do not match their work: $(cat "$T/credited.txt")"
echo "ok   three honest nodes serve a paying client and are credited for it"
honest_balances() { for n in a b c; do "$KVCTL" market balance "$M" "$(key_of $n)" --json | tr -d ' \n'; echo; done; }
honest_balances >"$T/honest.before"
H=$(sha256sum "$T/$R0/manifest.json" | cut -d' ' -f1)
demand() { curl -s "$M/v1/models/$ID/coverage" | python3 -c 'import json,sys; print(json.load(sys.stdin)["demand_rpm"])'; }
d0=$(demand)

# ---- credit minted from nothing
rc() { # rc SESSION RANK T0 T1 SIDE [MANIFEST]
    echo "{\"model\":\"$ID\",\"manifest\":\"${6:-$H}\",\"session\":\"$1\",\"rank\":$2,\"tokens\":[$3,$4],\"digest\":\"$(echo x | sha256sum | cut -d' ' -f1)\",\"side\":\"$5\"}"
}
op() { # op SESSION T CLIENT-ID PROOF-KEY: an open side with a proof made with that key
    client_open "$ID" "$H" "$1" "$2" "$4" "$3"
}
X1=aaaaaaaaaaaaaaa1
expect "a stranger signs rank 0's side of the live ring" 403 --key "$T/x" --from 127.0.0.9 POST "$M" /v1/receipts "$(rc $X1 0 0 10 sent)"
echo "$LAST" | grep -q "did not hold rank 0" || fail "no reason given: $LAST"
expect "a stranger attests itself for a generation the market never published" 404 --key "$T/x" --from 127.0.0.9 \
    POST "$M" /v1/receipts "$(rc $X1 0 0 10 received "$(echo fake | sha256sum | cut -d' ' -f1)")"
# the whole ring's keys (the attacker holds them all) sign every side of sessions nobody opened
for s in 1 2 3 4 5; do
    sid=$(printf 'bbbbbbbbbbbbbbb%x' $s)
    for r in 0 1 2; do
        owner=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["ranks"][int(sys.argv[2])]["node"])' "$T/$R0/manifest.json" $r)
        next=$(python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["ranks"][(int(sys.argv[2])+1)%3]["node"])' "$T/$R0/manifest.json" $r)
        for n in a b c; do [ "$(key_of $n)" = "$owner" ] && so=$n; [ "$(key_of $n)" = "$next" ] && sn=$n; done
        expect "self-dealing session $s: rank $r sent" 200 --key "$T/$so" POST "$M" /v1/receipts "$(rc $sid $r 0 100 sent)"
        expect "self-dealing session $s: rank $r received" 200 --key "$T/$sn" POST "$M" /v1/receipts "$(rc $sid $r 0 100 received)"
        echo "$LAST" | grep -q '"credited":false' || fail "a session no client opened was credited: $LAST"
    done
done
CID=$(printf %s "$CKEY" | sha256sum | cut -d' ' -f1)
expect "rank 0 opens a self-dealt session for a made-up client" 403 --key "$T/$R0" POST "$M" /v1/receipts \
    "$(op bbbbbbbbbbbbbbb1 100 "$(echo nobody | sha256sum | cut -d' ' -f1)" kvc-x)"
echo "$LAST" | grep -q "not known to this market" || fail "no reason given: $LAST"
expect "rank 0 opens it for the real client without its key" 403 --key "$T/$R0" POST "$M" /v1/receipts \
    "$(op bbbbbbbbbbbbbbb2 100 "$CID" kvc-0000000000000000000000000000000000000000000000000000000000000000)"
echo "$LAST" | grep -q "must hold the client's key" || fail "no reason given: $LAST"
expect "a receipt for 1e12 tokens" 400 --key "$T/$R0" POST "$M" /v1/receipts "$(rc bbbbbbbbbbbbbbb3 0 0 1000000000000 sent)"
honest_balances >"$T/honest.after"
cmp -s "$T/honest.before" "$T/honest.after" || fail "receipts no client opened changed the balances: $(cat "$T/honest.before") -> $(cat "$T/honest.after")"
python3 -c "import sys; sys.exit(0 if float('$(demand)') <= float('$d0') + 1e-9 else 1)" ||
    fail "fake sessions raised the demand: $d0 -> $(demand)"
echo "ok   sessions no client opened pay nothing and raise no demand"
# self-dealing with money of one's own: the ring's keys get exactly what their client paid
OKEY=$("$KVCTL" market client add "$M" --credit 5 --state-dir "$T/op" 2>/dev/null) || fail "second client"
OCID=$(printf %s "$OKEY" | sha256sum | cut -d' ' -f1)
sum_credit() { for n in a b c; do "$KVCTL" market balance "$M" "$(key_of $n)" --json; done |
    python3 -c 'import json,sys; d=sys.stdin.read().replace("}\n{","}|{").split("|"); print(sum(json.loads(x)["credit"] for x in d))'; }
c0=$(sum_credit)
for n in a b c; do "$KVCTL" market balance "$M" "$(key_of $n)" --json >"$T/sd-$n.json"; done
expect "the colluders open a session for their own client" 200 --key "$T/$R0" POST "$M" /v1/receipts \
    "$(op bbbbbbbbbbbbbbb4 100 "$OCID" "$OKEY")"
echo "$LAST" | grep -q '"ranks_paid":3' || fail "the self-funded session was not paid: $LAST"
spent=$("$KVCTL" market client show "$M" "$OKEY" --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["spent"])')
python3 -c "import sys; sys.exit(0 if abs(($(sum_credit) - $c0) - $spent) < 1e-9 else 1)" ||
    fail "self-dealing: credit $(sum_credit) - $c0 against $spent spent"
echo "ok   self-dealing with the colluders' own client pays them exactly what it cost them ($spent)"
for n in a b c; do   # what the colluding keys got, for the honest-credit check below
    "$KVCTL" market balance "$M" "$(key_of $n)" --json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["layer_tokens"] - json.load(open(sys.argv[1]))["layer_tokens"])' \
        "$T/sd-$n.json" >"$T/extra-$n"
done
honest_balances >"$T/honest.before"

# ---- a model hijack
python3 -c '
import json,sys
print(json.dumps({"catalog": open(sys.argv[1]).read(), "name": "hijacked", "sources": ["http://127.0.0.1:9/evil.gguf"],
                  "probes": {"n_layers": 5, "n_embd": 64, "seqs": []}}))' "$T/cat.json" >"$T/hijack.json"
expect "a stranger re-registers the model" 403 --key "$T/x" --from 127.0.0.9 POST "$M" /v1/models "@$T/hijack.json"
echo "$LAST" | grep -q "belongs to node $(key_of admin)" || fail "the refusal does not name the owner: $LAST"
expect "a stranger removes the model" 403 --key "$T/x" --from 127.0.0.9 DELETE "$M" "/v1/models/$ID"
curl -s "$M/v1/models/$ID/sources" | grep -q "$SEEDER" || fail "the model's sources changed: $(curl -s "$M/v1/models/$ID/sources")"
curl -s "$M/v1/models" | grep -q '"name":"stories"' || fail "the model's name changed"
"$KVCTL" market add "$M" --catalog "$T/cat.json" --source "$SEEDER" --name stories --state-dir "$T/admin" \
    >"$T/readd.out" 2>"$T/readd.err" || fail "the owner's re-registration: $(cat "$T/readd.err")"
[ "$(cat "$T/readd.out")" = "$ID" ] || fail "the owner's re-registration answered $(cat "$T/readd.out")"
echo "ok   a stranger cannot change or remove the model; its owner's re-registration is idempotent"

# ---- a stranger standing by says it took over a rank whose holder is alive
mkdir -p "$T/sb"
MAN=$(curl -s "$M/v1/models/$ID/coverage" | python3 -c 'import json,sys; print(json.load(sys.stdin)["rings"][0]["manifest_sha256"])')
sb() { echo "{\"model\":\"$ID\",\"window\":$1${2:-}}"; }
expect "a stranger stands by for rank 0's window" 409 --key "$T/sb" --from 127.0.0.12 POST "$M" /v1/standbys "$(sb 0)"
# the last rank's window takes standbys too, under the same rule: a second stranger standing
# by for it gets nothing by saying it serves rank 2 while its holder is alive
mkdir -p "$T/sb2"
expect "a second stranger stands by for the last rank's window" 201 --key "$T/sb2" --from 127.0.0.13 POST "$M" /v1/standbys "$(sb 2 ',"endpoint":"tcp://127.0.0.13:9"')"
expect "it says it took the last rank over while its holder serves" 202 --key "$T/sb2" --from 127.0.0.13 POST "$M" /v1/standbys "$(sb 2 ",\"serving\":2,\"manifest\":\"$MAN\"")"
expect "the second stranger gives its standby lease up" 200 --key "$T/sb2" --from 127.0.0.13 POST "$M" /v1/standbys "$(sb 2 ',"release":true')"
expect "a stranger stands by for window 1" 201 --key "$T/sb" --from 127.0.0.12 POST "$M" /v1/standbys "$(sb 1 ',"endpoint":"tcp://127.0.0.12:9"')"
expect "it says it took rank 2 over with a standby lease on window 1" 409 --key "$T/sb" --from 127.0.0.12 POST "$M" /v1/standbys "$(sb 1 ",\"serving\":2,\"manifest\":\"$MAN\"")"
expect "it says it took rank 1 over in a ring generation never published" 409 --key "$T/sb" --from 127.0.0.12 POST "$M" /v1/standbys "$(sb 1 ",\"serving\":1,\"manifest\":\"$(printf '%064d' 0)\"")"
# for longer than its holder's heartbeat period (the lease is 6 s): the market waits for the
# predecessor's word and the holder keeps its window
t0=$(date +%s)
while [ $(( $(date +%s) - t0 )) -lt 4 ]; do
    expect "it says it took rank 1 over while its holder serves" 202 --key "$T/sb" --from 127.0.0.12 POST "$M" /v1/standbys "$(sb 1 ",\"serving\":1,\"manifest\":\"$MAN\"")" >/dev/null
done
echo "$LAST" | grep -q "does not report its link to its successor up to tcp://127.0.0.12:9" ||
    fail "the refusal does not say what it waits for: $LAST"
"$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" || fail "kvctl market status failed"
python3 - "$T/cov.json" "$(key_of "$(for n in a b c; do [ "$(rank_of $n)" = 1 ] && echo $n; done)")" \
    "$(key_of "$(for n in a b c; do [ "$(rank_of $n)" = 2 ] && echo $n; done)")" <<'PY' ||
import json, sys
ws = json.load(open(sys.argv[1]))["models"][0]["windows"]
ok = True
for i in (1, 2):
    st = ws[i]["stages"][0]
    ok = ok and st["node"] == sys.argv[1 + i] and "took_over" not in st and ws[i]["state"] == "active"
sys.exit(0 if ok else 1)
PY
    fail "window 1 or 2 changed hands on a stranger's word: $(cat "$T/cov.json")"
# (its lease is 6 s and the look above may take longer on a busy machine: renewed first)
expect "the stranger renews its standby lease" "20[01]" --key "$T/sb" --from 127.0.0.12 POST "$M" /v1/standbys "$(sb 1 ',"endpoint":"tcp://127.0.0.12:9"')"
expect "the stranger gives its standby lease up" 200 --key "$T/sb" --from 127.0.0.12 POST "$M" /v1/standbys "$(sb 1 ',"release":true')"
echo "ok   a standby's word that it took a live holder's rank over changes nothing (202 until the rank before confirms it)"

# ---- the honest ring was never disturbed
ring_ready || fail "the honest ring is not complete after the attacks: $(cat "$T/cov.json")"
serves || fail "the honest ring does not serve after the attacks ($got)"
wait_for 40 credited a b c || fail "the honest nodes' credit after the attacks: $(cat "$T/credited.txt")"
for n in a b c; do
    grep -q "lost the lease" "$T/join-$n.log" && fail "honest node $n lost its lease during the attacks"
done
echo "ok   the honest nodes kept their leases, their ring and exactly their credit"

# ---- one rank per address by default (a market of its own, with the default limits)
"$KVD" market --db "$T/caps.db" --listen 127.0.0.1:0 --port-file "$T/caps.port" >"$T/caps.log" 2>&1 &
PIDS="$PIDS $!"
wait_file "$T/caps.port" || die "the second market did not start: $(cat "$T/caps.log")"
M3=http://127.0.0.1:$(cat "$T/caps.port")
"$KVCTL" market add "$M3" --catalog "$T/cat.json" --source "$SEEDER" --state-dir "$T/admin" >/dev/null 2>&1 ||
    fail "registration at the second market"
for n in x y q; do
    expect "profile $n" 200 --key "$T/$n" --from 127.0.0.9 POST "$M3" /v1/nodes "{\"model\":\"$ID\",\"mem_bytes\":1800000}"
done
expect "q claims window 0" 201 --key "$T/q" --from 127.0.0.9 POST "$M3" /v1/claims "$(claim 0)"
expect "q2, another key from q's address, claims window 1" 409 --key "$T/q2" --from 127.0.0.9 POST "$M3" /v1/claims "$(claim 1)"
echo "$LAST" | grep -q "address 127.0.0.9 already holds 1 rank" || fail "the refusal does not name the address cap: $LAST"
expect "a key from another address claims window 1" 201 --key "$T/q2" --from 127.0.0.12 POST "$M3" /v1/claims "$(claim 1)"
expect "a node that says it is reached through a relay (carrier NAT: up to 4 a ring)" 201 --key "$T/y" --from 127.0.0.9 \
    POST "$M3" /v1/claims "{\"model\":\"$ID\",\"window\":2,\"relay\":true}"
expect "... and then shows a direct endpoint" 409 --key "$T/y" --from 127.0.0.9 POST "$M3" /v1/leases/heartbeat \
    "{\"model\":\"$ID\",\"window\":2,\"endpoint\":\"tcp://127.0.0.9:4000\"}"
echo "$LAST" | grep -q "claimed as reached through a relay" || fail "no reason given: $LAST"

# ---- admission by allowlist (a market of its own)
key_of a >"$T/allow.txt"
"$KVD" market --db "$T/allow.db" --listen 127.0.0.1:0 --port-file "$T/allow.port" \
    --admission allowlist "$T/allow.txt" >"$T/allow.log" 2>&1 &
PIDS="$PIDS $!"
wait_file "$T/allow.port" || die "the allowlist market did not start: $(cat "$T/allow.log")"
M2=http://127.0.0.1:$(cat "$T/allow.port")
"$KVCTL" market add "$M2" --catalog "$T/cat.json" --source "$SEEDER" --state-dir "$T/admin" >/dev/null 2>&1 ||
    fail "registration at the allowlist market"
expect "a key not on the allowlist claims" 403 --key "$T/x" POST "$M2" /v1/claims "$(claim 0)"
echo "$LAST" | grep -q "allowlist" || fail "no reason given: $LAST"
expect "a key on the allowlist claims" 201 --key "$T/a" POST "$M2" /v1/claims "$(claim 0)"
finish

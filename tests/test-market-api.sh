#!/bin/bash
# test-market-api.sh — the market's API against hostile and careless callers
# (docs/market.md), with real signatures (tests/tool-market-call.c):
#  * claims: the first valid claim wins, the loser gets 409 and the free windows; a claim for
#    a window or model that does not exist is 404; a lapsed lease frees its window after the
#    grace period, during which only its node may take it back;
#  * signatures: unsigned, forged (body changed), wrong key, stale timestamp and replayed nonce
#    are refused with 4xx and a reason;
#  * receipts: credited once both sides agree, layer_tokens = tokens x the window's layers and
#    credit = layer_tokens x the published reward; forged, replayed, double-submitted,
#    overlapping, disagreeing and wrong-signer receipts are refused or not credited, and the
#    ledger is unchanged by each;
#  * malformed JSON and an oversized body get 4xx;
#  * durability: kill -9 of the market during a burst of receipts loses no acknowledged
#    receipt, and resubmitting everything after the restart double-counts none;
#  * the coverage page (GET /) renders in headless Chromium (screenshot kept in the log dir).
# KV_MARKET_DB=postgres://... runs it all on PostgreSQL (tests/test-market-pg.sh).
. "$(dirname "$0")/lib.sh"
S=$DATA/models/stories260K.gguf
need_data "$S"
CALL=$TOOLS/tool-market-call
need_exec "$KVD" "$KVCTL" "$CALL"
KEEP_FAILED_TMP=1
san_log_check

"$KVCTL" catalog "$S" -o "$T/cat.json" >/dev/null 2>&1 || die "kvctl catalog failed"
start_market() {
    "$KVD" market --db "${KV_MARKET_DB:-$T/market.db}" --listen "127.0.0.1:$MPORT" --lease-s "${LEASE:-60}" \
        --reserve-s 60 --grace-s "${GRACE:-2}" --no-probe >>"$T/market.log" 2>&1 &
    MARKET_PID=$!
    PIDS="$PIDS $MARKET_PID"
    wait_port "$MPORT" || die "the market did not start: $(tail -5 "$T/market.log")"
}
MPORT=$(free_port)
M=http://127.0.0.1:$MPORT
LEASE=15 GRACE=6 start_market
ID=$("$KVCTL" market add "$M" --catalog "$T/cat.json" --source http://127.0.0.1:1 --state-dir "$T/admin") ||
    die "kvctl market add failed"

expect() { # expect WHAT CODE-PATTERN CALL-ARGS...: run the tool, check the status
    local what=$1 want=$2 out
    shift 2
    out=$("$CALL" "$@")
    LAST=$out
    case "${out%% *}" in
        $want) echo "ok   $what -> ${out:0:160}" ;;
        *) fail "$what: expected $want, got: $out" ;;
    esac
}
key() { "$KVD" stage --state-dir "$T/$1" --print-key; }
for n in a b c d; do mkdir -p "$T/$n"; done
A=$(key a); B=$(key b); C=$(key c); D=$(key d)

# profiles that need three windows; the plan is made before any lease exists
for n in a b c; do
    expect "profile $n" 200 --key "$T/$n" POST "$M" /v1/nodes "{\"model\":\"$ID\",\"mem_bytes\":1800000}"
done
NW=$(curl -s "$M/v1/models/$ID/coverage" | python3 -c 'import json,sys; print(len(json.load(sys.stdin)["windows"]))')
[ "$NW" = 3 ] || fail "planned $NW windows, expected 3"

# ---- claims and leases
claim() { echo "{\"model\":\"$ID\",\"window\":$1}"; }
expect "a claims window 0" 201 --key "$T/a" POST "$M" /v1/claims "$(claim 0)"
expect "b loses the race for window 0 and is told the free ones" 409 --key "$T/b" POST "$M" /v1/claims "$(claim 0)"
echo "$LAST" | grep -q '"free":\[1,2\]' || fail "the loser was not told the free windows [1,2]: $LAST"
expect "a claims window 0 again (idempotent)" 200 --key "$T/a" POST "$M" /v1/claims "$(claim 0)"
expect "a cannot hold a second window" 409 --key "$T/a" POST "$M" /v1/claims "$(claim 1)"
expect "claim for a window that does not exist" 404 --key "$T/b" POST "$M" /v1/claims "$(claim 7)"
expect "claim for a model that does not exist" 404 --key "$T/b" POST "$M" /v1/claims \
    '{"model":"0000000000000000000000000000000000000000000000000000000000000000","window":0}'
expect "b claims window 1" 201 --key "$T/b" POST "$M" /v1/claims "$(claim 1)"
expect "c claims window 2" 201 --key "$T/c" POST "$M" /v1/claims "$(claim 2)"
hb() { echo "{\"model\":\"$ID\",\"window\":$1,\"endpoint\":\"tcp://127.0.0.1:$((40000 + $1))\"}"; }
expect "heartbeat from a non-holder" 409 --key "$T/d" POST "$M" /v1/leases/heartbeat "$(hb 0)"
expect "bad endpoint" 400 --key "$T/a" POST "$M" /v1/leases/heartbeat \
    "{\"model\":\"$ID\",\"window\":0,\"endpoint\":\"ftp://x\"}"
for w in 0 1 2; do
    k=$(echo a b c | cut -d' ' -f$((w + 1)))
    expect "activate window $w" 200 --key "$T/$k" POST "$M" /v1/leases/heartbeat "$(hb $w)"
done
curl -s "$M/v1/models/$ID/coverage" >"$T/cov.json"
grep -q '"rings":\[{' "$T/cov.json" || fail "no ring with every window active: $(cat "$T/cov.json")"
code=$(curl -s -o "$T/man.json" -w '%{http_code}' "$M/v1/models/$ID/manifest")
[ "$code" = 200 ] || fail "manifest: HTTP $code"
H=$(sha256sum "$T/man.json" | cut -d' ' -f1)
t0=$(date +%s.%N)
code=$(curl -s -o /dev/null -w '%{http_code}' "$M/v1/models/$ID/manifest?after=$H&wait=1")
el=$(echo "$(date +%s.%N) - $t0" | bc)
[ "$code" = 204 ] && [ "$(echo "$el >= 0.9" | bc)" = 1 ] ||
    fail "a long-poll for an unchanged manifest: HTTP $code after $el s (expected 204 after ~1 s)"

# a lapsed lease: window 2's node stops its heartbeats (lease 15 s, then a grace of 6 s)
stage_state() { # the state of window $1's stage entry ("" when none)
    curl -s "$M/v1/models/$ID/coverage" | grep -o "\"stages\":\[[^]]*" | sed -n "$(($1 + 1))p" |
        grep -o '"state":"[a-z]*"' | cut -d'"' -f4
}
is_state() { [ "$(stage_state 2)" = "$1" ]; }
keep_ab() { # keep a's and b's leases alive until CMD succeeds (at most 80 rounds)
    local i
    for i in $(seq 80); do
        "$CALL" --key "$T/a" POST "$M" /v1/leases/heartbeat "$(hb 0)" >/dev/null
        "$CALL" --key "$T/b" POST "$M" /v1/leases/heartbeat "$(hb 1)" >/dev/null
        "$@" && return 0
        sleep 0.25
    done
    return 1
}
keep_ab is_state grace || fail "window 2's lease never lapsed into its grace period"
expect "d cannot take window 2 during its grace period" 409 --key "$T/d" POST "$M" /v1/claims "$(claim 2)"
keep_ab is_state "" || fail "window 2's grace period never ended"
curl -s "$M/v1/models/$ID/coverage" >"$T/cov.json"
python3 -c '
import json,sys
c=json.load(open(sys.argv[1])); s=[w["state"] for w in c["windows"]]
sys.exit(0 if s==["active","active","uncovered"] and not c["rings"] else 1)' "$T/cov.json" ||
    fail "after the lapse: $(cat "$T/cov.json")"
python3 -c '
import json,sys
c=json.load(open(sys.argv[1])); r=[w["reward"] for w in c["windows"]]
sys.exit(0 if r[2] > r[0] and r[0] == r[1] else 1)' "$T/cov.json" ||
    fail "the uncovered window does not pay most: $(cat "$T/cov.json")"
expect "c takes its window back after the grace period" 201 --key "$T/c" POST "$M" /v1/claims "$(claim 2)"
expect "c activates again" 200 --key "$T/c" POST "$M" /v1/leases/heartbeat "$(hb 2)"

# long leases from here on (restart the market on the same database)
kill "$MARKET_PID"; wait "$MARKET_PID" 2>/dev/null
start_market
for w in 0 1 2; do   # leases lapsed during the restart are taken back (their grace period)
    k=$(echo a b c | cut -d' ' -f$((w + 1)))
    expect "take window $w back" "20[01]" --key "$T/$k" POST "$M" /v1/claims "$(claim $w)"
    expect "renew window $w" 200 --key "$T/$k" POST "$M" /v1/leases/heartbeat "$(hb $w)"
done

# ---- signatures
expect "unsigned claim" 401 POST "$M" /v1/claims "$(claim 0)"
expect "forged body" 401 --key "$T/a" --sign-body "$(claim 1)" POST "$M" /v1/claims "$(claim 0)"
expect "claim signed by the wrong key" 401 --key "$T/d" --as "$T/a" POST "$M" /v1/claims "$(claim 0)"
expect "stale timestamp" 401 --key "$T/a" --ts $(( $(date +%s) - 3600 )) POST "$M" /v1/claims "$(claim 0)"
expect "claim once" 200 --key "$T/a" --save "$T/h.txt" POST "$M" /v1/claims "$(claim 0)"
expect "replayed nonce" 409 --replay "$T/h.txt" POST "$M" /v1/claims "$(claim 0)"
expect "malformed JSON" 400 --key "$T/a" POST "$M" /v1/claims '{"model": '
expect "JSON that is not an object" 400 --key "$T/a" POST "$M" /v1/claims '[1,2]'
head -c 2000000 /dev/zero | tr '\0' ' ' >"$T/big.json"
expect "oversized body" 413 --key "$T/a" POST "$M" /v1/claims "@$T/big.json"
expect "bad model id in a path" 400 GET "$M" "/v1/models/xyz/coverage"

# ---- known-answer probes: hostile answers and probe sets (their flow: test-market-spot.sh)
probe_ans() { echo "{\"model\":\"$ID\",\"window\":$1,\"id\":\"0011223344556677\",\"outputs\":[]}"; }
expect "a probe answer with no probe pending" 409 --key "$T/a" POST "$M" /v1/leases/probe "$(probe_ans 0)"
expect "a probe answer from a node without the lease" 409 --key "$T/d" POST "$M" /v1/leases/probe "$(probe_ans 0)"
expect "a probe answer for a window that does not exist" 404 --key "$T/a" POST "$M" /v1/leases/probe "$(probe_ans 9)"
reg_with_probes() { # reg_with_probes FILE PROBES-JSON: a registration body with that probe set
    python3 -c '
import json,sys
print(json.dumps({"catalog": open(sys.argv[1]).read(), "sources": ["http://127.0.0.1:1"],
                  "probes": json.loads(sys.argv[2])}))' "$T/cat.json" "$2" >"$1"
}
reg_with_probes "$T/p1.json" '{"n_layers": 5, "n_embd": 64, "seqs": [{"tokens": [1, 2]}]}'
expect "a probe set without boundaries" 400 --key "$T/admin" POST "$M" /v1/models "@$T/p1.json"
reg_with_probes "$T/p2.json" '{"n_layers": 9, "n_embd": 64, "seqs": []}'
expect "a probe set of another shape" 400 --key "$T/admin" POST "$M" /v1/models "@$T/p2.json"

# ---- receipts
bal() { curl -s "$M/v1/nodes/$1/balance" | python3 -c 'import json,sys; b=json.load(sys.stdin); print(b["layer_tokens"], "%.9f" % b["credit"])'; }
ledger() { echo "$(bal "$A") $(bal "$B") $(bal "$C") $(bal "$D")"; }
rc() { # rc SESSION RANK T0 T1 DIGEST SIDE
    echo "{\"model\":\"$ID\",\"session\":\"$1\",\"rank\":$2,\"tokens\":[$3,$4],\"digest\":\"$5\",\"side\":\"$6\"}"
}
DG1=$(echo one | sha256sum | cut -d' ' -f1)
DG2=$(echo two | sha256sum | cut -d' ' -f1)
SESS=00112233445566778899aabbccddeeff
L0=$(python3 -c 'import json,sys; w=json.load(open(sys.argv[1]))["windows"][0]["layers"]; print(w[1]-w[0])' "$T/cov.json")
R0=$(curl -s "$M/v1/models/$ID/coverage" | python3 -c 'import json,sys; print(json.load(sys.stdin)["windows"][0]["reward"])')
expect "rank 0 signs what it sent" 200 --key "$T/a" POST "$M" /v1/receipts "$(rc $SESS 0 0 10 "$DG1" sent)"
expect "rank 1 countersigns what it received" 200 --key "$T/b" POST "$M" /v1/receipts "$(rc $SESS 0 0 10 "$DG1" received)"
echo "$LAST" | grep -q '"credited":true' || fail "an agreeing pair was not credited: $LAST"
want=$(python3 -c "print($L0 * 10, '%.9f' % ($L0 * 10 * $R0))")
[ "$(bal "$A")" = "$want" ] || fail "a's balance $(bal "$A"), expected $want (10 tokens x $L0 layers x reward $R0)"
before=$(ledger)
expect "double-submitted receipt" 409 --key "$T/a" POST "$M" /v1/receipts "$(rc $SESS 0 0 10 "$DG1" sent)"
expect "sent side once more, saved" 200 --key "$T/a" --save "$T/r.txt" POST "$M" /v1/receipts "$(rc $SESS 0 10 12 "$DG1" sent)"
expect "replayed receipt" 409 --replay "$T/r.txt" POST "$M" /v1/receipts "$(rc $SESS 0 10 12 "$DG1" sent)"
expect "forged receipt" 401 --key "$T/a" --sign-body "$(rc $SESS 0 0 99 "$DG1" sent)" POST "$M" /v1/receipts "$(rc $SESS 0 0 50 "$DG1" sent)"
expect "receipt signed for another node's rank" 403 --key "$T/c" POST "$M" /v1/receipts "$(rc $SESS 0 20 30 "$DG1" sent)"
expect "overlapping range, sent" 200 --key "$T/a" POST "$M" /v1/receipts "$(rc $SESS 0 5 15 "$DG1" sent)"
expect "overlapping range, received: never paid twice" 409 --key "$T/b" POST "$M" /v1/receipts "$(rc $SESS 0 5 15 "$DG1" received)"
expect "rank 1 sent" 200 --key "$T/b" POST "$M" /v1/receipts "$(rc $SESS 1 0 10 "$DG1" sent)"
expect "rank 2 received something else" 200 --key "$T/c" POST "$M" /v1/receipts "$(rc $SESS 1 0 10 "$DG2" received)"
echo "$LAST" | grep -q '"credited":false' || fail "disagreeing digests were credited: $LAST"
expect "receipt for a rank that does not exist" 404 --key "$T/a" POST "$M" /v1/receipts "$(rc $SESS 9 0 10 "$DG1" sent)"
expect "receipt with a bad token range" 400 --key "$T/a" POST "$M" /v1/receipts "$(rc $SESS 0 10 5 "$DG1" sent)"
expect "malformed receipt" 400 --key "$T/a" POST "$M" /v1/receipts '{"model":"'"$ID"'","session":"zz"}'
[ "$(ledger)" = "$before" ] || fail "hostile receipts changed the ledger: $before -> $(ledger)"
expect "the last rank's work, attested by rank 0" 200 --key "$T/c" POST "$M" /v1/receipts "$(rc $SESS 2 0 10 "$DG1" sent)"
expect "rank 0 attests the last rank" 200 --key "$T/a" POST "$M" /v1/receipts "$(rc $SESS 2 0 10 "$DG1" received)"
echo "$LAST" | grep -q '"credited":true' || fail "rank 0's attestation of the last rank was not credited: $LAST"
"$KVCTL" market balance "$M" "$C" | grep -q "layer_tokens [1-9]" || fail "kvctl market balance: $("$KVCTL" market balance "$M" "$C")"

# ---- durability: kill -9 during a burst of receipts
N=60
burst() { # submit sessions 1..N (both sides); the acknowledged ones go to acked.txt
    local s
    for s in $(seq 1 $N); do
        local sid
        sid=$(printf 'ee%030x' "$s")
        "$CALL" --key "$T/a" POST "$M" /v1/receipts "$(rc "$sid" 0 0 4 "$DG1" sent)" >/dev/null
        out=$("$CALL" --key "$T/b" POST "$M" /v1/receipts "$(rc "$sid" 0 0 4 "$DG1" received)")
        case "$out" in 200*credited\":true*) echo "$sid" >>"$T/acked.txt" ;; esac
    done
}
base=$(bal "$A" | cut -d' ' -f1)
: >"$T/acked.txt"
burst &
BURST=$!
wait_for 30 bash -c "[ \$(wc -l < '$T/acked.txt') -ge 15 ]" || fail "the burst did not get going"
kill -9 "$MARKET_PID"
wait "$BURST" 2>/dev/null
acked=$(wc -l <"$T/acked.txt")
start_market
now=$(bal "$A" | cut -d' ' -f1)
[ $((now - base)) -ge $((acked * 4 * L0)) ] ||
    fail "after kill -9: a has $((now - base)) layer-tokens from the burst, $acked acknowledged receipts are worth $((acked * 4 * L0))"
echo "ok   kill -9 after $acked acknowledged receipts: none lost ($((now - base)) layer-tokens)"
burst   # everything again: what was credited is refused, the rest is credited once
now=$(bal "$A" | cut -d' ' -f1)
[ $((now - base)) = $((N * 4 * L0)) ] ||
    fail "after resubmitting all $N sessions: $((now - base)) layer-tokens, expected exactly $((N * 4 * L0))"

# ---- the coverage page in headless Chromium
CHROME=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$CHROME" ]; then
    fail "chromium is not installed (scripts/setup.sh installs it)"
else
    LOGDIR=${KV_BUILD:-build}/test-logs
    mkdir -p "$LOGDIR"
    timeout 60 "$CHROME" --headless --no-sandbox --disable-gpu --virtual-time-budget=5000 \
        --user-data-dir="$T/chrome" --dump-dom "$M/" >"$T/dom.html" 2>"$T/chrome.err"
    grep -q 'data-loaded="1"' "$T/dom.html" && grep -q '<td>0-2</td>' "$T/dom.html" ||
        fail "the coverage page did not render the map: $(head -c 400 "$T/dom.html")"
    timeout 60 "$CHROME" --headless --no-sandbox --disable-gpu --virtual-time-budget=5000 \
        --user-data-dir="$T/chrome" --window-size=1000,500 --screenshot="$LOGDIR/market-coverage${KV_MARKET_DB:+-pg}.png" "$M/" \
        >/dev/null 2>>"$T/chrome.err"
    [ -s "$LOGDIR/market-coverage${KV_MARKET_DB:+-pg}.png" ] || fail "no screenshot of the coverage page"
    echo "ok   coverage page rendered; screenshot in $LOGDIR/market-coverage${KV_MARKET_DB:+-pg}.png"
fi
finish

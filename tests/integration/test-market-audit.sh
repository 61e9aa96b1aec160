#!/bin/bash
# test-market-audit.sh — audits of credited work (docs/market.md, "Audits"): a market started
# with --verify-model (the whole test model) and --audit-rate 1 audits every credited receipt
# after the fact. Three `kvd join` nodes form a ring; node x runs kvd-stub's `wrong-traffic`
# wrapper (tests/tools/stub_backend.c): honest on every known-answer probe, wrong in one ring session
# in KVD_WRONG_TRAFFIC_EVERY (3). Client sessions run one at a time, each left to settle (its
# receipts credited, their audits judged) before the next:
#  - node x passes its activation probe (a probe cannot see what it does to traffic);
#  - an audit catches it: its lease ends, its unpaid credit is voided, its claims are refused
#    with the reason (which it logs); the test prints within how many sessions;
#  - the honest nodes' audits pass, they keep their active leases and their credit.
# Node x claims first, so it holds rank 0 or 1 (caught at the third session in the runs so
# far); X_LAST=1 (test-market-audit-last.sh) puts it on the last rank, whose tokens are judged by
# the set the session's sampling draws from (the last edge's receipts commit to it): the
# sessions here are greedy, so at the first corrupted session, the third.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"
need_exec "$KVD_STUB"

EVERY=3
MAX_SESSIONS=24
MARKET_ARGS="--audit-rate 1 --audit-deadline-s 60 --verify-model $S"
market_up

join() { # join NAME BACKEND
    KVD_WRONG_TRAFFIC_EVERY=$EVERY "$KVD_STUB" join --market "$M" --model "$ID" \
        --state-dir "$T/$1" --mem 1800000 -t 1 --jitter-ms 300 --backend "$2" \
        >"$T/join-$1.log" 2>&1 &
    PIDS="$PIDS $!"
}
# x joins first and claims before a and b, so it takes one of the larger windows, which go
# first: rank 0 or 1, where any wrong row is seen. X_LAST=1: x joins once a and b claimed, so
# it takes the window left, the last rank's, where its wrong logits sample a wrong token.
if [ "${X_LAST:-0}" = 1 ]; then
    join a cpu
    join b cpu
    wait_for 30 grep -q "claimed window" "$T/join-a.log" && wait_for 30 grep -q "claimed window" "$T/join-b.log"
    join x wrong-traffic
else
    join x wrong-traffic
    wait_for 30 grep -q "claimed window" "$T/join-x.log" || fail "node x claimed no window: $(tail -3 "$T/join-x.log")"
    join a cpu
    join b cpu
fi
KA=$(key_of a); KB=$(key_of b); KX=$(key_of x)
short() { echo "${1:0:16}"; }

wait_for 60 ring_ready || fail "no complete ring: $(cat "$T/cov.json")"
grep -q "(activation) of window [0-9]* by node $(short "$KX")\.\.\.: pass" "$T/market.log" ||
    fail "node x (honest on probes) did not pass its activation probe"
R0=$(rank0 a b x)
[ -n "$R0" ] || fail "no node runs rank 0"
echo "ok   a ring of three joined nodes; node x (wrong on one ring session in $EVERY) is rank $(rank_of x) and passed its probe"

caught() { grep -q "node $(short "$KX")\.\.\.: window [0-9]*: audit probe failed" "$T/market.log"; }
# every audit drawn so far was judged, and count audits were drawn
drawn() { grep -c "audit [0-9a-f]* of node [0-9a-f]*\.\.\.: rank [0-9]*, session" "$T/market.log"; }
judged() { grep -c "audit [0-9a-f]* of node [0-9a-f]*\.\.\. (rank [0-9]*, session [0-9a-f]*, position [0-9]*): " "$T/market.log"; }
settled_or_caught() { caught || { [ "$(drawn)" -ge "$1" ] && [ "$(drawn)" = "$(judged)" ]; }; }

n=0
while [ $n -lt $MAX_SESSIONS ] && ! caught; do
    n=$((n + 1))
    "$KVCTL" generate --ring "unix:$T/$R0/kvd.sock" --client-key "$CKEY" --tokens "1,$((40 + n)),100,$((200 + n))" -n 8 \
        --temp 0 --ids >/dev/null 2>"$T/gen.err" || { caught && break; fail "session $n failed: $(cat "$T/gen.err")"; break; }
    # its three receipts credited and audited (one audit per rank: none is pending now)
    wait_for 40 settled_or_caught $((3 * n)) ||
        { fail "the audits of session $n did not settle: drawn $(drawn), judged $(judged)"; break; }
done
caught || fail "node x was not caught within $MAX_SESSIONS sessions"
# every row of a corrupted session is wrong, and on the last rank every token (greedy), so the
# audit of its first one catches it, wherever its position
[ $n -le $EVERY ] || fail "node x was caught only at session $n, not at its first corrupted one ($EVERY)"
WRONG=$(grep -o "runs wrong (ring session [0-9]*)" "$T/join-x.log" | grep -o "[0-9]*" | tr '\n' ' ')
echo "ok   node x caught by an audit within $n sessions (it ran ring sessions ${WRONG}wrong; audit rate 1)"
grep "audit [0-9a-f]* of node $(short "$KX")\.\.\..*: fail" "$T/market.log" | head -1 | sed 's/^/     /'

# ---- what being caught costs: lease, credit, claims
XW=$(grep -o "node $(short "$KX")\.\.\.: window [0-9]*: audit" "$T/market.log" | head -1 | grep -o "window [0-9]*" | cut -d' ' -f2)
grep "node $(short "$KX")\.\.\.: window $XW: audit probe failed" "$T/market.log" | head -1 |
    grep -q "lease ended.*unpaid credit voided" || fail "the market's log does not say node x's lease ended and its credit was voided"
x_gone() {
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 - "$T/cov.json" "$XW" "$KX" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
w = [w for w in c["windows"] if w["window"] == int(sys.argv[2])][0]
sys.exit(0 if w["state"] == "uncovered" and not any(s["node"] == sys.argv[3] for s in w["stages"]) else 1)
PY
}
wait_for 10 x_gone || fail "node x's window $XW is not uncovered: $(cat "$T/cov.json")"
"$KVCTL" market balance "$M" "$KX" --json >"$T/bal-x.json" || fail "balance of x"
python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); sys.exit(0 if b["layer_tokens"]==0 and b["credit"]==0 else 1)' \
    "$T/bal-x.json" || fail "node x's balance after the audit is not zero: $(cat "$T/bal-x.json")"
wait_for 20 grep -q "claims are refused for [0-9]* s more: window $XW: audit probe failed" "$T/join-x.log" ||
    fail "node x's claims are not refused with the reason"
echo "ok   node x: lease ended, window $XW uncovered, credit voided, claims refused with the reason"

# ---- the honest nodes: audits passed, leases kept, credit kept
for k in "$KA" "$KB"; do
    grep -q "audit [0-9a-f]* of node $(short "$k")\.\.\. (rank [0-9]*, session [0-9a-f]*, position [0-9]*): pass" "$T/market.log" ||
        fail "no audit of honest node $(short "$k") passed"
    grep -q "audit [0-9a-f]* of node $(short "$k")\.\.\..*: \(fail\|inconclusive\)" "$T/market.log" &&
        fail "an audit of honest node $(short "$k") did not pass: $(grep "of node $(short "$k").*: fail" "$T/market.log")"
    grep -q "node $(short "$k")\.\.\.: .*voided" "$T/market.log" && fail "honest node $(short "$k") lost its credit"
done
honest_kept() {
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 - "$T/cov.json" "$KA" "$KB" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
st = {s["node"]: s["state"] for w in c["windows"] for s in w["stages"]}
sys.exit(0 if all(st.get(k) == "active" for k in sys.argv[2:]) else 1)
PY
}
honest_kept || fail "the honest nodes do not both hold active leases: $(cat "$T/cov.json")"
for n in a b; do
    "$KVCTL" market balance "$M" "$(key_of $n)" --json >"$T/bal-$n.json" || fail "balance of $n"
    python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); sys.exit(0 if b["layer_tokens"]>0 and b["credit"]>0 else 1)' \
        "$T/bal-$n.json" || fail "honest node $n has no credit: $(cat "$T/bal-$n.json")"
done
# the map shows each stage's audits: the honest ones' counts, all passed, and their last
"$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" || fail "market status"
python3 - "$T/cov.json" "$KA" "$KB" <<'PY' || fail "the map does not show the honest nodes' audits passed: $(cat "$T/cov.json")"
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
st = {s["node"]: s for w in c["windows"] for s in w["stages"]}
for k in sys.argv[2:]:
    a = st[k]["audits"]
    assert a["counts"].get("pass", 0) >= 1 and not a["counts"].get("fail"), a
    assert a["last"]["result"] == "pass", a
PY
"$KVCTL" market status "$M" --model "$ID" >"$T/status.txt" || fail "market status"
grep -q "audits [0-9]* pass.*; last pass [0-9]* s ago" "$T/status.txt" ||
    fail "kvctl market status shows no audits line: $(cat "$T/status.txt")"
PASSED=$(grep -c "audit [0-9a-f]* of node \($(short "$KA")\|$(short "$KB")\)\.\.\. (.*): pass" "$T/market.log")
echo "ok   the honest nodes' $PASSED audits passed; they keep their active leases and their credit; the map shows their audits"
grep "audits " "$T/status.txt" | head -1 | sed 's/^ */     /'
finish

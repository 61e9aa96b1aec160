#!/bin/bash
# test-market-spot.sh — known-answer probes and spot checks (docs/market.md, "Probes"), with
# kvd-stub's wrappers of the model that return wrong boundaries (tests/tools/stub_backend.c):
#  (a) honest nodes' leases become active only after their probe passed: each node logs the
#      market's verdict before its lease is active, the market logs every probe's result and
#      the coverage map shows it on each stage; honest stages pass their spot checks too, also
#      at other SIMD levels (scalar, AVX2) than kvctl market add computed the probes at;
#  (c) a node that turns wrong once active is caught by a spot check (every 1.5..4.5 s here):
#      node l first serves honestly and is credited, then restarts (same key) with
#      `--backend wrong-late`, takes its window back after passing a new activation probe, and
#      is caught: its lease ends, its window is reported uncovered, the credit it earned is
#      voided (its balance is zero and stays so), its claims are refused;
#      a serving node's spot checks run on the window its stage has loaded (the stage's
#      status counts them), its activation probe on the window opened for it;
#  (b) a node whose stage is wrong from the start (`--backend wrong`) takes the freed window,
#      fails its activation probe, never gets an active lease, and its claims are refused with
#      the reason, which it logs.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"
need_exec "$KVD_STUB"

MARKET_ARGS="--spot-check-s 3 --penalty-s 600"
market_up

declare -A JPID
join() { # join NAME BACKEND
    "$KVD_STUB" join --market "$M" --model "$ID" --state-dir "$T/$1" --mem 1800000 -t 1 \
        --jitter-ms 300 --backend "$2" >"$T/join-$1.log" 2>&1 &
    JPID[$1]=$!
    PIDS="$PIDS $!"
}
# the honest nodes compute at other SIMD levels than kvctl did (KV_KERN_SIMD caps a process's):
# the tolerance must hold across them
KV_KERN_SIMD=scalar join a cpu
KV_KERN_SIMD=avx2 join b cpu
join l cpu
KA=$(key_of a); KB=$(key_of b); KL=$(key_of l)
short() { echo "${1:0:16}"; }

# ---- (a) activation after a passed probe
active_ab() { # both honest nodes hold active leases whose last probe passed
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 - "$T/cov.json" "$KA" "$KB" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
st = {s["node"]: s for w in c["windows"] for s in w["stages"]}
ok = all(k in st and st[k]["state"] == "active" and st[k].get("probe", {}).get("result") == "pass"
         for k in sys.argv[2:])
sys.exit(0 if ok else 1)
PY
}
wait_for 60 active_ab || fail "nodes a and b did not both get active leases with a passed probe: $(cat "$T/cov.json")"
for n in a b; do
    log=$T/join-$n.log
    # the market marks the lease active as it answers the probe; the node logs it a heartbeat later
    wait_for 20 grep -q "lease on window .* active" "$log" || fail "node $n never logged its lease active"
    p=$(grep -n "(activation) of window .*found it right" "$log" | head -1 | cut -d: -f1)
    act=$(grep -n "lease on window .* active" "$log" | head -1 | cut -d: -f1)
    [ -n "$p" ] && [ -n "$act" ] && [ "$p" -lt "$act" ] ||
        fail "node $n: no passed activation probe logged before its lease became active"
done
for k in "$KA" "$KB"; do
    grep -q "(activation) of window [0-9]* by node $(short "$k")\.\.\.: pass (NMSE" "$T/market.log" ||
        fail "the market's log shows no passed activation probe of node $(short "$k")"
done
echo "ok   honest nodes activate only after their known-answer probe passed (market log, coverage map)"

# ---- (c) a node that turns wrong after activation is caught by a spot check
caught() { grep -q "node $(short "$KL")\.\.\.: window [0-9]*: spot probe failed" "$T/market.log"; }
wait_for 30 ring_ready || fail "no complete ring: $(cat "$T/cov.json")"
R0=$(rank0 a b l)
[ -n "$R0" ] || fail "no node runs rank 0"
"$KVCTL" generate --ring "unix:$T/$R0/kvd.sock" --client-key "$CKEY" --tokens 1,50,100,200 -n 8 --temp 0 --ids \
    >/dev/null 2>"$T/gen.err" || fail "generation failed: $(cat "$T/gen.err")"
wait_for 30 credited a b l || fail "balances do not match the stages' work: $(cat "$T/credited.txt")"
LT=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["layer_tokens"])' "$T/bal-l.json")
# a serving node's spot checks run on the window its stage has loaded, between its steps (no
# second copy of the window): the node logs it, the stage counts it
stage_probed() { # NAME: a spot check logged as run by the stage, and the stage's count of them
    grep -q "(spot) of window [0-9]*: the market found it right (.*, run by the serving stage)" "$T/join-$1.log" &&
    python3 - "$ROOT/tests/lib" "$T/$1/kvd.sock" >"$T/st-$1.json" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import kvd_ctl
p = kvd_ctl.status(sys.argv[2])["probes"]
print(json.dumps(p))
sys.exit(0 if p["run"] >= 1 and p["failed"] == 0 else 1)
PY
}
wait_for 30 stage_probed a || fail "node a's spot checks did not run on its serving stage: $(grep -h '(spot)' "$T/join-a.log" | tail -2) $(cat "$T/st-a.json" 2>/dev/null)"
grep -q "(activation) of window [0-9]*: the market found it right (.*, window opened for it)" "$T/join-a.log" ||
    fail "node a's activation probe (no stage yet) did not run on the window opened for it"
echo "ok   spot checks of a serving node run on its stage's loaded window (its stage's probes: $(cat "$T/st-a.json"))"
# node l stops and comes back with the same key (within its grace period), now wrong once active
kill -TERM "${JPID[l]}"
wait "${JPID[l]}" 2>/dev/null
mv "$T/join-l.log" "$T/join-l-honest.log"
join l wrong-late
wait_for 30 grep -q "(activation) of window .*found it right" "$T/join-l.log" ||
    fail "node l (wrong only once active) did not pass its new activation probe"
wait_for 30 caught || fail "no spot check caught node l within 30 s"
LW=$(grep -o "node $(short "$KL")\.\.\.: window [0-9]*: spot" "$T/market.log" | head -1 | grep -o "window [0-9]*" | cut -d' ' -f2)
grep "node $(short "$KL")\.\.\.: window" "$T/market.log" | head -1 |
    grep -q "unpaid credit voided ($LT layer-tokens" ||
    fail "the market's log does not say node l's unpaid credit ($LT layer-tokens) was voided"
l_uncovered() {
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 - "$T/cov.json" "$LW" "$KL" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
w = [w for w in c["windows"] if w["window"] == int(sys.argv[2])][0]
sys.exit(0 if w["state"] == "uncovered" and not any(s["node"] == sys.argv[3] for s in w["stages"])
         and not c["rings"] else 1)
PY
}
l_uncovered || wait_for 5 l_uncovered || fail "node l's window $LW is not reported uncovered after the spot check: $(cat "$T/cov.json")"
wait_for 20 grep -q "spot) of window .*found it wrong" "$T/join-l.log" ||
    fail "node l does not log that its spot check failed"
wait_for 20 grep -q "claims are refused for [0-9]* s more: window $LW: spot probe failed" "$T/join-l.log" ||
    fail "node l's claims are not refused with the reason"
"$KVCTL" market balance "$M" "$KL" --json >"$T/bal-l.json" || fail "balance of l"
python3 -c 'import json,sys; b=json.load(open(sys.argv[1])); sys.exit(0 if b["layer_tokens"]==0 and b["credit"]==0 else 1)' \
    "$T/bal-l.json" || fail "node l's balance after the spot check is not zero: $(cat "$T/bal-l.json")"
echo "ok   a node wrong after activation is caught by a spot check: lease ended, window $LW uncovered,"
echo "     its credit voided ($(grep -o "unpaid credit voided ([^)]*)" "$T/market.log" | head -1)), claims refused"

# ---- (b) a node wrong from the start never gets an active lease
join x wrong
KX=$(key_of x)
wait_for 40 grep -q "node $(short "$KX")\.\.\.: window [0-9]*: activation probe failed" "$T/market.log" ||
    fail "the market did not log a failed activation probe of node x"
wait_for 20 grep -q "claims are refused for [0-9]* s more: window [0-9]*: activation probe failed" "$T/join-x.log" ||
    fail "node x's claims are not refused with the reason"
grep -q "lease on window .* active" "$T/join-x.log" && fail "node x logged an active lease"
"$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" || fail "status"
python3 - "$T/cov.json" "$KX" <<'PY' || fail "node x holds a window: $(cat "$T/cov.json")"
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
sys.exit(1 if any(s["node"] == sys.argv[2] for w in c["windows"] for s in w["stages"]) else 0)
PY
echo "ok   a node wrong from the start never gets an active lease; its claims are refused with the reason"

# honest stages pass their spot checks (no false alarms at the f16 wire's tolerance)
grep -q "(spot) of window [0-9]* by node \($(short "$KA")\|$(short "$KB")\)\.\.\.: pass" "$T/market.log" ||
    wait_for 10 grep -q "(spot) of window [0-9]* by node \($(short "$KA")\|$(short "$KB")\)\.\.\.: pass" "$T/market.log" ||
    fail "no spot check of an honest node passed"
grep -q "node \($(short "$KA")\|$(short "$KB")\)\.\.\.: window" "$T/market.log" &&
    fail "an honest node failed a probe: $(grep "probe failed" "$T/market.log")"
echo "ok   honest nodes pass their spot checks"
finish

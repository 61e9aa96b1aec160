#!/bin/bash
# test-market-standby-last.sh — a market ring survives the death of its last rank's node, whose
# stage samples every token (docs/market.md, "Standbys"):
#  * three `kvd join` nodes form a ring; a fourth, whose memory fits the last window and not
#    the middle one, stands by for the last window (named in the roster, the window pulled
#    ahead);
#  * 8 concurrent streamed sessions through the ring's API (the npm openai client, greedy and
#    seeded with every sampling parameter given); the last rank's node is killed with -9 once
#    every session has streamed a few chunks; every text equals its one-process text and no
#    client sees an error: the standby took the rank over and rank 0 replayed the sessions,
#    the seeded ones continuing their draws;
#  * the map shows the standby holding the last window, taken over from the killed node, which,
#    started again, stands by;
#  * every session of the generation is paid in full, nothing held back: the standby's sent
#    side and rank 0's received side of the last edge agree although the killed node sampled
#    the tokens before the break (both ends clear those TOKEN leaves at the replay), and the
#    last rank's share of each session the kill broke goes to the standby;
#  * the market audits every node's credited work (--audit-rate 1): the standby answers from
#    its row log, where the replay's cleared leaves are recorded, and its openings match the
#    root it signed; no audit fails.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"
command -v node >/dev/null || die "node missing (scripts/setup.sh installs nodejs)"
[ -f tests/node_modules/openai/package.json ] ||
    die "node package openai missing in tests/node_modules (scripts/setup.sh installs it from the npm registry)"

# every credited receipt audited (one at a time per node), recomputed with the whole model
MARKET_ARGS="--lease-s 12 --audit-rate 1 --audit-deadline-s 60 --verify-model $S"
market_up
declare -A JPID
join() { # join NAME MEM: a node that serves the API should it be rank 0
    "$LISTEN" "$T/$1.api" 0 -- "$KVD" join --market "$M" --model "$ID" --state-dir "$T/$1" --mem "$2" -t 1 \
        --jitter-ms 300 --listen 127.0.0.1:0 --api "127.0.0.1:{PORT}" \
        >>"$T/join-$1.log" 2>&1 &
    JPID[$1]=$!
    PIDS="$PIDS $!"
}
for n in a b c; do join $n 1800000; done
wait_for 60 ring_ready || fail "no complete ring within 60 s: $(cat "$T/cov.json")"
SHA=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["models"][0]["rings"][0]["manifest_sha256"])' "$T/cov.json")
LAST=""
for n in a b c; do [ "$(rank_of $n)" = 2 ] && LAST=$n; done
[ -n "$LAST" ] || fail "no node runs rank 2"
# the standby's memory: the last window's, below the middle one's (so it stands by for the last)
MEM=$(python3 -c '
import json,sys
w = json.load(open(sys.argv[1]))["models"][0]["windows"]
m1, m2 = w[1]["mem_bytes"], w[2]["mem_bytes"]
print(m2 if m2 < m1 else "")' "$T/cov.json")
[ -n "$MEM" ] || fail "the last window is not smaller than the middle one: $(cat "$T/cov.json")"
join d "$MEM"
standing_by() {
    grep -qs "standby stage for rank 2 (window 2) started" "$T/join-d.log" || return 1
    for n in a b c; do grep -qs "roster: 1 standby(s) for this ring" "$T/join-$n.log" || return 1; done
}
wait_for 30 standing_by || fail "node d does not stand by for the last window: $(grep -h 'standby\|roster' "$T"/join-*.log | tail -8)"
echo "ok   node d stands by for the last window (node $LAST serves it), named in every stage's roster"

api_named() {
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    API=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["models"][0]["rings"][0]["api"][0])' "$T/cov.json" 2>/dev/null)
}
wait_for 20 api_named || fail "the map names no API for the ring: $(cat "$T/cov.json")"
client_listed() { curl -s "$M/v1/clients" | grep -q "$(printf %s "$CKEY" | sha256sum | cut -c1-64)"; }
wait_for 10 client_listed || fail "GET /v1/clients does not list the paying client"
key_ok() { [ "$(node tests/lib/api_openai_client.mjs --key "$API/v1" "$CKEY")" = "ok 2" ]; }
wait_for 20 key_ok || fail "the ring's API at $API does not serve the paying client"

python3 - "$T/spec.json" <<'PY'
import json, sys
prompts = ["Once upon a time", "The little dog", "One day, a girl named Lily", "Tom had a red ball",
           "The sun was hot", "Sam and his mom went", "There was a big tree", "A bird sat on"]
spec = []
for i, p in enumerate(prompts):
    s = {"prompt": p, "max_tokens": 300 + 10 * i}
    if i % 2:
        s.update(temperature=0.8, seed=200 + i, top_k=40, top_p=0.95, min_p=0.05)
    else:
        s.update(temperature=0, seed=0, top_k=0, top_p=1, min_p=0)
    spec.append(s)
json.dump(spec, open(sys.argv[1], "w"))
PY
python3 - "$KVCTL" "$S" "$T" <<'PY' || fail "kvctl generate -m failed: $(cat "$T"/ref.err.* | tail -3)"
import json, subprocess, sys
kvctl, model, T = sys.argv[1:4]
for i, s in enumerate(json.load(open(T + "/spec.json"))):
    args = [kvctl, "generate", "-m", model, "-p", s["prompt"], "-n", str(s["max_tokens"]),
            "--temp", str(s["temperature"]), "--seed", str(s["seed"]), "--top-k", str(s["top_k"]),
            "--top-p", str(s["top_p"]), "--min-p", str(s["min_p"]), "--ignore-eos"]
    with open("%s/ref.%d" % (T, i), "w") as out, open("%s/ref.err.%d" % (T, i), "w") as err:
        if subprocess.call(args, stdout=out, stderr=err):
            sys.exit(1)
PY
mkdir -p "$T/out"
R0=$(rank0 a b c)
node tests/lib/api_sessions.mjs "$API/v1" "$CKEY" "$T/spec.json" "$T/out" "${JPID[$LAST]}" "$T/$R0/kvd.sock" \
    >"$T/sessions.json" 2>"$T/sessions.err" ||
    fail "the sessions' client failed: $(cat "$T/sessions.err")"
python3 - "$T/sessions.json" "$T/out" "$T" <<'PY' || fail "the sessions through the repair: $(cat "$T/sessions.json")"
import json, os, sys
r = json.load(open(sys.argv[1]))
out, T = sys.argv[2], sys.argv[3]
ok = r["killed"] and r["failed"] == 0
for i in range(8):
    if os.path.exists("%s/%d.err" % (out, i)):
        ok = False
        print("session %d: client error: %s" % (i, open("%s/%d.err" % (out, i)).read()))
        continue
    got = open("%s/%d.txt" % (out, i), encoding="utf-8").read()
    want = open("%s/ref.%d" % (T, i), encoding="utf-8").read()
    want = want[:-1] if want.endswith("\n") else want
    if got != want:
        ok = False
        print("session %d differs from its one-process text:\n  got  %r\n  want %r" % (i, got[:200], want[:200]))
sys.exit(0 if ok else 1)
PY
RUNNING=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["running_at_kill"])' "$T/sessions.json")
[ "$RUNNING" -ge 1 ] || fail "no session was running when node $LAST was killed (the test's timing): $(cat "$T/sessions.json")"
python3 - "$ROOT/tests/lib" "$T/$R0/kvd.sock" <<'PY' || fail "rank 0 did not resume the sessions the kill broke"
import sys
sys.path.insert(0, sys.argv[1])
import kvd_ctl
rep = kvd_ctl.status(sys.argv[2])["repair"]
print("       rank 0's repair: %s" % rep)
sys.exit(0 if rep["resumed_sessions"] >= 1 and rep["not_repaired"] == 0 else 1)
PY
echo "ok   8 sessions through the API, the last rank's node killed with -9 while $RUNNING ran: every text equals its one-process text, no client error"

took() {
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 - "$T/cov.json" "$(key_of d)" "$(key_of "$LAST")" "$SHA" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
w = c["windows"][2]
st = w["stages"][0] if w["stages"] else {}
sys.exit(0 if w["state"] == "active" and st.get("node") == sys.argv[2] and
         st.get("took_over", {}).get("from") == sys.argv[3] and len(c["rings"]) == 1 and
         c["rings"][0]["manifest_sha256"] == sys.argv[4] else 1)
PY
}
wait_for 30 took || fail "the map does not show node d holding the last window on the same manifest: $(cat "$T/cov.json")"
echo "ok   node d holds the last window (taken over from node $LAST), the ring runs on the same manifest"
# the killed node, started again on its state directory, sends the receipts it had not sent
# before the kill (sessions that ended before it) and stands by
join "$LAST" 1800000
wait_for 30 grep -q "standby stage for rank [12] (window [12]) started" "$T/join-$LAST.log" ||
    fail "node $LAST, started again, does not stand by: $(grep -v pull: "$T/join-$LAST.log" | tail -5)"
echo "ok   node $LAST, started again, stands by"

# ---- credit: every session paid in full, the last rank's share to the node that ran it to its end
settled() {
    python3 - "$T/market.db" "$SHA" >"$T/settled.txt" 2>&1 <<'PY'
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
n = 0
for (v,) in db.execute("select v from blobs where k like 'sess/%'"):
    s = json.loads(v)
    if s.get("manifest") != sys.argv[2] or "client" not in s:
        continue
    n += 1
    if s["held"] or sorted(s["paid"]) != ["0", "1", "2"]:
        print("session %s not settled in full: paid %s held %s" % (s["session"], s["paid"], s["held"]))
        sys.exit(1)
print("%d sessions paid in full" % n)
sys.exit(0 if n >= 9 else 1)
PY
}
wait_for 60 settled || fail "the sessions are not all paid in full: $(cat "$T/settled.txt")"
for n in d "$LAST"; do
    "$KVCTL" market balance "$M" "$(key_of $n)" --json >"$T/bal-$n.json" 2>/dev/null || fail "kvctl market balance $n"
done
python3 - "$T/market.db" "$SHA" "$(key_of d)" "$(key_of "$LAST")" "$T/bal-d.json" "$T/bal-$LAST.json" <<'PY' ||
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
want = {sys.argv[3]: 0, sys.argv[4]: 0}
for (v,) in db.execute("select v from blobs where k like 'sess/%'"):
    s = json.loads(v)
    if s.get("manifest") == sys.argv[2] and "client" in s:
        own = s["sides"]["s2"]
        want[own["node"]] += own["t1"] - own["t0"]   # window 2: layers [4, 5)
got = {json.load(open(f))["node"]: json.load(open(f))["layer_tokens"] for f in sys.argv[5:7]}
print("       the last rank's layer-tokens: standby %d (want %d), the killed node %d (want %d)" %
      (got[sys.argv[3]], want[sys.argv[3]], got[sys.argv[4]], want[sys.argv[4]]))
sys.exit(0 if got == want and want[sys.argv[3]] > 0 else 1)
PY
    fail "the last rank's credit is not the standby's and the killed node's own work"
echo "ok   every session paid in full; the last rank's share to whichever node ran each session to its end"
short() { echo "${1:0:16}"; }
KD=$(key_of d)
# its openings are checked against the root it signed either way: a pass, or, where the audited
# position lies in a replayed history longer than an answer holds (the kill came late), an
# inconclusive run of proven empty leaves
wait_for 60 grep -q "audit [0-9a-f]* of node $(short "$KD")\.\.\. (rank 2, session [0-9a-f]*, position [0-9]*): \(pass\|inconclusive\)" "$T/market.log" ||
    fail "no audit of the standby's work as the last rank was judged: $(grep "audit.*$(short "$KD")" "$T/market.log" | tail -3)"
grep -q "audit [0-9a-f]* of node .*: fail" "$T/market.log" &&
    fail "an audit failed: $(grep "audit [0-9a-f]* of node .*: fail" "$T/market.log")"
echo "ok   no audit fails, the standby's as the last rank among them ($(grep -c "audit [0-9a-f]* of node .*: pass" "$T/market.log") passed, $(grep -c "audit [0-9a-f]* of node .*: inconclusive" "$T/market.log") inconclusive)"
finish

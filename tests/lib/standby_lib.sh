# Shared by the market's standby tests (test-market-standby.sh, test-market-standby-last.sh), on
# top of tests/lib/lib.sh and tests/lib/market_lib.sh: `kvd join` nodes that serve the API as
# rank 0, 8 streamed sessions through the ring's API with a node killed during them, and the
# settlement checks after the repair.
command -v node >/dev/null || die "node missing (scripts/setup.sh installs nodejs)"
[ -f tests/node_modules/openai/package.json ] ||
    die "node package openai missing in tests/node_modules (scripts/setup.sh installs it from the npm registry)"

declare -A JPID
# join_api NAME [MEM]: a node that serves the API should it be rank 0, on ports it binds; its
# pid in JPID[NAME], its log appended to $T/join-NAME.log (a node started again keeps one log)
join_api() {
    "$LISTEN" "$T/$1.api" 0 -- "$KVD" join --market "$M" --model "$ID" --state-dir "$T/$1" \
        --mem "${2:-1800000}" -t 1 --jitter-ms 300 --listen 127.0.0.1:0 --api "127.0.0.1:{PORT}" \
        >>"$T/join-$1.log" 2>&1 &
    JPID[$1]=$!
    PIDS="$PIDS $!"
}
# sha_of: the manifest of the ring in $T/cov.json
sha_of() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["models"][0]["rings"][0]["manifest_sha256"])' "$T/cov.json"; }

# ring_of_three RANK: the market up ($MARKET_ARGS), nodes a, b and c joined into a complete ring;
# sets SHA (its manifest) and VICTIM (the node that serves RANK)
ring_of_three() {
    market_up
    local n
    for n in a b c; do join_api $n; done
    wait_for 60 ring_ready || fail "no complete ring within 60 s: $(cat "$T/cov.json")"
    SHA=$(sha_of)
    VICTIM=""
    for n in a b c; do [ "$(rank_of $n)" = "$1" ] && VICTIM=$n; done
    [ -n "$VICTIM" ] || fail "no node runs rank $1"
}

# took_over WINDOW TAKER FROM: the map shows window WINDOW active and held by node TAKER, taken
# over from node FROM, the ring still on manifest $SHA (in $T/cov.json)
took_over() {
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 - "$T/cov.json" "$1" "$(key_of "$2")" "$(key_of "$3")" "$SHA" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
w = c["windows"][int(sys.argv[2])]
st = w["stages"][0] if w["stages"] else {}
sys.exit(0 if w["state"] == "active" and st.get("node") == sys.argv[3] and
         st.get("took_over", {}).get("from") == sys.argv[4] and len(c["rings"]) == 1 and
         c["rings"][0]["manifest_sha256"] == sys.argv[5] else 1)
PY
}

# api_up: waits until the map names rank 0's API (in API) and it serves the paying client
api_up() {
    api_named() {
        "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
        API=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["models"][0]["rings"][0]["api"][0])' "$T/cov.json" 2>/dev/null)
    }
    wait_for 20 api_named || fail "the map names no API for the ring: $(cat "$T/cov.json")"
    client_listed() { curl -s "$M/v1/clients" | grep -q "$(printf %s "$CKEY" | sha256sum | cut -c1-64)"; }
    wait_for 10 client_listed || fail "GET /v1/clients does not list the paying client"
    key_ok() { [ "$(node tests/lib/api_openai_client.mjs --key "$API/v1" "$CKEY")" = "ok 2" ]; }
    wait_for 20 key_ok || fail "the ring's API at $API does not serve the paying client"
}

# sessions_killing NAME R0 SEED: 8 concurrent streamed sessions through $API (greedy, and seeded
# from SEED with every sampling parameter given), node NAME killed with -9 once each has
# streamed a few chunks (R0: the node of rank 0, whose control socket says when); every text
# must equal its one-process text (`kvctl generate -m`) with no client error, and rank 0 must
# have resumed the sessions the kill broke. Sets RUNNING: the sessions running at the kill.
sessions_killing() {
    local victim=$1 r0=$2
    python3 - "$T/spec.json" "$3" <<'PY'
import json, sys
prompts = ["Once upon a time", "The little dog", "One day, a girl named Lily", "Tom had a red ball",
           "The sun was hot", "Sam and his mom went", "There was a big tree", "A bird sat on"]
spec = []
for i, p in enumerate(prompts):
    s = {"prompt": p, "max_tokens": 300 + 10 * i}
    if i % 2:   # seeded: every sampling parameter given, so both sides use the same
        s.update(temperature=0.8, seed=int(sys.argv[2]) + i, top_k=40, top_p=0.95, min_p=0.05)
    else:       # greedy
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
    node tests/lib/api_sessions.mjs "$API/v1" "$CKEY" "$T/spec.json" "$T/out" "${JPID[$victim]}" "$T/$r0/kvd.sock" \
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
    [ "$RUNNING" -ge 1 ] || fail "no session was running when node $victim was killed (the test's timing): $(cat "$T/sessions.json")"
    python3 - "$ROOT/tests/lib" "$T/$r0/kvd.sock" "$RUNNING" <<'PY' || fail "rank 0 did not resume the sessions the kill broke"
import sys
sys.path.insert(0, sys.argv[1])
import kvd_ctl
rep = kvd_ctl.status(sys.argv[2])["repair"]
print("       rank 0's repair: %s" % rep)
sys.exit(0 if rep["resumed_sessions"] >= 1 and rep["not_repaired"] == 0 else 1)
PY
}

# settled_in_full SHA: every client session of ring generation SHA is paid to all 3 ranks, none
# held back (at least 9: the 8 sessions and api_up's)
settled_in_full() {
    python3 - "$T/market.db" "$1" >"$T/settled.txt" 2>&1 <<'PY'
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

# rank_credit SHA RANK LAYERS TAKER KILLED: the layer-tokens of rank RANK (LAYERS layers) in ring
# generation SHA went to the node that signed each session's sent side there: the balances of
# the nodes TAKER (the standby) and KILLED are exactly their own sides' positions x LAYERS, and
# the standby earned some
rank_credit() {
    local sha=$1 rank=$2 layers=$3 n
    for n in "$4" "$5"; do
        "$KVCTL" market balance "$M" "$(key_of "$n")" --json >"$T/bal-$n.json" 2>/dev/null || fail "kvctl market balance $n"
    done
    python3 - "$T/market.db" "$sha" "$rank" "$layers" "$(key_of "$4")" "$(key_of "$5")" "$T/bal-$4.json" "$T/bal-$5.json" <<'PY' ||
import json, sqlite3, sys
db = sqlite3.connect(sys.argv[1])
rank, layers = sys.argv[3], int(sys.argv[4])
want = {sys.argv[5]: 0, sys.argv[6]: 0}
for (v,) in db.execute("select v from blobs where k like 'sess/%'"):
    s = json.loads(v)
    if s.get("manifest") == sys.argv[2] and "client" in s:
        own = s["sides"]["s" + rank]
        want[own["node"]] += (own["t1"] - own["t0"]) * layers
got = {json.load(open(f))["node"]: json.load(open(f))["layer_tokens"] for f in sys.argv[7:9]}
print("       rank %s's layer-tokens: standby %d (want %d), the killed node %d (want %d)" %
      (rank, got[sys.argv[5]], want[sys.argv[5]], got[sys.argv[6]], want[sys.argv[6]]))
sys.exit(0 if got == want and want[sys.argv[5]] > 0 else 1)
PY
        fail "rank $rank's credit is not the standby's and the killed node's own work"
}

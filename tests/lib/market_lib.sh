# Shared by the market's ring tests (test-market-ring.sh, test-market-nat.sh), on top of
# tests/lib/lib.sh: reading the coverage map, the nodes' keys and ranks, and the receipts' check
# that each node was credited what its stage computed. M is the market's URL, ID the model's.
# ring_ready: the coverage map (in $T/cov.json) has one ring and every window active.
# MKT_NS: a command prefix that reaches the market (ip netns exec NS), empty on loopback.
MKT_NS=${MKT_NS:-}
S=$DATA/models/stories260K.gguf   # the test model: a trained llama, 5 layers

# The scripts' common start: the model and the binaries there, sanitizer reports checked, the
# first failure stops the script after showing every log's tail (the scratch dir is kept).
need_data "$S"
need_exec "$KVD" "$KVCTL"
KEEP_FAILED_TMP=1
san_log_check
show_logs() { for f in "$T"/*.log; do echo "--- $f"; tail -n 15 "$f"; done; }
on_fatal() { show_logs; }
fail_fast

# market_up: the model's catalog, a seeder and a market (lease 6 s, grace 3 s, an operator key,
# and $MARKET_ARGS) on loopback, the model registered with its known-answer probes (kvctl market
# add --model) and a paying client with plenty of credit: sets SEEDER, M, ID, MARKET_PID and
# CKEY (the client's key: sessions opened with it are credited). Every node here comes from
# 127.0.0.1, so the caps on ranks and claims per address are off (MARKET_CAPS replaces that).
MARKET_CAPS=${MARKET_CAPS:---max-ranks-per-addr 0 --claims-per-min-addr 0}
market_start() { # market_start [PORT]: the market on its database (again, after a kill)
    "$KVD" market --db "$T/market.db" --listen "127.0.0.1:${1:-0}" --port-file "$T/market.port" \
        --lease-s 6 --grace-s 3 --operator-key "$T/operators.txt" $MARKET_CAPS ${MARKET_ARGS:-} \
        >>"$T/market.log" 2>&1 &
    MARKET_PID=$!
    PIDS="$PIDS $MARKET_PID"
}
market_up() {
    "$KVCTL" catalog "$S" -o "$T/cat.json" >/dev/null 2>&1 || die "kvctl catalog failed"
    "$KVD" seeder --serve "$S" --listen 127.0.0.1:0 --port-file "$T/seeder.port" >"$T/seeder.log" 2>&1 &
    PIDS="$PIDS $!"
    mkdir -p "$T/op"
    "$KVD" stage --state-dir "$T/op" --print-key >"$T/operators.txt" || die "no operator key"
    market_start
    wait_file "$T/seeder.port" && wait_file "$T/market.port" || die "seeder or market did not start"
    SEEDER=http://127.0.0.1:$(cat "$T/seeder.port")
    M=http://127.0.0.1:$(cat "$T/market.port")
    ID=$("$KVCTL" market add "$M" --catalog "$T/cat.json" --source "$SEEDER" --name stories \
         --model "$S" --state-dir "$T/admin" 2>"$T/add.log") || { cat "$T/add.log"; die "kvctl market add failed"; }
    CKEY=$("$KVCTL" market client add "$M" --credit 1000000 --name tests --state-dir "$T/op" 2>>"$T/add.log") ||
        { cat "$T/add.log"; die "kvctl market client add failed"; }
}
ring_ready() {
    $MKT_NS "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 -c '
import json,sys
c=json.load(open(sys.argv[1]))["models"][0]
sys.exit(0 if len(c["rings"])==1 and all(w["state"]=="active" for w in c["windows"]) else 1)' "$T/cov.json"
}
# key_of NAME: the node key of the node whose state directory is $T/NAME
key_of() { "$KVD" stage --state-dir "$T/$1" --print-key; }
# rank_of NAME: its rank in the manifest it runs
rank_of() {
    python3 -c '
import json,sys
m=json.load(open(sys.argv[1]))
print([r["rank"] for r in m["ranks"] if r["node"]==sys.argv[2]][0])' "$T/$1/manifest.json" "$(key_of "$1")"
}
# rank0 NAME...: the one of them that runs rank 0
rank0() { for n in "$@"; do [ "$(rank_of "$n" 2>/dev/null)" = 0 ] && { echo "$n"; return; }; done; }
# credited NAME...: every node's balance equals its window's layers x the rows its stage ran
# (its own status counter; plus $T/extra-NAME layer-tokens where a test credited more), and its credit per layer-token is the published reward of a
# covered window, base x (1 + d/(d+10)) for some demand d >= 0: within [base, 2 x base]
# (docs/market.md, "Rewards"). What each showed goes to $T/credited.txt.
credited() {
    for n in "$@"; do
        $MKT_NS "$KVCTL" market balance "$M" "$(key_of "$n")" --json >"$T/bal-$n.json" 2>/dev/null ||
            return 1
    done
    /usr/bin/python3 - "$ROOT/tests/lib" "$T" "$@" >"$T/credited.txt" 2>&1 <<'PY'
import json, sys
sys.path.insert(0, sys.argv[1])
import kvd_ctl
T, names = sys.argv[2], sys.argv[3:]
base = 0.001
ok = True
for n in names:
    st = kvd_ctl.status("%s/%s/kvd.sock" % (T, n))
    m = json.load(open("%s/%s/manifest.json" % (T, n)))
    b = json.load(open("%s/bal-%s.json" % (T, n)))
    r = [x for x in m["ranks"] if x["node"] == b["node"]][0]
    layers = r["layers"][1] - r["layers"][0]
    want = st["rows"] * layers
    try:   # work credited besides the stage's rows (a test's own receipts for it)
        want += int(open("%s/extra-%s" % (T, n)).read())
    except FileNotFoundError:
        pass
    good = b["layer_tokens"] == want and want > 0 and \
        base * want * (1 - 1e-9) <= b["credit"] <= 2 * base * want * (1 + 1e-9)
    print("%s rank %d: rows %d x layers %d = %d; balance %s" % (n, r["rank"], st["rows"], layers, want, b))
    ok = ok and good
sys.exit(0 if ok else 1)
PY
}

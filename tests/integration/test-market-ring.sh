#!/bin/bash
# test-market-ring.sh — the market end to end on loopback (docs/market.md):
#  * a market, a seeder holding a test model and three `kvd join` nodes (no manifest, no
#    layer ranges given) form a ring whose generation equals one process's;
#  * every node holds only its window (pulled, verified), every window is active, one ring;
#  * `kvctl market status` (table and --json) and `kvctl market balance` read the map;
#  * the API of rank 0's node (kvd join --api) serves the market's paying clients only;
#  * receipts: each node's balance (layer_tokens) equals its window's layers x the rows its own
#    stage counted for a paying client's sessions, and its credit follows the published
#    reward of a covered window;
#  * churn: kill -9 one joined node: its window is reported uncovered once its lease lapses,
#    a fourth `kvd join` takes exactly that window, the new manifest changes only that rank's
#    entry, and the ring serves the same generation again;
#  * kill -9 of the market: the ring keeps serving, and after the market's restart (same
#    database) the nodes take their leases back without a new manifest.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"

market_up
[ "$ID" = "$(sha256sum "$T/cat.json" | cut -d' ' -f1)" ] || fail "model id $ID is not the catalog's SHA-256"

# three nodes; memory (1.8 MB each) that needs three of them for the 3.6 MiB the planner asks
declare -A JPID
declare -A APORT
join() { # join NAME: the node serves the ring's API on its own port should it be rank 0
    rm -f "$T/$1.api"
    "$LISTEN" "$T/$1.api" 0 -- "$KVD" join --market "$M" --model "$ID" --state-dir "$T/$1" --mem 1800000 -t 1 \
        --jitter-ms 300 --api "127.0.0.1:{PORT}" >"$T/join-$1.log" 2>&1 &
    JPID[$1]=$!
    PIDS="$PIDS $!"
    APORT[$1]=$(port_of "$T/$1.api") || fail "node $1's launcher: $(cat "$T/join-$1.log")"
}
for n in a b c; do join $n; done

wait_for 60 ring_ready || fail "no complete ring within 60 s: $(cat "$T/cov.json")"
NW=$(python3 -c 'import json,sys; print(len(json.load(open(sys.argv[1]))["models"][0]["windows"]))' "$T/cov.json")
[ "$NW" = 3 ] || fail "the market planned $NW windows for three 1.8 MB nodes, expected 3"
"$KVCTL" market status "$M" >"$T/status.txt" || fail "kvctl market status failed"
grep -q "rings 1" "$T/status.txt" || fail "the status table shows no ring: $(cat "$T/status.txt")"
[ "$(grep -c ' active ' "$T/status.txt")" = 3 ] || fail "status table: $(cat "$T/status.txt")"

serves() { # serves NAME: rank 0's socket answers with the one-process tokens
    got=$("$KVCTL" generate --ring "unix:$T/$1/kvd.sock" --client-key "$CKEY" --tokens 1,50,100,200,300 -n 16 --temp 0 \
          --ids 2>"$T/gen.err")
    [ -n "$got" ] && [ "$got" = "$want" ]
}
want=$("$KVCTL" generate -m "$S" --tokens 1,50,100,200,300 -n 16 --temp 0 --ids 2>/dev/null)
[ -n "$want" ] || die "one-process generation failed"
R0=$(rank0 a b c)
[ -n "$R0" ] || fail "no node runs rank 0"
wait_for 30 serves "$R0" || fail "the joined ring's tokens ($got; $(cat "$T/gen.err")) differ from one process's ($want)"
echo "ok   three joined nodes serve the one-process generation: $got"

# the ring's API on rank 0's node: the market's paying clients only
api() { # api KEY: the HTTP status of a completion request with that key ("" for none)
    curl -s -o "$T/api.out" -w '%{http_code}' ${1:+-H "Authorization: Bearer $1"} \
        -H 'Content-Type: application/json' -d '{"prompt":"Once upon a time","max_tokens":6,"temperature":0}' \
        "http://127.0.0.1:${APORT[$R0]}/v1/completions"
}
wait_for 20 bash -c "[ \"\$(curl -s -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer $CKEY' -H 'Content-Type: application/json' \
    -d '{\"prompt\":\"Once\",\"max_tokens\":2}' http://127.0.0.1:${APORT[$R0]}/v1/completions)\" = 200 ]" ||
    fail "the ring's API does not serve the paying client: $(api "$CKEY") $(cat "$T/api.out")"
[ "$(api "$CKEY")" = 200 ] && grep -q '"text"' "$T/api.out" || fail "completion for the client: $(cat "$T/api.out")"
[ "$(api "")" = 401 ] || fail "the ring's API served a request without a key: $(cat "$T/api.out")"
[ "$(api kvc-00000000000000000000000000000000000000000000000000000000000000aa)" = 401 ] ||
    fail "the ring's API served a key the market does not know: $(cat "$T/api.out")"
ZKEY=$("$KVCTL" market client add "$M" --credit 0 --state-dir "$T/op" 2>/dev/null) || fail "a client with no credit"
client_listed() { curl -s "$M/v1/clients" | grep -q "$(printf %s "$CKEY" | sha256sum | cut -c1-64)"; }
wait_for 10 client_listed || fail "GET /v1/clients does not list the paying client"
curl -s "$M/v1/clients" | grep -q "$(printf %s "$ZKEY" | sha256sum | cut -c1-64)" && fail "a client with no credit is listed as payable"
[ "$(api "$ZKEY")" = 401 ] || fail "the ring's API served a client with no credit: $(cat "$T/api.out")"
echo "ok   rank 0's API (kvd join --api) serves the market's paying clients and refuses others (401)"

# each node pulled only its own window, and the windows are the manifest's
for n in a b c; do
    r=$(rank_of $n)
    win=$(python3 -c '
import json,sys
m=json.load(open(sys.argv[1])); l=m["ranks"][int(sys.argv[2])]["layers"]; print("%d-%d"%(l[0],l[1]))' \
        "$T/$n/manifest.json" "$r")
    [ -s "$T/$n/window-$win.gguf" ] || fail "node $n (rank $r) has no window-$win.gguf"
    [ "$(ls "$T/$n"/window-*.gguf | wc -l)" = 1 ] || fail "node $n holds more than its window"
done
cmp -s "$T/a/manifest.json" "$T/b/manifest.json" && cmp -s "$T/b/manifest.json" "$T/c/manifest.json" ||
    fail "the nodes run different manifests"
"$KVCTL" market balance "$M" "$(key_of a)" --json >"$T/bal.json" || fail "kvctl market balance failed"
grep -q '"layer_tokens"' "$T/bal.json" && grep -q '"credit"' "$T/bal.json" ||
    fail "balance lacks layer_tokens/credit: $(cat "$T/bal.json")"

# ---- receipts: the stages sign what they computed, kvd join submits it, the market credits it.
# A second generation with a longer prompt, so prompt and decode rows both count.
serves2() {
    got2=$("$KVCTL" generate --ring "unix:$T/$1/kvd.sock" --client-key "$CKEY" --tokens 1,20,30,40,50,60,70,80 -n 9 \
           --temp 0 --ids 2>"$T/gen.err")
    [ -n "$got2" ]
}
serves2 "$R0" || fail "the second generation failed: $(cat "$T/gen.err")"
wait_for 30 credited a b c || fail "balances do not match the stages' work: $(cat "$T/credited.txt")"
echo "ok   every node is credited the layer-tokens its stage computed, at the published reward:"
sed 's/^/       /' "$T/credited.txt"
# a node that submits its receipts again (its submitted offset lost, as after a crash between a
# submission and saving the offset) is told 409 for each and credited nothing more
for n in a b c; do cp "$T/bal-$n.json" "$T/bal-$n.before"; rm -f "$T/$n/receipts.offset"; done
wait_for 20 test -s "$T/a/receipts.offset" -a -s "$T/b/receipts.offset" -a -s "$T/c/receipts.offset" ||
    fail "the nodes did not submit their receipts again"
sleep 1
for n in a b c; do
    "$KVCTL" market balance "$M" "$(key_of $n)" --json >"$T/bal-$n.json" || fail "balance of $n"
    cmp -s "$T/bal-$n.json" "$T/bal-$n.before" ||
        fail "resubmitted receipts changed node $n's balance: $(cat "$T/bal-$n.before") -> $(cat "$T/bal-$n.json")"
done
grep -q "submitted before" "$T/join-a.log" || fail "node a's resubmissions were not refused as duplicates"
echo "ok   resubmitted receipts are refused as duplicates and credit nothing twice"

# ---- churn: kill -9 a node that is not rank 0 (the client's socket stays where it is)
VICTIM=""
for n in a b c; do [ "$n" != "$R0" ] && VICTIM=$n; done
VR=$(rank_of $VICTIM)
cp "$T/$R0/manifest.json" "$T/manifest-before.json"
kill -9 "${JPID[$VICTIM]}"
uncovered() {
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 -c '
import json,sys
c=json.load(open(sys.argv[1]))["models"][0]
w=c["windows"][int(sys.argv[2])]
sys.exit(0 if w["state"]=="uncovered" and not c["rings"] else 1)' "$T/cov.json" "$VR"
}
wait_for 20 uncovered || fail "window $VR still covered 20 s after its node was killed: $(cat "$T/cov.json")"
echo "ok   window $VR reported uncovered once the killed node's lease lapsed"
join d
wait_for 60 ring_ready || fail "no complete ring after the fourth node joined: $(cat "$T/cov.json")"
wait_for 20 test -s "$T/d/manifest.json" || fail "node d got no manifest"
[ "$(rank_of d)" = "$VR" ] || fail "node d took rank $(rank_of d), the freed window is $VR"
python3 - "$T/manifest-before.json" "$T/d/manifest.json" "$VR" <<'EOF' || fail "the new manifest changes more than rank $VR's entry"
import json, sys
a, b, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2])), int(sys.argv[3])
ra, rb = a.pop("ranks"), b.pop("ranks")
assert a == b, "header differs"
assert len(ra) == len(rb)
for i, (x, y) in enumerate(zip(ra, rb)):
    if i == r:
        assert x["layers"] == y["layers"] and x["node"] != y["node"], "rank %d: %s -> %s" % (i, x, y)
    else:
        assert x == y, "rank %d changed: %s -> %s" % (i, x, y)
EOF
wait_for 40 serves "$R0" || fail "after churn the ring's tokens ($got; $(cat "$T/gen.err")) differ from one process's"
echo "ok   a fourth node took window $VR and the ring serves again: $got"

# ---- control plane only: the ring serves while the market is down, and is left alone after
cp "$T/$R0/manifest.json" "$T/manifest-running.json"
MPORT=$(cat "$T/market.port")
kill_dead "$MARKET_PID"
sleep 2   # the ring runs a while without its market
serves "$R0" || fail "the ring stopped serving while the market was down ($got)"
market_start "$MPORT"
wait_for 30 ring_ready || fail "the ring was not complete again after the market came back: $(cat "$T/cov.json")"
sleep 2
cmp -s "$T/manifest-running.json" "$T/$R0/manifest.json" || fail "the market's restart changed the manifest"
serves "$R0" || fail "the ring does not serve after the market came back ($got)"
# the receipts of what the ring served while the market was down reach it once it is back
# (node d's stage ran from its start on this manifest, so its counter is all its work)
wait_for 40 credited d || fail "node d's balance does not match its stage's work: $(cat "$T/credited.txt")"
echo "ok   the ring served while the market was down, and kept its manifest after; receipts"
echo "     of that work were submitted once the market was back"
finish

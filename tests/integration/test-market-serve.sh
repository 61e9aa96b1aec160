#!/bin/bash
# test-market-serve.sh — clients find a market ring, and the map tells the truth about it
# (docs/market.md, "Clients" and "The map"):
#  * three `kvd join --listen 127.0.0.1:0` nodes join: each binds a free port first and
#    advertises that one (no endpoint ends in :0), and they form a ring;
#  * the ring's API (rank 0's --api) is listed in the coverage JSON's ring entry and in
#    `kvctl market status`; the npm openai client pointed at that URL completes a request with
#    the market's paying client's key and with a key of --api-key-file, and gets 401 without;
#  * every stage reports its links up and when it last ran a token;
#  * with temperature, seed, top-k, top-p and min-p all given, the API and `kvctl generate`
#    write the same text (kvctl's defaults spelled out to the API, other values on both, and
#    the API's defaults spelled out to kvctl);
#  * SIGTERM of a join node gives its lease back: its window is uncovered at once (no lease
#    to lapse, no grace), and a replacement started right after on the same port takes it;
#  * `kvctl ring down --dir NODE_DIR` stops a joined node, which gives its lease back;
#  * an endpoint the market refuses (400) stops kvd join with the reason, no claim loop;
#  * a node killed with -9: `kvctl market status` shows its window in grace with its holder,
#    and a newcomer that fits says the window is kept for that holder, then takes it.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"
command -v node >/dev/null || die "node missing (scripts/setup.sh installs nodejs)"
[ -f tests/node_modules/openai/package.json ] ||
    die "node package openai missing in tests/node_modules (scripts/setup.sh installs it from the npm registry)"

market_up
printf '# keys of our own\nown-key-1\n' >"$T/own.keys"
declare -A JPID APORT
join() { # join NAME [options]: a node with its API should it be rank 0, on a port it binds
    local n=$1; shift
    rm -f "$T/$n.api"
    "$LISTEN" "$T/$n.api" 0 -- "$KVD" join --market "$M" --model "$ID" --state-dir "$T/$n" --mem 1800000 -t 1 \
        --jitter-ms 300 --api "127.0.0.1:{PORT}" --api-key-file "$T/own.keys" \
        --chat-template chatml "$@" >"$T/join-$n.log" 2>&1 &
    JPID[$n]=$!
    PIDS="$PIDS $!"
    APORT[$n]=$(port_of "$T/$n.api") || fail "node $n's launcher: $(cat "$T/join-$n.log")"
}
for n in a b c; do join $n --listen 127.0.0.1:0; done
wait_for 60 ring_ready || fail "no complete ring within 60 s: $(cat "$T/cov.json")"
python3 - "$T/cov.json" <<'PY' || fail "an endpoint in the map is not a bound port: $(cat "$T/cov.json")"
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
eps = [s["endpoint"] for w in c["windows"] for s in w["stages"]]
assert len(eps) == 3 and all(e.startswith("tcp://127.0.0.1:") and not e.endswith(":0") for e in eps), eps
PY
echo "ok   three kvd join --listen 127.0.0.1:0 nodes advertise the ports they bound and form a ring"

R0=$(rank0 a b c)
[ -n "$R0" ] || fail "no node runs rank 0"
API=http://127.0.0.1:${APORT[$R0]}
api_listed() { # the ring entry names rank 0's API, and every stage reports its links up
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 - "$T/cov.json" "$API" 2>/dev/null <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
ok = len(c["rings"]) == 1 and c["rings"][0].get("api") == [sys.argv[2]] and not c["unlinked"]
ok = ok and all(s.get("ring", {}).get("links", {}).get("linked") for w in c["windows"] for s in w["stages"])
sys.exit(0 if ok else 1)
PY
}
wait_for 20 api_listed || fail "the map does not list the ring's API $API with its links up: $(cat "$T/cov.json")"
"$KVCTL" market status "$M" >"$T/status.txt" || fail "kvctl market status failed"
grep -q "API $API\$" "$T/status.txt" || fail "kvctl market status does not show the ring's API: $(cat "$T/status.txt")"
[ "$(grep -c ' up ' "$T/status.txt")" = 3 ] || fail "kvctl market status does not show three stages linked: $(cat "$T/status.txt")"
echo "ok   the map lists the ring's API ($API) and every stage's links up"

# the official client, pointed at the URL the map gave: the paying client's key, our own key
client_listed() { curl -s "$M/v1/clients" | grep -q "$(printf %s "$CKEY" | sha256sum | cut -c1-64)"; }
wait_for 10 client_listed || fail "GET /v1/clients does not list the paying client"
key_ok() { [ "$(node tests/lib/api_openai_client.mjs --key "$API/v1" "$1")" = "ok 2" ]; }
wait_for 20 key_ok "$CKEY" ||
    fail "the openai client with the paying client's key: $(node tests/lib/api_openai_client.mjs --key "$API/v1" "$CKEY")"
key_ok own-key-1 || fail "the openai client with a key of --api-key-file: $(node tests/lib/api_openai_client.mjs --key "$API/v1" own-key-1)"
out=$(node tests/lib/api_openai_client.mjs --key "$API/v1" kvc-not-a-client)
[ "$out" = "401 AuthenticationError" ] || fail "an unknown key was not refused with 401: $out"
echo "ok   the openai client at the map's URL: the paying client's key and --api-key-file's served, others 401"

# the same seed and every sampling parameter given: the API and kvctl generate agree
same_text() { # same_text JSON-PARAMS KVCTL-OPTIONS...: the completion's text equals kvctl's
    local params=$1; shift
    curl -s -H "Authorization: Bearer $CKEY" -H 'Content-Type: application/json' \
        -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,$params}" "$API/v1/completions" >"$T/api.json"
    "$KVCTL" generate --ring "unix:$T/$R0/kvd.sock" --client-key "$CKEY" -p "Once upon a time" -n 24 \
        "$@" >"$T/gen.txt" 2>"$T/gen.err" || fail "kvctl generate: $(cat "$T/gen.err")"
    python3 - "$T/api.json" "$T/gen.txt" <<'PY' || fail "API and kvctl generate differ ($params / $*)"
import json, sys
got = json.load(open(sys.argv[1]))["choices"][0]["text"]
want = open(sys.argv[2], encoding="utf-8").read()
want = want[:-1] if want.endswith("\n") else want
print("       API: %r\n       kvctl: %r" % (got, want))
sys.exit(0 if got == want and got else 1)
PY
}
same_text '"temperature":0.8,"seed":42,"top_k":40,"top_p":0.95,"min_p":0.05' \
    --temp 0.8 --seed 42 --top-k 40 --top-p 0.95 --min-p 0.05
same_text '"temperature":0.9,"seed":7,"top_k":20,"top_p":0.9,"min_p":0.02' \
    --temp 0.9 --seed 7 --top-k 20 --top-p 0.9 --min-p 0.02
same_text '"temperature":0.8,"seed":42' --temp 0.8 --seed 42 --top-k 0 --top-p 1 --min-p 0
echo "ok   the same seed and sampling parameters give the same text through the API and kvctl generate"

# ---- a clean stop gives the lease back: the window is free at once
VICTIM=""
for n in a b c; do [ "$n" != "$R0" ] && VICTIM=$n; done
VR=$(rank_of $VICTIM)
VPORT=$(python3 -c '
import json,sys
m=json.load(open(sys.argv[1])); print(m["ranks"][int(sys.argv[2])]["endpoint"].rsplit(":",1)[1])' \
    "$T/$VICTIM/manifest.json" "$VR")
freed() { # freed W: window W is uncovered with no stage kept for anyone
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 -c '
import json,sys
c=json.load(open(sys.argv[1]))["models"][0]
w=c["windows"][int(sys.argv[2])]
sys.exit(0 if w["state"]=="uncovered" and not w["stages"] and not c["rings"] else 1)' "$T/cov.json" "$1"
}
t0=$(date +%s.%N)
kill -TERM "${JPID[$VICTIM]}"
# the lease is 6 s (renewed every 1.5 s) and its grace 3 s: a window free within 5 s by the
# clock was given back, not left to lapse
wait_clock 5 freed "$VR" || fail "window $VR not free within 5 s of its node's SIGTERM: $(cat "$T/cov.json")"
echo "ok   SIGTERM of node $VICTIM: window $VR free after $(python3 -c "import time;print('%.1f'%(time.time()-$t0))") s (lease 6 s, grace 3 s)"
wait_for 10 grep -q "gave the lease on window $VR back" "$T/join-$VICTIM.log" || fail "node $VICTIM does not say it gave its lease back"
# a replacement on the very port the stopped node used (it may still be closing)
join d --listen "127.0.0.1:$VPORT"
wait_for 60 ring_ready || fail "no complete ring after node d joined on port $VPORT: $(cat "$T/cov.json"; tail -5 "$T/join-d.log")"
grep -q "Address already in use" "$T/join-d.log" && ! kill -0 "${JPID[d]}" 2>/dev/null &&
    fail "node d exited on a busy port"
[ "$(rank_of d)" = "$VR" ] || fail "node d took rank $(rank_of d), the freed window is $VR"
echo "ok   node d took window $VR on port $VPORT right after node $VICTIM's stop"

# ---- kvctl ring down --dir of a joined node: it stops and gives its lease back
"$KVCTL" ring down --dir "$T/d" >"$T/down.txt" 2>&1 || fail "kvctl ring down --dir $T/d: $(cat "$T/down.txt")"
grep -q "gave its lease back" "$T/down.txt" || fail "kvctl ring down --dir: $(cat "$T/down.txt")"
kill -0 "${JPID[d]}" 2>/dev/null && fail "node d still runs after kvctl ring down --dir"
freed "$VR" || fail "window $VR not free after kvctl ring down --dir: $(cat "$T/cov.json")"
echo "ok   kvctl ring down --dir NODE_DIR stopped node d and its window is free: $(cat "$T/down.txt")"

# ---- a refusal no retry changes stops kvd join with the market's reason: an endpoint the
# market refuses (a port past 65535), instead of claiming again once a second
timeout 60 "$KVD" join --market "$M" --model "$ID" --state-dir "$T/x" --mem 1800000 -t 1 --jitter-ms 0 \
    --advertise 127.0.0.1:99999 >"$T/join-x.log" 2>&1
rc=$?
[ $rc = 1 ] || fail "kvd join with an endpoint the market refuses exited $rc: $(tail -5 "$T/join-x.log")"
grep -q "HTTP 400: endpoint: expected tcp://HOST:PORT" "$T/join-x.log" && grep -q "refused endpoint tcp://127.0.0.1:99999; stopping" "$T/join-x.log" ||
    fail "kvd join does not say why it stopped: $(tail -5 "$T/join-x.log")"
[ "$(grep -c 'claimed window' "$T/join-x.log")" = 1 ] || fail "kvd join claimed more than once: $(grep 'claimed window' "$T/join-x.log")"
freed "$VR" || fail "window $VR is not free after the refused node stopped: $(cat "$T/cov.json")"
echo "ok   kvd join stops on the market's 400 for its endpoint, with the reason, and gives the window back"

# ---- grace, shown as such: a node killed with -9 keeps its window for itself a while; the map
# says grace with its holder, and a newcomer that would fit says whose it is
join e
wait_for 60 ring_ready || fail "no complete ring after node e joined: $(cat "$T/cov.json")"
OTHER=""
for n in a b c; do [ "$n" != "$R0" ] && [ "$n" != "$VICTIM" ] && OTHER=$n; done
OR=$(rank_of $OTHER)
kill -9 "${JPID[$OTHER]}"
in_grace() {
    "$KVCTL" market status "$M" --model "$ID" >"$T/status.txt" 2>/dev/null &&
    grep -qE "^  $OR +\\[[0-9]+, [0-9]+\\) +grace +[^ ]+ [^ ]+ +$(key_of $OTHER | cut -c1-16) " "$T/status.txt"
}
wait_for 15 in_grace || fail "window $OR of the killed node is not shown in grace with its holder: $(cat "$T/status.txt")"
join f
wait_for 10 grep -q "window $OR of .* fits in [0-9]* bytes but is kept for its holder $(key_of $OTHER | cut -c1-16)\.\.\. in its grace period" "$T/join-f.log" ||
    fail "node f does not say the window is kept for its holder: $(tail -3 "$T/join-f.log")"
echo "ok   window $OR in grace: kvctl market status shows grace and its holder, and node f says whose it is"
wait_for 30 ring_ready || fail "node f did not take window $OR after its grace: $(cat "$T/cov.json")"
echo "ok   node f took window $OR once its grace was over"
finish

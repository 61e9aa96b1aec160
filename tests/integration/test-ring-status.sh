#!/bin/bash
# The ring-wide status of a 3-host ring, asked only at rank 0 (docs/kvctl.md, "status"). Each
# rank runs in its own network namespace and UTS namespace (its own host name), wired as a
# triangle of veth links on TEST-NET addresses, so the only way rank 0 can hear of ranks 1
# and 2 is over the ring's own links:
#
#   ns0 (host kvs-a) rank 0 on 192.0.2.9:7100    ns0 <-> ns1  192.0.2.1 / 192.0.2.2
#   ns1 (host kvs-b) rank 1 on 192.0.2.2:7101    ns1 <-> ns2  192.0.2.5 / 192.0.2.6
#   ns2 (host kvs-c) rank 2 on 192.0.2.6:7102    ns2 <-> ns0  192.0.2.10 / 192.0.2.9
#
# kvctl status --ring unix:RANK0-SOCKET (and a ring directory holding only rank 0) lists all
# three ranks with their hosts and link states; --watch refreshes and ends on SIGINT; rank 0's
# /metrics has each rank's series; a killed stage shows as down with its neighbours' reasons.
# Needs root (ip netns, unshare).
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$(need_model stories260K.gguf) || exit 1
[ "$(id -u)" = 0 ] || fail "needs root for network namespaces"
command -v ip >/dev/null || fail "ip (iproute2) missing"
command -v unshare >/dev/null || fail "unshare (util-linux) missing"
command -v curl >/dev/null || fail "curl missing"

S=$$
N0=kvs0$S N1=kvs1$S N2=kvs2$S
NPIDS=""
ns_cleanup() {
    for p in $NPIDS; do kill "$p" 2>/dev/null; done
    for p in $NPIDS; do wait "$p" 2>/dev/null; done
    for n in $N0 $N1 $N2; do ip netns del "$n" 2>/dev/null; done
}
at_exit ns_cleanup
for n in $N0 $N1 $N2; do ip netns add "$n" || fail "ip netns add $n"; ip -n "$n" link set lo up; done
# veth names are per namespace: the same short names in each
ip link add a1 netns $N0 type veth peer name b0 netns $N1 || fail "veth 0-1"
ip link add b2 netns $N1 type veth peer name c1 netns $N2 || fail "veth 1-2"
ip link add c0 netns $N2 type veth peer name a2 netns $N0 || fail "veth 2-0"
ip -n $N0 addr add 192.0.2.1/30 dev a1
ip -n $N1 addr add 192.0.2.2/30 dev b0
ip -n $N1 addr add 192.0.2.5/30 dev b2
ip -n $N2 addr add 192.0.2.6/30 dev c1
ip -n $N2 addr add 192.0.2.10/30 dev c0
ip -n $N0 addr add 192.0.2.9/30 dev a2
for l in "$N0 a1" "$N0 a2" "$N1 b0" "$N1 b2" "$N2 c1" "$N2 c0"; do set -- $l; ip -n "$1" link set "$2" up; done

# A local ring gives each rank its node key (the manifest names them); then the endpoints
# move to the namespaces, and ranks 1 and 2 keep their state elsewhere: the ring directory
# holds only rank 0, as on rank 0's host.
D=$TMP/ring
FAR=$TMP/far
ring_up "$D" --model "$M" --stages 3
ring_down "$D"
/usr/bin/python3 - "$D/ring.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
for r, ep in zip(m["ranks"], ["tcp://192.0.2.9:7100", "tcp://192.0.2.2:7101", "tcp://192.0.2.6:7102"]):
    r["endpoint"] = ep
json.dump(m, open(sys.argv[1], "w"), indent=1)
PY
mkdir -p "$FAR"
mv "$D/rank-1" "$D/rank-2" "$FAR/"
# start RANK NS HOST STATE_DIR [kvd options]: kvd stage inside NS with host name HOST
start() {
    local r=$1 ns=$2 host=$3 sd=$4; shift 4
    rm -f "$sd/kvd.sock" "$sd/kvd.log"
    ip netns exec "$ns" unshare --uts sh -c 'hostname "$1"; shift; exec "$@"' sh "$host" \
        "$KVD" stage --manifest "$D/ring.json" --rank "$r" --model "$M" --state-dir "$sd" -t 1 "$@" \
        > "$sd/kvd.log" 2>&1 &
    echo $! > "$sd/kvd.pid"
    NPIDS="$NPIDS $!"
}
start 0 $N0 kvs-a "$D/rank-0" --api 127.0.0.1:0
start 1 $N1 kvs-b "$FAR/rank-1"
start 2 $N2 kvs-c "$FAR/rank-2"
SOCK=unix:$D/rank-0/kvd.sock
# all three ranks linked and heard of at rank 0
all_heard() {
    [ "$("$KVCTL" status --ring "$SOCK" --json 2>/dev/null | grep '"answer":true\|"rank":0,' |
         grep -c '"linked":true')" = 3 ]
}
wait_for 40 all_heard || {
    for f in "$D/rank-0" "$FAR/rank-1" "$FAR/rank-2"; do echo "--- $f"; tail -n 8 "$f/kvd.log"; done
    "$KVCTL" status --ring "$SOCK"
    fail "rank 0 did not hear of all three linked ranks"
}
echo "ok the namespaced ring linked; rank 0 hears every rank"

out=$("$KVCTL" generate --ring "$SOCK" --ids --tokens 1,400,300,200 -n 12 --temp 0 2>&1) || fail "generate: $out"
# the ranks' records (one a second at most) carry the steps once the next one reaches rank 0
stepped() {
    "$KVCTL" status --ring "$SOCK" --json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in sys.stdin]
sys.exit(not (len(rows) == 3 and all(r.get("steps", 0) > 0 and r.get("ms_per_token", 0) > 0 for r in rows)))'
}
wait_for 20 stepped || fail "the ranks' records do not carry the steps: $("$KVCTL" status --ring "$SOCK" --json)"
"$KVCTL" status --ring "$SOCK" > "$TMP/table" || fail "status --ring unix: exit $?: $(cat "$TMP/table")"
cat "$TMP/table"
for r in "0 kvs-a 192.0.2.9:7100" "1 kvs-b 192.0.2.2:7101" "2 kvs-c 192.0.2.6:7102"; do
    set -- $r
    grep -Eq "^$1 +\[[0-9]+, [0-9]+\) +[0-9]+ +$3 +up +up .* $2\$" "$TMP/table" ||
        fail "rank $1 (host $2, $3) is not listed up/up: $(cat "$TMP/table")"
done
"$KVCTL" status --ring "$SOCK" --json > "$TMP/json" || fail "status --json"
/usr/bin/python3 - "$TMP/json" <<'PY' || fail "status --json via rank 0: $(cat "$TMP/json")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["rank"] for r in rows] == [0, 1, 2], rows
hosts = {0: "kvs-a", 1: "kvs-b", 2: "kvs-c"}
peers = {0: "192.0.2.10", 1: "192.0.2.1", 2: "192.0.2.5"}   # who dialled each rank's in link
for r in rows:
    k = r["rank"]
    assert r["host"] == hosts[k] and r["linked"], r
    assert r["in"]["state"] == "up" and r["out"]["state"] == "up", r
    assert r["in"]["peer"].rsplit(":", 1)[0] == peers[k], r
    assert r["steps"] > 0 and r["ms_per_token"] > 0 and r["ms_per_token_avg"] > 0, r
    assert r["rss_bytes"] > 0 and r["backend"] == "cpu" and len(r["node"]) == 16, r
    assert r["in"]["bytes_in"] > 0 and r["out"]["bytes_out"] > 0, r
    if k:
        assert r["via"] == "rank 0" and r["answer"] and 0 <= r["age_ms"] < 5000, r
    else:
        assert r["n_ranks"] == 3 and "repair" in r, r
PY
echo "ok status via rank 0's socket: 3 ranks, their hosts, links, steps"

# A ring directory that holds only rank 0 (rank 0's host): the others through rank 0.
"$KVCTL" status --ring "$D" --json > "$TMP/djson" || fail "status --ring DIR: $(cat "$TMP/djson")"
[ "$(grep -c '"via":"rank 0"' "$TMP/djson")" = 2 ] || fail "status --ring DIR did not ask rank 0 for ranks 1, 2: $(cat "$TMP/djson")"
[ "$(grep -c '"linked":true' "$TMP/djson")" = 3 ] || fail "status --ring DIR: not 3 linked: $(cat "$TMP/djson")"
echo "ok status --ring DIR with only rank 0 here"

# /metrics on rank 0's API: every rank's series, labelled.
port=$(sed -n 's/.*OpenAI-compatible API on .* (port \([0-9]*\)).*/\1/p' "$D/rank-0/kvd.log")
[ -n "$port" ] || fail "rank 0 did not log its API port"
ip netns exec $N0 curl -s "http://127.0.0.1:$port/metrics" > "$TMP/metrics" || fail "GET /metrics"
for r in 0 1 2; do
    for k in "kvasir_stage_up{rank=\"$r\"} 1" "kvasir_stage_ms_per_token{rank=\"$r\"}" \
             "kvasir_stage_sessions{rank=\"$r\"}" "kvasir_link_bytes_total{rank=\"$r\",link=\"out\",dir=\"tx\"}" \
             "kvasir_link_bytes_total{rank=\"$r\",link=\"in\",dir=\"rx\"}"; do
        grep -qF "$k" "$TMP/metrics" || fail "/metrics lacks $k: $(grep kvasir_stage "$TMP/metrics")"
    done
    v=$(sed -n "s/^kvasir_stage_ms_per_token{rank=\"$r\"} //p" "$TMP/metrics")
    /usr/bin/python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "$v" || fail "rank $r ms/token $v"
done
[ "$(grep -c '^# TYPE kvasir_stage_ms_per_token ' "$TMP/metrics")" = 1 ] || fail "/metrics: a TYPE line repeated"
echo "ok /metrics: every rank's series"

# --watch: a block per refresh off a terminal; SIGINT ends it with status 0.
"$KVCTL" status --ring "$SOCK" --watch 0.3 > "$TMP/watch" 2>&1 &
wpid=$!
for i in $(seq 100); do [ "$(grep -c '^-- ' "$TMP/watch")" -ge 2 ] && break; sleep 0.1; done
kill -INT $wpid
wait $wpid
wrc=$?
[ $wrc = 0 ] || fail "--watch ended with $wrc on SIGINT"
[ "$(grep -c '^-- ' "$TMP/watch")" -ge 2 ] || fail "--watch printed fewer than 2 refreshes: $(cat "$TMP/watch")"
[ "$(grep -c '^rank  *layers' "$TMP/watch")" -ge 2 ] || fail "--watch blocks lack the table"
# a reader that goes away ends it too (SIGPIPE / EPIPE), cleanly
timeout 20 bash -c "\"$KVCTL\" status --ring \"$SOCK\" --watch 0.1 | head -n 3 > /dev/null"
[ $? = 0 ] || fail "--watch did not end when its reader went away"
# on a terminal (script(1) gives it one) each refresh clears the screen and redraws the table
if command -v script >/dev/null; then
    timeout -s INT 3 script -qec "\"$KVCTL\" status --ring \"$SOCK\" --watch 0.5" /dev/null > "$TMP/tty" 2>&1
    n=$(grep -o $'\033\[H\033\[2J' "$TMP/tty" | wc -l)
    [ "$n" -ge 2 ] || fail "--watch on a terminal did not redraw twice ($n clears): $(head -c 600 "$TMP/tty")"
    grep -q -- '-- [0-9]' "$TMP/tty" || fail "--watch on a terminal lacks its refresh line"
fi
echo "ok --watch: $(grep -c '^-- ' "$TMP/watch") refreshes, ended by SIGINT and by a closed pipe"

# Kill rank 2: rank 0 shows it down with the reason, heard from its neighbours.
kill -9 $(cat "$FAR/rank-2/kvd.pid")
# A SIGKILLed process keeps its listening socket until its memory is unmapped (long under
# ASan), so rank 1's first redial may be accepted and sit in the handshake until that socket
# closes: wait for the settled picture, not the first snapshot that shows rank 2 gone.
gone() {
    "$KVCTL" status --ring "$SOCK" > "$TMP/table2" 2>&1
    grep -Eq "^2 .* down \(no answer" "$TMP/table2" && grep -Eq "^1 .* up +down " "$TMP/table2"
}
wait_for 20 gone || fail "rank 2 and rank 1's out link are not shown down: $(cat "$TMP/table2")"
cat "$TMP/table2"
"$KVCTL" status --ring "$SOCK" > /dev/null 2>&1 && fail "status exit 0 with rank 2 down"
grep -Eq "rank 1 out link to rank 2: .*(refused|unreachable|timed out|closed|reset)" "$TMP/table2" ||
    fail "no reason for rank 1's link to rank 2: $(cat "$TMP/table2")"
grep -Eq "rank 0 in link from rank 2: down: " "$TMP/table2" || fail "no reason for rank 0's in link: $(cat "$TMP/table2")"
"$KVCTL" status --ring "$SOCK" --json > "$TMP/json2"
/usr/bin/python3 - "$TMP/json2" <<'PY' || fail "rank 2 in --json: $(cat "$TMP/json2")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
r2 = rows[2]
assert r2["rank"] == 2 and not r2["answer"] and not r2["linked"] and "no answer" in r2["error"], r2
assert r2["host"] == "kvs-c", r2   # its last record is kept
PY
ip netns exec $N0 curl -s "http://127.0.0.1:$port/metrics" | grep -qF 'kvasir_stage_up{rank="2"} 0' ||
    fail "/metrics does not show rank 2 down"
echo "ok a killed stage shows as down, with its neighbours' reasons"
finish

#!/bin/bash
# Errors carry their cause to the client (docs/troubleshooting.md). A 3-stage ring (stand-in
# compute) started without rank 2: rank 1, dialling a successor that is not there, says so in
# its log within seconds (not only at debug level), and a client's error from rank 0 names
# the link that is down and why. Then rank 2 comes up with another manifest: both sides log
# the manifest hash mismatch, rank 1 once (not on every redial), and the client's error
# names the mismatch. With the right manifest the ring links and generates.
. "$(dirname "$0")/../lib/ring_lib.sh"
need_exec "$KVD_STUB"

D=$TMP/ring
ring_up "$D" --stub --layers 6 --embd 64 --stages 3
KVD_BIN=$KVD_STUB "$KVCTL" ring down --dir "$D" > /dev/null
for r in 0 1 2; do rm -f "$D/rank-$r/kvd.log"; done

stage() {   # stage RANK MANIFEST: start a stage of the ring with the stand-in compute
    "$KVD_STUB" stage --manifest "$2" --rank "$1" --state-dir "$D/rank-$1" -t 1 --stub \
        >> "$D/rank-$1/kvd.log" 2>&1 &
    echo $! > "$D/rank-$1/kvd.pid"
    EXTRA_PIDS="$EXTRA_PIDS $!"
}
ts='^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+Z (INFO|WARN) '

# ---- the successor is not there
stage 0 "$D/ring.json"
stage 1 "$D/ring.json"
t0=$(date +%s%N)
wait_for 5 grep -q "link rank 1 -> rank 2 .* is down: dial .* connection refused" "$D/rank-1/kvd.log" ||
    fail "rank 1 said nothing within 5 s about its missing successor: $(cat "$D/rank-1/kvd.log")"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
grep "link rank 1 -> rank 2" "$D/rank-1/kvd.log" | head -1 | grep -qE "$ts" ||
    fail "not an info/warn line: $(grep "link rank 1 -> rank 2" "$D/rank-1/kvd.log" | head -1)"
echo "ok a missing successor is logged within $ms ms: $(grep -m1 "link rank 1 -> rank 2" "$D/rank-1/kvd.log")"
sleep 2   # rank 1 redials every 2 s at most: the same reason is not logged again
n=$(grep -c "link rank 1 -> rank 2 .* connection refused" "$D/rank-1/kvd.log")
[ "$n" = 1 ] || fail "the same dial failure was logged $n times"
# gen_err FILE PATTERN: a generate fails and its error matches PATTERN (rank 1's report takes
# a moment to reach rank 0, and rank 0's own out link may still be redialling: wait for it)
gen_err() {
    if "$KVCTL" generate --ring "$D" --ids --tokens 1,2,3 -n 3 --temp 0 > /dev/null 2> "$1"; then
        echo "generate succeeded" >> "$1"
        return 1
    fi
    grep -q "$2" "$1"
}
wait_for 10 gen_err "$TMP/err1" "ring not linked: link rank 1 -> rank 2 is down: dial .* connection refused" ||
    fail "the client's error does not name the link and why: $(cat "$TMP/err1")"
echo "ok the client hears which link is down and why: $(cat "$TMP/err1")"

# ---- rank 2 runs another manifest
python3 - "$D/ring.json" "$D/other.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m["limits"]["n_ctx"] = m["limits"]["n_ctx"] // 2
json.dump(m, open(sys.argv[2], "w"), indent=1)
PY
stage 2 "$D/other.json"
wait_for 10 grep -q "manifest hash mismatch" "$D/rank-1/kvd.log" ||
    fail "rank 1 does not log the mismatch: $(tail -n 5 "$D/rank-1/kvd.log")"
wait_for 5 grep -q "manifest hash mismatch" "$D/rank-2/kvd.log" ||
    fail "rank 2 does not log the mismatch: $(tail -n 5 "$D/rank-2/kvd.log")"
wait_for 10 gen_err "$TMP/err2" "ring not linked: link rank 1 -> rank 2 is down: .*manifest hash mismatch: rank [12] has [0-9a-f]*\.\.\., rank [12] has" ||
    fail "the client's error does not name the mismatch: $(cat "$TMP/err2")"
echo "ok the client hears of the manifest mismatch: $(cat "$TMP/err2")"
# ... and so does the ring-wide status asked at rank 0: rank 1's out link and why it is down
wait_for 5 bash -c "\"$KVCTL\" status --ring unix:$D/rank-0/kvd.sock 2>/dev/null |
    grep -q 'rank 1 out link to rank 2: [a-z]*: .*manifest hash mismatch'" ||
    fail "rank 0's status does not show why rank 1's out link is down: $("$KVCTL" status --ring unix:$D/rank-0/kvd.sock 2>&1)"
echo "ok rank 0's status shows the mismatch on rank 1's out link"
sleep 3
n=$(grep -c "manifest hash mismatch" "$D/rank-1/kvd.log")
[ "$n" -le 2 ] || fail "rank 1 logged the mismatch $n times in a few seconds"

# ---- the right manifest: the ring links
kill "$(cat "$D/rank-2/kvd.pid")"
wait_for 30 pid_gone "$(cat "$D/rank-2/kvd.pid")" || fail "rank 2 did not stop on SIGTERM"
stage 2 "$D/ring.json"
wait_linked "$D" 3 20 || fail "the ring did not link with the right manifest"
out=$("$KVCTL" generate --ring "$D" --ids --tokens 1,2,3 -n 3 --temp 0 2> "$TMP/err3") ||
    fail "generate: $(cat "$TMP/err3")"
echo "ok linked and generating: $out"
KVD_BIN=$KVD_STUB "$KVCTL" ring down --dir "$D" > /dev/null
finish

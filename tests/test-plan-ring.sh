#!/bin/bash
# test-plan-ring: a manifest written by `kvctl plan` runs as a real ring. Three local
# "devices" whose memory forces a 3-way split (a fourth too small to hold a layer is left
# out), kvd stages started from the planned manifest, and greedy generation through the
# ring gives the one-process tokens.
set -u
cd "$(dirname "$0")/.."
B=${KV_BUILD:-build}
D=${KV_TESTDATA:-../shared/testdata}
M="$D/models/stories260K.gguf"
[ -r "$M" ] || { echo "test data missing: $M"; exit 1; }
T=$(mktemp -d /tmp/kvplanring.XXXXXX)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$T"; }
trap cleanup EXIT
want=$("$B/kvctl" generate -m "$M" -p "Once upon a time" -n 24 --temp 0 --ids 2>/dev/null)
[ -n "$want" ] || { echo "FAIL one-process generation"; exit 1; }
for attempt in 1 2 3; do
    P=$((20000 + RANDOM % 30000))
    cat > "$T/devs.json" <<JSON
{"devices":[
 {"id":"a","mem_bytes":700000,"ms_per_layer_token":1,"endpoint":"tcp://127.0.0.1:$P"},
 {"id":"b","mem_bytes":700000,"ms_per_layer_token":1,"endpoint":"tcp://127.0.0.1:$((P+1))"},
 {"id":"c","mem_bytes":700000,"ms_per_layer_token":1,"endpoint":"tcp://127.0.0.1:$((P+2))"},
 {"id":"tiny","mem_bytes":100000,"ms_per_layer_token":0.1,"endpoint":"tcp://127.0.0.1:$((P+3))"}]}
JSON
    "$B/kvctl" plan --model "$M" --devices "$T/devs.json" --ctx 256 --sessions 2 --headroom 0 -o "$T/ring.json" > "$T/plan.txt" 2>&1 \
        || { echo "FAIL plan"; cat "$T/plan.txt"; exit 1; }
    n=$(python3 -c "import json;m=json.load(open('$T/ring.json'));print(len(m['ranks']))")
    grep -q "tiny: too little memory" "$T/plan.txt" || { echo "FAIL the small device is not left out"; cat "$T/plan.txt"; exit 1; }
    [ "$n" -eq 3 ] || { echo "FAIL expected 3 ranks, got $n"; cat "$T/plan.txt"; exit 1; }
    pids=""
    for r in 0 1 2; do
        mkdir -p "$T/r$r"
        "$B/kvd" stage --manifest "$T/ring.json" --rank $r --model "$M" --state-dir "$T/r$r" -t 1 > "$T/r$r.log" 2>&1 &
        pids="$pids $!"
    done
    for i in $(seq 50); do [ -S "$T/r0/kvd.sock" ] && break; sleep 0.1; done
    got=""
    for i in $(seq 60); do   # until the stages have linked up
        got=$(timeout 60 "$B/kvctl" generate --ring "unix:$T/r0/kvd.sock" -p "Once upon a time" -n 24 --temp 0 --ids 2> "$T/gen.err") && break
        grep -q "not linked" "$T/gen.err" || break
        sleep 0.2
    done
    for p in $pids; do kill "$p" 2>/dev/null; done
    wait 2>/dev/null
    pids=""
    if [ "$got" = "$want" ]; then
        echo "ok   planned 3-rank ring gives the one-process tokens"
        exit 0
    fi
    # a port taken by someone else shows as a bind error: try other ports
    grep -qi "in use\|bind" "$T"/r*.log || break
done
echo "FAIL ring tokens differ: got '$got', want '$want'"
tail -n 5 "$T"/r*.log "$T/gen.err"
exit 1

#!/bin/bash
# test-relay-mitm: a malicious relay that terminates both handshakes of the edge it bridges
# (tests/lib/ring_attack.py mitm: its own HELLO, right in every public field, with its own key, to
# each end) against a two-stage ring planned the documented way (docs/planner.md, docs/relay.md):
# each "host" profiled with `kvctl profile --state-dir` (its node key), `kvctl plan --relay`.
# Both stages refuse the relay, each naming the rank the relay posed as and the relay's key.
# The same attack on a manifest planned with --allow-unpinned, on stages started with
# --allow-unpinned, gets a signature from a stage for the relay's key: what pinning stops.
. "$(dirname "$0")/../lib/lib.sh"

M=$(need_model stories260K.gguf) || exit 1
ATTACK="python3 $(dirname "$0")/../lib/ring_attack.py"

# profile HOST ENDPOINT EXTRA...: HOST's device profile (its node key in $T/HOST, created
# there), shrunk so that the model needs both hosts (a planner that fits everything on one
# host leaves no edge for the relay)
profile() {
    local h=$1 ep=$2
    shift 2
    mkdir -p "$T/$h"
    "$KVCTL" profile --model "$M" --estimate --id "$h" --endpoint "$ep" "$@" > "$T/$h.json" 2> "$T/$h.err" ||
        die "profile $h: $(cat "$T/$h.err")"
    python3 - "$T/$h.json" <<'EOF'
import json, sys
p = json.load(open(sys.argv[1])); p["devices"][0]["mem_bytes"] = 1000000
json.dump(p, open(sys.argv[1], "w"))
EOF
}
# the malicious relay's socket bound first (tests/lib/listen.py --wait): the plan names its port,
# then the relay starts with the planned manifest
"$LISTEN" --wait "$T/go-relay" "$T/relay.port" 0 -- $ATTACK mitm "{PORT}" "$T/ring.json" > "$T/mitm.out" 2>&1 &
APID=$!
at_exit "kill $APID 2>/dev/null"
RP=$(port_of "$T/relay.port") || die "the malicious relay's launcher failed: $(cat "$T/mitm.out")"
profile host-a "tcp://127.0.0.1:$(free_port)" --state-dir "$T/host-a"
profile host-b "tcp://127.0.0.1:$(free_port)" --state-dir "$T/host-b" --no-inbound
"$KVCTL" plan --model "$M" --devices "$T/host-a.json" --devices "$T/host-b.json" --ctx 256 --sessions 1 \
    --headroom 0 --relay "ws://127.0.0.1:$RP" -o "$T/ring.json" > "$T/plan.txt" 2>&1 || die "plan: $(cat "$T/plan.txt")"
python3 - "$T/ring.json" <<'EOF' || die "the planned manifest: $(cat "$T/ring.json")"
import json, sys
m = json.load(open(sys.argv[1]))
assert len(m["ranks"]) == 2 and all(len(r.get("node", "")) == 64 for r in m["ranks"]), "two pinned ranks"
assert any(r["endpoint"].startswith("relay+ws://") for r in m["ranks"]), "an edge through the relay"
EOF
echo "ok   planned the documented way: two ranks, both keys named, one edge through the relay"

# start_ring MANIFEST LOGTAG EXTRA...: both stages of MANIFEST, each as its planned device
PIDS=""
start_ring() {
    local man=$1 tag=$2 r dev
    shift 2
    for r in 0 1; do
        dev=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"][int(sys.argv[2])]["device"])' "$man" $r)
        mkdir -p "$T/$tag-$r"
        [ -f "$T/$dev/node.key" ] && cp "$T/$dev/node.key" "$T/$tag-$r/"
        "$KVD" stage --manifest "$man" --rank $r --model "$M" --state-dir "$T/$tag-$r" -t 1 "$@" \
            > "$T/$tag-$r.log" 2>&1 &
        PIDS="$PIDS $!"
    done
    at_exit "kill $PIDS 2>/dev/null"
}
stop_all() { kill $PIDS 2>/dev/null; wait $PIDS 2>/dev/null; PIDS=""; }

# ---- pinned: the relay is refused by both stages ----
touch "$T/go-relay"
wait_for 10 grep -q "^relay key " "$T/mitm.out" || die "the malicious relay did not start: $(cat "$T/mitm.out")"
RKEY=$(sed -n 's/^relay key //p' "$T/mitm.out")
[ ${#RKEY} -eq 64 ] || die "no relay key: $(cat "$T/mitm.out")"
t0=$(date +%s.%N)
start_ring "$T/ring.json" pinned
wait_for 20 bash -c "grep -q '^rank 0 .*refused' '$T/mitm.out' && grep -q '^rank 1 .*refused' '$T/mitm.out'" ||
    fail "both stages did not refuse the relay: $(cat "$T/mitm.out")"
echo "     both refused $(python3 -c "import sys,time;print('%.2f' % (time.time()-float(sys.argv[1])))" "$t0") s after the stages started"
grep -q "accepted the relay's key" "$T/mitm.out" && fail "a pinned stage signed for the relay: $(grep accepted "$T/mitm.out")"
for r in 0 1; do
    peer=$((1 - r))
    wait_for 10 grep -q "node key ${RKEY:0:16}\.\.\. is not the one the manifest names for rank $peer" "$T/pinned-$r.log" ||
        fail "rank $r's log does not name the relay's key and rank $peer: $(tail -n 5 "$T/pinned-$r.log")"
done
echo "ok   pinned: both stages refuse the relay, naming the rank it posed as and its key ${RKEY:0:16}..."
echo "     $(grep -m1 "is not the one the manifest names" "$T/pinned-0.log" | cut -d' ' -f4-)"
echo "     $(grep -m1 "is not the one the manifest names" "$T/pinned-1.log" | cut -d' ' -f4-)"
stop_all

# ---- unpinned (planned with --allow-unpinned): what the pinning stops ----
profile bare-a "tcp://127.0.0.1:$(free_port)" --allow-unpinned
profile bare-b "tcp://127.0.0.1:$(free_port)" --allow-unpinned --no-inbound
"$KVCTL" plan --model "$M" --devices "$T/bare-a.json" --devices "$T/bare-b.json" --ctx 256 --sessions 1 \
    --headroom 0 --relay "ws://127.0.0.1:$RP" -o "$T/bare.json" > "$T/plan2.txt" 2>&1
grep -q "no node key" "$T/plan2.txt" && [ ! -e "$T/bare.json" ] ||
    fail "plan wrote a manifest without keys: $(cat "$T/plan2.txt")"
"$KVCTL" plan --model "$M" --devices "$T/bare-a.json" --devices "$T/bare-b.json" --ctx 256 --sessions 1 \
    --headroom 0 --relay "ws://127.0.0.1:$RP" --allow-unpinned -o "$T/bare.json" > "$T/plan2.txt" 2>&1 ||
    die "plan --allow-unpinned: $(cat "$T/plan2.txt")"
kill $APID 2>/dev/null; wait $APID 2>/dev/null
$ATTACK mitm "$RP" "$T/bare.json" > "$T/mitm2.out" 2>&1 &
APID=$!
at_exit "kill $APID 2>/dev/null"
wait_port "$RP" 5 || die "the malicious relay does not listen: $(cat "$T/mitm2.out")"
start_ring "$T/bare.json" bare
wait_for 15 bash -c "grep -q 'names no node key' '$T/bare-0.log' && grep -q 'names no node key' '$T/bare-1.log'"
grep -q "ERROR" "$T/bare-0.log" || fail "a stage started on a manifest without keys: $(tail -n 3 "$T/bare-0.log")"
stop_all
start_ring "$T/bare.json" loose --allow-unpinned
wait_for 20 grep -q "accepted the relay's key" "$T/mitm2.out" ||
    fail "the attack did not reach a signature on the unpinned ring: $(cat "$T/mitm2.out")"
grep -q "WARN.*--allow-unpinned" "$T/loose-0.log" || fail "no warning naming the unpinned ranks: $(head -n 5 "$T/loose-0.log")"
echo "ok   unpinned: refused at start without --allow-unpinned; with it a stage signs for the relay's key"
echo "     $(grep -m1 "accepted the relay's key" "$T/mitm2.out")"
stop_all
finish

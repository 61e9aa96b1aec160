#!/bin/bash
# test-weight: 2 (several stages computing at once)
# test-plan-ring: a manifest written by `kvctl plan` runs as a real ring. Three local
# "devices" whose memory forces a 3-way split (a fourth too small to hold a layer is left
# out), kvd stages started from the planned manifest, and greedy generation through the
# ring gives the one-process tokens. Then again with the middle device declaring
# "inbound": false and a (plain) relay: its edge goes through relay+ws://.../b/<bridge id>.
# The profiles carry each device's node key (kvctl profile --state-dir) and the stages check
# the catalog id, so the planned manifest runs unedited and admits only the planned nodes.
. "$(dirname "$0")/../lib/lib.sh"
D=$DATA
M="$D/models/stories260K.gguf"
need_data "$M"
mkdir -p "$T/ring"
pids=""
spids=""
plan_ring_cleanup() { for p in $pids $spids; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
at_exit plan_ring_cleanup
want=$("$B/kvctl" generate -m "$M" -p "Once upon a time" -n 24 --temp 0 --ids 2>/dev/null)
[ -n "$want" ] || { echo "FAIL one-process generation"; exit 1; }
# each device's node key, as `kvctl profile --state-dir` reports it
for d in a b c tiny; do
    mkdir -p "$T/node-$d"
    "$B/kvctl" profile --model "$M" --estimate --state-dir "$T/node-$d" > "$T/prof-$d.json" 2>/dev/null ||
        { echo "FAIL profile --state-dir for $d"; exit 1; }
    eval "KEY_$d=\$(python3 -c \"import json;print(json.load(open('$T/prof-$d.json'))['devices'][0]['node'])\")"
done
"$B/kvctl" catalog "$M" -o "$T/cat.json" > /dev/null 2>&1 || { echo "FAIL catalog"; exit 1; }
run_ring() {  # $1: "relay" or ""
for attempt in 1 2 3; do
    P=$(free_ports 4) || { echo "FAIL no 4 free ports"; exit 1; }
    cat > "$T/devs.json" <<JSON
{"devices":[
 {"id":"a","mem_bytes":700000,"ms_per_layer_token":1,"endpoint":"tcp://127.0.0.1:$P","node":"$KEY_a"},
 {"id":"b","mem_bytes":700000,"ms_per_layer_token":1,"endpoint":"tcp://127.0.0.1:$((P+1))","inbound":$inb,"node":"$KEY_b"},
 {"id":"c","mem_bytes":700000,"ms_per_layer_token":1,"endpoint":"tcp://localhost:$((P+2))","node":"$KEY_c"},
 {"id":"tiny","mem_bytes":100000,"ms_per_layer_token":0.1,"endpoint":"tcp://127.0.0.1:$((P+3))","node":"$KEY_tiny"}]}
JSON
    "$B/kvctl" plan --model "$M" --devices "$T/devs.json" --ctx 256 --sessions 2 --headroom 0 $relayopt -o "$T/ring/ring.json" > "$T/plan.txt" 2>&1 \
        || { echo "FAIL plan"; cat "$T/plan.txt"; exit 1; }
    n=$(python3 -c "import json;m=json.load(open('$T/ring/ring.json'));print(len(m['ranks']))")
    grep -q "tiny: too little memory" "$T/plan.txt" || { echo "FAIL the small device is not left out"; cat "$T/plan.txt"; exit 1; }
    [ "$n" -eq 3 ] || { echo "FAIL expected 3 ranks, got $n"; cat "$T/plan.txt"; exit 1; }
    spids=""
    for r in 0 1 2; do
        rm -rf "$T/ring/rank-$r"; mkdir -p "$T/ring/rank-$r"
        dev=$(python3 -c "import json;print(json.load(open('$T/ring/ring.json'))['ranks'][$r]['device'])")
        cp "$T/node-$dev/node.key" "$T/ring/rank-$r/node.key"
        "$B/kvd" stage --manifest "$T/ring/ring.json" --rank $r --model "$M" --catalog "$T/cat.json" \
            --state-dir "$T/ring/rank-$r" -t 1 > "$T/r$r.log" 2>&1 &
        spids="$spids $!"
    done
    for i in $(seq 300); do   # until every stage has both links up
        [ "$("$B/kvctl" status --ring "$T/ring" --json 2>/dev/null | grep -c '"linked":true')" = 3 ] && break
        sleep 0.1
    done
    got=$(timeout 60 "$B/kvctl" generate --ring "$T/ring" -p "Once upon a time" -n 24 --temp 0 --ids 2> "$T/gen.err")
    for p in $spids; do kill "$p" 2>/dev/null; done
    for p in $spids; do wait "$p" 2>/dev/null; done
    spids=""
    if [ "$got" = "$want" ]; then
        echo "ok   planned 3-rank ring${1:+ through the relay} gives the one-process tokens"
        return 0
    fi
    # a port taken by someone else shows as a bind error: try other ports
    grep -qi "in use\|bind" "$T"/r*.log || break
done
echo "FAIL ring${1:+ through the relay}: tokens differ: got '$got', want '$want'"
tail -n 5 "$T"/r*.log "$T/gen.err"
exit 1
}

inb=true relayopt=""
run_ring ""
python3 -c "
import json
m=json.load(open('$T/ring/ring.json'))
assert m['model']['catalog'] and m['model']['name'], m['model']
assert all(len(r.get('node',''))==64 for r in m['ranks']), 'a rank without its node key'
" || { echo "FAIL the planned manifest lacks the catalog id, name or node keys"; exit 1; }
# a node with another key cannot take a planned rank
mkdir -p "$T/intruder"
timeout 20 "$B/kvd" stage --manifest "$T/ring/ring.json" --rank 1 --model "$M" --state-dir "$T/intruder" -t 1 \
    > "$T/intruder.log" 2>&1
rc=$?
{ [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "not the one the manifest names" "$T/intruder.log"; } ||
    { echo "FAIL a stage with another node key was not refused (rc $rc)"; tail -n 3 "$T/intruder.log"; exit 1; }
echo "ok   a stage with another node key is refused"
# a host name in an endpoint is resolved (device c listens on tcp://localhost:PORT above); one
# that does not resolve is refused with the way out
python3 -c "
import json
m=json.load(open('$T/ring/ring.json')); m['ranks'][1]['endpoint']='tcp://no-such-host.invalid:7100'
json.dump(m,open('$T/badhost.json','w'))"
dev1=$(python3 -c "import json;print(json.load(open('$T/ring/ring.json'))['ranks'][1]['device'])")
mkdir -p "$T/badhost"; cp "$T/node-$dev1/node.key" "$T/badhost/"
timeout 20 "$B/kvd" stage --manifest "$T/badhost.json" --rank 1 --model "$M" --state-dir "$T/badhost" -t 1 \
    > "$T/badhost.log" 2>&1
rc=$?
{ [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "does not resolve" "$T/badhost.log" && grep -q -- "--listen" "$T/badhost.log"; } ||
    { echo "FAIL an unresolvable endpoint host: rc $rc"; tail -n 3 "$T/badhost.log"; exit 1; }
echo "ok   a host-name endpoint binds; an unresolvable one is refused naming --listen"
# the middle stage accepts no inbound connection: a plain relay carries its in-edge
"$B/kvd" relay --listen 127.0.0.1:0 --plain > "$T/relay.log" 2>&1 &
relaypid=$!
pids="$relaypid"
wait_for 5 grep -q "port [0-9]" "$T/relay.log"
RP=$(sed -n 's/.* port \([0-9]*\).*/\1/p' "$T/relay.log" | head -1)
[ -n "$RP" ] || { echo "FAIL relay did not start"; cat "$T/relay.log"; exit 1; }
inb=false relayopt="--relay ws://127.0.0.1:$RP"
run_ring relay
python3 -c "
import json,re
m=json.load(open('$T/ring/ring.json'))
eps=[r['endpoint'] for r in m['ranks']]
assert eps[0].startswith('tcp://') and eps[2].startswith('tcp://'), eps
assert re.fullmatch(r'relay\+ws://127\.0\.0\.1:$RP/b/[0-9a-f]{32}', eps[1]), eps
" || { echo "FAIL relay endpoint in the manifest"; exit 1; }
grep -qi "relay" "$T/r1.log" || { echo "FAIL rank 1's log does not mention the relay"; tail -n 5 "$T/r1.log"; exit 1; }
st=$(curl -s "http://127.0.0.1:$RP/v1/relay/status")
echo "$st" | python3 -c "import json,sys; assert json.load(sys.stdin)['pairings_total'] >= 1" \
    || { echo "FAIL the relay paired no bridge: $st"; exit 1; }
echo "ok   the NAT'd rank's endpoint is relay+ws://127.0.0.1:$RP/b/<128-bit id>"
exit 0

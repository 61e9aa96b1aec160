#!/bin/bash
# kvctl ring up / generate --ring / status / ring down as a user drives them: two rings side
# by side (other DIR, other --base-port: rank r listens on P+r), each generating what one
# process generates; `generate --ring` with DIR, DIR/ring.json or unix:SOCKET alike; a second
# `ring up` on a running DIR refused naming its pid (the ring keeps working); ring down stops
# one ring and leaves the other; ring down twice and generate/status on a stopped ring; the
# stand-in compute (--stub) only in the test build of kvd; --batch-wait-us passed to the
# stages, whose status reports the steps' waits; without --dir, ./ring-state (or an earlier
# version's ./ring).
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$(need_model stories260K.gguf) || exit 1
one=$("$KVCTL" generate -m "$M" --ids --tokens 1,400,300 -n 12 --temp 0 2>/dev/null) || fail "one-process generate"

# ring_up_at DIR: ring up with a --base-port whose 3 ports are free (another one if a port is
# taken meanwhile); BASE=P
ring_up_at() {
    local d=$1 try
    for try in 1 2 3 4 5 6; do
        BASE=$(free_ports 3) || break
        RINGS="$RINGS $d"
        "$KVCTL" ring up --dir "$d" --model "$M" --stages 3 --base-port $BASE > "$d.up" 2>&1 && return 0
        grep -q "in use" "$d.up" || fail "ring up --base-port $BASE: $(cat "$d.up")"
        ring_down "$d"
    done
    fail "ring up: no free base port in 6 tries: $(cat "$d.up")"
}

A=$TMP/a
B=$TMP/b
ring_up_at "$A"
BASE_A=$BASE
ring_up_at "$B"
BASE_B=$BASE
[ "$BASE_A" != "$BASE_B" ] || fail "both rings on base port $BASE_A"
for r in 0 1 2; do
    [ "$(rank_port "$A" $r)" = $((BASE_A + r)) ] || fail "ring A rank $r port $(rank_port "$A" $r), expected $((BASE_A + r))"
    [ "$(rank_port "$B" $r)" = $((BASE_B + r)) ] || fail "ring B rank $r port $(rank_port "$B" $r), expected $((BASE_B + r))"
done
"$KVCTL" status --ring "$A" > "$TMP/st" || fail "status A"
[ "$(grep -cE "127\.0\.0\.1:($BASE_A|$((BASE_A + 1))|$((BASE_A + 2))) +up +up" "$TMP/st")" = 3 ] ||
    fail "status A does not show 3 linked stages on the base ports: $(cat "$TMP/st")"

for how in "$A" "$A/ring.json" "unix:$A/rank-0/kvd.sock" "$B"; do
    out=$("$KVCTL" generate --ring "$how" --ids --tokens 1,400,300 -n 12 --temp 0 2>"$TMP/err") ||
        fail "generate --ring $how: $(cat "$TMP/err")"
    [ "$out" = "$one" ] || fail "generate --ring $how: '$out' vs one process '$one'"
done
# status takes the manifest file too, whatever its name; a broken one is named
cp "$A/ring.json" "$A/prod.json"
"$KVCTL" status --ring "$A/prod.json" > "$TMP/st" 2>&1 || fail "status --ring prod.json: $(cat "$TMP/st")"
[ "$(grep -c " up  *up " "$TMP/st")" = 3 ] || fail "status --ring prod.json: $(cat "$TMP/st")"
echo '{"version": 1}' > "$TMP/broken.json"
if "$KVCTL" status --ring "$TMP/broken.json" > "$TMP/st" 2>&1; then fail "status of a broken manifest: exit 0"; fi
grep -q "$TMP/broken.json" "$TMP/st" || fail "status of a broken manifest does not name it: $(cat "$TMP/st")"
echo "ok two rings side by side, DIR / ring.json / unix:SOCKET"

# The context: a ring with --ctx 16 and one process with --ctx 16 stop at the same token and
# both say so on stderr (the text on stdout stays the same).
C=$TMP/ctx
ring_up "$C" --model "$M" --stages 2 --ctx 16
one16=$("$KVCTL" generate -m "$M" --ctx 16 --ids --tokens 1,400,300 -n 100 --temp 0 --ignore-eos 2>"$TMP/err1") ||
    fail "one process, --ctx 16: $(cat "$TMP/err1")"
ring16=$("$KVCTL" generate --ring "$C" --ids --tokens 1,400,300 -n 100 --temp 0 --ignore-eos 2>"$TMP/err2") ||
    fail "ring, ctx 16: $(cat "$TMP/err2")"
[ "$(echo "$one16" | wc -w)" = 13 ] || fail "one process, --ctx 16: 3 prompt + 13 tokens expected: '$one16'"
[ "$ring16" = "$one16" ] || fail "at the context: ring '$ring16' vs one process '$one16'"
grep -q "stopped at the context length: 3 prompt + 13 generated" "$TMP/err1" || fail "one process: no context note: $(cat "$TMP/err1")"
grep -q "stopped at the context length: 3 prompt + 13 generated" "$TMP/err2" || fail "ring: no context note: $(cat "$TMP/err2")"
ring_down "$C"
echo "ok generation stops at the context, ring and one process alike"

pid0=$(rank_pid "$A" 0)
if "$KVCTL" ring up --dir "$A" --model "$M" --stages 3 > "$TMP/up2" 2>&1; then
    fail "a second ring up on a running DIR succeeded"
fi
grep -q "already running in $A (rank 0, pid $pid0)" "$TMP/up2" || fail "second ring up: '$(cat "$TMP/up2")'"
[ "$(rank_pid "$A" 0)" = "$pid0" ] || fail "the refused ring up replaced rank 0's pid file"
out=$("$KVCTL" generate --ring "$A" --ids --tokens 1,400,300 -n 12 --temp 0 2>"$TMP/err") ||
    fail "ring A after the refused ring up: $(cat "$TMP/err")"
[ "$out" = "$one" ] || fail "ring A after the refused ring up: '$out'"
echo "ok second ring up refused, the ring keeps working"

"$KVCTL" ring down --dir "$A" > "$TMP/down" 2>&1 || fail "ring down A: $(cat "$TMP/down")"
grep -q "3 stages stopped" "$TMP/down" || fail "ring down A: '$(cat "$TMP/down")'"
for r in 0 1 2; do
    [ -e "$A/rank-$r/kvd.sock" ] && fail "rank $r's control socket is left after ring down"
done
out=$("$KVCTL" generate --ring "$B" --ids --tokens 1,400,300 -n 12 --temp 0 2>"$TMP/err") ||
    fail "ring B after ring A went down: $(cat "$TMP/err")"
[ "$out" = "$one" ] || fail "ring B after ring A went down: '$out'"
"$KVCTL" ring down --dir "$A" > "$TMP/down" 2>&1 || fail "ring down twice: exit status $?"
grep -q "0 stages stopped" "$TMP/down" || fail "ring down twice: '$(cat "$TMP/down")'"
if "$KVCTL" generate --ring "$A" --ids --tokens 1,400,300 -n 4 > /dev/null 2> "$TMP/err"; then
    fail "generate on a stopped ring succeeded"
fi
grep -q "cannot reach the daemon at $A/rank-0/kvd.sock" "$TMP/err" || fail "generate on a stopped ring: '$(cat "$TMP/err")'"
if "$KVCTL" status --ring "$A" > "$TMP/st" 2>&1; then fail "status of a stopped ring: exit 0"; fi
[ "$(grep -c " down (cannot reach" "$TMP/st")" = 3 ] || fail "status of a stopped ring: $(cat "$TMP/st")"
ring_down "$B"
echo "ok ring down leaves the other ring; down twice, generate and status on a stopped ring"

# Without --dir, ring up and ring down use ./ring-state; where ./ring holds a ring an earlier
# version started (its default) and there is no ./ring-state, ring down stops that one.
D=$TMP/cwd
mkdir -p "$D/old"
RINGS="$RINGS $D/ring-state $D/old/ring"
(cd "$D" && "$KVCTL" ring up --model "$M" --stages 2) > "$D.up" 2>&1 || fail "ring up without --dir: $(cat "$D.up")"
[ -s "$D/ring-state/ring.json" ] || fail "ring up without --dir wrote no ./ring-state/ring.json: $(ls "$D")"
out=$("$KVCTL" generate --ring "$D/ring-state" --ids --tokens 1,400,300 -n 12 --temp 0 2>"$TMP/err") ||
    fail "generate on the ring in ./ring-state: $(cat "$TMP/err")"
[ "$out" = "$one" ] || fail "the ring in ./ring-state: '$out'"
(cd "$D" && "$KVCTL" ring down) > "$TMP/down" 2>&1 || fail "ring down without --dir: $(cat "$TMP/down")"
grep -q "2 stages stopped" "$TMP/down" || fail "ring down without --dir: '$(cat "$TMP/down")'"
"$KVCTL" ring up --dir "$D/old/ring" --model "$M" --stages 2 > "$D.old.up" 2>&1 || fail "ring up --dir old/ring: $(cat "$D.old.up")"
(cd "$D/old" && "$KVCTL" ring down) > "$TMP/down" 2>&1 || fail "ring down in a folder with an old ./ring: $(cat "$TMP/down")"
grep -q "2 stages stopped" "$TMP/down" || fail "ring down did not stop the ring in an old ./ring: '$(cat "$TMP/down")'"
[ -e "$D/old/ring-state" ] && fail "ring down made ./ring-state beside an old ./ring"
echo "ok without --dir: ./ring-state, or the ./ring of an earlier version"

# A client that goes away mid-generation ends its session on every stage (CLOSE round the
# ring); the ring serves the next client. Stand-in compute keeps the generation going.
S=$TMP/stub
ring_up "$S" --stub --layers 6 --embd 1024 --stages 3
"$KVCTL" generate --ring "$S" --ids --tokens 1,2,3 -n 3000 --temp 0 --ignore-eos > "$TMP/long" 2>&1 &
G=$!
EXTRA_PIDS="$EXTRA_PIDS $G"
for i in $(seq 100); do [ -s "$TMP/long" ] && break; sleep 0.05; done
[ -s "$TMP/long" ] || fail "the long generation printed nothing"
kill -TERM $G
wait $G 2>/dev/null
wait_for 10 ring_idle "$S" || fail "$(ring_sessions "$S") sessions still open after the client went away"
grep -q "ends: client gone" "$S/rank-0/kvd.log" || fail "rank 0 did not log the client's departure"
out=$("$KVCTL" generate --ring "$S" --ids --tokens 1,2,3 -n 5 --temp 0 --ignore-eos 2>"$TMP/err") ||
    fail "the next client: $(cat "$TMP/err")"
[ "$(echo "$out" | wc -w)" = 5 ] || fail "the next client got '$out'"
ring_down "$S"
echo "ok a client gone mid-generation ends its session everywhere"

# The stand-in compute exists only in the test build of kvd: the production kvd refuses
# --stub, and `kvctl ring up --stub` with it says which binary to use.
"$KVD" stage --help | grep -q -- "--stub" && fail "the production kvd offers --stub"
"$KVD_STUB" stage --help | grep -q -- "--stub" || fail "the test kvd does not offer --stub"
"$KVD" stage --stub --manifest "$S/ring.json" --rank 0 > /dev/null 2> "$TMP/err" && fail "kvd stage --stub started"
grep -q "unknown option '--stub'" "$TMP/err" || fail "kvd stage --stub: '$(cat "$TMP/err")'"
P=$TMP/prod
RINGS="$RINGS $P"
if KVD_BIN= "$KVCTL" ring up --dir "$P" --stub --layers 4 --embd 64 --stages 2 > "$TMP/up" 2>&1; then
    fail "ring up --stub started the production kvd"
fi
grep -q "KVD_BIN=build/tests/kvd-stub" "$TMP/up" || fail "ring up --stub on the production kvd: $(cat "$TMP/up")"
ring_down "$P"
echo "ok --stub only in the test build of kvd (build/tests/kvd-stub)"

# --batch-wait-us reaches every stage; a lone session's steps then each wait the budget for
# company, and the status's batches object reports those waits (and batches with company).
W=$TMP/wait
ring_up "$W" --stub --layers 4 --embd 64 --stages 2 --batch-wait-us 3000
for r in 0 1; do
    tr '\0' ' ' < "/proc/$(rank_pid "$W" $r)/cmdline" | grep -q -- "--batch-wait-us 3000 " ||
        fail "rank $r runs without --batch-wait-us 3000: $(tr '\0' ' ' < "/proc/$(rank_pid "$W" $r)/cmdline")"
done
"$KVCTL" generate --ring "$W" --ids --tokens 1,2,3 -n 10 --temp 0 --ignore-eos > /dev/null 2> "$TMP/err" ||
    fail "generate on the waiting ring: $(cat "$TMP/err")"
"$KVCTL" status --ring "$W" --json > "$TMP/wst" || fail "status of the waiting ring"
python3 - "$TMP/wst" <<'PY' || fail "waits of a lone session: $(cat "$TMP/wst")"
import json, sys
for line in open(sys.argv[1]):
    s = json.loads(line)
    b = s["batches"]
    assert b["wait_budget_ms"] == 3, b
    # every step of the one session waited the whole budget (no company came), and not
    # unboundedly longer
    assert b["waited_steps"] >= 10 and b["step_runs"] >= 10, b
    assert 2.9 <= b["mean_wait_ms"] <= b["max_wait_ms"] < 2000, b
    assert 0 < b["mean_run_ms"] <= b["max_run_ms"], b
PY
pids=""
for i in 1 2 3 4; do
    "$KVCTL" generate --ring "$W" --ids --tokens 1,$i -n 20 --temp 0 --ignore-eos > "$TMP/w.$i" 2>&1 &
    pids="$pids $!"
done
for p in $pids; do wait $p || fail "a concurrent generate on the waiting ring failed"; done
"$KVCTL" status --ring "$W" --json > "$TMP/wst" || fail "status of the waiting ring"
python3 - "$TMP/wst" <<'PY' || fail "no batch with company on the waiting ring: $(cat "$TMP/wst")"
import json, sys
for line in open(sys.argv[1]):
    b = json.loads(line)["batches"]
    assert b["runs"] > 0 and b["max_steps"] >= 2, b
    assert b["max_wait_ms"] < 2000, b
PY
ring_down "$W"
echo "ok kvctl ring up --batch-wait-us reaches the stages; status reports the steps' waits"
echo "PASS"

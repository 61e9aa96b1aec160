#!/bin/bash
# A standby that holds no window pulls the dead rank's window before it takes the rank
# (docs/ring.md, "Repair"): a 3-stage loopback ring whose stages and standby pull their windows
# from a seeder (kvctl ring up --window-from: the standby gets no --model); 4 concurrent greedy
# generations, SIGKILL of the middle stage: the standby, dialled, pulls rank 1's window in the
# background, takes the rank on the next dial, and every text equals its one-process text with
# no client error; the standby's log says where the window came from.
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$(need_model TinyLLama-v0-q4_0.gguf) || exit 1
spid=""
cleanup_pull() { [ -n "$spid" ] && kill "$spid" 2>/dev/null; }
at_exit cleanup_pull
"$B/kvd" seeder --serve "$M" --listen 127.0.0.1:0 --port-file "$TMP/seed.port" 2> "$TMP/seeder.log" &
spid=$!
wait_file "$TMP/seed.port" 10 || fail "seeder did not start: $(cat "$TMP/seeder.log")"
D=$TMP/ring
ring_up "$D" --model "$M" --stages 3 --standby 1 --window-from "http://127.0.0.1:$(cat "$TMP/seed.port")"
! grep -qx -- "--model" <(tr '\0' '\n' < "/proc/$(cat "$D/standby-0/kvd.pid")/cmdline") ||
    fail "the standby was given --model"
ls "$D"/standby-0/window-* > /dev/null 2>&1 && fail "the standby holds a window before it takes a rank"

prompts=("Once upon a time" "The little dog" "Lily and Tom went to the park" "One day, a bird")
for i in 0 1 2 3; do
    "$KVCTL" generate -m "$M" -p "${prompts[$i]}" -n 800 --temp 0 --ignore-eos \
        > "$TMP/one.$i" 2>/dev/null || fail "one-process generate $i"
done
pid=$(serving_pid "$D" 1)
pids="" args=""
for i in 0 1 2 3; do
    "$KVCTL" generate --ring "$D" -p "${prompts[$i]}" -n 800 --temp 0 --ignore-eos \
        > "$TMP/r.$i" 2> "$TMP/r.err.$i" &
    pids="$pids $!"
    args="$args $!:$TMP/r.$i:$TMP/r.err.$i"
done
EXTRA_PIDS="$EXTRA_PIDS $pids"
read -r ms running < <(kill_measure "$pid" $((RANDOM % 200)) $args)
[ "$running" -gt 0 ] || fail "no session was running at the kill (the test's timing)"
i=0
for p in $pids; do
    wait "$p" || fail "session $i failed: $(cat "$TMP/r.err.$i")"
    ! grep -q "error" "$TMP/r.err.$i" || fail "session $i saw an error: $(cat "$TMP/r.err.$i")"
    cmp -s "$TMP/one.$i" "$TMP/r.$i" || fail "session $i differs from its one-process text"
    i=$((i + 1))
done
grep -q "window of rank 1 pulled from http://127.0.0.1:" "$D/standby-0/kvd.log" ||
    fail "the standby's log does not say it pulled rank 1's window: $(tail -5 "$D/standby-0/kvd.log")"
ls "$D"/standby-0/window-* > /dev/null 2>&1 || fail "no pulled window in the standby's state directory"
"$KVCTL" status --ring "$D" | grep -q "^standby 0 .* serves rank 1" ||
    fail "standby 0 does not serve rank 1: $("$KVCTL" status --ring "$D")"
echo "ok rank 1 killed with $running of 4 sessions running; the standby pulled its window" \
     "($(grep -o "pulled from [^ ]* in [0-9]* ms" "$D/standby-0/kvd.log")) and took over;" \
     "kill -> every running session's next token: $ms ms; every text as one process"
wait_for 10 ring_idle "$D" || fail "$(ring_sessions "$D") sessions left on the nodes"
finish

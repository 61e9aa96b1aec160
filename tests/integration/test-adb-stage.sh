#!/bin/bash
# scripts/adb-stage against tests/lib/fake-adb (a directory as the "device", its shell run here):
# it pushes kvd, the window and the manifest, starts `kvd stage --foreground` through the
# adb shell, and that stage serves its rank of a ring (greedy tokens equal one process's);
# SIGTERM to the adb shell stops kvd cleanly (exit 0) and the ring sees the link close; it
# never asks adb to forward or reverse a port; its arguments are checked before adb is used.
. "$(dirname "$0")/../lib/ring_lib.sh"
need_exec "$KVD" "$KVCTL"
M=$(need_model stories260K.gguf) || exit 1
export ADB=$ROOT/tests/lib/fake-adb FAKE_ADB_ROOT=$T/device FAKE_ADB_LOG=$T/adb.log
DEV=$FAKE_ADB_ROOT/data/local/tmp/kvasir
mkdir -p "$FAKE_ADB_ROOT"

# Bad arguments: refused before any adb call.
scripts/adb-stage --kvd "$KVD" --window "$M" --rank 1 > "$T/o" 2>&1 && fail "no --manifest accepted"
grep -q "needs --window, --manifest and --rank" "$T/o" || fail "missing --manifest not named: $(cat "$T/o")"
scripts/adb-stage --kvd "$T/none" > "$T/o" 2>&1 && fail "a missing binary accepted"
grep -q "cannot read $T/none" "$T/o" || fail "missing binary not named: $(cat "$T/o")"
[ ! -s "$FAKE_ADB_LOG" ] || fail "adb used before the arguments were checked: $(cat "$FAKE_ADB_LOG")"

# A 2-stage ring whose rank 1 then moves to the "phone", with its node key and a mini-GGUF.
d=$T/ring
ring_up "$d" --model "$M" --stages 2 -t 1
wait_linked "$d" 2 20 || fail "ring did not link"
one=$("$KVCTL" generate -m "$M" --ids --tokens 1,400,300,200,100 -n 16 --temp 0 2>/dev/null) || fail "one process"
p1=$(rank_pid "$d" 1)
kill -TERM "$p1"
wait_for 10 pid_gone $p1 || fail "rank 1 did not stop"
layers=$(python3 -c 'import json,sys; print("%d:%d" % tuple(json.load(open(sys.argv[1]))["ranks"][1]["layers"]))' "$d/ring.json")
"$KVCTL" slice "$M" --layers "$layers" -o "$T/window-1.gguf" > /dev/null || fail "slice $layers"
mkdir -p "$DEV/state" && cp "$d/rank-1/node.key" "$DEV/state/node.key"
scripts/adb-stage --kvd "$KVD" --window "$T/window-1.gguf" --manifest "$d/ring.json" --rank 1 \
    --catalog "$d/catalog.json" -t 1 > "$T/phone.log" 2>&1 &
phone=$!
PIDS="$PIDS $phone"
# kvctl status asks each rank's control socket: the phone's is in its state directory.
ln -sfn "$DEV/state/kvd.sock" "$d/rank-1/kvd.sock"
wait_linked "$d" 2 30 || fail "the adb stage did not link: $(tail -n 5 "$T/phone.log")"
for f in kvd window.gguf ring.json catalog.json; do [ -s "$DEV/$f" ] || fail "$f not pushed to the device"; done
cmp -s "$DEV/window.gguf" "$T/window-1.gguf" || fail "the pushed window differs"
[ -x "$DEV/kvd" ] || fail "kvd not made executable on the device"
grep -q "^shell .*exec ./kvd 'stage' '--foreground' '--manifest' 'ring.json' '--rank' '1' '--window' 'window.gguf'" "$FAKE_ADB_LOG" ||
    fail "kvd stage --foreground not started: $(cat "$FAKE_ADB_LOG")"
grep -Eq "^(-s [^ ]+ )?(forward|reverse)" "$FAKE_ADB_LOG" && fail "adb-stage forwarded a port: $(cat "$FAKE_ADB_LOG")"
out=$("$KVCTL" generate --ring "$d" --ids --tokens 1,400,300,200,100 -n 16 --temp 0 2>"$T/err") ||
    fail "generate through the adb stage: $(cat "$T/err")"
[ "$out" = "$one" ] || fail "tokens through the adb stage '$out' vs one process '$one'"
echo "ok ring through the adb stage"

# The phone goes away: SIGTERM to the adb shell (kvd itself, exec'ed) stops it cleanly.
kill -TERM "$phone"
rc=0
wait "$phone" || rc=$?
[ "$rc" = 0 ] || fail "kvd on the device exited $rc on SIGTERM: $(tail -n 5 "$T/phone.log")"
wait_for 10 bash -c "! $KVCTL status --ring $d --json 2>/dev/null | grep -q '\"linked\":true'" ||
    fail "rank 0 still reports its link up after the phone stopped"
echo "ok clean stop"

# The second form: kvd's own arguments, run in the device directory.
out=$(scripts/adb-stage --kvd "$KVD" -- --version 2>/dev/null) || fail "adb-stage -- --version"
[ "$out" = "$("$KVD" --version)" ] || fail "kvd --version through adb-stage: '$out'"
grep -q "^shell cd '/data/local/tmp/kvasir' && exec ./kvd '--version'" "$FAKE_ADB_LOG" || fail "passthrough form: $(tail -n 2 "$FAKE_ADB_LOG")"
echo "ok passthrough"
finish

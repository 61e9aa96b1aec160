#!/bin/bash
# test-market-move.sh — the join role's hysteresis (docs/market.md, "Moving"): a node moves to
# a free window only when it is worth clearly more (--move-ratio) for a sustained time
# (--move-after-s), with no session open on its stage; otherwise it stays.
# Three nodes hold windows of 2, 2 and 1 layers (equal rewards, so worth 2, 2 and 1 per token).
#  * while the ring serves (rewards move with demand, equally for every window) nobody moves;
#  * kill -9 the holder of a 2-layer window: once its lease lapses, the other 2-layer node (a
#    free window worth 1x its own) stays, the 1-layer node (worth 2x) moves there after the
#    hold time, releasing its window, which shows uncovered at once and which a fourth node
#    then takes; the ring serves the one-process generation again.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"

market_up
declare -A JPID
join() {
    "$KVD" join --market "$M" --model "$ID" --state-dir "$T/$1" --mem 1800000 -t 1 --jitter-ms 300 \
        --move-ratio 1.5 --move-after-s 4 >"$T/join-$1.log" 2>&1 &
    JPID[$1]=$!
    PIDS="$PIDS $!"
}
for n in a b c; do join $n; done
wait_for 60 ring_ready || fail "no complete ring within 60 s: $(cat "$T/cov.json")"
wait_for 20 test -s "$T/a/manifest.json" -a -s "$T/b/manifest.json" -a -s "$T/c/manifest.json" ||
    fail "not every node got the manifest"
holder() { # holder WINDOW: the node (a..d) whose key holds it in $T/cov.json
    local k
    k=$(python3 -c '
import json,sys
w=json.load(open(sys.argv[1]))["models"][0]["windows"][int(sys.argv[2])]
print(w["stages"][0]["node"] if w["stages"] and w["state"]!="uncovered" else "")' "$T/cov.json" "$1")
    for n in a b c d; do [ -d "$T/$n" ] && [ "$(key_of $n)" = "$k" ] && { echo $n; return; }; done
}
layers() { python3 -c '
import json,sys
w=json.load(open(sys.argv[1]))["models"][0]["windows"][int(sys.argv[2])]; print(w["layers"][1]-w["layers"][0])' "$T/cov.json" "$1"; }
[ "$(layers 0) $(layers 1) $(layers 2)" = "2 2 1" ] || fail "windows of $(layers 0) $(layers 1) $(layers 2) layers, expected 2 2 1"
H0=$(holder 0) H1=$(holder 1) L=$(holder 2)
R0=$(rank0 a b c)
want=$("$KVCTL" generate -m "$S" --tokens 1,50,100,200,300 -n 12 --temp 0 --ids 2>/dev/null)
serves() {
    got=$("$KVCTL" generate --ring "unix:$T/$R0/kvd.sock" --client-key "$CKEY" --tokens 1,50,100,200,300 -n 12 --temp 0 \
          --ids 2>"$T/gen.err")
    [ -n "$got" ] && [ "$got" = "$want" ]
}
wait_for 30 serves || fail "the ring gives '$got' ($(cat "$T/gen.err")), one process '$want'"
# rewards change with demand while it serves, for every window alike: nobody moves
for i in 1 2 3; do serves || fail "generation $i: '$got'"; done
sleep 6
ring_ready || fail "the ring came apart while serving: $(cat "$T/cov.json")"
[ "$(holder 0) $(holder 1) $(holder 2)" = "$H0 $H1 $L" ] ||
    fail "windows changed hands with only demand changing: $H0 $H1 $L -> $(holder 0) $(holder 1) $(holder 2)"
grep -q "moving" "$T"/join-*.log && fail "a node moved: $(grep -h moving "$T"/join-*.log)"
echo "ok   while rewards move with demand (equally for all windows) nobody hops"

# free a 2-layer window that is not rank 0's
if [ "$H1" != "$R0" ]; then VICTIM=$H1 VW=1 STAY=$H0; else VICTIM=$H0 VW=0 STAY=$H1; fi
kill -9 "${JPID[$VICTIM]}"
moved() { grep -q "moving from window 2 to window $VW" "$T/join-$L.log"; }
wait_for 40 moved || fail "node $L (1 layer) did not move to the freed 2-layer window $VW: $(grep -h "worth\|moving" "$T/join-$L.log")"
# released, not lapsed: window 2 is free for anyone at once, with no grace entry for node L
# (the node logs its move before its release reaches the market: wait for the release, by the
# clock less than the 6 s lease, after which a window never released would lapse and, its
# grace over, look free too)
released() {
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" && python3 -c '
import json,sys
w=json.load(open(sys.argv[1]))["models"][0]["windows"][2]
sys.exit(0 if w["state"]=="uncovered" and not any(s["state"]=="grace" for s in w["stages"]) else 1)' "$T/cov.json"
}
wait_clock 4 released || fail "the released window 2 is not simply free: $(cat "$T/cov.json")"
grep -q "worth 2.00x ours" "$T/join-$L.log" || fail "node $L's log does not give the ratio"
grep -q "moving\|worth" "$T/join-$STAY.log" &&
    fail "node $STAY (2 layers) considered a window worth as much as its own: $(grep -h "moving\|worth" "$T/join-$STAY.log")"
echo "ok   the 1-layer node moved to the freed 2-layer window after the hold time; the 2-layer node stayed"
join d
wait_for 60 ring_ready || fail "no complete ring after the fourth node joined: $(cat "$T/cov.json")"
[ "$(holder 2)" = d ] && [ "$(holder $VW)" = "$L" ] && [ "$(holder $(( 1 - VW )))" = "$STAY" ] ||
    fail "after the move: windows held by $(holder 0) $(holder 1) $(holder 2)"
[ "$(ls "$T/$L"/window-*.gguf | wc -l)" = 1 ] || fail "node $L kept its old window: $(ls "$T/$L")"
wait_for 40 serves || fail "after the move the ring gives '$got' ($(cat "$T/gen.err")), one process '$want'"
echo "ok   a fourth node took the released window and the ring serves again: $got"
finish

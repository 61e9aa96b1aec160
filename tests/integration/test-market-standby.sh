#!/bin/bash
# test-market-standby.sh — a market ring repairs itself like a manifest ring (docs/market.md,
# "Standbys"):
#  * three `kvd join` nodes form a ring; a fourth, joining once every window is covered, stands
#    by for the middle window: it pulls that window ahead, and the ring's roster (beside the
#    manifest, whose hash the links check) names it; every stage takes the roster in without a
#    restart, and the manifest stays the one the ring runs;
#  * the npm openai client, pointed at the API that `kvctl market status` names, runs 8
#    concurrent streamed sessions (greedy and seeded, every sampling parameter given) with the
#    market's paying client's key; the node serving the middle rank is killed with -9 once every
#    session has streamed a few chunks; every session's text equals its one-process text
#    (`kvctl generate -m`) and no client sees an error;
#  * the standby took the rank over without the market in the loop: rank 0 counts the resumed
#    sessions, the map shows the standby holding the window (taken over from the manifest's
#    node) with the ring still listed on the same manifest, and `kvctl market status` says so;
#  * the killed node, started again, stands by (its stage waits for its rank; it does not start
#    a second stage for the rank the manifest still names it for).
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"
. "$(dirname "$0")/../lib/standby_lib.sh"

# leases of 12 s (heartbeats every 3 s): a stage silent for 8 s (half the lease and 2 s) is
# shown silent for the 4 s before its lease lapses
MARKET_ARGS="--lease-s 12"
ring_of_three 1
MID=$VICTIM
echo "ok   three nodes form a ring (manifest ${SHA:0:16}); node $MID serves the middle rank"

# ---- a fourth node stands by
join_api d
standing_by() { # d's standby lease is in the map with its endpoint, and every stage read the roster
    grep -qs "standby stage for rank 1 (window 1) started" "$T/join-d.log" || return 1
    for n in a b c; do grep -qs "roster: 1 standby(s) for this ring" "$T/join-$n.log" || return 1; done
    "$KVCTL" market status "$M" --model "$ID" --json >"$T/cov.json" 2>/dev/null &&
    python3 - "$T/cov.json" "$(key_of d)" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))["models"][0]
sb = c["windows"][1]["standbys"]
sys.exit(0 if len(c["rings"]) == 1 and [s["node"] for s in sb] == [sys.argv[2]] and sb[0]["state"] == "standby" else 1)
PY
}
wait_for 30 standing_by || fail "node d does not stand by for window 1 with every stage knowing it: $(grep -h 'standby\|roster' "$T"/join-*.log | tail -8; cat "$T/cov.json")"
[ "$(sha_of)" = "$SHA" ] || fail "the manifest changed when a standby came: $(sha_of) vs $SHA"
grep -q "stage of rank" "$T/join-d.log" && fail "node d started a rank's stage: $(grep 'stage of rank' "$T/join-d.log")"
for n in a b c; do
    [ "$(grep -c 'stage of rank .* started' "$T/join-$n.log")" = 1 ] ||
        fail "node $n's stage restarted when the standby came: $(grep 'started' "$T/join-$n.log")"
done
"$KVCTL" market status "$M" --model "$ID" >"$T/status.txt" || fail "kvctl market status failed"
grep -qE "^ +standby +$(key_of d | cut -c1-16) +tcp://127.0.0.1:[0-9]+" "$T/status.txt" ||
    fail "kvctl market status does not list the standby: $(cat "$T/status.txt")"
echo "ok   node d stands by for window 1 (pulled ahead), named in the roster; no stage restarted, the manifest is the same"

# ---- 8 sessions through the API the map names; the middle node killed during them
api_up
R0=$(rank0 a b c)
sessions_killing "$MID" "$R0" 100
echo "ok   8 concurrent sessions through the API at $API, node $MID killed with -9 while $RUNNING ran: every text equals its one-process text, no client error"

# ---- the standby holds the rank; the map shows it
wait_for 30 took_over 1 d "$MID" || fail "the map does not show node d holding window 1 on the same manifest: $(cat "$T/cov.json")"
"$KVCTL" market status "$M" --model "$ID" >"$T/status.txt" || fail "kvctl market status failed"
grep -qE "^  1 +\\[2, 4\\) +active .* $(key_of d | cut -c1-16) " "$T/status.txt" &&
    grep -q "took over from $(key_of "$MID" | cut -c1-16)" "$T/status.txt" ||
    fail "kvctl market status does not show the takeover: $(cat "$T/status.txt")"
wait_for 10 grep -q "took rank 1 over; the market made this node the holder of window 1" "$T/join-d.log" ||
    fail "node d does not say it holds the window: $(grep -v pull: "$T/join-d.log" | tail -5)"
echo "ok   node d holds window 1 (taken over from node $MID), the ring runs on the same manifest"

# ---- the killed node again: a standby now
join_api "$MID"
back() {
    grep -q "standby stage for rank 1 (window 1) started" "$T/join-$MID.log" &&
    python3 - "$ROOT/tests/lib" "$T/$MID/kvd.sock" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import kvd_ctl
s = kvd_ctl.status(sys.argv[2])
sys.exit(0 if s.get("waiting") and s.get("rank", -1) == -1 else 1)
PY
}
wait_for 30 back || fail "node $MID, started again, is not a waiting standby: $(grep -v pull: "$T/join-$MID.log" | tail -5)"
[ "$(grep -c 'stage of rank' "$T/join-$MID.log")" = 1 ] ||
    fail "node $MID started a stage for its old rank again: $(grep 'stage of rank' "$T/join-$MID.log")"
echo "ok   node $MID, started again, stands by for window 1"

# ---- a silent lease is not active: the last rank's join process stopped (its stage still
# serves) sends no heartbeat; the map shows its window silent and the ring as no ring, with
# the reason, until it beats again
LAST=""
for n in a b c d; do [ "$n" != "$MID" ] && [ "$(rank_of $n 2>/dev/null)" = 2 ] && LAST=$n; done
[ -n "$LAST" ] || fail "no node runs rank 2"
kill -STOP "${JPID[$LAST]}"
silent() {
    "$KVCTL" market status "$M" --model "$ID" >"$T/status.txt" 2>/dev/null &&
    grep -qE "^  2 +\[4, 5\) +silent " "$T/status.txt" &&
    grep -q "not a ring: .*window 2's stage (node $(key_of $LAST | cut -c1-16)...) has sent no heartbeat for" "$T/status.txt"
}
wait_for 12 silent || { kill -CONT "${JPID[$LAST]}"; fail "the stopped node's window is not shown silent: $(cat "$T/status.txt")"; }
kill -CONT "${JPID[$LAST]}"
wait_for 30 ring_ready || fail "the ring is not listed again after node $LAST's heartbeats resumed: $(cat "$T/cov.json")"
echo "ok   a node that stopped heartbeating: its window shown silent and its ring as no ring, until it beats again"

# ---- credit: every session of the generation is paid in full, nothing held back; rank 1's
# share of each goes to the node that ran the session to its end (the standby for those the
# kill broke: its receipts cover their whole history, and the stages around it kept one
# receipt across the break)
wait_for 60 settled_in_full "$SHA" || fail "the sessions are not all paid in full: $(cat "$T/settled.txt")"
rank_credit "$SHA" 1 2 d "$MID"   # window 1: layers [2, 4)
echo "ok   every session paid in full; rank 1's share to whichever node ran each session to its end"
finish

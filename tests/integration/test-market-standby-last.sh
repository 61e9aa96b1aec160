#!/bin/bash
# test-market-standby-last.sh — a market ring survives the death of its last rank's node, whose
# stage samples every token (docs/market.md, "Standbys"):
#  * three `kvd join` nodes form a ring; a fourth, whose memory fits the last window and not
#    the middle one, stands by for the last window (named in the roster, the window pulled
#    ahead);
#  * 8 concurrent streamed sessions through the ring's API (the npm openai client, greedy and
#    seeded with every sampling parameter given); the last rank's node is killed with -9 once
#    every session has streamed a few chunks; every text equals its one-process text and no
#    client sees an error: the standby took the rank over and rank 0 replayed the sessions,
#    the seeded ones continuing their draws;
#  * the map shows the standby holding the last window, taken over from the killed node, which,
#    started again, stands by;
#  * every session of the generation is paid in full, nothing held back: the standby's sent
#    side and rank 0's received side of the last edge agree although the killed node sampled
#    the tokens before the break (both ends clear those TOKEN leaves at the replay), and the
#    last rank's share of each session the kill broke goes to the standby;
#  * the market audits every node's credited work (--audit-rate 1): the standby answers from
#    its row log, where the replay's cleared leaves are recorded, and its openings match the
#    root it signed; no audit fails.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"
. "$(dirname "$0")/../lib/standby_lib.sh"

# every credited receipt audited (one at a time per node), recomputed with the whole model
MARKET_ARGS="--lease-s 12 --audit-rate 1 --audit-deadline-s 60 --verify-model $S"
ring_of_three 2
LAST=$VICTIM
# the standby's memory: the last window's, below the middle one's (so it stands by for the last)
MEM=$(python3 -c '
import json,sys
w = json.load(open(sys.argv[1]))["models"][0]["windows"]
m1, m2 = w[1]["mem_bytes"], w[2]["mem_bytes"]
print(m2 if m2 < m1 else "")' "$T/cov.json")
[ -n "$MEM" ] || fail "the last window is not smaller than the middle one: $(cat "$T/cov.json")"
join_api d "$MEM"
standing_by() {
    grep -qs "standby stage for rank 2 (window 2) started" "$T/join-d.log" || return 1
    for n in a b c; do grep -qs "roster: 1 standby(s) for this ring" "$T/join-$n.log" || return 1; done
}
wait_for 30 standing_by || fail "node d does not stand by for the last window: $(grep -h 'standby\|roster' "$T"/join-*.log | tail -8)"
echo "ok   node d stands by for the last window (node $LAST serves it), named in every stage's roster"

api_up
sessions_killing "$LAST" "$(rank0 a b c)" 200
echo "ok   8 sessions through the API, the last rank's node killed with -9 while $RUNNING ran: every text equals its one-process text, no client error"

wait_for 30 took_over 2 d "$LAST" || fail "the map does not show node d holding the last window on the same manifest: $(cat "$T/cov.json")"
echo "ok   node d holds the last window (taken over from node $LAST), the ring runs on the same manifest"
# the killed node, started again on its state directory, sends the receipts it had not sent
# before the kill (sessions that ended before it) and stands by
join_api "$LAST"
wait_for 30 grep -q "standby stage for rank [12] (window [12]) started" "$T/join-$LAST.log" ||
    fail "node $LAST, started again, does not stand by: $(grep -v pull: "$T/join-$LAST.log" | tail -5)"
echo "ok   node $LAST, started again, stands by"

# ---- credit: every session paid in full, the last rank's share to the node that ran it to its end
wait_for 60 settled_in_full "$SHA" || fail "the sessions are not all paid in full: $(cat "$T/settled.txt")"
rank_credit "$SHA" 2 1 d "$LAST"   # window 2: layers [4, 5)
echo "ok   every session paid in full; the last rank's share to whichever node ran each session to its end"
short() { echo "${1:0:16}"; }
KD=$(key_of d)
# its openings are checked against the root it signed either way: a pass, or, where the audited
# position lies in a replayed history longer than an answer holds (the kill came late), an
# inconclusive run of proven empty leaves
wait_for 60 grep -q "audit [0-9a-f]* of node $(short "$KD")\.\.\. (rank 2, session [0-9a-f]*, position [0-9]*): \(pass\|inconclusive\)" "$T/market.log" ||
    fail "no audit of the standby's work as the last rank was judged: $(grep "audit.*$(short "$KD")" "$T/market.log" | tail -3)"
grep -q "audit [0-9a-f]* of node .*: fail" "$T/market.log" &&
    fail "an audit failed: $(grep "audit [0-9a-f]* of node .*: fail" "$T/market.log")"
echo "ok   no audit fails, the standby's as the last rank among them ($(grep -c "audit [0-9a-f]* of node .*: pass" "$T/market.log") passed, $(grep -c "audit [0-9a-f]* of node .*: inconclusive" "$T/market.log") inconclusive)"
finish

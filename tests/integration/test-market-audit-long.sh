#!/bin/bash
# test-market-audit-long.sh — audits of the last rank's work on a prompt longer than an audit's
# answer can open (docs/market.md, "Audits"). The last rank samples nothing from a prompt's rows,
# so its audit opens the empty leaves from the audited position to its first token, and its
# inputs from the range's start to there: on a real model a prompt of a few hundred tokens
# would take more than the API's 1 MiB body, the node could not answer, and the audit would
# fail an honest node. The market caps the opening at the positions that fit
# (--audit-answer-kib, here 32 KiB: 9 positions of the test model, at 64 x 4 / 3 x 4 bytes of
# row and two 24-hash proofs of 67 bytes a position, and 64 more) and takes a run of empties
# that reaches the cap as inconclusive (nothing judged, nothing lost). Three honest `kvd join` nodes, every credited receipt audited
# (--audit-rate 1) and recomputed (--verify-model):
#  * a session with a 120-token prompt: the last rank's audit stops at the cap, inconclusive,
#    its answer within the cap; the other ranks' audits pass on recomputation;
#  * a session with a short prompt and 40 generated tokens: the last rank's audit reaches a
#    sampled token and passes on recomputation;
#  * the market restarted with room for 579 positions (2 MiB): a 480-token prompt's audit of the
#    last rank (480 positions, more than one request holds) goes in parts and passes on
#    recomputation;
#  * sessions with prompt-lookup drafts and logits, greedy and seeded: the last rank's audit judges
#    a TOKEN of several tokens, compares its logits (opened beside the TOKEN's summary, which
#    holds their hash) and finds its token in the set the session's sampling draws from; rank 0's checks the ids it fed against the TOKENs it received, drafts
#    they accepted included; they pass;
#  * no audit fails, no node loses its lease or its credit for it.
. "$(dirname "$0")/../lib/lib.sh"
. "$(dirname "$0")/../lib/market_lib.sh"

MARKET_ARGS="--audit-rate 1 --audit-deadline-s 60 --audit-answer-kib 32 --verify-model $S"
market_up
for n in a b c; do
    "$KVD" join --market "$M" --model "$ID" --state-dir "$T/$n" --mem 1800000 -t 1 --jitter-ms 300 \
        >"$T/join-$n.log" 2>&1 &
    PIDS="$PIDS $!"
done
wait_for 60 ring_ready || fail "no complete ring within 60 s: $(cat "$T/cov.json")"
sha_now() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["models"][0]["rings"][0]["manifest_sha256"])' "$T/cov.json"; }
SHA=$(sha_now)
R0=$(rank0 a b c)
LAST=""
for n in a b c; do [ "$(rank_of $n)" = 2 ] && LAST=$n; done
[ -n "$R0" ] && [ -n "$LAST" ] || fail "no rank 0 or last rank"
short() { echo "${1:0:16}"; }
KL=$(short "$(key_of "$LAST")")

audited() { # SESSION-ID RANK: the market's verdict on that rank's audit of the session
    grep "audit [0-9a-f]* of node [0-9a-f]*\.\.\. (rank $2, session $1, position [0-9]*): " "$T/market.log" | tail -1
}
ends() { grep -c "session [0-9a-f]\{16\} ends" "$T/join-$R0.log"; }
ends_past() { [ "$(ends)" -gt "$1" ]; }
# the id of the session that ended after N had (rank 0's node logs the end just after the
# client has its last token, so it is waited for)
ended_after() {
    wait_for 20 ends_past "$1" || return 1
    grep -o "session [0-9a-f]\{16\} ends" "$T/join-$R0.log" | sed -n "$(($1 + 1))p" | cut -d' ' -f2
}
gen() { # TOKENS N: one session through rank 0; prints its id
    local before
    before=$(ends)
    "$KVCTL" generate --ring "unix:$T/$R0/kvd.sock" --client-key "$CKEY" --tokens "$1" -n "$2" \
        --temp 0 --ignore-eos --ids >"$T/gen.out" 2>"$T/gen.err" || fail "generation failed: $(cat "$T/gen.err")"
    ended_after "$before"
}
has_audit() { [ -n "$(audited "$1" "$2")" ]; }

# ---- a 120-token prompt: the last rank's audit is capped and passes
LONG=$(python3 -c 'print(",".join(str(1 + (i * 37) % 500) for i in range(120)))')
S1=$(gen "$LONG" 4)
[ -n "$S1" ] || fail "no session id in rank 0's node's log"
for r in 0 1 2; do
    wait_for 60 has_audit "$S1" $r || fail "no audit of rank $r's work on session $S1: $(grep "audit" "$T/market.log" | tail -5)"
done
V=$(audited "$S1" 2)
echo "$V" | grep -q "): inconclusive (no token sampled in the positions an answer holds: nothing judged; [0-9]* to 8 opened empty)" ||
    fail "the last rank's audit of the long prompt did not stop at the cap, inconclusive: $V"
for r in 0 1; do
    audited "$S1" $r | grep -q "): pass\( (.*)\)\?$" || fail "rank $r's audit of session $S1: $(audited "$S1" $r)"
done
grep -q "audit [0-9a-f]* of session $S1: answered (inconclusive: no token in what an answer holds" "$T/join-$LAST.log" ||
    fail "the last rank's node does not log its answer as inconclusive: $(grep audit "$T/join-$LAST.log" | tail -3)"
echo "ok   a 120-token prompt: the last rank's audit opens at most 9 positions, inconclusive ($(echo "$V" | grep -o 'position [0-9]*'))"

# ---- a short prompt and 40 tokens: the last rank's audit reaches a token and is recomputed
S2=$(gen 1,50,100,200 40)
[ -n "$S2" ] && [ "$S2" != "$S1" ] || fail "no new session id in rank 0's node's log"
wait_for 60 has_audit "$S2" 2 || fail "no audit of the last rank's work on session $S2"
audited "$S2" 2 | grep -q "): pass\( (.*)\)\?$" || fail "the last rank's audit of session $S2: $(audited "$S2" 2)"
echo "ok   a short prompt: the last rank's audit reaches a sampled token and passes on recomputation"

# ---- the market again, with room for 579 positions (2 MiB): a 480-token prompt's audit of the
# last rank opens its 480 positions, too many for one request: the node sends the answer in
# parts, the market keeps them until the last and recomputes the token at the prompt's end
MPORT=$(cat "$T/market.port")
kill_dead "$MARKET_PID"
MARKET_ARGS="--audit-rate 1 --audit-deadline-s 60 --audit-answer-kib 2048 --verify-model $S"
market_start "$MPORT"
wait_for 30 ring_ready || fail "the ring is not whole after the market's restart: $(cat "$T/cov.json")"
LONG=$(python3 -c 'print(",".join(str(1 + (i * 37) % 500) for i in range(480)))')
S3=$(gen "$LONG" 4)
[ -n "$S3" ] && [ "$S3" != "$S2" ] || fail "no new session id in rank 0's node's log"
wait_for 60 has_audit "$S3" 2 || fail "no audit of the last rank's work on session $S3: $(grep audit "$T/market.log" | tail -4)"
audited "$S3" 2 | grep -q "): pass\( (.*)\)\?$" || fail "the last rank's audit of session $S3: $(audited "$S3" 2)"
grep -q "audit [0-9a-f]*: answer of [0-9]* bytes sent in [2-9] parts" "$T/join-$LAST.log" ||
    fail "the last rank's node did not send its answer in parts: $(grep audit "$T/join-$LAST.log" | tail -3)"
echo "ok   a 480-token prompt: the last rank's answer goes in parts ($(grep -o "answer of [0-9]* bytes sent in [0-9]* parts" "$T/join-$LAST.log" | tail -1)) and passes on recomputation"

# ---- drafting (docs/ring.md, "Drafting"): a TOKEN carries several tokens (the drafts it accepted
# and one more) and, with logits asked for, each one's logits; its leaf is a summary of it
# (docs/market.md, "Audits"). A prompt whose greedy continuation repeats it, so prompt-lookup
# drafts are accepted; greedy and seeded sessions with logits, until an audit of the last rank
# judged a TOKEN of several tokens with its logits compared, and one of rank 0 checked the ids
# a TOKEN's accepted drafts gave against it. Every audit of them passes.
gen_p() { # TEXT N ARGS...: one session from a text prompt; prints its id
    local text=$1 n=$2 before
    shift 2
    before=$(ends)
    "$KVCTL" generate --ring "unix:$T/$R0/kvd.sock" --client-key "$CKEY" -p "$text" -n "$n" \
        --ignore-eos --ids "$@" >"$T/gen.out" 2>"$T/gen.err" || fail "generation failed: $(cat "$T/gen.err")"
    ended_after "$before"
}
# every audit of the 480-token session judged first: a node with one pending draws no other
for r in 0 1; do
    wait_for 90 has_audit "$S3" $r || fail "no audit of rank $r's work on session $S3"
done
P="Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big, red ball. Once upon a time"
SEEN_LAST=""; SEEN_R0=""; PREV=$S3; k=0
# (the audited position is drawn at random, and the TOKEN the last rank's audit finds carries
# one token in about two passes of three: one session in 4 or 5 finds one of several, measured;
# 40 sessions all without, odds of about 1 in 100 000 at 1 in 4)
while [ $k -lt 40 ] && { [ -z "$SEEN_LAST" ] || [ -z "$SEEN_R0" ]; }; do
    k=$((k + 1))
    if [ $((k % 2)) = 1 ]; then SAMP="--temp 0"; else SAMP="--temp 0.8 --seed $k"; fi
    # shellcheck disable=SC2086
    SD=$(gen_p "$P" 160 $SAMP --draft lookup --draft-max 4 --dump-logits "$T/logits.bin")
    [ -n "$SD" ] && [ "$SD" != "$PREV" ] || fail "no new session id in rank 0's node's log"
    PREV=$SD
    grep -q "^drafts: [0-9]* proposed, [1-9][0-9]* accepted" "$T/gen.err" ||
        fail "session $SD accepted no draft: $(tail -2 "$T/gen.err")"
    for r in 0 1 2; do   # (all three judged before the next session: one pending draws no other)
        wait_for 60 has_audit "$SD" $r || fail "no audit of rank $r's work on session $SD"
        audited "$SD" $r | grep -q "): pass\( (.*)\)\?$" ||
            fail "rank $r's audit of drafting session $SD ($SAMP): $(audited "$SD" $r)"
    done
    # (by the session's sampling, which the last edge's receipts commit to; an audited position
    # among the rejected drafts left at the session's end has no token from it on: nothing to judge)
    audited "$SD" 2 | grep -q "TOKEN's [0-9]* tokens judged, its logits compared, in the set its sampling draws from\|(no token sampled from the position on;" ||
        fail "the last rank's audit of session $SD did not judge its token by the session's sampling: $(audited "$SD" 2)"
    audited "$SD" 2 | grep -q "TOKEN's \([2-9]\|1[0-5]\) tokens judged" && SEEN_LAST="$SD ($SAMP)"
    audited "$SD" 0 | grep -q "checked, [1-9][0-9]* of them drafts they accepted" && SEEN_R0="$SD ($SAMP)"
done
[ -n "$SEEN_LAST" ] || fail "in $k drafting sessions no audit of the last rank judged a TOKEN of several tokens with its logits: $(grep "rank 2, session" "$T/market.log" | tail -3)"
[ -n "$SEEN_R0" ] || fail "in $k drafting sessions no audit of rank 0 checked ids from accepted drafts: $(grep "rank 0, session" "$T/market.log" | tail -3)"
echo "ok   drafting with logits, $k sessions: the last rank's audit judged a TOKEN of several tokens and its logits (session $SEEN_LAST); rank 0's checked the ids drafts gave against the TOKENs received (session $SEEN_R0)"
grep "rank 0, session ${SEEN_R0%% *}" "$T/market.log" | tail -1 | sed 's/^.*pass/     pass/'

grep -q "audit [0-9a-f]* of node .*: fail" "$T/market.log" &&
    fail "an audit failed: $(grep "audit [0-9a-f]* of node .*: fail" "$T/market.log")"
# the same ring generation as at the start: no lease lapsed (a node busy building or sending a
# large answer may miss a beat on a loaded machine; the parts it sends count as beats)
same_ring() { ring_ready && [ "$(sha_now)" = "$SHA" ]; }
wait_for 20 same_ring || fail "the ring is not the one of the start after the audits: $(cat "$T/cov.json")"
echo "ok   no audit failed; every node keeps its lease"
finish

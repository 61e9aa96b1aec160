#!/bin/bash
# Hostile peers against a running stage (rank 1 of 3): handshake mismatches (wrong ring,
# manifest, rank, node key), a second predecessor, random bytes, a wrong magic, payload_len
# 4 GiB, an ACT with the wrong n_embd, a TOKEN from a non-last rank, an unknown session, status
# records oversized, malformed or of the wrong types (all sealed, as a real peer's frames are),
# an unsealed frame after the handshake. Each closes
# that link with the reason logged on both sides; the stage stays up, serves a fresh link,
# and rejoins a ring when the real predecessor comes back.
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$(need_model stories260K.gguf) || exit 1
D=$TMP/ring
ring_up "$D" --model "$M" --stages 3
P1=$(rank_port "$D" 1)
PID1=$(rank_pid "$D" 1)
LOG1=$D/rank-1/kvd.log

# peer CASE AS_RANK STATE_DIR EXPECT: run the tool; its output and the stage's log must both
# name the reason; the stage must still be running.
peer() {
    local kase=$1 as=$2 sd=$3 expect=$4
    out=$("$TOOLS/tool-ring-peer" --connect 127.0.0.1:$P1 --manifest "$D/ring.json" --as-rank $as \
          --state-dir "$sd" --case $kase --target 1 2>&1) || fail "$kase: the stage did not close the link: $out"
    echo "$out" | grep -q "closed" || fail "$kase: no close seen: $out"
    # (a peer that closed the link itself hears nothing back: PEER_SIDE=no)
    [ "${PEER_SIDE:-yes}" = no ] || echo "$out" | grep -q -- "$expect" ||
        fail "$kase: peer side lacks the reason '$expect': $out"
    for i in $(seq 50); do grep -q -- "$expect" "$LOG1" && break; sleep 0.1; done
    grep -q -- "$expect" "$LOG1" || fail "$kase: stage log lacks the reason '$expect'"
    kill -0 $PID1 || fail "$kase: the stage died"
    echo "ok $kase: $expect"
}

# The manifest names each stage's node key: the one `kvd stage --print-key` shows.
key0=$("$KVD" stage --state-dir "$D/rank-0" --print-key) || fail "--print-key"
python3 -c 'import json,sys; sys.exit(json.load(open(sys.argv[1]))["ranks"][0]["node"] != sys.argv[2])' \
    "$D/ring.json" "$key0" || fail "rank 0's key $key0 is not the manifest's"
echo "ok node key in the manifest"

# Handshake mismatches and a second predecessor, while the real rank 0 is linked.
peer wrong-ring 0 "$D/rank-0" "wrong ring"
peer wrong-manifest 0 "$D/rank-0" "manifest hash"
peer idle 2 "$D/rank-2" "wrong rank 2, expected 0"
peer idle 0 "$TMP/stranger" "is not the one the manifest names"
peer idle 0 "$D/rank-0" "already has a predecessor link"

# Kill the real predecessor so the hostile peer can take its place (with its key).
kill -9 $(rank_pid "$D" 0)
in_down() { "$KVCTL" status --ring "$D" --json 2>/dev/null | sed -n 2p | grep -q '"in":{[^}]*"state":"down"'; }
wait_for 20 in_down || fail "rank 1's in link is not down after rank 0 was killed: $("$KVCTL" status --ring "$D")"
peer random 0 "$D/rank-0" "frame magic"
peer early-act 0 "$D/rank-0" "payload_len 100000 exceeds the cap 1028"
peer magic 0 "$D/rank-0" "frame magic 0x58585858"
peer huge 0 "$D/rank-0" "payload_len 4294967295 exceeds the cap"
peer n_embd 0 "$D/rank-0" "ACT payload_len 260, expected n_tokens 1 x n_embd 64"
peer token 0 "$D/rank-0" "TOKEN from rank 0, which is not the last rank"
peer unknown 0 "$D/rank-0" "ACT for unknown session"
peer plain 0 "$D/rank-0" "record 0: length"
# Drafting (docs/ring.md, "Drafting"): more drafts than a pass may verify, a verifying pass
# that is not the last chunk of its step or too long, and an ACT that goes back without a
# verifying pass before it (or to the pass's own first row, which is always kept).
peer draft-max 0 "$D/rank-0" "OPEN draft_max 15 above 14"
peer draft-nolast 0 "$D/rank-0" "ACT flagged DRAFT with n_tokens 2 and without LAST"
peer draft-big 0 "$D/rank-0" "ACT flagged DRAFT with n_tokens 16 ("
peer draft-rewind 0 "$D/rank-0" "ACT pos 0 (+1) for session [0-9a-f]*: expected pos 1, context"
peer draft-deep 0 "$D/rank-0" "ACT pos 1 (+1) for session [0-9a-f]*: expected pos 4 or a position inside the verifying pass"
# Status records (STATUS frames, docs/design.md "The ring data path"): capped, JSON, a rank of
# the ring, every known field of its type; a good one is kept cleaned (control bytes made '?',
# unknown fields dropped) and the link stays up.
peer status-big 0 "$D/rank-0" "STATUS payload_len 1025 not in"
peer status-json 0 "$D/rank-0" "STATUS record for rank 0 is not a JSON object"
peer status-rank 0 "$D/rank-0" "STATUS for rank 7 of a ring of 3 ranks"
peer status-type 0 "$D/rank-0" "STATUS record: field sessions has the wrong type"
out=$("$TOOLS/tool-ring-peer" --connect 127.0.0.1:$P1 --manifest "$D/ring.json" --as-rank 0 \
      --state-dir "$D/rank-0" --case status-ok --target 1 2>&1) || fail "status-ok: the link was closed: $out"
"$KVCTL" status --ring "unix:$D/rank-1/kvd.sock" --json > "$TMP/st1" 2>&1
python3 - "$TMP/st1" <<'PY' || fail "rank 1 did not keep the peer's record cleaned: $(cat "$TMP/st1")"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
r0 = rows[0]
assert r0["rank"] == 0 and r0["via"] == "rank 1", r0
assert r0["host"] == "evil?host" and r0["sessions"] == 7, r0
assert "junk" not in r0 and r0["in"] == {"state": "up"}, r0
PY
echo "ok status records checked, a good one kept cleaned"
# A peer's ERROR: bounded, and printable when logged (its escape and bell become '?').
PEER_SIDE=no peer hs-error 0 "$D/rank-0" "the peer refused the link: ?\[2Jevil? reason"
PEER_SIDE=no peer error-ctl 0 "$D/rank-0" "rank 0 closed the link: ?\[2Jevil? reason"
peer error-huge 0 "$D/rank-0" "ERROR payload_len 1029 not in \[4, 1028\]"
peer report-up 0 "$D/rank-0" "link report from the predecessor"
grep -q $'\x1b\|\x07' "$LOG1" && fail "a peer's control bytes reached the stage's log"
echo "ok a peer's ERROR text is bounded and cleaned"
"$TOOLS/tool-ring-peer" --connect 127.0.0.1:$P1 --manifest "$D/ring.json" --as-rank 0 \
    --state-dir "$D/rank-0" --case ping | grep -q pong || fail "the stage does not serve a fresh link"
echo "ok fresh link served"

# Idle sessions end: rank 1 again, with a 1 s idle timeout; a peer opens a session and goes
# quiet (but keeps its link alive): the stage drops the session and keeps the link.
kill $PID1
wait_for 30 pid_gone $PID1 || fail "rank 1 did not stop on SIGTERM"
"$KVD" stage --manifest "$D/ring.json" --rank 1 --model "$M" --catalog "$D/catalog.json" \
    --state-dir "$D/rank-1" --idle-timeout 1 >> "$LOG1" 2>&1 &
PID1=$!
echo $PID1 > "$D/rank-1/kvd.pid"
up1() { [ -S "$D/rank-1/kvd.sock" ] && "$KVCTL" status --ring "$D" --json 2>/dev/null | sed -n 2p | grep -q rank; }
wait_for 30 up1 || fail "the restarted rank 1 does not answer: $(tail -5 "$LOG1")"
out=$("$TOOLS/tool-ring-peer" --connect 127.0.0.1:$P1 --manifest "$D/ring.json" --as-rank 0 \
      --state-dir "$D/rank-0" --case open-idle --target 1 2>&1) || fail "open-idle: the link was closed: $out"
wait_for 10 grep -q "idle for more than 1 s on rank 1" "$LOG1" || fail "the idle session was not ended"
echo "ok idle session ended, link kept"

# Model identity: a stage given another model's catalog (or a window that does not match the
# manifest's) refuses to start, saying why.
M2=$(need_model TinyStories-656K-Q8_0.gguf) || exit 1
"$KVCTL" catalog "$M2" -o "$TMP/other.catalog.json" > /dev/null || fail "kvctl catalog"
mkdir -p "$TMP/id-check" && cp "$D/rank-1/node.key" "$TMP/id-check/"   # rank 1's key, its own dir
if "$KVD" stage --manifest "$D/ring.json" --rank 1 --model "$M" --catalog "$TMP/other.catalog.json" \
        --state-dir "$TMP/id-check" --listen 127.0.0.1:0 > "$TMP/id.log" 2>&1; then
    fail "a stage started with another model's catalog"
fi
grep -q "the manifest's model is" "$TMP/id.log" || fail "no reason for the catalog refusal: $(cat "$TMP/id.log")"
M3=$(need_model synth-llama-spm512-q4_0.gguf) || exit 1
if "$KVD" stage --manifest "$D/ring.json" --rank 1 --model "$M3" --catalog "$D/catalog.json" \
        --state-dir "$TMP/id-check" --listen 127.0.0.1:0 > "$TMP/id.log" 2>&1; then
    fail "a stage started with another model file"
fi
grep -q "does not match the manifest\|does not match catalog" "$TMP/id.log" || fail "no reason for the model refusal: $(cat "$TMP/id.log")"
echo "ok model identity checked"

# The real rank 0 comes back: the ring links again and generates.
"$KVD" stage --manifest "$D/ring.json" --rank 0 --model "$M" --state-dir "$D/rank-0" \
    >> "$D/rank-0/kvd.log" 2>&1 &
echo $! > "$D/rank-0/kvd.pid"
wait_linked "$D" 3 20 || fail "the ring did not link again after rank 0 came back"
out=$("$KVCTL" generate --ring "$D" --ids --tokens 1,400,300 -n 8 --temp 0 2>&1) || fail "generate after recovery: $out"
echo "ok ring back: $out"
echo PASS

#!/bin/bash
# test-weight: 2 (several stages computing at once)
# Drafting round the ring (docs/ring.md, "Drafting"): the last rank sends prompt-lookup drafts
# with each TOKEN, rank 0 runs the token and its drafts through every stage as one verifying
# pass, and every stage drops the rows of rejected drafts. The tokens are the ones without
# drafts, token for token:
# - 3-stage rings of a dense, a MoE, a hybrid (DeltaNet) and a hybrid-MoE model: greedy and
#   seeded sampling with --draft-max 8 and 14 equal one process without drafts; drafts were
#   accepted where the text repeats itself, the dense ring's last logits are bit-identical,
#   and the hybrid rings' stages put their recurrent state back after rejected drafts;
# - the same on a ring of OpenCL stages (PoCL);
# - 8 concurrent sessions with drafts on a batching ring: each its one-process text;
# - rank 0's --draft default and a request's "draft": "none" (which wins), over the API too;
# - a middle stage killed mid-session (a standby takes over, the sessions replay): every
#   session's text as one process;
# - a session whose client asks for bad drafting parameters gets a clear error.
. "$(dirname "$0")/../lib/ring_lib.sh"

P=1,400,300,200,100,400,300,200
for f in stories260K.gguf synth-qwen3moe-bpe1024-q4_k_m.gguf synth-qwen35-bpe1024-f16.gguf \
         synth-qwen35moe-bpe1024-q8_0.gguf; do
    M=$(need_model $f) || exit 1
    d=$TMP/r-$f
    ring_up "$d" --model "$M" --stages 3
    for samp in "--temp 0" "--temp 0.8 --seed 7" "--temp 1 --seed 3 --top-k 0 --top-p 1 --min-p 0 --repeat-penalty 1.1"; do
        one=$("$KVCTL" generate -m "$M" --ids --tokens $P -n 100 $samp --ignore-eos -t 1 \
              --dump-logits "$TMP/one.lg" 2>/dev/null) || fail "$f $samp: one-process generate"
        for k in 8 14; do
            out=$("$KVCTL" generate --ring "$d" --ids --tokens $P -n 100 $samp --ignore-eos \
                  --draft lookup --draft-max $k --dump-logits "$TMP/ring.lg" 2>"$TMP/err") ||
                fail "$f $samp --draft-max $k: $(cat "$TMP/err")"
            [ "$out" = "$one" ] || fail "$f $samp --draft-max $k: tokens differ from one process:
ring: $out
one:  $one"
            grep -q "^drafts: [1-9][0-9]* proposed" "$TMP/err" || fail "$f $samp: no drafts proposed: $(cat "$TMP/err")"
            if [ "$f" = stories260K.gguf ]; then
                cmp -s "$TMP/one.lg" "$TMP/ring.lg" || fail "$f $samp --draft-max $k: last logits not bit-identical"
            fi
        done
    done
    # greedy on the dense and MoE models repeats itself: drafts accepted, fewer passes than tokens
    if [ "$f" = stories260K.gguf ] || [ "$f" = synth-qwen3moe-bpe1024-q4_k_m.gguf ]; then
        "$KVCTL" generate --ring "$d" --ids --tokens $P -n 100 --temp 0 --ignore-eos --draft lookup \
            > /dev/null 2>"$TMP/err" || fail "$f greedy: $(cat "$TMP/err")"
        grep -Eq "^drafts: [0-9]+ proposed, [1-9][0-9]* accepted; ([0-9]+) passes for 100 tokens" "$TMP/err" ||
            fail "$f greedy: no draft accepted: $(cat "$TMP/err")"
    fi
    for r in 0 1 2; do
        [ "$(draft_field "$d" $r verifying_passes)" -gt 0 ] || fail "$f: rank $r ran no verifying pass"
        [ "$(draft_field "$d" $r rows_dropped)" -gt 0 ] || fail "$f: rank $r dropped no rejected row"
    done
    case $f in synth-qwen35*)   # recurrent layers on every rank: checkpoints put back
        for r in 0 1 2; do
            [ "$(draft_field "$d" $r restores)" -gt 0 ] || fail "$f: rank $r restored no checkpoint"
        done ;;
    esac
    echo "ok $f: 3 stages, greedy and sampled with drafts = one process (rank 1: $(draft_field "$d" 1 verifying_passes) verifying passes, $(draft_field "$d" 1 rows_dropped) rows dropped, $(draft_field "$d" 1 restores) restores)"
    ring_down "$d"
done

# On the OpenCL device (PoCL here): a ring of two OpenCL stages with drafts generates what one
# OpenCL process generates without them; the hybrid's stages restore their device state.
export KV_CL_CACHE="$TMP/clcache"
clinfo -l 2>/dev/null | grep -q "Device" || fail "no OpenCL device (clinfo -l lists none): install pocl-opencl-icd"
for f in stories260K.gguf synth-qwen35-bpe1024-f16.gguf; do
    M=$(need_model $f) || exit 1
    d=$TMP/cl-$f
    ring_up "$d" --model "$M" --stages 2 --backends opencl,opencl
    one=$("$KVCTL" generate -m "$M" --device opencl --ids --tokens $P -n 60 --temp 0 --ignore-eos 2>/dev/null) ||
        fail "$f: one OpenCL process"
    out=$("$KVCTL" generate --ring "$d" --ids --tokens $P -n 60 --temp 0 --ignore-eos --draft lookup 2>"$TMP/err") ||
        fail "$f: OpenCL ring with drafts: $(cat "$TMP/err")"
    [ "$out" = "$one" ] || fail "$f: OpenCL ring with drafts differs from one OpenCL process:
ring: $out
one:  $one"
    [ "$(draft_field "$d" 1 verifying_passes)" -gt 0 ] || fail "$f: the OpenCL stage ran no verifying pass"
    case $f in synth-qwen35*)
        [ "$(draft_field "$d" 1 restores)" -gt 0 ] || fail "$f: the OpenCL stage restored no checkpoint" ;;
    esac
    echo "ok $f on OpenCL: drafts through 2 stages = one OpenCL process ($(grep '^drafts' "$TMP/err"))"
    ring_down "$d"
done

# 8 concurrent sessions with drafts through a batching ring: each its one-process text.
M=$(need_model TinyLLama-v0-q4_0.gguf) || exit 1
d=$TMP/conc
ring_up "$d" --model "$M" --stages 3 --batch-wait-us 2000
prompts=("Once upon a time" "The little dog" "Lily and Tom went to the park" "One day, a bird"
         "Tim had a red ball" "The sun was hot" "Sue liked to draw" "A big bear")
samp=("--temp 0" "--temp 0" "--temp 0" "--temp 0" "--temp 0.8 --seed 11" "--temp 0.8 --seed 12"
      "--temp 0.8 --seed 13" "--temp 0.8 --seed 14")
for i in $(seq 0 7); do
    "$KVCTL" generate -m "$M" -p "${prompts[$i]}" -n 120 ${samp[$i]} --ignore-eos -t 1 \
        > "$TMP/one.$i" 2>/dev/null || fail "one-process generate $i"
done
pids=""
for i in $(seq 0 7); do
    "$KVCTL" generate --ring "$d" -p "${prompts[$i]}" -n 120 ${samp[$i]} --ignore-eos --draft lookup \
        > "$TMP/conc.$i" 2> "$TMP/conc.err.$i" &
    pids="$pids $!"
done
i=0
for p in $pids; do
    wait "$p" || fail "concurrent session $i: $(cat "$TMP/conc.err.$i")"
    cmp -s "$TMP/one.$i" "$TMP/conc.$i" || fail "concurrent session $i differs from one process:
ring: $(cat "$TMP/conc.$i")
one:  $(cat "$TMP/one.$i")"
    i=$((i + 1))
done
acc=$(cat "$TMP"/conc.err.* | sed -n 's/^drafts: [0-9]* proposed, \([0-9]*\) accepted.*/\1/p' | awk '{ s += $1 } END { print s + 0 }')
[ "$acc" -gt 0 ] || fail "8 concurrent sessions: no draft accepted"
runs=$("$KVCTL" status --ring "$d" --json | sed -n 2p | python3 -c 'import json,sys; print(json.load(sys.stdin)["batches"]["runs"])')
[ "$runs" -gt 0 ] || fail "rank 1 never batched two sessions' steps"
echo "ok 8 concurrent sessions with drafts: each as one process ($acc drafts accepted, rank 1: $runs batched runs)"
ring_down "$d"

# Rank 0's default (kvd stage --draft lookup) drafts for a request that does not say; a
# request's "none" wins over it; the API takes the same fields.
d=$TMP/dflt
ring_up "$d" --model "$M" --stages 2 --draft lookup --draft-max 6 --api 127.0.0.1:0
PORT=$(api_port "$d")
"$KVCTL" generate --ring "$d" -p "${prompts[0]}" -n 80 --temp 0 --ignore-eos > "$TMP/dflt.txt" 2> "$TMP/dflt.err" ||
    fail "default drafting: $(cat "$TMP/dflt.err")"
head -c 200 "$TMP/one.0" | cmp -s - <(head -c 200 "$TMP/dflt.txt") || fail "default drafting: text differs"
grep -q "^drafts: [1-9]" "$TMP/dflt.err" || fail "rank 0's --draft lookup did not draft: $(cat "$TMP/dflt.err")"
# logits with drafts: a TOKEN of several tokens carries each one's 32000 logits (the link's
# payload cap counts them); the last position's are one process's, bit for bit
"$KVCTL" generate -m "$M" -p "${prompts[0]}" -n 60 --temp 0 --ignore-eos -t 1 --dump-logits "$TMP/one32k.lg" \
    > /dev/null 2>&1 || fail "one-process --dump-logits"
"$KVCTL" generate --ring "$d" -p "${prompts[0]}" -n 60 --temp 0 --ignore-eos --draft-max 14 \
    --dump-logits "$TMP/ring32k.lg" > /dev/null 2> "$TMP/lg.err" || fail "--dump-logits with drafts: $(cat "$TMP/lg.err")"
grep -Eq "^drafts: [0-9]+ proposed, [1-9]" "$TMP/lg.err" || fail "--dump-logits: no draft accepted: $(cat "$TMP/lg.err")"
cmp -s "$TMP/one32k.lg" "$TMP/ring32k.lg" || fail "--dump-logits with drafts: last logits differ from one process"
s0=$(draft_field "$d" 0 drafts_sent)
"$KVCTL" generate --ring "$d" -p "${prompts[0]}" -n 80 --temp 0 --ignore-eos --draft none > /dev/null 2> "$TMP/none.err" ||
    fail "--draft none: $(cat "$TMP/none.err")"
! grep -q "^drafts:" "$TMP/none.err" || fail "the request's none did not win: $(cat "$TMP/none.err")"
[ "$(draft_field "$d" 0 drafts_sent)" = "$s0" ] || fail "drafts sent for a request that said none"
api() { curl -s -m 60 -H 'Content-Type: application/json' -d "$1" "http://127.0.0.1:$PORT/v1/completions"; }
a1=$(api '{"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "draft": "none"}' |
     python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])') || fail "API draft none"
a2=$(api '{"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0, "draft": "lookup", "draft_max": 14}' |
     python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])') || fail "API draft lookup"
[ -n "$a1" ] && [ "$a1" = "$a2" ] || fail "API: text with drafts differs: '$a1' vs '$a2'"
[ "$(draft_field "$d" 0 drafts_sent)" -gt "$s0" ] || fail "API draft lookup sent no drafts"
bad=$(api '{"prompt": "x", "max_tokens": 4, "draft": "maybe"}')
echo "$bad" | grep -q '"param":"draft"' || fail "API: a bad draft mode not refused by name: $bad"
bad=$(api '{"prompt": "x", "max_tokens": 4, "draft_max": 15}')
echo "$bad" | grep -q '"param":"draft_max"' || fail "API: draft_max 15 not refused by name: $bad"
"$KVCTL" generate --ring "$d" -p x -n 4 --draft-max 15 > /dev/null 2>&1 && fail "--draft-max 15 accepted"
python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
s.connect(sys.argv[1])
s.sendall(b"{\"op\":\"generate\",\"prompt\":\"x\",\"n\":4,\"draft_max\":99}\n")
print(s.recv(4096).decode())' "$d/rank-0/kvd.sock" > "$TMP/ctl" 2>&1 || true
grep -q 'draft_max: expected an integer in \[1, 14\]' "$TMP/ctl" || fail "control socket: draft_max 99 not refused by name: $(cat "$TMP/ctl")"
echo "ok rank 0's --draft default, a request's none wins, the API's draft fields, bad values refused by name"
ring_down "$d"

# A middle stage killed while sessions draft: a standby takes over, the sessions replay, and
# every text is its one-process text.
d=$TMP/kill
ring_up "$d" --model "$M" --stages 3 --standby 1
for i in $(seq 0 3); do
    "$KVCTL" generate -m "$M" -p "${prompts[$i]}" -n $((200 + 20 * i)) ${samp[$((i * 2))]} --ignore-eos -t 1 \
        > "$TMP/kone.$i" 2>/dev/null || fail "one-process generate $i"
done
start_drafting() {
    local i
    for i in $(seq 0 3); do
        "$KVCTL" generate --ring "$d" -p "${prompts[$i]}" -n $((200 + 20 * i)) ${samp[$((i * 2))]} \
            --ignore-eos --draft lookup > "$TMP/kill.$i" 2> "$TMP/kill.err.$i" &
        CLIENT_PIDS="$CLIENT_PIDS $!"
        CLIENT_ARGS="$CLIENT_ARGS $!:$TMP/kill.$i:$TMP/kill.err.$i"
    done
}
pid=$(serving_pid "$d" 1)
[ -n "$pid" ] || fail "nobody serves rank 1"
kill_during "$d/rank-0/kvd.sock" "$pid" 200 KILL start_drafting
ms=$KILL_MS running=$KILL_RUNNING
clients_as_one "$TMP/kone" "$TMP/kill"
cat "$TMP"/kill.err.* | grep -q "resumed [0-9]* time" || fail "no session said it resumed"
echo "ok middle stage killed with $running drafting sessions running: every text as one process ($ms ms to the next tokens)"
ring_down "$d"

#!/bin/bash
# test-weight: 2 (several stages computing at once)
# The MTP drafter (docs/model.md and docs/ring.md, "Drafting"): Qwen3.5's multi-token-prediction
# block, on copies of the hybrid test models with one random MTP block appended
# (kvctl synth --from MODEL --nextn 1; the copy's main pass is the original's):
# - one process: without drafts the copy generates what the original does; --draft mtp with 1,
#   3 and 14 drafts a pass, and --draft auto, give that text, greedy and seeded, and the block
#   proposed drafts (random weights: few are accepted, the text never changes); the same on
#   the OpenCL device;
# - the original (no block): --draft mtp is refused with the reason, --draft auto drafts by
#   prompt lookup;
# - a 3-stage ring of the copy: --draft mtp greedy and seeded = one process, the last rank's
#   log says it loaded the block; the last stage killed mid-session (a standby takes over, the
#   sessions replay, the new last rank rebuilds the block's entries from the history): every
#   text as one process; the API's "draft": "mtp" drafts and gives the text of "none";
# - a ring of the original: a session asking for MTP drafts fails, naming the missing block.
. "$(dirname "$0")/../lib/ring_lib.sh"

P=1,400,300,200,100,400,300,200,17,99,5
for f in synth-qwen35-bpe1024-f16.gguf synth-qwen35moe-bpe1024-q8_0.gguf; do
    M=$(need_model $f) || exit 1
    C=$TMP/mtp-$f
    "$KVCTL" synth --from "$M" --nextn 1 --seed 3 -o "$C" > "$TMP/synth.out" 2>&1 ||
        fail "$f: kvctl synth --from --nextn 1: $(cat "$TMP/synth.out")"
    for samp in "--temp 0" "--temp 0.8 --seed 7"; do
        orig=$("$KVCTL" generate -m "$M" --ids --tokens $P -n 40 $samp --ignore-eos -t 1 2>/dev/null) ||
            fail "$f $samp: generate on the original"
        one=$("$KVCTL" generate -m "$C" --ids --tokens $P -n 40 $samp --ignore-eos -t 1 2>/dev/null) ||
            fail "$f $samp: generate on the copy"
        [ -n "$one" ] && [ "$one" = "$orig" ] || fail "$f $samp: the copy's main pass differs from the original's:
copy: $one
orig: $orig"
        for d in "mtp --draft-max 1" "mtp --draft-max 3" "mtp --draft-max 14" "auto"; do
            out=$("$KVCTL" generate -m "$C" --ids --tokens $P -n 40 $samp --ignore-eos -t 1 \
                  --draft $d 2>"$TMP/err") || fail "$f $samp --draft $d: $(cat "$TMP/err")"
            [ "$out" = "$one" ] || fail "$f $samp --draft $d: tokens differ from no drafting:
mtp:  $out
none: $one"
            grep -q "^drafts: [1-9][0-9]* proposed" "$TMP/err" ||
                fail "$f $samp --draft $d: the MTP block proposed nothing: $(cat "$TMP/err")"
        done
    done
    # without the block: mtp refused with the reason, auto falls back to prompt lookup
    "$KVCTL" generate -m "$M" --ids --tokens $P -n 8 --draft mtp > /dev/null 2>"$TMP/err" &&
        fail "$f: --draft mtp accepted on a model without the block"
    grep -q "has no MTP block" "$TMP/err" || fail "$f: --draft mtp without the block: $(cat "$TMP/err")"
    out=$("$KVCTL" generate -m "$M" --ids --tokens $P -n 40 --temp 0 --ignore-eos -t 1 --draft auto 2>"$TMP/err") ||
        fail "$f: --draft auto without the block: $(cat "$TMP/err")"
    [ "$out" = "$("$KVCTL" generate -m "$M" --ids --tokens $P -n 40 --temp 0 --ignore-eos -t 1 2>/dev/null)" ] ||
        fail "$f: --draft auto without the block changed the text"
    echo "ok $f: one process, --draft mtp (1, 3, 14 drafts) and auto = no drafting = the original, greedy and seeded"
done

# On the OpenCL device (PoCL here): the block runs there too, the text that of no drafting.
export KV_CL_CACHE="$TMP/clcache"
clinfo -l 2>/dev/null | grep -q "Device" || fail "no OpenCL device (clinfo -l lists none): install pocl-opencl-icd"
C=$TMP/mtp-synth-qwen35-bpe1024-f16.gguf
one=$("$KVCTL" generate -m "$C" --device opencl --ids --tokens $P -n 24 --temp 0 --ignore-eos 2>/dev/null) ||
    fail "OpenCL: generate"
out=$("$KVCTL" generate -m "$C" --device opencl --ids --tokens $P -n 24 --temp 0 --ignore-eos --draft mtp \
      --draft-max 2 2>"$TMP/err") || fail "OpenCL --draft mtp: $(cat "$TMP/err")"
[ -n "$one" ] && [ "$out" = "$one" ] || fail "OpenCL --draft mtp: tokens differ from no drafting"
grep -q "^drafts: [1-9][0-9]* proposed" "$TMP/err" || fail "OpenCL: the MTP block proposed nothing: $(cat "$TMP/err")"
echo "ok OpenCL: --draft mtp = no drafting"

# A 3-stage ring of the dense hybrid copy.
f=synth-qwen35-bpe1024-f16.gguf
M=$(need_model $f) || exit 1
C=$TMP/mtp-$f
d=$TMP/ring
ring_up "$d" --model "$C" --stages 3 --standby 1 --api 127.0.0.1:0
grep -q "MTP block 8 loaded" "$d/rank-2/kvd.log" || fail "the last rank did not load the MTP block: $(tail -5 "$d/rank-2/kvd.log")"
# the API's "draft": "mtp" gives the text of "none"
PORT=$(api_port "$d")
api() { curl -s -m 60 -H 'Content-Type: application/json' -d "$1" "http://127.0.0.1:$PORT/v1/completions" |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'; }
sent() { draft_field "$d" 0 drafts_sent; }   # the drafts rank 0 has sent in verifying passes
a1=$(api '{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "draft": "none"}') || fail "API draft none"
s0=$(sent)
a2=$(api '{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "draft": "mtp", "draft_max": 2}') ||
    fail "API draft mtp"
[ -n "$a1" ] && [ "$a1" = "$a2" ] || fail "API: the text with MTP drafts differs: '$a1' vs '$a2'"
[ "$(sent)" -gt "$s0" ] || fail "API draft mtp: rank 0 sent no drafts"
for samp in "--temp 0" "--temp 0.8 --seed 7"; do
    one=$("$KVCTL" generate -m "$C" --ids --tokens $P -n 60 $samp --ignore-eos -t 1 2>/dev/null) ||
        fail "ring $samp: one-process generate"
    out=$("$KVCTL" generate --ring "$d" --ids --tokens $P -n 60 $samp --ignore-eos --draft mtp --draft-max 3 \
          2>"$TMP/err") || fail "ring $samp --draft mtp: $(cat "$TMP/err")"
    [ "$out" = "$one" ] || fail "ring $samp --draft mtp: tokens differ from one process:
ring: $out
one:  $one"
    grep -q "^drafts: [1-9][0-9]* proposed" "$TMP/err" || fail "ring $samp: no MTP drafts proposed: $(cat "$TMP/err")"
done
echo "ok 3-stage ring: --draft mtp greedy and seeded = one process"

# The last stage killed while sessions draft with the MTP block: a standby takes rank 2 over,
# the sessions replay, and each text is its one-process text.
prompts=("1,400,300,200" "1,17,99,5,17,99" "1,250,251,252" "1,9,8,7,6,5")
samp=("--temp 0" "--temp 0.8 --seed 11" "--temp 0" "--temp 0.8 --seed 12")
for i in 0 1 2 3; do
    "$KVCTL" generate -m "$C" --ids --tokens "${prompts[$i]}" -n $((150 + 20 * i)) ${samp[$i]} --ignore-eos -t 1 \
        > "$TMP/kone.$i" 2>/dev/null || fail "one-process generate $i"
done
start_drafting() {
    local i
    for i in 0 1 2 3; do
        "$KVCTL" generate --ring "$d" --ids --tokens "${prompts[$i]}" -n $((150 + 20 * i)) ${samp[$i]} \
            --ignore-eos --draft mtp --draft-max 2 > "$TMP/kill.$i" 2> "$TMP/kill.err.$i" &
        CLIENT_PIDS="$CLIENT_PIDS $!"
        CLIENT_ARGS="$CLIENT_ARGS $!:$TMP/kill.$i:$TMP/kill.err.$i"
    done
}
pid=$(serving_pid "$d" 2)
[ -n "$pid" ] || fail "nobody serves rank 2"
kill_during "$d/rank-0/kvd.sock" "$pid" 100 KILL start_drafting
clients_as_one "$TMP/kone" "$TMP/kill"
cat "$TMP"/kill.err.* | grep -q "resumed [0-9]* time" || fail "no session said it resumed: $(cat "$TMP"/kill.err.*)"
grep -q "MTP block 8 loaded" "$d"/standby-*/kvd.log || fail "the standby that took rank 2 over did not load the MTP block"
echo "ok the last stage killed after ${KILL_MS} ms with $KILL_RUNNING sessions drafting: every text as one process"
ring_down "$d"

# A ring of the original (no MTP block): a session that asks for MTP drafts fails, saying why.
d=$TMP/plain
ring_up "$d" --model "$M" --stages 2
"$KVCTL" generate --ring "$d" --ids --tokens $P -n 8 --draft mtp > /dev/null 2>"$TMP/err" &&
    fail "a ring without the block took --draft mtp"
grep -q "holds no MTP block" "$TMP/err" || fail "the refusal does not name the block: $(cat "$TMP/err")"
out=$("$KVCTL" generate --ring "$d" --ids --tokens $P -n 20 --temp 0 --ignore-eos --draft auto 2>"$TMP/err") ||
    fail "--draft auto on a ring without the block: $(cat "$TMP/err")"
[ "$out" = "$("$KVCTL" generate -m "$M" --ids --tokens $P -n 20 --temp 0 --ignore-eos -t 1 2>/dev/null)" ] ||
    fail "--draft auto on a ring without the block changed the text"
echo "ok a ring without the block: --draft mtp refused naming it, auto drafts by lookup"
ring_down "$d"
echo "PASS"

#!/bin/bash
# The Qwen3.5 hybrid MoE (synth-qwen35moe: layers 3 and 7 full attention, the rest Gated
# DeltaNet, 8 routed experts + a shared expert) through rings of 2, 3 and 4 stages with
# explicit windows (kvctl ring up --split): windows that start on a linear-attention layer,
# on a full-attention layer, and single-layer windows of both kinds. Greedy tokens equal one
# process (`kvctl generate`), the last logits are bit-identical on the f32 wire, seeded
# sampling is equal; 8 concurrent sessions keep separate recurrent state.
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$(need_model synth-qwen35moe-bpe1024-q8_0.gguf) || exit 1
PROMPT=46,837,263,640,11,257
N=16
one=$("$KVCTL" generate -m "$M" --ids --tokens $PROMPT -n $N --temp 0 --ignore-eos 2>/dev/null) ||
    fail "one-process generate"
ref=$("$TOOLS/tool-ring-ref" -m "$M" --tokens $PROMPT -n $N --temp 0 --ignore-eos --dump-logits "$TMP/ref.lg") ||
    fail "reference tool"
[ "$one" = "$ref" ] || fail "reference tool disagrees with kvctl generate: '$ref' vs '$one'"
seeded=$("$KVCTL" generate -m "$M" --ids --tokens $PROMPT -n $N --temp 0.9 --top-k 40 --seed 5 --ignore-eos 2>/dev/null) ||
    fail "seeded one-process generate"

# 2 stages: the second window starts on linear layer 5.
# 3 stages: windows start on full-attention layers 3 and 7; [7, 8) is one full-attention layer.
# 4 stages: [1, 2) and [2, 3) are single linear layers, [3, 8) starts on full attention.
for split in 0:5,5:8 0:3,3:7,7:8 0:1,1:2,2:3,3:8; do
    d="$TMP/r-$split"
    ring_up "$d" --model "$M" --split $split
    grep -q '"layers"' "$d/ring.json" || fail "$split: no manifest"
    out=$("$KVCTL" generate --ring "$d" --ids --tokens $PROMPT -n $N --temp 0 --ignore-eos --dump-logits "$TMP/ring.lg" 2>"$TMP/err") ||
        fail "$split: generate --ring: $(cat "$TMP/err")"
    [ "$out" = "$one" ] || fail "$split: greedy tokens differ: ring '$out' vs one process '$one'"
    cmp -s "$TMP/ring.lg" "$TMP/ref.lg" || fail "$split: last logits not bit-identical"
    out=$("$KVCTL" generate --ring "$d" --ids --tokens $PROMPT -n $N --temp 0.9 --top-k 40 --seed 5 --ignore-eos 2>"$TMP/err") ||
        fail "$split: seeded generate --ring: $(cat "$TMP/err")"
    [ "$out" = "$seeded" ] || fail "$split: seeded tokens differ: ring '$out' vs '$seeded'"
    echo "ok windows $split"
    [ "$split" = 0:3,3:7,7:8 ] || ring_down "$d"
done

# 8 concurrent sessions with different prompts through the 3-stage ring.
D="$TMP/r-0:3,3:7,7:8"
prompts=("46,837" "11,257,258,259" "300,301" "1000,12,13,14,15" "700" "33,44,55" "600,601,602,603" "9,8")
for i in $(seq 0 7); do
    "$KVCTL" generate -m "$M" --ids --tokens ${prompts[$i]} -n $((8 + i)) --temp 0 --ignore-eos \
        > "$TMP/one.$i" 2>/dev/null || fail "one-process generate $i"
done
pids=""
for i in $(seq 0 7); do
    "$KVCTL" generate --ring "$D" --ids --tokens ${prompts[$i]} -n $((8 + i)) --temp 0 --ignore-eos \
        > "$TMP/ring.$i" 2>"$TMP/err.$i" &
    pids="$pids $!"
done
EXTRA_PIDS="$pids"
for p in $pids; do wait $p || fail "a ring generate failed: $(cat "$TMP"/err.*)"; done
for i in $(seq 0 7); do
    cmp -s "$TMP/one.$i" "$TMP/ring.$i" || fail "session $i: ring '$(cat "$TMP/ring.$i")' vs one process '$(cat "$TMP/one.$i")'"
done
echo "ok 8 concurrent sessions equal their one-process outputs"

# --split refusals: not covering the model, not contiguous.
"$KVCTL" ring up --dir "$TMP/bad1" --model "$M" --split 0:3,3:6 >/dev/null 2>"$TMP/err"; [ $? = 1 ] ||
    fail "--split short of the layers accepted"
grep -q "8 layers" "$TMP/err" || fail "--split message: $(cat "$TMP/err")"
"$KVCTL" ring up --dir "$TMP/bad2" --model "$M" --split 0:3,4:8 >/dev/null 2>&1; [ $? = 2 ] ||
    fail "--split with a gap accepted"

# kvctl inspect counts all experts for memory and the used ones per token; slice and verify
# carry the 3-D expert tensors of a window.
ins=$("$KVCTL" inspect "$M") || fail "inspect"
echo "$ins" | grep -Eq '^experts +routed 12.75 MiB in all \(memory\), 2 of 8 used per token: 3.19 MiB' ||
    fail "inspect expert line: $(echo "$ins" | grep experts)"
"$KVCTL" slice "$M" --layers 3:5 -o "$TMP/w.gguf" >/dev/null || fail "slice"
"$KVCTL" catalog "$M" -o "$TMP/cat.json" >/dev/null 2>&1 || fail "catalog"
"$KVCTL" verify "$TMP/w.gguf" --catalog "$TMP/cat.json" | grep -q "35 tensors match" || fail "verify window"
"$KVCTL" inspect --tensors "$TMP/w.gguf" | grep -Eq "blk.4.ffn_down_exps.weight +q8_0 +256x256x8 +557056" ||
    fail "3-D tensor in the window: $("$KVCTL" inspect --tensors "$TMP/w.gguf" | grep down_exps)"
# a flipped byte in the last expert's slice of a 3-D tensor: verify names that tensor
data=$("$KVCTL" inspect "$TMP/w.gguf" | sed -n 's/.*data at \([0-9]*\).*/\1/p')
read -r sz off < <("$KVCTL" inspect --tensors "$TMP/w.gguf" | awk '$1 == "blk.4.ffn_gate_exps.weight" {print $4, $5}')
[ -n "$data" ] && [ -n "$off" ] || fail "no offset for blk.4.ffn_gate_exps.weight in the window"
cp "$TMP/w.gguf" "$TMP/wc.gguf"
python3 -c 'import sys
f = open(sys.argv[1], "r+b"); o = int(sys.argv[2]); f.seek(o); b = f.read(1); f.seek(o); f.write(bytes([b[0] ^ 0xff]))' \
    "$TMP/wc.gguf" $((data + off + sz - 100))
"$KVCTL" verify "$TMP/wc.gguf" --catalog "$TMP/cat.json" > "$TMP/vc" 2>&1 && fail "verify accepted a corrupted expert slice"
grep -q "tensor blk.4.ffn_gate_exps.weight: sha256" "$TMP/vc" || fail "verify does not name the corrupted tensor: $(cat "$TMP/vc")"
echo "ok inspect, slice, verify (a corrupted expert slice is named)"
echo PASS

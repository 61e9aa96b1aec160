#!/bin/bash
# test-gguf-kvctl: kvctl synth / inspect / slice / catalog / verify end to end.
# synth writes each arch in f32, f16, q8_0 and q4_0, and in the K types with the tensor types
# promised (q4_k_m: llama.cpp's Q4_K_M mixture) and the same greedy tokens on the cpu and ref
# devices up to near-ties; shapes a type cannot hold are refused with a message naming them.
# Every shared test model is cut into 2 and 3 windows; each window verifies against the
# model's catalog, and a flipped byte makes verify fail naming the tensor it sits in. A model
# with an MTP block (kvctl synth --from --nextn 1): the last window, [k, 8) or [k, 9), carries the block and a
# token_embd for its drafter, the first and middle ones do not; each verifies.
. "$(dirname "$0")/../lib/lib.sh"
CHECK=tests/lib/gguf_strict_check.py
# the per-model checks run two at a time in subshells: lib.sh counts their failures too

need_exec "$KVCTL"
ls "$DATA"/models/*.gguf >/dev/null 2>&1 || die "test data missing: $DATA/models"

# Flip one byte of the data of tensor $2 in file $1.
flip() {
    local f=$1 name=$2 data off
    data=$("$KVCTL" inspect "$f" | awk '/^format/ { for (i = 1; i <= NF; i++) if ($i == "at") print $(i + 1) }')
    off=$("$KVCTL" inspect --tensors "$f" | awk -v n="$name" '$1 == n { print $5 }')
    [ -n "$data" ] && [ -n "$off" ] || { echo "flip: cannot locate $name in $f"; return 1; }
    python3 - "$f" $((data + off + 3)) <<'EOF'
import sys
p, o = sys.argv[1], int(sys.argv[2])
with open(p, 'r+b') as fh:
    fh.seek(o); b = fh.read(1); fh.seek(o); fh.write(bytes([b[0] ^ 0xFF]))
EOF
}

check_model() {
    local m=$1 base layers id src parts prev p end w victim out rc
    base=$(basename "$m" .gguf)
    layers=$("$KVCTL" inspect "$m" | awk '$1 == "layers" { print $2; exit }')
    [ -n "$layers" ] && [ "$layers" -gt 0 ] || { fail "$base: inspect gives no layer count"; return; }
    id=$("$KVCTL" catalog "$m" -o "$T/$base.cat.json" 2>/dev/null) || { fail "$base: catalog"; return; }
    [ "$id" = "$(sha256sum "$T/$base.cat.json" | cut -d' ' -f1)" ] || fail "$base: model id is not the catalog's SHA-256"
    src=$(sha256sum "$m" | cut -d' ' -f1)
    grep -q "\"source_sha256\":[[:space:]]*\"$src\"" "$T/$base.cat.json" || fail "$base: catalog source_sha256"
    "$KVCTL" verify "$m" --catalog "$T/$base.cat.json" >/dev/null || fail "$base: whole model does not verify"
    for parts in 2 3; do
        [ "$layers" -ge "$parts" ] || continue
        prev=0
        for p in $(seq 1 "$parts"); do
            end=$((layers * p / parts))
            w="$T/$base.$prev-$end.gguf"
            "$KVCTL" slice "$m" --layers "$prev:$end" -o "$w" --source-sha256 "$src" >/dev/null ||
                { fail "$base: slice $prev:$end"; prev=$end; continue; }
            out=$("$KVCTL" verify "$w" --catalog "$T/$base.cat.json" 2>&1) || fail "$base [$prev,$end): verify: $out"
            [ "$p" = 1 ] && { "$KVCTL" inspect "$w" | grep -q "^window      layers \[$prev, $end) of $layers" ||
                              fail "$base: inspect shows no window"; }
            if [ "$p" = 2 ]; then
                victim=$("$KVCTL" inspect --tensors "$w" | awk '$1 ~ /^blk\./ { print $1; exit }')
                cp "$w" "$w.bad"
                flip "$w.bad" "$victim" || fail "$base: flip"
                out=$("$KVCTL" verify "$w.bad" --catalog "$T/$base.cat.json" 2>&1)
                rc=$?
                [ $rc -eq 1 ] || fail "$base: verify of a flipped window returned $rc"
                echo "$out" | grep -q "tensor $victim: sha256" || fail "$base: verify does not name $victim: $out"
                rm -f "$w.bad"
            fi
            prev=$end
        done
    done
}

n_models=0
for m in "$DATA"/models/*.gguf; do
    n_models=$((n_models + 1))
    while [ "$(jobs -rp | wc -l)" -ge 2 ]; do wait -n; done
    check_model "$m" &
done
wait
# the windows also pass an independent reader with llama.cpp's layout rules
out=$(python3 "$CHECK" "$T"/*.*-*.gguf 2>&1) || fail "strict reader: $out"
rm -f "$T"/*.*-*.gguf
[ $n_models -ge 10 ] || fail "only $n_models models"

# a window checked against another model's catalog is refused
"$KVCTL" slice "$DATA/models/stories260K.gguf" --layers 0:2 -o "$T/s.gguf" >/dev/null || fail "slice stories"
out=$("$KVCTL" verify "$T/s.gguf" --catalog "$T/TinyStories-656K-Q8_0.cat.json" 2>&1) && fail "foreign catalog accepted"
echo "$out" | grep -q "source" || fail "foreign catalog message: $out"
# the same window against its own catalog passes; bad layer ranges are refused
out=$("$KVCTL" verify "$T/s.gguf" --catalog "$T/stories260K.cat.json" 2>&1) || fail "stories window: $out"
"$KVCTL" slice "$DATA/models/stories260K.gguf" --layers 3:2 -o "$T/x.gguf" 2>/dev/null && fail "empty window accepted"
"$KVCTL" slice "$DATA/models/stories260K.gguf" --layers 0:6 -o "$T/x.gguf" 2>/dev/null && fail "window past the end accepted"
"$KVCTL" slice "$DATA/models/stories260K.gguf" --layers 0-2 -o "$T/x.gguf" 2>/dev/null && fail "bad --layers accepted"

# a model with an MTP block after its 8 main blocks: only the last window carries blk.8.* (every
# one of its tensors) and, for the drafter, token_embd
mtp=$T/mtp.gguf
"$KVCTL" synth --from "$DATA/models/synth-qwen35moe-bpe1024-q8_0.gguf" --nextn 1 -o "$mtp" > /dev/null || fail "kvctl synth --from --nextn 1"
"$KVCTL" catalog "$mtp" -o "$T/mtp.cat.json" >/dev/null 2>&1 || fail "mtp: catalog"
python3 -c "import json,sys;c=json.load(open(sys.argv[1]));assert c['n_layers']==9 and c['n_main_layers']==8" "$T/mtp.cat.json" ||
    fail "mtp: the catalog does not record 9 blocks, 8 main"
n8=$("$KVCTL" inspect --tensors "$mtp" | awk '$1 ~ /^blk\.8\./' | wc -l)
[ "$n8" -ge 20 ] || fail "mtp: the model has only $n8 blk.8 tensors"
for w in 0:3 3:6 6:8 6:9 2:8; do
    f="$T/mtp-${w/:/-}.gguf"
    "$KVCTL" slice "$mtp" --layers "$w" -o "$f" >/dev/null || { fail "mtp: slice $w"; continue; }
    out=$("$KVCTL" verify "$f" --catalog "$T/mtp.cat.json" 2>&1) || fail "mtp [$w): verify: $out"
    names=$("$KVCTL" inspect --tensors "$f" | awk '{ print $1 }')
    has8=$(echo "$names" | grep -c '^blk\.8\.')
    embd=$(echo "$names" | grep -cx 'token_embd.weight')
    head=$(echo "$names" | grep -cx 'output.weight')
    case $w in
    0:3) [ "$has8" = 0 ] && [ "$embd" = 1 ] && [ "$head" = 0 ] || fail "mtp first window $w: blk.8 $has8, token_embd $embd, output $head" ;;
    3:6) [ "$has8" = 0 ] && [ "$embd" = 0 ] && [ "$head" = 0 ] || fail "mtp middle window $w: blk.8 $has8, token_embd $embd, output $head" ;;
    *) [ "$has8" = "$n8" ] && [ "$embd" = 1 ] && [ "$head" = 1 ] || fail "mtp last window $w: blk.8 $has8 of $n8, token_embd $embd, output $head" ;;
    esac
done
out=$(python3 "$CHECK" "$T"/mtp-*.gguf 2>&1) || fail "mtp windows: strict reader: $out"

# synth: every arch and type; shapes and tensor sets
for arch in llama qwen2 qwen3; do
    for ty in f32 f16 q8_0 q4_0; do
        f="$T/synth-$arch-$ty.gguf"
        "$KVCTL" synth --arch $arch --layers 3 --embd 128 --ff 256 --heads 4 --kv-heads 2 --vocab 400 \
            --type $ty --seed 7 -o "$f" >/dev/null || { fail "synth $arch $ty"; continue; }
        info=$("$KVCTL" inspect --tensors --kv "$f") || { fail "inspect synth $arch $ty"; continue; }
        per=9; [ $arch = qwen2 ] && per=12; [ $arch = qwen3 ] && per=11
        echo "$info" | grep -q "^tensors     $((3 * per + 3)):" || fail "synth $arch $ty: tensor count"
        echo "$info" | grep -q "tokenizer   llama (SPM), 400 tokens, bos 1, eos 2" || fail "synth $arch $ty: vocab"
        echo "$info" | grep -q "blk.2.attn_q.weight *$ty *128x128 " || fail "synth $arch $ty: attn_q type/shape"
        echo "$info" | grep -q "blk.0.ffn_norm.weight *f32 *128 " || fail "synth $arch $ty: norm f32"
        echo "$info" | grep -q '"<0x0A>"\|tokenizer.ggml.tokens' || fail "synth $arch $ty: tokens"
        [ $arch = qwen2 ] && { echo "$info" | grep -q "blk.1.attn_k.bias *f32 *64 " || fail "qwen2 bias"; }
        [ $arch = qwen3 ] && { echo "$info" | grep -q "blk.1.attn_k_norm.weight *f32 *32 " || fail "qwen3 k_norm";
                               echo "$info" | grep -q "qwen3.attention.key_length *u32 *32" || fail "qwen3 key_length"; }
    done
done
out=$(python3 "$CHECK" "$T"/synth-*.gguf 2>&1) || fail "synth: strict reader: $out"
# same seed, same bytes; another seed, other bytes
"$KVCTL" synth --arch llama --layers 2 --embd 64 --ff 128 --heads 4 --vocab 300 --type q4_0 --seed 5 -o "$T/a.gguf" >/dev/null
"$KVCTL" synth --arch llama --layers 2 --embd 64 --ff 128 --heads 4 --vocab 300 --type q4_0 --seed 5 -o "$T/b.gguf" >/dev/null
"$KVCTL" synth --arch llama --layers 2 --embd 64 --ff 128 --heads 4 --vocab 300 --type q4_0 --seed 6 -o "$T/c.gguf" >/dev/null
cmp -s "$T/a.gguf" "$T/b.gguf" || fail "synth is not deterministic"
cmp -s "$T/a.gguf" "$T/c.gguf" && fail "synth ignores the seed"
# head-dim given (qwen3 style: heads*head_dim != embd) and tied output
"$KVCTL" synth --arch qwen3 --layers 2 --embd 128 --ff 256 --heads 4 --kv-heads 2 --head-dim 64 --vocab 300 \
    --type q8_0 --tied -o "$T/q3.gguf" >/dev/null || fail "synth qwen3 head-dim"
info=$("$KVCTL" inspect --tensors "$T/q3.gguf")
echo "$info" | grep -q "blk.0.attn_q.weight *q8_0 *128x256 " || fail "qwen3 head-dim q shape"
echo "$info" | grep -q "^  output.weight" && fail "--tied still has output.weight"
echo "$info" | grep -q "the head reuses token_embd" || fail "inspect does not say tied"
# synth in the K types: q4_k and q6_k put every 2-D weight in that type; q4_k_m is llama.cpp's
# Q4_K_M, q6_k for output.weight and for attn_v and ffn_down of the layers its use_more_bits
# picks (of 8: 0 and 7, the first and last eighth, and 3 and 6, every third between), q4_k for
# the rest, token_embd included (q6_k when tied: it is the head then). general.file_type is
# llama.cpp's number (Q4_K_S's 14 for plain q4_k). Greedy tokens are the same on the CPU
# device and the scalar oracle, or part at a near-tie (near_tie).
for ty in q4_k q6_k q4_k_m; do
    f="$T/synth-k-$ty.gguf"
    "$KVCTL" synth --arch llama --layers 8 --embd 256 --ff 512 --heads 4 --vocab 600 --type $ty \
        --seed 3 -o "$f" >/dev/null || { fail "synth $ty"; continue; }
    info=$("$KVCTL" inspect --tensors --kv "$f") || { fail "inspect synth $ty"; continue; }
    case $ty in q4_k) ft=14 ;; q6_k) ft=18 ;; q4_k_m) ft=15 ;; esac
    echo "$info" | grep -q "general.file_type *u32 *$ft$" || fail "synth $ty: general.file_type is not $ft"
    bad=$(echo "$info" | awk -v ty=$ty '
        $1 ~ /^(token_embd|output|blk\.[0-9]+\.(attn_[qkv]|attn_output|ffn_gate|ffn_up|ffn_down))\.weight$/ {
            n++; want = ty
            if (ty == "q4_k_m")
                want = $1 == "output.weight" || $1 ~ /^blk\.[0367]\.(attn_v|ffn_down)\./ ? "q6_k" : "q4_k"
            if ($2 != want) print $1 " is " $2 ", not " want
        }
        $1 ~ /_norm\.weight$/ && $2 != "f32" { print $1 " is " $2 ", not f32" }
        END { if (n != 58) print n " 2-D weights, not 58" }')
    [ -z "$bad" ] || fail "synth $ty: $bad"
    g_cpu=$("$KVCTL" generate -m "$f" --ids --tokens 1,300,400 -n 16 --temp 0 --ignore-eos 2>/dev/null)
    g_ref=$("$KVCTL" generate -m "$f" --ids --tokens 1,300,400 -n 16 --temp 0 --ignore-eos --device ref 2>/dev/null)
    [ -n "$g_cpu" ] && { [ "$g_cpu" = "$g_ref" ] || near_tie "$f" 1,300,400 "$g_ref" "$g_cpu" ref cpu; } ||
        fail "synth $ty: greedy tokens on cpu '$g_cpu', on ref '$g_ref'"
done
"$KVCTL" synth --arch qwen3 --layers 2 --embd 256 --ff 512 --heads 4 --kv-heads 2 --vocab 300 --type q4_k_m \
    --tied -o "$T/synth-k-tied.gguf" >/dev/null || fail "synth q4_k_m --tied"
info=$("$KVCTL" inspect --tensors "$T/synth-k-tied.gguf")
echo "$info" | grep -q "token_embd.weight *q6_k " || fail "synth q4_k_m --tied: token_embd is not q6_k"
echo "$info" | grep -q "blk.1.attn_v.weight *q6_k " || fail "synth q4_k_m: the last layer's attn_v is not q6_k"
out=$(python3 "$CHECK" "$T"/synth-k-*.gguf 2>&1) || fail "synth K types: strict reader: $out"
# synth refuses shapes the type cannot hold, naming them
"$KVCTL" synth --arch llama --embd 100 --heads 4 --type q8_0 -o "$T/x.gguf" 2>/dev/null && fail "embd 100 q8_0 accepted"
out=$("$KVCTL" synth --arch llama --embd 384 --ff 512 --heads 4 --type q4_k -o "$T/x.gguf" 2>&1) && fail "embd 384 q4_k accepted"
echo "$out" | grep -q "embd 384, ff 512 .* must be multiples of the q4_k block size 256" || fail "embd 384 q4_k message: $out"
out=$("$KVCTL" synth --arch llama --embd 256 --ff 640 --heads 4 --type q4_k_m -o "$T/x.gguf" 2>&1) && fail "ff 640 q4_k_m accepted"
echo "$out" | grep -q "ff 640 .* q4_k_m block size 256" || fail "ff 640 q4_k_m message: $out"
out=$("$KVCTL" synth --type q5_k -o "$T/x.gguf" 2>&1) && fail "--type q5_k accepted"
echo "$out" | grep -q "'q5_k' not one of f32, f16, q8_0, q4_0, q4_k, q6_k, q4_k_m" || fail "--type q5_k message: $out"
[ -e "$T/x.gguf" ] && fail "synth wrote a file for refused options"
"$KVCTL" synth --arch mamba -o "$T/x.gguf" 2>/dev/null && fail "unknown arch accepted"

echo "$n_models models checked"
finish

#!/bin/bash
# Rings of 1-4 stages over stories260K, TinyStories-656K and a synthetic Q4_0 model generate
# exactly what one process generates: greedy tokens equal to `kvctl generate`, the last
# position's logits bit-identical with --dtype f32, seeded sampling (temp 0.8, top-p 0.9)
# equal; an f16 wire still generates and sends half the boundary bytes.
. "$(dirname "$0")/../lib/ring_lib.sh"

PROMPT=1,400,300,200,100
N=24
for name in stories260K.gguf TinyStories-656K-Q8_0.gguf synth-llama-spm512-q4_0.gguf; do
    M=$(need_model $name) || exit 1
    one=$("$KVCTL" generate -m "$M" --ids --tokens $PROMPT -n $N --temp 0 --dump-logits "$TMP/one.lg" 2>/dev/null) ||
        fail "$name: one-process generate"
    ref=$("$TOOLS/tool-ring-ref" -m "$M" --tokens $PROMPT -n $N --temp 0 --dump-logits "$TMP/ref.lg") ||
        fail "$name: reference tool"
    [ "$one" = "$ref" ] || fail "$name: reference tool disagrees with kvctl generate: '$ref' vs '$one'"
    cmp -s "$TMP/one.lg" "$TMP/ref.lg" || fail "$name: kvctl generate -m --dump-logits differs from the reference tool's"
    seeded=$("$KVCTL" generate -m "$M" --ids --tokens $PROMPT -n $N --temp 0.8 --top-p 0.9 --seed 42 2>/dev/null) ||
        fail "$name: seeded one-process generate"
    for n in 1 2 3 4; do
        d="$TMP/r-$name-$n"
        if ! "$KVCTL" ring up --dir "$d" --model "$M" --stages $n > "$d.up" 2>&1; then
            grep -q "has only . layers" "$d.up" && { echo "skip $name $n stages: $(cat "$d.up")"; continue; }
            fail "ring up $name $n stages: $(cat "$d.up")"
        fi
        RINGS="$RINGS $d"
        # the windows come from the planner, not the byte-split fallback
        grep -q "^windows: the planner's split" "$d.up" || fail "$name, $n stages: windows not from the planner: $(cat "$d.up")"
        out=$("$KVCTL" generate --ring "$d" --ids --tokens $PROMPT -n $N --temp 0 --dump-logits "$TMP/ring.lg" 2>"$TMP/err") ||
            fail "$name, $n stages: generate --ring: $(cat "$TMP/err")"
        [ "$out" = "$one" ] || fail "$name, $n stages: greedy tokens differ: ring '$out' vs one process '$one'"
        cmp -s "$TMP/ring.lg" "$TMP/ref.lg" || fail "$name, $n stages: last logits not bit-identical"
        out=$("$KVCTL" generate --ring "$d" --ids --tokens $PROMPT -n $N --temp 0.8 --top-p 0.9 --seed 42 2>"$TMP/err") ||
            fail "$name, $n stages: seeded generate --ring: $(cat "$TMP/err")"
        [ "$out" = "$seeded" ] || fail "$name, $n stages: seeded tokens differ: ring '$out' vs '$seeded'"
        grep -q "prompt: 5 tokens" "$TMP/err" || fail "$name: statistics line missing on stderr"
        ring_down "$d"
        echo "ok $name $n stages"
    done
done

# Chunked prefill: a 7-token prompt in chunks of 2 rows (4 ACT frames per stage) gives the
# same tokens and logits as one process.
M=$(need_model stories260K.gguf) || exit 1
d="$TMP/chunk"
ring_up "$d" --model "$M" --stages 3 --max-batch 2
"$TOOLS/tool-ring-ref" -m "$M" --tokens 1,400,300,200,100,50,60 -n 16 --temp 0 --dump-logits "$TMP/ref7.lg" > "$TMP/ref7" ||
    fail "reference tool (7-token prompt)"
out=$("$KVCTL" generate --ring "$d" --ids --tokens 1,400,300,200,100,50,60 -n 16 --temp 0 --dump-logits "$TMP/ring7.lg" 2>"$TMP/err") ||
    fail "chunked prefill: $(cat "$TMP/err")"
[ "$out" = "$(cat "$TMP/ref7")" ] || fail "chunked prefill: tokens '$out' vs '$(cat "$TMP/ref7")'"
cmp -s "$TMP/ring7.lg" "$TMP/ref7.lg" || fail "chunked prefill: logits not bit-identical"
steps=$("$KVCTL" status --ring "$d" --json | head -1 | python3 -c 'import json,sys; print(json.load(sys.stdin)["steps"])')
[ "$steps" = 19 ] || fail "rank 0 ran $steps steps, expected 4 prefill chunks + 15 decode steps"
ring_down "$d"
echo "ok chunked prefill"

# Stages that hold only their mini-GGUF window (kvctl slice), as on separate hosts, each
# verified against the model's catalog: the same tokens as one process.
M=$(need_model stories260K.gguf) || exit 1
d="$TMP/mini"
ring_up "$d" --model "$M" --stages 2
ring_down "$d"
layers=$(python3 -c 'import json,sys; print(" ".join("%d:%d" % tuple(r["layers"]) for r in json.load(open(sys.argv[1]))["ranks"]))' "$d/ring.json")
r=0
for w in $layers; do
    "$KVCTL" slice "$M" --layers $w -o "$d/window-$r.gguf" > /dev/null || fail "slice $w"
    "$KVD" stage --manifest "$d/ring.json" --rank $r --window "$d/window-$r.gguf" --catalog "$d/catalog.json" \
        --state-dir "$d/rank-$r" -t 1 > "$d/rank-$r/kvd.log" 2>&1 &
    echo $! > "$d/rank-$r/kvd.pid"
    r=$((r + 1))
done
wait_linked "$d" 2 20 || fail "the mini-GGUF ring did not link"
out=$("$KVCTL" generate --ring "$d" --ids --tokens $PROMPT -n $N --temp 0 2>"$TMP/err") || fail "mini-GGUF ring: $(cat "$TMP/err")"
one=$("$KVCTL" generate -m "$M" --ids --tokens $PROMPT -n $N --temp 0 2>/dev/null)
[ "$out" = "$one" ] || fail "mini-GGUF ring: '$out' vs one process '$one'"
grep -q "window verified against catalog" "$d/rank-1/kvd.log" || fail "the window was not verified"
ring_down "$d"
echo "ok mini-GGUF windows"

# Text in, text out: -p through the ring prints what one process prints, stop strings too
# (the same --stop on both: the same text, ending at the stop string).
M=$(need_model stories260K.gguf) || exit 1
d="$TMP/text"
ring_up "$d" --model "$M" --stages 3
for extra in "" "--stop park" "--stop zzz --stop k."; do   # k.: "park" and "." are two tokens
    one=$("$KVCTL" generate -m "$M" -p "Once upon a time" -n 40 --temp 0 $extra 2>/dev/null) || fail "one-process -p $extra"
    out=$("$KVCTL" generate --ring "$d" -p "Once upon a time" -n 40 --temp 0 $extra 2>"$TMP/err") || fail "ring -p: $(cat "$TMP/err")"
    [ "$out" = "$one" ] || fail "text differs ($extra): ring '$out' vs one process '$one'"
    if [ -n "$extra" ]; then
        case "$out" in *"${extra##* }") ;; *) fail "$extra: the text does not end at the stop string: '$out'" ;; esac
        case "$full" in "$out"*) ;; *) fail "$extra: '$out' is not a prefix of '$full'" ;; esac
    else
        full=$out
    fi
done
ring_down "$d"
echo "ok text prompt and output"

# f16 wire: half the boundary bytes, still a sensible generation.
M=$(need_model stories260K.gguf) || exit 1
for dt in f32 f16; do
    d="$TMP/w-$dt"
    ring_up "$d" --model "$M" --stages 2 --dtype $dt
    out=$("$KVCTL" generate --ring "$d" --ids --tokens $PROMPT -n $N --temp 0 --ignore-eos 2>"$TMP/err") ||
        fail "$dt: generate: $(cat "$TMP/err")"
    [ $(echo "$out" | wc -w) -eq $N ] || fail "$dt: expected $N tokens, got '$out'"
    eval "bytes_$dt=\$(\"\$KVCTL\" status --ring \"\$d\" --json | head -1 | python3 -c 'import json,sys; print(int(json.load(sys.stdin)[\"boundary_bytes_out\"]))')"
    ring_down "$d"
done
# stories260K: n_embd 64, 5 prompt rows + 23 decode rows = 28 rows over 24 frames.
[ "$bytes_f32" -eq $((28 * 64 * 4 + 24 * 28)) ] || fail "f32 boundary bytes $bytes_f32, expected $((28 * 64 * 4 + 24 * 28))"
[ "$bytes_f16" -eq $((28 * 64 * 2 + 24 * 28)) ] || fail "f16 boundary bytes $bytes_f16, expected $((28 * 64 * 2 + 24 * 28))"
echo "ok wire bytes f32 $bytes_f32 f16 $bytes_f16"
echo "PASS"

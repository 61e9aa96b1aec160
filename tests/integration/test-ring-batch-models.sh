#!/bin/bash
# test-weight: 2 (several stages computing at once)
# Batched equals unbatched on every kind of model: 8 concurrent greedy sessions of mixed
# prompt lengths (1 to 40 tokens) through a 3-stage ring (f32 wire, each stage waiting a
# little for company so that steps of several sessions run as one window pass) give every
# session exactly its one-process tokens, for a dense model (TinyLlama Q4_0), a MoE
# (Qwen3-MoE Q4_K_M) and a hybrid (Qwen3.5, Gated DeltaNet + attention, F16); and the stages
# did batch (the status counts window runs that took several sessions).
. "$(dirname "$0")/../lib/ring_lib.sh"

DENSE=$(need_model TinyLLama-v0-q4_0.gguf) || exit 1
MOE=$(need_model synth-qwen3moe-bpe1024-q4_k_m.gguf) || exit 1
HYBRID=$(need_model synth-qwen35-bpe1024-f16.gguf) || exit 1

# Prompt i: i*5+1 ids (1, 6, 11, ... 36 tokens), drawn from a range every vocabulary has.
prompt() {
    python3 -c "import sys; i=int(sys.argv[1]); print(','.join(str(100 + (i * 37 + j * 11) % 200) for j in range(i * 5 + 1)))" "$1"
}

for M in "$DENSE" "$MOE" "$HYBRID"; do
    name=$(basename "$M" .gguf)
    D=$TMP/ring-$name
    ring_up "$D" --model "$M" --stages 3 --dtype f32 --batch-wait-us 2000 --ctx 256
    for i in $(seq 0 7); do
        "$KVCTL" generate -m "$M" --ids --tokens "$(prompt $i)" -n $((6 + 2 * i)) --temp 0 --ignore-eos \
            > "$TMP/one.$name.$i" 2>"$TMP/err1.$name.$i" || fail "$name: one-process generate $i: $(cat "$TMP/err1.$name.$i")"
    done
    # A wave: the 8 sessions at once through the ring, each its one-process output. On a loaded
    # machine the clients may start too far apart to overlap: waves run until every stage has
    # batched (5 at most), as in test-ring-concurrent.sh.
    waves=0
    while :; do
        waves=$((waves + 1))
        pids=""
        for i in $(seq 0 7); do
            "$KVCTL" generate --ring "$D" --ids --tokens "$(prompt $i)" -n $((6 + 2 * i)) --temp 0 --ignore-eos \
                > "$TMP/ring.$name.$i" 2>"$TMP/err.$name.$i" &
            pids="$pids $!"
        done
        EXTRA_PIDS="$pids"
        for p in $pids; do wait $p || fail "$name: a ring generate failed: $(cat "$TMP"/err.$name.*)"; done
        EXTRA_PIDS=""
        for i in $(seq 0 7); do
            [ -s "$TMP/one.$name.$i" ] || fail "$name: session $i: one-process run gave no tokens"
            cmp -s "$TMP/one.$name.$i" "$TMP/ring.$name.$i" ||
                fail "$name: session $i: ring '$(cat "$TMP/ring.$name.$i")' vs one process '$(cat "$TMP/one.$name.$i")'"
        done
        "$KVCTL" status --ring "$D" --json > "$TMP/status.$name" || fail "$name: status"
        python3 - "$TMP/status.$name" <<'PY' && break
import json, sys
runs = [json.loads(line)["batches"]["runs"] for line in open(sys.argv[1])]
print("batched window runs per stage:", runs)
sys.exit(0 if len(runs) == 3 and all(r > 0 for r in runs) else 1)
PY
        [ $waves -lt 5 ] && continue
        fail "$name: no stage ran several sessions' steps in one window pass in $waves waves: $(cat "$TMP/status.$name")"
        break
    done
    echo "ok $name: 8 concurrent sessions, batched ($waves wave(s)), equal their one-process outputs"
    ring_down "$D"
done
finish

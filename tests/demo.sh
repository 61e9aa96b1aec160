#!/bin/sh
# make demo: what Kvasir can do so far, end to end, on a synthetic model.
# Each stage is a function; later issues add theirs (ring, generate, ...) and call them at the end.
set -e
cd "$(dirname "$0")/.."
KVCTL=${KV_BUILD:-build}/kvctl
DEMO=${DEMO_DIR:-demo}
mkdir -p "$DEMO"

say() { printf '\n=== %s\n' "$*"; }
run() { echo "\$ $*"; "$@"; }

# Stage windows: a random-weight llama, inspected, cut into three stage mini-GGUFs, each
# inspected and verified against the model's catalog.
demo_windows() {
    MODEL=$DEMO/synth-llama.gguf
    say "a synthetic 6-layer llama (random weights, working SPM vocabulary)"
    run "$KVCTL" synth --arch llama --layers 6 --embd 256 --ff 768 --heads 8 --kv-heads 2 \
        --vocab 1024 --type q8_0 --seed 42 -o "$MODEL"
    say "what the model holds"
    run "$KVCTL" inspect "$MODEL"
    say "its catalog: per-tensor SHA-256; the catalog's own SHA-256 is the model id"
    echo "\$ $KVCTL catalog $MODEL -o $DEMO/synth-llama.catalog.json"
    MODEL_ID=$("$KVCTL" catalog "$MODEL" -o "$DEMO/synth-llama.catalog.json")
    echo "model id $MODEL_ID"
    say "three stage windows: layers [0,2) [2,4) [4,6)"
    for w in 0:2 2:4 4:6; do
        run "$KVCTL" slice "$MODEL" --layers $w -o "$DEMO/window-${w%:*}-${w#*:}.gguf"
    done
    for w in 0-2 2-4 4-6; do
        say "window $w"
        run "$KVCTL" inspect --tensors "$DEMO/window-$w.gguf" | sed -n '/^window/p;/^tensors/,$p'
        run "$KVCTL" verify "$DEMO/window-$w.gguf" --catalog "$DEMO/synth-llama.catalog.json"
    done
}

demo_windows
say "demo done (files in $DEMO/)"

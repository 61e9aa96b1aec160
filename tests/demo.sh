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

# The ring: three kvd stages on loopback over the synthetic model, each holding only its window;
# a streamed generation through the ring, the ring's status table, then ring down.
demo_ring() {
    RING=$DEMO/ring
    "$KVCTL" ring down --dir "$RING" >/dev/null 2>&1 || true
    say "a 3-stage ring on loopback: one kvd per window, two links each, tokens back to rank 0"
    run "$KVCTL" ring up --model "$MODEL" --stages 3 --dir "$RING"
    say "generate through the ring (text streams from rank 0 as tokens come round)"
    run "$KVCTL" generate --ring "$RING" -p "Once upon a time" -n 32 --temp 0.8 --seed 7
    say "the same tokens as one process"
    run "$KVCTL" generate --ring "$RING" -p "Once upon a time" -n 16 --temp 0 --ids
    run "$KVCTL" generate -m "$MODEL" -p "Once upon a time" -n 16 --temp 0 --ids
    say "the ring at a glance"
    run "$KVCTL" status --ring "$RING"
    run "$KVCTL" ring down --dir "$RING"
}

# Windows that travel: a seeder serves the model; a new stage pulls only its window (the
# bytes `kvctl slice` writes, verified tensor by tensor); then a ring whose stages pull their
# windows from the seeder instead of reading the model file.
demo_seeder() {
    KVD=${KV_BUILD:-build}/kvd
    say "a seeder serving the model over HTTP (kvd seeder)"
    rm -f "$DEMO/seeder.port"
    echo "\$ $KVD seeder --serve $MODEL,$DEMO/synth-llama.catalog.json --listen 127.0.0.1:0 &"
    "$KVD" seeder --serve "$MODEL,$DEMO/synth-llama.catalog.json" --listen 127.0.0.1:0 \
        --port-file "$DEMO/seeder.port" 2>"$DEMO/seeder.log" &
    SEEDER_PID=$!
    for _ in $(seq 100); do [ -s "$DEMO/seeder.port" ] && break; sleep 0.1; done
    URL=http://127.0.0.1:$(cat "$DEMO/seeder.port")
    run curl -s "$URL/v1/models"; echo
    say "pull only layers [2,4): identical to the sliced window"
    rm -f "$DEMO/pulled-2-4.gguf"
    run "$KVCTL" pull --from "$URL" --layers 2:4 -o "$DEMO/pulled-2-4.gguf" </dev/null
    run cmp "$DEMO/pulled-2-4.gguf" "$DEMO/window-2-4.gguf" && echo "byte-identical"
    say "a ring whose stages pull their windows from the seeder"
    "$KVCTL" ring down --dir "$DEMO/ring-pulled" >/dev/null 2>&1 || true
    run "$KVCTL" ring up --model "$MODEL" --stages 3 --dir "$DEMO/ring-pulled" --window-from "$URL"
    run "$KVCTL" generate --ring "$DEMO/ring-pulled" -p "Once upon a time" -n 16 --temp 0 --ids
    run "$KVCTL" ring down --dir "$DEMO/ring-pulled"
    kill "$SEEDER_PID" 2>/dev/null || true
    wait "$SEEDER_PID" 2>/dev/null || true
}

# Planning: this machine's profile for the model, then the documented Qwen3.5-122B-A10B
# example (docs/planner.md) over a mixed set of GPU, CPU servers, a laptop and NAT'd phones.
demo_plan() {
    say "this machine's device profile for the model (kvctl profile)"
    run "$KVCTL" profile --model "$MODEL" -t 2 --id this-machine
    say "Qwen3.5-122B-A10B (shape descriptor) over a GPU box, two CPU servers, a laptop and six phones: one session"
    run "$KVCTL" plan --model docs/examples/qwen3.5-122b-a10b.shape.json \
        --devices docs/examples/mixed-devices.json --relay relay.example.org:443 -o "$DEMO/ring-122b.json"
    say "the same for many sessions: every device helps, the phones' edges go through the relay"
    run "$KVCTL" plan --model docs/examples/qwen3.5-122b-a10b.shape.json \
        --devices docs/examples/mixed-devices.json --relay relay.example.org:443 \
        --objective throughput --sessions 16 -o "$DEMO/ring-122b-throughput.json"
    grep -o '"relay://[^"]*"' "$DEMO/ring-122b-throughput.json" | head -2
}

demo_windows
demo_ring
demo_seeder
demo_plan
say "demo done (files in $DEMO/)"

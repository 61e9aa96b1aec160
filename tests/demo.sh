#!/bin/sh
# make demo: what Kvasir can do so far, end to end, on a synthetic model (make demo
# MODEL=path.gguf: on that model instead).
# Each stage is a function (ring, generate, ...), called in order at the end.
set -e
cd "$(dirname "$0")/.."
KVCTL=${KV_BUILD:-build}/kvctl
DEMO=${DEMO_DIR:-demo}
USER_MODEL=${MODEL:-}   # make demo MODEL=path.gguf: that model instead of the synthetic one
mkdir -p "$DEMO"
SEEDER_PID=
# The seeder goes also when a step fails; the script's exit status stays.
trap 'rc=$?; [ -z "$SEEDER_PID" ] || kill "$SEEDER_PID" 2>/dev/null || :; exit $rc' EXIT

say() { printf '\n=== %s\n' "$*"; }
run() { echo "\$ $*"; "$@"; }

# Stage windows: a random-weight llama, inspected, cut into three stage mini-GGUFs, each
# inspected and verified against the model's catalog.
demo_windows() {
    if [ -n "$USER_MODEL" ]; then
        MODEL=$USER_MODEL
        [ -r "$MODEL" ] || { echo "make demo: MODEL=$MODEL: no such readable file" >&2; exit 1; }
        say "your model: $MODEL"
    else
        MODEL=$DEMO/synth-llama.gguf
        say "a synthetic 6-layer llama (random weights, working SPM vocabulary)"
        run "$KVCTL" synth --arch llama --layers 6 --embd 256 --ff 768 --heads 8 --kv-heads 2 \
            --vocab 1024 --type q8_0 --seed 42 -o "$MODEL"
    fi
    CATALOG=$DEMO/model.catalog.json
    say "what the model holds"
    run "$KVCTL" inspect "$MODEL"
    say "its catalog: per-tensor SHA-256; the catalog's own SHA-256 is the model id"
    echo "\$ $KVCTL catalog $MODEL -o $CATALOG"
    MODEL_ID=$("$KVCTL" catalog "$MODEL" -o "$CATALOG")
    echo "model id $MODEL_ID"
    # Three windows of about a third of the layers each (fewer stages for a 1- or 2-layer model).
    N_LAYERS=$("$KVCTL" inspect "$MODEL" | awk '$1 == "layers" { print $2; exit }')
    STAGES=3
    [ "$N_LAYERS" -lt 3 ] && STAGES=$N_LAYERS
    WINDOWS=""
    for i in $(seq 0 $((STAGES - 1))); do
        WINDOWS="$WINDOWS $((N_LAYERS * i / STAGES)):$((N_LAYERS * (i + 1) / STAGES))"
    done
    say "$STAGES stage windows of the $N_LAYERS layers:$WINDOWS (half-open [A,B))"
    for w in $WINDOWS; do
        run "$KVCTL" slice "$MODEL" --layers $w -o "$DEMO/window-${w%:*}-${w#*:}.gguf"
    done
    for w in $WINDOWS; do
        w=${w%:*}-${w#*:}
        say "window $w"
        run "$KVCTL" inspect --tensors "$DEMO/window-$w.gguf" | sed -n '/^window/p;/^tensors/,$p'
        run "$KVCTL" verify "$DEMO/window-$w.gguf" --catalog "$CATALOG"
    done
    PULL_W=$(echo $WINDOWS | awk '{ print (NF >= 2 ? $2 : $1) }')   # the window the seeder demo pulls
}

# The ring: three kvd stages on loopback over the synthetic model, each holding only its window;
# a streamed generation through the ring, the ring's status table, then ring down.
demo_ring() {
    RING=$DEMO/ring
    "$KVCTL" ring down --dir "$RING" >/dev/null 2>&1 || true
    say "a $STAGES-stage ring on loopback: one kvd per window, two links each, tokens back to rank 0"
    run "$KVCTL" ring up --model "$MODEL" --stages $STAGES --dir "$RING"
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
    echo "\$ $KVD seeder --serve $MODEL,$CATALOG --listen 127.0.0.1:0 &"
    "$KVD" seeder --serve "$MODEL,$CATALOG" --listen 127.0.0.1:0 \
        --port-file "$DEMO/seeder.port" 2>"$DEMO/seeder.log" &
    SEEDER_PID=$!
    for _ in $(seq 100); do [ -s "$DEMO/seeder.port" ] && break; sleep 0.1; done
    URL=http://127.0.0.1:$(cat "$DEMO/seeder.port")
    run curl -s "$URL/v1/models"; echo
    PW=${PULL_W%:*}-${PULL_W#*:}
    say "pull only layers [${PULL_W%:*},${PULL_W#*:}): identical to the sliced window"
    rm -f "$DEMO/pulled-$PW.gguf"
    run "$KVCTL" pull --from "$URL" --layers $PULL_W -o "$DEMO/pulled-$PW.gguf" </dev/null
    run cmp "$DEMO/pulled-$PW.gguf" "$DEMO/window-$PW.gguf" && echo "byte-identical"
    say "a ring whose stages pull their windows from the seeder"
    "$KVCTL" ring down --dir "$DEMO/ring-pulled" >/dev/null 2>&1 || true
    run "$KVCTL" ring up --model "$MODEL" --stages $STAGES --dir "$DEMO/ring-pulled" --window-from "$URL"
    run "$KVCTL" generate --ring "$DEMO/ring-pulled" -p "Once upon a time" -n 16 --temp 0 --ids
    run "$KVCTL" ring down --dir "$DEMO/ring-pulled"
    kill "$SEEDER_PID" 2>/dev/null || true
    wait "$SEEDER_PID" 2>/dev/null || true
}

# Planning: this machine's profile for the model, then the documented Qwen3.5-122B-A10B
# example (docs/planner.md) over a mixed set of GPU, CPU servers, a laptop and NAT'd phones.
demo_plan() {
    say "this machine's device profile for the model, with the node key of its kvd (kvctl profile --state-dir)"
    run "$KVCTL" profile --model "$MODEL" -t 2 --id this-machine --state-dir "$DEMO/this-machine"
    say "Qwen3.5-122B-A10B (shape descriptor: 48 blocks and the MTP block, which goes to the last rank) over a GPU box, two CPU servers, a laptop and six phones: one session"
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

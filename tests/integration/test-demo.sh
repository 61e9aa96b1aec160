#!/bin/bash
# test-demo: `make demo`'s script (tests/demo.sh) runs to the end on the synthetic model and
# shows what it promises: three windows verified against the catalog, a 3-stage ring on
# loopback that is linked, a generation through it whose greedy ids equal one process's, the
# status table, ring down, a window pulled from a seeder, the 122B plans with its MTP block on
# the last rank; then the same with MODEL= a real model (stories260K) instead of the synthetic
# one.
. "$(dirname "$0")/../lib/lib.sh"
# the demo's rings, wherever it put them
demo_rings_down() {
    local d
    for d in "$T"/*/ring "$T"/*/ring-pulled; do
        [ -d "$d" ] && ring_down "$d"
    done
}
at_exit demo_rings_down

M=$DATA/models/stories260K.gguf
need_data "$M"

# check LOG WHAT: the ring parts of the demo's output
check() {
    local log=$1 what=$2
    grep -q "^ring up in" "$log" || fail "$what: no ring up"
    grep -q "^=== a 3-stage ring on loopback" "$log" || fail "$what: not a 3-stage ring"
    [ "$(grep -cE '^[0-2] +\[[0-9]+, [0-9]+\) +[0-9]+ +127\.0\.0\.1:[0-9]+ +up +up' "$log")" -ge 6 ] ||
        fail "$what: the status tables do not show 3 linked stages twice (up and status)"
    local ring one
    ring=$(grep -A1 -- "generate --ring .* --temp 0 --ids" "$log" | sed -n 2p)
    one=$(grep -A1 -- "generate -m .* --temp 0 --ids" "$log" | sed -n 2p)
    [ -n "$ring" ] && [ "$ring" = "$one" ] || fail "$what: ring ids '$ring' != one-process ids '$one'"
    [ "$(echo "$ring" | wc -w)" = 16 ] || fail "$what: expected 16 ids, got '$ring'"
    grep -q "^ring down: 3 stages stopped" "$log" || fail "$what: no ring down"
    grep -q "^byte-identical" "$log" || fail "$what: the pulled window differs from the slice"
    grep -q "^=== demo done" "$log" || fail "$what: the demo did not finish"
}

DEMO_DIR=$T/synth KV_BUILD=$B tests/demo.sh > "$T/synth.log" 2>&1 || fail "demo (synthetic model) exit $?: $(tail -5 "$T/synth.log")"
check "$T/synth.log" "synthetic"
grep -q "^=== 3 stage windows of the 6 layers" "$T/synth.log" || fail "synthetic: not 3 windows of 6 layers"
[ "$(grep -c "tensors match catalog" "$T/synth.log")" = 3 ] || fail "synthetic: not 3 windows verified"
[ "$(grep -cE '^\+ 1 MTP block \(\[48, 49\), 1\.57 GB\) placed on rank [0-9]+ with the head \(drafting\)' "$T/synth.log")" = 2 ] ||
    fail "synthetic: the 122B plans do not place the MTP block on the last rank"

MODEL=$M DEMO_DIR=$T/user KV_BUILD=$B tests/demo.sh > "$T/user.log" 2>&1 || fail "demo MODEL=stories260K exit $?: $(tail -5 "$T/user.log")"
check "$T/user.log" "MODEL=stories260K"
grep -q "synth" "$T/user.log" && fail "MODEL=: the demo still wrote a synthetic model"

finish

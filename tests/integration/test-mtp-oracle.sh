#!/bin/bash
# test-mtp-oracle: the MTP drafter's logits (model_mtp_draft) against an independent scalar
# oracle of llama.cpp's MTP graph (tests/tools/tool-mtp-oracle.c), on copies of both Qwen3.5 test
# models with one random MTP block appended (kvctl synth --from MODEL --nextn 1 --seed 5): the
# dense F16 one and the MoE + shared expert Q8_0 one. For each, on the "cpu" and "ref"
# devices: the logits of every entry of a 12-token teacher-forced run within the bound of the
# exact oracle (double precision, no rounding) and mostly within 1e-5 of the rounded one
# (llama.cpp's activation and K/V rounding), the drafts = the oracle's argmax where its top-2
# gap is clear, chained drafts = the oracle's chain; the entries written in one call, row by
# row, in two passes, in chunks of 4 rows and by the last window alone give the same logits;
# -EINVAL past the written entries; no MTP (-ENOTSUP) on a window that is not the last and on
# the original model.
. "$(dirname "$0")/../lib/lib.sh"

need_exec "$KVCTL" "$TOOLS/tool-mtp-oracle"
for f in synth-qwen35-bpe1024-f16.gguf synth-qwen35moe-bpe1024-q8_0.gguf; do
    M=$(need_model $f) || continue
    C=$T/mtp-$f
    "$KVCTL" synth --from "$M" --nextn 1 --seed 5 -o "$C" > "$T/synth.out" 2>&1 ||
        { fail "$f: kvctl synth --from --nextn 1: $(cat "$T/synth.out")"; continue; }
    "$TOOLS/tool-mtp-oracle" "$C" "$M" > "$T/out" 2>&1
    rc=$?
    cat "$T/out"
    [ $rc -eq 0 ] || fail "$f: tool-mtp-oracle exited $rc"
    grep -q "^ok " "$T/out" || fail "$f: no ok line from tool-mtp-oracle"
    rm -f "$C"
done
finish

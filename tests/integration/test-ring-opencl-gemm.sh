#!/bin/bash
# test-weight: 2 (several stages computing at once)
# Prompt GEMMs through CLBlast on the OpenCL device (docs/opencl.md, "Prompt GEMMs"; PoCL here):
#  1. kvctl logits --backend opencl of a 40-token prompt in one batch (every matmul through
#     CLBlast, which the process reports) agrees with the same without GEMMs
#     (KV_CL_GEMM_ROWS=off; NMSE < 1e-6) and with the CPU (NMSE < 1e-3) on F32, F16, Q4_0, the
#     Q4_K_M mixture, Q8_0 and a hybrid MoE model;
#  2. greedy generation from that prompt on the OpenCL device gives the CPU's tokens, or they
#     part at a near-tie (near_tie, the rule of test-ring-opencl);
#  3. sessions batched across CLBlast prefills equal their solo runs: on a ring of two OpenCL
#     stages (runs of several sessions capped below the GEMM threshold: rows_allowed 15 on a
#     quantised window that the CPU would batch to 64) six sessions with prompts of 20-40
#     tokens, run one at a time and then all at once, give each the same tokens and the same
#     last logits, bit for bit; the stages ran runs of several sessions and their logs report
#     the GEMMs.
# Needs an OpenCL device (PoCL, the pocl-opencl-icd test package): without one it fails saying so.
. "$(dirname "$0")/../lib/ring_lib.sh"

export KV_CL_CACHE="$TMP/clcache"
unset KV_CL_GEMM_ROWS
clinfo -l 2>/dev/null | grep -q "Device" ||
    fail "no OpenCL device (clinfo -l lists none): install pocl-opencl-icd"

# ids LEN SEED: a prompt of LEN token ids below 500, comma-separated
ids() { python3 -c 'import sys; n, s = int(sys.argv[1]), int(sys.argv[2]); print(",".join(str((i * 37 + s * 101) % 499 + 1) for i in range(n)))' "$1" "$2"; }
nmse() {  # nmse A.f32 B.f32: over every row, B the reference
    python3 - "$1" "$2" <<'PY'
import struct, sys
a = open(sys.argv[1], "rb").read(); b = open(sys.argv[2], "rb").read()
assert len(a) == len(b) and a, (len(a), len(b))
x = struct.unpack("<%df" % (len(a) // 4), a); y = struct.unpack("<%df" % (len(b) // 4), b)
print("%.3g" % (sum((u - v) ** 2 for u, v in zip(x, y)) / max(sum(v * v for v in y), 1e-30)))
PY
}
below() { python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) < float(sys.argv[2]) else 1)' "$1" "$2"; }

P=$(ids 40 1)
for name in stories260K.gguf synth-llama-spm512-f16.gguf synth-llama-spm512-q4_0.gguf \
            synth-qwen2-bpe1024-q4_k_m.gguf synth-qwen3-bpe1024-q8_0.gguf \
            synth-qwen35moe-bpe1024-q8_0.gguf; do
    M=$(need_model "$name") || exit 1
    "$KVCTL" logits -m "$M" --tokens "$P" -o "$TMP/cpu.f32" >/dev/null 2>&1 || fail "$name: cpu logits"
    "$KVCTL" logits -m "$M" --tokens "$P" --backend opencl -o "$TMP/gemm.f32" >/dev/null 2>"$TMP/gemm.err" ||
        fail "$name: opencl logits: $(cat "$TMP/gemm.err")"
    grep -q "prompt GEMMs (CLBlast) from 16 rows" "$TMP/gemm.err" &&
        grep -Eq "opencl: [1-9][0-9]* matmuls through CLBlast" "$TMP/gemm.err" ||
        fail "$name: the prompt did not go through CLBlast: $(cat "$TMP/gemm.err")"
    KV_CL_GEMM_ROWS=off "$KVCTL" logits -m "$M" --tokens "$P" --backend opencl -o "$TMP/fused.f32" \
        >/dev/null 2>"$TMP/fused.err" || fail "$name: opencl logits without GEMMs: $(cat "$TMP/fused.err")"
    grep -q "prompt GEMMs (CLBlast) off" "$TMP/fused.err" && ! grep -q "through CLBlast" "$TMP/fused.err" ||
        fail "$name: KV_CL_GEMM_ROWS=off still used CLBlast: $(cat "$TMP/fused.err")"
    e_fused=$(nmse "$TMP/gemm.f32" "$TMP/fused.f32") e_cpu=$(nmse "$TMP/gemm.f32" "$TMP/cpu.f32")
    below "$e_fused" 1e-6 || fail "$name: CLBlast prefill vs the fused kernels: NMSE $e_fused"
    below "$e_cpu" 1e-3 || fail "$name: CLBlast prefill vs the CPU: NMSE $e_cpu"
    echo "ok $name: 40-row prefill through CLBlast, NMSE $e_fused vs the fused kernels, $e_cpu vs the CPU"

    one=$("$KVCTL" generate -m "$M" --ids --tokens "$P" -n 16 --temp 0 --ignore-eos 2>/dev/null) ||
        fail "$name: cpu generate"
    cl=$("$KVCTL" generate -m "$M" --ids --tokens "$P" -n 16 --temp 0 --ignore-eos --backend opencl 2>"$TMP/gen.err") ||
        fail "$name: opencl generate: $(cat "$TMP/gen.err")"
    grep -Eq "opencl: [1-9][0-9]* matmuls through CLBlast" "$TMP/gen.err" || fail "$name: generate's prompt skipped CLBlast"
    if [ "$cl" = "$one" ]; then
        echo "ok $name: greedy tokens after a CLBlast prefill = the CPU's"
    elif near_tie "$M" "$P" "$one" "$cl" cpu opencl; then
        echo "ok $name: greedy tokens after a CLBlast prefill = the CPU's up to a near-tie"
    else
        fail "$name: greedy tokens differ beyond a near-tie: opencl '$cl' vs cpu '$one'"
    fi
done

# ---- sessions batched across CLBlast prefills = their solo runs ----
M=$(need_model synth-llama-spm512-q4_0.gguf) || exit 1
d=$TMP/ring
ring_up "$d" --model "$M" --stages 2 --backends opencl,opencl --batch-wait-us 3000
for r in 0 1; do
    grep -q "opencl prompt GEMMs (CLBlast) from 16 rows: runs of several sessions take at most 15" \
        "$d/rank-$r/kvd.log" || fail "rank $r: no GEMM threshold in its log"
done
lens=(20 24 28 32 36 40)
for i in "${!lens[@]}"; do
    "$KVCTL" generate --ring "$d" --ids --tokens "$(ids "${lens[$i]}" $((i + 2)))" -n 16 --temp 0 \
        --ignore-eos --dump-logits "$TMP/solo.$i.f32" > "$TMP/solo.$i" 2>"$TMP/solo.err.$i" ||
        fail "solo session $i: $(cat "$TMP/solo.err.$i")"
done
status() {  # 0: both stages capped at 15 rows and one ran several sessions' steps at once; 3: none yet
    "$KVCTL" status --ring "$d" --json > "$TMP/status" || return 2
    python3 - "$TMP/status" <<'PY'
import json, sys
runs = 0
for line in open(sys.argv[1]):
    s = json.loads(line)
    b = s["batches"]
    assert b["rows_allowed"] == 15 and b["max_rows"] <= 15, b
    runs += b["runs"] if b["max_steps"] >= 2 else 0
print("runs of several sessions:", runs)
sys.exit(0 if runs > 0 else 3)
PY
}
wave() {  # the six sessions at once, each its solo tokens
    local i p pids=""
    for i in "${!lens[@]}"; do
        "$KVCTL" generate --ring "$d" --ids --tokens "$(ids "${lens[$i]}" $((i + 2)))" -n 16 --temp 0 \
            --ignore-eos --dump-logits "$TMP/conc.$i.f32" > "$TMP/conc.$i" 2>"$TMP/conc.err.$i" &
        pids="$pids $!"
    done
    i=0
    for p in $pids; do
        wait "$p" || fail "concurrent session $i: $(cat "$TMP/conc.err.$i")"
        cmp -s "$TMP/solo.$i" "$TMP/conc.$i" || fail "session $i batched differs from its solo run:
batched: $(cat "$TMP/conc.$i")
solo:    $(cat "$TMP/solo.$i")"
        cmp -s "$TMP/solo.$i.f32" "$TMP/conc.$i.f32" ||
            fail "session $i batched: its last logits are not its solo run's, bit for bit"
        i=$((i + 1))
    done
}
waves=0
while :; do
    waves=$((waves + 1))
    wave
    status
    rc=$?
    if [ $rc = 0 ]; then
        echo "ok 6 sessions batched across CLBlast prefills = their solo runs ($waves wave(s))"
        break
    elif [ $rc != 3 ]; then
        fail "the stages' batching is wrong: $(cat "$TMP/status")"
        break
    elif [ $waves -ge 5 ]; then
        fail "no run took several sessions' steps in $waves waves: $(cat "$TMP/status")"
        break
    fi
done
for r in 0 1; do
    grep -q "opencl: prompt GEMMs through CLBlast" "$d/rank-$r/kvd.log" ||
        fail "rank $r ran no prompt GEMM: $(tail -n 5 "$d/rank-$r/kvd.log")"
done
ring_down "$d"
finish

#!/bin/bash
# A mixed ring: rank 0 and rank 2 on the CPU, rank 1 on the OpenCL device (the manifest's
# per-rank "backend", written by kvctl ring up --backends) generates the same greedy tokens as
# one CPU process, for a dense F32, a Q4_0 and a hybrid MoE model; `kvd stage --backend`
# overrides the manifest. A stage told to use a backend it cannot open refuses to start,
# naming what it found: no OpenCL platform at all (an empty ICD list), a platform index past
# the ones there are, a backend this kvd does not have. Needs an OpenCL device (PoCL here,
# the pocl-opencl-icd test package); without one the mixed rings fail saying so.
. "$(dirname "$0")/../lib/ring_lib.sh"

export KV_CL_CACHE="$TMP/clcache"
clinfo -l 2>/dev/null | grep -q "Device" ||
    fail "no OpenCL device (clinfo -l lists none): install pocl-opencl-icd"

N=16
for spec in stories260K.gguf:1,400,300,200,100 synth-llama-spm512-q4_0.gguf:1,400,300,200,100 \
            synth-qwen35moe-bpe1024-q8_0.gguf:46,837,263,640,11,257; do
    name=${spec%%:*} PROMPT=${spec#*:}
    M=$(need_model "$name") || exit 1
    one=$("$KVCTL" generate -m "$M" --ids --tokens $PROMPT -n $N --temp 0 --ignore-eos 2>/dev/null) ||
        fail "$name: one-process generate"
    d="$TMP/mixed-$name"
    ring_up "$d" --model "$M" --stages 3 --backends cpu,opencl,cpu
    grep -q '"backend":[[:space:]]*"opencl"' "$d/ring.json" || fail "$name: manifest has no opencl rank"
    for r in 0 2; do
        grep -q "kernel device cpu" "$d/rank-$r/kvd.log" || fail "$name: rank $r is not on cpu"
    done
    grep -q "kernel device opencl" "$d/rank-1/kvd.log" || fail "$name: rank 1 is not on opencl"
    out=$("$KVCTL" generate --ring "$d" --ids --tokens $PROMPT -n $N --temp 0 --ignore-eos 2>"$TMP/err") ||
        fail "$name: generate --ring: $(cat "$TMP/err")"
    if [ "$out" = "$one" ]; then
        echo "ok $name: cpu, opencl, cpu ring = one CPU process"
    else
        # The OpenCL device sums in another order than the CPU (docs/opencl.md): greedy
        # tokens agree up to near-ties. Where they part, the two tokens must be a near-tie
        # in the one-process logits at that position (teacher-forced on the common prefix),
        # and both devices' logits there must agree by NMSE.
        if near_tie "$M" "$PROMPT" "$one" "$out" cpu opencl; then
            echo "ok $name: cpu, opencl, cpu ring = one CPU process up to a near-tie"
        else
            fail "$name: greedy tokens differ beyond a near-tie: mixed ring '$out' vs one CPU process '$one'"
        fi
    fi
    ring_down "$d"
done

# Refusals, on the last ring's manifest and state (rank 1, stopped): its manifest entry says
# opencl; --backend cuda overrides it.
stage() {  # stage LOG ARGS...: run rank 1 of $d in the foreground; its exit status
    local log=$1
    shift
    timeout 60 "$KVD" stage --manifest "$d/ring.json" --rank 1 --state-dir "$d/rank-1" \
        --model "$M" "$@" > "$log" 2>&1
}
mkdir -p "$TMP/no-icd"
OCL_ICD_VENDORS="$TMP/no-icd" stage "$TMP/s1.log" && fail "a stage without an OpenCL platform started"
grep -q "no OpenCL platform found" "$TMP/s1.log" || fail "no platform: message: $(cat "$TMP/s1.log")"
stage "$TMP/s2.log" --cl-platform 9 && fail "a stage on platform 9 started"
grep -q "platform 9: there are 1 (0: " "$TMP/s2.log" || fail "platform 9: message: $(cat "$TMP/s2.log")"
stage "$TMP/s3.log" --backend cuda && fail "a stage on a backend kvd lacks started"
grep -q "cuda: unknown (there are cpu, ref, opencl)" "$TMP/s3.log" || fail "cuda: message: $(cat "$TMP/s3.log")"
echo "ok refusals name what there is"
finish

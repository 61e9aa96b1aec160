#!/bin/sh
# make bench: speed figures (never pass/fail).
#
# Model: a TinyLlama-1.1B-shaped random model (22 layers, n_embd 2048, n_ff 5632, 32 heads,
# 4 KV heads, 32000 vocab) in Q4_0 and Q8_0, written once by `kvctl synth` into build/bench/,
# run by `kvctl bench` with the default thread count. Generation reads every weight once per
# token, so its ceiling is memory read bandwidth / weight bytes per token; the script prints
# the measured bandwidth, that ceiling and the fraction of it reached (goal: >= 60%), plus the
# CPU time per token, which says what the threads would reach with their cores to themselves
# (the figures in tok/s suffer when other programs share the machine: see the load average).
# BENCH_PP / BENCH_TG / BENCH_REPS / BENCH_THREADS override the sizes (threads 0 = default).
set -e
cd "$(dirname "$0")/.."
B=${KV_BUILD:-build}
KVCTL=$B/kvctl
CACHE=$B/bench
mkdir -p "$CACHE"
PP=${BENCH_PP:-64}
TG=${BENCH_TG:-32}
REPS=${BENCH_REPS:-3}
THREADS=${BENCH_THREADS:-0}

# The kernels' tools (matvec micro-benchmark) are not part of `make all`.
make -s -j2 "$B/tests/tool-kernbench" >/dev/null 2>&1 || true

echo "== model: TinyLlama-1.1B-shaped synthetic model, kvctl bench -p $PP -n $TG (best of $REPS)"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
for type in q4_0 q8_0; do
    f="$CACHE/tinyllama-1.1b-shape-$type.gguf"
    if [ ! -s "$f" ]; then
        echo "writing $f ..."
        if ! "$KVCTL" synth --arch llama --layers 22 --embd 2048 --ff 5632 --heads 32 \
                --kv-heads 4 --vocab 32000 --type "$type" --seed 1 -o "$f" >/dev/null; then
            echo "$type: kvctl synth failed; skipped"
            rm -f "$f"
            continue
        fi
    fi
    if ! out=$("$KVCTL" bench -m "$f" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" --bandwidth); then
        echo "$type: kvctl bench failed"
        continue
    fi
    get() { echo "$out" | awk -v k="$1" '$1 == k {print $2}'; }
    bytes=$(get weight_bytes_per_token)
    bw=$(get bandwidth)
    cpu=$(get tg_cpu_ms_per_token)
    thr=$(get threads)
    pp=$(echo "$out" | awk '/^pp[0-9]+ / {print $2}')
    tg=$(echo "$out" | awk '/^tg[0-9]+ / {print $2}')
    awk -v t="$type" -v b="$bytes" -v bw="$bw" -v pp="$pp" -v tg="$tg" -v cpu="$cpu" \
        -v thr="${thr%,}" -v np="$PP" -v nt="$TG" 'BEGIN {
        ceil = bw * 1e9 / b;
        printf "%s: %.0f MB of weights per token, %s threads, read bandwidth %.2f GB/s\n", t, b / 1e6, thr, bw;
        printf "  pp%d %8.2f tok/s\n", np, pp;
        printf "  tg%d %8.2f tok/s = %3.0f%% of the bandwidth ceiling %.2f tok/s (goal >= 60%%)\n", nt, tg, 100 * tg / ceil, ceil;
        if (cpu > 0) {
            est = thr * 1000 / cpu; if (est > ceil) est = ceil;
            printf "  tg CPU time %.1f ms per token: with %s idle cores about %.2f tok/s = %3.0f%% of the ceiling\n", cpu, thr, est, 100 * est / ceil;
        }
    }'
done

echo "== kernels: matvec on TinyLlama-1.1B-shaped matrices (22 layers' worth, uncached) vs read bandwidth"
if [ -x "$B/tests/tool-kernbench" ]; then
    if [ "$THREADS" -gt 0 ] 2>/dev/null; then kt="-t $THREADS"; else kt=""; fi
    "$B/tests/tool-kernbench" $kt q4_0 q8_0 q4_k q6_k f16 || echo "kernbench failed"
    echo "== kernels: compute efficiency (one thread, cache-resident; holds on a busy machine)"
    "$B/tests/tool-kernbench" -c q4_0 q8_0 q4_k q6_k f16 || true
    "$B/tests/tool-kernbench" -c -n 64 q4_0 q8_0 || true
else
    echo "tool-kernbench not built"
fi

echo "== planner: 96 layers over 1000 devices (goal: well under a second)"
make -s -j2 "$B/tests/tool-plan-bench" >/dev/null 2>&1 || true
if [ -x "$B/tests/tool-plan-bench" ]; then "$B/tests/tool-plan-bench" || echo "plan bench failed"; else echo "tool-plan-bench not built"; fi

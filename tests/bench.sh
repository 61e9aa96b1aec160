#!/bin/sh
# make bench: speed figures (never pass/fail).
#
# Model: a TinyLlama-1.1B-shaped random model (22 layers, n_embd 2048, n_ff 5632, 32 heads,
# 4 KV heads, 32000 vocab) in Q4_0 and Q8_0, written once by `kvctl synth` into build/bench/,
# run by `kvctl bench` with the default thread count. Generation reads every weight once per
# token, so its ceiling is memory bandwidth / weight bytes per token; the script prints the
# measured bandwidth, that ceiling and how far generation is from it (goal: >= 60%).
# BENCH_PP / BENCH_TG / BENCH_REPS / BENCH_THREADS override the sizes.
set -e
cd "$(dirname "$0")/.."
B=${KV_BUILD:-build}
KVCTL=$B/kvctl
CACHE=$B/bench
mkdir -p "$CACHE"
PP=${BENCH_PP:-64}
TG=${BENCH_TG:-32}
REPS=${BENCH_REPS:-2}
THREADS=${BENCH_THREADS:-0}

# Memory bandwidth (bytes/s): the kernels' measurement tool when built.
bw=""
for t in "$B/tests/tool-membw" "$B/tests/tool-bandwidth"; do
    if [ -x "$t" ]; then
        bw=$("$t" 2>/dev/null | awk '/bytes_s|bytes\/s/ {for (i = 1; i <= NF; i++) if ($i ~ /^[0-9.eE+]+$/) v = $i} END {print v}')
        [ -n "$bw" ] && break
    fi
done
if [ -n "$bw" ]; then
    echo "memory bandwidth: $(awk -v b="$bw" 'BEGIN {printf "%.2f GB/s", b / 1e9}')"
else
    echo "memory bandwidth: unknown (no bandwidth tool built)"
fi

echo "== model: TinyLlama-1.1B-shaped synthetic, kvctl bench -p $PP -n $TG"
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
    out=$("$KVCTL" bench -m "$f" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS")
    bytes=$(echo "$out" | awk '/^weight_bytes_per_token/ {print $2}')
    pp=$(echo "$out" | awk '/^pp[0-9]+ / {print $2}')
    tg=$(echo "$out" | awk '/^tg[0-9]+ / {print $2}')
    thr=$(echo "$out" | awk '/^threads/ {print $2, $3, $4}')
    printf '%s: %s MB of weights per token, %s\n' "$type" \
        "$(awk -v b="$bytes" 'BEGIN {printf "%.0f", b / 1e6}')" "$thr"
    printf '  pp%s %8.2f tok/s\n  tg%s %8.2f tok/s' "$PP" "$pp" "$TG" "$tg"
    if [ -n "$bw" ]; then
        awk -v b="$bytes" -v bw="$bw" -v tg="$tg" 'BEGIN {
            ceil = bw / b;
            printf "   ceiling %.2f tok/s (bandwidth / weight bytes): %.0f%% of it\n", ceil, 100 * tg / ceil }'
    else
        echo
    fi
done

#!/bin/sh
# bench-vs-llama.sh LLAMA_BENCH_BIN [files.gguf...]: Kvasir's kernels against llama.cpp's on
# the same GGUF files, side by side (a benchmark, never pass/fail; docs/kernels.md, "Against
# llama.cpp").
#
# For each file and each of BENCH_VS_ROUNDS rounds (default 3), interleaved so that both see
# the same moments of a shared machine's load:
#   llama-bench -m F -p 64,512 -n 32 -t T -r 1 -o jsonl
#   kvctl bench -m F -p 64 -n 32 -t T -r 1 --sessions 8    (pp64, tg32, 8 sessions' decode)
#   kvctl bench -m F -p 512 -n 0 -t T -r 1                 (pp512)
#   llama-batched-bench -m F -npp 64 -ntg 32 -npl 8 -t T   (8 sequences decoding together)
# then prints the file's row of one table (as each file is done): the best round of each
# figure and the ratios Kvasir / llama.cpp for prompt processing (pp64, pp512), generation
# (tg32) and batched decode (8 sessions' aggregate tok/s of 32 steps each, every step one row
# per session in one pass).
#
# Without files it uses TinyLlama-1.1B-shaped models in build/bench/ (BENCH_VS_DIR), writing
# those missing: F16, Q4_0, Q8_0 by `kvctl synth`, and Q4_K_M, Q5_K_M, Q6_K from the F16 one
# by llama.cpp's llama-quantize when it is next to LLAMA_BENCH_BIN (else those rows are
# skipped). llama-batched-bench is looked for next to LLAMA_BENCH_BIN too (LLAMA_BATCHED_BENCH
# overrides; without it the batched row is skipped).
# BENCH_VS_THREADS (default 2), BENCH_VS_ROUNDS (default 3), BENCH_VS_TYPES (default
# "q4_0 q8_0 q4_k_m q5_k_m q6_k") choose the rest. Without a usable LLAMA_BENCH_BIN the script
# says so and exits 0.
set -e
cd "$(dirname "$0")/../.."
B=${KV_BUILD:-build}
KVCTL=$B/kvctl
LB=${1:-}
[ $# -gt 0 ] && shift
if [ -z "$LB" ] || [ ! -x "$LB" ]; then
    echo "bench-vs-llama: skipped: no llama-bench binary${LB:+ at $LB} (usage: $0 LLAMA_BENCH_BIN [files.gguf...])"
    exit 0
fi
if [ ! -x "$KVCTL" ]; then
    echo "bench-vs-llama: skipped: $KVCTL not built (make)"
    exit 0
fi
LDIR=$(dirname "$LB")
LBB=${LLAMA_BATCHED_BENCH:-$LDIR/llama-batched-bench}
LQ=$LDIR/llama-quantize
T=${BENCH_VS_THREADS:-2}
ROUNDS=${BENCH_VS_ROUNDS:-3}
DIR=${BENCH_VS_DIR:-$B/bench}
TYPES=${BENCH_VS_TYPES:-q4_0 q8_0 q4_k_m q5_k_m q6_k}

# model FILE TYPE: write the TinyLlama-shaped model FILE of TYPE if it is missing (0 when
# it is there afterwards).
model() {
    [ -s "$1" ] && return 0
    case "$2" in
    f16 | f32 | q4_0 | q8_0)   # what `kvctl synth` writes
        echo "writing $1 ..."
        "$KVCTL" synth --arch llama --layers 22 --embd 2048 --ff 5632 --heads 32 --kv-heads 4 \
            --vocab 32000 --type "$2" --seed 1 -o "$1" >/dev/null || { rm -f "$1"; return 1; }
        ;;
    *)  # every other type (q4_k_m, q5_k_m, q6_k, ...) comes from the F16 model through llama.cpp's quantizer
        [ -x "$LQ" ] || { echo "$2: no llama-quantize next to $LB; skipped"; return 1; }
        src=$DIR/tinyllama-1.1b-shape-f16.gguf
        model "$src" f16 || return 1
        echo "writing $1 (llama-quantize $(echo "$2" | tr a-z A-Z)) ..."
        "$LQ" "$src" "$1" "$(echo "$2" | tr a-z A-Z)" >"$1.log" 2>&1 ||
            { tail -3 "$1.log"; rm -f "$1"; return 1; }
        rm -f "$1.log"
        ;;
    esac
}

if [ $# -eq 0 ]; then
    mkdir -p "$DIR"
    for t in $TYPES; do
        f=$DIR/tinyllama-1.1b-shape-$t.gguf
        model "$f" "$t" && set -- "$@" "$f"
    done
fi
[ $# -gt 0 ] || { echo "bench-vs-llama: no model files"; exit 0; }

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
trap 'exit 130' INT TERM

# best KEY FILE: the largest value of KEY over the "KEY value" lines of FILE ("" when none).
best() {
    awk -v k="$1" '$1 == k && $2 + 0 > b {b = $2 + 0; s = 1} END {if (s) print b}' "$2"
}

# row LABEL FILE KEYS...: "| label | llama | kvasir | ratio |..." for each metric
row() {
    lbl=$1 r=$2
    shift 2
    line="| $lbl |"
    for m in "$@"; do
        l=$(best "l_$m" "$r") k=$(best "k_$m" "$r")
        line="$line $(awk -v l="$l" -v k="$k" 'BEGIN {
            printf "%s | %s | %s |", l == "" ? "-" : sprintf("%.1f", l), k == "" ? "-" : sprintf("%.1f", k),
                   (l == "" || k == "" || l == 0) ? "-" : sprintf("%.2f", k / l) }')"
    done
    echo "$line"
}

label() { basename "$1" .gguf | sed 's/^tinyllama-1.1b-shape-//' | tr a-z A-Z; }

echo "== bench-vs-llama: $T threads, best of $ROUNDS interleaved rounds, $(nproc) CPUs"
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "tok/s; ratio = Kvasir / llama.cpp; 8 x tg32 = 8 sessions decoding 32 steps together, aggregate"
echo "(llama-batched-bench -npp 64 -ntg 32 -npl 8 vs kvctl bench --sessions 8); a row per file as it is done"
echo
echo "| model | llama.cpp pp64 | Kvasir pp64 | ratio | llama.cpp pp512 | Kvasir pp512 | ratio | llama.cpp tg32 | Kvasir tg32 | ratio | llama.cpp 8 x tg32 | Kvasir 8 x tg32 | ratio |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
i=0
for f in "$@"; do
    i=$((i + 1))
    r=$out/$i
    : >"$r"
    for round in $(seq "$ROUNDS"); do
        if "$LB" -m "$f" -p 64,512 -n 32 -t "$T" -r 1 -o jsonl >"$r.lb" 2>"$r.err"; then
            sed -n 's/.*"n_prompt": \([0-9]*\), "n_gen": \([0-9]*\),.*"avg_ts": \([0-9.e+]*\),.*/\1 \2 \3/p' "$r.lb" |
                awk '$2 == 0 {print "l_pp" $1, $3} $1 == 0 {print "l_tg" $2, $3}' >>"$r"
        else
            echo "$f: llama-bench failed: $(tail -1 "$r.err")"
        fi
        if "$KVCTL" bench -m "$f" -p 64 -n 32 -t "$T" -r 1 --sessions 8 >"$r.kv" 2>"$r.err"; then
            awk '/^pp64 / {print "k_pp64", $2} /^tg32 / {print "k_tg32", $2}
                 /^tg32_sessions 8 / {print "k_b8", $3}' "$r.kv" >>"$r"
        else
            echo "$f: kvctl bench failed: $(tail -1 "$r.err")"
        fi
        if "$KVCTL" bench -m "$f" -p 512 -n 0 -t "$T" -r 1 >"$r.kv" 2>"$r.err"; then
            awk '/^pp512 / {print "k_pp512", $2}' "$r.kv" >>"$r"
        fi
        if [ -x "$LBB" ] && "$LBB" -m "$f" -c 1024 -b 512 -ub 512 -npp 64 -ntg 32 -npl 8 \
                -t "$T" -tb "$T" >"$r.bb" 2>&1; then
            # | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
            awk -F'|' '$4 + 0 == 8 && $2 + 0 == 64 {gsub(/ /, "", $9); print "l_b8", $9}' "$r.bb" >>"$r"
        fi
    done
    row "$(label "$f")" "$r" pp64 pp512 tg32 b8
done
echo
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"

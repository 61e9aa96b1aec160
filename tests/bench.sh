#!/bin/sh
# make bench: speed figures and ratios (never pass/fail, never part of `make test`).
#
# Model: a TinyLlama-1.1B-shaped random model (22 layers, n_embd 2048, n_ff 5632, 32 heads,
# 4 KV heads, 32000 vocab) in Q4_0, Q8_0 and Q4_K_M, written once by `kvctl synth` into
# build/bench/, run by `kvctl bench` with the default thread count. Generation reads every
# weight once per token, so its ceiling is memory read bandwidth / weight bytes per token;
# the script prints the measured bandwidth, that ceiling and the fraction of it reached
# (goal: >= 60%), plus the CPU time per token, which says what the threads would reach with
# their cores to themselves (the figures in tok/s suffer when other programs share the
# machine: see the load average), and eight sessions decoding together (`kvctl bench
# --sessions 1,8`: their aggregate tok/s and what a step of eight rows costs in one-row
# steps, goal <= 1.3).
# BENCH_PP / BENCH_TG / BENCH_REPS / BENCH_THREADS override the sizes (threads 0 = default).
#
# Ring: what a loopback ring costs against one process, on one model (default a 12-layer
# n_embd 1024 Q4_0 synthetic llama written into build/bench/, so the section takes about a
# minute on 2 cores; BENCH_RING_MODEL=build/bench/tinyllama-1.1b-shape-q4_0.gguf gives the
# target figures), with the same T threads per stage and for the one process
# (BENCH_RING_THREADS, default 1):
#   - decode tok/s of one greedy session of 64 tokens (BENCH_RING_TG) through 1-, 2- and
#     3-stage rings vs `kvctl generate -m` (best of 3, BENCH_RING_REPS, alternated) and
#     `kvctl bench`; ratio ring / one process (goal for 3 stages: >= 0.95x), and the median
#     and range of each rep's own ratio; then 9 pairs (BENCH_RING_PAIRS) of 32-token runs
#     (BENCH_RING_PAIR_TG) alternated between the 3-stage ring and one process holding the
#     whole model as a 1-stage ring (same kvd and client path, no model load between runs,
#     each side first in turn): the median of the pairs' ratios, the figure that holds on a
#     host whose speed drifts from second to second (BENCH_RING_SKIP=pairs leaves it out);
#   - the sealed records' cost: seal + open of one decode boundary frame (tests/tools/tool-rec-bench,
#     best of 5 rounds) times the 3 edges a token crosses, as a share of the 3-stage ring's
#     time per token (goal < 2%);
#   - boundary bytes per token on each edge (`kvctl status --ring --json`);
#   - CPU seconds of an idle 3-stage ring (no session) over 5 s (BENCH_RING_IDLE_S), all
#     stages' utime + stime from /proc/PID/stat, once after the ring is up and once after the
#     sessions (goal ~0);
#   - CPU milliseconds per generated token of one 256-token session (BENCH_RING_CPU_TG) less
#     a 1-token one (so the model's opening and the prompt drop out): all three stages
#     (/proc/PID/stat) vs the one process (its rusage), the least of 3 each, and their ratio;
#   - aggregate decode tok/s of 1, 4, 8 and 16 concurrent sessions (BENCH_RING_SESSIONS) of
#     64 tokens, run by tests/tools/tool-ring-clients (all tokens / wall time from the first request
#     to the last end), in BENCH_RING_REPS rounds of one session then each K: the best of
#     each K, its ratio to the best single session and the median and range of the rounds'
#     own ratios (goal >= 3x at 8 sessions, where the machine
#     has the cores: the ceiling is min(3 stages, CPUs / T)), the longest gap one session saw
#     between two of its streamed tokens, and the longest wait for a first token; then the
#     same counts for one process batching them (`kvctl bench --sessions`: one row per session
#     in each window pass), as ratios to one session;
#   - the batching scheduler (BENCH_RING_SKIP=fair leaves it out): a 3-stage ring of an F16
#     model of the same shape, whose windows batch several sessions' steps, with
#     --batch-wait-us W (BENCH_RING_BATCH_WAIT_US, default 2000; BENCH_RING_BATCH_MODEL):
#     32 sessions at once (BENCH_RING_MIXED) with mixed prompt lengths (BENCH_RING_PROMPTS,
#     default 3,8,17,33,64), and each stage's longest wait of one step from being queued to
#     its run starting (status: batches.max_wait_ms; a prompt's chunk from the end of its
#     last one), of a decode step, both also in runs that passed meanwhile, against the wait
#     budget plus one batch (its longest window run), and the mean and longest time to a
#     first token; then the aggregate tok/s of 1/4/8/16 sessions there, as
#     ratios to one session.
# The ring is taken down on exit, also on failure or Ctrl-C.
#
# llama.cpp: with LLAMA_BENCH=path/to/llama-bench, tests/bench/bench-vs-llama.sh runs after the
# model section (the same TinyLlama-shaped files in llama-bench and kvctl bench, interleaved,
# ratios; docs/kernels.md, "Against llama.cpp"); without it the section is left out.
#
# OpenCL: an OpenCL stage's executor (kvctl bench --backend opencl, the first device: PoCL on a
# machine without a GPU) against the CPU path on a small synthetic llama (8 layers, n_embd 512,
# Q4_0 and Q8_0; BENCH_OPENCL_MODEL overrides), with both Q4_0 layouts and the plain one
# without CLBlast's prompt GEMMs (KV_CL_GEMM_ROWS=off); figures only. For a machine with a
# real GPU: scripts/opencl-bench.
#
# api: the OpenAI-compatible API of a 3-stage ring of stories260K (kvd stage --api):
#     requests per second and time to first token with 1, 8 and 32 concurrent streaming
#     clients (BENCH_API_CLIENTS), each sending BENCH_API_REQS completions of
#     BENCH_API_TOKENS tokens (tests/bench/api_bench.mjs).
#
# Market: a simulated population (10,000 nodes, 100 models; BENCH_MARKET_NODES / _MODELS /
# _SECONDS, default 20 s of steady state) against `kvd market` on SQLite
# (tests/tools/tool-market-bench, the real protocol with signatures): profiles and claims, leases
# activated, manifests fetched, client accounts made by an operator key, then heartbeats and
# whole sessions' receipts (rank 0's open side for a client, both sides of every edge) in the
# proportion of their natural rates; requests/s and p50/p99 latency per kind, sessions
# settled/s, and a check that every session settled and the credit paid equals the clients'
# debits; then the same on a throwaway PostgreSQL server (initdb in a temp dir).
#
# wan: rings behind an emulated WAN (docs/ring.md, "Over a WAN"): tests/lib/wan_ring.sh puts a
# tests/tools/tool-wan-proxy on every link of a local ring of TinyLLama-v0 (a real-text model from the
# test data; BENCH_WAN_MODEL), 1 thread per stage; for each profile (BENCH_WAN_PROFILES, default
# lan wan phone) and ring size (BENCH_WAN_STAGES, default 2 4 8): aggregate tokens/s of 1
# session and of 8 concurrent ones (BENCH_WAN_SESSIONS) of 32 tokens (BENCH_WAN_TG), from
# tests/tools/tool-ring-clients, and ring passes per generated token (rank 0's steps over the tokens:
# 1 without drafting), beside the floor one pass sets (stages x one-way delay); first the
# proxy's own overhead (profile none: the added round trip of a 64 B message and the stream
# throughput, against the same echo server without it; and how late a proxy set to 1 ms hands
# a message over, its timer's wake-up). Then drafting (BENCH_WAN_DRAFT_PROFILES, default lan
# wan phone; BENCH_WAN_DRAFT_STAGES, default 8): a story of BENCH_WAN_DRAFT_TG (256) greedy
# tokens, 1 and 8 sessions, without drafts and with prompt-lookup drafts; with LLAMA_RPC_BIN,
# llama.cpp's RPC mode over the same links and hosts (tests/bench/bench-wan-rpc.sh).
#
# Sections: model llama kernels planner tokenizer ring pull relay repair qwen opencl api market attacks wan draft mtp. BENCH_ONLY="ring relay"
# runs only those, BENCH_SKIP="model kernels" leaves those out; BENCH_RING_SKIP="stages records
# wire idle cpu sessions fair" leaves out parts of the ring section.
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

# want SECTION: whether BENCH_ONLY / BENCH_SKIP let SECTION run (says so when skipped).
want() {
    if [ -n "${BENCH_ONLY:-}" ]; then
        case " $BENCH_ONLY " in *" $1 "*) ;; *) return 1 ;; esac
    fi
    case " ${BENCH_SKIP:-} " in *" $1 "*) echo "== $1: skipped (BENCH_SKIP)"; return 1 ;; esac
    return 0
}
skip_ring() { case " ${BENCH_RING_SKIP:-} " in *" $1 "*) return 0 ;; esac; return 1; }
# the ring section's ring directory while a ring may be up: taken down on any exit
RD="" RD1="" WD=""
trap 'for d in "$RD" "$RD1"; do if [ -n "$d" ]; then "$KVCTL" ring down --dir "$d" >/dev/null 2>&1 || true; fi; done
      if [ -n "$WD" ]; then KV_BUILD=$B tests/lib/wan_ring.sh down "$WD" || true; fi' EXIT
trap 'exit 130' INT TERM

# The kernels' tools (matvec micro-benchmark) are not part of `make all`.
make -s -j2 "$B/tests/tool-kernbench" >/dev/null 2>&1 || true

if want model; then
    echo "== model: TinyLlama-1.1B-shaped synthetic model, kvctl bench -p $PP -n $TG (best of $REPS)"
    echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
    for type in q4_0 q8_0 q4_k_m; do
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
        if ! out=$("$KVCTL" bench -m "$f" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS" --bandwidth \
                --sessions 1,8); then
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
        # eight sessions decoding together, one row each per pass: what a step of eight rows
        # costs in one-row steps (goal <= 1.3; docs/kernels.md has the figures per CPU kind)
        echo "$out" | awk '/^tg[0-9]+_sessions 8 / {
            for (i = 1; i <= NF; i++) if ($i == "costs") c = $(i + 1);
            printf "  8 sessions %8.2f tok/s aggregate: a step of 8 rows costs %s one-row steps (goal <= 1.3)\n", $3, c }'
    done
fi

if [ -n "${LLAMA_BENCH:-}" ] && want llama; then
    tests/bench/bench-vs-llama.sh "$LLAMA_BENCH" || echo "bench-vs-llama failed"
fi

if want kernels; then
    echo "== kernels: matvec on TinyLlama-1.1B-shaped matrices (22 layers' worth, uncached) vs read bandwidth"
    if [ -x "$B/tests/tool-kernbench" ]; then
        if [ "$THREADS" -gt 0 ] 2>/dev/null; then kt="-t $THREADS"; else kt=""; fi
        "$B/tests/tool-kernbench" $kt q4_0 q8_0 q4_k q6_k f16 || echo "kernbench failed"
        echo "== kernels: compute efficiency (one thread, cache-resident; holds on a busy machine)"
        "$B/tests/tool-kernbench" -c q4_0 q8_0 q4_k q6_k f16 || true
        "$B/tests/tool-kernbench" -c -n 64 q4_0 q8_0 || true
        echo "== kernels: attention over an F16 cache (TinyLlama heads), one query row"
        for c in 128 2048; do "$B/tests/tool-kernbench" $kt -a $c || true; done
    else
        echo "tool-kernbench not built"
    fi
fi

if want planner; then
    echo "== planner: 96 layers over 1000 devices (goal: well under a second)"
    make -s -j2 "$B/tests/tool-plan-bench" >/dev/null 2>&1 || true
    if [ -x "$B/tests/tool-plan-bench" ]; then "$B/tests/tool-plan-bench" || echo "plan bench failed"; else echo "tool-plan-bench not built"; fi
fi

# Tokenizer: 1 MiB of English text (the licence texts every Debian system ships, repeated),
# tokenised by vocabularies from the shared test data (goal: well under a second each).
TD=${KV_TESTDATA:-../shared/testdata}
if want tokenizer; then
    TXT="$CACHE/english-1m.txt"
    if [ ! -s "$TXT" ] && ls /usr/share/common-licenses/* >/dev/null 2>&1; then
        : > "$TXT.tmp"
        while [ "$(wc -c < "$TXT.tmp")" -lt 1048576 ]; do cat /usr/share/common-licenses/* >> "$TXT.tmp"; done
        head -c 1048576 "$TXT.tmp" > "$TXT" && rm -f "$TXT.tmp"
    fi
    echo "== tokenizer: 1 MiB of English text, best of 3"
    make -s -j2 "$B/tests/tool-tokbench" >/dev/null 2>&1 || true
    if [ ! -x "$B/tests/tool-tokbench" ]; then
        echo "tokenizer: $B/tests/tool-tokbench missing (make tests); skipped"
    elif [ ! -s "$TXT" ]; then
        echo "tokenizer: no English text source; skipped"
    else
        for v in llama-spm gpt-2 qwen2 deepseek-llm falcon; do
            f="$TD/tokenizer/ggml-vocab-$v.gguf"
            [ -s "$f" ] || { echo "tokenizer: $f missing; skipped"; continue; }
            "$B/tests/tool-tokbench" "$f" "$TXT" 3 || echo "tokenizer: $v failed"
        done
    fi
fi

# ---- ring: what a ring costs against one process ----
# The same model and thread count on both sides; every ratio compares figures of this run.
bench_ring() {
    local rt=${BENCH_RING_THREADS:-1} rn=${BENCH_RING_TG:-64} rr=${BENCH_RING_REPS:-3}
    local ctg=${BENCH_RING_CPU_TG:-256} idle=${BENCH_RING_IDLE_S:-5}
    local sessions=${BENCH_RING_SESSIONS:-1 4 8 16}
    local f=${BENCH_RING_MODEL:-$CACHE/ring-bench-q4_0.gguf} prompt=1,100,200,300,400,500,600,700
    local clients=$B/tests/tool-ring-clients hz n best1 bestr i out sock pairs r1 r2 line
    RD=$CACHE/ring-bench
    if [ -z "${BENCH_RING_MODEL:-}" ] && [ ! -s "$f" ]; then
        echo "writing $f ..."
        "$KVCTL" synth --arch llama --layers 12 --embd 1024 --ff 2816 --heads 16 --kv-heads 4 \
            --vocab 8192 --type q4_0 --seed 3 --ctx 1024 -o "$f" >/dev/null || { echo "ring: synth failed; skipped"; return 0; }
    fi
    [ -s "$f" ] || { echo "ring: no model $f; skipped"; return 0; }
    make -s -j2 "$clients" >/dev/null 2>&1 || true
    hz=$(getconf CLK_TCK)
    # decode tok/s from a generate's statistics line: (N - 1) steps after the first token, so
    # the one process and the ring count alike (the ring times from the first token it streams)
    tgrate() { sed -n 's/.*generation: \([0-9]*\) tokens in \([0-9.]*\) s.*/\1 \2/p' |
        awk '{ if ($2 > 0 && $1 > 1) printf "%.2f", ($1 - 1) / $2; else print 0 }'; }
    gen_one() { "$KVCTL" generate -m "$f" --ids --tokens $prompt -n "$1" --temp 0 --ignore-eos -t "$rt" 2>&1 >/dev/null | tgrate; }
    gen_ring() { gen_ring_at "$RD" "$1"; }
    gen_ring_at() { "$KVCTL" generate --ring "$1" --ids --tokens $prompt -n "$2" --temp 0 --ignore-eos 2>&1 >/dev/null | tgrate; }
    # "median Mx (from Ax to Bx)" of a list of ratios ("-": none)
    med() { echo "$1" | tr ' ' '\n' | grep -v '^-\?$' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) printf "median %.2fx (from %.2fx to %.2fx)", (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2, v[1], v[NR] }'; }
    # CPU seconds (user + system) of every stage of the ring, from /proc/PID/stat
    ring_cpu() { for p in $(cat "$RD"/rank-*/kvd.pid 2>/dev/null); do sed 's/.*) //' "/proc/$p/stat" 2>/dev/null; done |
        awk -v hz="$hz" '{ s += $12 + $13 } END { printf "%.3f", s / hz }'; }
    # CPU seconds (user + system) of a command, from its rusage
    rusage() { python3 -c 'import resource, subprocess, sys
subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print("%.3f" % (r.ru_utime + r.ru_stime))' "$@"; }
    max() { awk -v a="$1" -v b="$2" 'BEGIN { print (b + 0 > a + 0) ? b : a }'; }
    ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }'; }
    up() {
        "$KVCTL" ring down --dir "$RD" >/dev/null 2>&1 || true
        "$KVCTL" ring up --model "$f" --stages "$1" --dir "$RD" -t "$rt" >/dev/null
    }

    echo
    echo "== ring: $(basename "$f"), $rt thread(s) per stage and for the one process, greedy, one session"
    echo "load average: $(cut -d' ' -f1-3 /proc/loadavg), $(nproc) CPUs"
    out=$("$KVCTL" bench -m "$f" -p 8 -n "$rn" -r "$rr" -t "$rt") || out=""
    echo "$out" | awk -v n="$rn" '/^tg[0-9]+ / { tg = $2 } $1 == "tg_cpu_ms_per_token" { c = $2 }
        END { printf "  one process, kvctl bench tg%d: %8.2f tok/s, %.2f ms CPU per token\n", n, tg, c }'
    # 1- and 2-stage rings first (BENCH_RING_SKIP=stages leaves them out), then the 3-stage
    # ring, which stays up for the rest. Each rep runs the one process, then the ring: both
    # see the same moment's load; the best of each is compared.
    for n in 1 2 3; do
        if [ $n -lt 3 ] && skip_ring stages; then continue; fi
        up $n || { echo "  ring up --stages $n failed"; return 0; }
        best1=0 bestr=0 pairs=""
        for i in $(seq "$rr"); do
            r1=$(gen_one "$rn")
            r2=$(gen_ring "$rn")
            best1=$(max "$best1" "$r1")
            bestr=$(max "$bestr" "$r2")
            pairs="$pairs $(ratio "$r2" "$r1")"
        done
        printf "  tg%d: one process %8.2f tok/s, %d-stage ring %8.2f tok/s = %sx%s\n" "$rn" "$best1" $n "$bestr" \
            "$(ratio "$bestr" "$best1")" "$([ $n -eq 3 ] && echo " (goal >= 0.95x)")"
        # On a host whose speed drifts between runs the best-of figures can come from
        # different moments; each rep's own pair (one process, then the ring) saw one moment.
        line=$(med "$pairs")
        if [ -n "$line" ]; then echo "        the $rr reps' own ratios: $line"; fi
    done
    sock=$RD/rank-0/kvd.sock

    if ! skip_ring pairs; then
        # The 3-stage ring against one process holding the whole model as a 1-stage ring (the
        # same kvd, the same client path; both up, each idle while the other runs): short runs
        # alternated, each side first in turn, so a pair's two runs see one moment of a host
        # whose speed drifts; the median of the pairs' ratios.
        local np=${BENCH_RING_PAIRS:-9} pn=${BENCH_RING_PAIR_TG:-32} a b
        RD1=$CACHE/ring-bench-1
        "$KVCTL" ring down --dir "$RD1" >/dev/null 2>&1 || true
        if "$KVCTL" ring up --model "$f" --stages 1 --dir "$RD1" -t "$rt" >/dev/null; then
            pairs=""
            for i in $(seq "$np"); do
                if [ $((i % 2)) -eq 1 ]; then
                    a=$(gen_ring_at "$RD1" "$pn"); b=$(gen_ring_at "$RD" "$pn")
                else
                    b=$(gen_ring_at "$RD" "$pn"); a=$(gen_ring_at "$RD1" "$pn")
                fi
                pairs="$pairs $(ratio "$b" "$a")"
            done
            "$KVCTL" ring down --dir "$RD1" >/dev/null 2>&1 || true
            RD1=""
            echo "  tg$pn, $np alternated pairs against one process holding the whole model (a 1-stage ring):"
            echo "        3-stage ring / one process: $(med "$pairs") (goal >= 0.95x)"
        else
            echo "  ring up --stages 1 failed: the alternated pairs skipped"
        fi
    fi

    if ! skip_ring records; then
        # The sealed records' cost: seal + open of one decode boundary frame (n_embd x wire
        # size + header), measured alone, times the 3 edges a token crosses, against the
        # 3-stage ring's measured time per token (no plain wire exists to race against).
        local recb=$B/tests/tool-rec-bench fb ns
        make -s -j2 "$recb" >/dev/null 2>&1 || true
        fb=$(python3 -c 'import json, sys
m = json.load(open(sys.argv[1]))
d = {"f32": 4, "f16": 2, "bf16": 2}.get(m.get("wire", {}).get("dtype", "f32"), 4)
print(m["model"]["n_embd"] * d + 28)' "$RD/ring.json" 2>/dev/null) || fb=""
        ns=$([ -x "$recb" ] && [ -n "$fb" ] && "$recb" "$fb" | awk '{ print $2 }')
        if [ -n "$ns" ] && [ "$bestr" != 0 ]; then
            awk -v ns="$ns" -v fb="$fb" -v r="$bestr" 'BEGIN { tok = 1e9 / r; per = 3 * ns
                printf "  sealed records: seal + open of a %d-byte boundary frame %.1f us; x 3 edges = %.1f us per token = %.3f%% of the 3-stage ring'"'"'s %.2f ms per token (goal < 2%%)\n", fb, ns / 1e3, per / 1e3, 100 * per / tok, tok / 1e6 }'
        else
            echo "  sealed records: tool-rec-bench or the ring's n_embd unavailable; skipped"
        fi
    fi

    if ! skip_ring wire; then
        echo "  bytes on the wire per token per edge (wire f32: n_embd x 4 + the 28-byte header + the record's 20):"
        "$KVCTL" status --ring "$RD" --json | python3 -c '
import json, sys
for l in sys.stdin:
    s = json.loads(l)
    kind = "TOKEN" if s["rank"] == s["n_ranks"] - 1 else "ACT"
    print("    rank %d -> rank %d: %8.1f B/token (%s)" % (s["rank"], (s["rank"] + 1) % s["n_ranks"], s["bytes_per_token_out"], kind))' || true
    fi

    if ! skip_ring idle; then
        sleep 1
        local c0 c1
        c0=$(ring_cpu); sleep "$idle"; c1=$(ring_cpu)
        awk -v a="$c0" -v b="$c1" -v s="$idle" 'BEGIN { printf "  idle 3-stage ring, no session: %.2f CPU s in %d s, all stages (goal ~0)\n", b - a, s }'
    fi

    if ! skip_ring cpu; then
        # CPU of one session of ctg tokens minus that of a 1-token session (so neither side
        # counts opening the model or the prompt): all three stages (their /proc counters
        # around it) against the one process (its rusage); alternated, the least of each
        local c0 c1 c2 o1 o2 cr=0 co=0
        for i in $(seq "$rr"); do
            c0=$(ring_cpu); gen_ring 1 >/dev/null; c1=$(ring_cpu); gen_ring "$ctg" >/dev/null; c2=$(ring_cpu)
            o1=$(rusage "$KVCTL" generate -m "$f" --ids --tokens $prompt -n 1 --temp 0 -t "$rt")
            o2=$(rusage "$KVCTL" generate -m "$f" --ids --tokens $prompt -n "$ctg" --temp 0 --ignore-eos -t "$rt")
            cr=$(awk -v m="$cr" -v a="$c0" -v b="$c1" -v c="$c2" -v n="$ctg" 'BEGIN {
                r = ((c - b) - (b - a)) * 1e3 / (n - 1); print (m == 0 || r < m) ? r : m }')
            co=$(awk -v m="$co" -v a="$o1" -v b="$o2" -v n="$ctg" 'BEGIN {
                r = (b - a) * 1e3 / (n - 1); print (m == 0 || r < m) ? r : m }')
        done
        printf "  CPU per generated token (tg%d - tg1, least of %d): 3-stage ring %.2f ms, one process %.2f ms = %sx\n" \
            "$ctg" "$rr" "$cr" "$co" "$(ratio "$cr" "$co")"
    fi

    # agg_sessions: aggregate tok/s of $sessions concurrent sessions on the ring at $sock, as
    # ratios to one session. Each of rr rounds runs one session, then every K in turn, so a
    # round's ratios compare one moment; printed: the best aggregate of each K (its gap and
    # first-token figures), its ratio to the best single session, and the median and range of
    # the rounds' own ratios, the figure that holds on a host whose speed drifts.
    agg_sessions() {
        local k i line agg tab
        tab=$(mktemp /tmp/kvbench-agg.XXXXXX)
        for i in $(seq "$rr"); do
            agg=0
            for k in 1 $sessions; do
                [ "$k" -eq 1 ] && [ "$agg" != 0 ] && continue   # one session: once a round, first
                out=$("$clients" "$sock" "$k" "$rn" 2>"$CACHE/ring-clients.err") || {
                    echo "  $k session(s): failed:"; head -n 3 "$CACHE/ring-clients.err"; continue; }
                line=$(echo "$out" | tail -n 1)
                # total: sessions S tokens T wall_s W tok_s R max_gap_ms G ttft_max_ms F worst_session I ttft_mean_ms M
                # shellcheck disable=SC2086
                set -- $line
                [ "$k" -eq 1 ] && agg=$9
                echo "$k $9 ${11} ${13} $(ratio "$9" "$agg")" >> "$tab"
            done
        done
        for k in $sessions; do
            # the best round of K (its figures) against the best single session
            awk -v k="$k" -v g="$([ "$k" -eq 8 ] && echo " (goal >= 3x)")" '
                $1 == 1 && $2 + 0 > b1 { b1 = $2 + 0 }
                $1 == k && $2 + 0 > best { best = $2 + 0; gap = $3; ft = $4 }
                END { if (best) printf "  %2d session(s): %8.2f tok/s aggregate = %.2fx one session%s, max gap %7.1f ms, first token after at most %7.1f ms\n",
                        k, best, b1 ? best / b1 : 0, g, gap, ft }' "$tab"
            # the rounds' own ratios
            line=$(med "$(awk -v k="$k" '$1 == k { print $5 }' "$tab" | tr '\n' ' ')")
            if [ "$k" -gt 1 ] && [ -n "$line" ]; then
                echo "        the $rr rounds' own ratios (one session, then $k, one moment): $line"
            fi
        done
        rm -f "$tab"
    }

    if ! skip_ring sessions; then
        if [ ! -x "$clients" ]; then
            echo "  concurrent sessions: $clients not built; skipped"
        else
            echo "== ring: concurrent sessions on the 3-stage ring, tg$rn each, greedy (aggregate = all tokens / wall time from the first start to the last end;"
            echo "   max gap = the longest wait one session saw between two of its streamed tokens; ceiling here: min(3 stages, $(nproc) CPUs / $rt thread(s)))"
            agg_sessions
            # the same for one process batching K sessions (kvctl bench --sessions: one row per
            # session in each window pass, as a ring stage runs them)
            echo "== one process batching K sessions: kvctl bench --sessions, tg$rn each, $rt thread(s)"
            "$KVCTL" bench -m "$f" -p 8 -n "$rn" -t "$rt" -r "$rr" --sessions "$(echo $sessions | tr ' ' ',')" 2>&1 |
                awk '/_sessions/ { printf "  %2d session(s): %8.2f tok/s aggregate%s%s\n", $2, $3, ($7 != "" ? " = " $7 " one session" : ""), ($2 == 8 ? " (goal >= 3x)" : "") }'
        fi
    fi

    if ! skip_ring idle; then
        local c0 c1
        c0=$(ring_cpu); sleep "$idle"; c1=$(ring_cpu)
        awk -v a="$c0" -v b="$c1" -v s="$idle" 'BEGIN { printf "  idle again after the sessions: %.2f CPU s in %d s (goal ~0)\n", b - a, s }'
    fi
    if ! skip_ring fair; then
        bench_ring_fair
    fi
    "$KVCTL" ring down --dir "$RD" >/dev/null 2>&1 || true
    RD=""
}

# ---- ring: the batching scheduler (fairness and batching gain) ----
# Runs inside bench_ring (its helpers and variables). A 3-stage ring of a model whose windows
# batch several sessions' steps (F16 weights: kern_type_rows_exact; the Q4_0 ring above runs
# them one by one) with --batch-wait-us W: first, on the fresh ring, M sessions at once with
# mixed prompt lengths (prefill chunks beside decode steps), and from each stage's status the
# longest wait of one step from being queued to its run starting against the wait budget plus
# one batch (the stage's longest window run); then the aggregate tok/s of 1/4/8/16 sessions
# as ratios to one session.
bench_ring_fair() {
    local fm=${BENCH_RING_BATCH_MODEL:-$CACHE/ring-bench-f16.gguf} bw=${BENCH_RING_BATCH_WAIT_US:-2000}
    local mixed=${BENCH_RING_MIXED:-32} plens=${BENCH_RING_PROMPTS:-3,8,17,33,64} line
    if [ ! -x "$clients" ]; then echo "  batching scheduler: $clients not built; skipped"; return 0; fi
    if [ -z "${BENCH_RING_BATCH_MODEL:-}" ] && [ ! -s "$fm" ]; then
        echo "writing $fm ..."
        "$KVCTL" synth --arch llama --layers 12 --embd 1024 --ff 2816 --heads 16 --kv-heads 4 \
            --vocab 8192 --type f16 --seed 3 --ctx 1024 -o "$fm" >/dev/null || { echo "ring: synth failed; skipped"; return 0; }
    fi
    "$KVCTL" ring down --dir "$RD" >/dev/null 2>&1 || true
    "$KVCTL" ring up --model "$fm" --stages 3 --dir "$RD" -t "$rt" --batch-wait-us "$bw" >/dev/null ||
        { echo "  ring up of $fm failed"; return 0; }
    echo "== ring: the batching scheduler, 3-stage ring of $(basename "$fm"), --batch-wait-us $bw, tg$rn each, greedy"
    out=$("$clients" "$sock" "$mixed" "$rn" "$plens" 2>"$CACHE/ring-clients.err") || out=""
    if [ -z "$out" ]; then
        echo "  $mixed sessions: failed:"; head -n 3 "$CACHE/ring-clients.err"
    else
        line=$(echo "$out" | tail -n 1)
        # shellcheck disable=SC2086
        set -- $line
        printf "  %d sessions, prompts of %s tokens: %8.2f tok/s aggregate, max gap %7.1f ms, first token after %7.1f ms mean, %7.1f ms at most\n" \
            "$mixed" "$plens" "$9" "${11}" "${17:-0}" "${13}"
        "$KVCTL" status --ring "$RD" --json | python3 -c '
import json, sys
for l in sys.stdin:
    s = json.loads(l)
    b = s["batches"]
    bound = b["wait_budget_ms"] + b["max_run_ms"]
    r = lambda x: "%.2fx" % (x / bound) if bound > 0 else "-"
    print("    rank %d: longest wait of a step %7.1f ms = %s, of a decode step %7.1f ms = %s, mean %6.1f ms;"
          " against budget %.1f + one batch (longest window run) %.1f ms = %.1f ms" % (
          s["rank"], b["max_wait_ms"], r(b["max_wait_ms"]), b["max_decode_wait_ms"],
          r(b["max_decode_wait_ms"]), b["mean_wait_ms"], b["wait_budget_ms"], b["max_run_ms"], bound))
    print("            %d batched runs, up to %d steps / %d rows (rows_allowed %d), %d prompt chunks;"
          " the longest wait in runs that passed meanwhile: %d for a step, %d for a decode step" % (
          b["runs"], b["max_steps"], b["max_rows"], b["rows_allowed"], b.get("prompt_chunks", 0),
          b.get("max_wait_runs", -1), b.get("max_decode_wait_runs", -1)))' || true
    fi
    agg_sessions
}
if want ring; then bench_ring || true; fi

# The TinyLlama-shaped Q4_0 model above; a window of half its layers. Page cache warmed first.
bench_pull() {
    echo "== windows: pull throughput, loopback seeder vs curl of the same bytes from nginx"
    local f="$CACHE/tinyllama-1.1b-shape-q4_0.gguf" t port nport sp w=${BENCH_PULL_LAYERS:-0:11}
    [ -s "$f" ] || { echo "no model ($f): skipped"; return 0; }
    command -v nginx >/dev/null || [ -x /usr/sbin/nginx ] || { echo "no nginx: skipped"; return 0; }
    t=$(mktemp -d /tmp/kvbench.XXXXXX)
    cat "$f" >/dev/null
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    nport=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    mkdir -p "$t/www" "$t/tmp"
    ln -s "$(readlink -f "$f")" "$t/www/model.gguf"
    cat > "$t/nginx.conf" <<EOF
$([ "$(id -u)" = 0 ] && echo "user root;")
worker_processes 1;
pid $t/nginx.pid;
error_log $t/error.log;
events { worker_connections 64; }
http {
    access_log off; sendfile on; client_body_temp_path $t/tmp/b; proxy_temp_path $t/tmp/p;
    fastcgi_temp_path $t/tmp/f; uwsgi_temp_path $t/tmp/u; scgi_temp_path $t/tmp/s;
    server { listen 127.0.0.1:$nport; root $t/www; }
}
EOF
    $(command -v nginx || echo /usr/sbin/nginx) -p "$t" -c "$t/nginx.conf" 2>/dev/null
    "$KVCTL" catalog "$f" -o "$t/cat.json" >/dev/null 2>&1 || { echo "catalog failed"; return 0; }
    "$B/kvd" seeder --serve "$f,$t/cat.json" --listen "127.0.0.1:$port" 2>"$t/seeder.log" &
    sp=$!
    for _ in $(seq 600); do curl -sf -o /dev/null "http://127.0.0.1:$port/v1/models" && break; sleep 0.1; done
    local t0 t1 size
    t0=$(date +%s.%N)
    "$KVCTL" pull --from "http://127.0.0.1:$port" --layers "$w" -o "$t/s.gguf" 2>"$t/pull.log" </dev/null || echo "seeder pull failed"
    t1=$(date +%s.%N)
    tail -n 1 "$t/pull.log"
    size=$(stat -c %s "$t/s.gguf" 2>/dev/null || echo 0)
    awk -v s="$size" -v a="$t0" -v b="$t1" -v w="$w" 'BEGIN {printf "kvctl pull from a loopback seeder: window %s, %.0f MB in %.2f s = %.0f MB/s (verified)\n", w, s/1e6, b-a, s/1e6/(b-a)}'
    rm -f "$t/s.gguf"
    t0=$(date +%s.%N)
    "$KVCTL" pull -q --zstd --from "http://127.0.0.1:$port" --layers "$w" -o "$t/s.gguf" || echo "seeder zstd pull failed"
    t1=$(date +%s.%N)
    awk -v s="$size" -v a="$t0" -v b="$t1" 'BEGIN {printf "kvctl pull --zstd from the seeder:  %.0f MB in %.2f s = %.0f MB/s (verified)\n", s/1e6, b-a, s/1e6/(b-a)}'
    curl -s -o "$t/c.bin" -r "0-$((size - 1))" -w '%{size_download} %{time_total}\n' \
        "http://127.0.0.1:$nport/model.gguf" | awk '{printf "curl of the same bytes from nginx:   %.0f MB in %.2f s = %.0f MB/s (to a file, no fsync, no verify)\n", $1/1e6, $2, $1/1e6/$2}'
    rm -f "$t/c.bin"
    t0=$(date +%s.%N)
    "$KVCTL" pull -q --from "http://127.0.0.1:$nport/model.gguf" --layers "$w" --catalog "$t/cat.json" -o "$t/n.gguf" || echo "nginx pull failed"
    t1=$(date +%s.%N)
    awk -v s="$size" -v a="$t0" -v b="$t1" 'BEGIN {printf "kvctl pull from nginx (ranges):     %.0f MB in %.2f s = %.0f MB/s (verified)\n", s/1e6, b-a, s/1e6/(b-a)}'
    kill "$sp" 2>/dev/null; wait "$sp" 2>/dev/null
    kill "$(cat "$t/nginx.pid")" 2>/dev/null
    rm -rf "$t"
}
if want pull; then bench_pull || true; fi

# ---- relay: 1000 concurrent bridges, 1 MB each way; added latency of one hop ----
bench_relay() {
    echo
    echo "== relay: 1000 concurrent bridges over TLS on loopback, 1 MB each way per bridge (every message checked)"
    local t rp port hw=${BENCH_RELAY_HIGH_WATER:-65536} n=${BENCH_RELAY_BRIDGES:-1000}
    make -s -j2 "$B/tests/tool-relay-load" >/dev/null 2>&1 || true
    [ -x "$B/tests/tool-relay-load" ] || { echo "tool-relay-load not built: skipped"; return 0; }
    t=$(mktemp -d /tmp/kvbench.XXXXXX)
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=bench \
        -keyout "$t/key.pem" -out "$t/cert.pem" 2>/dev/null
    # 2000 client sockets in the tool and 2000 in the relay
    ulimit -n 16384 2>/dev/null || ulimit -n 4096 2>/dev/null || true
    for mode in tls plain; do
        if [ $mode = tls ]; then opts="--tls-cert $t/cert.pem --tls-key $t/key.pem"; scheme=wss; else opts="--plain"; scheme=ws; fi
        # shellcheck disable=SC2086
        "$B/kvd" --role relay --listen 127.0.0.1:0 $opts --max-bridges $((n + 100)) --max-per-addr $((2 * n + 100)) \
            --high-water "$hw" --quiet > "$t/relay.log" 2>&1 &
        rp=$!
        port=""
        for _ in $(seq 50); do
            port=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$t/relay.log" 2>/dev/null)
            [ -n "$port" ] && break
            sleep 0.1
        done
        [ -n "$port" ] || { echo "relay did not start"; cat "$t/relay.log"; kill $rp; break; }
        echo "  $scheme (relay --high-water $hw):"
        "$B/tests/tool-relay-load" --url "$scheme://127.0.0.1:$port" --bridges "$n" --bytes 1048576 2>"$t/load.err" |
            sed 's/^/    /' || { echo "    load run failed:"; tail -5 "$t/load.err"; }
        awk -v n="$n" '/VmHWM/ {printf "    relay peak RSS: %.0f MB for %d bridges = %.0f KB per bridge (queues capped by --high-water; the rest is read buffers and message assembly)\n", $2 / 1024, n, $2 / n}' /proc/$rp/status
        "$B/tests/tool-relay-load" --url "$scheme://127.0.0.1:$port" --latency 2000 2>&1 | sed 's/^/    /'
        kill $rp; wait $rp 2>/dev/null
    done
    rm -rf "$t"
}
if want relay; then bench_relay || true; fi

# ---- repair: a dead stage costs the time to the next token (docs/ring.md, "Repair") ----
# A 3-stage loopback ring of a small test-data model (BENCH_REPAIR_MODEL) with one standby,
# 8 greedy sessions of 200 tokens; SIGKILL of the middle stage 300 ms after every session
# streamed its first bytes; the time until every session running at the kill has said it
# resumed (its next token follows the note), and rank 0's own figure (from the break it saw).
# Target: under 2 s on loopback plus the window's load time.
bench_repair() {
    m=${BENCH_REPAIR_MODEL:-$TD/models/TinyLLama-v0-q4_0.gguf}
    [ -s "$m" ] || { echo "== repair: $m missing; skipped"; return 0; }
    t=$(mktemp -d /tmp/kvbench-repair.XXXXXX)
    RD=$t/ring
    if ! "$KVCTL" ring up --model "$m" --stages 3 --standby 1 --dir "$RD" > "$t/up" 2>&1; then
        echo "== repair: ring up failed:"; tail -5 "$t/up"; rm -rf "$t"; return 1
    fi
    args=""
    for i in 1 2 3 4 5 6 7 8; do
        "$KVCTL" generate --ring "$RD" -p "Once upon a time" -n 200 --temp 0 --ignore-eos > "$t/o.$i" 2> "$t/e.$i" &
        args="$args $!:$t/o.$i:$t/e.$i"
    done
    ms=$(python3 tests/lib/ring_kill.py "$(cat "$RD/rank-1/kvd.pid")" 300 $args)
    wait
    r0=$("$KVCTL" status --ring "$RD" --json 2>/dev/null | sed -n 1p |
         python3 -c 'import json,sys; r=json.load(sys.stdin)["repair"]; print("%.0f ms (max %.0f ms), %d sessions resumed" % (r["last_resume_ms"], r["max_resume_ms"], r["resumed_sessions"]))' 2>/dev/null)
    echo "== repair: SIGKILL of the middle stage of a 3-stage ring, 8 sessions, a standby takes over"
    echo "  kill -> next token of every running session ($(echo "$ms" | cut -d' ' -f2) running): $(echo "$ms" | cut -d' ' -f1) ms;" \
         "rank 0, break -> next token: $r0 (target < 2000 ms + window load)"
    "$KVCTL" ring down --dir "$RD" >/dev/null 2>&1 || true
    RD=""
    rm -rf "$t"
}
if want repair; then bench_repair || true; fi
# market_run DB LABEL: one simulated population against a market on DB. Every node here comes
# from 127.0.0.1, so the claim rate limits and the address cap are off; no probes (a lease
# activates on its heartbeat's endpoint) and no audits, so the figures are the market's own;
# reservations last 10 minutes, as the claims of 10,000 nodes may take more than a minute.
MARKET_OPTS="--no-probe --max-ranks-per-addr 0 --claims-per-min-addr 0 --claims-per-min-key 0 --audit-rate 0 --reserve-s 600"
market_run() {
    echo "== market: ${BENCH_MARKET_NODES:-10000} simulated nodes, ${BENCH_MARKET_MODELS:-100} models, $2;" \
         "kvd market $MARKET_OPTS; nproc $(nproc), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    rm -f "$t/port"
    # shellcheck disable=SC2086
    "$B/kvd" market --db "$1" --listen 127.0.0.1:0 --port-file "$t/port" --log-level warn \
        --operator-key "$t/operators.txt" $MARKET_OPTS >"$t/market.log" 2>&1 &
    mp=$!
    for _ in $(seq 50); do [ -s "$t/port" ] && break; sleep 0.1; done
    "$B/tests/tool-market-bench" --url "http://127.0.0.1:$(cat "$t/port")" --catalog "$t/cat.json" \
        --operator "$t/op" --nodes "${BENCH_MARKET_NODES:-10000}" --models "${BENCH_MARKET_MODELS:-100}" \
        --seconds "${BENCH_MARKET_SECONDS:-20}" 2>&1 | sed 's/^/  /'
    echo "  load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
    kill $mp; wait $mp 2>/dev/null
}
bench_market() {
    t=$(mktemp -d)
    chmod 755 "$t"
    "$KVCTL" catalog "$TD/models/stories260K.gguf" -o "$t/cat.json" >/dev/null 2>&1 || { echo "catalog failed"; rm -rf "$t"; return 1; }
    mkdir -p "$t/op"
    "$B/kvd" stage --state-dir "$t/op" --print-key >"$t/operators.txt" || { echo "no operator key"; rm -rf "$t"; return 1; }
    market_run "$t/market.db" SQLite
    pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
    if [ -z "$pgbin" ]; then echo "== market on PostgreSQL: no server binaries; skipped"; rm -rf "$t"; return 0; fi
    runas=""
    mkdir -p "$t/pg"
    if [ "$(id -u)" = 0 ]; then chown postgres "$t/pg"; runas="runuser -u postgres --"; fi
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    if $runas "$pgbin/initdb" -D "$t/pg/data" -A trust -U kv >/dev/null 2>&1 &&
       $runas "$pgbin/pg_ctl" -D "$t/pg/data" -l "$t/pg/log" -w -o "-p $port -k $t/pg -c listen_addresses=127.0.0.1" start >/dev/null 2>&1; then
        "$pgbin/createdb" -h 127.0.0.1 -p "$port" -U kv market &&
            market_run "postgres://kv@127.0.0.1:$port/market" PostgreSQL
        $runas "$pgbin/pg_ctl" -D "$t/pg/data" -m fast stop >/dev/null 2>&1
    else
        echo "== market on PostgreSQL: the throwaway server did not start; skipped"
    fi
    rm -rf "$t"
}
if want market; then bench_market || true; fi

# ---- Qwen3.5 family: the small synthetic MoE / hybrid models of the test data ----
# Active bytes per token (router + used experts + shared expert) vs all expert bytes (memory).
if want qwen; then
    echo "== qwen3.5 family: kvctl bench -p $PP -n $TG on the test-data synthetic models"
    for m in synth-qwen3moe-bpe1024-q8_0 synth-qwen35-bpe1024-f16 synth-qwen35moe-bpe1024-q8_0; do
        f="$TD/models/$m.gguf"
        [ -s "$f" ] || { echo "$m: missing; skipped"; continue; }
        out=$("$KVCTL" bench -m "$f" -p "$PP" -n "$TG" -r "$REPS" -t "$THREADS") || { echo "$m: bench failed"; continue; }
        ex=$("$KVCTL" inspect "$f" | sed -n 's/^experts *//p')
        echo "$out" | awk -v m="$m" -v ex="$ex" '
            $1 == "weight_bytes_per_token" {b = $2} /^pp[0-9]+ / {pp = $1 " " $2} /^tg[0-9]+ / {tg = $1 " " $2}
            END {printf "%-30s %s tok/s, %s tok/s, %.2f MB read per token%s\n", m, pp, tg, b / 1e6, ex != "" ? "; experts " ex : ""}'
    done
fi

# ---- OpenCL: a stage's executor on the first OpenCL device vs the CPU path ----
if want opencl; then
    echo "== opencl: kvctl bench -p $PP -n $TG --backend opencl vs cpu (best of $REPS)"
    if ! clinfo -l 2>/dev/null | grep -q Device; then
        echo "no OpenCL device (clinfo -l); skipped"
    else
        clinfo -l 2>/dev/null | sed 's/^/  /'
        models=${BENCH_OPENCL_MODEL:-}
        if [ -z "$models" ]; then
            for type in q4_0 q8_0; do
                f="$CACHE/llama-8x512-$type.gguf"
                [ -s "$f" ] || "$KVCTL" synth --arch llama --layers 8 --embd 512 --ff 1536 --heads 8 \
                    --kv-heads 4 --vocab 8000 --type "$type" --seed 1 -o "$f" >/dev/null || rm -f "$f"
                [ -s "$f" ] && models="$models $f"
            done
        fi
        for f in $models; do
            for run in "cpu::" "opencl:plain:" "opencl:plain:off" "opencl:adreno:"; do
                dev=${run%%:*} lay=${run#*:} gemm=${run##*:}; lay=${lay%%:*}
                out=$(KV_CL_LAYOUT=${lay:-auto} KV_CL_GEMM_ROWS=$gemm "$KVCTL" bench -m "$f" -p "$PP" \
                      -n "$TG" -r "$REPS" -t "$THREADS" --backend "$dev" --bandwidth 2>&1) ||
                    { echo "  $(basename "$f") $dev: failed"; continue; }
                echo "$out" | awk -v m="$(basename "$f")" -v d="$dev${lay:+ ($lay layout${gemm:+, GEMMs $gemm})}" '
                    /^pp[0-9]+ / {pp = $1 " " $2} /^tg[0-9]+ / {tg = $1 " " $2}
                    /^bandwidth/ {bw = $2} /^tg ceiling/ {frac = $NF}
                    END {printf "  %-24s %-24s %s tok/s, %s tok/s, read bandwidth %s GB/s, %s of its ceiling\n", m, d, pp, tg, bw, frac}'
            done
        done
    fi
fi
# ---- the OpenAI-compatible API: requests/s and time to first token under load ----
bench_api() {
    local f="$TD/models/stories260K.gguf" t port
    [ -s "$f" ] || { echo "== api: stories260K.gguf missing; skipped"; return 0; }
    command -v node >/dev/null || { echo "== api: node missing; skipped"; return 0; }
    t=$(mktemp -d /tmp/kvbench-api.XXXXXX)
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    echo "== api: 3-stage ring of stories260K, rank 0 serving the API; streamed completions of ${BENCH_API_TOKENS:-16} tokens"
    if ! "$KVCTL" ring up --dir "$t/ring" --model "$f" --stages 3 --api "127.0.0.1:$port" \
            --api-max-sessions 64 > "$t/up" 2>&1; then
        echo "ring up failed:"; tail -5 "$t/up"; rm -rf "$t"; return 0
    fi
    node tests/bench/api_bench.mjs "http://127.0.0.1:$port" "${BENCH_API_TOKENS:-16}" "${BENCH_API_REQS:-4}" \
        ${BENCH_API_CLIENTS:-1 8 32} | sed 's/^/  /' || echo "  the API benchmark failed"
    "$KVCTL" ring down --dir "$t/ring" > /dev/null 2>&1
    rm -rf "$t"
}
if want api; then bench_api || true; fi
# ---- attacks on the defaults: what a legitimate peer waits while they go on ----
# The figures come from the attack tests themselves (they assert only generous bounds): a fresh
# API client while 1024 idle keep-alive connections hold the server, target < 1 s; a restarted
# rank linking while 40 pending links with valid HELLOs are held at its neighbour, target < 3 s.
bench_attacks() {
    local t out v
    t=$(mktemp -d /tmp/kvbench-attacks.XXXXXX)
    echo "== attacks: what a legitimate peer waits during an attack (docs/security.md, \"Attacks\")"
    if KV_BUILD=$B bash tests/integration/test-api-exposure.sh "$B" > "$t/api" 2>&1; then
        v=$(sed -n 's/^fresh client: HTTP\/1.1 200 OK after \([0-9.]*\) s/\1/p' "$t/api")
        echo "  fresh API client, 1024 idle keep-alive connections held: ${v:-?} s (target < 1 s: $(python3 -c "import sys; print('%.0fx under' % (1/max(float(sys.argv[1]),1e-3)))" "${v:-1}"))"
    else
        echo "  test-api-exposure failed:"; tail -n 5 "$t/api" | sed 's/^/    /'
    fi
    if KV_BUILD=$B bash tests/integration/test-ring-handshake-slots.sh "$B" > "$t/slots" 2>&1; then
        v=$(sed -n 's/.*rank 1 linked again in \([0-9.]*\) s.*/\1/p' "$t/slots")
        echo "  restarted rank linking, 40 pending valid HELLOs held at its neighbour: ${v:-?} s (target < 3 s: ${v:-?}/3 = $(python3 -c "import sys; print('%.2f' % (float(sys.argv[1])/3))" "${v:-0}"))"
    else
        echo "  test-ring-handshake-slots failed:"; tail -n 5 "$t/slots" | sed 's/^/    /'
    fi
    rm -rf "$t"
}
if want attacks; then bench_attacks || true; fi
# ---- wan: rings behind an emulated WAN, a delay proxy on every link ----
bench_wan() {
    local m=${BENCH_WAN_MODEL:-$TD/models/TinyLLama-v0-q4_0.gguf} tg=${BENCH_WAN_TG:-32} k=${BENCH_WAN_SESSIONS:-8}
    local p=$B/tests/tool-wan-proxy clients=$B/tests/tool-ring-clients t ep pp dp d1 d2 d3 s1 s2 prof n st0 st1 one many delay
    [ -s "$m" ] || { echo "== wan: $m missing; skipped"; return 0; }
    make -s -j2 "$p" "$clients" >/dev/null 2>&1 || true
    [ -x "$p" ] && [ -x "$clients" ] || { echo "== wan: tool-wan-proxy or tool-ring-clients not built; skipped"; return 0; }
    t=$(mktemp -d /tmp/kvbench-wan.XXXXXX)
    echo "== wan: $(basename "$m") behind tests/tools/tool-wan-proxy on every link (tests/lib/wan_ring.sh), 1 thread per stage," \
         "$tg tokens a session; $(date -u '+%Y-%m-%d %H:%M UTC'), nproc $(nproc), load average $(cut -d' ' -f1-3 /proc/loadavg)"
    # the proxy's own overhead: the same echo server with and without a proxy (profile none)
    "$p" echo --port-file "$t/echo.port" 2>/dev/null & ep=$!
    "$p" --profile none --to-file "$t/echo.port" --port-file "$t/proxy.port" 2>/dev/null & pp=$!
    # and a proxy that delays each crossing by exactly 1 ms: how late its timer hands bytes over
    "$p" --delay-ms 1 --to-file "$t/echo.port" --port-file "$t/delay.port" 2>/dev/null & dp=$!
    for _ in $(seq 50); do [ -s "$t/echo.port" ] && [ -s "$t/proxy.port" ] && [ -s "$t/delay.port" ] && break; sleep 0.1; done
    d1=$("$p" ping --to "127.0.0.1:$(cat "$t/echo.port")" --count 2000 | sed -n 's/.*median \([0-9.]*\) ms.*/\1/p')
    d2=$("$p" ping --to "127.0.0.1:$(cat "$t/proxy.port")" --count 2000 | sed -n 's/.*median \([0-9.]*\) ms.*/\1/p')
    s1=$("$p" stream --to "127.0.0.1:$(cat "$t/echo.port")" --bytes 256M | sed -n 's/.*: \([0-9.]*\) MB\/s.*/\1/p')
    s2=$("$p" stream --to "127.0.0.1:$(cat "$t/proxy.port")" --bytes 256M | sed -n 's/.*: \([0-9.]*\) MB\/s.*/\1/p')
    d3=$("$p" ping --to "127.0.0.1:$(cat "$t/delay.port")" --count 500 | sed -n 's/.*median \([0-9.]*\) ms.*/\1/p')
    kill $pp $dp $ep 2>/dev/null; wait $pp $dp $ep 2>/dev/null
    echo "  proxy overhead (profile none): 64 B round trip, median of 2000: ${d1:-?} ms direct, ${d2:-?} ms through the proxy" \
         "(+$(awk -v a="${d1:-0}" -v b="${d2:-0}" 'BEGIN { printf "%.3f", b - a }') ms for two crossings);" \
         "echoed stream: ${s1:-?} MB/s direct, ${s2:-?} MB/s through the proxy, each way"
    echo "  timed crossings (--delay-ms 1): round trip median of 500 ${d3:-?} ms against 2 ms set" \
         "(+$(awk -v a="${d1:-0}" -v b="${d3:-0}" 'BEGIN { printf "%.3f", (b - a - 2) / 2 }') ms late a crossing, the timer's wake-up)"
    printf "  %-7s  %6s  %10s  %12s  %24s  %s\n" profile stages "pass floor" "1 session" "$k sessions" "passes/token"
    for prof in ${BENCH_WAN_PROFILES:-lan wan phone}; do
        delay=$(case $prof in lan) echo 0.2 ;; wan) echo 20 ;; phone) echo 50 ;; *) echo 0 ;; esac)
        for n in ${BENCH_WAN_STAGES:-2 4 8}; do
            WD=$t/ring
            if ! KV_BUILD=$B WAN_RING_UP_OPTS="-t 1" tests/lib/wan_ring.sh up "$WD" "$m" "$n" "$prof" > "$t/up" 2>&1; then
                echo "  $prof $n stages: the ring did not come up:"; tail -3 "$t/up" | sed 's/^/    /'
                continue
            fi
            st0=$("$KVCTL" status --ring "$WD" --json 2>/dev/null | sed -n 1p | python3 -c 'import json,sys; print(json.load(sys.stdin)["steps"])')
            one=$("$clients" "$WD/rank-0/kvd.sock" 1 "$tg" 2>/dev/null | sed -n 's/^total:.* tok_s \([0-9.]*\).*/\1/p')
            many=$("$clients" "$WD/rank-0/kvd.sock" "$k" "$tg" 2>/dev/null | sed -n 's/^total:.* tok_s \([0-9.]*\).*/\1/p')
            st1=$("$KVCTL" status --ring "$WD" --json 2>/dev/null | sed -n 1p | python3 -c 'import json,sys; print(json.load(sys.stdin)["steps"])')
            printf "  %-7s  %6s  %7.1f ms  %6s tok/s  %7s tok/s = %5sx  %s\n" "$prof" "$n" \
                "$(awk -v n="$n" -v d="$delay" 'BEGIN { print n * d }')" "${one:-?}" "${many:-?}" \
                "$(awk -v a="${many:-0}" -v b="${one:-0}" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "-" }')" \
                "$(awk -v a="${st0:-0}" -v b="${st1:-0}" -v t=$(((k + 1) * tg)) 'BEGIN { printf "%.2f", (b - a) / t }')"
            KV_BUILD=$B tests/lib/wan_ring.sh down "$WD"
            WD=""
        done
    done
    bench_wan_draft "$m" "$clients" "$t"
    rm -rf "$t"
}
# rank0_figs DIR: rank 0's steps, tokens come back and TOKEN frames, one line
rank0_figs() {
    "$KVCTL" status --ring "$1" --json 2>/dev/null | sed -n 1p |
        python3 -c 'import json,sys; o=json.load(sys.stdin); d=o["drafts"]; print(o["steps"], d["tokens"], d["token_frames"])'
}
# Drafting over the emulated WAN (docs/ring.md, "Drafting"): a repetitive real-text task (greedy
# stories from one prompt, BENCH_WAN_DRAFT_TG tokens each, long enough that the story repeats
# itself), 1 and 8 sessions, without drafts and with prompt-lookup drafts (8 a pass): tokens/s,
# ring passes per generated token, drafts accepted per pass, and the ratio of the two rates.
# With LLAMA_RPC_BIN (a directory holding llama-bench and rpc-server of a llama.cpp built
# outside this repository with GGML_RPC on), llama.cpp's RPC mode over the same links and as
# many hosts, one sequence of BENCH_WAN_RPC_TG (16) tokens: tests/bench/bench-wan-rpc.sh.
bench_wan_draft() {
    local m=$1 clients=$2 t=$3 tg=${BENCH_WAN_DRAFT_TG:-256} prof n delay k mode a b tok pass acc line
    local prompt="Once upon a time"
    echo "  drafting: \"$prompt\", greedy, $tg tokens a session (BENCH_WAN_DRAFT_TG); passes/token from rank 0's steps"
    printf "  %-7s  %6s  %8s  %-6s  %12s  %13s  %13s\n" profile stages sessions drafts "tok/s" "passes/token" "accepted/pass"
    for prof in ${BENCH_WAN_DRAFT_PROFILES:-lan wan phone}; do
        for n in ${BENCH_WAN_DRAFT_STAGES:-8}; do
            WD=$t/dring
            if ! KV_BUILD=$B WAN_RING_UP_OPTS="-t 1" tests/lib/wan_ring.sh up "$WD" "$m" "$n" "$prof" > "$t/up" 2>&1; then
                echo "  $prof $n stages: the ring did not come up:"; tail -3 "$t/up" | sed 's/^/    /'
                continue
            fi
            for k in 1 ${BENCH_WAN_SESSIONS:-8}; do
                local base=""
                for mode in 0 8; do
                    a=$(rank0_figs "$WD")
                    tok=$("$clients" --draft $mode --prompt "$prompt" "$WD/rank-0/kvd.sock" "$k" "$tg" 2>/dev/null |
                          sed -n 's/^total:.* tok_s \([0-9.]*\).*/\1/p')
                    b=$(rank0_figs "$WD")
                    line=$(awk -v a="$a" -v b="$b" -v n=$((k * tg)) 'BEGIN { split(a, x, " "); split(b, y, " ");
                        f = y[3] - x[3]; printf "%.2f %.2f", (y[1] - x[1]) / n, (f > 0 ? (y[2] - x[2] - f) / f : 0) }')
                    printf "  %-7s  %6s  %8s  %-6s  %12s  %13s  %13s%s\n" "$prof" "$n" "$k" \
                        "$([ $mode = 0 ] && echo none || echo lookup)" "${tok:-?}" "${line% *}" "${line#* }" \
                        "$([ $mode = 0 ] && echo "" || awk -v a="${tok:-0}" -v b="${base:-0}" 'BEGIN { if (b > 0) printf "   %.2fx none", a / b }')"
                    [ $mode = 0 ] && base=$tok
                done
                # llama.cpp's RPC mode over the same emulated links, n hosts (one session)
                if [ "$k" = 1 ] && [ -n "${LLAMA_RPC_BIN:-}" ]; then
                    local rpc
                    rpc=$(KV_BUILD=$B tests/bench/bench-wan-rpc.sh "$LLAMA_RPC_BIN" "$m" "$n" "$prof" "${BENCH_WAN_RPC_TG:-16}")
                    a=$(echo "$rpc" | sed -n 's/^tok_s \([0-9.]*\).*/\1/p')
                    printf "  %-7s  %6s  %8s  %-6s  %12s  %13s  %13s%s\n" "$prof" "$n" 1 "llama.cpp RPC" "${a:-?}" "" "" \
                        "$(awk -v a="${base:-0}" -v b="${a:-0}" 'BEGIN { if (b > 0) printf "   ring (none) %.1fx", a / b }')"
                    [ -n "$a" ] || echo "    $rpc"
                fi
            done
            KV_BUILD=$B tests/lib/wan_ring.sh down "$WD"
            WD=""
        done
    done
}
if want wan; then bench_wan || true; fi
# ---- draft: speculative decoding with prompt-lookup drafts in one process (docs/model.md,
# "Drafting"): the same text in fewer passes where it repeats itself ----
bench_draft() {
    local f m n=${BENCH_DRAFT_TG:-256} samp base drf a b
    echo "== draft: kvctl generate --draft lookup against none, one process, 1 thread, $n tokens," \
         "\"Once upon a time\", --ignore-eos; $(date -u '+%Y-%m-%d %H:%M UTC'), nproc $(nproc)," \
         "load average $(cut -d' ' -f1-3 /proc/loadavg)"
    printf "  %-28s %-10s %12s %12s %8s %18s %s\n" model sampling "none tok/s" "draft tok/s" ratio "passes / tokens" "accepted / proposed"
    for f in ${BENCH_DRAFT_MODELS:-stories260K.gguf TinyLLama-v0-q4_0.gguf synth-qwen35-bpe1024-f16.gguf}; do
        m=$TD/models/$f
        [ -s "$m" ] || { echo "  $f missing; skipped"; continue; }
        for samp in "--temp 0" "--temp 0.8 --seed 7"; do
            base=$("$KVCTL" generate -m "$m" -p "Once upon a time" -n "$n" $samp --ignore-eos -t 1 2>&1 >/dev/null |
                   sed -n 's/.*generation: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p')
            drf=$("$KVCTL" generate -m "$m" -p "Once upon a time" -n "$n" $samp --ignore-eos -t 1 --draft lookup 2>&1 >/dev/null)
            a=$(echo "$drf" | sed -n 's/.*generation: [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tok\/s).*/\1/p')
            b=$(echo "$drf" | sed -n 's/^drafts: \([0-9]*\) proposed, \([0-9]*\) accepted; \([0-9]*\) passes for \([0-9]*\) tokens.*/\3 \4 \2 \1/p')
            set -- $b
            printf "  %-28s %-10s %12s %12s %7sx %18s %s\n" "$f" "$([ "$samp" = "--temp 0" ] && echo greedy || echo seeded)" \
                "${base:-?}" "${a:-?}" "$(awk -v x="${a:-0}" -v y="${base:-0}" 'BEGIN { if (y > 0) printf "%.2f", x / y; else print "-" }')" \
                "${1:-?} / ${2:-?}" "${3:-?} / ${4:-?}"
        done
    done
}
if want draft; then bench_draft || true; fi
# ---- mtp: the MTP drafter's cost in one process (docs/model.md, "Drafting"): copies of the
# Qwen3.5 test models with one random MTP block (kvctl synth --from --nextn 1), whose guesses
# random weights rarely confirm, so this shows what a pass costs with the block's drafts
# against a pass without (the text is the same) ----
bench_mtp() {
    local f m c n=${BENCH_MTP_TG:-128} k none t_none p_none drf t p acc prop
    echo "== mtp: kvctl generate --draft mtp against none, one process, 1 thread, $n tokens greedy," \
         "copies with one random MTP block; $(date -u '+%Y-%m-%d %H:%M UTC'), nproc $(nproc)," \
         "load average $(cut -d' ' -f1-3 /proc/loadavg)"
    printf "  %-34s %-10s %10s %12s %10s %18s %s\n" model drafts "tok/s" "ms / pass" "x none" "passes / tokens" "accepted / proposed"
    mkdir -p build/bench
    for f in ${BENCH_MTP_MODELS:-synth-qwen35-bpe1024-f16.gguf synth-qwen35moe-bpe1024-q8_0.gguf}; do
        m=$TD/models/$f
        [ -s "$m" ] || { echo "  $f missing; skipped"; continue; }
        c=build/bench/mtp-$f
        "$KVCTL" synth --from "$m" --nextn 1 -o "$c" > /dev/null || { echo "  $f: kvctl synth --from failed"; continue; }
        none=$("$KVCTL" generate -m "$c" --tokens 1,400,300,200 -n "$n" --temp 0 --ignore-eos -t 1 --ids 2>&1 >/dev/null)
        t_none=$(echo "$none" | sed -n 's/.*generation: \([0-9]*\) tokens in \([0-9.]*\) s.*/\2/p')
        p_none=$(echo "$none" | sed -n 's/.*generation: \([0-9]*\) tokens in.*/\1/p')
        printf "  %-34s %-10s %10s %12s %10s %18s %s\n" "$f" none \
            "$(awk -v t="$t_none" -v p="$p_none" 'BEGIN { if (t > 0) printf "%.0f", p / t }')" \
            "$(awk -v t="$t_none" -v p="$p_none" 'BEGIN { if (p > 0) printf "%.3f", 1000 * t / p }')" 1.00 "$p_none / $p_none" "-"
        for k in 1 3; do
            drf=$("$KVCTL" generate -m "$c" --tokens 1,400,300,200 -n "$n" --temp 0 --ignore-eos -t 1 --ids \
                  --draft mtp --draft-max $k 2>&1 >/dev/null)
            t=$(echo "$drf" | sed -n 's/.*generation: [0-9]* tokens in \([0-9.]*\) s.*/\1/p')
            set -- $(echo "$drf" | sed -n 's/^drafts: \([0-9]*\) proposed, \([0-9]*\) accepted; \([0-9]*\) passes for \([0-9]*\) tokens.*/\1 \2 \3 \4/p')
            prop=${1:-?} acc=${2:-?} p=${3:-0}
            printf "  %-34s %-10s %10s %12s %9sx %18s %s\n" "$f" "mtp $k" \
                "$(awk -v t="$t" -v n="${4:-0}" 'BEGIN { if (t > 0) printf "%.0f", n / t }')" \
                "$(awk -v t="$t" -v p="$p" 'BEGIN { if (p > 0) printf "%.3f", 1000 * t / p }')" \
                "$(awk -v t="$t" -v p="$p" -v t0="$t_none" -v p0="$p_none" 'BEGIN { if (p > 0 && t0 > 0) printf "%.2f", (t / p) / (t0 / p0) }')" \
                "$p / ${4:-?}" "$acc / $prop"
        done
    done
}
if want mtp; then bench_mtp || true; fi

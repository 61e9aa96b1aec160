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
    echo "== kernels: attention over an F16 cache (TinyLlama heads), one query row"
    for c in 128 2048; do "$B/tests/tool-kernbench" $kt -a $c || true; done
else
    echo "tool-kernbench not built"
fi

echo "== planner: 96 layers over 1000 devices (goal: well under a second)"
make -s -j2 "$B/tests/tool-plan-bench" >/dev/null 2>&1 || true
if [ -x "$B/tests/tool-plan-bench" ]; then "$B/tests/tool-plan-bench" || echo "plan bench failed"; else echo "tool-plan-bench not built"; fi

# Tokenizer: 1 MiB of English text (the licence texts every Debian system ships, repeated),
# tokenised by vocabularies from the shared test data (goal: well under a second each).
TD=${KV_TESTDATA:-../shared/testdata}
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

# ---- ring: loopback rings vs one process, wire bytes, concurrent sessions ----
# A mid-sized synthetic llama (12 layers, n_embd 1024, Q4_0) so each figure takes seconds.
# One compute thread per stage and for the one process (BENCH_RING_THREADS overrides).
RT=${BENCH_RING_THREADS:-1}
RN=${BENCH_RING_TG:-48}
f="$CACHE/ring-bench-q4_0.gguf"
if [ ! -s "$f" ]; then
    echo "writing $f ..."
    "$KVCTL" synth --arch llama --layers 12 --embd 1024 --ff 2816 --heads 16 --kv-heads 4 \
        --vocab 8192 --type q4_0 --seed 3 --ctx 1024 -o "$f" >/dev/null || { echo "ring bench: synth failed"; exit 0; }
fi
PROMPT=1,100,200,300,400,500,600,700
tgrate() { sed -n 's/.*generation: \([0-9]*\) tokens in \([0-9.]*\) s.*/\1 \2/p' | awk '{ if ($2 > 0) printf "%.2f", $1 / $2; else print 0 }'; }
echo
echo "== ring: decode tok/s of loopback rings vs one process (12-layer n_embd 1024 Q4_0, $RT thread(s) per stage, tg$RN)"
one=$("$KVCTL" generate -m "$f" --ids --tokens $PROMPT -n "$RN" --temp 0 --ignore-eos -t "$RT" 2>&1 >/dev/null | tgrate)
echo "  one process      $one tok/s"
RD=$CACHE/ring-bench
for n in 1 2 3; do
    "$KVCTL" ring down --dir "$RD" >/dev/null 2>&1 || true
    "$KVCTL" ring up --model "$f" --stages $n --dir "$RD" -t "$RT" >/dev/null || { echo "ring up $n failed"; continue; }
    r=$("$KVCTL" generate --ring "$RD" --ids --tokens $PROMPT -n "$RN" --temp 0 --ignore-eos 2>&1 >/dev/null | tgrate)
    echo "  $n-stage ring     $r tok/s"
    if [ $n -eq 3 ]; then
        echo "  bytes on the wire per token per edge (f32; n_embd x 4 + 28-byte header = $((1024 * 4 + 28))):"
        "$KVCTL" status --ring "$RD" --json | python3 -c '
import json, sys
for l in sys.stdin:
    s = json.loads(l)
    kind = "TOKEN" if s["rank"] == s["n_ranks"] - 1 else "ACT"
    print("    rank %d -> rank %d: %8.1f B/token (%s)" % (s["rank"], (s["rank"] + 1) % s["n_ranks"], s["bytes_per_token_out"], kind))'
        echo "== ring: aggregate decode tok/s with concurrent sessions (3-stage ring, tg$RN each)"
        for k in 1 4 8; do
            start=$(date +%s.%N)
            pids=""
            for i in $(seq $k); do
                "$KVCTL" generate --ring "$RD" --ids --tokens 1,$((100 + i)),$((200 + i)) -n "$RN" --temp 0 --ignore-eos \
                    >/dev/null 2>&1 &
                pids="$pids $!"
            done
            for p in $pids; do wait $p; done
            end=$(date +%s.%N)
            awk -v k=$k -v n="$RN" -v a="$start" -v b="$end" 'BEGIN { printf "  %d session(s): %8.2f tok/s aggregate\n", k, k * n / (b - a) }'
        done
    fi
    "$KVCTL" ring down --dir "$RD" >/dev/null
done

echo "== windows: pull throughput, loopback seeder vs curl of the same bytes from nginx"
# The TinyLlama-shaped Q4_0 model above; a window of half its layers. Page cache warmed first.
bench_pull() {
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
bench_pull || true

# ---- relay: 1000 concurrent bridges, 1 MB each way; added latency of one hop ----
echo
echo "== relay: 1000 concurrent bridges over TLS on loopback, 1 MB each way per bridge (every message checked)"
bench_relay() {
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
bench_relay || true

# ---- Qwen3.5 family: the small synthetic MoE / hybrid models of the test data ----
# Active bytes per token (router + used experts + shared expert) vs all expert bytes (memory).
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

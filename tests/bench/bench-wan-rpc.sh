#!/bin/bash
# bench-wan-rpc.sh LLAMA_BIN_DIR MODEL HOSTS PROFILE TOKENS: llama.cpp's RPC mode over the
# emulated links of tests/tools/tool-wan-proxy, for the `wan` section of tests/bench.sh (a figure,
# never pass/fail; docs/ring.md, "Over a WAN").
#
# The same shape as a ring of HOSTS stages: one host holds the first layers and drives
# (llama-bench), the other HOSTS - 1 run llama.cpp's rpc-server on loopback, each behind its own
# proxy with PROFILE (none, lan, wan, phone), and llama-bench offloads the model's last
# layers to them (-ngl: all but the driver's share, split among the servers by the equal
# memory each reports). Prints "tok_s X" (llama-bench's tg TOKENS, greedy decode of one
# sequence, best of 1 repetition) or says why it could not. LLAMA_BIN_DIR holds llama-bench
# and rpc-server from a llama.cpp built outside this repository with GGML_RPC on.
set -u
cd "$(dirname "$0")/../.."
B=${KV_BUILD:-build}
PROXY=$B/tests/tool-wan-proxy
bin=${1:-} model=${2:-} hosts=${3:-} prof=${4:-} tg=${5:-32}
[ -x "$bin/llama-bench" ] && [ -x "$bin/rpc-server" ] || { echo "skipped: no llama-bench and rpc-server in '$bin'"; exit 0; }
[ -s "$model" ] && [ "${hosts:-0}" -ge 2 ] && [ -n "$prof" ] || { echo "usage: $0 LLAMA_BIN_DIR MODEL HOSTS PROFILE [TOKENS]"; exit 2; }
t=$(mktemp -d /tmp/kvbench-rpc.XXXXXX)
pids=""
cleanup() { for p in $pids; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$t"; }
trap cleanup EXIT
# a port free on 127.0.0.1 for an rpc-server (it takes a port number, not 0); a clash shows as
# a server that did not come up, and the run says so
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
n_layer=$("$B/kvctl" inspect "$model" 2>/dev/null | sed -n 's/^  layers  *\([0-9]*\)$/\1/p' | head -1)
[ -n "$n_layer" ] || { echo "skipped: cannot read the layer count of $model"; exit 0; }
list=""
for i in $(seq 1 $((hosts - 1))); do
    port=$(free_port)
    "$bin/rpc-server" -H 127.0.0.1 -p "$port" -m 1024 > "$t/rpc-$i.log" 2>&1 &
    pids="$pids $!"
    "$PROXY" --profile "$prof" --to "127.0.0.1:$port" --port-file "$t/proxy-$i.port" --seed "$i" \
        > "$t/proxy-$i.log" 2>&1 &
    pids="$pids $!"
    for _ in $(seq 100); do
        [ -s "$t/proxy-$i.port" ] && grep -q "listening\|Starting RPC server" "$t/rpc-$i.log" 2>/dev/null && break
        sleep 0.1
    done
    [ -s "$t/proxy-$i.port" ] || { echo "failed: proxy $i did not start: $(tail -2 "$t/proxy-$i.log")"; exit 0; }
    list="$list${list:+,}127.0.0.1:$(cat "$t/proxy-$i.port")"
done
ngl=$((n_layer - n_layer / hosts))   # the driver keeps the first n_layer / hosts layers
out=$(timeout 900 "$bin/llama-bench" -m "$model" -p 0 -n "$tg" -r 1 -t 1 -ngl "$ngl" -rpc "$list" -o json 2>"$t/bench.err")
ts=$(echo "$out" | python3 -c 'import json,sys; print("%.2f" % json.load(sys.stdin)[0]["avg_ts"])' 2>/dev/null)
if [ -n "$ts" ]; then
    echo "tok_s $ts (llama.cpp RPC: $hosts hosts, $((n_layer - ngl)) layers on the driver, $ngl on $((hosts - 1)) rpc-servers)"
else
    echo "failed: llama-bench: $(tail -3 "$t/bench.err" | tr '\n' ' ')"
fi

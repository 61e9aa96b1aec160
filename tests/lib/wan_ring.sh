#!/bin/bash
# wan_ring.sh — a local ring with a WAN delay proxy (tests/tools/tool-wan-proxy) on every link,
# for tests/integration/test-ring-wan.sh and the `wan` section of tests/bench.sh (docs/ring.md, "Over a
# WAN").
#
#   tests/lib/wan_ring.sh up DIR MODEL STAGES PROFILE [PROXY_OPTION...]
#       `kvctl ring up --dir DIR --model MODEL --stages STAGES $WAN_RING_UP_OPTS` writes the
#       manifest (node keys pinned, the planner's windows, the catalog) and is taken down
#       again; then one proxy per rank listens on a port of its own (port 0, a port file) and
#       the manifest's endpoint of that rank becomes the proxy's, so the link from rank r-1
#       to rank r (and the ring's closing edge, last -> 0) runs through proxy r; each stage is
#       started again with the same command line plus `--listen 127.0.0.1:0` (where it
#       listens is no longer its endpoint: kvd stage --listen), and its port, read from its
#       log, goes into the file its proxy dials (tool-wan-proxy --to-file), so no port is
#       guessed. PROFILE (none, lan, wan, phone) and the options after it (--delay-ms 5,
#       --loss 0.02, ...) go to every proxy; each proxy gets its own --seed. Waits until every
#       stage has both links up (WAN_RING_TIMEOUT seconds, default 120) and prints one line.
#       `kvctl status --ring DIR`, `kvctl generate --ring DIR` and `kvctl ring down --dir DIR`
#       work on the ring as on any other (the control sockets do not go through the proxies:
#       the client sits next to rank 0, as an API client of rank 0 would).
#       WAN_RING_RELAY="R ...": those ranks (not 0) accept no connection, as a phone behind NAT:
#       a plain relay (kvd relay --plain) is started, proxy R sits in front of it instead of
#       the stage, and rank R's endpoint becomes relay+ws://127.0.0.1:<proxy R>/b/<bridge id>,
#       so both legs of the relayed hop (the predecessor dialling the relay, rank R dialling it
#       for its in-link) cross proxy R: a relayed hop costs two legs' delay, as it does.
#   tests/lib/wan_ring.sh down DIR
#       `kvctl ring down --dir DIR`, then stops the proxies this script started in DIR (by the
#       pids it wrote).
# Files in DIR besides kvctl ring up's: wan-R.pid, wan-R.port, wan-R.log (proxy R, in front of
# rank R), rank-R/listen.port (the stage's own port), rank-R/kvd.cmdline; with relayed ranks
# relay.pid and relay.log.
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
B=${KV_BUILD:-$ROOT/build}
KVCTL=$B/kvctl
PROXY=$B/tests/tool-wan-proxy

die() { echo "wan_ring.sh: $*" >&2; exit 1; }

# wait_for SECONDS CMD...: CMD every 0.1 s until it succeeds, or fail after SECONDS
wait_for() {
    local t=$1 i
    shift
    for i in $(seq $((t * 10))); do "$@" && return 0; sleep 0.1; done
    "$@"
}

wan_down() {
    local d=$1 f p i
    "$KVCTL" ring down --dir "$d" > /dev/null 2>&1
    for f in "$d"/wan-*.pid; do
        [ -f "$f" ] || continue
        p=$(cat "$f")
        # only a proxy this script started: its command line names this ring's port file
        if [ -n "$p" ] && tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | grep -q -- "--port-file $d/wan-"; then
            kill "$p" 2>/dev/null
            for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        fi
        rm -f "$f"
    done
    # the relay this script started for WAN_RING_RELAY, by the log it writes in DIR
    p=$(cat "$d/relay.pid" 2>/dev/null)
    if [ -n "$p" ] && [ "$(readlink "/proc/$p/fd/1" 2>/dev/null)" = "$d/relay.log" ]; then
        kill "$p" 2>/dev/null
        for i in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    fi
    rm -f "$d/relay.pid"
}
relayed() { case " ${WAN_RING_RELAY:-} " in *" $1 "*) return 0 ;; esac; return 1; }
relay_port() { sed -n 's/.*listening on .* port \([0-9]*\).*/\1/p' "$1" | head -1; }
has_relay_port() { [ -n "$(relay_port "$1")" ]; }

stage_port() { sed -n 's/.*listening on [^ ]* (port \([0-9]*\)).*/\1/p' "$1" | head -1; }
has_port() { [ -n "$(stage_port "$1")" ]; }
linked() { [ "$("$KVCTL" status --ring "$1" --json 2>/dev/null | grep -c '"linked":true')" = "$2" ]; }

wan_up() {
    [ $# -ge 4 ] || die "usage: wan_ring.sh up DIR MODEL STAGES PROFILE [PROXY_OPTION...]"
    local d=$1 model=$2 n=$3 profile=$4 r pid port i
    shift 4
    [ -x "$PROXY" ] || die "no $PROXY (make tests)"
    mkdir -p "$d"
    d=$(cd "$d" && pwd)
    wan_down "$d"
    # 1. the manifest, keys and catalog as kvctl ring up makes them, and each stage's command line
    # shellcheck disable=SC2086
    "$KVCTL" ring up --dir "$d" --model "$model" --stages "$n" ${WAN_RING_UP_OPTS:-} > "$d/up.log" 2>&1 ||
        die "kvctl ring up: $(tail -5 "$d/up.log")"
    for r in $(seq 0 $((n - 1))); do
        tr '\0' '\n' < "/proc/$(cat "$d/rank-$r/kvd.pid")/cmdline" > "$d/rank-$r/kvd.cmdline" ||
            die "rank $r: no command line"
    done
    "$KVCTL" ring down --dir "$d" > /dev/null 2>&1 || die "kvctl ring down after the first start"
    # 2. a proxy in front of every rank (of the relay, for a relayed rank)
    local rport=""
    if [ -n "${WAN_RING_RELAY:-}" ]; then
        relayed 0 && die "WAN_RING_RELAY: rank 0 dials out and is dialled by the last rank; relay another"
        setsid "$B/kvd" --role relay --listen 127.0.0.1:0 --plain > "$d/relay.log" 2>&1 < /dev/null &
        echo $! > "$d/relay.pid"
        wait_for 10 has_relay_port "$d/relay.log" || die "the relay did not start: $(tail -3 "$d/relay.log")"
        rport=$(relay_port "$d/relay.log")
    fi
    for r in $(seq 0 $((n - 1))); do
        rm -f "$d/wan-$r.port" "$d/rank-$r/listen.port"
        local to=(--to-file "$d/rank-$r/listen.port")
        relayed "$r" && to=(--to "127.0.0.1:$rport")
        setsid "$PROXY" --listen 127.0.0.1:0 --port-file "$d/wan-$r.port" "${to[@]}" \
            --profile "$profile" --seed $((r + 1)) "$@" > "$d/wan-$r.log" 2>&1 < /dev/null &
        echo $! > "$d/wan-$r.pid"
    done
    for r in $(seq 0 $((n - 1))); do
        wait_for 10 test -s "$d/wan-$r.port" || die "proxy $r did not start: $(cat "$d/wan-$r.log")"
    done
    # 3. every endpoint is its proxy's
    python3 - "$d" "$n" "${WAN_RING_RELAY:-}" <<'EOF' || die "rewriting the manifest"
import json, os, sys
d, n, relayed = sys.argv[1], int(sys.argv[2]), [int(x) for x in sys.argv[3].split()]
m = json.load(open(d + "/ring.json"))
for r in range(n):
    port = open("%s/wan-%d.port" % (d, r)).read().strip()
    if r in relayed:
        m["ranks"][r]["endpoint"] = "relay+ws://127.0.0.1:%s/b/%s" % (port, os.urandom(16).hex())
    else:
        m["ranks"][r]["endpoint"] = "tcp://127.0.0.1:%s" % port
open(d + "/ring.json.tmp", "w").write(json.dumps(m, indent=2) + "\n")
EOF
    mv "$d/ring.json.tmp" "$d/ring.json"
    # 4. the stages again, each listening on a port of its own, told to its proxy (a relayed
    # rank listens through the relay, its endpoint)
    for r in $(seq 0 $((n - 1))); do
        mapfile -t args < "$d/rank-$r/kvd.cmdline"
        local listen=(--listen 127.0.0.1:0)
        relayed "$r" && listen=()
        setsid "${args[@]}" "${listen[@]}" > "$d/rank-$r/kvd.log" 2>&1 < /dev/null &
        echo $! > "$d/rank-$r/kvd.pid"
    done
    for r in $(seq 0 $((n - 1))); do
        relayed "$r" && continue
        wait_for 30 has_port "$d/rank-$r/kvd.log" || die "rank $r did not listen: $(tail -5 "$d/rank-$r/kvd.log")"
        port=$(stage_port "$d/rank-$r/kvd.log")
        echo "$port" > "$d/rank-$r/listen.port.tmp" && mv "$d/rank-$r/listen.port.tmp" "$d/rank-$r/listen.port"
    done
    if ! wait_for "${WAN_RING_TIMEOUT:-120}" linked "$d" "$n"; then
        for r in $(seq 0 $((n - 1))); do echo "--- rank $r"; tail -5 "$d/rank-$r/kvd.log"; done >&2
        die "the ring did not link through the proxies"
    fi
    echo "wan ring up: $n stages, profile $profile${*:+ $*}${WAN_RING_RELAY:+, ranks $WAN_RING_RELAY through a relay}, proxies on ports" \
        "$(for r in $(seq 0 $((n - 1))); do printf '%s ' "$(cat "$d/wan-$r.port")"; done)(manifest $d/ring.json)"
}

case "${1:-}" in
up) shift; wan_up "$@" ;;
down) [ $# -eq 2 ] || die "usage: wan_ring.sh down DIR"; wan_down "$(cd "$2" 2>/dev/null && pwd || echo "$2")" ;;
*) die "usage: wan_ring.sh up DIR MODEL STAGES PROFILE [PROXY_OPTION...] | down DIR" ;;
esac

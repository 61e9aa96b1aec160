# lib.sh — the set-up every tests/integration/test-*.sh shares. Source it first:
#     . "$(dirname "$0")/../lib/lib.sh"
# It moves to the repository root and sets
#   ROOT          the repository
#   B, KV_BUILD   the build directory ($KV_BUILD; tests/run.sh passes it, default build/)
#   KVCTL, KVD    the binaries; TOOLS the test tools ($B/tests)
#   KVD_STUB      the test build of kvd that offers `kvd stage --stub` (stand-in compute);
#                 ring_up runs it (KVD_BIN) for a ring started with --stub
#   DATA, TD      the shared test data ($KV_TESTDATA, default ../shared/testdata)
#   T, TMP        a fresh scratch directory, removed on exit
# Failures:
#   fail MSG      prints "FAIL: MSG" and counts it (from subshells too); the script goes on,
#                 or stops at once after fail_fast (the ring tests, whose later steps need
#                 the earlier ones)
#   die MSG       prints "FAIL: MSG" and exits 1
#   finish        the last line of a script: "PASS", or the failure count and exit 1
#   need_data PATH...   a missing file is a failure that says "test data missing"
#   need_model NAME     the path of a shared model (printed), or that failure
#   need_exec FILE...   a missing binary stops the script (build first)
# Clean-up, whatever way the script ends:
#   at_exit CMD   runs CMD on exit (in order), before T is removed; CMD may set LIB_RC=1
#   PIDS          background processes to kill and reap on exit (append: PIDS="$PIDS $!")
#   RINGS         ring directories to stop with `kvctl ring down` on exit (ring_up adds)
#   KEEP_FAILED_TMP=1   keeps T when the script fails (for inspection; it says where)
#   san_log_check       on exit, a sanitizer report in any *.log under T fails the script
# Waiting and ports:
#   wait_for SECONDS CMD...   runs CMD every 0.1 s until it succeeds (0) or time is up (1)
#   wait_file FILE [SECONDS]  until FILE exists and is not empty
#   wait_port PORT [SECONDS]  until 127.0.0.1:PORT accepts a connection
#   free_port                 prints a TCP port free on 127.0.0.1 right now, below the ephemeral
#                             range (for a port nothing must listen on, or a server that cannot
#                             take a socket handed over: nginx, PostgreSQL; a daemon's port
#                             comes from LISTEN)
#   $LISTEN PORTFILE PORT[,PORT..] -- CMD...   runs CMD with a listening socket on 127.0.0.1
#                             for each PORT (0: a free one), bound first (tests/lib/listen.py; kvd
#                             takes them as systemd hands sockets over); {PORT} / {PORT0},
#                             {PORT1}.. in CMD are their ports; in the background (&), $! is
#                             the daemon's pid
#   port_of PORTFILE [I]      waits for PORTFILE and prints its port I (default 0)
#   api_port DIR              the port of ring DIR's API (`ring_up DIR ... --api 127.0.0.1:0`)
# Greedy tokens of two devices:
#   near_tie MODEL PROMPT ONE OTHER DEV_ONE DEV_OTHER   the greedy token lists ONE and OTHER
#                             (from devices DEV_ONE and DEV_OTHER: cpu, ref, opencl) part at a
#                             near-tie (tests/lib/near_tie.py)
# Rings on loopback (real kvd processes):
#   ring_up DIR ARGS...  `kvctl ring up --dir DIR ARGS...`, stopped on exit
#   ring_down DIR; rank_pid DIR R; rank_port DIR R; wait_linked DIR N SECONDS
set -u
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 1
B=${KV_BUILD:-$ROOT/build}
KV_BUILD=$B
KVCTL=$B/kvctl
KVD=$B/kvd
KVD_STUB=$B/tests/kvd-stub
TOOLS=$B/tests
DATA=${KV_TESTDATA:-$ROOT/../shared/testdata}
TD=$DATA
# (under tests/run.sh, inside the test's own scratch directory, with a short name: socket
# paths under T are bounded)
if [ -n "${KV_TEST_TMP:-}" ]; then
    T=$(mktemp -d "$KV_TEST_TMP/t.XXXXXX")
else
    T=$(mktemp -d "/tmp/kvtest-$(basename "$0" .sh).XXXXXX")
fi
TMP=$T
PIDS=""
RINGS=""
EXTRA_PIDS=""
fails=0
LIB_FATAL=0
LIB_SAN=0
LIB_AT_EXIT=()

at_exit() { LIB_AT_EXIT+=("$*"); }

lib_exit() {
    LIB_RC=$?
    local h p d
    for d in $RINGS; do "$KVCTL" ring down --dir "$d" >/dev/null 2>&1; done
    for h in "${LIB_AT_EXIT[@]}"; do eval "$h"; done
    for p in $PIDS $EXTRA_PIDS; do kill "$p" 2>/dev/null; done
    for p in $PIDS $EXTRA_PIDS; do wait "$p" 2>/dev/null; done
    [ "$LIB_SAN" = 1 ] && lib_san_report && LIB_RC=1
    if [ "$LIB_RC" -ne 0 ] && [ "${KEEP_FAILED_TMP:-0}" = 1 ]; then
        echo "kept $T for inspection"
    else
        rm -rf "$T"
    fi
    exit "$LIB_RC"
}
trap lib_exit EXIT

# Prints any sanitizer report found in a log under T; true when there was one.
lib_san_report() {
    local logs l
    logs=$(grep -l "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:" \
        $(find "$T" -name '*.log') 2>/dev/null) || return 1
    echo "FAIL: sanitizer report in a log:"
    for l in $logs; do echo "--- $l"; grep -A25 "Sanitizer\|runtime error" "$l" | head -40; done
    return 0
}
san_log_check() { LIB_SAN=1; }

fail() {
    echo "FAIL: $*"
    fails=$((fails + 1))
    echo x >> "$T/.fails"
    if [ "$LIB_FATAL" = 1 ]; then
        declare -F on_fatal > /dev/null && on_fatal
        exit 1
    fi
}
fail_fast() { LIB_FATAL=1; }
die() { echo "FAIL: $*"; exit 1; }

# The failures so far, counted in a file so that subshells' count too.
n_fails() { if [ -f "$T/.fails" ]; then wc -l < "$T/.fails"; else echo 0; fi; }

finish() {
    local n
    n=$(n_fails)
    if [ "$n" -eq 0 ]; then echo "PASS"; exit 0; fi
    echo "$n failure(s)"
    exit 1
}

need_data() {
    local f
    for f in "$@"; do
        [ -r "$f" ] || die "test data missing: $f (set KV_TESTDATA)"
    done
}
# (used as M=$(need_model NAME) || exit 1: the failure goes to stderr, not into M)
need_model() {
    [ -f "$TD/models/$1" ] || { fail "test data missing: $TD/models/$1 (set KV_TESTDATA)" >&2; return 1; }
    echo "$TD/models/$1"
}
# expect WHAT CODE-PATTERN ARGS...: one signed market call (tests/tools/tool-market-call.c with
# ARGS); its "STATUS BODY" answer must match the status pattern (LAST keeps the answer)
expect() {
    local what=$1 want=$2 out
    shift 2
    out=$("$TOOLS/tool-market-call" "$@")
    LAST=$out
    case "${out%% *}" in
        $want) echo "ok   $what -> ${out:0:200}" ;;
        *) fail "$what: expected $want, got: $out" ;;
    esac
}
# client_open MODEL MANIFEST SESSION T KEY [CLIENT-ID]: rank 0's open side of a session for the
# paying client whose key is KEY, with its proof (docs/market.md, "Clients"); CLIENT-ID names
# another client than KEY's (a forgery)
client_open() {
    python3 - "$@" <<'PY'
import hashlib, hmac, json, sys
model, man, sess, t, key = sys.argv[1:6]
cid = sys.argv[6] if len(sys.argv) > 6 else hashlib.sha256(key.encode()).hexdigest()
v = hmac.new(key.encode(), b"kvasir client verifier v1", hashlib.sha256).digest()
p = hmac.new(v, ("KVSESS1\n%s\n%s\n%s\n%s" % (model, man, sess, t)).encode(), hashlib.sha256).hexdigest()
print(json.dumps({"model": model, "manifest": man, "session": sess, "rank": 0, "tokens": [0, int(t)],
                  "side": "open", "client": cid, "proof": p}))
PY
}
need_exec() {
    local f
    for f in "$@"; do [ -x "$f" ] || die "no $f (build first: make tests)"; done
}

wait_for() {
    local t=$1 i
    shift
    for i in $(seq $((t * 10))); do
        "$@" && return 0
        sleep 0.1
    done
    "$@"
}
# wait_clock SECONDS CMD...: as wait_for, but bounded by the clock, for a check that must pass
# within a time (before a lease lapses, say) however slowly each try runs; never tries after.
wait_clock() {
    local end=$(( $(date +%s%N) + $1 * 1000000000 ))
    shift
    while [ "$(date +%s%N)" -le "$end" ]; do
        "$@" && return 0
        sleep 0.1
    done
    return 1
}
wait_file() { wait_for "${2:-10}" test -s "$1"; }
# pid_gone PID: the process is gone or a zombie; either way its files (sockets) are closed.
pid_gone() {
    local s
    s=$(cat "/proc/$1/stat" 2>/dev/null) || return 0
    s=${s##*) }
    [ "${s%% *}" = Z ]
}
# kill_dead PID [SECONDS]: SIGKILL PID and wait until it is dead. A killed process keeps its
# listening socket until its memory is unmapped (a second or more for an ASan build under
# load), so a restart on its port, or a check that its port refuses, waits for this.
kill_dead() {
    kill -9 "$1" 2>/dev/null
    wait_for "${2:-30}" pid_gone "$1" || fail "process $1 did not die within ${2:-30} s of SIGKILL"
}
wait_port() { wait_for "${2:-10}" bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }
LISTEN=$ROOT/tests/lib/listen.py
port_of() {
    wait_file "$1" 20 || { echo "FAIL: $1 was not written (the daemon's launcher failed)" >&2; return 1; }
    awk -v i="${2:-0}" '{ print $(i + 1) }' "$1"
}
api_port() { sed -n 's|^api: https\{0,1\}://.*:\([0-9][0-9]*\)/v1.*|\1|p' "$1.up"; }
free_port() { free_ports 1; }
# free_ports N: the first of N consecutive ports below the kernel's ephemeral range
# (ip_local_port_range), all free right now. Below that range no outgoing connection of
# another test is given one of them between this choice and its use, nor leaves one in
# TIME_WAIT (which holds a port against a later listener, SO_REUSEADDR or not, when the client
# did not set it), as ports of the ephemeral range can be; two tests picking the same ones at
# the same moment is what is left.
free_ports() {
    python3 -c '
import random, socket, sys
n = int(sys.argv[1])
try:
    lo = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
except (OSError, ValueError, IndexError):
    lo = 32768
lo = max(lo, 12000)
def free(p):
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False
    finally:
        s.close()
for _ in range(200):
    p = random.randrange(10000, lo - n)
    if all(free(p + i) for i in range(n)):
        print(p)
        break
else:
    sys.exit("free_ports: no %d free ports in a row below %d" % (n, lo))' "$1"
}

# ring_up DIR ARGS...: start a local ring, remember it for clean-up.
ring_up() {
    local d=$1
    shift
    RINGS="$RINGS $d"
    local kvd_bin=${KVD_BIN:-}
    case " $* " in *" --stub "*) kvd_bin=$KVD_STUB ;; esac
    KVD_BIN=$kvd_bin "$KVCTL" ring up --dir "$d" "$@" > "$d.up" 2>&1 || fail "ring up $*: $(cat "$d.up")"
}
# near_tie MODEL PROMPT ONE OTHER DEV_ONE DEV_OTHER: the greedy token lists ONE (on device
# DEV_ONE) and OTHER (on DEV_OTHER) part at a near-tie (tests/lib/near_tie.py): in DEV_ONE's
# logits of the common prefix (teacher-forced in one batch) their two tokens lie within 1% of
# the row's range, and DEV_OTHER's logits there agree with DEV_ONE's. Devices that quantise
# activations or sum in another order agree on a random-weight model's greedy tokens, whose
# logits lie close together, only up to such near-ties. Says where they parted.
near_tie() {
    local m=$1 prefix=$2 d1=$5 d2=$6 k=0
    local -a a=($3) b=($4)
    while [ $k -lt ${#a[@]} ] && [ $k -lt ${#b[@]} ] && [ "${a[$k]}" = "${b[$k]}" ]; do
        prefix="$prefix,${a[$k]}"
        k=$((k + 1))
    done
    [ $k -lt ${#a[@]} ] && [ $k -lt ${#b[@]} ] || return 1   # one the other's prefix
    "$KVCTL" logits -m "$m" --tokens "$prefix" --device "$d1" -o "$T/nt-$d1.f32" >/dev/null 2>&1 &&
        "$KVCTL" logits -m "$m" --tokens "$prefix" --device "$d2" -o "$T/nt-$d2.f32" >/dev/null 2>&1 ||
        return 1
    python3 "$ROOT/tests/lib/near_tie.py" "$T/nt-$d1.f32" "$T/nt-$d2.f32" \
        "$(echo "$prefix" | tr ',' ' ' | wc -w)" "${a[$k]}" "${b[$k]}" "$d1/$d2"
}

ring_down() { "$KVCTL" ring down --dir "$1" >/dev/null 2>&1; }
rank_pid() { cat "$1/rank-$2/kvd.pid"; }
# rank_port DIR R: the TCP port of rank R's endpoint
rank_port() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"][int(sys.argv[2])]["endpoint"].rsplit(":",1)[1])' "$1/ring.json" "$2"
}
# wait_linked DIR N SECONDS: all N stages report both links up; otherwise their logs' tails.
lib_linked() { [ "$("$KVCTL" status --ring "$1" --json 2>/dev/null | grep -c '"linked":true')" = "$2" ]; }
wait_linked() {
    local d=$1 n=$2 r
    wait_for "$3" lib_linked "$d" "$n" && return 0
    for r in $(seq 0 $((n - 1))); do echo "--- $d/rank-$r/kvd.log"; tail -n 12 "$d/rank-$r/kvd.log"; done
    return 1
}

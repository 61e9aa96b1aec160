# ring_lib.sh — shared helpers for the ring integration tests (sourced by tests/test-ring-*.sh).
# Real kvd processes on 127.0.0.1 (free ports picked by kvctl ring up), cleaned up on exit.
set -u
cd "$(dirname "$0")/.."
B=${KV_BUILD:-$(pwd)/build}
KVCTL=$B/kvctl
KVD=$B/kvd
TOOLS=$B/tests
TD=${KV_TESTDATA:-$(pwd)/../shared/testdata}
TMP=$(mktemp -d /tmp/kvring.XXXXXX)
RINGS=""
EXTRA_PIDS=""

ring_cleanup() {
    local rc=$?
    for d in $RINGS; do "$KVCTL" ring down --dir "$d" >/dev/null 2>&1; done
    for p in $EXTRA_PIDS; do kill "$p" 2>/dev/null; done
    # A sanitizer report from any stage (ASan builds) fails the test.
    if grep -l "ERROR: AddressSanitizer\|ERROR: LeakSanitizer\|runtime error:" $(find "$TMP" -name '*.log') \
            > "$TMP.san" 2>/dev/null; then
        echo "FAIL: sanitizer report in a stage log:"
        for l in $(cat "$TMP.san"); do echo "--- $l"; grep -A25 "Sanitizer\|runtime error" "$l" | head -40; done
        rc=1
    fi
    rm -rf "$TMP" "$TMP.san"
    exit $rc
}
trap ring_cleanup EXIT

fail() {
    echo "FAIL: $*"
    for d in $RINGS; do
        for l in "$d"/rank-*/kvd.log; do [ -f "$l" ] && { echo "--- $l"; tail -n 15 "$l"; }; done
    done
    exit 1
}

need_model() {
    [ -f "$TD/models/$1" ] || fail "test data missing: $TD/models/$1 (set KV_TESTDATA)"
    echo "$TD/models/$1"
}

# ring_up DIR ARGS...: start a local ring, remember it for cleanup.
ring_up() {
    local d=$1; shift
    RINGS="$RINGS $d"
    "$KVCTL" ring up --dir "$d" "$@" > "$d.up" 2>&1 || fail "ring up $*: $(cat "$d.up")"
}

ring_down() {
    "$KVCTL" ring down --dir "$1" >/dev/null 2>&1
}

# rank_pid DIR R
rank_pid() { cat "$1/rank-$2/kvd.pid"; }
# rank_port DIR R: the TCP port of rank R's endpoint
rank_port() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"][int(sys.argv[2])]["endpoint"].rsplit(":",1)[1])' "$1/ring.json" "$2"
}

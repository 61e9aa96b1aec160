#!/bin/bash
# stress.sh — run chosen tests many times while other tests load the machine, and report every
# failure (a flaky test shows itself here, not in CI).
#
#   tests/stress.sh [-n RUNS] [-b BUILD] [-l "LOAD_TEST ..."] TEST ...
#
# Each TEST (a name as tests/run.sh prints it: test-ring-gen.sh, test-kvd-compute; a test of
# tests/tests.list: a shell test from tests/integration/, a C test from BUILD/tests/) runs RUNS
# times (default 10) in turn, one run at a time, with the build BUILD (default build) and the
# environment tests/run.sh gives. Beside them, each LOAD_TEST (default: test-ring-sched.sh
# test-market-api.sh) runs over and over in the background (its results ignored), so the chosen
# tests meet a busy machine, as on a shared CI runner. Every failed run's log is kept in
# BUILD/stress-logs/TEST.RUN.log. Prints one line per run and at the end "N runs, N failed";
# exits 1 when any run failed.
#
#   tests/stress.sh -r [-n ROUNDS] [-j JOBS] [-b BUILD] [-l "LOAD_TEST ..."] PATTERN ...
#
# Rounds: every test whose name contains a PATTERN (ring- market- relay- api- covers those
# suites) runs once a round, side by side through tests/run.sh -j JOBS (default 4), so they
# load each other as well as the load tests; ROUNDS rounds (default 10). A failed run's log is
# kept as BUILD/stress-logs/TEST.ROUND.log.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
runs=10 B=build load="test-ring-sched.sh test-market-api.sh" rounds=0 jobs=4
while [ $# -gt 0 ]; do
    case $1 in
    -n) runs=$2; shift 2 ;;
    -r) rounds=1; shift ;;
    -j) jobs=$2; shift 2 ;;
    -b) B=$2; shift 2 ;;
    -l) load=$2; shift 2 ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "stress.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
[ $# -gt 0 ] || { echo "usage: tests/stress.sh [-n RUNS] [-b BUILD] [-l \"LOAD_TEST ...\"] TEST ..." >&2; exit 2; }
export KV_BUILD="$ROOT/$B"
export KV_TESTDATA=${KV_TESTDATA:-$ROOT/../shared/testdata}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
TIMEOUT=${TEST_TIMEOUT:-900}
logs=$B/stress-logs
mkdir -p "$logs"

# path NAME: the executable of the test tests/tests.list names NAME (a shell test
# tests/integration/NAME, a C test BUILD/tests/NAME)
path() {
    local p
    p=$(sed 's/#.*//' tests/tests.list |
        awk -v n="$1" '$1 == "integration/" n || $1 == "unit/" n ".c" { print $1; exit }')
    case $p in
    integration/*) echo "tests/$p" ;;
    unit/*) [ -x "$B/tests/$1" ] && echo "$B/tests/$1" ;;
    *) return 1 ;;
    esac
}
for t in $([ $rounds = 1 ] || echo "$@") $load; do
    path "$t" > /dev/null ||
        { echo "stress.sh: no test named $t in tests/tests.list (or not built in $B/tests/)" >&2; exit 2; }
done

# the load: each load test over and over in its own background loop, in its own process group
# so that stopping it stops what it started
loaders=""
for l in $load; do
    setsid bash -c 'while :; do timeout -k 10 "$2" "$1" > /dev/null 2>&1; done' _ "$(path "$l")" "$TIMEOUT" &
    loaders="$loaders $!"
done
stop_load() {
    local p
    for p in $loaders; do kill -- -"$p" 2>/dev/null; done
    wait 2>/dev/null
}
trap stop_load EXIT
trap 'exit 130' INT TERM

total=0 bad=0
if [ $rounds = 1 ]; then
    for i in $(seq "$runs"); do
        out=$(TESTS="$*" FUZZ_TIME=0 tests/run.sh -j "$jobs" "$B")
        n=$(echo "$out" | grep -c '^\(PASS\|FAIL\) ')
        total=$((total + n))
        for t in $(echo "$out" | sed -n 's/^FAIL \([^ ]*\) .*/\1/p'); do
            bad=$((bad + 1))
            cp "$B/test-logs/$t.log" "$logs/$t.$i.log"
            echo "FAIL $t round $i (log $logs/$t.$i.log)"
            grep -a '^FAIL' "$logs/$t.$i.log" | head -n 3 | sed 's/^/    > /'
        done
        echo "round $i: $n runs, $(echo "$out" | tail -n 1)"
    done
    echo "$total runs, $bad failed (load: ${load:-none})"
    [ $bad -eq 0 ]
    exit
fi
for t in "$@"; do
    exe=$(path "$t")
    for i in $(seq "$runs"); do
        log=$logs/$t.$i.log
        start=$(date +%s)
        timeout -k 10 "$TIMEOUT" "$exe" > "$log" 2>&1
        rc=$?
        dur=$(( $(date +%s) - start ))
        total=$((total + 1))
        if [ $rc -eq 0 ]; then
            printf 'pass %-40s run %2d  %4ds\n' "$t" "$i" "$dur"
            rm -f "$log"
        else
            bad=$((bad + 1))
            printf 'FAIL %-40s run %2d  %4ds (rc %d; log %s)\n' "$t" "$i" "$dur" "$rc" "$log"
            grep -a '^FAIL' "$log" | head -n 3 | sed 's/^/    > /'
        fi
    done
done
echo "$total runs, $bad failed (load: ${load:-none})"
[ $bad -eq 0 ]

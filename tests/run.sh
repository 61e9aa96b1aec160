#!/bin/bash
# Test runner: runs every test binary build*/tests/test-* and every script tests/test-*.sh,
# each in its own process with a timeout, for each build directory given (default: build).
# Scripts get KV_BUILD (the build directory) in the environment. KV_TESTDATA points at the
# shared test data (default ../shared/testdata next to the repository).
# Filter with TESTS=<substring>; CHECK=1 runs the C tests and only the shell tests named in
# tests/check.list (make check). A failed test shows the lines of its log that start with
# FAIL (for a C test, each failed case and why) and the log's tail.
# Ends with "N passed, N failed"; exits 1 on any failure.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export KV_TESTDATA=${KV_TESTDATA:-$ROOT/../shared/testdata}
TIMEOUT=${TEST_TIMEOUT:-900}
[ $# -eq 0 ] && set -- build
pass=0; fail=0; failed=""
for B in "$@"; do
    export KV_BUILD="$ROOT/$B"
    mkdir -p "$B/test-logs"
    items=$(ls "$B"/tests/test-* 2>/dev/null | grep -v '\.d$'; ls tests/test-*.sh 2>/dev/null)
    for t in $items; do
        name=$(basename "$t")
        [ -n "${TESTS:-}" ] && case "$name" in *"$TESTS"*) ;; *) continue ;; esac
        if [ "${CHECK:-0}" = 1 ] && [ "${name%.sh}" != "$name" ] &&
           ! grep -qx -- "$name" tests/check.list; then
            continue
        fi
        log="$B/test-logs/$name.log"
        start=$(date +%s)
        ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
        UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
            timeout -k 10 "$TIMEOUT" "$t" >"$log" 2>&1
        rc=$?
        dur=$(( $(date +%s) - start ))
        if [ $rc -eq 0 ]; then
            pass=$((pass + 1)); printf 'PASS %-40s %-12s %4ds\n' "$name" "$B" "$dur"
        else
            fail=$((fail + 1)); failed="$failed $B/$name"
            printf 'FAIL %-40s %-12s %4ds (rc %d)\n' "$name" "$B" "$dur" "$rc"
            # the cases that failed (t.h and lib.sh start those lines with FAIL), then the tail
            grep -a '^FAIL' "$log" | head -n 20 | sed 's/^/    > /'
            tail -n 30 "$log" | sed 's/^/    | /'
            # once more after the tail, so that a reader who sees only the end still sees why
            grep -a '^FAIL' "$log" | head -n 3 | sed "s|^|    > $name: |"
        fi
    done
done
if [ -z "${TESTS:-}" ] && [ "${CHECK:-0}" != 1 ] && [ -x tests/fuzz.sh ] && [ "${FUZZ_TIME:-60}" != 0 ]; then
    if tests/fuzz.sh "${FUZZ_TIME:-60}" > build/test-logs/fuzz.log 2>&1; then
        pass=$((pass + 1)); echo "PASS fuzz"
    else
        fail=$((fail + 1)); failed="$failed fuzz"; echo "FAIL fuzz"; tail -n 30 build/test-logs/fuzz.log
    fi
fi
[ -n "$failed" ] && echo "failed:$failed"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

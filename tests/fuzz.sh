#!/bin/bash
# tests/fuzz.sh [SECONDS] — builds every libFuzzer target tests/tests.list names
# (tests/fuzz/fuzz-NAME.c) with clang-14 (ASan+UBSan, make FUZZ=1 fuzzers ->
# build/fuzz/fuzz-NAME) and runs each on its corpus
# build/fuzz/corpus-NAME with -malloc_limit_mb=64.
#   SECONDS given and > 0: the targets run one after another, each for its share of SECONDS.
#   no SECONDS (make fuzz without FUZZ_TIME): all targets run side by side until interrupted.
# Seeds: when a test tool tests/tools/tool-seed-NAME.c exists (built as build/tests/tool-seed-NAME),
# it is run first with the corpus directory and writes seed inputs into it (generated from
# valid small files).
# Crashes land in build/fuzz/artifacts-NAME/; any crash makes the script fail.
set -u
cd "$(dirname "$0")/.."
SECS=${1:-0}
export KV_TESTDATA=${KV_TESTDATA:-$(pwd)/../shared/testdata}
command -v clang-14 >/dev/null || { echo "fuzz: clang-14 missing (scripts/setup.sh installs it)"; exit 1; }
srcs=$(sed 's/#.*//' tests/tests.list | awk '$1 ~ /^fuzz\/fuzz-.*\.c$/ { print "tests/" $1 }')
targets=$(echo "$srcs" | sed 's#tests/fuzz/fuzz-\(.*\)\.c#\1#')
[ -n "$targets" ] || { echo "fuzz: no targets"; exit 0; }
make -s -j2 --no-print-directory tests >/dev/null || { echo "fuzz: build of the seed tools failed"; exit 1; }
mkdir -p build/fuzz
# A target that names its modules ("fuzz-modules:" in its source) builds and links only those;
# for one that does not, every library object clang can build goes into build/fuzz/libfuzz.a
# first (gcc-only SIMD code is left out; a target that needs it then fails to link, reported).
: >build/fuzz/build.log
if grep -L "fuzz-modules:" $srcs | grep -q .; then
    make -s -k -j2 --no-print-directory FUZZ=1 fuzz-objs >build/fuzz/build.log 2>&1
fi
make -s -j2 --no-print-directory FUZZ=1 fuzzers >>build/fuzz/build.log 2>&1 ||
    { tail -30 build/fuzz/build.log; echo "fuzz: build failed (build/fuzz/build.log)"; exit 1; }

n=$(echo "$targets" | wc -w)
share=0
[ "$SECS" -gt 0 ] && { share=$((SECS / n)); [ $share -lt 5 ] && share=5; }
fail=0
pids=""
for t in $targets; do
    corpus=build/fuzz/corpus-$t art=build/fuzz/artifacts-$t
    mkdir -p "$corpus" "$art"
    if [ -x build/tests/tool-seed-$t ]; then
        build/tests/tool-seed-$t "$corpus" >/dev/null || { echo "fuzz: seeding $t failed"; fail=1; }
    fi
    args=(-malloc_limit_mb=64 -rss_limit_mb=2048 -timeout=10 -max_len=65536 -print_final_stats=1
          -artifact_prefix="$art/" "$corpus")
    if [ $share -gt 0 ]; then
        echo "fuzz: $t for ${share}s ($(ls "$corpus" | wc -l) inputs in the corpus)"
        if ! build/fuzz/fuzz-$t -max_total_time=$share "${args[@]}" >build/fuzz/$t.log 2>&1; then
            echo "fuzz: $t FAILED (log build/fuzz/$t.log, inputs in $art)"
            grep -A20 "ERROR\|==ERROR\|runtime error" build/fuzz/$t.log | head -40
            fail=1
        else
            grep -E "stat::number_of_executed_units|cov:" build/fuzz/$t.log | tail -2
        fi
    else
        echo "fuzz: $t until interrupted (log build/fuzz/$t.log)"
        build/fuzz/fuzz-$t "${args[@]}" >build/fuzz/$t.log 2>&1 &
        pids="$pids $!"
    fi
done
if [ -n "$pids" ]; then
    trap 'kill $pids 2>/dev/null' INT TERM
    for p in $pids; do wait "$p" || fail=1; done
fi
[ $fail -eq 0 ] && echo "fuzz: ok" || echo "fuzz: FAILED"
exit $fail

#!/bin/bash
# Test runner: runs the suite's tests side by side, each in its own process group, scratch
# directory and time limit, and prints one line per test as it ends.
#
#   tests/run.sh [-j JOBS] [-l] [BUILD...]      (default BUILD: build)
#
# What runs comes from tests/tests.list, the suite's one list (the Makefile builds what it
# names): for each build directory given,
#   - every C unit test it names (unit/test-NAME.c, run as BUILD/tests/test-NAME) and every
#     shell test (integration/test-NAME.sh) against a normal build; against a sanitizer build
#     (a directory named asan) only those marked "san": every C test, and the shell tests
#     whose daemons parse what a peer, a client or a file sends (TEST_SAN_ALL=1: all of them);
#   - once, after the given builds, tests/fuzz.sh's bounded run (FUZZ_TIME seconds, default
#     60; 0 skips it), when no filter is set.
# Before anything runs, the list is checked against tests/: a test-, tool- or fuzz- file there
# that the list does not name, a line that names no file or two tests of one name stop the
# runner. A listed C test that was not built fails.
# Filters: TESTS="<substring> ..." runs only tests whose name contains one of them; CHECK=1
# only those marked "check" (make check). -l lists what would run ("BUILD NAME"), runs nothing.
#
# Side by side: JOBS (-j, or TEST_JOBS; default twice the CPUs: most tests spend most of
# their time waiting on their daemons, and at the CPUs and one the load stayed near one CPU) is
# a budget of weights. A test weighs 1 unless its script says otherwise in a line
# "# test-weight: N" (the ones whose several daemons compute at once); the runner starts
# tests while their weights fit in the budget, a test heavier than the budget alone.
# The longest tests start first: each run writes every test's duration into
# BUILD/test-logs/times and the next run orders by it (a test not timed there yet counts 20 s
# as a script, 3 s as a C test, four times that under a sanitizer).
# Each test runs under `timeout` (TEST_TIMEOUT seconds, default 900), which puts it in a
# process group of its own; when the test ends, whatever it left in that group is killed. It
# gets a scratch directory of its own, /tmp/kvt.XXXXXX (short: the sockets the tests make
# there have paths of at most 107 bytes), as TMPDIR and KV_TEST_TMP, removed when it ends
# (kept after a failure with KEEP_FAILED_TMP=1).
# A test's environment: KV_BUILD (its build directory), KV_TESTDATA (default
# ../shared/testdata beside the repository), ASAN_OPTIONS/UBSAN_OPTIONS.
#
# A failed test shows the lines of its log that start with FAIL (for a C test, each failed case
# and why) and the log's tail. Ends with "N passed, N failed"; exits 1 on any failure.
#
# Why by hand: prove -j (TAP::Harness) and GNU parallel run jobs side by side but know no job
# weights (two ring tests of several daemons each would then share two cores with two more),
# prove wants TAP from every test, and ctest or meson would bring a second build system. Bash's
# `wait -n -p` gives what a weighted pool needs in a few lines.
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
export KV_TESTDATA=${KV_TESTDATA:-$ROOT/../shared/testdata}
TIMEOUT=${TEST_TIMEOUT:-900}
JOBS=${TEST_JOBS:-$(( $(nproc 2>/dev/null || echo 2) * 2 ))}
LIST_ONLY=0
while [ $# -gt 0 ]; do
    case $1 in
    -j) JOBS=$2; shift 2 ;;
    -j*) JOBS=${1#-j}; shift ;;
    -l) LIST_ONLY=1; shift ;;
    -h|--help) sed -n '2,40p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "run.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
    esac
done
case $JOBS in ''|*[!0-9]*|0) echo "run.sh: -j wants a positive number, not '$JOBS'" >&2; exit 2 ;; esac
[ $# -eq 0 ] && set -- build
for B in "$@"; do
    [ -d "$B" ] || [ $LIST_ONLY = 1 ] || { echo "run.sh: no build directory $B (make first)" >&2; exit 2; }
done

# ---- the list: lines "PATH FLAG..." (PATH under tests/), comments and blank lines dropped ----
LIST=tests/tests.list
entries=$(sed 's/#.*//' "$LIST" 2>/dev/null | awk 'NF')
[ -n "$entries" ] || { echo "run.sh: $LIST is missing or empty" >&2; exit 2; }
list_errors() {
    local p flags f
    while read -r p flags; do
        case $p in
        unit/test-*.c|integration/test-*.sh|tools/tool-*.c|fuzz/fuzz-*.c) ;;
        *) echo "$LIST: $p: not unit/test-*.c, integration/test-*.sh, tools/tool-*.c or fuzz/fuzz-*.c" ;;
        esac
        [ -f "tests/$p" ] || echo "$LIST: $p: no such file"
        for f in $flags; do
            case $f in check|san) ;; *) echo "$LIST: $p: unknown flag '$f' (check, san)" ;; esac
        done
    done <<< "$entries"
    awk -v l="$LIST" '{ n = $1; sub(/.*\//, "", n); sub(/\.c$/, "", n)
                        if (seen[n]++) print l ": " $1 ": a second test or tool named " n }' <<< "$entries"
    # the files of the kinds the list holds, in tests/ and its folders, that it does not name
    comm -13 <(awk '{ print $1 }' <<< "$entries" | LC_ALL=C sort) <(
        cd tests && for d in . */; do
            case $d in data/|node_modules/) continue ;; esac
            ls -d "${d%/}"/test-* "${d%/}"/tool-* "${d%/}"/fuzz-* 2>/dev/null
        done | sed 's#^\./##' | LC_ALL=C sort) |
        sed "s#^#tests/#; s#\$#: not in $LIST (docs/hacking.md, \"How to add a test\")#"
}
errs=$(list_errors)
[ -z "$errs" ] || { echo "$errs" | sed 's/^/run.sh: /' >&2; exit 2; }
marked() { # FLAG FLAGS...: whether FLAG is among FLAGS
    local f=$1; shift
    case " $* " in *" $f "*) return 0 ;; esac
    return 1
}

# ---- the queue: lines "SECONDS WEIGHT BUILD PATH" ----
queue="" listing=""
for B in "$@"; do
    [ $LIST_ONLY = 1 ] || mkdir -p "$B/test-logs"
    times="$B/test-logs/times"
    san=0
    [ "$(basename "$B")" = asan ] && [ "${TEST_SAN_ALL:-0}" != 1 ] && san=1
    while read -r p flags; do
        case $p in
        unit/*) name=${p#unit/}; name=${name%.c}; t=$B/tests/$name ;;
        integration/*) name=${p#integration/}; t=tests/$p ;;
        *) continue ;;   # tools and fuzz targets are built, not run
        esac
        if [ -n "${TESTS:-}" ]; then
            hit=0
            for pat in $TESTS; do case "$name" in *"$pat"*) hit=1 ;; esac; done
            [ $hit = 1 ] || continue
        fi
        [ "${CHECK:-0}" = 1 ] && ! marked check $flags && continue
        [ $san = 1 ] && ! marked san $flags && continue
        w=1
        [ "${name%.sh}" != "$name" ] && w=$(sed -n '1,40s/^# test-weight: *\([0-9][0-9]*\).*/\1/p' "$t" | head -n 1)
        w=${w:-1}
        [ "$w" -gt "$JOBS" ] && w=$JOBS
        s=$(awk -v n="$name" '$1 == n { print $2 }' "$times" 2>/dev/null | tail -n 1)
        if [ -z "$s" ]; then   # not run here yet: shell tests take longer, sanitizers ~4x
            s=3
            [ "${name%.sh}" != "$name" ] && s=20
            [ "$(basename "$B")" = asan ] && s=$((s * 4))
        fi
        queue="$queue$s $w $B $t"$'\n'
        listing="$listing$B $name"$'\n'
    done <<< "$entries"
done
if [ -z "${TESTS:-}" ] && [ "${CHECK:-0}" != 1 ] && [ -x tests/fuzz.sh ] && [ "${FUZZ_TIME:-60}" != 0 ]; then
    # the fuzz run builds its targets first; it counts as one long test of weight 1
    queue="$queue$(( ${FUZZ_TIME:-60} + 200 )) 1 build fuzz"$'\n'
    listing="${listing}build fuzz"$'\n'
fi
if [ $LIST_ONLY = 1 ]; then printf '%s' "$listing"; exit 0; fi
queue=$(printf '%s' "$queue" | sort -s -k1,1nr)
[ -n "$queue" ] || { echo "run.sh: no test to run in $* (TESTS='${TESTS:-}', CHECK=${CHECK:-0})" >&2; exit 2; }

# ---- the pool ----
declare -A job_name=() job_build=() job_w=() job_start=() job_log=() job_tmp=()
used=0 pass=0 fail=0 failed=""
newtimes=$(mktemp)
trap 'rm -f "$newtimes"' EXIT
trap 'for p in "${!job_name[@]}"; do kill -TERM -- "-$p" 2>/dev/null; rm -rf "${job_tmp[$p]}"; done; exit 130' INT TERM

start_one() { # WEIGHT BUILD PATH
    local w=$1 B=$2 t=$3 name log tmp=
    if [ "$t" = fuzz ]; then
        name=fuzz
        log="$B/test-logs/fuzz.log"
        timeout -k 10 "$TIMEOUT" tests/fuzz.sh "${FUZZ_TIME:-60}" > "$log" 2>&1 < /dev/null &
    else
        name=$(basename "$t")
        log="$B/test-logs/$name.log"
        tmp=$(mktemp -d /tmp/kvt.XXXXXX)
        chmod 755 "$tmp"   # tests that run a server as another user (PostgreSQL) reach through it
        if [ ! -x "$t" ]; then   # listed but not built: a failure that says so
            echo "FAIL: $t is missing (make tests builds every C test of $LIST)" > "$log"
            (exit 127) &
        else
            KV_BUILD="$ROOT/$B" TMPDIR="$tmp" KV_TEST_TMP="$tmp" \
            ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
            UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
                timeout -k 10 "$TIMEOUT" "$t" > "$log" 2>&1 < /dev/null &
        fi
    fi
    job_name[$!]=$name job_build[$!]=$B job_w[$!]=$w job_start[$!]=$(date +%s) job_log[$!]=$log
    job_tmp[$!]=${tmp:-}
    used=$((used + w))
}

finish_one() { # PID RC
    local p=$1 rc=$2 name=${job_name[$1]} B=${job_build[$1]} log=${job_log[$1]} dur
    local tmp=${job_tmp[$1]}
    # timeout made the test's process group; what the test left running in it goes now
    kill -KILL -- "-$p" 2>/dev/null
    dur=$(( $(date +%s) - job_start[$p] ))
    used=$((used - job_w[$p]))
    unset "job_name[$p]" "job_build[$p]" "job_w[$p]" "job_start[$p]" "job_log[$p]" "job_tmp[$p]"
    if [ -n "$tmp" ]; then
        if [ "$rc" -ne 0 ] && [ "${KEEP_FAILED_TMP:-0}" = 1 ]; then echo "    kept $tmp"; else rm -rf "$tmp"; fi
    fi
    echo "$B $name $dur" >> "$newtimes"
    if [ "$rc" -eq 0 ]; then
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
}

wait_one() {
    local p rc
    wait -n -p p
    rc=$?
    [ -n "${p:-}" ] && [ -n "${job_name[$p]:-}" ] && finish_one "$p" "$rc"
}

while read -r _ w B t; do
    [ -n "${t:-}" ] || continue
    while [ $((used + w)) -gt "$JOBS" ] && [ "$used" -gt 0 ]; do wait_one; done
    start_one "$w" "$B" "$t"
done <<< "$queue"
while [ "${#job_name[@]}" -gt 0 ]; do wait_one; done

# the durations for the next run's order (the newest figure of each test wins)
for B in "$@"; do
    awk -v b="$B" '$1 == b { print $2, $3 }' "$newtimes" >> "$B/test-logs/times"
    tail -n 400 "$B/test-logs/times" > "$B/test-logs/times.new" && mv "$B/test-logs/times.new" "$B/test-logs/times"
done
[ -n "$failed" ] && echo "failed:$failed"
echo "$pass passed, $fail failed"
[ $fail -eq 0 ]

#!/bin/bash
# The aarch64 build under qemu-user (docs/arm64.md): the NEON kernels against kernels/ref
# (NMSE, and every multi-row dot bit-identical to the one-row dot) on both NEON levels, the
# level chosen by the CPU's HWCAP (a CPU without dotprod gets "neon") and capped by
# KV_KERN_SIMD; a 2-stage ring with both stages arm64 whose greedy tokens equal the x86
# build's and the llama.cpp reference's (../shared/testdata/ref); a mixed ring, an x86 stage
# and an arm64 stage, giving the same text as one process.
# The normal suite runs the kernel part; `make test-arm64` sets KV_ARM64_FULL=1 and adds the
# whole kernel test, the model tests and the rings. Installs what it needs
# with scripts/setup-arm64.sh (or fails saying what is missing) and builds build/arm64.
. "$(dirname "$0")/../lib/ring_lib.sh"

case "$B" in
    */asan | */fuzz) echo "skip: the arm64 build runs once, beside the plain build"; echo PASS; exit 0 ;;
esac
ARM=${KV_ARM64_BUILD:-$ROOT/build/arm64}
FULL=${KV_ARM64_FULL:-0}
# qemu-user's -L root: the host's own, where the arm64 multiarch packages put the loader
# (/lib/ld-linux-aarch64.so.1) and every library the build links, libc among them. Not the
# cross toolchain's /usr/aarch64-linux-gnu: its ld.so is libc6-arm64-cross's build of glibc,
# while the libraries it then loads come from /lib/aarch64-linux-gnu, libc6:arm64's libc.so.6.
# The loader and libc share private data (_rtld_global, whose layout is not an ABI), and two
# Debian revisions of glibc 2.36 lay it out differently: the first pthread_create walks a
# stack-cache list that is not one and never returns (a busy loop with no system calls, so
# every program with threads stalled at start: kvd stage before "listening", kvctl generate
# with -t 2, OpenBLAS's start-up).
SYSROOT=/
# OpenBLAS starts its own worker threads when loaded; the kernels use our pool, not those,
# and under qemu-user each idle thread costs start-up time on two cores.
export OPENBLAS_NUM_THREADS=1

# Tools and libraries: install when missing, else say what is missing.
if ! command -v aarch64-linux-gnu-gcc >/dev/null || ! command -v qemu-aarch64 >/dev/null ||
    ! scripts/setup-arm64.sh > "$T/setup.log" 2>&1; then
    scripts/setup-arm64.sh > "$T/setup.log" 2>&1 ||
        die "cannot set up the arm64 build (needs gcc-aarch64-linux-gnu, qemu-user and the :arm64 -dev packages): $(tail -n 5 "$T/setup.log")"
fi
QEMU=$(command -v qemu-aarch64 || command -v qemu-aarch64-static) || die "no qemu-aarch64 (Debian qemu-user)"
[ -e /lib/ld-linux-aarch64.so.1 ] ||
    die "no /lib/ld-linux-aarch64.so.1 (libc6:arm64; scripts/setup-arm64.sh installs it)"
need_exec "$KVCTL" "$KVD"
# The subset builds only the programs it runs (the daemon, the CLI and the kernel test), not
# every test program: a fraction of the build time on two cores.
if [ "$FULL" = 1 ]; then
    targets=(tests)
else
    targets=(build/arm64/kvd build/arm64/kvctl build/arm64/tests/test-kern-cpu)
fi
make -C "$ROOT" -j2 --no-print-directory ARCH=aarch64 "${targets[@]}" > "$T/build.log" 2>&1 ||
    die "make ARCH=aarch64 ${targets[*]}: $(grep -m 5 -E 'error|cannot' "$T/build.log")"
file -L "$ARM/kvd" | grep -q "ARM aarch64" || die "$ARM/kvd is not an aarch64 binary: $(file -L "$ARM/kvd")"

# run_arm [qemu options --] BINARY ARGS...: an arm64 binary under qemu-user.
run_arm() {
    local q=()
    if [ "${1:-}" = -cpu ]; then q=(-cpu "$2"); shift 2; fi
    "$QEMU" "${q[@]}" -L "$SYSROOT" "$@"
}

# ---- kernels: NEON against the reference, both levels ----
if [ "$FULL" = 1 ]; then
    cases=""                      # every case
else
    cases="dots_exact_inputs"    # every level, type and column count; the matmuls in FULL
fi
# shellcheck disable=SC2086
run_arm "$ARM/tests/test-kern-cpu" $cases > "$T/kern.log" 2>&1 ||
    fail "test-kern-cpu under qemu: $(grep -a '^FAIL' "$T/kern.log" | head -n 5; tail -n 3 "$T/kern.log")"
grep -q "cpu level: neon-dotprod" "$T/kern.log" ||
    fail "qemu's default CPU has dotprod, yet the level is not neon-dotprod: $(tail -n 2 "$T/kern.log")"
grep -q "level neon.* not available" "$T/kern.log" &&
    fail "a NEON level was not tested: $(grep 'not available' "$T/kern.log")"
echo "ok kernels (neon, neon-dotprod) under qemu"
# A CPU without dotprod (Cortex-A53) runs the baseline NEON level; KV_KERN_SIMD caps it.
lvl=$(run_arm -cpu cortex-a53 "$ARM/tests/test-kern-cpu" dots_exact_inputs 2>&1 | sed -n 's/^cpu level: //p')
[ "$lvl" = neon ] || fail "Cortex-A53 (no dotprod): level '$lvl', expected neon"
lvl=$(KV_KERN_SIMD=neon run_arm "$ARM/tests/test-kern-cpu" softmax_simd 2>&1 | sed -n 's/^cpu level: //p')
[ "$lvl" = neon ] || fail "KV_KERN_SIMD=neon: level '$lvl'"
lvl=$(KV_KERN_SIMD=scalar run_arm "$ARM/tests/test-kern-cpu" softmax_simd 2>&1 | sed -n 's/^cpu level: //p')
[ "$lvl" = scalar ] || fail "KV_KERN_SIMD=scalar: level '$lvl'"
echo "ok level detection"

field() {   # field JSON KEY: a string field, or a list field as "1,2,3"
    python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))[sys.argv[2]]
sys.stdout.write(",".join(map(str, v)) if isinstance(v, list) else str(v))' "$1" "$2"
}

if [ "$FULL" = 1 ]; then
    # The kernel and model tests under qemu, one case per run (the harness takes one), all but
    # the timing cases (qemu's timings mean nothing) and the opencl ones (no arm64 OpenCL
    # driver under qemu-user).
    for prog in test-kern-ref test-model-ref test-model-batch test-model-noalloc test-gguf-parse; do
        [ -x "$ARM/tests/$prog" ] || { fail "$ARM/tests/$prog is missing"; continue; }
        list=$(run_arm "$ARM/tests/$prog" --list 2>/dev/null | grep -E '^[a-z0-9_]+$') ||
            { fail "$prog --list under qemu"; continue; }
        n=0
        for tcase in $list; do
            case "$tcase" in *timing* | opencl*) continue ;; esac
            log="$T/$prog-$tcase.log"
            run_arm "$ARM/tests/$prog" "$tcase" > "$log" 2>&1 ||
                fail "$prog $tcase under qemu: $(grep -a '^FAIL' "$log" | head -n 5; tail -n 3 "$log")"
            n=$((n + 1))
        done
        echo "ok $prog under qemu ($n cases)"
    done

    # ---- every reference case, one process, arm64 (2 threads) against the x86 build ----
    # Exact for the cases whose greedy tokens are held exact on x86 too (test-model-ref's
    # greedy_generation, and the ring's TinyStories case). In a quantised case two builds may
    # part where two tokens are a near-tie (the order of float sums differs between SIMD
    # levels: on x86 alone, scalar and AVX2 part on TinyStories-656K-Q8_0.lily at token 5):
    # there the tokens must be a near-tie in the x86 logits of the common prefix, and the
    # arm64 logits of that prefix must agree with them (tests/lib/near_tie.py).
    exact=" stories260K.once stories260K.lily synth-llama-spm512-f32.once synth-llama-spm512-f16.once TinyStories-656K-Q8_0.once "
    cases=0
    for J in "$DATA"/ref/*.json; do
        c=$(basename "$J" .json)
        M=$(need_model "$(field "$J" model)") || continue
        p=$(field "$J" prompt_tokens) n=$(field "$J" n_gen)
        x86=$("$KVCTL" generate -m "$M" --tokens "$p" -n "$n" --temp 0 --ids --ignore-eos 2>/dev/null) ||
            { fail "$c: x86 generate"; continue; }
        arm=$(run_arm "$ARM/kvctl" generate -m "$M" --tokens "$p" -n "$n" --temp 0 --ids --ignore-eos -t 2 2>"$T/err") ||
            { fail "$c: arm64 generate: $(tail -n 3 "$T/err")"; continue; }
        cases=$((cases + 1))
        [ "$arm" = "$x86" ] && continue
        case "$exact" in *" $c "*) fail "$c: arm64 tokens '$arm' differ from the x86 build's '$x86'"; continue ;; esac
        read -r -a a <<< "$x86"
        read -r -a b <<< "$arm"
        k=0 prefix=$p
        while [ $k -lt ${#a[@]} ] && [ "${a[$k]}" = "${b[$k]}" ]; do prefix="$prefix,${a[$k]}"; k=$((k + 1)); done
        "$KVCTL" logits -m "$M" --tokens "$prefix" -o "$T/x86.f32" >/dev/null 2>&1 &&
            run_arm "$ARM/kvctl" logits -m "$M" --tokens "$prefix" -o "$T/arm.f32" -t 2 >/dev/null 2>&1 ||
            { fail "$c: kvctl logits"; continue; }
        python3 "$ROOT/tests/lib/near_tie.py" "$T/x86.f32" "$T/arm.f32" "$(echo "$prefix" | tr ',' ' ' | wc -w)" \
            "${a[$k]}" "${b[$k]}" arm64/x86 ||
            fail "$c: arm64 tokens '$arm' part from the x86 build's '$x86' beyond a near-tie"
        echo "ok $c: arm64 = x86 up to a near-tie at token $k"
    done
    [ "$cases" -gt 0 ] || fail "no reference case ran"
    echo "ok $cases reference cases: arm64 greedy tokens = the x86 build's (one process, 2 threads)"
fi

# ---- rings ----
# The kvd that `kvctl ring up` starts: ranks listed in ARM_RANKS run the arm64 kvd under
# qemu, the others the x86 one.
cat > "$T/kvd-mixed" <<EOF
#!/bin/bash
rank=
prev=
for a in "\$@"; do [ "\$prev" = --rank ] && rank=\$a; prev=\$a; done
case " \$ARM_RANKS " in
    *" \$rank "*) exec "$QEMU" -L "$SYSROOT" "$ARM/kvd" "\$@" ;;
esac
exec "$KVD" "\$@"
EOF
chmod +x "$T/kvd-mixed"
# under_qemu DIR RANK: true when that rank's kvd is the arm64 one under qemu (its executable is
# qemu and its command line names the arm64 kvd), not the x86 build
under_qemu() {
    local pid
    pid=$(rank_pid "$1" "$2") || return 1
    case "$(readlink "/proc/$pid/exe")" in *qemu-aarch64*) ;; *) return 1 ;; esac
    tr '\0' '\n' < "/proc/$pid/cmdline" | grep -qx "$ARM/kvd"
}

models="stories260K"
[ "$FULL" = 1 ] && models="stories260K TinyStories-656K-Q8_0"
for m in $models; do
    M=$(need_model $m.gguf) || exit 1
    J=$DATA/ref/$m.once.json
    need_data "$J"
    want=$(field "$J" generated_tokens | tr ',' ' ')
    n=$(field "$J" n_gen)
    x86=$("$KVCTL" generate -m "$M" --tokens "$(field "$J" prompt_tokens)" -n "$n" --temp 0 --ids --ignore-eos 2>/dev/null) ||
        fail "$m: x86 generate"
    [ "$x86" = "$want" ] || fail "$m: the x86 build disagrees with the reference: '$x86' vs '$want'"
    d="$TMP/arm-$m"
    t0=$SECONDS
    ARM_RANKS="0 1" KVD_BIN="$T/kvd-mixed" ring_up "$d" --model "$M" --stages 2 -t 2
    wait_linked "$d" 2 120 || fail "$m: the arm64 stages did not link"
    under_qemu "$d" 0 && under_qemu "$d" 1 || fail "$m: the stages are not both the arm64 kvd under qemu"
    out=$("$KVCTL" generate --ring "$d" --ids --tokens "$(field "$J" prompt_tokens)" -n "$n" --temp 0 --ignore-eos 2>"$T/err") ||
        fail "$m: generate on the arm64 ring: $(cat "$T/err")"
    [ "$out" = "$x86" ] || fail "$m: arm64 ring tokens '$out' differ from the x86 build's '$x86'"
    ring_down "$d"
    echo "ok $m: 2 arm64 stages under qemu = x86 = reference ($n tokens, $((SECONDS - t0)) s)"
done

# Mixed: rank 0 x86, rank 1 arm64; text from a text prompt equals one process's.
M=$(need_model stories260K.gguf) || exit 1
J=$DATA/ref/stories260K.lily.json
need_data "$J"
prompt=$(field "$J" prompt)
one=$("$KVCTL" generate -m "$M" -p "$prompt" -n 24 --temp 0 --ignore-eos 2>/dev/null) || fail "one-process generate"
[ "$one" = "$(field "$J" generated_text)" ] || fail "one process disagrees with the reference text"
d="$TMP/mixed"
t0=$SECONDS
ARM_RANKS="1" KVD_BIN="$T/kvd-mixed" ring_up "$d" --model "$M" --stages 2 -t 2
wait_linked "$d" 2 120 || fail "the mixed ring did not link"
under_qemu "$d" 1 || fail "rank 1 is not the arm64 kvd under qemu"
under_qemu "$d" 0 && fail "rank 0 is not the x86 kvd"
out=$("$KVCTL" generate --ring "$d" -p "$prompt" -n 24 --temp 0 --ignore-eos 2>"$T/err") ||
    fail "generate on the mixed ring: $(cat "$T/err")"
[ "$out" = "$one" ] || fail "mixed ring text '$out' differs from one process's '$one'"
ring_down "$d"
echo "ok mixed ring (x86 rank 0, arm64 rank 1) = one process ($((SECONDS - t0)) s)"
finish

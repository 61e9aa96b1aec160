#!/bin/bash
# The layout's rules (scripts/check-layout.py): no include cycle, no two source files that use
# each other (directly or through a cycle), modules that depend only downwards. Then the checker
# itself on a tree of two files: a header whose static inline function calls into a source that
# includes it (the call nm never shows) must be reported as a cycle.
. "$(dirname "$0")/lib.sh"
python3 scripts/check-layout.py "$B" || fail "layout violations in $B"

mkdir -p "$T/tree/scripts" "$T/tree/kernels/ref" "$T/tree/build/obj/kernels/ref"
cp scripts/check-layout.py "$T/tree/scripts/"
cat >"$T/tree/kernels/internal.h" <<'H'
#include <stdint.h>
float kern_f16_to_f32(uint16_t h);
static inline float kern__h2f(uint16_t h) { return kern_f16_to_f32(h); }
H
cat >"$T/tree/kernels/ref/ref_quant.c" <<'C'
#include "kernels/internal.h"
float kern_f16_to_f32(uint16_t h) { return (float)h; }
C
${CC:-cc} -c -I"$T/tree" -o "$T/tree/build/obj/kernels/ref/ref_quant.o" "$T/tree/kernels/ref/ref_quant.c" ||
    die "cannot compile the checker's test tree"
out=$(python3 "$T/tree/scripts/check-layout.py" "$T/tree/build") && fail "header-call cycle not reported: $out"
grep -q "^file cycle among kernels/internal.h, kernels/ref/ref_quant.c" <<<"$out" ||
    fail "header-call cycle: got: $out"
grep -q "kernels/internal.h uses kern_f16_to_f32 from kernels/ref/ref_quant.c" <<<"$out" ||
    fail "header-call cycle names no call: $out"
finish

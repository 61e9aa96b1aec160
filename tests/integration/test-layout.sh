#!/bin/bash
# The layout's rules (scripts/check-layout.py): no include cycle, no two source files that use
# each other (directly or through a cycle), modules that depend only downwards. Then the checker
# itself on two small trees, on the calls nm never shows (a header's static inline function that
# no object calls): one that calls into a source including its header must be reported as a
# cycle, one that calls into a module its own module may not use as a layering violation (of the
# header and of every file that includes it).
. "$(dirname "$0")/../lib/lib.sh"
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

L="$T/layer"
mkdir -p "$L/scripts" "$L/util" "$L/model" "$L/build/obj/util" "$L/build/obj/model"
cp scripts/check-layout.py "$L/scripts/"
cat >"$L/util/util.h" <<'H'
float model_scale(float x);
static inline float util_half(float x) { return model_scale(x) / 2; }
H
cat >"$L/util/num.c" <<'C'
#include "util/util.h"
float util_num(float x) { return x; }
C
cat >"$L/model/scale.c" <<'C'
float model_scale(float x) { return 3 * x; }
C
for f in util/num model/scale; do
    ${CC:-cc} -c -I"$L" -o "$L/build/obj/$f.o" "$L/$f.c" || die "cannot compile the checker's test tree"
done
out=$(python3 "$L/scripts/check-layout.py" "$L/build") && fail "upward inline call not reported: $out"
grep -q "^layering: util/util.h uses model/scale.c (model_scale): module util may use only nothing else" \
    <<<"$out" || fail "upward inline call: the header is not named: $out"
grep -q "^layering: util/num.c uses model/scale.c (model_scale (called by an inline function of util/util.h))" \
    <<<"$out" || fail "upward inline call: the file including the header is not named: $out"
grep -q "^check-layout: 3 files (2 sources), 2 violations" <<<"$out" ||
    fail "upward inline call: other violations reported: $out"
finish

#!/bin/bash
# test-model-kvctl: kvctl generate / logits / bench end to end on the shared test models.
# Greedy generation from a text prompt prints exactly llama.cpp's generated text (stories260K,
# both cases) and, with --ids, its token ids; a seed reproduces a sampled run; logits from a
# text prompt equal the reference's first rows within tolerance; --stop ends the text at a stop
# string and --dump-logits writes the last position's logits, as through a ring; bench prints
# pp/tg figures; --device ref (the scalar oracle) gives logits as close to the reference and
# the same greedy text, an unknown device is refused; bad input is refused with a usage status.
. "$(dirname "$0")/../lib/lib.sh"

need_exec "$KVCTL"
M=$DATA/models/stories260K.gguf
need_data "$M"

field() {   # field JSON KEY: a string field, or a list field as "1,2,3"
    python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))[sys.argv[2]]
sys.stdout.write(",".join(map(str, v)) if isinstance(v, list) else v)' "$1" "$2"
}

for c in once lily; do
    J=$DATA/ref/stories260K.$c.json
    prompt=$(field "$J" prompt)
    want=$(field "$J" generated_text)
    got=$("$KVCTL" generate -m "$M" -p "$prompt" -n 24 --temp 0 --ignore-eos 2>"$T/err")
    [ "$got" = "$want" ] || fail "$c: text '$got' != reference '$want' ($(cat "$T/err"))"
    grep -q "generation: 24 tokens" "$T/err" || fail "$c: no speed line on stderr: $(cat "$T/err")"
    want_ids=$(field "$J" generated_tokens | tr ',' ' ')
    got_ids=$("$KVCTL" generate -m "$M" --tokens "$(field "$J" prompt_tokens)" -n 24 --temp 0 \
              --ids --ignore-eos 2>/dev/null)
    [ "$got_ids" = "$want_ids" ] || fail "$c: ids '$got_ids' != '$want_ids'"
done

# Sampling: the same seed reproduces the run, another seed (almost surely) does not.
a=$("$KVCTL" generate -m "$M" -p "Lily" -n 40 --temp 1.2 --top-k 0 --top-p 1 --min-p 0 --seed 11 --ids 2>/dev/null)
b=$("$KVCTL" generate -m "$M" -p "Lily" -n 40 --temp 1.2 --top-k 0 --top-p 1 --min-p 0 --seed 11 --ids 2>/dev/null)
c=$("$KVCTL" generate -m "$M" -p "Lily" -n 40 --temp 1.2 --top-k 0 --top-p 1 --min-p 0 --seed 12 --ids 2>/dev/null)
[ -n "$a" ] && [ "$a" = "$b" ] || fail "seed 11 twice: '$a' vs '$b'"
[ "$a" != "$c" ] || fail "seeds 11 and 12 gave the same 40 tokens"
# "--seed -1" (llama.cpp's habit) is accepted and wraps as it always has: 2^64 - 1.
d=$("$KVCTL" generate -m "$M" -p "Lily" -n 20 --temp 1.2 --seed -1 --ids 2>/dev/null) || fail "--seed -1 refused"
e=$("$KVCTL" generate -m "$M" -p "Lily" -n 20 --temp 1.2 --seed 18446744073709551615 --ids 2>/dev/null)
[ -n "$d" ] && [ "$d" = "$e" ] || fail "--seed -1 is not seed 2^64-1: '$d' vs '$e'"

# --stop, as through a ring: the text ends with the token that completes the stop string (one
# may span tokens) and is a prefix of the full run; with --ids the ids are a prefix too;
# limits refused.
full=$("$KVCTL" generate -m "$M" -p "Once upon a time" -n 40 --temp 0 2>/dev/null)
full_ids=$("$KVCTL" generate -m "$M" -p "Once upon a time" -n 40 --temp 0 --ids 2>/dev/null)
for s in park "k." "ily. S"; do
    got=$("$KVCTL" generate -m "$M" -p "Once upon a time" -n 40 --temp 0 --stop zzz --stop "$s" 2>"$T/err") ||
        fail "--stop '$s': $(cat "$T/err")"
    case "$got" in *"$s"*) ;; *) fail "--stop '$s': '$got' does not hold it" ;; esac
    case "$full" in "$got"*) ;; *) fail "--stop '$s': '$got' is not a prefix of '$full'" ;; esac
    [ "${#got}" -lt "${#full}" ] || fail "--stop '$s': did not stop early"
    ids=$("$KVCTL" generate -m "$M" -p "Once upon a time" -n 40 --temp 0 --ids --stop "$s" 2>/dev/null)
    n=$(echo "$ids" | wc -w)
    [ -n "$ids" ] && [ "$(echo "$full_ids" | cut -d' ' -f1-"$n")" = "$ids" ] && [ "$n" -lt 40 ] ||
        fail "--ids --stop '$s': '$ids' is not a short prefix of '$full_ids'"
    grep -q "generation: $n tokens" "$T/err" || fail "--stop '$s': $n tokens, stderr: $(cat "$T/err")"
done
"$KVCTL" generate -m "$M" -p "Once" -n 4 --stop "$(printf 'x%.0s' $(seq 256))" >/dev/null 2>&1
[ $? = 2 ] || fail "--stop longer than 255 bytes accepted"
"$KVCTL" generate -m "$M" -p "Once" -n 4 $(for i in $(seq 17); do echo --stop s$i; done) >/dev/null 2>&1
[ $? = 2 ] || fail "17 --stop strings accepted"

# --dump-logits: the raw f32 logits of the last sampled position; greedy, their argmax is the
# last id printed, and they equal `kvctl logits` of the same tokens' last row.
ids=$("$KVCTL" generate -m "$M" --tokens 1,403,407,261 -n 6 --temp 0 --ignore-eos --ids \
      --dump-logits "$T/d.f32" 2>"$T/err") || fail "--dump-logits: $(cat "$T/err")"
[ "$(stat -c %s "$T/d.f32" 2>/dev/null)" = $((512 * 4)) ] || fail "--dump-logits: size"
fed="1,403,407,261,$(echo "$ids" | cut -d' ' -f1-5 | tr ' ' ',')"
"$KVCTL" logits -m "$M" --tokens "$fed" -o "$T/all.f32" 2>/dev/null || fail "logits of $fed"
python3 - "$T/d.f32" "$T/all.f32" "${ids##* }" <<'EOF' || fail "--dump-logits: not the last position's logits"
import struct, sys
d = struct.unpack('<512f', open(sys.argv[1], 'rb').read())
a = open(sys.argv[2], 'rb').read()
r = struct.unpack('<512f', a[-2048:])
assert max(range(512), key=lambda i: d[i]) == int(sys.argv[3]), "argmax"
e = sum((p - q) ** 2 for p, q in zip(d, r)) / sum(q * q for q in r)
assert e < 1e-6, e
EOF
"$KVCTL" generate -m "$M" -p "Once" -n 0 --dump-logits "$T/none.f32" >/dev/null 2>"$T/err"
[ $? = 1 ] && grep -q "no logits" "$T/err" || fail "-n 0 --dump-logits: $(cat "$T/err")"

# Logits from a text prompt: the reference's prompt rows (same tokens, same positions).
J=$DATA/ref/stories260K.once.json
# near_reference FILE: every row of FILE (raw f32) within NMSE 2.2e-5 of the reference's.
near_reference() {
    python3 - "$1" "$DATA/ref/stories260K.once.logits.f32" 512 <<'EOF'
import struct, sys
a = open(sys.argv[1], 'rb').read(); b = open(sys.argv[2], 'rb').read(); V = int(sys.argv[3])
n = len(a) // 4
assert n > 0 and n % V == 0, n
x = struct.unpack('<%df' % n, a); y = struct.unpack('<%df' % n, b[:len(a)])
for r in range(n // V):
    xs, ys = x[r*V:(r+1)*V], y[r*V:(r+1)*V]
    e = sum((p - q) ** 2 for p, q in zip(xs, ys)) / sum(q * q for q in ys)
    assert e < 2.2e-5, (r, e)
EOF
}
"$KVCTL" logits -m "$M" -p "$(field "$J" prompt)" -o "$T/l.f32" 2>"$T/err" || fail "logits: $(cat "$T/err")"
near_reference "$T/l.f32" || fail "logits differ from the reference"
# --tokens, fed in chunks of 2 rows: one row of n_vocab floats per token.
"$KVCTL" logits -m "$M" --tokens 1,403,407,261,378,432 --batch 2 -o "$T/a.f32" 2>/dev/null
[ -s "$T/a.f32" ] && [ "$(stat -c %s "$T/a.f32")" = $((6 * 512 * 4)) ] || fail "logits size"

# --device ref: the scalar oracle's logits of the same prompt are as close to the reference;
# greedy generation on it prints the same text; an unknown device exits 1 naming the choices.
"$KVCTL" logits -m "$M" -p "$(field "$J" prompt)" --device ref -o "$T/lr.f32" 2>"$T/err" ||
    fail "logits --device ref: $(cat "$T/err")"
near_reference "$T/lr.f32" || fail "logits --device ref differ from the reference"
g_cpu=$("$KVCTL" generate -m "$M" -p "Once upon" -n 12 --temp 0 2>/dev/null)
g_ref=$("$KVCTL" generate -m "$M" -p "Once upon" -n 12 --temp 0 --device ref 2>/dev/null)
[ -n "$g_cpu" ] && [ "$g_cpu" = "$g_ref" ] || fail "generate --device ref: '$g_ref' vs '$g_cpu'"
"$KVCTL" logits -m "$M" --tokens 1,2 --device tpu -o "$T/x.f32" 2>"$T/err"
[ $? = 1 ] && grep -q "device tpu: unknown (there are cpu, ref, opencl)" "$T/err" ||
    fail "logits --device tpu: $(cat "$T/err")"

# Bench prints both figures.
out=$("$KVCTL" bench -m "$M" -p 16 -n 8 -t 1 2>&1)
echo "$out" | grep -Eq '^pp16 [0-9.]+ tok/s' || fail "bench pp: $out"
echo "$out" | grep -Eq '^tg8 [0-9.]+ tok/s' || fail "bench tg: $out"
echo "$out" | grep -Eq '^weight_bytes_per_token [0-9]+' || fail "bench bytes: $out"
# --sessions: K sessions decoding together, one line per K with its ratio to one session.
out=$("$KVCTL" bench -m "$M" -p 4 -n 4 -t 1 --sessions 1,3 2>&1)
echo "$out" | grep -Eq '^tg4_sessions 1 [0-9.]+ tok/s aggregate = 1.00x one session' || fail "bench --sessions 1: $out"
echo "$out" | grep -Eq '^tg4_sessions 3 [0-9.]+ tok/s aggregate = [0-9.]+x one session; a step of 3 rows costs [0-9.]+ one-row steps' ||
    fail "bench --sessions 3: $out"
"$KVCTL" bench -m "$M" -p 4 -n 4 --sessions 0 >/dev/null 2>&1; [ $? = 2 ] || fail "bench --sessions 0 accepted"

# Refusals: usage errors exit 2, a bad model file exits 1 with a message.
"$KVCTL" generate -m "$M" -n 4 >/dev/null 2>&1; [ $? = 2 ] || fail "generate without a prompt"
"$KVCTL" generate -m "$M" --tokens 1,x -n 4 >/dev/null 2>&1; [ $? = 2 ] || fail "bad --tokens"
"$KVCTL" generate -m "$DATA/tokenizer/ggml-vocab-bert-bge.gguf" -p hi -n 1 2>"$T/err" >/dev/null
[ $? = 1 ] && grep -q bert "$T/err" || fail "unsupported arch: $(cat "$T/err")"
"$KVCTL" generate -m "$M" --tokens 1,99999 -n 1 2>"$T/err" >/dev/null
[ $? = 1 ] && grep -q vocabulary "$T/err" || fail "token out of range: $(cat "$T/err")"

finish

#!/bin/bash
# test-kvctl-cli: what a user sees from kvctl on bad input and in its help. Errors name the
# command and the file once (a missing or truncated model, a missing text file, a ring
# directory that is not there) and exit non-zero; synth names the option and value it
# refuses; generate prints its text before its statistics when both go to one pipe; ring
# down with nothing running succeeds; `generate --help` points at --ring; every option a
# command's --help names is documented in docs/kvctl.md.
. "$(dirname "$0")/../lib/lib.sh"

need_exec "$KVCTL"
M=$DATA/models/stories260K.gguf
need_data "$M"
head -c 5000 "$M" > "$T/trunc.gguf"

# expect_err WHAT WANT_SUBSTRING CMD...: non-zero exit, stderr holds WANT once per line and
# does not repeat the file name ("x: x: ...").
expect_err() {
    local what=$1 want=$2
    shift 2
    if "$@" > "$T/out" 2> "$T/err"; then
        fail "$what: exit 0 (stderr: $(cat "$T/err"))"
        return
    fi
    grep -qF -- "$want" "$T/err" || fail "$what: stderr lacks '$want': $(cat "$T/err")"
    if grep -qE '([^ :]+): \1:' "$T/err"; then fail "$what: the file is named twice: $(cat "$T/err")"; fi
}

expect_err "generate, missing model" "kvctl generate: $T/none.gguf: No such file" \
    "$KVCTL" generate -m "$T/none.gguf" -p hi -n 2
expect_err "generate, truncated model" "kvctl generate: $T/trunc.gguf: " \
    "$KVCTL" generate -m "$T/trunc.gguf" -p hi -n 2
grep -q "truncated" "$T/err" || fail "generate, truncated model: does not say truncated: $(cat "$T/err")"
expect_err "bench, missing model" "kvctl bench: $T/none.gguf: No such file" "$KVCTL" bench -m "$T/none.gguf"
expect_err "inspect, truncated" "kvctl inspect: $T/trunc.gguf: " "$KVCTL" inspect "$T/trunc.gguf"
grep -q "needs .* bytes at offset .* but the file has 5000" "$T/err" ||
    fail "inspect, truncated: no field/offset/size in '$(cat "$T/err")'"
expect_err "tokenize, truncated model" "kvctl tokenize: $T/trunc.gguf: " \
    "$KVCTL" tokenize -m "$T/trunc.gguf" hi
expect_err "tokenize, missing text file" "kvctl tokenize: $T/none.txt: No such file" \
    "$KVCTL" tokenize -m "$M" -f "$T/none.txt"
expect_err "detokenize, missing model" "kvctl detokenize: $T/none.gguf: No such file" \
    "$KVCTL" detokenize -m "$T/none.gguf" 1 2
expect_err "ring up, missing model" "kvctl ring up: $T/none.gguf: No such file" \
    "$KVCTL" ring up --model "$T/none.gguf" --stages 2 --dir "$T/ring"
expect_err "status, no ring" "$T/nothing: No such file" "$KVCTL" status --ring "$T/nothing"
expect_err "generate --ring, no ring" "$T/nothing" "$KVCTL" generate --ring "$T/nothing" -p hi -n 2

expect_err "generate, id past the vocabulary" "tokens[1] = 512 is not a token id in [0, 512)" \
    "$KVCTL" generate -m "$M" --tokens 1,512 -n 2
expect_err "logits, id past the vocabulary" "tokens[2] = 9999 is not a token id in [0, 512)" \
    "$KVCTL" logits -m "$M" --tokens 1,2,9999 -o "$T/l.f32"
expect_err "generate, prompt longer than --ctx" "the prompt's 5 tokens do not fit the context of 4 (--ctx): at most 3" \
    "$KVCTL" generate -m "$M" --tokens 1,2,3,4,5 -n 2 --ctx 4

cp "$M" "$T/model.gguf"
ln -s model.gguf "$T/link.gguf"
expect_err "slice onto its own model" "-o $T/link.gguf is the model itself" \
    "$KVCTL" slice "$T/model.gguf" --layers 0:2 -o "$T/link.gguf"
cmp -s "$M" "$T/model.gguf" || fail "slice -o the model itself changed the model"

expect_err "ring up without --stages" "kvctl ring up: --stages N (or --split A:B,B:C,...) is required" \
    "$KVCTL" ring up --model "$M" --dir "$T/ring"
expect_err "ring up without --model" "kvctl ring up: --model FILE is required" \
    "$KVCTL" ring up --stages 2 --dir "$T/ring"
expect_err "ring up, stray argument" "kvctl ring up: unexpected argument 'extra'" \
    "$KVCTL" ring up --model "$M" --stages 2 --dir "$T/ring" extra
[ -e "$T/ring/ring.json" ] && fail "a refused ring up wrote a manifest"

expect_err "generate without a model" "kvctl generate: -m FILE (or --ring DIR) is required" \
    "$KVCTL" generate -p hi -n 2
expect_err "generate without a prompt" "kvctl generate: -p TEXT or --tokens 1,2,3 is required" \
    "$KVCTL" generate -m "$M" -n 2
expect_err "generate, unquoted prompt" "kvctl generate: unexpected argument 'upon'" \
    "$KVCTL" generate -m "$M" -p Once upon -n 2

expect_err "synth --layers 0" "--layers 0" "$KVCTL" synth --layers 0 -o "$T/s.gguf"
expect_err "synth heads/kv-heads" "--heads 8 is not a multiple of --kv-heads 3" \
    "$KVCTL" synth --heads 8 --kv-heads 3 -o "$T/s.gguf"
[ -e "$T/s.gguf" ] && fail "synth wrote a file for refused options"

# ring down with nothing running: nothing to stop, not an error.
"$KVCTL" ring down --dir "$T/nothing" > "$T/out" 2>&1 || fail "ring down, nothing running: $(cat "$T/out")"
grep -q "0 stages stopped" "$T/out" || fail "ring down, nothing running: '$(cat "$T/out")'"
for spelling in "--ring $T/nothing" "--dir=$T/nothing" "--ring=$T/nothing"; do
    # shellcheck disable=SC2086
    "$KVCTL" ring down $spelling > "$T/out" 2>&1 && grep -q "0 stages stopped" "$T/out" ||
        fail "ring down $spelling: '$(cat "$T/out")'"
done
"$KVCTL" status --dir "$T/nothing" > "$T/out" 2>&1
[ $? -eq 1 ] && grep -q "nothing" "$T/out" || fail "status --dir: '$(cat "$T/out")'"

# Text first, statistics after, also when stdout and stderr share one pipe.
out=$("$KVCTL" generate -m "$M" --tokens 1,400,300 -n 4 --temp 0 --ids 2>&1)
first=$(printf '%s\n' "$out" | head -1)
case "$first" in
    *prompt:*) fail "generate: statistics inside the text line: '$first'" ;;
esac
[ "$(echo "$first" | wc -w)" = 4 ] || fail "generate: first line '$first' is not the 4 ids"
printf '%s\n' "$out" | sed -n 2p | grep -q "^prompt: 3 tokens" || fail "generate: no statistics line after the text: '$out'"

"$KVCTL" generate --help | grep -q -- "--ring" || fail "generate --help does not mention --ring"
"$KVCTL" generate --ring x --help | grep -q "unix:SOCKET" || fail "generate --ring --help lacks unix:SOCKET"

# Without --seed a sampled run draws a random seed and says it; that seed repeats the run.
# Two runs may by chance sample the same text, three runs of 32 tokens each alike would not;
# the seeds they print must all differ.
for i in 1 2 3; do
    "$KVCTL" generate -m "$M" -p "Once upon a time" -n 32 --temp 1 > "$T/s$i.out" 2> "$T/s$i.err" ||
        fail "sampled run $i: $(cat "$T/s$i.err")"
done
seed1=$(sed -n 's/^kvctl generate: seed \([0-9]*\) .*/\1/p' "$T/s1.err")
[ -n "$seed1" ] || fail "a sampled run without --seed does not print its seed: $(head -3 "$T/s1.err")"
seeds=$(sed -n 's/^kvctl generate: seed \([0-9]*\) .*/\1/p' "$T"/s[123].err | sort -u | wc -l)
[ "$seeds" = 3 ] || fail "three unseeded runs printed $seeds different seeds: $(grep -h seed "$T"/s[123].err)"
cmp -s "$T/s1.out" "$T/s2.out" && cmp -s "$T/s1.out" "$T/s3.out" &&
    fail "three unseeded sampled runs gave the same text: '$(head -c 200 "$T/s1.out")'"
"$KVCTL" generate -m "$M" -p "Once upon a time" -n 32 --temp 1 --seed "$seed1" > "$T/s4.out" 2> "$T/s4.err"
cmp -s "$T/s1.out" "$T/s4.out" || fail "--seed $seed1 does not repeat the run that printed it"
grep -q "seed" "$T/s4.err" && fail "a seeded run still prints a seed line"
"$KVCTL" generate -m "$M" -p x -n 2 --temp 0 2> "$T/g.err" > /dev/null
grep -q "seed" "$T/g.err" && fail "a greedy run prints a seed"
# Sampling parameters out of range are refused, naming the option and the range.
for bad in "--temp -1" "--top-p 5" "--min-p 1.5" "--repeat-penalty 0" "--freq-penalty 3" "--presence-penalty -9"; do
    # shellcheck disable=SC2086
    "$KVCTL" generate -m "$M" -p x -n 1 $bad > /dev/null 2> "$T/bad.err"
    rc=$?
    [ $rc -eq 2 ] && grep -q -- "${bad%% *}" "$T/bad.err" || fail "generate $bad: rc $rc, '$(cat "$T/bad.err")'"
done

# --version on both programs; kvd takes --opt=value as kvctl does.
"$KVCTL" --version | grep -Eq '^kvctl [0-9]+\.[0-9]+\.[0-9]+' || fail "kvctl --version: '$("$KVCTL" --version 2>&1)'"
"$B/kvd" --version | grep -Eq '^kvd [0-9]+\.[0-9]+\.[0-9]+' || fail "kvd --version: '$("$B/kvd" --version 2>&1)'"
[ "$("$KVCTL" --version | cut -d' ' -f2)" = "$("$B/kvd" --version | cut -d' ' -f2)" ] || fail "kvd and kvctl versions differ"
mkdir -p "$T/keydir"
k1=$("$B/kvd" stage --state-dir="$T/keydir" --print-key 2>&1)
k2=$("$B/kvd" stage --state-dir "$T/keydir" --print-key 2>&1)
[ ${#k1} -eq 64 ] && [ "$k1" = "$k2" ] || fail "kvd stage --state-dir=DIR: '$k1' vs '$k2'"
"$B/kvd" stage --print-key=yes > "$T/pk.err" 2>&1 && fail "kvd stage --print-key=yes accepted"
grep -q "takes no value" "$T/pk.err" || fail "kvd stage --print-key=yes: '$(cat "$T/pk.err")'"

python3 tests/lib/kvctl_doc_check.py "$KVCTL" docs/kvctl.md || fail "docs/kvctl.md misses options (above)"

finish

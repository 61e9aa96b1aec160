#!/bin/bash
# test-model-tokenize: kvctl tokenize / detokenize end to end. The reference prompts tokenise
# to llama.cpp's ids (--ids: one line, space-separated) and decode back; text from a file and
# from standard input is taken byte for byte (no trailing newline added or lost, invalid UTF-8
# kept); --special parses control tokens; the per-token listing shows ids and pieces; bad
# input fails with a usage status (2) or an error status (1) and a message.
. "$(dirname "$0")/../lib/lib.sh"

need_exec "$KVCTL"
SPM=$DATA/models/stories260K.gguf
BPE=$DATA/models/synth-qwen2-bpe1024-q8_0.gguf
QWEN=$DATA/tokenizer/ggml-vocab-qwen2.gguf
need_data "$SPM" "$BPE" "$QWEN"

field() {   # field JSON KEY: a string field, or a list field as "1 2 3"
    python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))[sys.argv[2]]
sys.stdout.write(" ".join(map(str, v)) if isinstance(v, list) else v)' "$1" "$2"
}

# reference prompts: ids as llama.cpp, and back to the prompt
for J in "$DATA/ref/stories260K.once.json" "$DATA/ref/TinyStories-656K-Q8_0.lily.json" \
         "$DATA/ref/synth-qwen2-bpe1024-q8_0.once.json"; do
    M=$DATA/models/$(field "$J" model)
    prompt=$(field "$J" prompt)
    want=$(field "$J" prompt_tokens)
    got=$("$KVCTL" tokenize -m "$M" --ids "$prompt") || fail "$J: tokenize failed"
    [ "$got" = "$want" ] || fail "$(basename "$J"): ids '$got' != '$want'"
    back=$("$KVCTL" detokenize -m "$M" $got) || fail "$J: detokenize failed"
    [ "$back" = "$prompt" ] || fail "$(basename "$J"): detokenize gives '$back'"
    # comma-separated ids in one argument work too
    back=$("$KVCTL" detokenize -m "$M" "$(echo "$got" | tr ' ' ',')")
    [ "$back" = "$prompt" ] || fail "$(basename "$J"): comma ids give '$back'"
done

# the listing: one line per token, id then the quoted piece; BOS shown as its text
"$KVCTL" tokenize -m "$SPM" "Once upon a time" > "$T/list" || fail "listing failed"
[ "$(wc -l < "$T/list")" = 5 ] || fail "listing has $(wc -l < "$T/list") lines, want 5"
grep -q "^ *1 '<s>'$" "$T/list" || fail "listing lacks BOS: $(head -1 "$T/list")"
grep -q "^ *403 ' Once'$" "$T/list" || fail "listing lacks ' Once': $(cat "$T/list")"

# files and stdin, byte for byte: a trailing newline, a tab, invalid UTF-8, no final newline
printf 'line one\n\tline two \xff\xfe end' > "$T/in.txt"
a=$("$KVCTL" tokenize -m "$BPE" --ids -f "$T/in.txt") || fail "-f FILE failed"
b=$("$KVCTL" tokenize -m "$BPE" --ids -f - < "$T/in.txt") || fail "-f - failed"
[ -n "$a" ] && [ "$a" = "$b" ] || fail "file and stdin differ: '$a' vs '$b'"
printf 'x\n' > "$T/nl.txt"; printf 'x' > "$T/nonl.txt"
c=$("$KVCTL" tokenize -m "$BPE" --ids -f "$T/nl.txt"); d=$("$KVCTL" tokenize -m "$BPE" --ids -f "$T/nonl.txt")
[ "$c" != "$d" ] || fail "a trailing newline was lost: '$c' == '$d'"
# an id-for-id round trip of the valid part through detokenize
printf 'Hello, world!\n\tIndented' > "$T/v.txt"
ids=$("$KVCTL" tokenize -m "$BPE" --ids -f "$T/v.txt")
"$KVCTL" detokenize -m "$BPE" $ids > "$T/v.out"
printf 'Hello, world!\n\tIndented\n' | cmp -s - "$T/v.out" || fail "BPE round trip: $(od -c "$T/v.out" | head -3)"

# --clean-spaces: llama.cpp's decoding clean-up (GPT-2 vocabulary), only when asked
G=$DATA/tokenizer/ggml-vocab-gpt-2.gguf
ids=$("$KVCTL" tokenize -m "$G" --ids "Hi , you ?")
[ "$("$KVCTL" detokenize -m "$G" $ids)" = "Hi , you ?" ] || fail "plain decode not the input"
[ "$("$KVCTL" detokenize -m "$G" --clean-spaces $ids)" = "Hi, you?" ] || fail "--clean-spaces"

# --special: control-token text becomes one token only when asked
s=$("$KVCTL" tokenize -m "$QWEN" --ids --special '<|im_start|>user')
p=$("$KVCTL" tokenize -m "$QWEN" --ids '<|im_start|>user')
[ "$s" = "151644 872" ] || fail "--special gives '$s'"
[ "$(echo "$p" | wc -w)" -gt 2 ] || fail "without --special the marker is text: '$p'"
[ "$("$KVCTL" detokenize -m "$QWEN" 151644 872)" = "user" ] || fail "control token shown without --special"
[ "$("$KVCTL" detokenize -m "$QWEN" --special 151644 872)" = "<|im_start|>user" ] || fail "--special decode"

# errors
"$KVCTL" tokenize -m "$SPM" > /dev/null 2>&1; [ $? = 2 ] || fail "no text: want status 2"
"$KVCTL" tokenize --ids "x" > /dev/null 2>&1; [ $? = 2 ] || fail "no model: want status 2"
"$KVCTL" detokenize -m "$SPM" 1 abc > /dev/null 2>"$T/e"; [ $? = 2 ] || fail "bad id list: want status 2"
"$KVCTL" detokenize -m "$SPM" 1 600 > /dev/null 2>"$T/e"; [ $? = 1 ] && grep -q "600 out of range" "$T/e" ||
    fail "id out of range: $(cat "$T/e")"
"$KVCTL" tokenize -m "$T/in.txt" x > /dev/null 2>"$T/e"; [ $? = 1 ] || fail "not a GGUF: want status 1"
"$KVCTL" tokenize -m "$DATA/tokenizer/ggml-vocab-bert-bge.gguf" x > /dev/null 2>"$T/e"
[ $? = 1 ] && grep -q "not supported" "$T/e" || fail "WordPiece refused: $(cat "$T/e")"
"$KVCTL" tokenize -m "$SPM" -f "$T/missing" > /dev/null 2>"$T/e"; [ $? = 1 ] || fail "missing file"

finish

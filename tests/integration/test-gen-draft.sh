#!/bin/bash
# test-weight: 2 (several stages computing at once)
# test-gen-draft.sh — speculative decoding with prompt-lookup drafts in one process (kvctl
# generate --draft lookup; docs/model.md, "Drafting"): on the dense (F32, Q8_0, F16), MoE and
# hybrid test models, greedy and seeded sampling write exactly the text they write without
# drafts (the sampler draws at each verified row as it would one token at a time), with 8 and
# with 15 drafts a pass, with --stop, and as token ids; on a story that repeats itself drafts
# are accepted and a pass yields more than one token; on a hybrid model (recurrent layers,
# whose state cannot rewind) the state is checkpointed before a pass of drafts and restored
# after a rejection, and the text is the same too.
. "$(dirname "$0")/../lib/lib.sh"
need_exec "$KVCTL"
P="Once upon a time"
for f in stories260K.gguf TinyStories-656K-Q8_0.gguf synth-llama-spm512-f16.gguf \
         synth-qwen3moe-bpe1024-q8_0.gguf synth-qwen3moe-bpe1024-q4_k_m.gguf \
         synth-qwen35-bpe1024-f16.gguf synth-qwen35moe-bpe1024-q8_0.gguf; do
    need_data "$DATA/models/$f"
    for samp in "--temp 0" "--temp 0.8 --seed 7" "--temp 1 --seed 3 --top-k 0 --top-p 1 --min-p 0 --repeat-penalty 1.1"; do
        for extra in "" "--ids" "--stop the"; do
            "$KVCTL" generate -m "$DATA/models/$f" -p "$P" -n 120 $samp --ignore-eos -t 1 $extra \
                >"$T/plain" 2>"$T/plain.err" || fail "$f $samp $extra: $(tail -2 "$T/plain.err")"
            for k in 8 14; do
                "$KVCTL" generate -m "$DATA/models/$f" -p "$P" -n 120 $samp --ignore-eos -t 1 $extra \
                    --draft lookup --draft-max $k >"$T/draft" 2>"$T/draft.err" ||
                    fail "$f $samp $extra --draft-max $k: $(tail -2 "$T/draft.err")"
                cmp -s "$T/plain" "$T/draft" ||
                    fail "$f $samp $extra --draft-max $k: the text differs from the one without drafts:
$(head -c 300 "$T/plain")
---
$(head -c 300 "$T/draft")"
            done
        done
    done
    grep -q "^drafts: [0-9]* proposed, [0-9]* accepted; [0-9]* passes for [0-9]* tokens" "$T/draft.err" ||
        fail "$f: no drafting figures: $(cat "$T/draft.err")"
    case $f in
    synth-qwen35*)
        grep -q "^drafts: recurrent state restored after rejected drafts, [1-9][0-9]* rows run again" "$T/draft.err" ||
            fail "$f: the hybrid's state was never restored: $(cat "$T/draft.err")" ;;
    esac
    echo "ok   $f: the same text with drafts (greedy and seeded; 8 and 15 drafts; --ids, --stop)"
done
# the story repeats itself: drafts are accepted and a pass yields more than one token
"$KVCTL" generate -m "$DATA/models/stories260K.gguf" -p "$P" -n 200 --temp 0 --ignore-eos -t 1 \
    --draft lookup >/dev/null 2>"$T/fig.err" || fail "kvctl generate --draft lookup: $(cat "$T/fig.err")"
python3 - "$T/fig.err" <<'PY' || fail "drafting does not pay on a story that repeats itself: $(grep drafts "$T/fig.err")"
import re, sys
m = re.search(r"drafts: (\d+) proposed, (\d+) accepted; (\d+) passes for (\d+) tokens", open(sys.argv[1]).read())
prop, acc, passes, toks = map(int, m.groups())
print("       stories260K greedy, 200 tokens: %d drafts proposed, %d accepted, %d passes (%.2f tokens a pass)" % (prop, acc, passes, toks / passes))
# every token is one fed by a pass, an accepted draft, or the last (never fed)
sys.exit(0 if acc > 0 and passes + acc + 1 == toks and toks / passes > 1.2 else 1)
PY
"$KVCTL" generate -m "$DATA/models/stories260K.gguf" -p "$P" --draft bogus 2>&1 | grep -q "draft 'bogus': lookup, mtp, auto or none" ||
    fail "a bad --draft value is not refused with the reason"
"$KVCTL" generate -m "$DATA/models/stories260K.gguf" -p "$P" --draft lookup --draft-max 15 >/dev/null 2>&1 &&
    fail "--draft-max 15 accepted (at most 14)"
echo "ok   drafting pays where the text repeats itself; bad values refused"
finish

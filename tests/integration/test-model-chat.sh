#!/bin/bash
# test-model-chat: the chat templates (model/chat.c) render every family's Jinja template text
# (tests/data/chat/*.jinja, and the tokenizer.chat_template of the shared GGUFs that carry
# one) byte for byte as python3-jinja2 renders it, for conversations with and without a
# system message, multi-turn, special characters, empty content, add_generation_prompt on
# and off; conversations a template refuses are refused; each template is recognised as its
# family and each family named explicitly renders as its template (tests/lib/chat_render.py).
. "$(dirname "$0")/../lib/lib.sh"

need_exec "$TOOLS/tool-chat"
need_data "$DATA/tokenizer/ggml-vocab-qwen2.gguf" "$DATA/tokenizer/ggml-vocab-phi-3.gguf"
PY=/usr/bin/python3   # Debian's, where python3-jinja2 is (a python3 earlier in PATH may differ)
"$PY" -c 'import jinja2' 2>/dev/null ||
    die "python3-jinja2 missing (scripts/setup.sh installs it)"

"$PY" "$ROOT/tests/lib/chat_render.py" "$TOOLS/tool-chat" "$DATA" > "$T/out" 2>&1 ||
    fail "chat templates differ from Jinja: $(cat "$T/out")"
tail -1 "$T/out"
grep -q ', 0 mismatches' "$T/out" || fail "no comparison summary: $(cat "$T/out")"

finish

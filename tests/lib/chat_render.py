#!/usr/bin/env python3
"""chat_render.py TOOL DATA — Kvasir's chat templates (model/chat.c) against Jinja.

Renders every template of tests/data/chat/ and the tokenizer.chat_template of the shared
GGUFs that carry one with python3-jinja2, set up as Hugging Face's apply_chat_template sets
it up (sandboxed, trim_blocks, lstrip_blocks, raise_exception, tojson), for a set of
conversations with add_generation_prompt on and off, and compares byte for byte with what
tool-chat renders through model_chat_render. Where a template raises (roles that do not
alternate, a system message it refuses), the C side must refuse too. Also checked: the family
each template is recognised as, and each family named explicitly (--chat-template NAME)
rendering as that family's template. Prints one line per mismatch and exits 1 on any.
"""
import json
import os
import subprocess
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
CHAT = os.path.join(HERE, "..", "data", "chat")

# template file stem -> (family it must be recognised as, bos text, eos text)
TEMPLATES = {
    "chatml": ("chatml", "", "<|im_end|>"),
    "qwen2": ("chatml", "", "<|im_end|>"),
    "qwen2.5": ("chatml", "", "<|im_end|>"),
    "qwen3": ("chatml", "", "<|im_end|>"),
    "llama3": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama3.1": ("llama3", "<|begin_of_text|>", "<|eot_id|>"),
    "llama2": ("llama2", "<s>", "</s>"),
    "mistral": ("mistral", "<s>", "</s>"),
    "mistral-v1": ("mistral", "<s>", "</s>"),
    "mistral-v2": ("mistral", "<s>", "</s>"),
    "phi3": ("phi3", "<s>", "<|endoftext|>"),
    "phi3.5": ("phi3", "<s>", "<|endoftext|>"),
    "gemma": ("gemma", "<bos>", "<eos>"),
    "gemma2": ("gemma", "<bos>", "<eos>"),
}

# shared GGUFs whose tokenizer.chat_template is a real case -> family
GGUFS = {
    "tokenizer/ggml-vocab-qwen2.gguf": "chatml",
    "tokenizer/ggml-vocab-phi-3.gguf": "phi3",
}

SPECIAL = ("  Quotes ' \" and \\backslash\\, braces {{ x }} {% if %} {# c #},\n"
           "tags <|im_end|> [INST] <start_of_turn>, tab\there,\r\n"
           "unicode caf\u00e9 \u4e2d\u6587 \U0001f600, trailing nbsp\u00a0\u3000\n\n")


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = {
    "system+user": [m("system", "You are terse."), m("user", "Hello")],
    "user": [m("user", "Hello")],
    "multi-turn": [m("system", "Be kind."), m("user", "Hi"), m("assistant", "Hello!"),
                   m("user", "Who are you?")],
    "multi-turn-no-system": [m("user", "Hi"), m("assistant", "   Hello there   "),
                             m("user", "And then?")],
    "ends-with-assistant": [m("user", "Hi"), m("assistant", "Hello")],
    "system+ends-with-assistant": [m("system", "S"), m("user", "Hi"), m("assistant", "Hello")],
    "special": [m("system", SPECIAL), m("user", SPECIAL), m("assistant", SPECIAL),
                m("user", "\n" + SPECIAL)],
    "empty": [m("system", ""), m("user", "")],
    "empty-user": [m("user", ""), m("assistant", ""), m("user", "")],
    "whitespace": [m("user", " \t\n\x0b\x0c\x1c\x1f\u2003 x \u2028\u205f\x85 ")],
    "system-only": [m("system", "Only me.")],
    "not-alternating": [m("user", "a"), m("user", "b")],
    "assistant-first": [m("assistant", "a"), m("user", "b")],
    "late-system": [m("user", "a"), m("assistant", "b"), m("system", "c"), m("user", "d")],
    "two-systems": [m("system", "a"), m("system", "b"), m("user", "c")],
    # reasoning in assistant turns (Qwen3 drops it from turns before the last user turn)
    "thinking": [m("user", "q1"), m("assistant", "<think>\nr1\n</think>\n\na1"),
                 m("user", "q2"), m("assistant", "\n<think>\n\nr2\n\n</think>\n\n\na2\n")],
    "thinking-odd": [m("user", "q"), m("assistant", "x<think>a<think>b\n</think>c</think>\nd"),
                     m("user", "<tool_response>t</tool_response>"),
                     m("assistant", "no close tag <think>"), m("user", "</think>")],
    "thinking-after-tool": [m("user", "q"), m("user", "<tool_response>t</tool_response>"),
                            m("assistant", "<think>r</think>a")],
}


def jinja_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    env.filters["tojson"] = lambda x, indent=None, **k: json.dumps(x, ensure_ascii=False,
                                                                    indent=indent)
    env.globals["raise_exception"] = raise_exception
    return env


def jinja_render(env, text, bos, eos, messages, gen):
    try:
        return env.from_string(text).render(messages=messages, bos_token=bos, eos_token=eos,
                                            add_generation_prompt=gen), None
    except jinja2.exceptions.TemplateError as e:
        return None, str(e) or type(e).__name__


def run_tool(tool, req):
    p = subprocess.run([tool], input=json.dumps(req).encode(), capture_output=True, timeout=60)
    if p.returncode != 0:
        raise SystemExit("tool-chat failed: " + p.stderr.decode(errors="replace"))
    return json.loads(p.stdout)


def cases():
    out = []
    for name, msgs in CONVERSATIONS.items():
        for gen in (True, False):
            out.append((name, gen, {"messages": msgs, "add_generation_prompt": gen}))
    return out


def compare(label, env, text, bos, eos, res, failures):
    n = 0
    for (name, gen, c), r in zip(cases(), res["results"]):
        want, jerr = jinja_render(env, text, bos, eos, c["messages"], gen)
        where = "%s: %s, add_generation_prompt=%s" % (label, name, gen)
        if jerr is not None:
            if "error" not in r:
                failures.append("%s: Jinja raises (%s) but C renders %r" % (where, jerr, r["text"]))
        elif "error" in r:
            failures.append("%s: C refuses (%s) but Jinja renders %r" % (where, r["error"], want))
        elif r["text"] != want:
            failures.append("%s:\n  jinja %r\n  C     %r" % (where, want, r["text"]))
        n += 1
    return n


def main():
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    tool, data = sys.argv[1], sys.argv[2]
    env = jinja_env()
    failures = []
    compared = 0
    all_cases = [c for _, _, c in cases()]

    for stem, (family, bos, eos) in TEMPLATES.items():
        path = os.path.join(CHAT, stem + ".jinja")
        with open(path, encoding="utf-8") as f:
            text = f.read()
        # recognised from the text
        res = run_tool(tool, {"template": text, "bos": bos, "eos": eos, "cases": all_cases})
        if res["family"] != family:
            failures.append("%s: recognised as %s, not %s" % (stem, res["family"], family))
        compared += compare(stem, env, text, bos, eos, res, failures)
        # named explicitly, no template at all: the same rendering
        res = run_tool(tool, {"name": stem, "bos": bos, "eos": eos, "cases": all_cases})
        compared += compare("--chat-template " + stem, env, text, bos, eos, res, failures)

    for rel, family in GGUFS.items():
        path = os.path.join(data, rel)
        if not os.path.exists(path):
            failures.append("test data missing: %s" % path)
            continue
        res = run_tool(tool, {"gguf": path, "cases": all_cases})
        if res["family"] != family:
            failures.append("%s: recognised as %s, not %s" % (rel, res["family"], family))
        bos, eos = res["bos"] or "", res["eos"] or ""
        compared += compare(rel, env, res["template"], bos, eos, res, failures)
        # the BOS rule: has_bos exactly when the text starts with the model's BOS text
        for r in res["results"]:
            if "text" in r and r["has_bos"] != (bos != "" and r["text"].startswith(bos)):
                failures.append("%s: has_bos %s for %r" % (rel, r["has_bos"], r["text"][:40]))

    for f in failures:
        print("FAIL " + f)
    print("chat_render: %d renderings compared, %d mismatches" % (compared, len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

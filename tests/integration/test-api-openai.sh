#!/bin/bash
# The official `openai` npm client (pinned in tests/package.json, installed by
# scripts/setup.sh) against the OpenAI-compatible API of a 3-stage loopback ring (rank 0,
# kvd stage --api) and of one process (kvctl serve): a streamed chat completion and a
# non-streamed completion return the same text as `kvctl generate` with the same seed and
# sampling, and their usage counts are the prompt's and the generation's tokens.
. "$(dirname "$0")/../lib/lib.sh"
need_exec "$KVCTL" "$KVD"
san_log_check   # a sanitizer report in a daemon's log (under $T) fails the test
command -v node >/dev/null || die "node missing (scripts/setup.sh installs nodejs)"
[ -f tests/node_modules/openai/package.json ] ||
    die "node package openai missing in tests/node_modules (scripts/setup.sh installs it from the npm registry)"
M=$(need_model stories260K.gguf) || exit 1

PROMPT="Once upon a time"
# the ChatML rendering of one user turn, trailing newline kept
CHAT=$(printf '<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n.' "$PROMPT")
CHAT=${CHAT%.}
N=24
SAMPLING="--temp 0.8 --top-p 0.9 --top-k 0 --min-p 0 --seed 42"

# check NAME JSON TARGET...: the client's answers against `kvctl generate TARGET`
check() {
    local name=$1 json=$2
    shift 2
    "$KVCTL" generate "$@" -p "$CHAT" -n $N $SAMPLING > "$T/chat.ref" 2> "$T/chat.err" ||
        { fail "$name: kvctl generate (chat prompt): $(cat "$T/chat.err")"; return; }
    "$KVCTL" generate "$@" -p "$PROMPT" -n $N $SAMPLING > "$T/cmpl.ref" 2> "$T/cmpl.err" ||
        { fail "$name: kvctl generate: $(cat "$T/cmpl.err")"; return; }
    python3 - "$json" "$T/chat.ref" "$T/chat.err" "$T/cmpl.ref" "$T/cmpl.err" "$name" <<'PY' || { fail "$name: see above"; return; }
import json, re, sys
out = json.loads(open(sys.argv[1]).read())
name = sys.argv[6]
ok = True
def bad(msg):
    global ok
    ok = False
    print(f"{name}: {msg}")
def counts(errf):
    m = re.search(r"prompt: (\d+) tokens.*generation: (\d+) tokens", open(errf).read())
    return int(m.group(1)), int(m.group(2))
for key, ref, err in (("chat", sys.argv[2], sys.argv[3]), ("completion", sys.argv[4], sys.argv[5])):
    want = open(ref, encoding="utf-8").read()
    assert want.endswith("\n")
    want = want[:-1]
    got = out[key]
    if got["text"] != want:
        bad(f"{key}: text {got['text']!r} vs kvctl generate {want!r}")
    npr, ngen = counts(err)
    u = got["usage"] or {}
    if (u.get("prompt_tokens"), u.get("completion_tokens"), u.get("total_tokens")) != (npr, ngen, npr + ngen):
        bad(f"{key}: usage {u} vs prompt {npr} + generated {ngen}")
    if got["finish"] != ("length" if ngen == 24 else "stop"):
        bad(f"{key}: finish_reason {got['finish']} after {ngen} tokens")
if out["chat"]["role"] != "assistant":
    bad(f"chat: no assistant role in the stream ({out['chat']['role']})")
if out["chat"]["chunks"] < 3:
    bad(f"chat: {out['chat']['chunks']} chunks: not streamed")
c = out["completion"]
if c["object"] != "text_completion" or c["n_logprobs"] != c["usage"]["completion_tokens"] or c["n_top"] < 1:
    bad(f"completion: object/logprobs wrong: {c}")
if not out["n2"].startswith("400 BadRequestError n"):
    bad(f"n = 2 not refused with 400 naming n: {out['n2']}")
if not out["models"]:
    bad("/v1/models lists nothing")
sys.exit(0 if ok else 1)
PY
    [ $? = 0 ] && echo "ok $name"
}

# A 3-stage loopback ring, rank 0 serving the API.
ring_up "$T/ring" --model "$M" --stages 3 --api 127.0.0.1:0 --chat-template chatml
PORT=$(api_port "$T/ring")
[ -n "$PORT" ] && [ "$PORT" != 0 ] || die "ring up --api 127.0.0.1:0 printed no port: $(cat "$T/ring.up")"
timeout 120 node tests/lib/api_openai_client.mjs "http://127.0.0.1:$PORT/v1" "$PROMPT" $N 0.8 0.9 42 > "$T/ring.json" 2> "$T/node.err" ||
    fail "openai client against the ring: $(cat "$T/node.err")"
[ -s "$T/ring.json" ] && check "3-stage ring" "$T/ring.json" --ring "$T/ring"
ring_down "$T/ring"

# One process: kvctl serve.
"$LISTEN" "$T/serve.port" 0 -- "$KVCTL" serve -m "$M" --listen 127.0.0.1:{PORT} --chat-template chatml -t 1 > "$T/serve.log" 2>&1 &
PIDS="$PIDS $!"
PORT=$(port_of "$T/serve.port") || die "kvctl serve: $(cat "$T/serve.log")"
timeout 120 node tests/lib/api_openai_client.mjs "http://127.0.0.1:$PORT/v1" "$PROMPT" $N 0.8 0.9 42 > "$T/serve.json" 2> "$T/node.err" ||
    fail "openai client against kvctl serve: $(cat "$T/node.err")"
[ -s "$T/serve.json" ] && check "kvctl serve" "$T/serve.json" -m "$M" -t 1

# API keys: the client without the key gets 401 (AuthenticationError), with it an answer.
printf '# keys\nsecret-one\n  secret-two  \n' > "$T/keys"
"$LISTEN" "$T/serve2.port" 0 -- "$KVCTL" serve -m "$M" --listen 127.0.0.1:{PORT} --api-key-file "$T/keys" -t 1 > "$T/serve2.log" 2>&1 &
PIDS="$PIDS $!"
PORT=$(port_of "$T/serve2.port") || die "kvctl serve --api-key-file: $(cat "$T/serve2.log")"
out=$(node tests/lib/api_openai_client.mjs --key "http://127.0.0.1:$PORT/v1" wrong-key)
[ "$out" = "401 AuthenticationError" ] || fail "a wrong key: '$out', expected 401 AuthenticationError"
out=$(node tests/lib/api_openai_client.mjs --key "http://127.0.0.1:$PORT/v1" secret-two)
[ "$out" = "ok 2" ] || fail "the second key in the file: '$out'"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$PORT/health")
[ "$code" = 200 ] || fail "/health needs no key: $code"
finish

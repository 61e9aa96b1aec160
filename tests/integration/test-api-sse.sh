#!/bin/bash
# The OpenAI-compatible API driven with curl, on a 3-stage loopback ring (kvd stage --api on
# rank 0) and through kvctl serve: server-sent events (text/event-stream, "data: " events, a
# final [DONE], usage with stream_options.include_usage), stop strings that span tokens
# (never in the text, streamed or not), 16 concurrent streaming clients, a client that
# disconnects mid-stream freeing its session on every stage, 429 past the
# session limit, and bad requests (malformed JSON, wrong types, a prompt past the context,
# 1,000 stop strings, a 10 MB body) refused with their status and a JSON error while the
# daemon stays up.
. "$(dirname "$0")/../lib/lib.sh"
need_exec "$KVCTL" "$KVD"
san_log_check   # a sanitizer report in a daemon's log (under $T) fails the test
command -v curl >/dev/null || die "curl missing (scripts/setup.sh installs it)"
M=$(need_model stories260K.gguf) || exit 1

# Python starts slowly on a loaded machine: the checks are batched, one python3 run each.
# sse_check FILE HEADERS N [FILE HEADERS N]...: well-formed event streams (N content tokens
# unless N is "-"); prints the text of each, one a line (repr-free: the text itself).
sse_check() {
    python3 - "$@" <<'PY'
import json, sys
args = sys.argv[1:]
for k in range(0, len(args), 3):
    f, hf, n = args[k:k + 3]
    body = open(f, encoding="utf-8").read()
    heads = open(hf).read().lower()
    def die(msg):
        sys.exit(f"{f}: {msg}")
    if "content-type: text/event-stream" not in heads:
        die(f"content type: {heads!r}")
    events = [l for l in body.split("\n") if l]
    if not events or any(not l.startswith("data: ") for l in events):
        die(f"a line that is not a data: event in {body[:300]!r}")
    if events[-1] != "data: [DONE]" or sum(e == "data: [DONE]" for e in events) != 1:
        die(f"no single final [DONE]: {events[-3:]}")
    if "\n\n" not in body:
        die("events not separated by blank lines")
    text, usage, finish = "", None, None
    for e in events[:-1]:
        o = json.loads(e[6:])
        if o.get("usage"):
            usage = o["usage"]
        for c in o.get("choices", []):
            text += c.get("text") or (c.get("delta") or {}).get("content") or ""
            finish = c.get("finish_reason") or finish
    if usage is None or usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
        die(f"usage missing or wrong: {usage}")
    if n != "-" and usage["completion_tokens"] != int(n):
        die(f"{usage['completion_tokens']} tokens, expected {n}")
    if finish not in ("stop", "length"):
        die(f"finish_reason {finish}")
    print(json.dumps(text))
PY
}

# err_check NAME STATUS PARAM: records the last post's answer; err_verify checks them all
# (the status, a JSON error with a message, naming PARAM unless it is "").
err_check() {
    local k=$(( ${ERRN:-0} + 1 ))
    ERRN=$k
    cp "$T/body" "$T/err-$k.body"
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$(cat "$T/status")" >> "$T/errs"
}
err_verify() {
    python3 - "$T" <<'PY' || fail "refusals: see above"
import json, sys
ok = True
for k, line in enumerate(open(sys.argv[1] + "/errs"), 1):
    name, want, param, got = line.rstrip("\n").split("\t")
    body = open(f"{sys.argv[1]}/err-{k}.body", errors="replace").read()
    try:
        e = json.loads(body)["error"]
        good = got == want and e["message"] and (not param or e.get("param") == param)
    except Exception:
        good = False
    if not good:
        ok = False
        print(f"FAIL: {name}: status {got} (expected {want}, param {param!r}): {body[:300]}")
sys.exit(0 if ok else 1)
PY
    rm -f "$T/errs" "$T"/err-*.body
    ERRN=0
}

# the request bodies, made once
python3 - "$T" <<'PY'
import json, sys
d = sys.argv[1]
def w(name, o):
    open(f"{d}/{name}.json", "w").write(o if isinstance(o, str) else json.dumps(o))
w("malformed", '{"prompt": "x", "max_tokens": ')
w("temp-str", {"prompt": "x", "temperature": "hot"})
w("max-frac", {"prompt": "x", "max_tokens": 2.5})
w("msgs-str", {"messages": "hello"})
w("stream-str", {"prompt": "x", "stream": "yes"})
w("n3", {"prompt": "x", "n": 3})
w("ctx-ids", {"prompt": [1] * 4096, "max_tokens": 1})
w("ctx-text", {"prompt": "Once upon a time " * 3000, "max_tokens": 1})
w("stops", {"prompt": "x", "stop": ["s%d" % i for i in range(1000)]})
w("big", {"prompt": "x", "pad": "a" * (10 << 20)})
w("unknown", {"prompt": "Once", "max_tokens": 2, "some_future_field": {"x": 1}, "user": "u"})
w("one", {"prompt": "x", "max_tokens": 1})
PY

post() {   # post URL BODY-FILE: status into $T/status, body into $T/body
    curl -s -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$2" "$1" > "$T/status"
}

# The request checks every server must pass (BASE: http://host:port; its context 4096).
common_checks() {
    local base=$1 who=$2
    # SSE: a streamed completion; its text is that of the same request not streamed
    local req='{"prompt":"Once upon a time","max_tokens":24,"temperature":0.8,"top_p":0.9,"seed":7,"stream":true,"stream_options":{"include_usage":true}}'
    curl -sN -D "$T/h1" -H 'Content-Type: application/json' -d "$req" "$base/v1/completions" > "$T/sse" ||
        fail "$who: streamed completion"
    curl -s -d "${req/\"stream\":true/\"stream\":false}" "$base/v1/completions" > "$T/plain"
    # a stop string across tokens (" named" split as "d na" ... ): never in the text
    curl -s -d '{"prompt":"Once upon a time","max_tokens":24,"temperature":0}' "$base/v1/completions" > "$T/full"
    stop=$(sed -n 's/.*"text":"[^"]\{8\}[^ "]*\(..\) \(...\).*/\1 \2/p' "$T/full")
    [ -n "$stop" ] || fail "$who: no stop string picked from $(cat "$T/full")"
    for s in false true; do
        curl -sN -D "$T/h-$s" -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":24,\"temperature\":0,\"stop\":[\"zzz\",\"$stop\"],\"stream\":$s,\"stream_options\":{\"include_usage\":true}}" \
            "$base/v1/completions" > "$T/stop-$s"
    done
    # chat streaming: the role first, content after, logprobs
    curl -sN -D "$T/h2" -d '{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"}],"max_tokens":8,"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":3}' \
        "$base/v1/chat/completions" > "$T/chat"
    grep -q '"role":"assistant"' "$T/chat" && grep -q '"top_logprobs":\[{' "$T/chat" || fail "$who: chat stream without role or logprobs"
    sse_check "$T/sse" "$T/h1" 24 "$T/stop-true" "$T/h-true" - "$T/chat" "$T/h2" - > "$T/texts" || fail "$who: SSE"
    python3 - "$T" "$stop" <<'PY' || fail "$who: streamed and plain texts, stop strings: see above"
import json, sys
d, stop = sys.argv[1], sys.argv[2]
texts = [json.loads(l) for l in open(d + "/texts")]
plain = json.load(open(d + "/plain"))["choices"][0]["text"]
full = json.load(open(d + "/full"))["choices"][0]["text"]
want = full[:full.index(stop)]
nostream = json.load(open(d + "/stop-false"))["choices"][0]
ok = True
if texts[0] != plain or not plain:
    ok = False; print(f"streamed {texts[0]!r} vs not streamed {plain!r}")
if texts[1] != want or nostream["text"] != want or nostream["finish_reason"] != "stop":
    ok = False; print(f"stop {stop!r}: streamed {texts[1]!r}, not streamed {nostream}, expected {want!r} (full {full!r})")
sys.exit(0 if ok else 1)
PY
    # refusals, each a JSON error; unknown fields are ignored
    local u=$base/v1/completions
    post "$u" "$T/malformed.json"; err_check "$who: malformed JSON" 400 ""
    post "$u" "$T/temp-str.json"; err_check "$who: temperature a string" 400 temperature
    post "$u" "$T/max-frac.json"; err_check "$who: max_tokens not an integer" 400 max_tokens
    post "$base/v1/chat/completions" "$T/msgs-str.json"; err_check "$who: messages a string" 400 messages
    post "$u" "$T/stream-str.json"; err_check "$who: stream a string" 400 stream
    post "$u" "$T/n3.json"; err_check "$who: n = 3" 400 n
    post "$u" "$T/ctx-ids.json"; err_check "$who: a prompt of 4096 tokens (the context)" 400 prompt
    grep -q context_length_exceeded "$T/body" || fail "$who: no context_length_exceeded code"
    post "$u" "$T/ctx-text.json"; err_check "$who: a text prompt past the context" 400 prompt
    post "$u" "$T/stops.json"; err_check "$who: 1,000 stop strings" 400 stop
    post "$u" "$T/big.json"; err_check "$who: a 10 MB body" 413 ""
    code=$(curl -s -o "$T/body" -w '%{http_code}' "$base/v1/nothing"); echo $code > "$T/status"
    err_check "$who: unknown path" 404 ""
    err_verify
    post "$u" "$T/unknown.json"
    [ "$(cat "$T/status")" = 200 ] || fail "$who: unknown fields not ignored: $(cat "$T/body")"
    code=$(curl -s -o /dev/null -w '%{http_code}' "$base/health")
    [ "$code" = 200 ] || fail "$who: /health after the refusals: $code"
    curl -s "$base/v1/models" | grep -q '"object":"list"' || fail "$who: /v1/models"
    curl -s "$base/metrics" > "$T/metrics"
    for k in kvasir_api_tokens_per_second kvasir_api_sessions kvasir_stage_ms_per_token kvasir_api_completion_tokens_total; do
        grep -q "^$k" "$T/metrics" || fail "$who: /metrics lacks $k"
    done
    echo "ok $who: SSE, stop strings, refusals"
}

# stream_and_leave BASE: a long stream whose client leaves after its first events; the pid
# of curl is gone when this returns.
stream_and_leave() {
    curl -sN -d '{"prompt":"Once upon a time","max_tokens":100000,"ignore_eos":true,"stream":true}' \
        "$1/v1/completions" > "$T/leave" 2>/dev/null &
    local pid=$!
    wait_for 10 bash -c "[ \$(grep -c '^data: ' '$T/leave') -ge 3 ]" || fail "the long stream did not start"
    kill $pid 2>/dev/null
    wait $pid 2>/dev/null
    grep -q '\[DONE\]' "$T/leave" && fail "the long stream ended before its client left"
}

# ------------------------------------------------------------------ the ring
ring_up "$T/ring" --model "$M" --stages 3 --ctx 4096 --api 127.0.0.1:0 --api-max-sessions 20 --chat-template chatml
PORT=$(api_port "$T/ring")
[ -n "$PORT" ] || die "ring up --api: $(cat "$T/ring.up")"
BASE=http://127.0.0.1:$PORT
common_checks "$BASE" "ring"

# 16 concurrent streaming clients all complete
for i in $(seq 1 16); do
    curl -sN -D "$T/h$i" -d "{\"prompt\":\"Once upon a time\",\"max_tokens\":32,\"ignore_eos\":true,\"seed\":$i,\"stream\":true,\"stream_options\":{\"include_usage\":true}}" \
        "$BASE/v1/completions" > "$T/c$i" &
    cpids="${cpids:-} $!"
done
for p in $cpids; do wait $p || fail "a concurrent client's curl failed"; done
args=(); for i in $(seq 1 16); do args+=("$T/c$i" "$T/h$i" 32); done
sse_check "${args[@]}" > /dev/null || fail "the 16 concurrent clients' streams"
echo "ok 16 concurrent streaming clients"

# a client that leaves mid-stream: its session ends on every stage (the ring is idle, so
# nothing but that session holds a slot)
all_free() {
    "$KVCTL" status --ring "$T/ring" --json > "$T/st" && [ "$(grep -c '"sessions":0,' "$T/st")" = 3 ]
}
stream_and_leave "$BASE"
wait_for 15 all_free || fail "the session of a client that left is still held: $(cat "$T/st")"
grep -q "client gone" "$T/ring/rank-0/kvd.log" || fail "rank 0's log does not say the session ended for a client gone"
echo "ok a client that left freed its session on every stage"

# past --api-max-sessions: 429 with a JSON error
for i in $(seq 1 20); do
    curl -sN -d '{"prompt":"Once upon a time","max_tokens":100000,"ignore_eos":true,"stream":true}' "$BASE/v1/completions" > /dev/null 2>&1 &
    lpids="${lpids:-} $!"
done
wait_for 10 bash -c "curl -s $BASE/health | grep -q '\"sessions\":20'" || fail "20 long streams did not start"
post "$BASE/v1/completions" "$T/one.json"
err_check "ring: the 21st session" 429 ""
err_verify
for p in $lpids; do kill $p 2>/dev/null; wait $p 2>/dev/null; done
wait_for 15 all_free || fail "20 clients gone, sessions still held: $(cat "$T/st")"
kill -0 "$(rank_pid "$T/ring" 0)" || fail "rank 0 died"
ring_down "$T/ring"

# ------------------------------------------------------------------ kvctl serve
"$LISTEN" "$T/serve.port" 0 -- "$KVCTL" serve -m "$M" --listen 127.0.0.1:{PORT} --ctx 4096 --max-sessions 4 --chat-template chatml -t 1 > "$T/serve.log" 2>&1 &
SERVE=$!
PIDS="$PIDS $SERVE"
PORT=$(port_of "$T/serve.port") || die "kvctl serve: $(cat "$T/serve.log")"
wait_port $PORT 20 || die "kvctl serve did not serve: $(cat "$T/serve.log")"
BASE=http://127.0.0.1:$PORT
common_checks "$BASE" "kvctl serve"
stream_and_leave "$BASE"
wait_for 10 bash -c "curl -s $BASE/health | grep -q '\"sessions\":0'" || fail "kvctl serve: the session of a client that left is still running"
kill -0 $SERVE || fail "kvctl serve died"
kill -INT $SERVE
wait_for 10 bash -c "! kill -0 $SERVE 2>/dev/null" || fail "kvctl serve did not stop on SIGINT"
finish

#!/bin/bash
# The compute thread's scheduler on real models (docs/ring.md, "The batching scheduler"):
# 10 sessions sent at once to a 3-stage ring, 6 with 40-token prompts and 4 with 2-token ones,
# each give exactly their one-process tokens (and the last step's logits bit for bit), on a
# dense F16 model and the F16 hybrid (Gated DeltaNet: per-session recurrent state that
# chunks must carry in order), whose windows batch any number of rows (capped at 64 a run)
# and split prompts into chunks, and on a Q8_0 MoE, whose F32 router caps its runs at
# KERN_ROWS_EXACT_MAX rows with prompts whole. On the F16 rings some prompt was split, and
# on every ring no decode step waited behind more than two window runs (status
# batches.max_decode_wait_runs).
. "$(dirname "$0")/../lib/ring_lib.sh"

N=10
GEN=12
# session i's prompt: 40 tokens for i < 6, else 2 (ids below every vocabulary here)
prompt() {
    local i=$1 len=2 k out
    [ "$i" -lt 6 ] && len=40
    out=1
    for k in $(seq 1 $((len - 1))); do out="$out,$(( (37 * i + 11 * k) % 900 + 2 ))"; done
    echo "$out"
}

for name in synth-qwen3-bpe1024-f16.gguf synth-qwen35-bpe1024-f16.gguf synth-qwen3moe-bpe1024-q8_0.gguf; do
    M=$(need_model $name) || exit 1
    D="$TMP/ring-${name%.gguf}"
    ring_up "$D" --model "$M" --stages 3
    for i in $(seq 0 $((N - 1))); do
        "$TOOLS/tool-ring-ref" -m "$M" --tokens "$(prompt $i)" -n $GEN --temp 0 --ignore-eos \
            --dump-logits "$TMP/one.$i.lg" > "$TMP/one.$i" 2>/dev/null || fail "$name: one-process run $i"
    done
    # Waves of the N sessions until some prompt was split on the F16 rings (up to 5: on a busy
    # machine the loop may hand the compute thread the prompts one by one, each run whole);
    # every wave's tokens and logits are checked, the figures count all waves.
    for wave in 1 2 3 4 5; do
    # All requests written before any reply is read: the prompts reach rank 0 together.
    python3 - "$D/rank-0/kvd.sock" "$TMP" $N $GEN $(for i in $(seq 0 $((N - 1))); do prompt $i; done) <<'PY' ||
import json, selectors, socket, struct, sys
path, tmp, n, gen, prompts = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
socks = []
for i in range(n):
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    socks.append(s)
for i, s in enumerate(socks):
    req = {"op": "generate", "tokens": [int(t) for t in prompts[i].split(",")], "n": gen,
           "temp": 0, "ignore_eos": True, "logits": True}
    s.sendall((json.dumps(req) + "\n").encode())
sel = selectors.DefaultSelector()
buf, toks, done = {}, {}, set()
for i, s in enumerate(socks):
    sel.register(s, selectors.EVENT_READ, i)
    buf[i], toks[i] = b"", []
while len(done) < n:
    for key, _ in sel.select(timeout=60):
        i = key.data
        d = key.fileobj.recv(1 << 20)
        if not d:
            sys.exit("session %d: closed early" % i)
        buf[i] += d
        while b"\n" in buf[i]:
            line, buf[i] = buf[i].split(b"\n", 1)
            o = json.loads(line)
            if "error" in o:
                sys.exit("session %d: %s" % (i, o["error"]))
            if "t" in o:
                toks[i].append(o["t"])
            if o.get("done"):
                lg = o.get("logits") or []
                open("%s/ring.%d.lg" % (tmp, i), "wb").write(struct.pack("<%df" % len(lg), *lg))
                done.add(i)
                sel.unregister(key.fileobj)
for i in range(n):
    open("%s/ring.%d" % (tmp, i), "w").write(" ".join(map(str, toks[i])) + "\n")
PY
        fail "$name: concurrent sessions failed"
    for i in $(seq 0 $((N - 1))); do
        cmp -s "$TMP/one.$i" "$TMP/ring.$i" ||
            fail "$name: session $i: ring '$(cat "$TMP/ring.$i")' vs one process '$(cat "$TMP/one.$i")'"
        cmp -s "$TMP/one.$i.lg" "$TMP/ring.$i.lg" || fail "$name: session $i: last logits not bit-identical"
    done
    echo "ok $name: $N sessions at once equal their one-process tokens (wave $wave)"
    "$KVCTL" status --ring "$D" --json > "$TMP/status" || fail "$name: status"
    python3 - "$TMP/status" "$name" <<'PY'
import json, sys
name = sys.argv[2]
chunks = 0
for line in open(sys.argv[1]):
    s = json.loads(line)
    b = s["batches"]
    print("  rank %d: %d prompt chunks, longest wait %d runs (decode %d), max_rows %d, rows_allowed %d" % (
        s["rank"], b["prompt_chunks"], b["max_wait_runs"], b["max_decode_wait_runs"], b["max_rows"],
        b["rows_allowed"]))
    f32_window = "q8_0" in name   # the MoE router's F32 weights
    assert b["rows_allowed"] == 15 if f32_window else b["rows_allowed"] > 64, b
    assert b["max_rows"] <= min(64, b["rows_allowed"]), b
    assert b["max_decode_wait_runs"] <= 2, b
    chunks += b["prompt_chunks"]
if "q8_0" in name:
    sys.exit(0 if chunks == 0 else 1)
sys.exit(0 if chunks > 0 else 2)   # 2: no prompt split yet
PY
    rc=$?
    [ $rc = 2 ] && [ $wave -lt 5 ] && continue   # no prompt split yet: another wave
    [ $rc = 0 ] || fail "$name: scheduler figures after $wave wave(s): $(cat "$TMP/status")"
    break
    done
    echo "ok $name: scheduler figures"
    ring_down "$D"
done
echo PASS

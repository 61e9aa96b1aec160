#!/bin/bash
# test-ring-probe.sh — a market's known-answer probe run by a serving stage on the window it
# has loaded (the control socket's "probe" op, which kvd join uses so that a spot check costs
# no second copy of the window; docs/market.md, "Probes"). A 3-stage ring with --max-batch 3,
# so a probe's 4 rows run in two pieces as a 4-token prompt would:
#  (a) chained through the ranks (tokens -> boundary -> boundary -> greedy tokens, f16
#      boundaries between them as the market sends them) the probe gives the token the ring
#      itself generates greedily after those tokens;
#  (b) probes asked of every rank while sessions generate leave the sessions' tokens as they
#      are without probes, and the stages count them;
#  (c) hostile challenges (no challenge, another window, too many sequences or rows, token ids
#      outside the vocabulary, an input of the wrong size or not base64) get an error naming
#      what is wrong; clients that leave before their answer cost nothing; the stages keep
#      serving.
. "$(dirname "$0")/../lib/ring_lib.sh"
need_exec "$KVCTL" "$KVD"
M=$(need_model stories260K.gguf) || exit 1
D=$TMP/ring
ring_up "$D" --model "$M" --stages 3 --max-batch 3
wait_linked "$D" 3 20 || fail "ring did not link"

PROMPT=1,50,100,200
gen() { # N: greedy ids after PROMPT, on one line
    "$KVCTL" generate --ring "$D" --tokens "$PROMPT" -n "$1" --temp 0 --ids 2>"$T/gen.err" | tr -s ' \n' ' ' |
        sed 's/ $//'
}
FIRST=$(gen 1)
[ -n "$FIRST" ] || fail "no greedy token from the ring: $(cat "$T/gen.err")"

# probe.py: the tests' probe client (one request, one answer line) and the challenges
cat >"$T/probe.py" <<'PY'
import base64, json, os, socket, struct, sys, threading
sys.path.insert(0, os.environ["ROOT"] + "/tests/lib")
import kvd_ctl
D = os.environ["D"]

def sock(r):
    return "%s/rank-%d/kvd.sock" % (D, r)

def ask(r, req, leave=False):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(30)
    s.connect(sock(r))
    s.sendall(json.dumps(req).encode() + b"\n")
    if leave:
        s.close()
        return None
    buf = b""
    while b"\n" not in buf:
        d = s.recv(1 << 20)
        if not d:
            break
        buf += d
    s.close()
    return json.loads(buf.split(b"\n")[0])

st = [kvd_ctl.status(sock(r)) for r in range(3)]
L, E = st[0]["n_layers"], st[0]["n_embd"]

def challenge(r, seqs, **kw):
    c = {"layers": st[r]["window"], "n_layers": L, "n_embd": E, "seqs": seqs}
    c.update(kw)
    return {"op": "probe", "challenge": c}

def chain(tokens):
    """The probe through every rank: the last rank's greedy tokens."""
    x = None
    for r in range(3):
        seq = {"n": len(tokens), "tokens": tokens} if r == 0 else {"n": len(tokens), "input": x}
        a = ask(r, challenge(r, [seq]))
        if "outputs" not in a:
            sys.exit("rank %d: %s" % (r, a))
        o = a["outputs"][0]
        x = o.get("output")
        if r == 2:
            return o["tokens"]

cmd = sys.argv[1]
if cmd == "chain":
    print(" ".join(map(str, chain([int(t) for t in sys.argv[2].split(",")]))))
elif cmd == "hammer":   # chains until STOP exists (at least N); in STOP.n: how many, and how
                        # many found sessions open
    n = busy = 0
    open(sys.argv[3] + ".n", "w").write("0 0\n")
    while n < int(sys.argv[2]) or not os.path.exists(sys.argv[3]):
        busy += any(kvd_ctl.status(sock(r))["sessions"] > 0 for r in range(3))
        chain([1, 50, 100, 200])
        n += 1
        with open(sys.argv[3] + ".t", "w") as f:
            f.write("%d %d\n" % (n, busy))
        os.replace(sys.argv[3] + ".t", sys.argv[3] + ".n")
elif cmd == "count":    # the probes every stage ran, and failed
    print(" ".join("%d/%d" % (s["probes"]["run"], s["probes"]["failed"])
                   for s in [kvd_ctl.status(sock(r)) for r in range(3)]))
elif cmd == "hostile":
    good = base64.b64encode(b"\0" * (4 * E * 2)).decode()
    short = base64.b64encode(b"\0" * (3 * E * 2)).decode()
    cases = [
        (0, {"op": "probe"}, "probe: expected a challenge object"),
        (0, {"op": "probe", "challenge": []}, "probe: expected a challenge object"),
        (0, challenge(0, []), "probe: expected seqs (1..8), layers [first, last)"),
        (0, challenge(0, [{"n": 1, "tokens": [1]}] * 9), "probe: expected seqs (1..8), layers [first, last)"),
        (0, challenge(0, [{"n": 1, "tokens": [1]}], layers=[2, 1]), "expected seqs (1..8), layers [first, last)"),
        (0, challenge(0, [{"n": 1, "tokens": [1]}], layers=["a", 1]), "expected seqs (1..8), layers [first, last)"),
        (1, challenge(1, [{"n": 4, "input": good}], layers=[0, st[1]["window"][1]]),
         "probe: layers [0, %d) of %d (n_embd %d) asked, the window holds [%d, %d)" %
         (st[1]["window"][1], L, E, st[1]["window"][0], st[1]["window"][1])),
        (1, challenge(1, [{"n": 4, "input": good}], n_embd=E + 1), "(n_embd %d) asked" % (E + 1)),
        (0, challenge(0, [{"n": 17, "tokens": [1] * 17}]), "probe: a sequence needs n (1..16)"),
        (0, challenge(0, [{"n": -1e30, "tokens": [1]}]), "probe: a sequence needs n (1..16)"),
        (0, challenge(0, [{"n": 1, "tokens": [1]}], n_embd=1e300), "the model's n_layers and n_embd"),
        (0, challenge(0, [{"n": 1, "tokens": [1]}], n_layers=-5), "the model's n_layers and n_embd"),
        (0, challenge(0, [{"n": 0, "tokens": []}]), "probe: a sequence needs n (1..16)"),
        (0, challenge(0, [{"n": 2, "tokens": [1]}]), "and, for layers [0, "),
        (0, challenge(0, [{"n": 2, "tokens": [1, -1]}]), "probe: token 1 is not an id below the vocabulary's"),
        (0, challenge(0, [{"n": 1, "tokens": [1e9]}]), "probe: token 0 is not an id below the vocabulary's"),
        (0, challenge(0, [{"n": 1, "tokens": ["x"]}]), "probe: token 0 is not an id below the vocabulary's"),
        (1, challenge(1, [{"n": 4, "input": "!!!!"}]), "probe: input is not 4 x %d f16 (base64)" % E),
        (1, challenge(1, [{"n": 4, "input": short}]), "probe: input is not 4 x %d f16 (base64)" % E),
        (2, challenge(2, [{"n": 4, "tokens": [1, 2, 3, 4]}]), "an input"),
    ]
    for r, req, want in cases:
        a = ask(r, req)
        if "error" not in a or want not in a["error"]:
            sys.exit("rank %d, %s: answer %s lacks %r" % (r, json.dumps(req)[:120], a, want))
        print("ok   rank %d refuses %s: %s" % (r, json.dumps(req)[:70], a["error"][:90]))
    # askers that leave at once, many at a time: nothing to answer, nothing kept
    ts = [threading.Thread(target=ask, args=(r % 3, challenge(r % 3, [{"n": 4, "tokens": [1, 2, 3, 4]}
          if r % 3 == 0 else {"n": 4, "input": good}]), True)) for r in range(60)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    print("ok   60 probes whose askers left before the answer")
PY
export ROOT D

# (a) the chain's last greedy token is the ring's own
CHAIN=$(python3 "$T/probe.py" chain "$PROMPT") || fail "probe chain: $CHAIN"
[ "$(echo "$CHAIN" | wc -w)" = 4 ] || fail "the last rank's probe answer is not 4 tokens: $CHAIN"
[ "${CHAIN##* }" = "$FIRST" ] ||
    fail "the probe chain's greedy token after $PROMPT is ${CHAIN##* }, the ring generates $FIRST"
echo "ok   probes chained through the 3 ranks (rows in pieces of 3) give the ring's greedy token $FIRST"

# (b) probes between the steps of running sessions change none of their tokens
N=300
BASE=$(gen $N)
[ "$(echo "$BASE" | wc -w)" = $N ] || fail "baseline generation: $BASE $(cat "$T/gen.err")"
python3 "$T/probe.py" hammer 20 "$T/stop" >"$T/hammer.out" 2>&1 &
HAMMER=$!
# rounds of 3 sessions side by side until the prober has done 20 chains, 3 of them while
# sessions were open (each round's tokens checked below, the last round's kept)
wait_for 10 test -s "$T/stop.n" || fail "the prober did not start: $(cat "$T/hammer.out")"
ROUNDS=0
while :; do
    GENS=""
    for i in 1 2 3; do
        gen $N >"$T/during.$i" &
        GENS="$GENS $!"
    done
    wait $GENS
    ROUNDS=$((ROUNDS + 1))
    for i in 1 2 3; do
        [ "$(cat "$T/during.$i")" = "$BASE" ] ||
            fail "round $ROUNDS: a session's tokens changed while probes ran: $(cat "$T/during.$i") vs $BASE"
    done
    read -r CHAINS BUSY <"$T/stop.n"
    [ "$CHAINS" -ge 20 ] && [ "$BUSY" -ge 3 ] && break
    [ $ROUNDS -lt 50 ] || fail "after 50 rounds the prober saw sessions open at $BUSY of $CHAINS chains"
    kill -0 $HAMMER 2>/dev/null || fail "the prober stopped: $(cat "$T/hammer.out")"
done
touch "$T/stop"
wait $HAMMER || fail "probes during generation: $(cat "$T/hammer.out")"
read -r CHAINS BUSY <"$T/stop.n"
for i in 1 2 3; do
    [ "$(cat "$T/during.$i")" = "$BASE" ] ||
        fail "a session's tokens changed while probes ran: $(cat "$T/during.$i") vs $BASE"
done
COUNT=$(python3 "$T/probe.py" count) || fail "status: $COUNT"
for c in $COUNT; do
    [ "${c%/*}" -ge $((CHAINS + 1)) ] && [ "${c#*/}" = 0 ] ||
        fail "the stages' probe counts (run/failed) are $COUNT, want >= $((CHAINS + 1))/0"
done
echo "ok   $CHAINS probes of every rank ($BUSY while sessions were open) beside 3 sessions of $N tokens ($ROUNDS round(s)):"
echo "     their tokens unchanged; the stages' counts (run/failed) $COUNT"

# (c) hostile challenges and askers that leave
python3 "$T/probe.py" hostile || fail "hostile probes"
for r in 0 1 2; do kill -0 "$(rank_pid "$D" $r)" 2>/dev/null || fail "rank $r died"; done
AFTER=$(gen $N)
[ "$AFTER" = "$BASE" ] || fail "after the hostile probes the ring generates $AFTER, not $BASE"
CHAIN2=$(python3 "$T/probe.py" chain "$PROMPT") || fail "probe chain after the hostile ones: $CHAIN2"
[ "$CHAIN2" = "$CHAIN" ] || fail "the probe chain answers $CHAIN2 after the hostile probes, $CHAIN before"
echo "ok   the stages serve sessions and probes as before"
finish

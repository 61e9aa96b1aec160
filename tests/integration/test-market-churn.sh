#!/bin/bash
# test-market-churn.sh — honest credit is never lost to churn (docs/market.md, "Receipts and
# credit"): three `kvd join` nodes serve a paying client's sessions; the middle rank's node is
# killed with -9 right after they end, before any of its receipts went out (its join process
# is held stopped while the sessions run, so its stage writes them and nothing sends them),
# and started again on its state directory. Every node's balance then ends equal to its
# window's layers times the rows of those sessions (prompt plus generated tokens less the
# last, from one-process runs of the same requests): the killed node's receipts count for the
# rank it held when the sessions ran, whatever it holds after, and the others' shares, which
# wait for the whole ring's receipts (a settle wait longer than the test), are paid once its
# are in.
. "$(dirname "$0")/../lib/lib.sh"
MARKET_ARGS="--settle-wait-s 3600"
. "$(dirname "$0")/../lib/market_lib.sh"
market_up

declare -A JPID
join() { # join NAME
    "$KVD" join --market "$M" --model "$ID" --state-dir "$T/$1" --mem 1800000 -t 1 \
        --jitter-ms 300 >>"$T/join-$1.log" 2>&1 &
    JPID[$1]=$!
    PIDS="$PIDS $!"
}
for n in a b c; do join $n; done
wait_for 90 ring_ready || fail "no complete ring within 90 s: $(cat "$T/cov.json")"
R0=$(rank0 a b c)
V=""
for n in a b c; do [ "$(rank_of $n 2>/dev/null)" = 1 ] && V=$n; done
[ -n "$R0" ] && [ -n "$V" ] || fail "no rank 0 or rank 1 among the nodes"
for n in a b c; do cp "$T/$n/manifest.json" "$T/manifest-$n.json"; done
PROMPTS="1,50,100,200,300 1,20,30,40,50,60,70,80 1,7,9"
# rows of one session: the prompt and every generated token but the last (it is sampled, not run)
rows=0
for p in $PROMPTS; do
    ids=$("$KVCTL" generate -m "$S" --tokens "$p" -n 9 --temp 0 --ids 2>/dev/null) || die "one-process run"
    np=$(echo "$p" | tr ',' '\n' | wc -l)
    ng=$(echo "$ids" | wc -w)
    rows=$((rows + np + ng - 1))
done
echo "ok   the sessions' rows from one-process runs: $rows"
serves() { # serves PROMPT: the ring answers a client session with it
    "$KVCTL" generate --ring "unix:$T/$R0/kvd.sock" --client-key "$CKEY" --tokens "$1" -n 9 --temp 0 \
        --ids >"$T/gen.out" 2>"$T/gen.err" && [ -s "$T/gen.out" ]
}
wait_for 30 serves 1,2 || fail "the ring does not serve: $(cat "$T/gen.err")"
# what the ring has done so far (the warm-up above) is credited once its receipts are all in
wait_for 40 credited a b c || fail "the warm-up session was not credited: $(cat "$T/credited.txt")"
for n in a b c; do cp "$T/bal-$n.json" "$T/bal0-$n.json"; done

# the middle node's join stops (its stage goes on serving): its receipts stay unsent
kill -STOP "${JPID[$V]}"
before=$(wc -l <"$T/$V/receipts.jsonl")
for p in $PROMPTS; do
    serves "$p" || fail "session $p failed: $(cat "$T/gen.err")"
done
wait_for 20 bash -c "[ \$(wc -l < '$T/$V/receipts.jsonl') -ge $((before + 6)) ]" ||
    fail "node $V's stage did not write its receipts of the 3 sessions"
off=$(cat "$T/$V/receipts.offset" 2>/dev/null || echo 0)
[ "$off" -lt "$(stat -c %s "$T/$V/receipts.jsonl")" ] || fail "node $V's receipts went out before the kill"
SPID=$(pgrep -P "${JPID[$V]}" | head -1)
[ -n "$SPID" ] || fail "node $V runs no stage"
kill -9 "${JPID[$V]}"
wait_for 20 pid_gone $SPID || fail "node $V's stage outlived its join process"
echo "ok   node $V (rank 1) killed with -9 after the sessions, its receipts unsent"
# nobody is paid for them yet, though the others submitted theirs: the ring's receipts are not
# all in, and the wait is long
submitted() { [ "$(cat "$T/$1/receipts.offset" 2>/dev/null)" = "$(stat -c %s "$T/$1/receipts.jsonl")" ]; }
for n in a b c; do
    [ "$n" = "$V" ] || wait_for 30 submitted $n || fail "node $n did not submit its receipts"
done
for n in a b c; do
    "$KVCTL" market balance "$M" "$(key_of $n)" --json >"$T/bal-$n.now" || fail "balance of $n"
    python3 -c 'import json,sys; sys.exit(0 if json.load(open(sys.argv[1]))["layer_tokens"] == json.load(open(sys.argv[2]))["layer_tokens"] else 1)' \
        "$T/bal-$n.now" "$T/bal0-$n.json" || fail "node $n was paid before the ring's receipts were all in"
done
join "$V"   # again, on its state directory
balanced() {
    for n in a b c; do
        "$KVCTL" market balance "$M" "$(key_of $n)" --json >"$T/bal-$n.now" 2>/dev/null || return 1
    done
    python3 - "$T" "$rows" <<'PY'
import json, sys
T, rows = sys.argv[1], int(sys.argv[2])
ok = True
for n in "abc":
    m = json.load(open("%s/manifest-%s.json" % (T, n)))
    b, b0 = json.load(open("%s/bal-%s.now" % (T, n))), json.load(open("%s/bal0-%s.json" % (T, n)))
    r = [x for x in m["ranks"] if x["node"] == b["node"]][0]
    layers = r["layers"][1] - r["layers"][0]
    got = b["layer_tokens"] - b0["layer_tokens"]
    print("%s rank %d: %d layer-tokens for the sessions, want %d x %d = %d" % (n, r["rank"], got, layers, rows, layers * rows))
    ok = ok and got == layers * rows
sys.exit(0 if ok else 1)
PY
}
wait_for 60 balanced >"$T/balanced.txt" 2>&1 || { balanced >"$T/balanced.txt" 2>&1; fail "balances after the restart: $(cat "$T/balanced.txt")"; }
sed 's/^/     /' "$T/balanced.txt"
grep -q "refused a receipt" "$T/join-$V.log" && fail "the market refused some of node $V's receipts: $(grep 'refused a receipt' "$T/join-$V.log")"
echo "ok   every node is paid its window's layers x the sessions' rows; node $V's late receipts completed the ring"
finish

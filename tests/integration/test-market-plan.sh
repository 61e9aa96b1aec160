#!/bin/bash
# test-market-plan.sh — the market's window plan of a model with an MTP block (kvctl synth --from --nextn 1:
# 8 main blocks + blk.8): its windows cover the main pass [0, 8), and the last window's bytes
# count the MTP block, its K/V and the drafter's token_embd (planner/plan.h), exactly as
# `kvctl plan` counts them for the same devices (ctx 1024, 4 sessions, every expert read: the
# market's planning options); the first window's do not.
. "$(dirname "$0")/../lib/lib.sh"
M=$DATA/models/synth-qwen35moe-bpe1024-q8_0.gguf
need_data "$M"
need_exec "$KVD" "$KVCTL" "$TOOLS/tool-market-call"
KEEP_FAILED_TMP=1
san_log_check

"$KVCTL" synth --from "$M" --nextn 1 -o "$T/mtp.gguf" > /dev/null || die "kvctl synth --from --nextn 1 failed"
"$KVCTL" catalog "$T/mtp.gguf" -o "$T/cat.json" >/dev/null 2>&1 || die "kvctl catalog failed"
"$LISTEN" "$T/market.port" 0 -- \
    "$KVD" market --db "$T/market.db" --listen "127.0.0.1:{PORT}" --no-probe --max-ranks-per-addr 0 \
    --claims-per-min-addr 0 >>"$T/market.log" 2>&1 &
PIDS="$PIDS $!"
MPORT=$(port_of "$T/market.port") || die "the market's launcher failed: $(tail -5 "$T/market.log")"
wait_port "$MPORT" || die "the market did not start: $(tail -5 "$T/market.log")"
MK=http://127.0.0.1:$MPORT
ID=$("$KVCTL" market add "$MK" --catalog "$T/cat.json" --source http://127.0.0.1:1 --state-dir "$T/admin") ||
    die "kvctl market add failed"

# two 17 MB nodes: the model (29.6 MB with its K/V) needs both; one holds 16.15 MB after headroom
MEM=17000000
devs=""
for n in a b; do
    mkdir -p "$T/$n"
    expect "profile $n" 200 --key "$T/$n" POST "$MK" /v1/nodes "{\"model\":\"$ID\",\"mem_bytes\":$MEM}"
    devs="$devs{\"id\":\"$n\",\"mem_bytes\":$MEM,\"ms_per_layer_token\":1,\"rtt_ms\":1,\"node\":\"$("$KVD" stage --state-dir "$T/$n" --print-key)\"},"
done
echo "{\"devices\":[${devs%,}]}" > "$T/devs.json"
curl -s "$MK/v1/models/$ID/coverage" > "$T/cov.json"
"$KVCTL" plan --catalog "$T/cat.json" --experts-used 8 --ctx 1024 --devices "$T/devs.json" --json > "$T/plan.json" 2>"$T/plan.err" ||
    fail "kvctl plan: $(cat "$T/plan.err")"
python3 - "$T/cov.json" "$T/plan.json" "$T/cat.json" <<'PY' || fail "the market's windows do not count the MTP block on the last window (above)"
import json, sys
cov, plan, cat = (json.load(open(p)) for p in sys.argv[1:4])
w = cov["windows"]; r = plan["ranks"]
assert cov["n_layers"] == 8 and w[0]["layers"][0] == 0 and w[-1]["layers"][1] == 8, ("main pass", cov["n_layers"], w)
assert len(w) == len(r) == 2, ("windows", w, r)
assert [x["layers"] for x in w] == [x["layers"] for x in r], ([x["layers"] for x in w], [x["layers"] for x in r])
assert [x["mem_bytes"] for x in w] == [x["mem_bytes"] for x in r], ([x["mem_bytes"] for x in w], [x["mem_bytes"] for x in r])
tail = sum(t["size"] for t in cat["tensors"] if t["name"].startswith("blk.8.") or t["name"] == "token_embd.weight")
assert r[-1]["mtp_blocks"] == 1 and r[-1]["mtp_mem_bytes"] == tail + 4 * 1024 * 512, (r[-1], tail)
assert "mtp_blocks" not in r[0], r[0]
print("ok   market windows", [x["layers"] for x in w], "bytes", [x["mem_bytes"] for x in w],
      "(last: MTP block + token_embd + K/V %d)" % r[-1]["mtp_mem_bytes"])
PY
finish

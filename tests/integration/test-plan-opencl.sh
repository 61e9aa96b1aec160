#!/bin/bash
# test-plan-opencl: `kvctl profile --backend opencl` measures the OpenCL device (PoCL here)
# besides the CPU and lists both under "backends"; `kvctl plan` places each machine's windows
# on its faster option that holds a layer, and writes that option's name into the manifest
# rank's "backend". A three-machine plan whose middle machine's OpenCL device is the faster
# runs as a real ring (two cpu ranks and one opencl rank: the manifest's backend honoured, no
# --backend given) and gives the one-process greedy tokens. Needs an OpenCL device (PoCL).
. "$(dirname "$0")/../lib/ring_lib.sh"

export KV_CL_CACHE="$TMP/clcache"
clinfo -l 2>/dev/null | grep -q "Device" ||
    fail "no OpenCL device (clinfo -l lists none): install pocl-opencl-icd"
M=$(need_model stories260K.gguf) || exit 1
PY=/usr/bin/python3

# each machine's node key, as `kvctl profile --state-dir` records it (the profile measured is b's)
for name in a b c; do
    mkdir -p "$TMP/node-$name"
    "$KVD" stage --print-key --state-dir "$TMP/node-$name" > "$TMP/node-$name/key" || fail "node key of $name"
done
"$KVCTL" profile --model "$M" --backend opencl --tokens 6 --state-dir "$TMP/node-b" > "$TMP/prof.json" 2> "$TMP/prof.err" ||
    fail "profile --backend opencl: $(cat "$TMP/prof.err")"
$PY - "$TMP/prof.json" <<'PY' || fail "profile: $(cat "$TMP/prof.json")"
import json, sys
d = json.load(open(sys.argv[1]))["devices"][0]
b = {x["backend"]: x for x in d["backends"]}
assert set(b) == {"cpu", "opencl"}, b.keys()
cl = b["opencl"]["opencl"]
assert cl["device"] and cl["platform"], cl
assert cl["global_mem_bytes"] > 0 and 0 < cl["max_alloc_bytes"] <= cl["global_mem_bytes"], cl
assert cl["unified_memory"] is True and cl["weights"] == "map", cl   # PoCL's CPU device
assert b["opencl"]["mem_bytes"] == min(cl["global_mem_bytes"], b["cpu"]["mem_bytes"]), b
assert b["opencl"]["ms_per_layer_token_is"] == "measured" and b["opencl"]["ms_per_layer_token"] > 0, b
assert b["opencl"]["mem_bw_bytes_s"] > 0, b
assert b["opencl"]["max_alloc_bytes"] == cl["max_alloc_bytes"], b
mm = {m["type"]: m for m in cl["matmul"]}
assert "f32" in mm and mm["f32"]["gb_s"] > 0 and mm["f32"]["gflops"] > 0, mm
# the profile's own figures are its faster option's
best = min(b.values(), key=lambda x: x["ms_per_layer_token"])
assert d["backend"] == best["backend"] and d["ms_per_layer_token"] == best["ms_per_layer_token"], d
print("ok   profile: %s (%s), %.2f GB, max alloc %.2f GB, unified, f32 matmul %.2f GB/s; "
      "cpu %.4f vs opencl %.4f ms per layer-token -> %s" % (
      cl["device"], cl["platform"], cl["global_mem_bytes"] / 1e9, cl["max_alloc_bytes"] / 1e9,
      mm["f32"]["gb_s"], b["cpu"]["ms_per_layer_token"], b["opencl"]["ms_per_layer_token"], d["backend"]))
PY

# devs MODE PORTS: three machines from the measured profile, a, b and c on the ports given
# ("P0,P1,P2"; one port P: P, P+1, P+2). MODE fast: b's OpenCL device is
# 10x faster than its CPU; small: and has too little memory for a layer; alloc: and its
# largest allocation cannot hold a layer's K cache; slow: 10x slower.
devs() {
    $PY - "$TMP/prof.json" "$1" "$2" "$TMP" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["devices"][0]
mode, ports = sys.argv[2], [int(x) for x in sys.argv[3].split(",")]
ports = ports if len(ports) == 3 else [ports[0] + i for i in range(3)]
out = []
for i, name in enumerate("abc"):
    d = {"id": name, "mem_bytes": 700000, "ms_per_layer_token": 1,
         "endpoint": "tcp://127.0.0.1:%d" % ports[i],
         "node": open("%s/node-%s/key" % (sys.argv[4], name)).read().strip()}
    assert name != "b" or d["node"] == p["node"], "the profile carries b's key"
    if name == "b":
        cpu = {"backend": "cpu", "mem_bytes": 700000, "ms_per_layer_token": 1}
        cl = dict(next(x for x in p["backends"] if x["backend"] == "opencl"))
        cl["mem_bytes"] = 700000
        cl["ms_per_layer_token"] = {"fast": 0.1, "small": 0.1, "alloc": 0.1, "slow": 10}[mode]
        if mode == "small":
            cl["mem_bytes"] = 1000
        if mode == "alloc":
            cl["max_alloc_bytes"] = 1000
        d["backends"] = [cpu, cl]
    out.append(d)
print(json.dumps({"devices": out}))
PY
}
for mode in slow small alloc fast; do
    devs $mode 1 > "$TMP/devs-$mode.json"
    "$KVCTL" plan --model "$M" --devices "$TMP/devs-$mode.json" --ctx 256 --sessions 2 --headroom 0 \
        -o "$TMP/plan-$mode.json" > "$TMP/plan-$mode.txt" 2>&1 || fail "plan $mode: $(cat "$TMP/plan-$mode.txt")"
    got=$($PY -c 'import json,sys; print(" ".join(r["device"] + ":" + r.get("backend", "cpu") for r in json.load(open(sys.argv[1]))["ranks"]))' "$TMP/plan-$mode.json")
    case $mode in fast) want="a:cpu b:opencl c:cpu" ;; *) want="a:cpu b:cpu c:cpu" ;; esac
    # the order of the ranks is the planner's; which backend each machine got is the point
    [ "$(echo "$got" | tr ' ' '\n' | sort | tr '\n' ' ')" = "$want " ] ||
        fail "plan with b's opencl $mode: ranks '$got', want $want"
    # the printed table's backend column too
    n_cl=$(grep -cE '^[0-9]+ +[a-z]+ +opencl ' "$TMP/plan-$mode.txt")
    [ "$n_cl" = "$([ $mode = fast ] && echo 1 || echo 0)" ] || fail "plan $mode: $n_cl opencl ranks in: $(cat "$TMP/plan-$mode.txt")"
done
echo "ok   plan: b's windows go on its OpenCL device only when it is faster and holds a layer (and its K cache)"

# the fast plan as a real ring, stages started from the manifest alone
want=$("$KVCTL" generate -m "$M" --ids --tokens 1,400,300,200,100 -n 16 --temp 0 --ignore-eos 2>/dev/null)
[ -n "$want" ] || fail "one-process generate"
# each machine's stage on a socket bound before the plan names its port (tests/lib/listen.py
# --wait): it starts, as the rank the plan gives it, once the manifest is written
D=$TMP/ring
mkdir -p "$D"
pids=""
for dev in a b c; do
    "$LISTEN" --wait "$D/go" "$D/port-$dev" 0 -- bash -c '
        r=$(cat "$1/rank-of-$2")
        exec "$3" stage --manifest "$1/ring.json" --rank "$r" --model "$4" --state-dir "$1/rank-$r" -t 1 \
            > "$1/rank-$r/kvd.log" 2>&1' _ "$D" "$dev" "$KVD" "$M" > "$D/launch-$dev.log" 2>&1 &
    pids="$pids $!"
done
at_exit "kill $pids 2>/dev/null"
ports=$(for dev in a b c; do port_of "$D/port-$dev"; done | paste -sd, -)
devs fast "$ports" > "$TMP/devs.json"
"$KVCTL" plan --model "$M" --devices "$TMP/devs.json" --ctx 256 --sessions 2 --headroom 0 \
    -o "$D/ring.json" > "$TMP/plan.txt" 2>&1 || fail "plan: $(cat "$TMP/plan.txt")"
for r in 0 1 2; do
    mkdir -p "$D/rank-$r"
    dev=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1]))["ranks"][int(sys.argv[2])]["device"])' "$D/ring.json" $r)
    cp "$TMP/node-$dev/node.key" "$D/rank-$r/"   # the machine's key: the rank admits only it
    echo "$r" > "$D/rank-of-$dev"
done
touch "$D/go"
wait_for 30 lib_linked "$D" 3
got=$(timeout 120 "$KVCTL" generate --ring "$D" --ids --tokens 1,400,300,200,100 -n 16 --temp 0 \
      --ignore-eos 2> "$TMP/gen.err")
for p in $pids; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
r_cl=$($PY -c 'import json,sys; print([i for i, r in enumerate(json.load(open(sys.argv[1]))["ranks"]) if r.get("backend") == "opencl"][0])' "$D/ring.json")
grep -q "kernel device opencl" "$D/rank-$r_cl/kvd.log" || fail "rank $r_cl does not run on opencl: $(tail -5 "$D/rank-$r_cl/kvd.log")"
[ "$got" = "$want" ] || fail "planned ring with an opencl rank: '$got', one process: '$want' ($(cat "$TMP/gen.err"))"
echo "ok   planned ring (rank $r_cl on opencl) = one CPU process"
finish

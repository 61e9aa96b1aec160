#!/bin/bash
# test-plan-cli: kvctl plan and kvctl profile end to end. The Qwen3.5-122B-A10B example of
# docs/planner.md over the mixed device set (both objectives): a valid manifest, relay
# endpoints with fresh 128-bit bridge ids for the NAT'd phones, no window over a device's
# memory; refusals (no --relay, does not fit, bad profiles); a real GGUF, a catalog and a
# profile measured on this machine feeding a plan; pinning: a profile without the node key and
# a manifest with a rank naming none are refused unless --allow-unpinned (which names the
# ranks), and a stage of such a manifest refuses to link to them unless told so too.
# MTP blocks: the 122B's 49th block is placed on the last rank with its weights (1.57 GB), its
# K/V and a token_embd of its own (474.87 MB; none when that rank is rank 0), and the table and
# the manifest say so; --no-mtp leaves all of it out; the same from a real GGUF with an MTP
# block (kvctl synth --from --nextn 1), its catalog, a stage window of it, and a catalog given --nextn.
. "$(dirname "$0")/../lib/lib.sh"
K=$KVCTL
D=$DATA
check() { if eval "$2"; then echo "ok   $1"; else fail "$1"; fi; }
# made_up_key NAME: a fixed 64-hex-digit key for a device that runs no kvd here
made_up_key() { python3 -c "import hashlib,sys;print(hashlib.sha256(sys.argv[1].encode()).hexdigest())" "$1"; }
need_data "$D/models/stories260K.gguf" "$D/models/synth-qwen35moe-bpe1024-q8_0.gguf"
SHAPE=docs/examples/qwen3.5-122b-a10b.shape.json
DEVS=docs/examples/mixed-devices.json

# A manifest checker: windows, flags, memory, endpoints, relay bridge ids.
cat > "$T/check.py" <<'PY'
import json, re, sys
m = json.load(open(sys.argv[1])); devs = {d["id"]: d for d in json.load(open(sys.argv[2]))["devices"]}
relay = sys.argv[3] if len(sys.argv) > 3 else None
assert m["version"] == 1 and re.fullmatch(r"[0-9a-f]{32}", m["ring"]), "ring id"
n = m["model"]["n_layers"]; j = 0; seen = set(); bridges = set()
assert m["wire"]["dtype"] in ("f32", "f16")
for i, r in enumerate(m["ranks"]):
    a, b = r["layers"]
    assert r["rank"] == i and a == j and b > a, f"rank {i} window {a},{b}"
    assert r["embed"] == (i == 0) and r["head"] == (i == len(m["ranks"]) - 1), f"rank {i} flags"
    d = devs[r["device"]]; assert r["device"] not in seen; seen.add(r["device"])
    assert r["mem_bytes"] <= r["mem_avail_bytes"] <= d["mem_bytes"], f"rank {i} memory"
    ep = r["endpoint"]
    if d.get("inbound", True):
        assert ep.startswith("tcp://"), ep
    else:
        g = re.fullmatch(r"relay://" + re.escape(relay) + r"/b/([0-9a-f]{32})", ep)
        assert g, f"rank {i} endpoint {ep}"
        assert g.group(1) not in bridges; bridges.add(g.group(1))
    j = b
assert j == n, f"covers {j} of {n}"
ex = {e["device"] for e in m["plan"]["excluded"]}
assert ex | seen == set(devs) and not (ex & seen), "used + excluded = devices"
print(len(m["ranks"]), "ranks,", len(bridges), "relay bridges")
PY

# 1. the 122B example, latency and throughput
"$K" plan --model "$SHAPE" --devices "$DEVS" --relay relay.example.org:443 -o "$T/lat.json" > "$T/lat.txt" 2>&1
check "122B latency plan" '[ $? -eq 0 ] && python3 "$T/check.py" "$T/lat.json" "$DEVS" relay.example.org:443'
check "122B latency table" 'grep -q "^0 .*embed" "$T/lat.txt" && grep -q "head" "$T/lat.txt" && grep -q "phone-1: not needed" "$T/lat.txt"'
# the MTP block: on the last rank, with its 1.57 GB, its K/V and the drafter's token_embd
cat > "$T/mtp.py" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); want = sys.argv[2]; low = float(sys.argv[3]) if len(sys.argv) > 3 else 0
r = m["ranks"]; p = m["plan"]
assert m["model"]["n_layers"] == int(sys.argv[4]) if len(sys.argv) > 4 else True
assert r[-1]["layers"][1] == m["model"]["n_layers"], "the windows are the main pass"
assert all("mtp_blocks" not in x for x in r[:-1]), "an MTP block off the last rank"
if want == "placed":
    assert r[-1]["mtp_blocks"] == 1 and p["mtp_blocks"] == 1 and p["mtp_placed"] is True, r[-1]
    assert low <= r[-1]["mtp_mem_bytes"] <= r[-1]["mem_bytes"], (low, r[-1]["mtp_mem_bytes"])
else:
    assert "mtp_blocks" not in r[-1] and "mtp_mem_bytes" not in r[-1], r[-1]
    assert p["mtp_blocks"] == (1 if want == "left out" else 0) and p["mtp_placed"] is False, p
print(len(r) - 1)
PY
R=$(python3 "$T/mtp.py" "$T/lat.json" placed $((1570000000 + 474870000)) 48)
check "122B manifest: 48 main blocks in the windows, the MTP block (1.57 GB) and a token_embd (474.87 MB) on the last rank" '[ -n "$R" ] && [ "$R" -ge 1 ]'
check "122B table: the MTP block placed on the last rank, drafting, with its token_embd" \
    'grep -qF "+ 1 MTP block ([48, 49), 1.57 GB) placed on rank $R with the head (drafting)" "$T/lat.txt" && grep -qF "a token_embd of its own (474.87 MB)" "$T/lat.txt" && grep -qE "^$R .* head mtp" "$T/lat.txt"'
"$K" plan --model "$SHAPE" --devices "$DEVS" --relay relay.example.org:443 --no-mtp -o "$T/nomtp.json" > "$T/nomtp.txt" 2>&1
check "--no-mtp: the block left out, said so, counted nowhere" \
    '[ $? -eq 0 ] && python3 "$T/mtp.py" "$T/nomtp.json" "left out" >/dev/null && grep -qF "+ 1 MTP block ([48, 49), 1.57 GB) left out (--no-mtp)" "$T/nomtp.txt" && ! grep -q " mtp" "$T/nomtp.txt"'
"$K" plan --model "$SHAPE" --devices "$DEVS" --relay relay.example.org:443 --layers > "$T/layers.txt" 2>&1
check "--layers: block 48 is the last rank's drafter, the drafter's token_embd named" \
    'grep -qE "^48 .*MTP: last rank \(drafter\)" "$T/layers.txt" && grep -qF "the drafter'"'"'s token_embd 474.87 MB" "$T/layers.txt"'
# one machine holds it all: rank 0 is the last rank, with token_embd already; two need their own
echo '{"devices":[{"id":"big","mem_bytes":200000000000,"ms_per_layer_token":1,"node":"'$(made_up_key big)'"}]}' > "$T/big1.json"
echo '{"devices":[{"id":"h1","mem_bytes":60000000000,"ms_per_layer_token":1,"node":"'$(made_up_key h1)'"},{"id":"h2","mem_bytes":60000000000,"ms_per_layer_token":1,"node":"'$(made_up_key h2)'"}]}' > "$T/big2.json"
for f in big1 big2; do
    "$K" plan --model "$SHAPE" --devices "$T/$f.json" --json > "$T/$f.out" 2>/dev/null
    "$K" plan --model "$SHAPE" --devices "$T/$f.json" --json --no-mtp > "$T/$f.nomtp" 2>/dev/null
done
check "122B on one and two machines: the MTP block's bytes, K/V and (only off rank 0) token_embd" 'python3 -c "
import json,sys
one,one0,two,two0=(json.load(open(sys.argv[i])) for i in range(1,5))
a=one[\"ranks\"][-1]; a0=one0[\"ranks\"][-1]; b=two[\"ranks\"][-1]
assert len(one[\"ranks\"])==1 and len(two[\"ranks\"])==2, \"rank counts\"
kv=4*4096*2048
assert a[\"mem_bytes\"]-a0[\"mem_bytes\"]==a[\"mtp_mem_bytes\"] and 1.565e9<a[\"mtp_mem_bytes\"]-kv<1.575e9, a
assert abs(b[\"mtp_mem_bytes\"]-a[\"mtp_mem_bytes\"]-474.87e6)<0.01e6, (a,b)
assert a[\"compute_ms\"]>a0[\"compute_ms\"], \"the drafter takes time\"
assert all(\"mtp_blocks\" not in r for r in one0[\"ranks\"]+two0[\"ranks\"])" "$T/big1.out" "$T/big1.nomtp" "$T/big2.out" "$T/big2.nomtp"'
"$K" plan --model "$SHAPE" --devices "$DEVS" --relay relay.example.org:443 --objective throughput --sessions 16 -o "$T/thr.json" > "$T/thr.txt" 2>&1
check "122B throughput plan with relays" '[ $? -eq 0 ] && python3 "$T/check.py" "$T/thr.json" "$DEVS" relay.example.org:443 | grep -qv " 0 relay"'
"$K" plan --model "$SHAPE" --devices "$DEVS" --relay relay.example.org:443 --objective throughput --sessions 16 -o "$T/thr2.json" > /dev/null 2>&1
check "fresh ring and bridge ids per plan" '[ "$(python3 -c "import json,sys;a=json.load(open(sys.argv[1]));b=json.load(open(sys.argv[2]));print(a[\"ring\"]!=b[\"ring\"] and a[\"ranks\"][0][\"endpoint\"]!=b[\"ranks\"][0][\"endpoint\"] or not a[\"ranks\"][0][\"endpoint\"].startswith(\"relay\"))" "$T/thr.json" "$T/thr2.json")" = True ]'

# 2. refusals
"$K" plan --model "$SHAPE" --devices "$DEVS" --objective throughput --sessions 16 -o "$T/x.json" > "$T/norelay.txt" 2>&1
check "relay needed but not given" '[ $? -eq 1 ] && grep -q -- "--relay" "$T/norelay.txt" && [ ! -e "$T/x.json" ]'
python3 -c "import json;d=json.load(open('$DEVS'));d['devices']=[x for x in d['devices'] if x['id'].startswith(('phone','laptop'))];json.dump(d,open('$T/small.json','w'))"
"$K" plan --model "$SHAPE" --devices "$T/small.json" > "$T/nofit.txt" 2>&1
check "does not fit: bytes and layers" '[ $? -eq 1 ] && grep -q "short by [0-9]* bytes" "$T/nofit.txt" && grep -q "layers \[[0-9]*, 48)" "$T/nofit.txt"'
echo '{"devices":[{"id":"a","mem_bytes":-5,"ms_per_layer_token":1}]}' > "$T/bad.json"
"$K" plan --model "$SHAPE" --devices "$T/bad.json" > "$T/bad.txt" 2>&1
check "bad profile named" '[ $? -eq 1 ] && grep -q "mem_bytes" "$T/bad.txt"'
echo '{"devices":[]}' > "$T/empty.json"
"$K" plan --model "$SHAPE" --devices "$T/empty.json" > "$T/empty.txt" 2>&1
check "empty device list" '[ $? -eq 1 ] && grep -q "no devices" "$T/empty.txt"'
echo '{"devices":[{"id":"nomem","mem_bytes":0,"ms_per_layer_token":1}]}' > "$T/zero.json"
"$K" plan --model "$D/models/stories260K.gguf" --devices "$T/zero.json" -o "$T/z.json" > "$T/zero.txt" 2>&1
check "a device with no memory: bytes short, layers, device named" '[ $? -eq 1 ] && grep -q "short by [0-9]* bytes" "$T/zero.txt" && grep -qF "layers [0, 5)" "$T/zero.txt" && grep -q "nomem: mem_bytes is 0" "$T/zero.txt" && [ ! -e "$T/z.json" ]'
echo '{"devices":[{"id":"slowpoke","mem_bytes":1e9}]}' > "$T/nospeed.json"
"$K" plan --model "$D/models/stories260K.gguf" --devices "$T/nospeed.json" > "$T/nospeed.txt" 2>&1
check "a device with no speed: named, and memory is not blamed" '[ $? -eq 1 ] && grep -q "slowpoke: no speed: give ms_per_layer_token" "$T/nospeed.txt" && ! grep -q "short by" "$T/nospeed.txt"'
"$K" plan --model /etc/hostname --devices "$DEVS" > "$T/notmodel.txt" 2>&1
check "neither GGUF nor descriptor: said so" '[ $? -eq 1 ] && grep -q "neither a GGUF file" "$T/notmodel.txt"'

# 3. a real GGUF with a profile measured here
"$K" profile --model "$D/models/stories260K.gguf" -t 1 --id here --endpoint tcp://127.0.0.1:7100 \
    --state-dir "$T/here" > "$T/prof.json" 2> "$T/prof.txt"
check "profile prints a device" '[ $? -eq 0 ] && python3 -c "import json,sys;d=json.load(open(sys.argv[1]))[\"devices\"][0];assert d[\"ms_per_layer_token\"]>0 and d[\"mem_bytes\"]>0 and d[\"backend\"]==\"cpu\" and d[\"ms_per_layer_token_is\"]==\"measured\"" "$T/prof.json"'
python3 -c "
import json; d=json.load(open('$T/prof.json'))['devices'][0]
devs=[]
for i in range(3):
    x=dict(d); x['id']='p%d'%i; x['mem_bytes']=600000; x['endpoint']='tcp://127.0.0.1:%d'%(7100+i)
    x['node']='%064x'%(i+1) if i else d['node']; devs.append(x)
json.dump({'devices':devs},open('$T/three.json','w'))"
"$K" plan --model "$D/models/stories260K.gguf" --devices "$T/three.json" --ctx 256 --sessions 1 --headroom 0 -o "$T/st.json" > "$T/st.txt" 2>&1
check "GGUF plan over measured profiles" '[ $? -eq 0 ] && python3 "$T/check.py" "$T/st.json" "$T/three.json" >/dev/null && [ "$(python3 -c "import json;print(len(json.load(open(\"$T/st.json\"))[\"ranks\"]))")" -ge 2 ]'

# 4. a catalog of a MoE model: experts-used is required, then it plans like the GGUF
"$K" catalog "$D/models/synth-qwen35moe-bpe1024-q8_0.gguf" -o "$T/cat.json" > /dev/null 2>&1
echo '{"devices":[{"id":"one","mem_bytes":100000000,"ms_per_layer_token":1,"node":"'$(made_up_key one)'"}]}' > "$T/one.json"
"$K" plan --catalog "$T/cat.json" --devices "$T/one.json" > "$T/c1.txt" 2>&1
check "catalog MoE needs --experts-used" '[ $? -eq 1 ] && grep -q -- "--experts-used" "$T/c1.txt"'
"$K" plan --catalog "$T/cat.json" --experts-used 2 --devices "$T/one.json" --json > "$T/c2.json" 2>/dev/null
"$K" plan --model "$D/models/synth-qwen35moe-bpe1024-q8_0.gguf" --devices "$T/one.json" --json > "$T/g2.json" 2>/dev/null
check "catalog and GGUF agree" 'python3 -c "
import json,sys
a=json.load(open(sys.argv[1]));b=json.load(open(sys.argv[2]))
assert a[\"model\"][\"catalog\"] and len(a[\"model\"][\"catalog\"])==64
assert [r[\"mem_bytes\"] for r in a[\"ranks\"]]==[r[\"mem_bytes\"] for r in b[\"ranks\"]]
assert abs(a[\"plan\"][\"est_ms_per_token\"]-b[\"plan\"][\"est_ms_per_token\"])<1e-9" "$T/c2.json" "$T/g2.json"'

# 5. a stage mini-GGUF: the blocks outside its window are extrapolated from the ones inside
"$K" slice "$D/models/synth-qwen35moe-bpe1024-q8_0.gguf" --layers 2:5 -o "$T/w25.gguf" > /dev/null 2>&1
"$K" plan --model "$T/w25.gguf" --devices "$T/one.json" --json > "$T/w2.json" 2> "$T/w2.txt"
check "mini-GGUF window plans like its model" '[ $? -eq 0 ] && grep -q "window \[2, 5)" "$T/w2.txt" && python3 -c "
import json,sys
a=json.load(open(sys.argv[1]));b=json.load(open(sys.argv[2]))
assert a[\"model\"][\"n_layers\"]==b[\"model\"][\"n_layers\"]==8
x=a[\"ranks\"][0][\"mem_bytes\"];y=b[\"ranks\"][0][\"mem_bytes\"]
assert abs(x-y)<=0.01*y,(x,y)" "$T/w2.json" "$T/g2.json"'
check "a model without MTP blocks: none placed" 'python3 "$T/mtp.py" "$T/g2.json" none >/dev/null && python3 "$T/mtp.py" "$T/c2.json" none >/dev/null'
"$K" plan --catalog "$T/cat.json" --experts-used 2 --nextn 1 --devices "$T/one.json" --json > "$T/c3.json" 2>/dev/null
check "a catalog with --nextn 1: 7 main blocks, blk.7 on the last rank" 'python3 "$T/mtp.py" "$T/c3.json" placed 1 7 >/dev/null'

# 5b. a real GGUF with an MTP block after its 8 main blocks, its catalog, a stage window of it
"$K" synth --from "$D/models/synth-qwen35moe-bpe1024-q8_0.gguf" --nextn 1 -o "$T/mtp.gguf" > /dev/null 2>&1
"$K" catalog "$T/mtp.gguf" -o "$T/mtp.cat.json" > /dev/null 2>&1
# two 35 MB machines: the model (48 MB with its K/V) needs both, the last keeps its own token_embd
echo '{"devices":[{"id":"m1","mem_bytes":35000000,"ms_per_layer_token":1,"node":"'$(made_up_key m1)'"},{"id":"m2","mem_bytes":35000000,"ms_per_layer_token":1,"node":"'$(made_up_key m2)'"}]}' > "$T/m2.json"
"$K" plan --model "$T/mtp.gguf" --devices "$T/m2.json" --json > "$T/mg.json" 2>/dev/null
"$K" plan --model "$T/mtp.gguf" --devices "$T/m2.json" > "$T/mg.txt" 2>&1
"$K" plan --catalog "$T/mtp.cat.json" --experts-used 2 --devices "$T/m2.json" --json > "$T/mc.json" 2>/dev/null
# what the last rank must hold for it: blk.8.*, K/V of 2 heads x 64 x (K, V) f16 for 4 x 4096 tokens, token_embd
WANT=$(python3 -c "
import json,sys; c=json.load(open(sys.argv[1]))
print(sum(t['size'] for t in c['tensors'] if t['name'].startswith('blk.8.') or t['name']=='token_embd.weight') + 4*4096*512)" "$T/mtp.cat.json")
check "GGUF with an MTP block: 8 main blocks, blk.8, its K/V and a token_embd on the last rank" \
    'python3 "$T/mtp.py" "$T/mg.json" placed "$WANT" 8 >/dev/null && python3 -c "import json,sys;r=json.load(open(sys.argv[1]))[\"ranks\"];assert len(r)==2 and r[-1][\"mtp_mem_bytes\"]==int(sys.argv[2]),r" "$T/mg.json" "$WANT" && grep -qF "+ 1 MTP block ([8, 9)" "$T/mg.txt" && grep -q "placed on rank 1 with the head (drafting)" "$T/mg.txt"'
check "its catalog plans the same" 'python3 "$T/mtp.py" "$T/mc.json" placed "$WANT" 8 >/dev/null && python3 -c "
import json,sys
a=json.load(open(sys.argv[1]));b=json.load(open(sys.argv[2]))
assert [r[\"mem_bytes\"] for r in a[\"ranks\"]]==[r[\"mem_bytes\"] for r in b[\"ranks\"]]" "$T/mc.json" "$T/mg.json"'
# its last window holds the head, the MTP block and token_embd: their real bytes, not guesses
"$K" slice "$T/mtp.gguf" --layers 4:8 -o "$T/mtp48.gguf" > /dev/null 2>&1
"$K" plan --model "$T/mtp48.gguf" --devices "$T/one.json" --json > "$T/mw.json" 2>/dev/null
"$K" plan --model "$T/mtp.gguf" --devices "$T/one.json" --json > "$T/mg1.json" 2>/dev/null
check "its last window plans the MTP block as the whole model does" 'python3 "$T/mtp.py" "$T/mw.json" placed 1 8 >/dev/null && python3 -c "
import json,sys
a=json.load(open(sys.argv[1]))[\"ranks\"][-1];b=json.load(open(sys.argv[2]))[\"ranks\"][-1]
assert a[\"mtp_mem_bytes\"]==b[\"mtp_mem_bytes\"]>0 and abs(a[\"mem_bytes\"]-b[\"mem_bytes\"])<=0.01*b[\"mem_bytes\"],(a,b)" "$T/mw.json" "$T/mg1.json"'

# 6. the manifest names the model so that it runs unedited: name and catalog id both
"$K" catalog "$D/models/stories260K.gguf" -o "$T/st-cat.json" > /dev/null 2>&1
STID=$(python3 -c "import hashlib,sys;print(hashlib.sha256(open(sys.argv[1],'rb').read()).hexdigest())" "$T/st-cat.json")
mid() { python3 -c "import json,sys;m=json.load(open(sys.argv[1]))['model'];print(m['name'],m['catalog'])" "$1"; }
"$K" plan --model "$D/models/stories260K.gguf" --devices "$T/one.json" --json > "$T/id1.json" 2> "$T/id1.txt"
check "--model alone: hashed for the catalog id, name from the GGUF" '[ "$(mid "$T/id1.json")" = "llama $STID" ] && grep -q "hashing" "$T/id1.txt"'
"$K" plan --model "$D/models/stories260K.gguf" --catalog "$T/st-cat.json" --devices "$T/one.json" --json > "$T/id2.json" 2> "$T/id2.txt"
check "--model and --catalog: id from the catalog, not hashed again" '[ "$(mid "$T/id2.json")" = "llama $STID" ] && ! grep -q "hashing" "$T/id2.txt"'
"$K" plan --catalog "$T/st-cat.json" --devices "$T/one.json" --json > "$T/id3.json" 2>/dev/null
check "--catalog alone: ARCH-ID12 name" '[ "$(mid "$T/id3.json")" = "llama-${STID:0:12} $STID" ]'
"$K" plan --catalog "$T/st-cat.json" --name stories --devices "$T/one.json" --json > "$T/id4.json" 2>/dev/null
check "--name sets the name" '[ "$(mid "$T/id4.json")" = "stories $STID" ]'
"$K" plan --model "$D/models/synth-qwen35moe-bpe1024-q8_0.gguf" --catalog "$T/st-cat.json" --devices "$T/one.json" --json > /dev/null 2> "$T/id5.txt"
check "a GGUF that is not the catalog's model is refused, the key named" '[ $? -ne 0 ] && grep -q "is not the model of catalog" "$T/id5.txt" && grep -q "general.architecture" "$T/id5.txt"'
"$K" plan --model "$T/w25.gguf" --devices "$T/one.json" --json > "$T/id6.json" 2> "$T/id6.txt"
check "a window alone: no catalog id, and said so" '[ -z "$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))[\"model\"][\"catalog\"])" "$T/id6.json")" ] && grep -q "stage window" "$T/id6.txt"'

# 7. profile --state-dir: the node key the stage will use, so the manifest admits only it
mkdir -p "$T/node"
"$K" profile --model "$D/models/stories260K.gguf" --estimate --state-dir "$T/node" > "$T/pn.json" 2>/dev/null
KEY=$("$B/kvd" stage --state-dir "$T/node" --print-key 2>/dev/null)
check "profile carries the node key kvd prints" '[ ${#KEY} -eq 64 ] && [ "$(python3 -c "import json,sys;print(json.load(open(sys.argv[1]))[\"devices\"][0][\"node\"])" "$T/pn.json")" = "$KEY" ]'

# 8. pinned unless said otherwise: profile, plan and stage each refuse a rank without a key
"$K" profile --model "$D/models/stories260K.gguf" --estimate > "$T/pu.json" 2> "$T/pu.txt"
check "profile without --state-dir is refused, the reason and the way out named" \
    '[ $? -eq 2 ] && [ ! -s "$T/pu.json" ] && grep -q -- "--state-dir DIR is required" "$T/pu.txt" && grep -q -- "--allow-unpinned" "$T/pu.txt"'
"$K" profile --model "$D/models/stories260K.gguf" --estimate --allow-unpinned > "$T/pu.json" 2>/dev/null
check "profile --allow-unpinned: a profile without a node key" \
    '[ $? -eq 0 ] && python3 -c "import json,sys;d=json.load(open(sys.argv[1]))[\"devices\"][0];assert \"node\" not in d" "$T/pu.json"'
P0=$(free_port); P1=$(free_port)
cat > "$T/mixed.json" <<JSON
{"devices":[{"id":"keyed","mem_bytes":1000000,"ms_per_layer_token":1,"endpoint":"tcp://127.0.0.1:$P0","node":"$KEY"},
 {"id":"bare","mem_bytes":1000000,"ms_per_layer_token":1,"endpoint":"tcp://127.0.0.1:$P1"}]}
JSON
planm() { "$K" plan --model "$D/models/stories260K.gguf" --devices "$T/mixed.json" --ctx 256 --sessions 1 --headroom 0 --max-ranks 2 "$@"; }
planm -o "$T/unpinned.json" > "$T/pl1.txt" 2>&1
check "plan refuses a manifest with a rank naming no key: rank and device named, none written" \
    '[ $? -eq 1 ] && grep -q "rank [01] (device bare) names no node key" "$T/pl1.txt" && grep -q -- "--allow-unpinned" "$T/pl1.txt" && [ ! -e "$T/unpinned.json" ]'
planm --json > "$T/pl2.json" 2> "$T/pl2.txt"
check "plan --json is refused the same way" '[ $? -eq 1 ] && [ ! -s "$T/pl2.json" ] && grep -q "(device bare) names no node key" "$T/pl2.txt"'
planm --allow-unpinned -o "$T/unpinned.json" > "$T/pl3.txt" 2>&1
check "plan --allow-unpinned writes it and names the ranks" \
    '[ $? -eq 0 ] && [ -s "$T/unpinned.json" ] && grep -q "warning (--allow-unpinned): rank [01] (device bare) names no node key" "$T/pl3.txt"'
KR=$(python3 -c "import json,sys;print([r['rank'] for r in json.load(open(sys.argv[1]))['ranks'] if r.get('node')][0])" "$T/unpinned.json")
BR=$((1 - KR))
"$B/kvd" stage --manifest "$T/unpinned.json" --rank "$KR" --model "$D/models/stories260K.gguf" --state-dir "$T/node" > "$T/st1.log" 2>&1
check "a stage whose neighbour names no key refuses to start, naming the rank" \
    '[ $? -ne 0 ] && grep -q "names no node key for rank $BR" "$T/st1.log" && grep -q -- "--allow-unpinned" "$T/st1.log"'
"$B/kvd" stage --manifest "$T/unpinned.json" --rank "$KR" --model "$D/models/stories260K.gguf" --state-dir "$T/node" \
    --allow-unpinned > "$T/st2.log" 2>&1 &
SPID=$!
at_exit "kill $SPID 2>/dev/null"
wait_for 20 grep -q "listening on" "$T/st2.log"
check "with --allow-unpinned it starts and warns, naming the rank" \
    'grep -q "WARN.*--allow-unpinned: .* names no node key for rank $BR" "$T/st2.log" || grep -qi "warn.*--allow-unpinned.*rank $BR" "$T/st2.log"'
kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null
finish

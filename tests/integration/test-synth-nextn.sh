#!/bin/bash
# test-synth-nextn: `kvctl synth --from MODEL --nextn N` on the two Qwen3.5 test models. The
# copy has block_count and nextn_predict_layers one higher; every key but those two and every
# tensor of the model are there with the same SHA-256 (kvctl catalog); the new block holds the
# tensors of the last full-attention layer (same types and shapes) plus the four nextn.*
# tensors; logits and a greedy generation on the copy are the model's, byte for byte; the same
# seed gives the same file, another seed other MTP tensors and nothing else changed; bad
# --nextn values, a missing and a non-GGUF --from, a model without MTP support and a window
# are refused with a message.
. "$(dirname "$0")/../lib/lib.sh"

need_exec "$KVCTL"
CHECK=tests/lib/gguf_strict_check.py
MODELS="synth-qwen35-bpe1024-f16.gguf synth-qwen35moe-bpe1024-q8_0.gguf"

# cmp_catalogs ORIG COPY NEW_BLOCK LIKE_BLOCK N_EMBD MODE: compares two catalog JSONs.
# MODE "mtp": COPY = ORIG + block NEW_BLOCK (the tensors of LIKE_BLOCK, same types and shapes,
# plus nextn.*), metadata equal but block_count / nextn_predict_layers.
# MODE "seed": same tensor set; ORIG's own blocks identical, every tensor of NEW_BLOCK differs.
cmp_catalogs() {
    python3 - "$@" <<'EOF'
import json, sys
orig, copy, new, like, embd, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
a, b = json.load(open(orig)), json.load(open(copy))
ta = {t["name"]: t for t in a["tensors"]}
tb = {t["name"]: t for t in b["tensors"]}
bad = []
newp = "blk.%d." % new
if mode == "mtp":
    for n, t in ta.items():
        u = tb.get(n)
        if u is None:
            bad.append("%s missing from the copy" % n)
        elif (u["sha256"], u["type"], u["shape"], u["size"]) != (t["sha256"], t["type"], t["shape"], t["size"]):
            bad.append("%s differs in the copy" % n)
    extra = sorted(set(tb) - set(ta))
    if any(not n.startswith(newp) for n in extra):
        bad.append("tensors outside %s added: %s" % (newp, [n for n in extra if not n.startswith(newp)]))
    likep = "blk.%d." % like
    want = {newp + n[len(likep):]: (t["type"], t["shape"]) for n, t in ta.items() if n.startswith(likep)}
    want[newp + "nextn.eh_proj.weight"] = (ta[likep + "attn_q.weight"]["type"], [2 * embd, embd])
    for p in ("enorm", "hnorm", "shared_head_norm"):
        want[newp + "nextn.%s.weight" % p] = ("f32", [embd])
    if set(extra) != set(want):
        bad.append("new block holds %s, expected %s" % (sorted(extra), sorted(want)))
    for n, (ty, sh) in want.items():
        if n in tb and (tb[n]["type"], tb[n]["shape"]) != (ty, sh):
            bad.append("%s: %s %s, expected %s %s" % (n, tb[n]["type"], tb[n]["shape"], ty, sh))
    ma = {m["key"]: m["sha256"] for m in a["metadata"]}
    mb = {m["key"]: m["sha256"] for m in b["metadata"]}
    arch = a["arch"]
    changed = {arch + ".block_count", arch + ".nextn_predict_layers"}
    for k, h in ma.items():
        if k not in changed and mb.get(k) != h:
            bad.append("metadata %s not copied as is" % k)
    if set(mb) - set(ma) - changed:
        bad.append("metadata added: %s" % sorted(set(mb) - set(ma) - changed))
    if (b["n_layers"], b["n_main_layers"]) != (a["n_layers"] + 1, a["n_main_layers"]):
        bad.append("catalog layers %d/%d main, expected %d/%d" % (b["n_layers"], b["n_main_layers"],
                   a["n_layers"] + 1, a["n_main_layers"]))
else:
    if set(ta) != set(tb):
        bad.append("tensor sets differ")
    if not any(n.startswith(newp) for n in ta):
        bad.append("no %s tensors" % newp)
    for n, t in ta.items():
        u = tb.get(n)
        if u is None:
            continue
        if n.startswith(newp):
            if u["sha256"] == t["sha256"]:
                bad.append("%s is the same under another seed" % n)
        elif u["sha256"] != t["sha256"]:
            bad.append("%s changed with the seed" % n)
    if a["metadata_sha256"] != b["metadata_sha256"]:
        bad.append("metadata changed with the seed")
for x in bad[:20]:
    print(x)
sys.exit(1 if bad else 0)
EOF
}

check_model() {
    local name=$1 m base c info n_embd out
    m=$(need_model "$name") || return
    base="$T/$(basename "$name" .gguf)"
    c="$base.mtp.gguf"
    out=$("$KVCTL" synth --from "$m" --nextn 1 -o "$c" 2>&1) || { fail "$name: synth --nextn 1: $out"; return; }
    # inspect: 9 blocks, 1 MTP block; the original has 8 and none
    info=$("$KVCTL" inspect "$c") || { fail "$name: inspect of the copy"; return; }
    echo "$info" | grep -q "^  layers  *9$" || fail "$name: copy's block count is not 9: $(echo "$info" | grep layers)"
    echo "$info" | grep -q "^  nextn (MTP) blocks  *1$" || fail "$name: copy's nextn is not 1"
    "$KVCTL" inspect "$m" | grep -q "^  layers  *8$" || fail "$name: the original does not have 8 blocks"
    "$KVCTL" inspect "$m" | grep -q "nextn" && fail "$name: the original already has MTP blocks"
    n_embd=$(echo "$info" | awk '$1 == "embedding" && NF == 2 { print $2 }')
    # every tensor and key of the original, the new block's tensors and shapes
    "$KVCTL" catalog "$m" -o "$base.cat.json" >/dev/null 2>&1 || { fail "$name: catalog"; return; }
    "$KVCTL" catalog "$c" -o "$c.cat.json" >/dev/null 2>&1 || { fail "$name: catalog of the copy"; return; }
    out=$(cmp_catalogs "$base.cat.json" "$c.cat.json" 8 7 "$n_embd" mtp 2>&1) || fail "$name: copy vs original: $out"
    out=$(python3 "$CHECK" "$c" 2>&1) || fail "$name: strict reader: $out"
    # the main pass: teacher-forced logits and a greedy generation, byte for byte
    "$KVCTL" logits -m "$m" --tokens 1,2,3,4,5,6,7,8 -o "$base.a.f32" -t 1 >/dev/null 2>&1 || fail "$name: logits"
    "$KVCTL" logits -m "$c" --tokens 1,2,3,4,5,6,7,8 -o "$base.b.f32" -t 1 >/dev/null 2>&1 || fail "$name: logits of the copy"
    cmp -s "$base.a.f32" "$base.b.f32" || fail "$name: logits of the copy differ from the original's"
    [ -s "$base.a.f32" ] || fail "$name: no logits"
    a=$("$KVCTL" generate -m "$m" --tokens 1,2,3 -n 12 --temp 0 --ids -t 1 2>/dev/null)
    b=$("$KVCTL" generate -m "$c" --tokens 1,2,3 -n 12 --temp 0 --ids -t 1 2>/dev/null)
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "$name: greedy generation differs: '$a' vs '$b'"
    # seeds: the same one (1 is the default) gives the same bytes, another other MTP tensors
    "$KVCTL" synth --from "$m" --nextn 1 --seed 1 -o "$base.s1.gguf" >/dev/null || fail "$name: synth --seed 1"
    cmp -s "$c" "$base.s1.gguf" || fail "$name: --seed 1 (the default) gives other bytes"
    "$KVCTL" synth --from "$m" --nextn 1 --seed 2 -o "$base.s2.gguf" >/dev/null || fail "$name: synth --seed 2"
    "$KVCTL" catalog "$base.s2.gguf" -o "$base.s2.cat.json" >/dev/null 2>&1 || fail "$name: catalog seed 2"
    out=$(cmp_catalogs "$c.cat.json" "$base.s2.cat.json" 8 7 "$n_embd" seed 2>&1) || fail "$name: seed 2: $out"
    rm -f "$base".s*.gguf "$base".*.f32
}

for name in $MODELS; do
    check_model "$name"
done

# more blocks on top: --nextn 2 on the copy gives 11 blocks, 3 of them MTP
m=$(need_model synth-qwen35-bpe1024-f16.gguf) && [ -f "$T/synth-qwen35-bpe1024-f16.mtp.gguf" ] && {
    "$KVCTL" synth --from "$T/synth-qwen35-bpe1024-f16.mtp.gguf" --nextn 2 -o "$T/n3.gguf" >/dev/null ||
        fail "--nextn 2 on a copy"
    info=$("$KVCTL" inspect --tensors "$T/n3.gguf")
    echo "$info" | grep -q "^  layers  *11$" || fail "--nextn 2 on a copy: not 11 blocks"
    echo "$info" | grep -q "^  nextn (MTP) blocks  *3$" || fail "--nextn 2 on a copy: nextn not 3"
    echo "$info" | grep -q "^  blk.10.nextn.eh_proj.weight  *f16  *512x256 " || fail "--nextn 2: blk.10 eh_proj"
    rm -f "$T/n3.gguf"
}

# expect_err WHAT CODE WANT CMD...: exit status CODE, stderr holds WANT, no file written.
expect_err() {
    local what=$1 code=$2 want=$3 rc
    shift 3
    rm -f "$T/x.gguf"
    "$@" > "$T/out" 2> "$T/err"
    rc=$?
    [ $rc -eq "$code" ] || fail "$what: exit $rc, expected $code (stderr: $(cat "$T/err"))"
    grep -qF -- "$want" "$T/err" || fail "$what: stderr lacks '$want': $(cat "$T/err")"
    [ -e "$T/x.gguf" ] && fail "$what: wrote $T/x.gguf"
}
m=$(need_model synth-qwen35-bpe1024-f16.gguf) && {
    expect_err "--nextn 0" 2 "--nextn '0' is not an integer in [1, 4]" \
        "$KVCTL" synth --from "$m" --nextn 0 -o "$T/x.gguf"
    expect_err "--nextn 5" 2 "--nextn '5' is not an integer in [1, 4]" \
        "$KVCTL" synth --from "$m" --nextn 5 -o "$T/x.gguf"
    expect_err "--from without --nextn" 2 "--from MODEL and --nextn N go together" \
        "$KVCTL" synth --from "$m" -o "$T/x.gguf"
    expect_err "--from with --layers" 2 "--layers does not go with --from" \
        "$KVCTL" synth --from "$m" --nextn 1 --layers 3 -o "$T/x.gguf"
    expect_err "missing --from" 1 "kvctl synth: $T/none.gguf: No such file" \
        "$KVCTL" synth --from "$T/none.gguf" --nextn 1 -o "$T/x.gguf"
    head -c 4096 /dev/urandom > "$T/junk.gguf"
    expect_err "non-GGUF --from" 1 "kvctl synth: $T/junk.gguf: magic" \
        "$KVCTL" synth --from "$T/junk.gguf" --nextn 1 -o "$T/x.gguf"
    "$KVCTL" slice "$m" --layers 4:8 -o "$T/w.gguf" >/dev/null || fail "slice"
    expect_err "a window as --from" 1 "a stage window (layers [4, 8)), not a whole model" \
        "$KVCTL" synth --from "$T/w.gguf" --nextn 1 -o "$T/x.gguf"
    cp "$m" "$T/self.gguf"
    expect_err "-o the model itself" 2 "is the --from model itself" \
        "$KVCTL" synth --from "$T/self.gguf" --nextn 1 -o "$T/self.gguf"
    cmp -s "$m" "$T/self.gguf" || fail "-o the model itself: the model changed"
}
m=$(need_model stories260K.gguf) &&
    expect_err "llama --from" 1 "architecture 'llama' has no multi-token-prediction blocks" \
        "$KVCTL" synth --from "$m" --nextn 1 -o "$T/x.gguf"
finish

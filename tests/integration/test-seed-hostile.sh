#!/bin/bash
# What a hostile seeder or a stale file can do to a pull, and what must stop it.
#  1. A window whose one vocabulary piece was changed (no tensor byte moved): kvctl verify,
#     kvctl pull (from the project's seeder serving it, with and without --catalog) and a
#     stage started on it with --catalog all refuse, naming the metadata key; nothing is
#     installed and no .part is left. A version-1 catalog asks for kvctl catalog again.
#  2. A seeder (tests/lib/hostile_seeder.py) that answers a resumed pull with a 206 at the wrong
#     offset or with the wrong total, announces a 300 MB window for a small one, or sends
#     more than it announced: the pull refuses before writing those bytes and leaves no
#     .part; a clean interruption keeps its .part to resume; an honest answer still works.
#  3. A plain range server answering ranges from the wrong offset, short, or with a total
#     that is not the catalog's source size: refused, no .part; an honest one still works.
. "$(dirname "$0")/../lib/lib.sh"
need_exec "$KVCTL" "$KVD"
M=$(need_model stories260K.gguf) || exit 1

"$KVCTL" catalog "$M" -o "$T/cat.json" > /dev/null || die "kvctl catalog"
"$KVCTL" slice "$M" --layers 0:2 -o "$T/w.gguf" > /dev/null || die "kvctl slice"
python3 tests/lib/gguf_tamper.py "$T/w.gguf" "$T/bad.gguf" tokenizer.ggml.tokens 300 ||
    die "tamper with a vocabulary piece"
cmp -s "$T/w.gguf" "$T/bad.gguf" && die "the tampered window is the same file"

# no_part OUT WHAT: neither OUT, OUT.part nor OUT.part.state exists
no_part() {
    local f
    for f in "$1" "$1.part" "$1.part.state"; do
        [ -e "$f" ] && fail "$2: $f left behind"
    done
    return 0
}

# ---- 1. metadata
"$KVCTL" verify "$T/w.gguf" --catalog "$T/cat.json" > "$T/v.ok" 2>&1 || fail "verify of the honest window: $(cat "$T/v.ok")"
if "$KVCTL" verify "$T/bad.gguf" --catalog "$T/cat.json" > "$T/v.bad" 2>&1; then
    fail "kvctl verify accepted a changed vocabulary piece"
fi
grep -q "metadata tokenizer.ggml.tokens: sha256 [0-9a-f]* differs from the catalog's" "$T/v.bad" ||
    fail "kvctl verify does not name the key: $(cat "$T/v.bad")"
echo "ok kvctl verify refuses: $(cat "$T/v.bad")"

python3 - "$T/cat.json" "$T/cat-v1.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["version"] = 1
for k in ("metadata", "metadata_sha256", "n_main_layers"):
    del c[k]
json.dump(c, open(sys.argv[2], "w"))
PY
"$KVCTL" verify "$T/w.gguf" --catalog "$T/cat-v1.json" > "$T/v.v1" 2>&1 && fail "a version-1 catalog was accepted"
grep -q "version 1 does not cover the window's metadata; re-run kvctl catalog" "$T/v.v1" ||
    fail "version-1 catalog message: $(cat "$T/v.v1")"
echo "ok version-1 catalog: $(cat "$T/v.v1")"

"$KVD" seeder --serve "$T/bad.gguf,$T/cat.json" --listen 127.0.0.1:0 --port-file "$T/seeder.port" \
    > "$T/seeder.log" 2>&1 &
PIDS="$PIDS $!"
wait_file "$T/seeder.port" || die "seeder did not start: $(cat "$T/seeder.log")"
SP=$(cat "$T/seeder.port")
for cat_opt in "--catalog $T/cat.json" ""; do
    # shellcheck disable=SC2086
    if "$KVCTL" pull --from "http://127.0.0.1:$SP" --layers 0:2 $cat_opt -o "$T/got.gguf" -q > "$T/p.bad" 2>&1; then
        fail "pull ${cat_opt:-without --catalog} installed a window with a changed vocabulary piece"
    fi
    grep -q "window refused: metadata tokenizer.ggml.tokens: sha256" "$T/p.bad" ||
        fail "pull ${cat_opt:-without --catalog}: $(cat "$T/p.bad")"
    no_part "$T/got.gguf" "pull of a tampered window"
    echo "ok pull ${cat_opt:+--catalog }refuses: $(cat "$T/p.bad")"
done

# The stage: a ring's manifest, rank 0's window with the changed piece, --catalog.
D=$T/ring
"$KVCTL" ring up --dir "$D" --model "$M" --stages 2 > "$T/up" 2>&1 || die "ring up: $(cat "$T/up")"
RINGS="$RINGS $D"
"$KVCTL" ring down --dir "$D" > /dev/null 2>&1
L=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["ranks"][0]["layers"]; print("%d:%d" % (r[0], r[1]))' "$D/ring.json")
"$KVCTL" slice "$M" --layers "$L" -o "$T/r0.gguf" > /dev/null || die "slice rank 0's window"
python3 tests/lib/gguf_tamper.py "$T/r0.gguf" "$T/r0-bad.gguf" tokenizer.ggml.tokens 300 > /dev/null || die "tamper"
timeout 30 "$KVD" stage --manifest "$D/ring.json" --rank 0 --window "$T/r0-bad.gguf" --catalog "$D/catalog.json" \
    --state-dir "$D/rank-0" > "$T/stage.log" 2>&1
rc=$?
[ $rc = 0 ] || [ $rc = 124 ] && fail "the stage ran on a window with a changed vocabulary piece (rc $rc)"
grep -q "window does not match catalog .*: metadata tokenizer.ggml.tokens: sha256" "$T/stage.log" ||
    fail "the stage does not name the key: $(tail -n 3 "$T/stage.log")"
echo "ok the stage refuses: $(grep -o 'window does not match.*' "$T/stage.log" | head -c 200)"

# ---- 2. a hostile seeder; 3. a hostile range server
# hs MODE: tests/lib/hostile_seeder.py (one server for the whole test) answers in MODE from now
hs() {
    echo "$1" > "$T/hs.mode"
    if [ -z "${HP:-}" ]; then
        python3 tests/lib/hostile_seeder.py "$T/hs.mode" "$T/hs.port" "$T/cat.json" "$T/w.gguf" "$M" 2> "$T/hs.log" &
        PIDS="$PIDS $!"
        wait_file "$T/hs.port" || die "hostile seeder did not start: $(cat "$T/hs.log")"
        HP=$(cat "$T/hs.port")
    fi
}
# refused MODE URL_PATH EXPECT: the pull fails saying EXPECT, nothing is left behind
refused() {
    hs "$1"
    if "$KVCTL" pull --from "http://127.0.0.1:$HP$2" --layers 0:2 --catalog "$T/cat.json" -o "$T/h.gguf" -q \
        > "$T/h.out" 2>&1; then
        fail "$1: pull succeeded"
    fi
    grep -q -- "$3" "$T/h.out" || fail "$1: '$(cat "$T/h.out")' lacks '$3'"
    no_part "$T/h.gguf" "$1"
    echo "ok $1 refused: $(head -c 220 "$T/h.out")"
}
# interrupted: a clean interruption from the seeder keeps the part (and its state) to resume
interrupted() {
    hs cut
    "$KVCTL" pull --from "http://127.0.0.1:$HP" --layers 0:2 --catalog "$T/cat.json" -o "$T/h.gguf" -q \
        > "$T/h.out" 2>&1 && fail "cut: pull succeeded"
    grep -q "run again to resume" "$T/h.out" || fail "cut: $(cat "$T/h.out")"
    [ -s "$T/h.gguf.part" ] && [ -s "$T/h.gguf.part.state" ] || fail "cut: the interrupted part was not kept"
    [ -e "$T/h.gguf" ] && fail "cut: a window was installed"
    return 0
}
WSIZE=$(stat -c %s "$T/w.gguf")
interrupted
refused wrong-offset "" "answered bytes 0-[0-9]*/$WSIZE to a request for [1-9][0-9]*-$((WSIZE - 1))"
interrupted
refused wrong-total "" "Content-Range total $((WSIZE + 1000)) is not the window's $WSIZE bytes"
refused huge-head "" "314572800 bytes announced; the catalog's window \[0, 2) has"
refused over-send "" "more than the $WSIZE bytes announced"
refused plain-offset /model.gguf "answered bytes 0-"
refused plain-short /model.gguf "answered bytes [0-9]*-[0-9]*/[0-9]* to a request for"
refused plain-total /model.gguf "the catalog's source is $(stat -c %s "$M")"
for how in "" /model.gguf; do
    hs ok
    rm -f "$T/h.gguf"
    "$KVCTL" pull --from "http://127.0.0.1:$HP$how" --layers 0:2 --catalog "$T/cat.json" -o "$T/h.gguf" -q \
        > "$T/h.out" 2>&1 || fail "honest ${how:-seeder}: $(cat "$T/h.out")"
    cmp -s "$T/h.gguf" "$T/w.gguf" || fail "honest ${how:-seeder}: not the window kvctl slice writes"
    echo "ok honest ${how:-seeder} pull is byte-identical"
done
# a clean interruption still resumes to the same window
rm -f "$T/h.gguf"
interrupted
hs ok
"$KVCTL" pull --from "http://127.0.0.1:$HP" --layers 0:2 --catalog "$T/cat.json" -o "$T/h.gguf" > "$T/h.out" 2>&1 ||
    fail "resume: $(cat "$T/h.out")"
grep -q "resuming at" "$T/h.out" || fail "resume: did not resume: $(cat "$T/h.out")"
cmp -s "$T/h.gguf" "$T/w.gguf" || fail "resume: not the window"
echo "ok an interrupted pull resumes byte-identical"

finish

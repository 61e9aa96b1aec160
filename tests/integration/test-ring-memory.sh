#!/bin/bash
# Memory: a stage maps and keeps resident only its window. A 4-stage ring over a synthetic
# 16-layer Q8_0 model (~69 MiB, made by kvctl synth): after a generation has touched every
# weight, each stage's resident pages of the model file are at most its window's bytes (not
# the model's), and its whole resident set is the window plus KV plus a small fixed overhead.
# Where the cpu device repacks Q8_0 (AVX2 / AVX-512), the matrices live in its own copy and
# their file pages are dropped: the window is resident once, as that copy (anonymous memory).
. "$(dirname "$0")/../lib/ring_lib.sh"

M=$TMP/big.gguf
"$KVCTL" synth --arch llama --layers 16 --embd 512 --ff 2048 --heads 8 --vocab 512 --type q8_0 \
    --ctx 256 -o "$M" > /dev/null || fail "kvctl synth"
size=$(stat -c %s "$M")
# Fixed overhead allowed per process (binary, libraries, scratch): more under ASan's shadow.
case "$B" in *asan*) OVH=$((100 * 1048576)) ;; *) OVH=$((40 * 1048576)) ;; esac
D=$TMP/ring
ring_up "$D" --model "$M" --stages 4
"$KVCTL" generate --ring "$D" --ids --tokens 1,2,3 -n 8 --temp 0 > /dev/null 2>&1 || fail "generate"
"$KVCTL" status --ring "$D" --json > "$TMP/status" || fail "status"
# the cpu device repacks Q8_0 at the AVX2 and AVX-512 levels (unless KV_KERN_SIMD=scalar)
repack=0
grep -qw avx2 /proc/cpuinfo && grep -qw fma /proc/cpuinfo && grep -qw f16c /proc/cpuinfo &&
    [ "${KV_KERN_SIMD:-}" != scalar ] && repack=1
total=0
for r in 0 1 2 3; do
    pid=$(rank_pid "$D" $r)
    wb=$(sed -n "$((r + 1))p" "$TMP/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["weight_bytes"])')
    # resident kB of the model file's mappings, and of the whole process
    mrss=$(awk -v f="$M" '$0 ~ /^[0-9a-f]+-[0-9a-f]+ / {on = ($6 == f); next} on && /^Rss:/ {s += $2} END {print s + 0}' /proc/$pid/smaps)
    rss=$(awk '/^VmRSS:/ {print $2}' /proc/$pid/status)
    anon=$(awk '/^RssAnon:/ {print $2}' /proc/$pid/status)
    mapped=$(python3 -c 'import sys
s = 0
for l in open("/proc/%s/maps" % sys.argv[1]):
    f = l.split()
    if len(f) >= 6 and f[5] == sys.argv[2]:
        a, b = f[0].split("-"); s += int(b, 16) - int(a, 16)
print(s)' $pid "$M")
    echo "rank $r: window $wb bytes, mapped $mapped bytes, model pages resident ${mrss} kB, process ${rss} kB, anonymous ${anon} kB (model $size bytes)"
    [ $wb -gt 0 ] || fail "rank $r: no weight bytes in status"
    [ $mapped -le $((wb + wb / 20 + 1048576)) ] || fail "rank $r maps $mapped bytes of the file for a $wb-byte window"
    [ $((mrss * 1024)) -le $((wb + wb / 20 + 1048576)) ] || fail "rank $r keeps ${mrss} kB of the model resident for a $wb-byte window"
    if [ "$repack" = 1 ]; then
        [ $((mrss * 1024)) -le $((wb / 4)) ] || fail "rank $r: ${mrss} kB of the model file resident besides the repacked copy of a $wb-byte window"
        [ $(((mrss + anon) * 1024)) -ge $((wb * 9 / 10)) ] || fail "rank $r: only ${mrss} + ${anon} kB resident: did the generation touch the window?"
    else
        [ $((mrss * 1024)) -ge $((wb / 2)) ] || fail "rank $r: only ${mrss} kB resident: did the generation touch the window?"
    fi
    [ $((rss * 1024)) -le $((wb + OVH)) ] || fail "rank $r: resident ${rss} kB > window + $((OVH / 1048576)) MiB"
    [ $((mrss * 1024)) -lt $((size * 35 / 100)) ] || fail "rank $r: ${mrss} kB of the model resident, not well below its $size bytes"
    total=$((total + mapped))
done
[ $total -le $((size + 4 * 1048576)) ] || fail "the stages together map $total bytes of a $size-byte model"
echo PASS

#!/bin/bash
# Host memory on an OpenCL device that shares it (PoCL's CPU device reports
# CL_DEVICE_HOST_UNIFIED_MEMORY, as phones and integrated GPUs do): with weights "map" (the
# default there) a stage wraps the mapped file in place and holds its window once; with
# "copy" it uploads, and the window is resident twice (the file's pages the upload read, and
# the device's copy). A one-rank ring over a synthetic 8-layer Q8_0 model (~61 MB): `kvctl
# ring up` with the default maps; then its stage is started by hand in each mode
# (`kvd stage --cl-weights`, no --catalog: the catalog check drops the file's pages after
# hashing them, which would hide the copy's second window after load) and, after a
# generation, its status says which was used and its anonymous memory plus the file's
# resident pages are about one window mapped and two copied. Both generate the same tokens;
# `kvctl logits` gives bit-identical logits either way; another word is refused. Needs an
# OpenCL device (pocl-opencl-icd).
. "$(dirname "$0")/../lib/ring_lib.sh"

export KV_CL_CACHE="$TMP/clcache"
clinfo -l 2>/dev/null | grep -q "Device" ||
    fail "no OpenCL device (clinfo -l lists none): install pocl-opencl-icd"
M=$TMP/w.gguf
"$KVCTL" synth --arch llama --layers 8 --embd 768 --ff 2048 --heads 8 --vocab 512 --type q8_0 \
    --ctx 256 -o "$M" > /dev/null || fail "kvctl synth"

declare -A OUT WIN
d=$TMP/ring
ring_up "$d" --model "$M" --stages 1 --backends opencl -t 1
OUT[auto]=$("$KVCTL" generate --ring "$d" --ids --tokens 1,2,3 -n 4 --temp 0 --ignore-eos 2>"$TMP/err") ||
    fail "generate: $(cat "$TMP/err")"
"$KVCTL" status --ring "$d" --json | grep -q '"cl_weights":[[:space:]]*"map"' ||
    fail "the default on PoCL is not map: $("$KVCTL" status --ring "$d" --json)"
ring_down "$d"
for mode in map copy; do
    "$KVD" stage --manifest "$d/ring.json" --rank 0 --model "$M" --state-dir "$d/rank-0" -t 1 \
        --cl-weights $mode > "$TMP/kvd-$mode.log" 2>&1 &
    pid=$!
    EXTRA_PIDS="$EXTRA_PIDS $pid"
    wait_for 60 lib_linked "$d" 1 || fail "$mode: the stage did not link: $(tail -5 "$TMP/kvd-$mode.log")"
    OUT[$mode]=$("$KVCTL" generate --ring "$d" --ids --tokens 1,2,3 -n 4 --temp 0 --ignore-eos 2>"$TMP/err") ||
        fail "$mode: generate: $(cat "$TMP/err")"
    "$KVCTL" status --ring "$d" --json > "$TMP/status-$mode" || fail "$mode: status"
    mrss=$(awk -v f="$M" '$0 ~ /^[0-9a-f]+-[0-9a-f]+ / {on = ($6 == f); next} on && /^Rss:/ {s += $2} END {print s + 0}' /proc/$pid/smaps)
    anon=$(awk '/^RssAnon:/ {print $2}' /proc/$pid/status)
    rss=$(awk '/^VmRSS:/ {print $2}' /proc/$pid/status)
    read -r wb used mapped copied < <(python3 -c 'import json,sys
s = json.load(open(sys.argv[1]))
print(s["weight_bytes"], s["cl_weights"], s["cl_weights_mapped_bytes"], s["cl_weights_copied_bytes"])' "$TMP/status-$mode")
    echo "$mode: window $wb bytes; status: weights $used, $mapped bytes mapped, $copied copied;" \
         "resident ${rss} kB: ${anon} kB anonymous, ${mrss} kB the model file's pages"
    [ "$used" = "$mode" ] || fail "$mode: the stage says its weights are '$used'"
    if [ $mode = map ]; then
        [ "$copied" = 0 ] && [ "$mapped" -ge "$wb" ] || fail "map: $mapped bytes mapped, $copied copied of $wb"
    else
        [ "$mapped" = 0 ] && [ "$copied" -ge "$wb" ] || fail "copy: $mapped bytes mapped, $copied copied of $wb"
    fi
    # the device read the window from the file's pages (map) or the upload did (copy)
    [ $((mrss * 1024)) -ge $((wb * 9 / 10)) ] || fail "$mode: only ${mrss} kB of the file resident for a $wb-byte window"
    WIN[$mode]=$((anon + mrss))
    kill $pid
    wait $pid 2>/dev/null
done
# the copy holds the window a second time (anonymous memory); mapping does not. What else is
# anonymous (KV cache, scratch, the runtime's heap, compiled kernels) is the same in both.
# (Under ASan the runtime's copy is a malloc with ASan's shadow and redzones: up to half more.)
extra=$(( (WIN[copy] - WIN[map]) * 1024 ))
echo "anonymous + file pages: map ${WIN[map]} kB, copy ${WIN[copy]} kB: the copy $extra bytes more (window $wb)"
case "$B" in *asan*) most=$((wb * 3 / 2)) ;; *) most=$((wb * 11 / 10)) ;; esac
[ $extra -ge $((wb * 9 / 10)) ] && [ $extra -le $most ] ||
    fail "copy holds $extra bytes more than map for a $wb-byte window (want about one window)"
# mapped: the window once plus the runtime's fixed anonymous memory (PoCL's heap and compiled
# kernels, the KV cache and scratch: about 40 MB here; more under ASan's shadow)
case "$B" in *asan*) OVH=$((240 * 1048576)) ;; *) OVH=$((64 * 1048576)) ;; esac
[ $((WIN[map] * 1024)) -le $((wb + OVH)) ] ||
    fail "map: ${WIN[map]} kB anonymous + file pages for a $wb-byte window: not about once"
[ "${OUT[map]}" = "${OUT[copy]}" ] && [ "${OUT[map]}" = "${OUT[auto]}" ] ||
    fail "map generates '${OUT[map]}', copy '${OUT[copy]}', the default '${OUT[auto]}'"
echo "ok   map and copy generate the same tokens: ${OUT[map]}"
for mode in map copy; do
    "$KVCTL" logits -m "$M" --tokens 1,2,3,4 -o "$TMP/l-$mode.f32" --backend opencl --cl-weights $mode \
        > /dev/null 2> "$TMP/l-$mode.err" || fail "logits $mode: $(cat "$TMP/l-$mode.err")"
    grep -q "weights $mode (" "$TMP/l-$mode.err" || fail "logits $mode: $(cat "$TMP/l-$mode.err")"
done
cmp -s "$TMP/l-map.f32" "$TMP/l-copy.f32" || fail "logits differ between map and copy"
echo "ok   logits bit-identical mapped and copied"
"$KVD" stage --manifest "$d/ring.json" --rank 0 --model "$M" --backend opencl \
    --cl-weights mmap > "$TMP/bad.log" 2>&1 && fail "kvd stage took --cl-weights mmap"
grep -q -- "--cl-weights" "$TMP/bad.log" || fail "--cl-weights mmap: $(cat "$TMP/bad.log")"
"$KVCTL" logits -m "$M" --tokens 1 -o "$TMP/x.f32" --backend opencl --cl-weights mmap > /dev/null 2> "$TMP/bad2" &&
    fail "kvctl logits took --cl-weights mmap"
grep -q "map, copy or auto" "$TMP/bad2" || fail "kvctl --cl-weights mmap: $(cat "$TMP/bad2")"
echo "ok   --cl-weights refuses another word"
finish

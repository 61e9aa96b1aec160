#!/bin/bash
# test-net-slowreader.sh — clients that ask for a window and never read cannot pin the
# seeder's memory or its connections. The attacker (tests/lib/http_attack.py, from 127.0.0.2)
# asks for an 18 MB window many times, half of them zstd-encoded, with a tiny receive buffer,
# and reads nothing. The seeder must drop each within its write-stall deadline, hold little
# heap while they wait (read from /proc: RssAnon, the mapped model excluded), compress at
# most --max-zstd responses at once (the others go unencoded), and serve a legitimate client
# (identity and zstd, byte-identical) during the attack and after it.
. "$(dirname "$0")/../lib/lib.sh"
need_exec "$KVD"
M=$(need_model synth-qwen35moe-bpe1024-q8_0.gguf) || exit 1
A="python3 tests/lib/http_attack.py"
check() { local out; out=$($A check "$@") || fail "$out"; }
# ASan's quarantine keeps freed memory (256 MB by default), which would hide what the
# target really holds: keep it small so the heap figures below mean the same there.
case "$B" in *asan*) export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}quarantine_size_mb=1" ;; esac

"$KVD" seeder --serve "$M" --listen 127.0.0.1:0 --port-file "$T/seed.port" --write-timeout 1500 \
    --max-zstd 2 2> "$T/seeder.log" &
SPID=$!
PIDS="$PIDS $SPID"
wait_file "$T/seed.port" || die "seeder did not start: $(cat "$T/seeder.log")"
SP=$(cat "$T/seed.port")
U="http://127.0.0.1:$SP"
ID=$(curl -s "$U/v1/models" | sed -n 's/.*"id":"\([0-9a-f]*\)".*/\1/p')
[ -n "$ID" ] || die "no model id from $U/v1/models"
W="/v1/windows/$ID/0-8"
curl -s -o "$T/ref.bin" "$U$W" || die "reference download failed"
REF=$(sha256sum < "$T/ref.bin")
legit() { # legit TAG: identity and zstd downloads, both byte-identical to the reference
    curl -s --max-time 30 -o "$T/$1.id" "$U$W" &&
        curl -s --max-time 30 --compressed -o "$T/$1.zst" "$U$W" &&
        [ "$(sha256sum < "$T/$1.id")" = "$REF" ] && [ "$(sha256sum < "$T/$1.zst")" = "$REF" ]
}
# the baseline: the heap after one compressed transfer (the zstd context pool is warm)
legit warm || fail "legitimate downloads before the attack differ from the reference"
base=$($A rss --pid "$SPID" --field RssAnon)

$A noread --port "$SP" --src 127.0.0.2 -n 12 --zstd --path "$W" --hold 1.0 --after 2.5 \
    --pid "$SPID" --stats "$U/v1/seeder/stats" \
    --until 'd["timeouts"]["write"] >= 12 and d["conns_open"] <= 3' > "$T/zstd.json" &
ap=$!
sleep 0.5
legit during || fail "legitimate downloads during the attack failed or differ"
wait $ap
echo "12 zstd readers that never read (heap before: $base KiB): $(cat "$T/zstd.json")"
check "$T/zstd.json" \
    'd["stats_after"]["timeouts"]["write"] >= 12 and d["stats_after"]["conns_open"] <= 3' \
    "not every non-reading client was dropped by the write-stall deadline" \
    "d['anon_kib_while_held'] - $base < 8 * 1024" "non-reading clients pinned more than 8 MiB of heap"

$A noread --port "$SP" --src 127.0.0.2 -n 4 --path "$W" --hold 0.5 --after 2.5 \
    --stats "$U/v1/seeder/stats" --until 'd["timeouts"]["write"] >= 16 and d["conns_open"] <= 1' > "$T/id.json"
echo "4 identity readers that never read: $(cat "$T/id.json")"
check "$T/id.json" 'd["stats_after"]["timeouts"]["write"] >= 16 and d["stats_after"]["conns_open"] <= 1' \
    "a non-reading identity client was not dropped"

legit after || fail "legitimate downloads after the attack failed or differ"
curl -s "$U/v1/seeder/stats" > "$T/stats.json"
echo "seeder stats: $(cat "$T/stats.json")"
check "$T/stats.json" \
    'd["timeouts"]["write"] >= 16' "write-stall drops not counted" \
    'd["zstd_declined"] >= 8' "more than --max-zstd responses were compressed at once" \
    'd["zstd_active"] == 0 and d["queued_bytes"] == 0' "compressions or queued bytes left after the attack" \
    'd["conns_open"] <= 1' "connections left open after the attack"
grep -q "dropped: .* bytes queued and none taken" "$T/seeder.log" || fail "slow readers not logged"
finish

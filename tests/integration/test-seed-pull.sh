#!/bin/bash
# test-seed-pull.sh — windows that travel, end to end with real servers:
#  * a kvd seeder and a Debian nginx (own config and prefix in a tmp dir, random port)
#    serving the shared test models;
#  * `kvctl pull` from each is byte-identical to `kvctl slice` and passes `kvctl verify`;
#  * bytes moved for a 1-layer window (nginx $body_bytes_sent, the seeder's counters) stay
#    within 1% + header of the window, not the model;
#  * a transfer cut by killing the server mid-way resumes byte-identical (seeder and nginx);
#  * a corrupted byte at the source fails the pull naming the tensor, nothing at -o;
#  * hostile requests get 4xx and the seeder stays up;
#  * a 2-stage ring whose stages pull their windows (--window-from, seeder and nginx) gives
#    the tokens of `kvctl generate -m` on the full file;
#  * a model with an MTP block (kvctl synth --from --nextn 1): its last window, pulled from either, carries
#    the block and a token_embd for the drafter, byte-identical to the slice and verified; a
#    middle window neither.
. "$(dirname "$0")/../lib/lib.sh"
M=$DATA/models/synth-qwen35moe-bpe1024-q8_0.gguf   # 8 layers, ~18 MB
S=$DATA/models/stories260K.gguf                     # trained llama, for tokens
need_data "$M" "$S"
MTP=$T/mtp.gguf                                     # M with an MTP block: 8 main blocks + blk.8
"$KVCTL" synth --from "$M" --nextn 1 -o "$MTP" > /dev/null || { echo "FAIL: kvctl synth --from --nextn 1"; exit 1; }
NGINX=$(command -v nginx || echo /usr/sbin/nginx)
[ -x "$NGINX" ] || { echo "FAIL: nginx not installed (scripts/setup.sh installs it)"; exit 1; }

KEEP_FAILED_TMP=1
SEED_PID=""
seed_cleanup() {
    [ -n "$SEED_PID" ] && kill "$SEED_PID" 2>/dev/null
    [ -f "$T/nginx/nginx.pid" ] && kill "$(cat "$T/nginx/nginx.pid")" 2>/dev/null
    [ -d "$T/ring" ] && ring_down "$T/ring"
    [ -d "$T/ring2" ] && ring_down "$T/ring2"
    wait 2>/dev/null
}
at_exit seed_cleanup
check() { # check "what" command...
    local what=$1; shift
    if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}

# ---- servers
mkdir -p "$T/www" "$T/nginx/logs" "$T/nginx/tmp"
ln -s "$(readlink -f "$M")" "$T/www/model.gguf"
ln -s "$(readlink -f "$S")" "$T/www/stories.gguf"
ln -s "$MTP" "$T/www/mtp.gguf"
cp "$M" "$T/www/bad.gguf"
NPORT=$(free_port)
TPORT=$(free_port)
# the TLS server block needs its files before nginx starts
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 -subj /CN=127.0.0.1 \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$T/nginx/key.pem" -out "$T/nginx/cert.pem" >/dev/null 2>&1
USER_LINE=""
[ "$(id -u)" = 0 ] && USER_LINE="user root;"
write_nginx_conf() { # [limit_rate directive]
cat > "$T/nginx/nginx.conf" <<EOF
$USER_LINE
worker_processes 1;
pid $T/nginx/nginx.pid;
error_log $T/nginx/logs/error.log;
events { worker_connections 64; }
http {
    log_format bytes '\$request_method \$uri \$status \$body_bytes_sent "\$http_range"';
    access_log $T/nginx/logs/access.log bytes;
    client_body_temp_path $T/nginx/tmp/body;
    proxy_temp_path $T/nginx/tmp/proxy;
    fastcgi_temp_path $T/nginx/tmp/fastcgi;
    uwsgi_temp_path $T/nginx/tmp/uwsgi;
    scgi_temp_path $T/nginx/tmp/scgi;
    types { application/octet-stream gguf; }
    server {
        listen 127.0.0.1:$NPORT;
        root $T/www;
        ${1:-}
    }
    server {
        listen 127.0.0.1:$TPORT ssl;
        ssl_certificate $T/nginx/cert.pem;
        ssl_certificate_key $T/nginx/key.pem;
        root $T/www;
    }
}
EOF
}
write_nginx_conf
start_nginx() { "$NGINX" -p "$T/nginx" -c "$T/nginx/nginx.conf" 2>>"$T/nginx/logs/start.log"; }
stop_nginx() { # until the master is gone and its ports free for the next start
    local p
    p=$(cat "$T/nginx/nginx.pid" 2>/dev/null) || return 0
    kill "$p" 2>/dev/null
    wait_for 10 pid_gone $p || { echo "FAIL: nginx $p did not stop"; fails=$((fails + 1)); }
}
start_nginx || { echo "FAIL: nginx did not start"; cat "$T/nginx/logs/"*; exit 1; }

SPORT=0
start_seeder() { # [extra options]: on a free port, then again on the same one
    rm -f "$T/seeder.port"
    "$LISTEN" "$T/seeder.port" "$SPORT" -- \
        "$KVD" seeder --serve "$M" --serve "$S" --serve "$MTP" --listen "127.0.0.1:{PORT}" "$@" >>"$T/seeder.log" 2>&1 &
    SEED_PID=$!
    SPORT=$(port_of "$T/seeder.port") || { echo "FAIL: the seeder's launcher failed"; cat "$T/seeder.log"; exit 1; }
    for _ in $(seq 100); do
        curl -sf "http://127.0.0.1:$SPORT/v1/models" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    echo "FAIL: seeder did not start"; cat "$T/seeder.log"; exit 1
}
start_seeder
SEEDER=http://127.0.0.1:$SPORT
NGX=http://127.0.0.1:$NPORT
for _ in $(seq 50); do curl -sf -o /dev/null -r 0-0 "$NGX/model.gguf" && break; sleep 0.1; done

# ---- references
"$KVCTL" catalog "$M" -o "$T/m.cat.json" >"$T/m.id" || { echo "FAIL: kvctl catalog"; exit 1; }
"$KVCTL" catalog "$S" -o "$T/s.cat.json" >"$T/s.id" || { echo "FAIL: kvctl catalog"; exit 1; }
for w in 3:4 0:8 5:8; do
    "$KVCTL" slice "$M" --layers $w -o "$T/ref-${w/:/-}.gguf" >/dev/null || { echo "FAIL: slice"; exit 1; }
done

# ---- byte identity, seeder and nginx
for w in 3:4 5:8; do
    n=${w/:/-}
    check "seeder pull $w" "$KVCTL" pull -q --from "$SEEDER" --layers $w --catalog "$T/m.cat.json" -o "$T/s-$n.gguf"
    check "seeder $w identical to slice" cmp -s "$T/s-$n.gguf" "$T/ref-$n.gguf"
    check "nginx pull $w" "$KVCTL" pull -q --from "$NGX/model.gguf" --layers $w --catalog "$T/m.cat.json" -o "$T/n-$n.gguf"
    check "nginx $w identical to slice" cmp -s "$T/n-$n.gguf" "$T/ref-$n.gguf"
    check "kvctl verify $w" "$KVCTL" verify "$T/n-$n.gguf" --catalog "$T/m.cat.json"
done
check "zstd pull from the seeder identical" bash -c "'$KVCTL' pull -q --zstd --from '$SEEDER' --layers 3:4 --catalog '$T/m.cat.json' -o '$T/z.gguf' && cmp -s '$T/z.gguf' '$T/ref-3-4.gguf'"

# ---- HTTPS: the same pull from nginx over TLS (self-signed certificate, --cacert)
if [ -s "$T/nginx/cert.pem" ]; then
    check "https pull 3:4 identical" bash -c "'$KVCTL' pull -q --cacert '$T/nginx/cert.pem' --from 'https://127.0.0.1:$TPORT/model.gguf' --layers 3:4 --catalog '$T/m.cat.json' -o '$T/tls.gguf' && cmp -s '$T/tls.gguf' '$T/ref-3-4.gguf'"
    "$KVCTL" pull -q --from "https://127.0.0.1:$TPORT/model.gguf" --layers 3:4 -o "$T/tls2.gguf" 2>"$T/tls2.err"
    check "https with an untrusted certificate is refused" test $? -ne 0 -a ! -e "$T/tls2.gguf"
else
    echo "FAIL: openssl could not make a test certificate"; fails=$((fails + 1))
fi
# a seeder serving two models needs to be told which one
"$KVCTL" pull -q --from "$SEEDER" --layers 0:1 -o "$T/two.gguf" 2>"$T/two.err"
check "two models served: pull asks for one ($(head -c 80 "$T/two.err"))" grep -q "choose one with --model" "$T/two.err"
check "--model picks it" "$KVCTL" pull -q --from "$SEEDER" --model "$(cat "$T/s.id")" --layers 0:1 -o "$T/two.gguf"

# ---- a model with an MTP block: the last window carries it and the drafter's token_embd
"$KVCTL" catalog "$MTP" -o "$T/mtp.cat.json" >/dev/null || { echo "FAIL: kvctl catalog (MTP)"; exit 1; }
tail_n=$(python3 -c "import json,sys;print(sum(t['name'].startswith('blk.8.') or t['name']=='token_embd.weight' for t in json.load(open(sys.argv[1]))['tensors']))" "$T/mtp.cat.json")
for w in 5:8 5:9 3:5; do
    n=mtp-${w/:/-}
    "$KVCTL" slice "$MTP" --layers $w -o "$T/ref-$n.gguf" >/dev/null || { echo "FAIL: slice MTP $w"; exit 1; }
    check "seeder pull of the MTP model's $w identical to slice" bash -c "'$KVCTL' pull -q --from '$SEEDER' --layers $w --catalog '$T/mtp.cat.json' -o '$T/s-$n.gguf' && cmp -s '$T/s-$n.gguf' '$T/ref-$n.gguf'"
    check "nginx pull of the MTP model's $w identical to slice, verified" bash -c "'$KVCTL' pull -q --from '$NGX/mtp.gguf' --layers $w --catalog '$T/mtp.cat.json' -o '$T/n-$n.gguf' && cmp -s '$T/n-$n.gguf' '$T/ref-$n.gguf' && '$KVCTL' verify '$T/n-$n.gguf' --catalog '$T/mtp.cat.json' >/dev/null"
    got=$("$KVCTL" inspect --tensors "$T/s-$n.gguf" 2>/dev/null | awk '$1 ~ /^blk\.8\./ || $1 == "token_embd.weight"' | wc -l)
    want=$tail_n; [ $w = 3:5 ] && want=0
    check "the MTP model's $w holds $got of blk.8.* and token_embd (want $want)" test "$got" = "$want" -a "$tail_n" -gt 20
done

# ---- bytes moved for a 1-layer window
: > "$T/nginx/logs/access.log"
"$KVCTL" pull -q --from "$NGX/model.gguf" --layers 3:4 --catalog "$T/m.cat.json" -o "$T/b.gguf" || fails=$((fails + 1))
wait_file "$T/nginx/logs/access.log" 10   # nginx logs a request once it has sent it
sent=$(awk '{s += $4} END {print s + 0}' "$T/nginx/logs/access.log")
wsize=$(stat -c %s "$T/ref-3-4.gguf")
msize=$(stat -c %s "$M")
# the window's own header bounds the source header (same metadata): use its tensor-free part
whdr=$(python3 - "$T/ref-3-4.gguf" <<'PY'
import struct, sys
b = open(sys.argv[1], 'rb').read(1 << 22)
# walk the GGUF header far enough to find where tensor infos end (v3)
o = 24
n_t, n_kv = struct.unpack_from('<QQ', b, 8)
def s(o):
    n, = struct.unpack_from('<Q', b, o); return o + 8 + n
sizes = {0:1,1:1,2:2,3:2,4:4,5:4,6:4,7:1,10:8,11:8,12:8}
def val(o, t):
    if t == 8: return s(o)
    if t == 9:
        et, n = struct.unpack_from('<IQ', b, o); o += 12
        for _ in range(n): o = val(o, et)
        return o
    return o + sizes[t]
for _ in range(n_kv):
    o = s(o); t, = struct.unpack_from('<I', b, o); o = val(o + 4, t)
for _ in range(n_t):
    o = s(o); nd, = struct.unpack_from('<I', b, o); o += 4 + 8 * nd + 4 + 8
print(o)
PY
)
echo "nginx sent $sent body bytes for a $wsize-byte window (model $msize, window header $whdr)"
check "nginx bytes within 1% + header of the window" \
    awk -v s="$sent" -v w="$wsize" -v h="$whdr" 'BEGIN { exit !(s <= 1.01 * w + 2 * h + 65536 && s < w * 2) }'
before=$(curl -s "$SEEDER/v1/seeder/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["body_bytes_sent"])')
"$KVCTL" pull -q --from "$SEEDER" --layers 3:4 --catalog "$T/m.cat.json" -o "$T/b2.gguf" || fails=$((fails + 1))
after=$(curl -s "$SEEDER/v1/seeder/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["body_bytes_sent"])')
echo "seeder sent $((after - before)) body bytes for a $wsize-byte window (+ models list)"
check "seeder bytes within 1% of the window" \
    awk -v s=$((after - before)) -v w="$wsize" 'BEGIN { exit !(s >= w && s <= 1.01 * w + 4096) }'

# ---- interrupted transfers resume byte-identical
kill "$SEED_PID"; wait "$SEED_PID" 2>/dev/null
start_seeder --max-rate 400K   # a slow seeder, so the cut lands mid-way
"$KVCTL" pull -q --zstd --from "$SEEDER" --layers 0:8 --catalog "$T/m.cat.json" -o "$T/r.gguf" 2>"$T/r1.err" &
PULL=$!
check "the pull from the slow seeder is under way" wait_file "$T/r.gguf.part" 30   # mid-way
kill -9 "$SEED_PID"; wait "$SEED_PID" 2>/dev/null; SEED_PID=""
wait $PULL; rc=$?
check "zstd pull fails when the seeder dies" test $rc -ne 0
check "nothing at -o after the interruption" test ! -e "$T/r.gguf"
check "a partial download is kept" test -s "$T/r.gguf.part"
start_seeder
"$KVCTL" pull --from "$SEEDER" --layers 0:8 --catalog "$T/m.cat.json" -o "$T/r.gguf" 2>"$T/r2.err" </dev/null
check "seeder pull resumes" grep -q "resuming at" "$T/r2.err"
check "resumed seeder window identical" cmp -s "$T/r.gguf" "$T/ref-0-8.gguf"
np=$(grep -c '^pull: .*%.*/s  ETA [0-9]*s$' "$T/r2.err")
check "progress lines (no TTY: one per 10%, bytes, rate, ETA): $np" test "$np" -ge 1 -a "$np" -le 12
grep -q '^pull: 100% ' "$T/r2.err"; check "progress reaches 100%" test $? -eq 0
# on a terminal: one redrawn bar with bytes, rate and ETA
if command -v script >/dev/null; then
    script -qec "'$KVCTL' pull --from '$SEEDER' --layers 0:2 --catalog '$T/m.cat.json' -o '$T/tty.gguf'" /dev/null > "$T/tty.out" 2>&1
    check "progress bar on a terminal (bar, bytes, rate, ETA)" grep -qa $'\r\[#*-*\] 100% .*/s  ETA' "$T/tty.out"
fi

stop_nginx
write_nginx_conf "limit_rate 300k;"
start_nginx
"$KVCTL" pull -q --from "$NGX/model.gguf" --layers 5:8 --catalog "$T/m.cat.json" -o "$T/rs.gguf" 2>"$T/rs1.err" &
PULL=$!
check "the pull from the slow nginx is under way" wait_file "$T/rs.gguf.part" 30
stop_nginx
wait $PULL; rc=$?
check "pull fails when nginx stops" test $rc -ne 0
check "nothing at -o after the interruption (nginx)" test ! -e "$T/rs.gguf"
write_nginx_conf
start_nginx
"$KVCTL" pull --from "$NGX/model.gguf" --layers 5:8 --catalog "$T/m.cat.json" -o "$T/rs.gguf" 2>"$T/rs2.err" </dev/null
check "nginx pull resumes" grep -q "resuming at" "$T/rs2.err"
check "resumed nginx window identical" cmp -s "$T/rs.gguf" "$T/ref-5-8.gguf"

# ---- a corrupted byte at the source
off=$(python3 -c '
import json,sys
c = json.load(open(sys.argv[1]))
t = [t for t in c["tensors"] if t["name"] == "blk.3.ffn_down_exps.weight"][0]
print(t["offset"] + t["size"] // 2)' "$T/m.cat.json")
printf '\xff' | dd of="$T/www/bad.gguf" bs=1 seek="$off" conv=notrunc status=none
"$KVCTL" pull -q --from "$NGX/bad.gguf" --layers 3:4 --catalog "$T/m.cat.json" -o "$T/bad.gguf" 2>"$T/bad.err"
rc=$?
check "corrupted source: pull fails" test $rc -ne 0
check "corrupted source: the tensor is named" grep -q "blk.3.ffn_down_exps.weight" "$T/bad.err"
check "corrupted source: nothing at -o" test ! -e "$T/bad.gguf"

# ---- hostile requests
id=$(cat "$T/m.id")
for p in "/v1/windows/$id/../../../etc/passwd" "/v1/windows/$id/%2e%2e/%2e%2e/etc/passwd" \
         "/v1/windows/$id/9-3" "/v1/windows/$id/0-9" "/v1/windows/$id/a-b" "/v1/windows/xyz/0-1" \
         "/../../etc/passwd" "/v1/catalog/..%2f..%2fetc%2fpasswd" "//etc/passwd"; do
    code=$(curl -s --path-as-is -o /dev/null -w '%{http_code}' "$SEEDER$p")
    check "hostile $p -> $code" test "$code" -ge 400 -a "$code" -lt 500
done
big=$(head -c 40000 /dev/zero | tr '\0' a)
code=$(curl -s -o /dev/null -w '%{http_code}' -H "X-Big: $big" "$SEEDER/v1/models")
check "oversized header -> $code" test "$code" = 431
code=$(printf 'GARBAGE\r\n\r\n' | timeout 5 python3 -c '
import socket,sys
s=socket.create_connection(("127.0.0.1",int(sys.argv[1]))); s.sendall(sys.stdin.buffer.read())
print(s.recv(100).split()[1].decode())' "$SPORT")
check "malformed request -> $code" test "$code" = 400
check "seeder still up" kill -0 "$SEED_PID"
check "seeder still answers" curl -sf -o /dev/null "$SEEDER/v1/models"

# ---- tokens: stages started from pulled windows give the full file's tokens
want=$("$KVCTL" generate -m "$S" --tokens 1,50,100,200,300 -n 16 --temp 0 --ids 2>/dev/null)
"$KVCTL" ring up --model "$S" --stages 2 --dir "$T/ring" --window-from "$SEEDER" \
    --catalog "$T/s.cat.json" >"$T/ring.out" 2>&1 || { cat "$T/ring.out"; cat "$T"/ring/rank-*/kvd.log; }
got=$("$KVCTL" generate --ring "$T/ring" --tokens 1,50,100,200,300 -n 16 --temp 0 --ids 2>/dev/null)
"$KVCTL" ring down --dir "$T/ring" >/dev/null 2>&1
echo "full file: $want"
echo "ring (seeder windows): $got"
check "ring from seeder windows gives the same tokens" test -n "$want" -a "$want" = "$got"
check "stages hold windows, not the model" test -s "$T/ring/rank-0/window-0-$(python3 -c "
import json; m=json.load(open('$T/ring/ring.json')); print(m['ranks'][0]['layers'][1])").gguf"
# a stage also seeds what it holds (kvd stage --seed): its window, nothing else
W0=$(ls "$T"/ring/rank-0/window-*.gguf | head -1)
HELD=$(basename "$W0" .gguf); HELD=${HELD#window-}; HL=${HELD#*-}
SEED2=$(free_port)
"$KVD" stage --manifest "$T/ring/ring.json" --rank 0 --window "$W0" --catalog "$T/s.cat.json" \
    --state-dir "$T/ring/rank-0" --listen "127.0.0.1:$(free_port)" --seed "127.0.0.1:$SEED2" \
    >"$T/stage-seed.log" 2>&1 &
STAGE_PID=$!
for _ in $(seq 100); do curl -sf -o /dev/null "http://127.0.0.1:$SEED2/v1/models" && break; sleep 0.1; done
"$KVCTL" slice "$S" --layers 0:1 -o "$T/s-ref-0-1.gguf" >/dev/null
check "a stage seeds a window of what it holds" bash -c "'$KVCTL' pull -q --from http://127.0.0.1:$SEED2 --layers 0:1 -o '$T/st-0-1.gguf' && cmp -s '$T/st-0-1.gguf' '$T/s-ref-0-1.gguf'"
code=$(curl -s -o "$T/nh.txt" -w '%{http_code}' "http://127.0.0.1:$SEED2/v1/windows/$(cat "$T/s.id")/$HL-5")
check "the stage refuses layers it does not hold ($code: $(cat "$T/nh.txt"))" test "$code" = 404
kill "$STAGE_PID"; wait "$STAGE_PID" 2>/dev/null
"$KVCTL" ring up --model "$S" --stages 2 --dir "$T/ring2" --window-from "$NGX/stories.gguf" \
    --catalog "$T/s.cat.json" >"$T/ring2.out" 2>&1 || { cat "$T/ring2.out"; cat "$T"/ring2/rank-*/kvd.log; }
got=$("$KVCTL" generate --ring "$T/ring2" --tokens 1,50,100,200,300 -n 16 --temp 0 --ids 2>/dev/null)
"$KVCTL" ring down --dir "$T/ring2" >/dev/null 2>&1
echo "ring (nginx windows): $got"
check "ring from nginx windows gives the same tokens" test -n "$want" -a "$want" = "$got"

# an unreachable source: the stage refuses to start, naming the source, and leaves no window
mkdir -p "$T/wf"
timeout 30 "$KVD" stage --manifest "$T/ring/ring.json" --rank 1 --window-from "http://127.0.0.1:$(free_port)" \
    --state-dir "$T/wf" >"$T/wf.out" 2>&1
rc=$?
check "kvd --window-from an unreachable source exits 1 naming it ($(head -c 160 "$T/wf.out"))" \
    bash -c "[ $rc = 1 ] && grep -q -- '--window-from http://127.0.0.1:' '$T/wf.out' && ! ls '$T'/wf/window-* >/dev/null 2>&1"

# the seeder stops cleanly on SIGTERM (under ASan: no leak), even with a transfer in flight
ID=$(cat "$T/m.id")
curl -s -o /dev/null --limit-rate 200K "$SEEDER/v1/windows/$ID/0-8" &
CURL_PID=$!
sleep 0.5
kill "$SEED_PID"; wait "$SEED_PID"; rc=$?; SEED_PID=""
check "seeder exits 0 on SIGTERM with a transfer in flight" test $rc -eq 0
kill "$CURL_PID" 2>/dev/null; wait "$CURL_PID" 2>/dev/null

echo "$fails failed"
[ $fails -eq 0 ]

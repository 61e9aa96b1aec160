#!/bin/bash
# test-api-exposure: an API that strangers can neither hold nor use by accident.
#  (a) 1024 idle keep-alive connections (256 from each of 127.0.0.2-5, each after one
#      GET /health, the server's whole connection cap) while a fresh client from 127.0.0.1
#      asks: it is served (its wait printed; `make bench` reports the figure), an idle one
#      closed to make room (kvasir_api_connections_evicted_total);
#  (b) the keep-alive idle limit is its own (--api-keepalive 1): an idle connection closes
#      after about a second, not after the 600 s an answer may take;
#  (c) an API on an address other than loopback without --api-key-file refuses to start with
#      the reason (kvctl serve --listen, kvctl ring up --api, kvd stage --api), and starts with
#      keys or --api-open;
#  (d) HTTPS: --api-tls-cert/--api-tls-key serve /health over TLS (and not in the clear).
. "$(dirname "$0")/../lib/lib.sh"

M=$(need_model stories260K.gguf) || exit 1
ulimit -n 8192 2>/dev/null || true

# serve_start LOG ARGS...: kvctl serve on a port it picks; sets PORT, SPID
serve_start() {
    local log=$1
    shift
    "$KVCTL" serve -m "$M" -t 1 "$@" > "$log" 2>&1 &
    SPID=$!
    at_exit "kill $SPID 2>/dev/null"
    wait_for 20 grep -q "(port [0-9]*)" "$log" || die "kvctl serve did not start: $(cat "$log")"
    PORT=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$log" | head -1)
}
serve_stop() { kill "$SPID" 2>/dev/null; wait "$SPID" 2>/dev/null; }

# ---- (a) 1024 idle keep-alive connections, then a fresh client ----
serve_start "$T/a.log" --listen 127.0.0.1:0
python3 - "$PORT" > "$T/a.out" 2>&1 <<'EOF'
import socket, sys, time
port = int(sys.argv[1])
req = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
def read_response(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            raise OSError("closed before a response")
        buf += d
    head, _, body = buf.partition(b"\r\n\r\n")
    n = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    while len(body) < n:
        body += s.recv(4096)
    return head.split(b"\r\n")[0].decode()
idle = []
for a in range(2, 6):                         # 4 addresses x 256: the server's 1024 connections
    for i in range(256):
        s = socket.socket()
        s.bind(("127.0.0.%d" % a, 0))
        s.settimeout(10)
        s.connect(("127.0.0.1", port))
        s.sendall(req)
        status = read_response(s)
        assert "200" in status, status
        idle.append(s)
print("holding %d idle keep-alive connections" % len(idle), flush=True)
time.sleep(0.2)
t0 = time.time()
c = socket.create_connection(("127.0.0.1", port), timeout=30)
c.sendall(req)
status = read_response(c)
dt = time.time() - t0
print("fresh client: %s after %.3f s" % (status, dt), flush=True)
c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
buf = b""
c.settimeout(5)
while b"kvasir_api_connections_evicted_total " not in buf or not buf.endswith(b"\n"):
    d = c.recv(65536)
    if not d:
        break
    buf += d
ev = [l for l in buf.decode().splitlines() if l.startswith("kvasir_api_connections_evicted_total ")]
print("evicted " + (ev[0].split()[1] if ev else "?"), flush=True)
alive = 0
for s in idle:
    s.setblocking(False)
    try:
        alive += 0 if s.recv(1) == b"" else 1
    except BlockingIOError:
        alive += 1
    except OSError:
        pass
print("idle connections still open: %d of %d" % (alive, len(idle)), flush=True)
sys.exit(0 if "200" in status else 1)
EOF
rc=$?
cat "$T/a.out"
[ $rc -eq 0 ] || fail "(a) the fresh client was not served: $(cat "$T/a.out")"
grep -q "fresh client: HTTP/1.1 200" "$T/a.out" || fail "(a) no 200 for the fresh client"
ev=$(sed -n 's/^evicted //p' "$T/a.out")
[ "${ev:-0}" -ge 1 ] 2>/dev/null || fail "(a) no idle connection was closed to make room (evicted '$ev')"
echo "ok   (a) a fresh client is served while 1024 idle keep-alive connections are held: $(sed -n 's/^fresh client: //p' "$T/a.out")"
serve_stop

# ---- (b) keep-alive idle limit of its own ----
serve_start "$T/b.log" --listen 127.0.0.1:0 --api-keepalive 1
python3 - "$PORT" > "$T/b.out" 2>&1 <<'EOF'
import socket, sys, time
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=30)
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
buf = b""
while b"\r\n\r\n" not in buf:
    buf += s.recv(4096)
t0 = time.time()
while True:
    d = s.recv(4096)
    if not d:
        break
print("closed %.2f s after the answer" % (time.time() - t0))
EOF
cat "$T/b.out"
python3 -c "import sys; t=float(open(sys.argv[1]).read().split()[1]); sys.exit(0 if 0.5 <= t <= 5 else 1)" "$T/b.out" ||
    fail "(b) --api-keepalive 1 did not close the idle connection after about 1 s: $(cat "$T/b.out")"
echo "ok   (b) --api-keepalive 1: an idle kept-alive connection closes after about a second"
serve_stop

# ---- (c) no open API by accident ----
refused() {   # WHAT LOG CMD...: CMD exits non-zero at once and LOG names the reason
    local what=$1 log=$2
    shift 2
    timeout 30 "$@" > "$log" 2>&1
    local rc=$?
    [ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -q "other than loopback serves anyone" "$log" && grep -q -- "--api-key-file" "$log" &&
        grep -q -- "--api-open" "$log" || fail "(c) $what was not refused with the reason (rc $rc): $(tail -n 3 "$log")"
    echo "     $what: $(grep -m1 -o "API on .*loopback serves anyone" "$log")"
}
refused "kvctl serve --listen 0.0.0.0:0" "$T/c1.log" "$KVCTL" serve -m "$M" --listen 0.0.0.0:0
refused "kvctl ring up --api 0.0.0.0:0" "$T/c2.log" "$KVCTL" ring up --model "$M" --stages 2 --dir "$T/ring" --api 0.0.0.0:0
[ -e "$T/ring/ring.json" ] && fail "(c) ring up started a ring before refusing the API"
mkdir -p "$T/st"
"$KVCTL" ring up --model "$M" --stages 2 --dir "$T/r2" > "$T/r2.log" 2>&1 || die "ring up: $(cat "$T/r2.log")"
at_exit "\"$KVCTL\" ring down --dir \"$T/r2\" > /dev/null 2>&1"
"$KVCTL" ring down --dir "$T/r2" > /dev/null 2>&1
refused "kvd stage --api 0.0.0.0:0" "$T/c3.log" "$KVD" stage --manifest "$T/r2/ring.json" --rank 0 --model "$M" \
    --state-dir "$T/r2/rank-0" --api 0.0.0.0:0
echo "k-$(openssl rand -hex 16)" > "$T/keys"
serve_start "$T/c4.log" --listen 0.0.0.0:0 --api-key-file "$T/keys"
curl -s -o /dev/null -w "%{http_code}" "http://127.0.0.1:$PORT/v1/models" | grep -q 401 ||
    fail "(c) with keys on 0.0.0.0 a request without a key was not 401"
serve_stop
serve_start "$T/c5.log" --listen 0.0.0.0:0 --api-open
curl -sf "http://127.0.0.1:$PORT/health" > /dev/null || fail "(c) --api-open on 0.0.0.0 does not serve"
serve_stop
echo "ok   (c) an API on a non-loopback address without keys refuses to start, with the reason; keys or --api-open start it"

# ---- (d) HTTPS ----
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=localhost \
    -addext subjectAltName=IP:127.0.0.1 -keyout "$T/key.pem" -out "$T/cert.pem" > /dev/null 2>&1 || die "openssl req"
serve_start "$T/d.log" --listen 127.0.0.1:0 --api-tls-cert "$T/cert.pem" --api-tls-key "$T/key.pem"
grep -q "on https://" "$T/d.log" || fail "(d) the start line does not say https: $(cat "$T/d.log")"
out=$(curl -s --cacert "$T/cert.pem" "https://127.0.0.1:$PORT/health") || fail "(d) curl over https failed"
echo "$out" | grep -q ok || fail "(d) /health over https: '$out'"
curl -s -m 5 "http://127.0.0.1:$PORT/health" > /dev/null 2>&1 && fail "(d) the HTTPS API answered in the clear"
serve_stop
"$KVCTL" serve -m "$M" --listen 127.0.0.1:0 --api-tls-cert "$T/cert.pem" > "$T/d2.log" 2>&1
[ $? -ne 0 ] && grep -q "go together" "$T/d2.log" || fail "(d) a certificate without its key was not refused"
echo "ok   (d) HTTPS with --api-tls-cert/--api-tls-key (certificate checked by curl), nothing in the clear"
finish

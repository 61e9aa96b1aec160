# Shared by the relay's script tests: a scratch dir, a test certificate, a relay on a free
# port (read back from its log line), and cleanup of everything started.
set -u
KV_BUILD=${KV_BUILD:-$(pwd)/build}
KVD="$KV_BUILD/kvd"
T=$(mktemp -d /tmp/kvrelay.XXXXXX)
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null; done
    for p in $PIDS; do wait "$p" 2>/dev/null; done
    rm -rf "$T"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; exit 1; }
[ -x "$KVD" ] || fail "$KVD not built"

make_cert() {
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
        -subj /CN=kvasir-test -addext "subjectAltName=IP:127.0.0.1,DNS:localhost" \
        -keyout "$T/key.pem" -out "$T/cert.pem" 2>/dev/null || fail "openssl cannot make a test certificate"
}

# start_relay NAME [kvd options...]: sets PORT and RELAY_PID; log in $T/NAME.log
start_relay() {
    local name=$1; shift
    "$KVD" --role relay --listen 127.0.0.1:0 "$@" > "$T/$name.log" 2>&1 &
    RELAY_PID=$!
    PIDS="$PIDS $!"
    for _ in $(seq 50); do
        PORT=$(sed -n 's/.*listening on .* port \([0-9]*\).*/\1/p' "$T/$name.log" 2>/dev/null)
        [ -n "$PORT" ] && return 0
        sleep 0.1
    done
    cat "$T/$name.log"
    fail "relay $name did not start"
}

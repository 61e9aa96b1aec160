# Shared by the relay's script tests, on top of tests/lib/lib.sh (scratch dir T, KVD, PIDS killed
# on exit): a test certificate and a relay on a free port (read back from its log line).
# The first failure stops the script.
. "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
fail_fast
need_exec "$KVD"

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
    relay_port() {
        PORT=$(sed -n 's/.*listening on .* port \([0-9]*\).*/\1/p' "$T/$name.log" 2>/dev/null)
        [ -n "$PORT" ]
    }
    wait_for 5 relay_port && return 0
    cat "$T/$name.log"
    fail "relay $name did not start"
}

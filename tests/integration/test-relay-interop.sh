#!/bin/bash
# Independent WebSocket implementations against the relay over TLS: Debian's
# python3-websockets, Node's `ws` package and headless Chromium (a page opening a bridge,
# its other end in Python). Each must pair, move binary messages both ways unchanged and in
# order, see pings answered and get the relay's close codes. Missing tools fail loudly.
cd "$(dirname "$0")/../.."
. tests/lib/relay/lib.sh
PY=/usr/bin/python3
$PY -c 'import websockets' 2>/dev/null || fail "python3-websockets missing (scripts/setup.sh installs it)"
command -v node >/dev/null || fail "node missing (scripts/setup.sh)"
[ -f tests/node_modules/ws/package.json ] || fail "node package ws missing in tests/node_modules (scripts/setup.sh links Debian's node-ws there)"
CHROMIUM=$(command -v chromium || command -v chromium-browser) || fail "chromium missing (scripts/setup.sh installs it)"

make_cert
start_relay tls --tls-cert "$T/cert.pem" --tls-key "$T/key.pem"
echo "== python3-websockets over wss"
timeout 90 $PY tests/lib/relay/ws_python.py "wss://127.0.0.1:$PORT" || fail "python3-websockets over wss"
echo "== node ws over wss"
timeout 90 node tests/lib/relay/ws_node.js "wss://127.0.0.1:$PORT" || fail "node ws over wss"

echo "== headless chromium over wss"
id=$(openssl rand -hex 16)
$PY tests/lib/relay/browser_peer.py "wss://127.0.0.1:$PORT" "$id" 45 &
peer=$!
"$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
    --disable-background-networking --disable-component-update --disable-sync --disable-extensions \
    --disable-dev-shm-usage --user-data-dir="$T/chromium" --ignore-certificate-errors \
    "file://$(pwd)/tests/lib/relay/bridge_page.html?scheme=wss&port=$PORT&id=$id" > "$T/chromium.log" 2>&1 &
chrome=$!
PIDS="$PIDS $chrome"
wait $peer
rc=$?
kill $chrome 2>/dev/null
[ $rc -eq 0 ] || { tail -20 "$T/chromium.log"; fail "chromium bridge"; }

echo "== python3-websockets over plain ws (--plain)"
start_relay plain --plain
timeout 90 $PY tests/lib/relay/ws_python.py "ws://127.0.0.1:$PORT" || fail "python3-websockets over ws"
echo "relay interop: python3-websockets, node ws, chromium: all passed"

#!/usr/bin/python3
"""The other end (downstream, role 0x02) of a bridge whose upstream end is a browser page:
echoes every binary message back until the page's "RESULT ..." message arrives.
usage: browser_peer.py URL_BASE BRIDGE_ID TIMEOUT_S; exits 0 only on "RESULT ok"."""
import asyncio
import ssl
import sys

import websockets

base, bid, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
ctx = None
if base.startswith("wss://"):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE


async def main():
    async with websockets.connect(f"{base}/v1/bridge/{bid}", ssl=ctx, compression=None) as ws:
        await ws.send(b"\x02")
        n = 0
        while True:
            m = await ws.recv()
            if isinstance(m, bytes) and m.startswith(b"RESULT "):
                print(f"browser: {m.decode()} after {n} echoed messages", flush=True)
                return 0 if m == b"RESULT ok" else 1
            n += 1
            await ws.send(m)


try:
    sys.exit(asyncio.run(asyncio.wait_for(main(), timeout)))
except asyncio.TimeoutError:
    print(f"browser: no result within {timeout} s", flush=True)
    sys.exit(1)

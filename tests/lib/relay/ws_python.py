#!/usr/bin/python3
"""Interop: Debian's python3-websockets as a client of the relay (kvd --role relay).

usage: ws_python.py URL_BASE [CAFILE]   e.g. wss://127.0.0.1:4430
Checks the handshake, pairing, binary messages both ways in order, ping/pong, and the close
codes the relay sends (bad role, duplicate role, bad bridge id, partner gone, text frames).
Prints one line per case and exits 1 on any failure."""
import asyncio
import os
import ssl
import sys

import websockets

BASE = sys.argv[1]
SSL = None
if BASE.startswith("wss://"):
    SSL = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    SSL.check_hostname = False
    SSL.verify_mode = ssl.CERT_NONE
failures = 0


def check(cond, what):
    global failures
    if not cond:
        failures += 1
        print("FAIL", what, flush=True)
    return cond


def bid():
    return os.urandom(16).hex()


async def connect(b):
    return await websockets.connect(f"{BASE}/v1/bridge/{b}", ssl=SSL, max_size=1 << 24,
                                    compression=None, open_timeout=10)


async def wait_closed(ws, timeout=10):
    try:
        await asyncio.wait_for(ws.wait_closed(), timeout)
    except asyncio.TimeoutError:
        return None, "timeout"
    return ws.close_code, ws.close_reason


async def case_pair_and_forward():
    b = bid()
    up = await connect(b)
    down = await connect(b)
    await up.send(b"\x01")
    await down.send(b"\x02")
    n = 200
    msgs = [os.urandom(1 + (i * 7919) % 70000) for i in range(n)]

    async def pump(src, dst, data):
        for m in data:
            await src.send(m)
        got = []
        for _ in data:
            got.append(await asyncio.wait_for(dst.recv(), 20))
        return got

    rev = [os.urandom(1 + (i * 104729) % 50000) for i in range(n)]
    g1, g2 = await asyncio.gather(pump(up, down, msgs), pump(down, up, rev))
    check(g1 == msgs, "upstream -> downstream: messages unchanged and in order")
    check(g2 == rev, "downstream -> upstream: messages unchanged and in order")
    check(all(isinstance(x, bytes) for x in g1), "binary frames stay binary")
    pong = await up.ping(b"hello")
    await asyncio.wait_for(pong, 5)
    check(True, "ping answered with pong")
    await up.close(1000, "done")
    code, reason = await wait_closed(down)
    check(code == 4002 and reason.startswith("partner gone"),
          f"partner dropped -> other end closed 4002 'partner gone' (got {code} {reason!r})")
    print("ok   pair_and_forward", flush=True)


async def case_messages_before_partner():
    b = bid()
    up = await connect(b)
    await up.send(b"\x01")
    early = [b"early-%d" % i for i in range(10)]
    for m in early:
        await up.send(m)
    await asyncio.sleep(0.2)
    down = await connect(b)
    await down.send(b"\x02")
    got = [await asyncio.wait_for(down.recv(), 10) for _ in early]
    check(got == early, "messages sent before the partner arrived are delivered in order")
    await up.close()
    await down.close()
    print("ok   messages_before_partner", flush=True)


async def case_bad_role():
    ws = await connect(bid())
    await ws.send(b"\x07")
    code, reason = await wait_closed(ws)
    check(code == 4004 and "0x07" in reason, f"unknown role byte -> 4004 (got {code} {reason!r})")
    ws = await connect(bid())
    await ws.send(b"\x01\x02")
    code, reason = await wait_closed(ws)
    check(code == 4004, f"two-byte role message -> 4004 (got {code} {reason!r})")
    print("ok   bad_role", flush=True)


async def case_dup_role():
    b = bid()
    a = await connect(b)
    await a.send(b"\x02")
    await asyncio.sleep(0.1)
    c = await connect(b)
    await c.send(b"\x02")
    code, reason = await wait_closed(c)
    check(code == 4003 and "downstream" in reason, f"duplicate role -> 4003 (got {code} {reason!r})")
    check(a.open, "the first end stays connected")
    await a.close()
    print("ok   dup_role", flush=True)


async def case_bad_bridge():
    for bad in ["short", "X" * 32, "g" * 40, "a" * 65]:
        ws = await connect(bad)
        code, reason = await wait_closed(ws)
        check(code == 4005 and "bridge id" in reason, f"bridge id {bad!r} -> 4005 (got {code} {reason!r})")
    print("ok   bad_bridge", flush=True)


async def case_text_refused():
    ws = await connect(bid())
    await ws.send(b"\x01")
    await ws.send("text is not forwarded")
    code, reason = await wait_closed(ws)
    check(code == 1003, f"text message -> 1003 (got {code} {reason!r})")
    print("ok   text_refused", flush=True)


async def main():
    for c in [case_pair_and_forward, case_messages_before_partner, case_bad_role, case_dup_role,
              case_bad_bridge, case_text_refused]:
        try:
            await asyncio.wait_for(c(), 60)
        except Exception as e:  # a case that raises has failed
            check(False, f"{c.__name__}: {type(e).__name__}: {e}")
    print(f"python websockets {websockets.__version__}: {failures} failures", flush=True)
    sys.exit(1 if failures else 0)


asyncio.run(main())

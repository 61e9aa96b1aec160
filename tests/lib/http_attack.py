#!/usr/bin/env python3
"""http_attack.py — hostile HTTP and WebSocket clients for the hardening tests
(tests/integration/test-net-slowloris.sh, test-net-slowreader.sh, test-relay-flood.sh).

Each subcommand runs one attack against HOST:PORT and prints one JSON object saying what
happened, so the calling script can check that the attack failed. Attack connections can be
bound to another loopback source address (--src 127.0.0.2) so that the per-address caps of
the target hit the attacker and not the legitimate client on 127.0.0.1.

  stall    N connections that send a request head announcing a body (or only part of a
           head, or, with --tls, only a TCP connect or half a TLS handshake) and then
           nothing: how many the server closed, and how soon.
  noread   N connections that ask for PATH (optionally with Accept-Encoding: zstd) and never
           read: the target's memory after --hold seconds, and its --stats URL (JSON) --after
           seconds later, before they are closed; with --until EXPR the stats are read again
           until EXPR (on the stats as d) holds, up to --until-s seconds (a loaded machine
           runs the target's timers late).
  frag     WebSocket connections to /v1/bridge/<id> that send a role byte, then one message
           in --frags fragments of --fragsize bytes (1): the target's memory and --stats
           after --hold seconds, then the close code each got.
  unpaired WebSocket ends that send a role byte, then --msgs messages of --size bytes with no
           partner: the target's memory and --stats after --hold seconds, the close codes.
  pair     a legitimate bridge: two ends pair, exchange --msgs messages of --size bytes both
           ways, each checked; ok true when every message arrived intact and in order.
  rss      VmRSS of a process in KiB (for the scripts).
  check    FILE EXPR MSG [EXPR MSG...]: evaluates each EXPR on the JSON object d read from
           FILE ("-": stdin); prints MSG and the object for each false one, exit 1 if any
           (one python start for many checks: starts are slow on a loaded machine).
"""
import argparse, json, os, socket, ssl, struct, sys, time


def conn(host, port, src=None, timeout=5.0):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    if src:
        s.bind((src, 0))
    s.connect((host, port))
    return s


def closed_by_peer(s):
    """True when the peer closed (EOF or reset), False when the socket is still open."""
    s.setblocking(False)
    try:
        while True:
            d = s.recv(1 << 16)
            if not d:
                return True
    except BlockingIOError:
        return False
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        s.setblocking(True)


def rss_kib(pid, field="VmRSS"):
    """VmRSS (or RssAnon: the heap, without the mapped model files) of pid in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


# ---------------------------------------------------------------- stall

def cmd_stall(a):
    socks, refused = [], 0
    t0 = time.monotonic()
    for i in range(a.n):
        try:
            s = conn(a.host, a.port, a.src)
        except OSError:
            refused += 1
            continue
        try:
            if a.mode == "body":
                s.sendall(b"POST /v1/models HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
            elif a.mode == "head":
                s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            elif a.mode == "tls-half":
                # the first bytes of a TLS record header and nothing more
                s.sendall(b"\x16\x03\x01\x02\x00\x01")
            # "connect": say nothing at all
        except OSError:
            pass
        socks.append((s, time.monotonic()))
    opened = len(socks)
    closed_at = {}
    deadline = time.monotonic() + a.wait
    while time.monotonic() < deadline and len(closed_at) < opened:
        for i, (s, t) in enumerate(socks):
            if i not in closed_at and closed_by_peer(s):
                closed_at[i] = time.monotonic() - t
        time.sleep(0.05)
    for s, _ in socks:
        s.close()
    print(json.dumps({"opened": opened, "refused_at_connect": refused, "closed": len(closed_at),
                      "max_close_s": round(max(closed_at.values(), default=0), 3),
                      "elapsed_s": round(time.monotonic() - t0, 3)}))


# ---------------------------------------------------------------- noread

def cmd_noread(a):
    socks = []
    enc = "Accept-Encoding: zstd\r\n" if a.zstd else ""
    for i in range(a.n):
        s = conn(a.host, a.port, a.src)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(f"GET {a.path} HTTP/1.1\r\nHost: x\r\n{enc}\r\n".encode())
        socks.append(s)
    time.sleep(a.hold)
    rss = rss_kib(a.pid) if a.pid else -1
    anon = rss_kib(a.pid, "RssAnon") if a.pid else -1
    time.sleep(a.after)
    # Whether the server dropped them is read from its own counters: a dropped connection
    # still delivers what the kernels buffer, and reading it after a long zero window waits
    # on TCP's persist timer, so the client side cannot tell in a short test.
    stats = None
    if a.stats:
        import urllib.request
        t_end = time.monotonic() + a.until_s
        while True:
            with urllib.request.urlopen(a.stats, timeout=10) as r:
                stats = json.loads(r.read())
            if not a.until or eval(a.until, {"d": stats}) or time.monotonic() > t_end:
                break
            time.sleep(0.1)
    for s in socks:
        s.close()
    print(json.dumps({"opened": len(socks), "rss_kib_while_held": rss,
                      "anon_kib_while_held": anon, "stats_after": stats}))


# ---------------------------------------------------------------- websocket

def ws_frame(opcode, payload, fin=True):
    mask = os.urandom(4)
    n = len(payload)
    b0 = (0x80 if fin else 0) | opcode
    if n < 126:
        head = struct.pack("!BB", b0, 0x80 | n)
    elif n < 65536:
        head = struct.pack("!BBH", b0, 0x80 | 126, n)
    else:
        head = struct.pack("!BBQ", b0, 0x80 | 127, n)
    m = (mask * (n // 4 + 1))[:n]
    masked = (int.from_bytes(payload, "big") ^ int.from_bytes(m, "big")).to_bytes(n, "big")
    return head + mask + masked


def ws_open(host, port, path, src=None, tls=False, timeout=5.0):
    s = conn(host, port, src, timeout)
    if tls:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        s = ctx.wrap_socket(s, server_hostname=host)
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}\r\nUpgrade: websocket\r\n"
               "Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
               "Sec-WebSocket-Version: 13\r\n\r\n").encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        d = s.recv(4096)
        if not d:
            raise OSError("closed during the handshake")
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 101"):
        raise OSError("handshake refused: " + head.split(b"\r\n")[0].decode(errors="replace"))
    return s, rest


class WsReader:
    def __init__(self, s, rest=b""):
        self.s, self.buf = s, rest

    def _need(self, n):
        while len(self.buf) < n:
            d = self.s.recv(1 << 16)
            if not d:
                raise EOFError
            self.buf += d

    def frame(self):
        self._need(2)
        b0, b1 = self.buf[0], self.buf[1]
        n, off = b1 & 0x7f, 2
        if n == 126:
            self._need(4)
            n, off = struct.unpack("!H", self.buf[2:4])[0], 4
        elif n == 127:
            self._need(10)
            n, off = struct.unpack("!Q", self.buf[2:10])[0], 10
        self._need(off + n)
        p = self.buf[off:off + n]
        self.buf = self.buf[off + n:]
        return b0 & 0x0f, p

    def message(self):
        """Next data message (pings skipped), or ("close", code)."""
        while True:
            op, p = self.frame()
            if op == 0x8:
                return "close", struct.unpack("!H", p[:2])[0] if len(p) >= 2 else 1005
            if op in (0x1, 0x2):
                return "msg", p


def close_code(s, rest=b"", timeout=5.0):
    s.settimeout(timeout)
    r = WsReader(s, rest)
    try:
        while True:
            kind, v = r.message()
            if kind == "close":
                return v
    except (EOFError, OSError):
        return 1006


def fetch_json(url):
    import urllib.request
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


def ends_report(a, ends, out):
    """After --hold seconds: the target's memory and --stats while the ends are open, then
    the close code of each end; printed with out as one JSON object."""
    time.sleep(a.hold)
    out["rss_kib"] = rss_kib(a.pid) if a.pid else -1
    out["anon_kib"] = rss_kib(a.pid, "RssAnon") if a.pid else -1
    out["stats"] = fetch_json(a.stats) if a.stats else None
    out["codes"] = [close_code(s, rest) for s, rest in ends]
    for s, _ in ends:
        s.close()
    print(json.dumps(out))


def cmd_frag(a):
    """Every end first (so that their messages are assembled at the same time), then the
    fragments, then the target's memory and --stats, then the close codes."""
    ends = []
    for i in range(a.n):
        bid = os.urandom(16).hex()
        s, rest = ws_open(a.host, a.port, f"/v1/bridge/{bid}", a.src, a.tls)
        s.sendall(ws_frame(0x2, b"\x01"))
        ends.append((s, rest))
    sent_frags = []
    part = os.urandom(a.fragsize)
    for s, _ in ends:
        frags = 0
        try:
            s.sendall(ws_frame(0x2, part, fin=False))
            frags = 1
            batch = b"".join(ws_frame(0x0, part, fin=False) for _ in range(min(256, a.frags)))
            while frags < a.frags:
                s.sendall(batch)
                frags += min(256, a.frags)
        except OSError:
            pass
        sent_frags.append(frags)
    ends_report(a, ends, {"frags_sent": sent_frags})


def cmd_unpaired(a):
    codes, ends = [], []
    msg = os.urandom(a.size)
    for i in range(a.n):
        bid = os.urandom(16).hex()
        s, rest = ws_open(a.host, a.port, f"/v1/bridge/{bid}", a.src, a.tls)
        s.sendall(ws_frame(0x2, b"\x01"))
        try:
            for _ in range(a.msgs):
                s.sendall(ws_frame(0x2, msg))
        except OSError:
            pass
        ends.append((s, rest))
    ends_report(a, ends, {})


def cmd_pair(a):
    bid = os.urandom(16).hex()
    up, ur = ws_open(a.host, a.port, f"/v1/bridge/{bid}", None, a.tls)
    dn, dr = ws_open(a.host, a.port, f"/v1/bridge/{bid}", None, a.tls)
    up.sendall(ws_frame(0x2, b"\x01"))
    dn.sendall(ws_frame(0x2, b"\x02"))
    rup, rdn = WsReader(up, ur), WsReader(dn, dr)
    ok, why = True, ""
    try:
        for i in range(a.msgs):
            m1 = struct.pack("!I", i) + os.urandom(a.size)
            m2 = struct.pack("!I", i) + os.urandom(a.size)
            up.sendall(ws_frame(0x2, m1))
            dn.sendall(ws_frame(0x2, m2))
            k1, g1 = rdn.message()
            k2, g2 = rup.message()
            if (k1, g1) != ("msg", m1) or (k2, g2) != ("msg", m2):
                ok, why = False, f"message {i}: {k1} {k2}"
                break
    except (EOFError, OSError) as e:
        ok, why = False, f"{type(e).__name__}: {e}"
    up.close()
    dn.close()
    print(json.dumps({"ok": ok, "why": why}))


def cmd_check(argv):
    f = sys.stdin if argv[0] == "-" else open(argv[0])
    txt = f.read()
    try:
        d = json.loads(txt)
    except ValueError:
        print(f"not JSON: {txt[:300]!r}")
        return 1
    bad = 0
    for expr, msg in zip(argv[1::2], argv[2::2]):
        try:
            ok = eval(expr, {}, {"d": d})
        except Exception as e:
            ok, msg = False, f"{msg} ({expr}: {type(e).__name__} {e})"
        if not ok:
            print(f"{msg}: {json.dumps(d)[:600]}")
            bad += 1
    return 1 if bad else 0


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "check":
        sys.exit(cmd_check(sys.argv[2:]))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("cmd", choices=["stall", "noread", "frag", "unpaired", "pair", "rss", "check"])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--src", default=None)
    p.add_argument("-n", type=int, default=1)
    p.add_argument("--mode", default="body", choices=["body", "head", "connect", "tls-half"])
    p.add_argument("--wait", type=float, default=5.0)
    p.add_argument("--path", default="/")
    p.add_argument("--zstd", action="store_true")
    p.add_argument("--hold", type=float, default=1.0)
    p.add_argument("--after", type=float, default=0.0)
    p.add_argument("--field", default="VmRSS")
    p.add_argument("--stats", default=None)
    p.add_argument("--until", default=None)
    p.add_argument("--until-s", type=float, default=30.0)
    p.add_argument("--pid", type=int, default=0)
    p.add_argument("--tls", action="store_true")
    p.add_argument("--frags", type=int, default=100000)
    p.add_argument("--msgs", type=int, default=1)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--fragsize", type=int, default=1)
    a = p.parse_args()
    if a.cmd == "rss":
        print(rss_kib(a.pid, a.field))
        return
    {"stall": cmd_stall, "noread": cmd_noread, "frag": cmd_frag, "unpaired": cmd_unpaired,
     "pair": cmd_pair}[a.cmd](a)


if __name__ == "__main__":
    main()

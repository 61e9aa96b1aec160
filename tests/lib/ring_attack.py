#!/usr/bin/env python3
"""ring_attack.py — attackers on ring links for tests/integration/test-ring-attack.sh. None of them has a
node key: they know what ring.json says, and what passes through them.

  proxy LISTEN_PORT TO_HOST:PORT MODE [--record FILE] [--nth N]
      A TCP proxy placed between two stages (the dialer connects to it). It forwards the
      handshake frames as they are and then parses the sealed records (u32 length + body).
      MODE pass forwards everything; flip / drop / replay / reorder act once, on the N-th
      (default 1st) record of 100 bytes or more sent by the dialer (an OPEN or an ACT): flip a
      byte of it, drop it, send it twice, or swap it with the next record the dialer sends.
      --record FILE appends the body of every record it forwarded, both ways (the plaintext
      length prefixes left out), for a test to search. Runs until killed; prints one line per action.

  reflect R0_HOST:PORT R1_HOST:PORT SECONDS
      The takeover of a restarted rank 1 in a 2-stage ring: connect to rank 1 as its
      predecessor and to rank 0 as ITS predecessor, and hand each one's HELLO and AUTH to the
      other, so that rank 0's signature over rank 1's nonce would pass for rank 0's own AUTH
      at rank 1. Loops for SECONDS; prints how each attempt ended ("taken" if a link stayed
      up and rank 1 sent anything after the handshake frames it expected).

  relay LISTEN_PORT MODE [--record FILE] [--nth N]
      A malicious relay speaking the bridge protocol of docs/relay.md over plain ws://
      (relay+ws:// endpoints): it pairs the two ends of a bridge and forwards their bytes,
      reading and tampering with the upstream end's stream exactly as proxy does.

  idle HOST:PORT COUNT SECONDS
      COUNT idle TCP connections to a stage, held for SECONDS (reopened when closed).

  mitm LISTEN_PORT MANIFEST
      A malicious relay (plain ws://, relay+ws:// endpoints) that terminates both ends of
      every bridge itself instead of forwarding: to each end it sends a HELLO of its own,
      right in every public field of MANIFEST (ring id, ranks, manifest hash) but carrying
      the relay's own Ed25519 key, and reports what the stage does: "rank R refused: ..."
      (its ERROR, or its close with no AUTH) or "rank R accepted the relay's key" (it sent its AUTH, a signature for
      the relay: the link would be the relay's). Prints the relay's key first
      ("relay key HEX"). Runs until killed.

  pending HOST:PORT MANIFEST AS_RANK ADDRS PER_ADDR SECONDS [--count-file F]
      Valid pending HELLOs: from each of ADDRS loopback source addresses (127.0.0.2, ...),
      PER_ADDR connections to a stage, each sending a HELLO built from MANIFEST's public data
      that claims rank AS_RANK with that rank's key (which it cannot prove: no AUTH follows);
      a connection closed by the stage is opened again at once, for SECONDS. Writes the number
      of connections held now to F every 0.1 s; prints how many it opened and how often the
      stage closed one.
"""
import base64
import hashlib
import os
import select
import socket
import struct
import sys
import threading
import time

HDR = 28
MAGIC = 0x3152564B
F_HELLO, F_AUTH, F_ERROR = 1, 2, 7


def ring_version():
    """The link protocol's version, as ring/ring.h defines RING_VERSION (its one home)."""
    import re
    h = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "ring", "ring.h")
    m = re.search(r"#define RING_VERSION\s+(\d+)u", open(h).read())
    if not m:
        sys.exit("ring_attack: no RING_VERSION in " + h)
    return int(m.group(1))


class Dir:
    """One direction of a proxied link: handshake frames, then records."""

    def __init__(self, name):
        self.name = name
        self.buf = b""
        self.sealed = False   # the AUTH has gone by: records from here on
        self.big = 0          # records of >= 100 bytes seen
        self.held = None      # reorder: a record kept back

    def units(self, data):
        """Split the stream into whole units (frames or records): [(kind, bytes, body)]."""
        self.buf += data
        out = []
        while True:
            if not self.sealed:
                if len(self.buf) < HDR:
                    break
                magic, typ = struct.unpack_from("<IB", self.buf, 0)
                plen = struct.unpack_from("<I", self.buf, 24)[0]
                if magic != MAGIC or plen > 1 << 20:
                    out.append(("raw", self.buf, b""))
                    self.buf = b""
                    break
                if len(self.buf) < HDR + plen:
                    break
                unit, self.buf = self.buf[:HDR + plen], self.buf[HDR + plen:]
                out.append(("frame", unit, b""))
                if typ == F_AUTH:
                    self.sealed = True
            else:
                if len(self.buf) < 4:
                    break
                n = struct.unpack_from("<I", self.buf, 0)[0]
                if len(self.buf) < 4 + n:
                    break
                unit, self.buf = self.buf[:4 + n], self.buf[4 + n:]
                out.append(("record", unit, unit[4:]))
        return out


class Tamper:
    """What proxy and relay do to a stream: forward, record, and act once on a record."""

    def __init__(self, mode, record, nth):
        self.mode, self.nth, self.done = mode, nth, False
        self.rec = open(record, "ab") if record else None
        self.lock = threading.Lock()

    def feed(self, d, data, upstream):
        """Bytes from one end (d: its Dir; upstream: the sender of the ring's data): the
        bytes to pass on."""
        with self.lock:
            return self._feed(d, data, upstream)

    def _feed(self, d, data, upstream):
        out = b""
        for kind, unit, body in d.units(data):
            if self.rec is not None and kind == "record":
                self.rec.write(body)
                self.rec.flush()
            if kind == "record" and upstream and d.held is not None:
                # reorder: the next record, whatever its size, first, then the held one
                out += unit + d.held
                d.held = None
                print("reordered two records", flush=True)
                continue
            if kind != "record" or not upstream or self.mode == "pass" or self.done or len(unit) < 100:
                out += unit
                continue
            d.big += 1
            if d.big < self.nth:
                out += unit
                continue
            if self.mode == "flip":
                u = bytearray(unit)
                u[4 + len(body) // 2] ^= 0x01
                out += bytes(u)
                self.done = True
                print("flipped a byte", flush=True)
            elif self.mode == "drop":
                self.done = True
                print("dropped a record", flush=True)
            elif self.mode == "replay":
                out += unit + unit
                self.done = True
                print("replayed a record", flush=True)
            elif self.mode == "reorder":
                # done now: if this link closes before another record comes, the held one is
                # simply lost, and the next link is left alone ("act once").
                d.held = unit
                self.done = True
            else:
                out += unit
        return out


def listening(port, backlog):
    """The listening socket tests/lib/listen.py handed over (fd 3, LISTEN_FDS), else one bound on
    127.0.0.1:port: a port nobody can take between its choice and its use."""
    if os.environ.get("LISTEN_PID") == str(os.getpid()) and os.environ.get("LISTEN_FDS", "0") != "0":
        del os.environ["LISTEN_PID"], os.environ["LISTEN_FDS"]
        return socket.socket(fileno=3)
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", int(port)))
    ls.listen(backlog)
    return ls


def proxy(listen_port, to, mode, record, nth):
    host, port = to.rsplit(":", 1)
    ls = listening(listen_port, 8)
    tm = Tamper(mode, record, nth)
    pairs = {}     # socket -> (peer socket, Dir, is_dialer_side)
    print(f"proxy :{listen_port} -> {to} mode {mode}", flush=True)
    while True:
        r, _, _ = select.select([ls] + list(pairs), [], [], 1.0)
        for s in r:
            if s is ls:
                a, _ = ls.accept()
                try:
                    b = socket.create_connection((host, int(port)), timeout=5)
                except OSError:
                    a.close()
                    continue
                b.settimeout(None)
                pairs[a] = (b, Dir("up"), True)
                pairs[b] = (a, Dir("down"), False)
                print("link through the proxy", flush=True)
                continue
            if s not in pairs:
                continue
            peer, d, from_dialer = pairs[s]
            try:
                data = s.recv(1 << 16)
            except OSError:
                data = b""
            if not data:
                for x in (s, peer):
                    pairs.pop(x, None)
                    x.close()
                print("link closed", flush=True)
                continue
            out = tm.feed(d, data, from_dialer)
            if out:
                try:
                    peer.sendall(out)
                except OSError:
                    pass


def ws_read(f):
    """One WebSocket frame from file f: (fin, opcode, payload), or None at the end."""
    h = f.read(2)
    if len(h) < 2:
        return None
    fin, op, masked, n = h[0] >> 7, h[0] & 15, h[1] >> 7, h[1] & 127
    if n == 126:
        n = struct.unpack(">H", f.read(2))[0]
    elif n == 127:
        n = struct.unpack(">Q", f.read(8))[0]
    key = f.read(4) if masked else b""
    p = f.read(n)
    if len(p) < n:
        return None
    if masked:
        p = bytes(b ^ key[i % 4] for i, b in enumerate(p))
    return fin, op, p


def ws_frame(op, p):
    n = len(p)
    if n < 126:
        h = struct.pack("BB", 0x80 | op, n)
    elif n < 65536:
        h = struct.pack(">BBH", 0x80 | op, 126, n)
    else:
        h = struct.pack(">BBQ", 0x80 | op, 127, n)
    return h + p


def bridge_accept(c):
    """A bridge end's WebSocket upgrade and role preamble on socket c: (file, path, role), or
    None (c closed)."""
    f = c.makefile("rb")
    head = b""
    while not head.endswith(b"\r\n\r\n"):
        line = f.readline()
        if not line:
            c.close()
            return None
        head += line
    lines = head.decode(errors="replace").split("\r\n")
    path = lines[0].split(" ")[1] if len(lines[0].split(" ")) > 1 else ""
    hdr = {l.split(":", 1)[0].strip().lower(): l.split(":", 1)[1].strip() for l in lines[1:] if ":" in l}
    acc = base64.b64encode(hashlib.sha1((hdr.get("sec-websocket-key", "") +
                           "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    c.sendall(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               "Sec-WebSocket-Accept: %s\r\n\r\n" % acc).encode())
    first = ws_read(f)
    if not first or len(first[2]) != 1 or first[2][0] not in (1, 2):
        c.close()
        return None
    return f, path, first[2][0]


def relay(listen_port, mode, record, nth):
    tm = Tamper(mode, record, nth)
    bridges = {}          # bridge id -> {role: (socket, send lock)}
    cv = threading.Condition()

    def send(end, op, p):
        s, lock = end
        with lock:
            try:
                s.sendall(ws_frame(op, p))
            except OSError:
                pass

    def serve(c):
        up = bridge_accept(c)
        if not up:
            return
        f, path, role = up
        bid = path.rsplit("/", 1)[-1]
        me = (c, threading.Lock())
        with cv:
            b = bridges.setdefault(bid, {})
            b[role] = me
            cv.notify_all()
            while 3 - role not in b:
                cv.wait()
            partner = b[3 - role]
        print("bridge %s paired (role %d)" % (bid[:8], role), flush=True)
        d = Dir("up" if role == 1 else "down")
        while True:
            fr = ws_read(f)
            if fr is None or fr[1] == 8:
                break
            if fr[1] == 9:
                send(me, 10, fr[2])
                continue
            if fr[1] in (0, 2):
                out = tm.feed(d, fr[2], role == 1)
                if out:
                    send(partner, 2, out)
        with cv:
            if bridges.get(bid, {}).get(role) is me:
                del bridges[bid][role]
        for s_ in (c, partner[0]):
            try:
                s_.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        c.close()
        print("bridge %s end closed (role %d)" % (bid[:8], role), flush=True)

    ls = listening(listen_port, 16)
    print(f"relay :{listen_port} mode {mode}", flush=True)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def read_frame(s, deadline, buf=b""):
    """One handshake frame from s (after the bytes buf already received): (frame, rest), or
    None (closed, timeout, oversized)."""
    while True:
        if len(buf) >= HDR:
            plen = struct.unpack_from("<I", buf, 24)[0]
            if plen > 4096:
                return None
            if len(buf) >= HDR + plen:
                return buf[:HDR + plen], buf[HDR + plen:]
        left = deadline - time.time()
        if left <= 0:
            return None
        s.settimeout(left)
        try:
            d = s.recv(4096)
        except OSError:
            return None
        if not d:
            return None
        buf += d


def reflect(r0, r1, seconds):
    end = time.time() + float(seconds)
    n = 0
    while time.time() < end:
        n += 1
        try:
            a = socket.create_connection(tuple(r1.rsplit(":", 1)), timeout=2)   # at rank 1, as rank 0
            b = socket.create_connection(tuple(r0.rsplit(":", 1)), timeout=2)   # at rank 0, as rank 1
        except OSError as e:
            print(f"attempt {n}: connect failed: {e}", flush=True)
            time.sleep(0.1)
            continue
        dl = time.time() + 3
        res = "?"
        try:
            h1 = read_frame(a, dl)                     # rank 1's HELLO
            if not h1:
                res = "rank 1 sent no HELLO"
                raise StopIteration
            b.sendall(h1[0])                           # ... shown to rank 0 as its predecessor's
            h0 = read_frame(b, dl)                     # rank 0's HELLO
            if not h0:
                res = "rank 0 refused the reflected HELLO"
                raise StopIteration
            rest0 = h0[1]
            auth0 = read_frame(b, dl, rest0)       # rank 0's AUTH (its signature)
            a.sendall(h0[0] + (auth0[0] if auth0 else b""))
            auth1 = read_frame(a, dl, h1[1])       # rank 1's AUTH, or its ERROR
            if auth1 and struct.unpack_from("<B", auth1[0], 4)[0] == F_ERROR:
                res = "rank 1 refused: " + auth1[0][HDR + 4:].decode(errors="replace")
                raise StopIteration
            if auth1:
                b.sendall(auth1[0])
            # a taken link would now carry records from rank 1 (PONGs) or stay open
            a.settimeout(1.5)
            try:
                more = a.recv(4096)
            except socket.timeout:
                more = None
            if more is None:
                res = "taken: rank 1 kept the link"
            elif not more:
                res = "rank 1 closed the link"
            elif more[:4] == struct.pack("<I", MAGIC) and more[4] == F_ERROR:
                res = "rank 1 refused: " + more[HDR + 4:].decode(errors="replace")
            else:
                res = "taken: rank 1 sent %d bytes after the handshake" % len(more)
        except StopIteration:
            pass
        except OSError as e:
            res = f"closed: {e}"
        finally:
            a.close()
            b.close()
        print(f"attempt {n}: {res}", flush=True)
        time.sleep(0.05)


def idle(to, count, seconds):
    host, port = to.rsplit(":", 1)
    end = time.time() + float(seconds)
    socks = []
    opened = 0
    while time.time() < end:
        socks = [s for s in socks if s.fileno() >= 0]
        while len(socks) < int(count):
            try:
                socks.append(socket.create_connection((host, int(port)), timeout=2))
                opened += 1
            except OSError:
                break
        r, _, _ = select.select(socks, [], [], 0.2)
        for s in r:
            try:
                d = s.recv(4096)
            except OSError:
                d = b""
            if not d:
                s.close()
    print(f"opened {opened} idle connections", flush=True)


def hello_frame(ring, rank, n_ranks, key, mhash, nonce, eph):
    """A HELLO frame (this protocol version): the 28-byte header and its 204-byte payload."""
    p = struct.pack("<III", ring_version(), rank, n_ranks) + ring.encode().ljust(64, b"\0") + key + mhash + nonce + eph
    return struct.pack("<IBBHQIII", MAGIC, F_HELLO, 0, 0, 0, 0, 0, len(p)) + p


def manifest_facts(path):
    import json
    raw = open(path, "rb").read()
    m = json.loads(raw)
    return m, hashlib.sha256(raw).digest()


def mitm(listen_port, manifest):
    import os
    from cryptography.hazmat.primitives.asymmetric import ed25519, x25519
    from cryptography.hazmat.primitives import serialization
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    key = ed25519.Ed25519PrivateKey.generate().public_key().public_bytes(*raw)
    m, mhash = manifest_facts(manifest)
    n = len(m["ranks"])
    print("relay key %s" % key.hex(), flush=True)

    def serve(c):
        up = bridge_accept(c)
        if not up:
            return
        f, path, role = up
        bid = path.rsplit("/", 1)[-1].split("?")[0]
        down = [r["rank"] for r in m["ranks"] if r["endpoint"].endswith("/" + bid)]
        if not down:
            c.close()
            return
        stage = (down[0] - 1) % n if role == 1 else down[0]    # the rank on this end
        peer = down[0] if role == 1 else (down[0] - 1) % n     # the rank the relay poses as
        eph = x25519.X25519PrivateKey.generate().public_key().public_bytes(*raw)
        c.sendall(ws_frame(2, hello_frame(m["ring"], peer, n, key, mhash, os.urandom(32), eph)))
        buf, res = b"", "refused: closed the link after the relay's HELLO, no AUTH"
        while True:
            fr = ws_read(f)
            if fr is None or fr[1] == 8:
                break
            if fr[1] == 9:
                c.sendall(ws_frame(10, fr[2]))
                continue
            buf += fr[2]
            while len(buf) >= HDR and len(buf) >= HDR + struct.unpack_from("<I", buf, 24)[0]:
                plen = struct.unpack_from("<I", buf, 24)[0]
                typ, body, buf = buf[4], buf[HDR:HDR + plen], buf[HDR + plen:]
                if typ == F_AUTH:
                    res = "accepted the relay's key (sent its AUTH for it)"
                elif typ == F_ERROR:
                    res = "refused: " + body[4:].decode(errors="replace")
                else:
                    continue
                break
            if not res.startswith("refused: closed"):
                break
        print("rank %d (bridge %s, role %d) %s" % (stage, bid[:8], role, res), flush=True)
        c.close()

    ls = listening(listen_port, 16)
    print(f"mitm relay :{listen_port}", flush=True)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()


def pending(to, manifest, as_rank, addrs, per_addr, seconds, count_file):
    import os
    from cryptography.hazmat.primitives.asymmetric import x25519
    from cryptography.hazmat.primitives import serialization
    raw = serialization.Encoding.Raw, serialization.PublicFormat.Raw
    m, mhash = manifest_facts(manifest)
    r = int(as_rank)
    key = bytes.fromhex(m["ranks"][r]["node"])
    host, port = to.rsplit(":", 1)
    srcs = ["127.0.0.%d" % (2 + i) for i in range(int(addrs))]
    end = time.time() + float(seconds)
    held = {}          # socket -> source address
    opened = closed = 0
    last_write = 0

    def open_one(src):
        s = socket.socket()
        s.bind((src, 0))
        s.settimeout(2)
        s.connect((host, int(port)))
        eph = x25519.X25519PrivateKey.generate().public_key().public_bytes(*raw)
        s.sendall(hello_frame(m["ring"], r, len(m["ranks"]), key, mhash, os.urandom(32), eph))
        s.setblocking(False)
        return s

    while time.time() < end:
        for src in srcs:
            while sum(1 for v in held.values() if v == src) < int(per_addr) and time.time() < end:
                try:
                    held[open_one(src)] = src
                    opened += 1
                except OSError:
                    time.sleep(0.01)
                    break
        rd, _, _ = select.select(list(held), [], [], 0.05)
        for s in rd:
            try:
                d = s.recv(4096)
            except OSError:
                d = b""
            if not d:
                held.pop(s)
                s.close()
                closed += 1
        if count_file and time.time() - last_write > 0.1:
            last_write = time.time()
            with open(count_file + ".tmp", "w") as f:
                f.write("%d\n" % len(held))
            os.replace(count_file + ".tmp", count_file)
    print(f"opened {opened} pending links with valid HELLOs as rank {r}; the stage closed {closed}", flush=True)


def main(argv):
    if len(argv) >= 4 and argv[1] in ("proxy", "relay"):
        record, nth = None, 1
        rest = argv[5:] if argv[1] == "proxy" else argv[4:]
        while rest:
            if rest[0] == "--record":
                record = rest[1]
            elif rest[0] == "--nth":
                nth = int(rest[1])
            rest = rest[2:]
        if argv[1] == "proxy":
            proxy(argv[2], argv[3], argv[4], record, nth)
        else:
            relay(argv[2], argv[3], record, nth)
    elif len(argv) == 5 and argv[1] == "reflect":
        reflect(argv[2], argv[3], argv[4])
    elif len(argv) == 5 and argv[1] == "idle":
        idle(argv[2], argv[3], argv[4])
    elif len(argv) == 4 and argv[1] == "mitm":
        mitm(argv[2], argv[3])
    elif len(argv) in (8, 10) and argv[1] == "pending":
        pending(argv[2], argv[3], argv[4], argv[5], argv[6], argv[7], argv[9] if len(argv) == 10 else None)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

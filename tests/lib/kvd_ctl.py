"""kvd_ctl.py: the tests' one client of a stage's control socket from Python (a JSON request
line, one JSON answer line; docs/ring.md, "Control socket")."""
import json, socket


def status(sock, timeout=5):
    """The stage's status object ({"op":"status"}); raises OSError or ValueError."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(sock)
        s.sendall(b'{"op":"status"}\n')
        buf = b""
        while b"\n" not in buf:
            d = s.recv(65536)
            if not d:
                break
            buf += d
    finally:
        s.close()
    return json.loads(buf.split(b"\n")[0])

#!/usr/bin/env python3
"""A stand-in for systemd's notification socket: binds a Unix datagram socket at argv[1] and
appends every datagram it receives (sd_notify's READY=1, RELOADING=1, STOPPING=1, STATUS=...)
to the file argv[2], one line per field, until killed."""
import os
import socket
import sys

path, out = sys.argv[1], sys.argv[2]
if os.path.exists(path):
    os.unlink(path)
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
with open(out, "a", buffering=1) as f:
    f.write("listening\n")
    while True:
        data = s.recv(65536)
        for field in data.decode(errors="replace").split("\n"):
            if field:
                f.write(field + "\n")

#!/usr/bin/env python3
"""hostile_seeder.py MODE_FILE PORT_FILE CATALOG WINDOW SOURCE — a seeder (the kvd seeder's routes)
and a plain range server (/model.gguf) on 127.0.0.1 that misbehave on purpose, for
tests/integration/test-seed-hostile.sh. It serves WINDOW as every window of the catalog's model and SOURCE
as /model.gguf, and writes its port to PORT_FILE. Each request reads its MODE from MODE_FILE
(so one server, at one URL, can answer a pull and then misbehave on its resume):
  ok            answers as a seeder and a range server should (one range: 206)
  cut           sends half the window, then closes (a clean interruption: resumable)
  wrong-offset  answers "bytes=N-" with a 206 from byte 0 (Content-Range saying so)
  wrong-total   answers "bytes=N-" with the right bytes but a Content-Range total 1000 larger
  huge-head     announces a 300 MB window on HEAD (and sends that much on GET)
  over-send     sends the window and 1 MiB more, with no Content-Length, then closes
  plain-offset  /model.gguf: ranges past the first 64 KiB answered from byte 0
  plain-short   /model.gguf: ranges past the first 64 KiB answered 10 bytes short
  plain-total   /model.gguf: every Content-Range total 4096 larger than the file
Every request is logged to stderr."""
import hashlib, http.server, json, re, sys

MODE_FILE, PORT_FILE, CATALOG, WINDOW, SOURCE = sys.argv[1:6]
MODE = 'ok'
cat = open(CATALOG, 'rb').read()
ID = hashlib.sha256(cat).hexdigest()
meta = json.loads(cat)
win = open(WINDOW, 'rb').read()
src = open(SOURCE, 'rb').read()


class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def log_message(self, fmt, *args):
        sys.stderr.write('%s %s\n' % (MODE, fmt % args))

    def send(self, code, body, headers=(), length=True):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        if length:
            self.send_header('Content-Length', str(len(body)))
        self.send_header('Connection', 'close')
        self.end_headers()
        self.close_connection = True
        if self.command != 'HEAD':
            try:
                self.wfile.write(body)
            except OSError:
                pass

    def range(self):
        m = re.match(r'bytes=(\d+)-(\d*)$', self.headers.get('Range', ''))
        return (int(m.group(1)), int(m.group(2)) if m.group(2) else None) if m else None

    def window(self):
        r = self.range()
        size = len(win)
        etag = ('ETag', '"w-%s"' % hashlib.sha256(win).hexdigest()[:16])
        if MODE == 'huge-head':
            self.send_response(200)
            self.send_header('Content-Length', str(300 << 20))
            self.send_header('Connection', 'close')
            self.end_headers()
            self.close_connection = True
            for _ in range(300 if self.command != 'HEAD' else 0):
                self.wfile.write(b'\0' * (1 << 20))
            return
        if MODE == 'over-send':
            if self.command == 'HEAD':
                return self.send(200, win, [etag])
            return self.send(200, win + b'\0' * (1 << 20), [etag], length=False)
        if MODE == 'cut' and not r:
            self.send_response(200)
            self.send_header('Content-Length', str(size))
            self.send_header(*etag)
            self.send_header('Connection', 'close')
            self.end_headers()
            self.close_connection = True
            if self.command != 'HEAD':
                self.wfile.write(win[:size // 2])
            return
        if r:
            a = r[0]
            if MODE == 'wrong-offset':
                body = win[:size - a]
                return self.send(206, body, [etag, ('Content-Range', 'bytes 0-%d/%d' % (len(body) - 1, size))])
            total = size + 1000 if MODE == 'wrong-total' else size
            return self.send(206, win[a:], [etag, ('Content-Range', 'bytes %d-%d/%d' % (a, size - 1, total))])
        self.send(200, win, [etag])

    def plain(self):
        r = self.range()
        size = len(src)
        if not r:
            return self.send(200, src)
        a, b = r[0], min(r[1] if r[1] is not None else size - 1, size - 1)
        total = size + 4096 if MODE == 'plain-total' else size
        if a >= 65536 and MODE == 'plain-offset':
            return self.send(206, src[:b - a + 1], [('Content-Range', 'bytes 0-%d/%d' % (b - a, total))])
        if a >= 65536 and MODE == 'plain-short':
            b -= 10
        self.send(206, src[a:b + 1], [('Content-Range', 'bytes %d-%d/%d' % (a, b, total))])

    def do_GET(self):
        global MODE
        MODE = open(MODE_FILE).read().strip()
        p = self.path
        if p == '/v1/models':
            n = meta['n_layers']
            body = json.dumps({'models': [{'id': ID, 'name': 'hostile', 'arch': meta['arch'], 'n_layers': n,
                                           'layers': [0, n], 'size': len(src)}]}).encode()
            return self.send(200, body)
        if p == '/v1/catalog/' + ID:
            return self.send(200, cat)
        if p.startswith('/v1/windows/' + ID + '/'):
            return self.window()
        if p == '/model.gguf':
            return self.plain()
        self.send(404, b'not here\n')

    do_HEAD = do_GET


s = http.server.ThreadingHTTPServer(('127.0.0.1', 0), H)
with open(PORT_FILE + '.tmp', 'w') as f:
    f.write('%d\n' % s.server_address[1])
import os
os.rename(PORT_FILE + '.tmp', PORT_FILE)
s.serve_forever()

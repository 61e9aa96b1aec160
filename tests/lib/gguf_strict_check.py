#!/usr/bin/env python3
"""gguf_strict_check.py FILE... — an independent GGUF reader (written from the format
description, not from our C code) that applies llama.cpp's stricter loader rules: version 2/3,
unique keys, u32 power-of-two general.alignment, tensor names shorter than 64 bytes and
unique, at most 4 dims, row length a multiple of the block size, tensors laid out in order
each padded to the alignment (offset == running padded sum), and the data section present.
Prints one line per file; exits 1 if any file breaks a rule."""
import struct, sys

BLOCK = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 6: (32, 22), 7: (32, 24), 8: (32, 34),
         9: (32, 36), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
         15: (256, 292), 30: (1, 2), 24: (1, 1), 25: (1, 2), 26: (1, 4), 27: (1, 8), 28: (1, 8)}
FIXED = {0: 'B', 1: 'b', 2: 'H', 3: 'h', 4: 'I', 5: 'i', 6: 'f', 7: '?', 10: 'Q', 11: 'q', 12: 'd'}


class R:
    def __init__(self, b):
        self.b, self.p = b, 0

    def take(self, fmt):
        n = struct.calcsize('<' + fmt)
        if self.p + n > len(self.b):
            raise ValueError('truncated at %d' % self.p)
        v = struct.unpack_from('<' + fmt, self.b, self.p)
        self.p += n
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take('Q')
        if self.p + n > len(self.b):
            raise ValueError('string past end')
        s = self.b[self.p:self.p + n]
        self.p += n
        return s.decode('utf-8')

    def value(self, t, depth=0):
        if t in FIXED:
            return self.take(FIXED[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take('I'), self.take('Q')
            if depth > 3:
                raise ValueError('arrays nested too deep')
            return [self.value(et, depth + 1) for _ in range(n)]
        raise ValueError('bad value type %d' % t)


def check(path):
    b = open(path, 'rb').read()
    r = R(b)
    if r.take('I') != 0x46554747:
        raise ValueError('bad magic')
    ver = r.take('I')
    if ver not in (2, 3):
        raise ValueError('version %d' % ver)
    nt, nkv = r.take('Q'), r.take('Q')
    kv = {}
    for _ in range(nkv):
        k = r.string()
        if k in kv:
            raise ValueError('duplicate key ' + k)
        t = r.take('I')
        kv[k] = r.value(t)
        if k == 'general.alignment' and t != 4:
            raise ValueError('alignment not u32')
    align = kv.get('general.alignment', 32)
    if align == 0 or align & (align - 1):
        raise ValueError('alignment %d' % align)
    infos, names, expect = [], set(), 0
    for _ in range(nt):
        name = r.string()
        if len(name.encode()) >= 64:
            raise ValueError('tensor name too long: ' + name)
        if name in names:
            raise ValueError('duplicate tensor ' + name)
        names.add(name)
        nd = r.take('I')
        if nd < 1 or nd > 4:
            raise ValueError('%s: n_dims %d' % (name, nd))
        ne = [r.take('Q') for _ in range(nd)]
        t, off = r.take('I'), r.take('Q')
        if t not in BLOCK:
            raise ValueError('%s: type %d' % (name, t))
        be, bb = BLOCK[t]
        if ne[0] % be:
            raise ValueError('%s: row %d not a multiple of %d' % (name, ne[0], be))
        nel = 1
        for x in ne:
            nel *= x
        size = nel // be * bb
        if off != expect:
            raise ValueError('%s: offset %d, llama.cpp expects %d' % (name, off, expect))
        expect += (size + align - 1) // align * align
        infos.append((name, off, size))
    data = (r.p + align - 1) // align * align
    for name, off, size in infos:
        if data + off + size > len(b):
            raise ValueError('%s: data past end of file' % name)
    if 'general.architecture' not in kv:
        raise ValueError('no general.architecture')
    return '%s: ok (v%d, %d keys, %d tensors, arch %s)' % (path, ver, nkv, nt, kv['general.architecture'])


bad = 0
for p in sys.argv[1:]:
    try:
        print(check(p))
    except (ValueError, UnicodeDecodeError, struct.error, OSError) as e:
        print('%s: FAIL %s' % (p, e))
        bad = 1
sys.exit(bad)

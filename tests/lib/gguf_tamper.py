#!/usr/bin/env python3
"""gguf_tamper.py IN OUT KEY INDEX — copy a GGUF file, changing element INDEX of the string
array KEY (a vocabulary piece, say) to other bytes of the same length, so that no offset and
no tensor byte moves: what a hostile seeder would do to make a stage print its word. Prints
the old and the new piece."""
import struct, sys

FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def skip_value(b, p, t):
    if t in FIXED:
        return p + FIXED[t]
    if t == 8:
        n, = struct.unpack_from('<Q', b, p)
        return p + 8 + n
    if t == 9:
        et, n = struct.unpack_from('<IQ', b, p)
        p += 12
        if et in FIXED:
            return p + n * FIXED[et]
        for _ in range(n):
            p = skip_value(b, p, et)
        return p
    raise ValueError('value type %d' % t)


def main():
    src, dst, key, index = sys.argv[1], sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])
    b = bytearray(open(src, 'rb').read())
    magic, ver, nt, nkv = struct.unpack_from('<IIQQ', b, 0)
    assert magic == 0x46554747, 'not a GGUF file'
    p = 24
    for _ in range(nkv):
        kl, = struct.unpack_from('<Q', b, p)
        k = bytes(b[p + 8:p + 8 + kl])
        p += 8 + kl
        t, = struct.unpack_from('<I', b, p)
        p += 4
        if k == key:
            et, n = struct.unpack_from('<IQ', b, p)
            assert t == 9 and et == 8 and index < n, '%s is not a string array with %d elements' % (key, index + 1)
            q = p + 12
            for _ in range(index):
                q = skip_value(b, q, 8)
            sl, = struct.unpack_from('<Q', b, q)
            old = bytes(b[q + 8:q + 8 + sl])
            assert sl > 0, 'piece %d is empty' % index
            new = bytes((c ^ 0x20) if chr(c).isalpha() else ord('X') for c in old)
            if new == old:
                new = b'Z' * sl
            b[q + 8:q + 8 + sl] = new
            open(dst, 'wb').write(b)
            print('%s[%d]: %r -> %r' % (key.decode(), index, old, new))
            return 0
        p = skip_value(b, p, t)
    sys.exit('%s: no key %s' % (src, key.decode()))


if __name__ == '__main__':
    sys.exit(main())

#!/usr/bin/env python3
"""near_tie.py A.f32 B.f32 N TOK_A TOK_B NAME_B: whether two greedy generations that part at
prompt position N part at a near-tie. A.f32 and B.f32 are `kvctl logits` outputs (n rows of
n_vocab little-endian floats) of the common prefix from two kernel implementations, A the
one that is trusted; row N-1 is the position where A chose TOK_A and B chose TOK_B.

A near-tie: in A's logits the two tokens lie within 1% of the row's range of each other, and
B's logits of that row agree with A's (NMSE < 1e-3), so the parting comes from the order of
float sums, not from a wrong kernel. Prints one line; exit status 0 for a near-tie, else 1.
"""
import struct
import sys


def row(path, n, last):
    data = open(path, "rb").read()
    nv = len(data) // 4 // n
    return struct.unpack("<%df" % nv, data[last * nv * 4:(last + 1) * nv * 4])


def main():
    a_path, b_path, n, ta, tb, name_b = sys.argv[1:7]
    n, ta, tb = int(n), int(ta), int(tb)
    a, b = row(a_path, n, n - 1), row(b_path, n, n - 1)
    if len(a) != len(b) or not a:
        print(f"     logits rows differ in size: {len(a)} vs {len(b)}")
        return 1
    rng = max(a) - min(a)
    gap = abs(a[ta] - a[tb])
    nmse = sum((u - v) ** 2 for u, v in zip(a, b)) / max(sum(u * u for u in a), 1e-30)
    print(f"     parted at position {n}: tokens {ta} vs {tb}, logit gap {gap:.4g} of range "
          f"{rng:.4g}, NMSE {name_b} {nmse:.2e}")
    return 0 if gap <= 0.01 * rng and nmse < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())

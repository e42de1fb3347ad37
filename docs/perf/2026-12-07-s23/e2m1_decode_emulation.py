#!/usr/bin/env python3
# Host check of grouped-mxfp4-decode.patch's e2m1x8_bf16x8 (not yet run on a GPU): PTX prmt.b32
# emulated (default mode: selector nibble bits 0-2 pick one of the 8 bytes of {b, a}, bit 3
# replicates the picked byte's top bit), the decode's permutes applied to 65,536 words that cover
# every pair of 16-bit halves' patterns plus random words, each output BF16 compared with the E2M1
# value table (OCP MX spec: 0, 0.5, 1, 1.5, 2, 3, 4, 6, sign in bit 3; code 8 is -0). Prints the
# mismatch count (0 when session 23 ran it).
import random
import struct

def prmt(a, b, sel):
    byts = [(a >> (8 * i)) & 0xFF for i in range(4)] + [(b >> (8 * i)) & 0xFF for i in range(4)]
    out = 0
    for i in range(4):
        n = (sel >> (4 * i)) & 0xF
        v = byts[n & 7]
        if n & 8:
            v = 0xFF if v & 0x80 else 0
        out |= v << (8 * i)
    return out

def bf16_bits(x):
    return struct.unpack('<I', struct.pack('<f', x))[0] >> 16

MAG = [0, 0.5, 1, 1.5, 2, 3, 4, 6]

def decode(c):
    c4 = (c << 4) & 0xFFFFFFFF
    idx = [c & 0x7777, (c >> 16) & 0x7777]
    signs = [prmt(c4, c, 0xD9C8), prmt(c4, c, 0xFBEA)]
    vals = []
    for h in range(2):
        lo = prmt(0xC0800000, 0xC0804000, idx[h])
        hi = prmt(0x3F3F3F00, 0x40404040, idx[h]) | (signs[h] & 0x80808080)
        for w in (prmt(lo, hi, 0x5140), prmt(lo, hi, 0x7362)):
            vals += [w & 0xFFFF, w >> 16]
    return vals

bad = 0
rng = random.Random(0)
for t in range(1 << 17):
    c = (t | (t << 16)) if t < (1 << 16) else rng.getrandbits(32)
    for j, got in enumerate(decode(c)):
        code = (c >> (4 * j)) & 0xF
        want = 0x8000 if code == 8 else bf16_bits(-MAG[code & 7] if code & 8 else MAG[code])
        bad += got != want
print('mismatches', bad)

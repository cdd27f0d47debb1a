"""The codec's byte layout in slow, plain Python: the definition the numba kernels must match.

Written for reading, not speed: one Python int per value, bit strings built with a list of
'0'/'1' characters. The tests encode the same inputs with both and compare bytes, decode
each other's output, and check the golden vectors in ``tests/golden/codec``. The layout is
documented in :mod:`aggregator.store.codec`; this module imports nothing of the project so
that a bug in the kernels cannot leak into their reference.
"""

from __future__ import annotations

import math
import struct
from functools import cache

__all__ = ["decode_gorilla", "decode_group", "encode_gorilla", "encode_group", "entropy_tables"]

VERSION = 1
TS_DOD = 1
C_CONST, C_CONST_INT, C_XOR, C_DELTA, C_DOD, C_ZERO = 1, 2, 3, 4, 5, 6
C_DELTA_ANS, C_DOD_ANS = 7, 8
PROB_BITS, N_SYM, N_MODELS, RANS_L = 14, 256, 256, 1 << 16
E_MIN, E_MAX = -15, 15
MAX_LAG = 8
XOR_CHECK_BYTES = 4
MASK64 = (1 << 64) - 1


def f2u(x: float) -> int:
    return int(struct.unpack("<Q", struct.pack("<d", x))[0])


def u2f(u: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", u & MASK64))[0])


def zz(x: int) -> int:
    return (x << 1) ^ -1 if x < 0 else x << 1


def unzz(z: int) -> int:
    return (z >> 1) ^ -(z & 1)


def to_i64(u: int) -> int:
    u &= MASK64
    return u - (1 << 64) if u >> 63 else u


def varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


class Bits:
    """MSB-first bit string writer."""

    def __init__(self) -> None:
        self.bits: list[str] = []

    def put(self, value: int, width: int) -> None:
        if width:
            self.bits.append(format(value & ((1 << width) - 1), f"0{width}b"))

    def tobytes(self) -> bytes:
        s = "".join(self.bits)
        s += "0" * (-len(s) % 8)
        return bytes(int(s[i:i + 8], 2) for i in range(0, len(s), 8))


class Reader:
    """Reads varints and bit fields from a blob; raises ValueError past the end."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data = data
        self.pos = pos

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise ValueError("truncated")
        self.pos += 1
        return self.data[self.pos - 1]

    def varint(self) -> int:
        v = shift = 0
        while True:
            b = self.byte()
            v |= (b & 0x7F) << shift
            if b < 0x80:
                return v
            shift += 7

    def bitstream(self, nbytes: int) -> BitReader:
        if self.pos + nbytes > len(self.data):
            raise ValueError("truncated bit stream")
        br = BitReader(self.data[self.pos:self.pos + nbytes])
        self.pos += nbytes
        return br


class BitReader:
    def __init__(self, data: bytes) -> None:
        self.s = "".join(format(b, "08b") for b in data)
        self.i = 0

    def get(self, width: int) -> int:
        if self.i + width > len(self.s):
            raise ValueError("bit stream overrun")
        v = int(self.s[self.i:self.i + width], 2) if width else 0
        self.i += width
        return v


# ---------------------------------------------------------------------------- timestamps


def enc_ts(ts: list[int]) -> bytes:
    b = Bits()
    b.put(ts[0], 64)
    prev_d = 0
    for i in range(1, len(ts)):
        d = ts[i] - ts[i - 1]
        z = zz(to_i64(d - prev_d)) & MASK64
        prev_d = d
        if z == 0:
            b.put(0, 1)
        elif z < 128:
            b.put(0b10, 2)
            b.put(z, 7)
        elif z < 512:
            b.put(0b110, 3)
            b.put(z, 9)
        elif z < 4096:
            b.put(0b1110, 4)
            b.put(z, 12)
        else:
            b.put(0b1111, 4)
            b.put(z, 64)
    body = b.tobytes()
    return bytes([TS_DOD]) + varint(len(body)) + body


def dec_ts(r: Reader, n: int) -> list[int]:
    if r.byte() != TS_DOD:
        raise ValueError("bad timestamp tag")
    br = r.bitstream(r.varint())
    ts = [to_i64(br.get(64))]
    d = 0
    for _ in range(1, n):
        if br.get(1) == 0:
            z = 0
        elif br.get(1) == 0:
            z = br.get(7)
        elif br.get(1) == 0:
            z = br.get(9)
        elif br.get(1) == 0:
            z = br.get(12)
        else:
            z = br.get(64)
        d = to_i64(d + unzz(z))
        ts.append(to_i64(ts[-1] + d))
    return ts


# ---------------------------------------------------------------------------- XOR


def enc_xor(bits: list[int]) -> bytes:
    b = Bits()
    b.put(bits[0], 64)
    plz = ptz = None
    for i in range(1, len(bits)):
        x = bits[i] ^ bits[i - 1]
        if x == 0:
            b.put(0, 1)
            continue
        lz = min(64 - x.bit_length(), 31)
        tz = (x & -x).bit_length() - 1
        if plz is not None and ptz is not None and lz >= plz and tz >= ptz:
            b.put(0b10, 2)
            b.put(x >> ptz, 64 - plz - ptz)
        else:
            sig = 64 - lz - tz
            b.put(0b11, 2)
            b.put(lz, 5)
            b.put(sig & 63, 6)
            b.put(x >> tz, sig)
            plz, ptz = lz, tz
    body = b.tobytes()
    return varint(len(body)) + body


def dec_xor(r: Reader, n: int) -> list[int]:
    br = r.bitstream(r.varint())
    cur = br.get(64)
    out = [cur]
    lz = sig = 0
    for _ in range(1, n):
        if br.get(1) == 0:
            out.append(cur)
            continue
        if br.get(1) == 1:
            lz = br.get(5)
            sig = br.get(6) or 64
            if lz + sig > 64:
                raise ValueError("bad XOR window")
        elif sig == 0:
            raise ValueError("XOR window reused before one was set")
        cur ^= br.get(sig) << (64 - lz - sig)
        out.append(cur)
    return out


# ---------------------------------------------------------------------------- scaled integers


def scaled(v: float, e: int) -> int | None:
    """n with decode(n, e) == v bit for bit, or None (mirrors the kernel's test)."""
    x = v * 10.0 ** e if e >= 0 else v / 10.0 ** -e
    if not abs(x) <= 2.0 ** 53:
        return None
    n = round(x)  # round half to even, like numpy.rint
    return n if f2u(decode_scaled(n, e)) == f2u(v) else None


def decode_scaled(n: int, e: int) -> float:
    return float(n) / 10.0 ** e if e >= 0 else float(n) * 10.0 ** -e


def find_scale(col: list[float]) -> tuple[int, list[int]] | None:
    """The first value's smallest exponent (from 0 down while it fits, else up), raised
    until every value fits."""
    first = col[0]
    if scaled(first, 0) is not None:
        start = 0
        while start > E_MIN and scaled(first, start - 1) is not None:
            start -= 1
    else:
        start = next((x for x in range(1, E_MAX + 1) if scaled(first, x) is not None), E_MAX + 1)
    for e in range(start, E_MAX + 1):
        ints = [scaled(v, e) for v in col]
        if all(n is not None for n in ints):
            return e, [n for n in ints if n is not None]
    return None


def plan(zs: list[int]) -> tuple[list[int], int]:
    """(widths, payload bits) of the cheapest prefix code (ties: fewer classes, smaller)."""
    lens = [z.bit_length() for z in zs]
    m = len(zs)
    lmax = max(lens, default=0)

    def cnt(w: int) -> int:
        return sum(1 for x in lens if x <= w)

    best = ([lmax], m * lmax)
    for w0 in range(lmax):
        bits = m + cnt(w0) * w0 + (m - cnt(w0)) * lmax
        if bits < best[1]:
            best = ([w0, lmax], bits)
    for w0 in range(lmax):
        for w1 in range(w0 + 1, lmax):
            c0, c1 = cnt(w0), cnt(w1) - cnt(w0)
            bits = c0 * (1 + w0) + c1 * (2 + w1) + (m - cnt(w1)) * (2 + lmax)
            if bits < best[1]:
                best = ([w0, w1, lmax], bits)
    return best


def write_stream(zs: list[int], widths: list[int], nbits: int) -> bytes:
    b = Bits()
    for z in zs:
        ln = z.bit_length()
        if len(widths) == 1:
            b.put(z, widths[0])
        elif ln <= widths[0]:
            b.put(0, 1)
            b.put(z, widths[0])
        elif len(widths) == 2:
            b.put(1, 1)
            b.put(z, widths[1])
        elif ln <= widths[1]:
            b.put(0b10, 2)
            b.put(z, widths[1])
        else:
            b.put(0b11, 2)
            b.put(z, widths[2])
    body = b.tobytes()
    assert len(body) == (nbits + 7) // 8
    return varint(len(body)) + bytes([len(widths), *widths]) + body


def read_stream(r: Reader, m: int) -> list[int]:
    nbytes = r.varint()
    c = r.byte()
    if not 1 <= c <= 3:
        raise ValueError("bad class count")
    widths = [r.byte() for _ in range(c)]
    if max(widths) > 64:
        raise ValueError("bad width")
    br = r.bitstream(nbytes)
    out = []
    for _ in range(m):
        if c == 1 or br.get(1) == 0:
            w = widths[0]
        elif c == 2 or br.get(1) == 0:
            w = widths[1]
        else:
            w = widths[2]
        out.append(unzz(br.get(w)))
    return out


# ---------------------------------------------------------------------------- rANS streams


def symbol_of(z: int) -> tuple[int, int]:
    """(symbol, raw bit count) of a zigzagged residual."""
    b = z.bit_length()
    if b <= 4:
        return z, 0
    return 16 + 4 * (b - 5) + ((z >> (b - 3)) & 3), b - 3


def symbol_base(s: int) -> int:
    if s < 16:
        return s
    b = 5 + (s - 16) // 4
    return (4 + (s - 16) % 4) << (b - 3)


@cache
def entropy_tables() -> tuple[list[list[int]], list[list[float]]]:
    """(frequencies, costs in bits) of every model: the formula of the kernel's module."""
    edges = [symbol_base(s) for s in range(N_SYM)] + [2**64]
    freqs, costs = [], []
    for k in range(N_MODELS):
        scale = 2.0 ** ((k % 128 - 12) / 3)
        if k < 128:
            cdf = [1.0 - math.exp(-e / scale) for e in edges]
        else:
            cdf = [math.erf(e / (scale * math.sqrt(2.0))) for e in edges]
        p = [max(cdf[s + 1] - cdf[s], 0.0) for s in range(N_SYM)]
        total = sum(p)
        f = [1 + math.floor(x / total * ((1 << PROB_BITS) - N_SYM)) for x in p]
        f[max(range(N_SYM), key=lambda s: p[s])] += (1 << PROB_BITS) - sum(f)
        freqs.append(f)
        costs.append([PROB_BITS - math.log2(f[s]) + symbol_of(symbol_base(s))[1]
                      for s in range(N_SYM)])
    return freqs, costs


def ans_plan(zs: list[int]) -> tuple[int, float]:
    """(model, estimated bits): each family tried at its fitted scale +-2 steps."""
    _, costs = entropy_tables()
    hist = [0] * N_SYM
    s1 = s2 = 0.0
    for z in zs:
        hist[symbol_of(z)[0]] += 1
        s1 += float(z)
        s2 += float(z) * float(z)
    best_k, best = 0, math.inf
    for fam in range(2):
        mean = s1 / len(zs) if fam == 0 else math.sqrt(s2 / len(zs))
        centre = 12 + round(3 * math.log2(max(mean, 1e-3)))
        for d in range(-2, 3):
            k = fam * 128 + min(max(centre + d, 0), 127)
            bits = 0.0
            for s in range(N_SYM):
                if hist[s]:
                    bits += hist[s] * costs[k][s]
            if bits < best:
                best, best_k = bits, k
    return best_k, best


def ans_stream(zs: list[int], model: int) -> bytes:
    """astream of zs under ``model``: rANS run backwards, one uniform pop per <= 16 raw bits."""
    freqs, _ = entropy_tables()
    f = freqs[model]
    cum = [sum(f[:s]) for s in range(N_SYM + 1)]
    x = RANS_L
    words: list[int] = []  # in emission order
    for z in reversed(zs):
        s, extra = symbol_of(z)
        pieces = [(z >> lo) & ((1 << min(16, extra - lo)) - 1) for lo in range(0, extra, 16)]
        widths = [min(16, extra - lo) for lo in range(0, extra, 16)]
        for v, w in reversed(list(zip(pieces, widths, strict=True))):
            if x >= 1 << (32 - w):
                words.append(x & 0xFFFF)
                x >>= 16
            x = (x << w) | v
        if x >= ((RANS_L >> PROB_BITS) << 16) * f[s]:
            words.append(x & 0xFFFF)
            x >>= 16
        x = (x // f[s] << PROB_BITS) + x % f[s] + cum[s]
    body = bytes([model]) + struct.pack("<I", x) + b"".join(
        struct.pack("<H", w) for w in reversed(words))
    return varint(len(body)) + body


def read_ans_stream(r: Reader, m: int) -> list[int]:
    nbytes = r.varint()
    if nbytes < 5 or (nbytes - 5) % 2 or r.pos + nbytes > len(r.data):
        raise ValueError("bad rANS stream length")
    freqs, _ = entropy_tables()
    f = freqs[r.byte()]
    cum = [sum(f[:s]) for s in range(N_SYM + 1)]
    (x,) = struct.unpack_from("<I", r.data, r.pos)
    words = [w for (w,) in struct.iter_unpack("<H", r.data[r.pos + 4:r.pos + nbytes - 1])]
    r.pos += nbytes - 1
    if x < RANS_L:
        raise ValueError("bad rANS state")

    def refill(x: int) -> int:
        while x < RANS_L:
            if not words:
                raise ValueError("rANS stream overrun")
            x = (x << 16) | words.pop(0)
        return x

    out = []
    for _ in range(m):
        slot = x & ((1 << PROB_BITS) - 1)
        s = next(i for i in range(N_SYM) if cum[i] <= slot < cum[i + 1])
        x = refill(f[s] * (x >> PROB_BITS) + slot - cum[s])
        z, extra, shift = symbol_base(s), symbol_of(symbol_base(s))[1], 0
        while extra > 0:
            w = min(16, extra)
            z |= (x & ((1 << w) - 1)) << shift
            x = refill(x >> w)
            shift += w
            extra -= w
        out.append(unzz(z))
    if x != RANS_L or words:
        raise ValueError("rANS stream does not end where it began")
    return out


def smaller_stream(zs: list[int], prefix: bytes) -> tuple[bool, bytes]:
    """(entropy-coded?, stream): the astream where it is strictly smaller than ``prefix``."""
    if not zs:
        return False, prefix
    model, bits = ans_plan(zs)
    if (bits + 7) // 8 + 7 >= len(prefix):
        return False, prefix
    ans = ans_stream(zs, model)
    return (True, ans) if len(ans) < len(prefix) else (False, prefix)


# ---------------------------------------------------------------------------- columns


def enc_column(col: list[float], entropy_coded: bool = False) -> bytes:
    bits = [f2u(v) for v in col]
    found = None if any(b == 1 << 63 for b in bits) else find_scale(col)
    if all(b == bits[0] for b in bits):
        if bits[0] == 0:
            return bytes([C_ZERO])
        if found is not None:
            e, ints = found
            return bytes([C_CONST_INT, e & 0xFF]) + varint(zz(ints[0]))
        return bytes([C_CONST]) + struct.pack("<Q", bits[0])
    if found is None:
        return bytes([C_XOR]) + enc_xor(bits)
    e, ints = found
    n0 = ints[0]
    g = 0
    for x in ints[1:]:
        a, b = g, abs(x - n0)
        while b:
            a, b = b, a % b
        g = a
    m = [(x - n0) // g for x in ints]
    d = [0] + [m[i] - m[i - 1] for i in range(1, len(m))]
    z1, z2 = residuals(m, 0, 1), residuals(d, 1, 1)
    w1, b1 = plan(z1)
    w2, b2 = plan(z2)
    cost1 = (b1 + 7) // 8 * 8 + 8 * len(w1)
    cost2 = (b2 + 7) // 8 * 8 + 8 * len(w2) + 8 * len(varint(zz(d[1])))
    head = bytes([e & 0xFF]) + varint(zz(n0)) + varint(g)
    if cost2 < cost1:
        lag, z2, w2, b2 = improve_lag(d, 1, z2, w2, b2)
        tag, zs, stream = C_DOD, z2, write_stream(z2, w2, b2)
        head += bytes([lag]) + varint(zz(d[1]))
    else:
        lag, z1, w1, b1 = improve_lag(m, 0, z1, w1, b1)
        tag, zs, stream = C_DELTA, z1, write_stream(z1, w1, b1)
        head += bytes([lag])
    if entropy_coded:
        ans, stream = smaller_stream(zs, stream)
        tag += (C_DELTA_ANS - C_DELTA) if ans else 0
    out = bytes([tag]) + head + stream
    if len(out) > XOR_CHECK_BYTES * len(col) + 16:
        xor = bytes([C_XOR]) + enc_xor(bits)
        if len(xor) < len(out):
            return xor
    return out


def improve_lag(x: list[int], f: int, z: list[int], w: list[int], b: int
                ) -> tuple[int, list[int], list[int], int]:
    """(lag, residuals, widths, bits): lag 1 unless the estimated best lag plans smaller."""
    if b <= len(x) - f - 1:
        return 1, z, w, b
    lag = best_lag(x, f)
    if lag != 1:
        zl = residuals(x, f, lag)
        wl, bl = plan(zl)
        if (bl + 7) // 8 + len(wl) < (b + 7) // 8 + len(w):
            return lag, zl, wl, bl
    return 1, z, w, b


def residuals(x: list[int], f: int, lag: int) -> list[int]:
    """zz(x[i] - x[i-lag]) for i > f, against x[i-1] while i - lag < f."""
    return [zz(x[i] - x[i - lag if i - lag >= f else i - 1]) for i in range(f + 1, len(x))]


def best_lag(x: list[int], f: int) -> int:
    """Fewest summed bit lengths of x[i] - x[i-lag] over i = f+8, f+10, ... (ties: smaller)."""
    idx = range(f + MAX_LAG, len(x), 2)
    costs = [sum(zz(x[i] - x[i - lag]).bit_length() for i in idx)
             for lag in range(1, MAX_LAG + 1)]
    return costs.index(min(costs)) + 1


def dec_column(r: Reader, n: int) -> list[int]:
    tag = r.byte()
    if tag == C_ZERO:
        return [0] * n
    if tag == C_CONST:
        if r.pos + 8 > len(r.data):
            raise ValueError("truncated constant")
        v = int(struct.unpack_from("<Q", r.data, r.pos)[0])
        r.pos += 8
        return [v] * n
    if tag == C_XOR:
        return dec_xor(r, n)
    if tag not in (C_CONST_INT, C_DELTA, C_DOD, C_DELTA_ANS, C_DOD_ANS):
        raise ValueError(f"bad column tag {tag}")
    read = read_stream
    if tag in (C_DELTA_ANS, C_DOD_ANS):
        tag, read = tag - (C_DELTA_ANS - C_DELTA), read_ans_stream
    e = r.byte()
    e = e - 256 if e > 127 else e
    if not E_MIN <= e <= E_MAX:
        raise ValueError("bad exponent")
    n0 = unzz(r.varint())
    if tag == C_CONST_INT:
        return [f2u(decode_scaled(n0, e))] * n
    g = r.varint()
    lag = r.byte()
    if not 1 <= lag <= MAX_LAG:
        raise ValueError("bad lag")
    if tag == C_DELTA:
        m = [0]
        for i, x in enumerate(read(r, n - 1), start=1):
            m.append(m[i - lag if i - lag >= 0 else i - 1] + x)
    else:
        d = [0, unzz(r.varint())]
        for i, x in enumerate(read(r, n - 2), start=2):
            d.append(d[i - lag if i - lag >= 1 else i - 1] + x)
        m = [0]
        for x in d[1:n]:
            m.append(m[-1] + x)
    return [f2u(decode_scaled(n0 + g * x, e)) for x in m[:n]]


# ---------------------------------------------------------------------------- groups


def encode_group(ts: list[int], columns: list[list[float]], entropy_coded: bool = False) -> bytes:
    """ts: T ints; columns: k lists of T floats (column-major, unlike the kernel API)."""
    out = bytes([VERSION]) + varint(len(columns)) + varint(len(ts))
    if not ts:
        return out
    return out + enc_ts(ts) + b"".join(enc_column(c, entropy_coded) for c in columns)


def decode_group(blob: bytes) -> tuple[list[int], list[list[int]]]:
    """Returns (ts, columns of uint64 bit patterns)."""
    r = Reader(blob)
    if r.byte() != VERSION:
        raise ValueError("bad version")
    k, n = r.varint(), r.varint()
    if n == 0:
        cols: list[list[int]] = [[] for _ in range(k)]
    else:
        ts = dec_ts(r, n)
        cols = [dec_column(r, n) for _ in range(k)]
    if r.pos != len(blob):
        raise ValueError("trailing bytes")
    return (ts if n else []), cols


def encode_gorilla(ts: list[int], values: list[float]) -> bytes:
    out = varint(len(ts))
    if not ts:
        return out
    return out + enc_ts(ts) + bytes([C_XOR]) + enc_xor([f2u(v) for v in values])


def decode_gorilla(blob: bytes) -> tuple[list[int], list[int]]:
    r = Reader(blob)
    n = r.varint()
    if n == 0:
        return [], []
    ts = dec_ts(r, n)
    if r.byte() != C_XOR:
        raise ValueError("bad tag")
    vals = dec_xor(r, n)
    if r.pos != len(blob):
        raise ValueError("trailing bytes")
    return ts, vals

# numba kernels mix Python ints with numpy scalars; mypy cannot follow them (see codec.py).
# mypy: disable-error-code="arg-type,assignment,return-value,call-arg,operator,call-overload"
"""rANS entropy stage for the codec's residual streams: closer to the floor than a prefix code.

Why: the prefix code of :mod:`aggregator.store.codec` spends whole bits per width class and
sits about a bit per value above the entropy of noisy readings (power in mW, PCIe in KiB/s).
An arithmetic coder with a good model closes most of that gap. The costly part of one is its
table: a fitted histogram sent with every 120-sample column would eat the gain, so the model
is *parametric*: one byte names one of :data:`N_MODELS` fixed tables (an exponential or a
half-normal law over the zigzagged residual, at scales a third of a bit apart), chosen per
stream for the fewest bits. The tables are a pure function of the model byte, built here at
import from the formula below (and checked against :data:`TABLE_SHA256`, so a platform whose
libm rounds differently fails loudly instead of writing another format).

Symbols: a zigzagged residual z is cut into a symbol (its magnitude class) and raw low bits,
so 256 symbols cover every 64-bit value::

    z < 16:               symbol z, no raw bits
    z of bit length b>=5: symbol 16 + 4*(b-5) + (the two bits after the leading one),
                          raw bits: the low b-3 bits of z

Stream (the ``astream`` of the codec layout)::

    astream := varint nbytes | u8 model | u32 state (LE) | u16 words (LE){(nbytes-5)/2}

rANS with a 32-bit state in [2**16, 2**32), 16-bit renormalisation and 14-bit frequencies.
For each value in order the decoder takes the symbol from the state (slot = x mod 2**14), then
the raw bits, at most 16 at a time, lowest first, each as a uniform symbol (the low k bits
of x, then x >>= k); after each, while x < 2**16, x = (x << 16) | next word. The encoder runs
backwards from x = 2**16 and the decoder must end on exactly that state with no word left,
which also checks the stream.

The codec calls :func:`plan` (model and bit estimate from a histogram, no writes) and
:func:`encode` only where the plan beats the prefix code, and keeps the smaller stream. It
decodes a group's streams four at a time (:func:`decode4`; the last one to three with
:func:`decode2` and :func:`decode`): a stream's values form one chain of dependent steps, and
four chains in one loop decode 1.7-1.9x the values per second of one (the benchmark's
streams).
"""

from __future__ import annotations

import hashlib
import math
from typing import Final

import numba as nb
import numpy as np
from numba.cpython.unsafe.numbers import leading_zeros

__all__ = [
    "COST",
    "CUM",
    "FREQ",
    "LOOKUP",
    "N_MODELS",
    "PROB_BITS",
    "TABLES",
    "build_freq",
    "decode",
    "decode2",
    "decode4",
    "encode",
    "plan",
    "symbol_base",
    "symbol_extra",
]

PROB_BITS: Final = 14
M: Final = 1 << PROB_BITS
N_SYM: Final = 256
N_MODELS: Final = 256
SCALE_STEPS: Final = 3
"""Models per doubling of the scale (a third of a bit off costs under 0.01 bit a value)."""
SCALE_OFFSET: Final = 12
"""Model k (per family) has scale 2 ** ((k - SCALE_OFFSET) / SCALE_STEPS): 2**-4 .. 2**38."""
RANS_L: Final = 1 << 16
TABLE_SHA256: Final = "bde341622b643e343b4d1f48be2bf8e84e44175934850249aa6904d81195d794"

U64 = nb.uint64


def symbol_base(s: int) -> int:
    """Smallest z of symbol s."""
    if s < 16:
        return s
    b = 5 + (s - 16) // 4
    return (4 + (s - 16) % 4) << (b - 3)


def symbol_extra(s: int) -> int:
    """Raw bits after symbol s."""
    return 0 if s < 16 else 5 + (s - 16) // 4 - 3


def build_freq() -> list[list[int]]:
    """The frequency table of every model (rows sum to 2**14, every entry >= 1).

    Models 0..127: z exponential with mean 2**((k-12)/3); 128..255: z half-normal with that
    sigma. A symbol's probability is the law's mass over [base, base + 2**extra) (continuous
    CDF), quantised as 1 + floor(p * (2**14 - 256)), the rest to the likeliest symbol.
    """
    edges = [symbol_base(s) for s in range(N_SYM)] + [2**64]
    table = []
    for k in range(N_MODELS):
        scale = 2.0 ** ((k % 128 - SCALE_OFFSET) / SCALE_STEPS)
        if k < 128:
            cdf = [1.0 - math.exp(-e / scale) for e in edges]
        else:
            cdf = [math.erf(e / (scale * math.sqrt(2.0))) for e in edges]
        p = [max(cdf[s + 1] - cdf[s], 0.0) for s in range(N_SYM)]
        total = sum(p)
        f = [1 + math.floor(x / total * (M - N_SYM)) for x in p]
        f[max(range(N_SYM), key=lambda s: p[s])] += M - sum(f)
        table.append(f)
    return table


def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    freq = np.asarray(build_freq(), dtype=np.int64)
    digest = hashlib.sha256(freq.astype("<u2").tobytes()).hexdigest()
    if digest != TABLE_SHA256:
        raise RuntimeError(f"entropy tables differ from the format's ({digest}): this "
                           "platform's math library rounds differently; refusing to run")
    cum = np.zeros((N_MODELS, N_SYM + 1), np.int64)
    np.cumsum(freq, axis=1, out=cum[:, 1:])
    lookup = np.empty((N_MODELS, M), np.uint8)
    for k in range(N_MODELS):
        lookup[k] = np.repeat(np.arange(N_SYM, dtype=np.uint8), freq[k])
    # Python's log2, not numpy's: the reference computes the same costs, and the model the
    # encoder picks must not depend on which library rounded a near tie
    cost = np.asarray([[PROB_BITS - math.log2(f) + symbol_extra(s) for s, f in enumerate(row)]
                       for row in freq.tolist()], np.float64)
    return freq, cum, lookup, cost


FREQ, CUM, LOOKUP, COST = _tables()
SYM_BASE = np.asarray([symbol_base(s) for s in range(N_SYM)], np.uint64)
SYM_EXTRA = np.asarray([symbol_extra(s) for s in range(N_SYM)], np.int64)
FC = ((FREQ << 16) | CUM[:, :N_SYM]).astype(np.uint32)
"""Per model and symbol, frequency << 16 | cumulative frequency: what a decode step loads."""


@nb.njit(inline="always", cache=True)
def _symbol(z: np.uint64) -> int:  # pragma: no cover - numba
    b = 64 - np.int64(leading_zeros(z))
    if b <= 4:
        return np.int64(z)
    return 16 + 4 * (b - 5) + np.int64((z >> U64(b - 3)) & U64(3))


@nb.njit(cache=True)
def _plan(z: np.ndarray, m: int, hist: np.ndarray, cost: np.ndarray) -> tuple[int, float]:
    # pragma: no cover - numba
    """(model, estimated payload bits) for z[:m]: each family tried around its fitted scale."""
    hist[:] = 0
    s1 = 0.0
    s2 = 0.0
    lo = N_SYM
    hi = 0
    for i in range(m):
        s = _symbol(z[i])
        hist[s] += 1
        lo = min(lo, s)
        hi = max(hi, s)
        v = np.float64(z[i])
        s1 += v
        s2 += v * v
    best_k = 0
    best = np.inf
    for fam in range(2):
        mean = s1 / m if fam == 0 else math.sqrt(s2 / m)
        centre = SCALE_OFFSET + np.int64(np.rint(SCALE_STEPS * math.log2(max(mean, 1e-3))))
        for d in range(-2, 3):
            k = min(max(centre + d, 0), 127)
            row = cost[fam * 128 + k]
            bits = 0.0
            for s in range(lo, hi + 1):
                if hist[s]:
                    bits += hist[s] * row[s]
            if bits < best:
                best = bits
                best_k = fam * 128 + k
    return best_k, best


@nb.njit(cache=True)
def _encode(z: np.ndarray, m: int, k: int, freq: np.ndarray, cum: np.ndarray,
            words: np.ndarray) -> tuple[int, np.uint64]:  # pragma: no cover - numba
    """rANS of z[:m] with model k, backwards: words[:n] in emission order; (n, final state)."""
    x = U64(RANS_L)
    n = 0
    f_row = freq[k]
    c_row = cum[k]
    for i in range(m - 1, -1, -1):
        zi = z[i]
        s = _symbol(zi)
        extra = 0 if s < 16 else (s - 16) // 4 + 2
        # raw pieces: the decoder pops the lowest 16 bits first, so push the highest first
        top = (extra - 1) // 16 if extra > 0 else -1
        for piece in range(top, -1, -1):
            width = min(16, extra - 16 * piece)
            v = (zi >> U64(16 * piece)) & ((U64(1) << U64(width)) - U64(1))
            x_max = U64(1) << U64(32 - width)
            if x >= x_max:
                words[n] = np.uint16(x & U64(0xFFFF))
                n += 1
                x >>= U64(16)
            x = (x << U64(width)) | v
        f = U64(f_row[s])
        x_max = (U64(RANS_L >> PROB_BITS) << U64(16)) * f
        if x >= x_max:
            words[n] = np.uint16(x & U64(0xFFFF))
            n += 1
            x >>= U64(16)
        x = ((x // f) << U64(PROB_BITS)) + (x % f) + U64(c_row[s])
    return n, x


@nb.njit(cache=True)
def _refill(buf: np.ndarray, x: np.uint64, w: int) -> tuple[np.uint64, int]:
    # pragma: no cover - numba
    """x << 16 | the next word when x fell below 2**16, without a branch.

    Whether a step needs a word depends on the data (about every other value), so a branch
    here is mispredicted often; the word is loaded either way. Reading up to 10 bytes past
    the stream is safe (blobs are padded) and caught afterwards: ``w`` then ends past the
    stream's end, which the callers check.
    """
    word = U64(buf[U64(w)]) | (U64(buf[U64(w + 1)]) << U64(8))  # unsigned: no wraparound test
    need = x < U64(RANS_L)
    return ((x << U64(16)) | word) if need else x, w + (2 if need else 0)


@nb.njit(cache=True)
def _wide_raw(buf: np.ndarray, x: np.uint64, w: int, z: np.uint64,
              extra: int) -> tuple[np.uint64, int, np.uint64]:  # pragma: no cover - numba
    """The raw pieces after the first 16 bits of a value with ``extra`` > 16 raw bits
    (residuals of 2**19 and more; inlined: a call would count references to ``buf`` at
    every value)."""
    shift = 16
    extra -= 16
    while extra > 0:
        width = min(16, extra)
        z |= (x & ((U64(1) << U64(width)) - U64(1))) << U64(shift)
        x >>= U64(width)
        x, w = _refill(buf, x, w)
        shift += width
        extra -= width
    return x, w, z


@nb.njit(cache=True)
def _step(buf: np.ndarray, x: np.uint64, w: int, l_row: np.ndarray, fc_row: np.ndarray,
          base: np.ndarray, extra: np.ndarray) -> tuple[np.uint64, int, np.uint64, int]:
    # pragma: no cover - numba
    """Decode one value: its symbol from the state, then up to 16 raw bits; (x, w, z, raw
    bits in all). The caller takes the rest (:func:`_wide_raw`) when more than 16: kept
    out of here, a branch inside stops numba pruning a reference count per value.

    ``fc_row`` packs a symbol's frequency and cumulative frequency in one word (one load
    on the state's dependency chain instead of two); the first 16 raw bits, which are all
    the raw bits of residuals below 2**19, are taken without a branch.
    """
    slot = x & U64(M - 1)
    s = U64(l_row[slot])
    fc = U64(fc_row[s])
    x = (fc >> U64(16)) * (x >> U64(PROB_BITS)) + slot - (fc & U64(0xFFFF))
    x, w = _refill(buf, x, w)
    ex = extra[s]
    width = min(ex, 16)
    z = base[s] | (x & ((U64(1) << U64(width)) - U64(1)))
    x >>= U64(width)
    x, w = _refill(buf, x, w)
    return x, w, z, ex


@nb.njit(inline="always", cache=True)
def _unzz(z: np.uint64) -> np.int64:  # pragma: no cover - numba
    return np.int64(z >> U64(1)) ^ -np.int64(z & U64(1))


@nb.njit(inline="always", cache=True)
def _open(buf: np.ndarray, pos: int, end: int) -> tuple[int, np.uint64]:
    # pragma: no cover - numba
    """(model, initial state) of the astream body [pos, end); model -1 when malformed."""
    if end - pos < 5 or (end - pos - 5) % 2:
        return -1, U64(0)
    x = U64(buf[pos + 1]) | (U64(buf[pos + 2]) << U64(8)) | (U64(buf[pos + 3]) << U64(16)) \
        | (U64(buf[pos + 4]) << U64(24))
    if x < U64(RANS_L):
        return -1, U64(0)
    return np.int64(buf[pos]), x


@nb.njit(cache=True)
def _decode(buf: np.ndarray, pos: int, end: int, m: int, lookup: np.ndarray, fc: np.ndarray,
            base: np.ndarray, extra: np.ndarray, out: np.ndarray) -> int:
    # pragma: no cover - numba
    """Read an astream body (after its varint) of bytes [pos, end) into out[:m] as int64
    residuals (un-zigzagged); returns end, or -1 when the stream is malformed."""
    k, x = _open(buf, pos, end)
    if k < 0:
        return -1
    w = pos + 5
    l_row = lookup[k]
    fc_row = fc[k]
    for i in range(m):
        if w > end:
            return -1
        x, w, z, ex = _step(buf, x, w, l_row, fc_row, base, extra)
        if ex > 16:
            x, w, z = _wide_raw(buf, x, w, z, ex)
        out[i] = _unzz(z)
    if x != U64(RANS_L) or w != end:
        return -1
    return end


@nb.njit(inline="always", cache=True)
def _finish(buf: np.ndarray, x: np.uint64, w: int, end: int, l_row: np.ndarray,
            fc_row: np.ndarray, base: np.ndarray, extra: np.ndarray, i0: int, m: int,
            out: np.ndarray) -> bool:  # pragma: no cover - numba
    """A lane's values from i0 to m alone, then its end check (final state, no word left)."""
    for i in range(i0, m):
        if w > end:
            return False
        x, w, z, ex = _step(buf, x, w, l_row, fc_row, base, extra)
        if ex > 16:
            x, w, z = _wide_raw(buf, x, w, z, ex)
        out[i] = _unzz(z)
    return x == U64(RANS_L) and w == end


@nb.njit(cache=True)
def _decode2(buf: np.ndarray, s0: int, e0: int, m0: int, s1: int, e1: int, m1: int,
             out0: np.ndarray, out1: np.ndarray, lookup: np.ndarray, fc: np.ndarray,
             base: np.ndarray, extra: np.ndarray) -> bool:  # pragma: no cover - numba
    """Decode two astream bodies, [s0, e0) -> out0[:m0] and [s1, e1) -> out1[:m1], at once
    (what :func:`_decode4` does for four, for the two or three left of a group's columns).
    False when either is malformed."""
    k0, x0 = _open(buf, s0, e0)
    k1, x1 = _open(buf, s1, e1)
    if k0 < 0 or k1 < 0:
        return False
    w0 = s0 + 5
    w1 = s1 + 5
    l0, l1 = lookup[k0], lookup[k1]
    f0, f1 = fc[k0], fc[k1]
    mmin = min(m0, m1)
    for i in range(mmin):
        if w0 > e0 or w1 > e1:
            return False
        x0, w0, z0, ex = _step(buf, x0, w0, l0, f0, base, extra)
        if ex > 16:
            x0, w0, z0 = _wide_raw(buf, x0, w0, z0, ex)
        x1, w1, z1, ex = _step(buf, x1, w1, l1, f1, base, extra)
        if ex > 16:
            x1, w1, z1 = _wide_raw(buf, x1, w1, z1, ex)
        out0[i] = _unzz(z0)
        out1[i] = _unzz(z1)
    ok = _finish(buf, x0, w0, e0, l0, f0, base, extra, mmin, m0, out0)
    return _finish(buf, x1, w1, e1, l1, f1, base, extra, mmin, m1, out1) and ok


@nb.njit(cache=True)
def _decode4(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, ms: np.ndarray,
             out: np.ndarray, lookup: np.ndarray, fc: np.ndarray, base: np.ndarray,
             extra: np.ndarray) -> bool:  # pragma: no cover - numba
    """Decode four astream bodies, [starts[l], ends[l]) -> out[l, :ms[l]], at once.

    One stream's decode is a chain of dependent loads and multiplies (a value's symbol
    needs the state the previous value left); four independent chains in one loop keep the
    core busy while each waits: about twice the values per second of one stream. A
    group's columns are such streams, so the layout needs no interleaving of its own.
    False when any is malformed.
    """
    k0, x0 = _open(buf, starts[0], ends[0])
    k1, x1 = _open(buf, starts[1], ends[1])
    k2, x2 = _open(buf, starts[2], ends[2])
    k3, x3 = _open(buf, starts[3], ends[3])
    if k0 < 0 or k1 < 0 or k2 < 0 or k3 < 0:
        return False
    e0, e1, e2, e3 = ends[0], ends[1], ends[2], ends[3]
    w0, w1, w2, w3 = starts[0] + 5, starts[1] + 5, starts[2] + 5, starts[3] + 5
    l0, l1, l2, l3 = lookup[k0], lookup[k1], lookup[k2], lookup[k3]
    f0, f1, f2, f3 = fc[k0], fc[k1], fc[k2], fc[k3]
    o0, o1, o2, o3 = out[0], out[1], out[2], out[3]
    mmin = min(min(ms[0], ms[1]), min(ms[2], ms[3]))
    for i in range(mmin):
        if w0 > e0 or w1 > e1 or w2 > e2 or w3 > e3:
            return False
        x0, w0, z0, ex = _step(buf, x0, w0, l0, f0, base, extra)
        if ex > 16:
            x0, w0, z0 = _wide_raw(buf, x0, w0, z0, ex)
        x1, w1, z1, ex = _step(buf, x1, w1, l1, f1, base, extra)
        if ex > 16:
            x1, w1, z1 = _wide_raw(buf, x1, w1, z1, ex)
        x2, w2, z2, ex = _step(buf, x2, w2, l2, f2, base, extra)
        if ex > 16:
            x2, w2, z2 = _wide_raw(buf, x2, w2, z2, ex)
        x3, w3, z3, ex = _step(buf, x3, w3, l3, f3, base, extra)
        if ex > 16:
            x3, w3, z3 = _wide_raw(buf, x3, w3, z3, ex)
        o0[i] = _unzz(z0)
        o1[i] = _unzz(z1)
        o2[i] = _unzz(z2)
        o3[i] = _unzz(z3)
    ok = _finish(buf, x0, w0, e0, l0, f0, base, extra, mmin, ms[0], o0)
    ok &= _finish(buf, x1, w1, e1, l1, f1, base, extra, mmin, ms[1], o1)
    ok &= _finish(buf, x2, w2, e2, l2, f2, base, extra, mmin, ms[2], o2)
    return _finish(buf, x3, w3, e3, l3, f3, base, extra, mmin, ms[3], o3) and ok


TABLES: Final = (LOOKUP, FREQ, CUM, COST, FC, SYM_BASE, SYM_EXTRA)
"""What the kernels take as ``tab`` (numba would freeze a global table into every
compiled function, and one over 1 MB makes them uncachable)."""


@nb.njit(inline="always", cache=True)
def plan(z: np.ndarray, m: int, hist: np.ndarray, tab: tuple) -> tuple[int, float]:
    # pragma: no cover - numba
    """(model, estimated payload bits) of the zigzagged values z[:m] (hist: 256 int64)."""
    return _plan(z, m, hist, tab[3])


@nb.njit(inline="always", cache=True)
def encode(z: np.ndarray, m: int, k: int, words: np.ndarray, tab: tuple) -> tuple[int, np.uint64]:
    # pragma: no cover - numba
    """rANS words of z[:m] under model k into ``words`` (room for 5*m), emission order."""
    return _encode(z, m, k, tab[1], tab[2], words)


@nb.njit(inline="always", cache=True)
def decode(buf: np.ndarray, pos: int, end: int, m: int, out: np.ndarray, tab: tuple) -> int:
    # pragma: no cover - numba
    """Decode the astream body at [pos, end) into out[:m] (int64 residuals); end or -1."""
    return _decode(buf, pos, end, m, tab[0], tab[4], tab[5], tab[6], out)


@nb.njit(inline="always", cache=True)
def decode2(buf: np.ndarray, s0: int, e0: int, m0: int, s1: int, e1: int, m1: int,
            out0: np.ndarray, out1: np.ndarray, tab: tuple) -> bool:  # pragma: no cover
    """Decode two astream bodies at once (see :func:`_decode2`); False if one is bad."""
    return _decode2(buf, s0, e0, m0, s1, e1, m1, out0, out1, tab[0], tab[4], tab[5], tab[6])


@nb.njit(inline="always", cache=True)
def decode4(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, ms: np.ndarray,
            out: np.ndarray, tab: tuple) -> bool:  # pragma: no cover - numba
    """Decode four astream bodies at once into the rows of out (see :func:`_decode4`)."""
    return _decode4(buf, starts, ends, ms, out, tab[0], tab[4], tab[5], tab[6])

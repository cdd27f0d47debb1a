# numba kernels mix Python ints with numpy scalars (np.int64 / np.uint64 are what numba
# infers and needs for bit arithmetic) and call numba intrinsics (ctlz/cttz) whose stubs
# take a typing context; mypy cannot follow either, so these codes are off for this file
# only. The Python API at the bottom is fully typed.
# mypy: disable-error-code="arg-type,assignment,return-value,call-arg"
"""Chunk codec: groups of float64 series sharing int64 timestamps <-> bytes, lossless.

A leaf module (numpy and numba only, nothing of the project), in the spirit of Prometheus'
``chunkenc``: pure functions, arrays in, bytes out, and the byte layout documented here.
The numba kernels encode and decode whole groups (and batches of groups) per call;
:mod:`aggregator.store.codec_reference` is a slow, obviously-correct Python version of the
same layout that the tests hold the kernels to, byte for byte.

Why it beats plain Gorilla on telemetry
---------------------------------------
- One timestamp column per *group* (all series of one node's ticks share it), so jittered
  timestamps, which cost plain Gorilla ~2 bytes per sample, are paid once per tick.
- Most NVML readings are integers or fixed decimals once in base units (123.456 W from mW,
  0.37 ratio from %, 1410000000 Hz from MHz, MiB as bytes). Such a column is stored as
  scaled integers ``n * 10**-e`` (exact: decoding computes the same correctly rounded
  double), divided by the GCD of their differences (MiB, 15 MHz clock steps), as deltas or
  deltas of deltas, with a per-column prefix code whose widths are chosen optimally from
  the column's own histogram. XOR (Gorilla's value encoding) stays as the fallback for
  values that are not decimals (or for -0.0, NaN, inf, which are never decimals).
- Constant columns cost a few bytes.

Byte layout (all multi-byte header integers are LEB128 varints; ``zz`` = zigzag; bit
streams are MSB-first and padded with zero bits to a whole byte)::

    group   := u8 version (=1) | varint k | varint T | tsec | column{k}      (no sections when T=0)
    tsec    := u8 TS_DOD (=1) | varint nbytes | bits:
                 i64 first timestamp (64 bits), then for each later timestamp its
                 delta-of-delta (the first delta counts as a dod against 0), z = zz(dod):
                 '0' -> 0 | '10' z:7 | '110' z:9 | '1110' z:12 | '1111' z:64
    column  := u8 tag | body
      C_CONST     (1): u64 bits (8 bytes, little-endian)          all T values bitwise equal
      C_CONST_INT (2): i8 e | varint zz(n)                         all equal to n * 10**-e
      C_ZERO      (6): nothing                                     all +0.0 (idle counters)
      C_XOR       (3): varint nbytes | bits: first value 64 bits, then per value
                       '0' (same) | '10' meaningful bits in the previous window |
                       '11' lz:5 sig:6 (0 means 64) then sig bits      (Gorilla's control bits)
      C_DELTA     (4): i8 e | varint zz(n0) | varint g | u8 lag | stream of T-1 values
                       r[i] = m[i] - m[i-lag]  (m[i] - m[i-1] while i < lag), i = 1..T-1
      C_DOD       (5): i8 e | varint zz(n0) | varint g | u8 lag | varint zz(d1) | stream of
                       T-2 values s[i] = d[i] - d[i-lag]  (d[i] - d[i-1] while i-lag < 1),
                       i = 2..T-1, where d[i] = m[i] - m[i-1]
                       and everywhere n[i] = n0 + g*m[i], m[0] = 0, d1 = d[1], 1 <= lag <= 8
      C_DELTA_ANS (7): the body of C_DELTA with ``astream`` in place of ``stream``
      C_DOD_ANS   (8): the body of C_DOD with ``astream`` in place of ``stream``
    stream  := varint nbytes | u8 c (1..3) | u8 width{c} | bits: per value z = zz(x),
                 c=1: z:w0    c=2: '0' z:w0 | '1' z:w1    c=3: '0' z:w0 | '10' z:w1 | '11' z:w2
    astream := varint nbytes | u8 model | u32 state | u16 words: the same values z, rANS-coded
               under one of 256 fixed parametric tables (:mod:`aggregator.store.entropy`
               documents the symbols, tables and state machine)

Value of a scaled integer: ``n / 10**e`` when e >= 0, ``n * 10**-e`` when e < 0 (|n| <= 2**53,
-15 <= e <= 15); an encoder uses it only when that reproduces every value bit for bit. The
encoder's e is the first value's smallest exponent (searched from 0 downwards while it
fits, else upwards), raised while any later value does not fit.
The encoder picks, per column: C_ZERO, C_CONST_INT or C_CONST (the first that fits) if
all bits are equal, else C_DELTA/C_DOD if every value is such a decimal, else C_XOR; a
decimal column whose C_DELTA/C_DOD encoding takes more than 4 bytes per value (+16) is
also encoded as C_XOR and the strictly smaller one is kept. DELTA or DOD is decided with lag 1 (the fewest bits; DOD only when strictly
smaller); then, if that stream costs more than one bit per value, the lag (1..8) whose
residuals have the fewest summed bit lengths on every other index from 1 + 8 (DELTA) or
2 + 8 (DOD) on (ties: smaller lag) replaces lag 1 when its planned stream (bytes + width
bytes) is strictly smaller. Periodic load (an all-reduce rhythm at 1 Hz) is where it wins. For a stream
it picks c and widths with the fewest bits (ties: fewer classes, then smaller widths).
With ``entropy_coded`` (what the store's compaction writes; ingest seals without it, at
about twice the speed) each DELTA/DOD stream is then also planned as an astream: the model
whose table gives the fewest bits among five scales around each family's fitted one; it
replaces the prefix-coded stream, and the tag becomes 7 or 8, only when strictly smaller
(the lag and DELTA/DOD choice stay those of the prefix code). Decoding reads both forms
always, validates lengths and tags and raises :class:`CodecError`.

Plain Gorilla (the benchmark's baseline, no tricks): ``varint T | tsec | C_XOR body`` per
series (:func:`encode_gorilla`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numba as nb
import numpy as np
import numpy.typing as npt
from numba.cpython.unsafe.numbers import leading_zeros, trailing_zeros

from aggregator.store import entropy

__all__ = [
    "C_CONST",
    "C_CONST_INT",
    "C_DELTA",
    "C_DELTA_ANS",
    "C_DOD",
    "C_DOD_ANS",
    "C_XOR",
    "C_ZERO",
    "CodecError",
    "column_layout",
    "column_residuals",
    "column_tags",
    "decode_gorilla",
    "decode_group",
    "decode_groups",
    "decode_selected",
    "encode_gorilla",
    "encode_group",
    "encode_groups",
    "encode_ragged",
    "warm_up",
]

VERSION: Final = 1
TS_DOD: Final = 1
C_CONST: Final = 1
C_CONST_INT: Final = 2
C_XOR: Final = 3
C_DELTA: Final = 4
C_DOD: Final = 5
C_ZERO: Final = 6
C_DELTA_ANS: Final = 7
C_DOD_ANS: Final = 8
E_MIN: Final = -15
E_MAX: Final = 15
N_LIMIT: Final = 1 << 53
PAD: Final = 32  # zero bytes after a blob: a bit reader may look 66 bits past a stream
MAX_LAG: Final = 8
HIST: Final = 66
"""Entries of a bit-length histogram (lengths 0..64, and one spare)."""
XOR_CHECK_BYTES: Final = 4
"""A decimal column costing more than this per value (+16) is also tried as XOR."""
MAX_SAMPLES: Final = 1 << 24
"""Decoders refuse chunks claiming more samples (a corrupt header must not allocate GBs)."""
NEG_ZERO: Final = np.uint64(1 << 63)

POW10 = np.array([10.0 ** i for i in range(16)], dtype=np.float64)

U64 = nb.uint64
_U1 = np.uint64(1)


class CodecError(ValueError):
    """A blob that is not a valid chunk (truncated, bad tag, sizes that disagree)."""


# ---------------------------------------------------------------------------- bit writer


@nb.njit(inline="always", cache=True)
def _put(buf: np.ndarray, pos: int, acc: np.uint64, nacc: int, val: np.uint64,
         nbits: int) -> tuple[int, np.uint64, int]:  # pragma: no cover - numba
    """Append the low ``nbits`` (<= 64) of ``val``; returns (pos, acc, nacc).

    ``acc`` holds the last ``nacc`` (< 64) bits not yet stored; whole 64-bit words are
    stored big-endian, so most calls are a shift and an or.
    """
    if nbits == 0:
        return pos, acc, nacc
    val &= U64(0xFFFFFFFFFFFFFFFF) >> U64(64 - nbits)
    free = 64 - nacc
    if nbits < free:
        return pos, (acc << U64(nbits)) | val, nacc + nbits
    spill = nbits - free
    word = (val >> U64(spill)) if nacc == 0 else ((acc << U64(free)) | (val >> U64(spill)))
    for i in range(8):
        buf[pos + i] = np.uint8((word >> U64(56 - 8 * i)) & U64(0xFF))
    if spill == 0:
        return pos + 8, U64(0), 0
    return pos + 8, val & ((U64(1) << U64(spill)) - U64(1)), spill


@nb.njit(inline="always", cache=True)
def _put64(buf: np.ndarray, pos: int, acc: np.uint64, nacc: int, val: np.uint64,
           nbits: int) -> tuple[int, np.uint64, int]:  # pragma: no cover - numba
    """Append the low ``nbits`` (<= 64) of ``val`` (an alias kept for readability)."""
    return _put(buf, pos, acc, nacc, val, nbits)


@nb.njit(inline="always", cache=True)
def _finish(buf: np.ndarray, pos: int, acc: np.uint64, nacc: int) -> int:  # pragma: no cover
    """Store the last ``nacc`` bits, padded with zero bits to a whole byte."""
    if nacc == 0:
        return pos
    top = acc << U64(64 - nacc)
    for i in range((nacc + 7) // 8):
        buf[pos + i] = np.uint8((top >> U64(56 - 8 * i)) & U64(0xFF))
    return pos + (nacc + 7) // 8


@nb.njit(inline="always", cache=True)
def _varint(buf: np.ndarray, pos: int, v: np.uint64) -> int:  # pragma: no cover - numba
    while v >= U64(0x80):
        buf[pos] = np.uint8((v & U64(0x7F)) | U64(0x80))
        v >>= U64(7)
        pos += 1
    buf[pos] = np.uint8(v)
    return pos + 1


@nb.njit(inline="always", cache=True)
def _seal(buf: np.ndarray, pos: int, start: int, p: int, acc: np.uint64, nacc: int) -> int:  # pragma: no cover - numba
    """Close a bit-stream body written at ``start`` (10 bytes past ``pos``, room for the
    longest varint) and move it down behind its varint length at ``pos``; returns the end."""
    p = _finish(buf, p, acc, nacc)
    nbytes = p - start
    q = _varint(buf, pos, U64(nbytes))
    for i in range(nbytes):  # q < start: a forward copy never overwrites unread bytes
        buf[q + i] = buf[start + i]
    return q + nbytes


@nb.njit(inline="always", cache=True)
def _varint_len(v: np.uint64) -> int:  # pragma: no cover - numba
    n = 1
    while v >= U64(0x80):
        v >>= U64(7)
        n += 1
    return n


@nb.njit(inline="always", cache=True)
def _zz(x: np.int64) -> np.uint64:  # pragma: no cover - numba
    return U64((x << np.int64(1)) ^ (x >> np.int64(63)))


@nb.njit(inline="always", cache=True)
def _unzz(z: np.uint64) -> np.int64:  # pragma: no cover - numba
    return np.int64(z >> U64(1)) ^ -np.int64(z & U64(1))


@nb.njit(inline="always", cache=True)
def _bitlen(z: np.uint64) -> int:  # pragma: no cover - numba
    """Bits needed for z (0 for 0): one LLVM ctlz (defined for 0, returns 64)."""
    return 64 - np.int64(leading_zeros(z))


@nb.njit(inline="always", cache=True)
def _ctz(x: np.uint64) -> int:  # pragma: no cover - numba
    return np.int64(trailing_zeros(x))


# ---------------------------------------------------------------------------- bit reader


@nb.njit(cache=True)
def _be_words(buf: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """The buffer as big-endian 64-bit words (its length is a multiple of 8), so reading
    any 64 bits of a stream is two loads and two shifts."""
    words = np.empty(buf.size // 8, np.uint64)
    for j in range(words.size):
        v = U64(0)
        for i in range(8):
            v = (v << U64(8)) | U64(buf[8 * j + i])
        words[j] = v
    return words


@nb.njit(inline="always", cache=True)
def _peek(words: np.ndarray, bitpos: int) -> np.uint64:  # pragma: no cover - numba
    """The 64 bits starting at ``bitpos`` (the buffer ends in >= 2 zero words); without a
    branch for a word-aligned position (the low word is shifted in in two steps)."""
    j = bitpos >> 6
    r = U64(bitpos & 63)
    return (words[j] << r) | ((words[j + 1] >> U64(1)) >> (U64(63) - r))


@nb.njit(inline="always", cache=True)
def _get(words: np.ndarray, bitpos: int, nbits: int) -> np.uint64:  # pragma: no cover - numba
    if nbits == 0:
        return U64(0)
    return _peek(words, bitpos) >> U64(64 - nbits)


@nb.njit(inline="always", cache=True)
def _rvarint(buf: np.ndarray, pos: int, end: int) -> tuple[np.uint64, int]:  # pragma: no cover
    v = U64(0)
    shift = 0
    while True:
        if pos >= end or shift > 63:
            return U64(0), -1
        byte = buf[pos]
        pos += 1
        v |= U64(byte & 0x7F) << U64(shift)
        if byte < 0x80:
            return v, pos
        shift += 7


# ---------------------------------------------------------------------------- timestamps


@nb.njit(cache=True)
def _enc_ts(ts: np.ndarray, buf: np.ndarray, pos: int) -> int:  # pragma: no cover - numba
    """Write tsec at ``pos``; returns the new position."""
    n = ts.size
    buf[pos] = TS_DOD
    pos += 1
    # worst case bits: 64 + (n-1)*68 -> reserve a 10-byte varint slot, then compact
    start = pos + 10
    p = start
    acc = U64(0)
    nacc = 0
    p, acc, nacc = _put64(buf, p, acc, nacc, U64(ts[0]), 64)
    prev_d = np.int64(0)
    for i in range(1, n):
        d = ts[i] - ts[i - 1]
        z = _zz(d - prev_d)
        prev_d = d
        if z == U64(0):
            p, acc, nacc = _put(buf, p, acc, nacc, U64(0), 1)
        elif z < U64(128):
            p, acc, nacc = _put(buf, p, acc, nacc, (U64(0b10) << U64(7)) | z, 9)
        elif z < U64(512):
            p, acc, nacc = _put(buf, p, acc, nacc, (U64(0b110) << U64(9)) | z, 12)
        elif z < U64(4096):
            p, acc, nacc = _put(buf, p, acc, nacc, (U64(0b1110) << U64(12)) | z, 16)
        else:
            p, acc, nacc = _put(buf, p, acc, nacc, U64(0b1111), 4)
            p, acc, nacc = _put64(buf, p, acc, nacc, z, 64)
    return _seal(buf, pos, start, p, acc, nacc)


@nb.njit(cache=True)
def _dec_ts(buf: np.ndarray, words: np.ndarray, pos: int, end: int, n: int, out: np.ndarray) -> int:  # pragma: no cover
    """Read tsec into ``out[:n]``; returns the new position or -1 when malformed."""
    if pos >= end or buf[pos] != TS_DOD:
        return -1
    nbytes, pos = _rvarint(buf, pos + 1, end)
    if pos < 0 or pos + np.int64(nbytes) > end:
        return -1
    bit = pos * 8
    stop = (pos + np.int64(nbytes)) * 8
    out[0] = np.int64(_peek(words, bit))
    bit += 64
    prev_d = np.int64(0)
    for i in range(1, n):
        if bit > stop:
            return -1
        top = _peek(words, bit)
        if (top >> U64(63)) == U64(0):
            z = U64(0)
            bit += 1
        elif (top >> U64(62)) == U64(0b10):
            z = (top >> U64(55)) & U64(0x7F)
            bit += 9
        elif (top >> U64(61)) == U64(0b110):
            z = (top >> U64(52)) & U64(0x1FF)
            bit += 12
        elif (top >> U64(60)) == U64(0b1110):
            z = (top >> U64(48)) & U64(0xFFF)
            bit += 16
        else:
            bit += 4
            z = _peek(words, bit)
            bit += 64
        prev_d = prev_d + _unzz(z)
        out[i] = out[i - 1] + prev_d
    if bit > stop:
        return -1
    return pos + np.int64(nbytes)


# ---------------------------------------------------------------------------- XOR values


@nb.njit(cache=True)
def _enc_xor(bits: np.ndarray, buf: np.ndarray, pos: int) -> int:  # pragma: no cover - numba
    """Write a C_XOR body (after the tag) at ``pos``."""
    n = bits.size
    start = pos + 10
    p = start
    acc = U64(0)
    nacc = 0
    p, acc, nacc = _put64(buf, p, acc, nacc, bits[0], 64)
    plz = 65
    ptz = 65
    for i in range(1, n):
        x = bits[i] ^ bits[i - 1]
        if x == U64(0):
            p, acc, nacc = _put(buf, p, acc, nacc, U64(0), 1)
            continue
        lz = 64 - _bitlen(x)
        tz = _ctz(x)
        if lz > 31:
            lz = 31
        if plz <= 64 and lz >= plz and tz >= ptz:
            p, acc, nacc = _put(buf, p, acc, nacc, U64(0b10), 2)
            p, acc, nacc = _put64(buf, p, acc, nacc, x >> U64(ptz), 64 - plz - ptz)
        else:
            sig = 64 - lz - tz
            head = (U64(0b11) << U64(11)) | (U64(lz) << U64(6)) | U64(sig & 63)
            p, acc, nacc = _put(buf, p, acc, nacc, head, 13)
            p, acc, nacc = _put64(buf, p, acc, nacc, x >> U64(tz), sig)
            plz = lz
            ptz = tz
    return _seal(buf, pos, start, p, acc, nacc)


@nb.njit(cache=True)
def _dec_xor(buf: np.ndarray, words: np.ndarray, pos: int, end: int, n: int, out: np.ndarray) -> int:  # pragma: no cover
    nbytes, pos = _rvarint(buf, pos, end)
    if pos < 0 or pos + np.int64(nbytes) > end:
        return -1
    bit = pos * 8
    stop = (pos + np.int64(nbytes)) * 8
    cur = _peek(words, bit)
    out[0] = cur
    bit += 64
    plz = 0
    psig = 0
    for i in range(1, n):
        if bit > stop:
            return -1
        top = _peek(words, bit)
        if (top >> U64(63)) == U64(0):
            bit += 1
        elif (top >> U64(62)) == U64(0b10):
            if psig == 0:
                return -1
            bit += 2
            x = _get(words, bit, psig) if psig <= 56 else (
                (_get(words, bit, psig - 32) << U64(32)) | _get(words, bit + psig - 32, 32))
            bit += psig
            cur ^= x << U64(64 - plz - psig)
        else:
            lz = np.int64((top >> U64(57)) & U64(31))
            sig = np.int64((top >> U64(51)) & U64(63))
            if sig == 0:
                sig = 64
            if lz + sig > 64:
                return -1
            bit += 13
            x = _get(words, bit, sig) if sig <= 56 else (
                (_get(words, bit, sig - 32) << U64(32)) | _get(words, bit + sig - 32, 32))
            bit += sig
            cur ^= x << U64(64 - lz - sig)
            plz = lz
            psig = sig
        out[i] = cur
    if bit > stop:
        return -1
    return pos + np.int64(nbytes)


# ---------------------------------------------------------------------------- scaled integers


@nb.njit(inline="always", cache=True)
def _scaled(v: float, e: int) -> tuple[bool, np.int64]:  # pragma: no cover - numba
    """Is ``v`` exactly the double that decoding ``n`` at exponent ``e`` gives? -> (ok, n)."""
    x = v * POW10[e] if e >= 0 else v / POW10[-e]
    if not (abs(x) <= 9007199254740992.0):  # also rejects NaN and inf
        return False, np.int64(0)
    n = np.int64(np.rint(x))
    back = np.float64(n) / POW10[e] if e >= 0 else np.float64(n) * POW10[-e]
    # finite doubles compare equal exactly when their bits are equal, except -0.0 == 0.0;
    # the caller rejects -0.0 (n = 0 always decodes to +0.0)
    return back == v, n


@nb.njit(inline="always", cache=True)
def _decode_scaled(n: np.int64, e: int) -> float:  # pragma: no cover - numba
    if e >= 0:
        return np.float64(n) / POW10[e]
    return np.float64(n) * POW10[-e]


@nb.njit(cache=True)
def _fits(col: np.ndarray, e: int) -> bool:  # pragma: no cover - numba
    """Is every value of col a scaled integer at exponent e (the test of :func:`_scaled`)?

    Blocks of 16 values with no branch inside (the CPU multiplies, rounds and divides them
    as vectors, where a test per value would stop at each one), checked after each block.
    """
    n = col.size
    p = POW10[abs(e)]
    for a in range(0, n, 16):
        ok = True
        if e >= 0:
            for i in range(a, min(a + 16, n)):
                x = col[i] * p
                ok = ok & (abs(x) <= 9007199254740992.0) & (np.rint(x) / p == col[i])
        else:
            for i in range(a, min(a + 16, n)):
                x = col[i] / p
                ok = ok & (abs(x) <= 9007199254740992.0) & (np.rint(x) * p == col[i])
        if not ok:
            return False
    return True


@nb.njit(cache=True)
def _find_scale(col: np.ndarray, bits: np.ndarray, ints: np.ndarray) -> int:  # pragma: no cover
    """A common exponent e making every value a scaled integer (E_MAX+1 if none); the
    scaled integers into ``ints``.

    e starts at the first value's smallest exponent, found from 0 (down while it still
    fits, else up), and is the first from there at which every value fits.
    """
    n = col.size
    neg = False
    for i in range(n):
        neg = neg | (bits[i] == NEG_ZERO)
    if neg:
        return E_MAX + 1
    e = 0
    if _scaled(col[0], 0)[0]:
        while e > E_MIN and _scaled(col[0], e - 1)[0]:
            e -= 1
    else:
        e = 1
        while not _scaled(col[0], e)[0]:
            e += 1
            if e > E_MAX:
                return E_MAX + 1
    while e <= E_MAX:
        if _fits(col, e):
            p = POW10[abs(e)]
            for i in range(n):  # |x| <= 2**53 was checked: rint(x) converts exactly
                ints[i] = np.int64(np.rint(col[i] * p if e >= 0 else col[i] / p))
            return e
        e += 1
    return E_MAX + 1


@nb.njit(inline="always", cache=True)
def _gcd(a: np.int64, b: np.int64) -> np.int64:  # pragma: no cover - numba
    while b:
        a, b = b, a % b
    return a


@nb.njit(inline="always", cache=True)
def _odd_inverse(o: np.uint64) -> np.uint64:  # pragma: no cover - numba
    """The inverse of an odd o modulo 2**64 (Newton's iteration: 3 correct bits, then 6,
    12, 24, 48, 96)."""
    x = o
    for _ in range(5):
        x *= U64(2) - o * x
    return x


@nb.njit(cache=True)
def _common_step(ints: np.ndarray, n: int) -> np.int64:  # pragma: no cover - numba
    """The GCD of every |ints[i] - ints[0]| (0 when all are equal).

    A 64-bit division costs tens of cycles and Euclid's algorithm takes two per value
    even when the value is a multiple of the GCD so far, which is the usual case (MiB,
    clock steps); a multiple is recognised by a multiply with the inverse of the odd part
    instead (d is a multiple of odd o iff d * o**-1 mod 2**64 <= (2**64 - 1) // o), and
    Euclid runs only where the GCD shrinks.
    """
    n0 = ints[0]
    i = 1
    while i < n and ints[i] == n0:
        i += 1
    if i == n:
        return np.int64(0)
    g = abs(ints[i] - n0)
    while g != 1:
        k = _ctz(U64(g))
        o = U64(g) >> U64(k)
        inv = _odd_inverse(o)
        lim = U64(0xFFFFFFFFFFFFFFFF) // o
        low = (U64(1) << U64(k)) - U64(1)
        while i < n:
            d = U64(abs(ints[i] - n0))
            if (d & low) != U64(0) or (d >> U64(k)) * inv > lim:
                break
            i += 1
        if i == n:
            return g
        g = _gcd(g, abs(ints[i] - n0))
    return g


@nb.njit(cache=True)
def _offsets(ints: np.ndarray, n: int, g: np.int64) -> None:  # pragma: no cover - numba
    """ints[i] = (ints[i] - ints[0]) / g in place (exact): by a shift and a multiply with
    the odd part's inverse, not a division."""
    n0 = ints[0]
    if g <= 1:  # (0 only for equal values, which a constant column's tag takes)
        for i in range(n):
            ints[i] -= n0
        return
    k = _ctz(U64(g))
    inv = _odd_inverse(U64(g) >> U64(k))
    for i in range(n):
        ints[i] = np.int64(U64((ints[i] - n0) >> k) * inv)


@nb.njit(cache=True)
def _plan_stream(m: int, lmax: int, hist: np.ndarray, widths: np.ndarray) -> tuple[int, int]:
    # pragma: no cover - numba
    """Best prefix code for m values whose bit-length histogram is ``hist`` (longest
    ``lmax``): fills widths[:c]; returns (c, payload bits). Consumes ``hist`` (2 * HIST
    entries: the histogram, then scratch).

    The first minimum in the order (c = 1; c = 2 by w0; c = 3 by w0, then w1), as a
    search of every width would find it, but only widths some value has are tried (and
    w0 = 0): a width no value has costs at least as much as the one below it, which comes
    first, so it never strictly improves. A noisy column has a dozen of the up to 64.
    """
    best_bits = m * lmax
    best_c = 1
    widths[0] = lmax
    have = hist[HIST:]  # the candidate widths below lmax, ascending
    nh = 1
    have[0] = 0
    for w in range(1, lmax):
        if hist[w]:
            have[nh] = w
            nh += 1
    cum = hist  # in place: cum[w] = number of values with bitlen <= w
    for w in range(1, lmax + 1):
        cum[w] += cum[w - 1]
    for a in range(nh):
        w0 = have[a]
        c0 = cum[w0]
        bits2 = m + c0 * w0 + (m - c0) * lmax
        if bits2 < best_bits:
            best_bits = bits2
            best_c = 2
            widths[0] = w0
            widths[1] = lmax
    for a in range(nh):
        w0 = have[a]
        c0 = cum[w0]
        for b in range(a + 1, nh):
            w1 = have[b]
            c1 = cum[w1] - c0
            c2 = m - cum[w1]
            bits3 = c0 * (1 + w0) + c1 * (2 + w1) + c2 * (2 + lmax)
            if bits3 < best_bits:
                best_bits = bits3
                best_c = 3
                widths[0] = w0
                widths[1] = w1
                widths[2] = lmax
    return best_c, best_bits


@nb.njit(cache=True)
def _write_stream(z: np.ndarray, m: int, c: int, widths: np.ndarray, nbits: int, buf: np.ndarray,
                  pos: int) -> int:  # pragma: no cover - numba
    nbytes = (nbits + 7) // 8
    pos = _varint(buf, pos, U64(nbytes))
    buf[pos] = c
    pos += 1
    for j in range(c):
        buf[pos] = widths[j]
        pos += 1
    acc = U64(0)
    nacc = 0
    w0 = widths[0]
    if c == 1:
        for i in range(m):
            pos, acc, nacc = _put64(buf, pos, acc, nacc, z[i], w0)
        return _finish(buf, pos, acc, nacc)
    # class 1 and 2 codes ('1' and '1' for c = 2, '10' and '11' for c = 3); with c = 2
    # class 2 is class 1 again, which no value reaches past (its width is the longest)
    w1 = widths[1]
    w2 = widths[2] if c == 3 else w1
    h1 = U64(1) if c == 2 else U64(0b10)
    h2 = U64(1) if c == 2 else U64(0b11)
    l1 = 1 if c == 2 else 2
    for i in range(m):
        # the class by selects, not branches: a noisy column's classes follow no pattern
        b = _bitlen(z[i])
        in0 = b <= w0
        in1 = b <= w1
        head = U64(0) if in0 else (h1 if in1 else h2)
        hl = 1 if in0 else l1
        w = w0 if in0 else (w1 if in1 else w2)
        if hl + w <= 64:  # one put of code and value (all but 63- and 64-bit values)
            pos, acc, nacc = _put(buf, pos, acc, nacc, (head << U64(w)) | z[i], hl + w)
        else:
            pos, acc, nacc = _put(buf, pos, acc, nacc, head, hl)
            pos, acc, nacc = _put64(buf, pos, acc, nacc, z[i], w)
    return _finish(buf, pos, acc, nacc)


@nb.njit(cache=True)
def _read_stream(buf: np.ndarray, words: np.ndarray, pos: int, end: int, m: int, out: np.ndarray) -> int:
    # pragma: no cover - numba
    """Read a stream of m zigzagged values into out[:m] (as int64); new pos or -1."""
    nbytes, pos = _rvarint(buf, pos, end)
    if pos < 0 or pos >= end:
        return -1
    c = np.int64(buf[pos])
    pos += 1
    if c < 1 or c > 3 or pos + c > end:
        return -1
    w0 = np.int64(buf[pos])
    w1 = np.int64(buf[pos + 1]) if c > 1 else 0
    w2 = np.int64(buf[pos + 2]) if c > 2 else 0
    if w0 > 64 or w1 > 64 or w2 > 64:
        return -1
    pos += c
    if pos + np.int64(nbytes) > end:
        return -1
    bit = pos * 8
    stop = (pos + np.int64(nbytes)) * 8
    if max(w0, w1, w2) <= 62:
        bit = _read_short(words, bit, stop, m, c, w0, w1, w2, out)
    else:
        bit = _read_long(words, bit, stop, m, c, w0, w1, w2, out)
    if bit < 0 or bit > stop:
        return -1
    return pos + np.int64(nbytes)


@nb.njit(cache=True)
def _read_short(words: np.ndarray, bit: int, stop: int, m: int, c: int, w0: int, w1: int,
                w2: int, out: np.ndarray) -> int:  # pragma: no cover - numba
    """A stream's values when code and value fit one 64-bit peek (widths <= 62): the
    class's width and code length are looked up by the top two bits, no branch per value
    (a noisy column's classes follow no pattern). Returns the end bit, -1 past ``stop``."""
    # per top two bits t (0..3), width and code length packed a byte each
    if c == 1:
        wt = U64(w0) * U64(0x01010101)
        lt = U64(0)
    elif c == 2:
        wt = U64(w0) | (U64(w0) << U64(8)) | (U64(w1) << U64(16)) | (U64(w1) << U64(24))
        lt = U64(0x01010101)
    else:
        wt = U64(w0) | (U64(w0) << U64(8)) | (U64(w1) << U64(16)) | (U64(w2) << U64(24))
        lt = U64(0x02020101)
    for i in range(m):
        if bit > stop:
            return -1
        top = _peek(words, bit)
        t = (top >> U64(62)) << U64(3)
        w = (wt >> t) & U64(0xFF)
        cl = (lt >> t) & U64(0xFF)
        out[i] = _unzz(((top << cl) >> U64(1)) >> (U64(63) - w))
        bit += np.int64(cl + w)
    return bit


@nb.njit(cache=True)
def _read_long(words: np.ndarray, bit: int, stop: int, m: int, c: int, w0: int, w1: int,
               w2: int, out: np.ndarray) -> int:  # pragma: no cover - numba
    """A stream's values, any widths (up to 64 with a 2-bit code). Returns the end bit,
    -1 past ``stop``."""
    for i in range(m):
        if bit > stop:
            return -1
        if c == 1:
            w = w0
        else:
            top = _peek(words, bit)
            if (top >> U64(63)) == U64(0):
                w = w0
                bit += 1
            elif c == 2:
                w = w1
                bit += 1
            elif (top >> U64(62)) == U64(0b10):
                w = w1
                bit += 2
            else:
                w = w2
                bit += 2
        if w <= 56:
            z = _get(words, bit, w)
        else:
            z = (_get(words, bit, w - 32) << U64(32)) | _get(words, bit + w - 32, 32)
        bit += w
        out[i] = _unzz(z)
    return bit


# ---------------------------------------------------------------------------- columns


@nb.njit(cache=True)
def _enc_column(col: np.ndarray, bits: np.ndarray, buf: np.ndarray, pos: int, ints: np.ndarray,
                dd: np.ndarray, z1: np.ndarray, z2: np.ndarray, zs: np.ndarray,
                hist: np.ndarray, w1: np.ndarray, w2: np.ndarray,
                ws: np.ndarray, entropy_on: bool, ehist: np.ndarray,
                words: np.ndarray, tab: tuple) -> int:  # pragma: no cover - numba
    n = col.size
    same = True
    for i in range(1, n):
        if bits[i] != bits[0]:
            same = False
            break
    if same:
        if bits[0] == U64(0):
            buf[pos] = C_ZERO
            return pos + 1
        e = _find_scale(col[:1], bits[:1], ints)
        if e <= E_MAX:
            buf[pos] = C_CONST_INT
            buf[pos + 1] = np.uint8(e & 0xFF)
            return _varint(buf, pos + 2, _zz(ints[0]))
        buf[pos] = C_CONST
        v = bits[0]
        for j in range(8):
            buf[pos + 1 + j] = np.uint8((v >> U64(8 * j)) & U64(0xFF))
        return pos + 9
    e = _find_scale(col, bits, ints)
    if e > E_MAX:
        buf[pos] = C_XOR
        return _enc_xor(bits, buf, pos + 1)
    n0 = ints[0]
    g = _common_step(ints, n)
    _offsets(ints, n, g)  # in place: ints[i] = m[i] = (n[i] - n0) / g
    dd[0] = 0
    for i in range(1, n):
        dd[i] = ints[i] - ints[i - 1]
    c1, b1 = _plan_stream(n - 1, _lag_stream(ints, 0, n, 1, z1, hist), hist, w1)
    c2, b2 = _plan_stream(n - 2, _lag_stream(dd, 1, n, 1, z2, hist), hist, w2)
    d1 = dd[1]
    cost1 = ((b1 + 7) // 8) * 8 + 8 * c1
    cost2 = ((b2 + 7) // 8) * 8 + 8 * c2 + 8 * _varint_len(_zz(d1))
    buf[pos + 1] = np.uint8(e & 0xFF)
    p = _varint(buf, pos + 2, _zz(n0))
    p = _varint(buf, p, U64(g))
    if cost2 < cost1:
        lag, c2, b2 = _improve_lag(dd, 1, n, z2, w2, c2, b2, zs, ws, hist)
        buf[pos] = C_DOD
        buf[p] = lag
        p = _varint(buf, p + 1, _zz(d1))
        end = _write_stream(z2, n - 2, c2, w2, b2, buf, p)
        if entropy_on:
            smaller = _entropy_stream(z2, n - 2, buf, p, end, ehist, words, tab)
            if smaller < end:
                buf[pos] = C_DOD_ANS
                end = smaller
    else:
        lag, c1, b1 = _improve_lag(ints, 0, n, z1, w1, c1, b1, zs, ws, hist)
        buf[pos] = C_DELTA
        buf[p] = lag
        p += 1
        end = _write_stream(z1, n - 1, c1, w1, b1, buf, p)
        if entropy_on:
            smaller = _entropy_stream(z1, n - 1, buf, p, end, ehist, words, tab)
            if smaller < end:
                buf[pos] = C_DELTA_ANS
                end = smaller
    if end - pos <= XOR_CHECK_BYTES * n + 16:
        return end
    # decimals with many digits (or wild jumps): XOR may be smaller; try it after the end
    buf[end] = C_XOR
    xend = _enc_xor(bits, buf, end + 1)
    if xend - end >= end - pos:
        return end
    for i in range(xend - end):
        buf[pos + i] = buf[end + i]
    return pos + (xend - end)


@nb.njit(cache=True)
def _entropy_stream(z: np.ndarray, m: int, buf: np.ndarray, p: int, end: int, ehist: np.ndarray,
                    words: np.ndarray, tab: tuple) -> int:  # pragma: no cover - numba
    """Replace the prefix-coded stream at [p, end) by an astream of z[:m] when that is
    strictly smaller; returns the stream's end (``end`` when the prefix code stays)."""
    if m < 1:
        return end
    model, bits = entropy.plan(z, m, ehist, tab)
    if (bits + 7) // 8 + 7 >= end - p:  # cannot win (state, model and length bytes)
        return end
    nw, state = entropy.encode(z, m, model, words, tab)
    nbytes = 5 + 2 * nw
    if _varint_len(U64(nbytes)) + nbytes >= end - p:
        return end
    q = _varint(buf, p, U64(nbytes))
    buf[q] = model
    for j in range(4):
        buf[q + 1 + j] = np.uint8((state >> U64(8 * j)) & U64(0xFF))
    q += 5
    for j in range(nw - 1, -1, -1):  # the decoder reads the last word written first
        w = words[j]
        buf[q] = np.uint8(w & 0xFF)
        buf[q + 1] = np.uint8(w >> 8)
        q += 2
    return q


@nb.njit(cache=True)
def _improve_lag(x: np.ndarray, f: int, n: int, z: np.ndarray, w: np.ndarray, c: int, b: int,
                 zs: np.ndarray, ws: np.ndarray, hist: np.ndarray) -> tuple[int, int, int]:
    # pragma: no cover - numba
    """z / w hold x's lag-1 stream and its plan (c classes, b bits). Switch them to the
    estimated best lag when that plans strictly smaller; returns (lag, classes, bits)."""
    if b <= n - f - 1:  # at most one bit per value already
        return 1, c, b
    lag = _best_lag(x, f, n)
    if lag == 1:
        return 1, c, b
    cs, bs = _plan_stream(n - f - 1, _lag_stream(x, f, n, lag, zs, hist), hist, ws)
    if (bs + 7) // 8 + cs < (b + 7) // 8 + c:
        z[:n - f - 1] = zs[:n - f - 1]
        w[:] = ws
        return lag, cs, bs
    return 1, c, b


@nb.njit(inline="always", cache=True)
def _lag_stream(x: np.ndarray, f: int, n: int, lag: int, z: np.ndarray,
                hist: np.ndarray) -> int:  # pragma: no cover - numba
    """Zigzagged residuals of x[f+1:n] against x[i-lag] (x[i-1] while i-lag < f) into z,
    their bit-length histogram into hist; returns the longest bit length."""
    hist[:HIST] = 0
    lmax = 0
    for i in range(f + 1, n):
        ref = i - lag if i - lag >= f else i - 1
        r = _zz(x[i] - x[ref])
        z[i - f - 1] = r
        b = _bitlen(r)
        hist[b] += 1
        lmax = max(lmax, b)
    return lmax


@nb.njit(inline="always", cache=True)
def _zzlen(d: np.int64) -> int:  # pragma: no cover - numba
    """Bit length of zz(d)."""
    return _bitlen(_zz(d))


@nb.njit(cache=True)
def _best_lag(x: np.ndarray, f: int, n: int) -> int:  # pragma: no cover - numba
    """The lag in 1..MAX_LAG whose residuals x[i] - x[i-lag] have the fewest bits, counted
    on every other i from f + MAX_LAG on (the same points for every lag, half the work);
    ties go to the smaller lag. All eight sums in one pass (MAX_LAG is 8): eight
    independent chains instead of eight passes over x, each bound by its one sum."""
    b1 = b2 = b3 = b4 = b5 = b6 = b7 = b8 = 0
    for i in range(f + MAX_LAG, n, 2):
        xi = x[i]
        b1 += _zzlen(xi - x[i - 1])
        b2 += _zzlen(xi - x[i - 2])
        b3 += _zzlen(xi - x[i - 3])
        b4 += _zzlen(xi - x[i - 4])
        b5 += _zzlen(xi - x[i - 5])
        b6 += _zzlen(xi - x[i - 6])
        b7 += _zzlen(xi - x[i - 7])
        b8 += _zzlen(xi - x[i - 8])
    best = b1
    lag = 1
    for cand, bits in ((2, b2), (3, b3), (4, b4), (5, b5), (6, b6), (7, b7), (8, b8)):
        if bits < best:
            best = bits
            lag = cand
    return lag


@nb.njit(cache=True)
def _num_head(buf: np.ndarray, pos: int, end: int) -> tuple[int, int, np.int64, np.int64, int,
                                                             np.int64, int]:
    # pragma: no cover - numba
    """The header of a C_CONST_INT / DELTA / DOD (/ _ANS) column whose tag is at ``pos``:
    (tag, e, n0, g, lag, d1, position after it: the stream's varint); position -1 when
    malformed. A C_CONST_INT column ends there (g, lag, d1 are 0)."""
    z = np.int64(0)
    tag = np.int64(buf[pos])
    pos += 1
    if pos >= end:
        return tag, 0, z, z, 0, z, -1
    e = np.int64(np.int8(buf[pos]))
    if e < E_MIN or e > E_MAX:
        return tag, 0, z, z, 0, z, -1
    zn0, pos = _rvarint(buf, pos + 1, end)
    if pos < 0:
        return tag, 0, z, z, 0, z, -1
    n0 = _unzz(zn0)
    if tag == C_CONST_INT:
        return tag, e, n0, z, 0, z, pos
    ug, pos = _rvarint(buf, pos, end)
    if pos < 0 or pos >= end:
        return tag, 0, z, z, 0, z, -1
    lag = np.int64(buf[pos])
    pos += 1
    if lag < 1 or lag > MAX_LAG:
        return tag, 0, z, z, 0, z, -1
    d1 = z
    if tag in (C_DOD, C_DOD_ANS):
        zd1, pos = _rvarint(buf, pos, end)
        if pos < 0:
            return tag, 0, z, z, 0, z, -1
        d1 = _unzz(zd1)
    return tag, e, n0, np.int64(ug), lag, d1, pos


@nb.njit(cache=True)
def _rebuild(tmp: np.ndarray, n: int, dod: bool, e: int, n0: np.int64, g: np.int64, lag: int,
             d1: np.int64, ring: np.ndarray, vals: np.ndarray) -> None:  # pragma: no cover
    """Values from the residuals of a DELTA / DOD stream: tmp[i-1] holds r_i (DELTA) or
    tmp[i-2] holds s_i (DOD); ``ring`` is scratch for 8 int64.

    First the offsets m_i in place, a serial sum (kept in registers at lag 1, the usual
    lag; other lags read d_{i-lag} from an 8-slot ring); then the doubles in a pass with no
    dependence between values, which keeps the division (n / 10**e) off the sum's chain.
    """
    vals[0] = _decode_scaled(n0, e)
    if n == 1:
        return
    if not dod:  # m_i = r_i + m_{i-lag} (m_{i-1} while i < lag), m_0 = 0
        if lag == 1:
            acc = np.int64(0)
            for i in range(n - 1):
                acc += tmp[i]
                tmp[i] = acc
        else:
            for i in range(1, n):
                ref = i - lag if i - lag >= 0 else i - 1
                tmp[i - 1] += tmp[ref - 1] if ref >= 1 else 0
        _scaled_out(tmp, n - 1, n0, g, e, vals[1:])
        return
    # d_i = s_i + d_{i-lag} (d_{i-1} while i - lag < 1), m_1 = d_1, m_i = m_{i-1} + d_i
    acc = d1
    if lag == 1:
        d = d1
        for i in range(n - 2):
            d += tmp[i]
            acc += d
            tmp[i] = acc
    else:
        ring[1] = d1
        for i in range(2, n):
            ref = i - lag if i - lag >= 1 else i - 1
            d = tmp[i - 2] + ring[ref & 7]  # read before the write: lag 8 reuses the slot
            ring[i & 7] = d
            acc += d
            tmp[i - 2] = acc
    vals[1] = _decode_scaled(n0 + g * d1, e)
    _scaled_out(tmp, n - 2, n0, g, e, vals[2:])


@nb.njit(cache=True)
def _scaled_out(m: np.ndarray, count: int, n0: np.int64, g: np.int64, e: int,
                vals: np.ndarray) -> None:  # pragma: no cover - numba
    """vals[:count] = the doubles of the scaled integers n0 + g * m[:count] at exponent e."""
    if e > 0:
        p = POW10[e]
        for i in range(count):
            vals[i] = np.float64(n0 + g * m[i]) / p
    elif e < 0:
        p = POW10[-e]
        for i in range(count):
            vals[i] = np.float64(n0 + g * m[i]) * p
    else:
        for i in range(count):
            vals[i] = np.float64(n0 + g * m[i])


@nb.njit(cache=True)
def _skip_or_dec_column(buf: np.ndarray, words: np.ndarray, pos: int, end: int, n: int, out: np.ndarray,
                        tmp: np.ndarray, decode: bool, tab: tuple, residuals: bool = False) -> int:
    # pragma: no cover - numba
    """Decode (or just skip) one column at ``pos`` into the uint64 bit patterns ``out``
    (``tmp``: scratch of n + 8 int64).

    With ``residuals`` a DELTA / DOD column stops after its stream: tmp holds its residuals
    (for the benchmark's entropy figures), ``out`` is not written."""
    if pos >= end:
        return -1
    tag = buf[pos]
    pos += 1
    if tag == C_ZERO:
        if decode:
            out[:n] = 0
        return pos
    if tag == C_CONST:
        if pos + 8 > end:
            return -1
        v = U64(0)
        for j in range(8):
            v |= U64(buf[pos + j]) << U64(8 * j)
        if decode:
            out[:n] = v
        return pos + 8
    if tag == C_XOR:
        if not decode:
            nbytes, p = _rvarint(buf, pos, end)
            if p < 0 or p + np.int64(nbytes) > end:
                return -1
            return p + np.int64(nbytes)
        return _dec_xor(buf, words, pos, end, n, out)
    if tag != C_CONST_INT and tag != C_DELTA and tag != C_DOD and tag != C_DELTA_ANS \
            and tag != C_DOD_ANS:
        return -1
    tag, e, n0, g, lag, d1, pos = _num_head(buf, pos - 1, end)
    if pos < 0:
        return -1
    if tag == C_CONST_INT:
        if decode:
            out.view(np.float64)[:n] = _decode_scaled(n0, e)
        return pos
    ans = tag >= C_DELTA_ANS  # (7 or 8: the only tags this far up)
    dod = tag in (C_DOD, C_DOD_ANS)
    m = n - 2 if dod else n - 1
    if ans:
        nbytes, p = _rvarint(buf, pos, end)
        if p < 0 or p + np.int64(nbytes) > end:
            return -1
        if not decode:
            return p + np.int64(nbytes)
        pos = entropy.decode(buf, p, p + np.int64(nbytes), m, tmp, tab)
    elif not decode:
        nbytes, p = _rvarint(buf, pos, end)
        if p < 0 or p >= end:
            return -1
        c = np.int64(buf[p])
        p2 = p + 1 + c + np.int64(nbytes)
        return -1 if c < 1 or c > 3 or p2 > end else p2
    else:
        pos = _read_stream(buf, words, pos, end, m, tmp)
    if pos < 0 or residuals:
        return pos
    _rebuild(tmp, n, dod, e, n0, g, lag, d1, tmp[tmp.size - 8:], out.view(np.float64))
    return pos


LANES: Final = 4
"""Entropy-coded columns a group decode reads at once (:func:`entropy.decode4`)."""


@nb.njit(cache=True)
def _dec_lanes(buf: np.ndarray, end: int, n: int, lanes: np.ndarray, nl: int, flat: np.ndarray,
               scratch: np.ndarray, tab: tuple) -> bool:  # pragma: no cover - numba
    """Decode the ``nl`` (1..4) C_DELTA_ANS / C_DOD_ANS columns whose tags are at
    lanes[0, :nl] into flat[lanes[1, l]:lanes[1, l] + n] (uint64 bit patterns); False when
    one is malformed. Their rANS streams are read together (:func:`entropy.decode4`): one
    stream is a chain of dependent steps, four keep the core busy. ``scratch`` is
    (LANES + 1, n + 8) int64."""
    for lane in range(nl):
        tag, _, _, _, _, _, p = _num_head(buf, lanes[0, lane], end)
        if p < 0:
            return False
        nbytes, q = _rvarint(buf, p, end)
        if q < 0 or q + np.int64(nbytes) > end:
            return False
        lanes[2, lane] = q
        lanes[3, lane] = q + np.int64(nbytes)
        lanes[4, lane] = n - 2 if tag == C_DOD_ANS else n - 1
    if nl == LANES:
        if not entropy.decode4(buf, lanes[2], lanes[3], lanes[4], scratch, tab):
            return False
    else:  # a group's last one to three: in twos, then alone
        if nl >= 2 and not entropy.decode2(buf, lanes[2, 0], lanes[3, 0], lanes[4, 0],
                                           lanes[2, 1], lanes[3, 1], lanes[4, 1], scratch[0],
                                           scratch[1], tab):
            return False
        last = nl - 1
        if nl % 2 and entropy.decode(buf, lanes[2, last], lanes[3, last], lanes[4, last],
                                     scratch[last], tab) < 0:
            return False
    for lane in range(nl):
        tag, e, n0, g, lag, d1, _ = _num_head(buf, lanes[0, lane], end)
        off = lanes[1, lane]
        _rebuild(scratch[lane], n, tag == C_DOD_ANS, e, n0, g, lag, d1, scratch[LANES],
                 flat[off:off + n].view(np.float64))
    return True


@nb.njit(inline="always", cache=True)
def _is_ans(buf: np.ndarray, pos: int, end: int) -> bool:  # pragma: no cover - numba
    return pos < end and (buf[pos] == C_DELTA_ANS or buf[pos] == C_DOD_ANS)


# ---------------------------------------------------------------------------- groups


@nb.njit(cache=True, nogil=True)
def _enc_group(ts: np.ndarray, cols: np.ndarray, buf: np.ndarray, pos: int,
               entropy_on: bool, tab: tuple) -> int:  # pragma: no cover - numba
    """Encode one group (cols is (k, T) float64) at ``pos``; returns the new position."""
    k = cols.shape[0]
    n = ts.size
    buf[pos] = VERSION
    pos = _varint(buf, pos + 1, U64(k))
    pos = _varint(buf, pos, U64(n))
    if n == 0:
        return pos
    pos = _enc_ts(ts, buf, pos)
    ints = np.empty(n, np.int64)
    dd = np.empty(n, np.int64)
    z1 = np.empty(max(n, 1), np.uint64)
    z2 = np.empty(max(n, 1), np.uint64)
    zs = np.empty(max(n, 1), np.uint64)
    hist = np.zeros(2 * HIST, np.int64)
    w1 = np.zeros(3, np.int64)
    w2 = np.zeros(3, np.int64)
    ws = np.zeros(3, np.int64)
    ehist = np.zeros(entropy.N_SYM, np.int64)
    words = np.empty(5 * n + 8 if entropy_on else 1, np.uint16)
    for j in range(k):
        col = cols[j]
        pos = _enc_column(col, col.view(np.uint64), buf, pos, ints, dd, z1, z2, zs, hist, w1,
                          w2, ws, entropy_on, ehist, words, tab)
    return pos


@nb.njit(cache=True, nogil=True)
def _enc_groups(ts: np.ndarray, cols: np.ndarray, buf: np.ndarray, offsets: np.ndarray,
                entropy_on: bool, tab: tuple) -> None:  # pragma: no cover - numba
    """ts (G, T), cols (G, k, T): every group into one buffer, offsets[G+1]."""
    pos = 0
    offsets[0] = 0
    for gi in range(ts.shape[0]):
        pos = _enc_group(ts[gi], cols[gi], buf, pos, entropy_on, tab)
        offsets[gi + 1] = pos


@nb.njit(cache=True, nogil=True)
def _enc_ragged(ts: np.ndarray, ts_off: np.ndarray, vals: np.ndarray, v_off: np.ndarray,
                ks: np.ndarray, buf: np.ndarray, offsets: np.ndarray, entropy_on: bool,
                tab: tuple) -> None:  # pragma: no cover - numba
    """Groups of any shape into one buffer: group g's ts are ts[ts_off[g]:ts_off[g+1]] and
    its (k, T) columns vals[v_off[g]:v_off[g+1]], row-major; offsets[G+1] as above."""
    pos = 0
    offsets[0] = 0
    for gi in range(ks.size):
        t = ts[ts_off[gi]:ts_off[gi + 1]]
        cols = vals[v_off[gi]:v_off[gi + 1]].reshape(ks[gi], t.size)
        pos = _enc_group(t, cols, buf, pos, entropy_on, tab)
        offsets[gi + 1] = pos


@nb.njit(cache=True)
def _dec_header(buf: np.ndarray, pos: int, end: int) -> tuple[int, int, int]:  # pragma: no cover
    if pos >= end or buf[pos] != VERSION:
        return -1, 0, 0
    k, pos = _rvarint(buf, pos + 1, end)
    if pos < 0:
        return -1, 0, 0
    n, pos = _rvarint(buf, pos, end)
    if pos < 0 or n > U64(MAX_SAMPLES) or (n > U64(0) and k > U64(end)):
        return -1, 0, 0  # (with samples, every column takes at least its tag byte)
    return pos, np.int64(k), np.int64(n)


@nb.njit(cache=True)
def _dec_group(buf: np.ndarray, words: np.ndarray, pos: int, end: int, which: np.ndarray, ts_out: np.ndarray,
               out: np.ndarray, tab: tuple) -> int:  # pragma: no cover - numba
    """Decode the columns marked in ``which`` (k bools) of the group at ``pos``.

    ``out`` is (count of marked, T) uint64; returns the end position or -1."""
    pos, k, n = _dec_header(buf, pos, end)
    if pos < 0:
        return -1
    if n == 0:
        return pos
    pos = _dec_ts(buf, words, pos, end, n, ts_out)
    if pos < 0:
        return -1
    tmp = np.empty(n + 8, np.int64)
    scratch = np.empty((LANES + 1, n + 8), np.int64)
    lanes = np.empty((5, LANES), np.int64)
    flat = out.reshape(-1)
    nl = 0
    r = 0
    for j in range(k):
        if which[j] and _is_ans(buf, pos, end):  # queued; decoded four at a time
            nxt = _skip_or_dec_column(buf, words, pos, end, n, out[r], tmp, False, tab)
            if nxt < 0:
                return -1
            lanes[0, nl] = pos
            lanes[1, nl] = r * n
            nl += 1
            if nl == LANES:
                if not _dec_lanes(buf, end, n, lanes, nl, flat, scratch, tab):
                    return -1
                nl = 0
            pos = nxt
            r += 1
            continue
        if which[j]:
            pos = _skip_or_dec_column(buf, words, pos, end, n, out[r], tmp, True, tab)
            r += 1
        else:
            pos = _skip_or_dec_column(buf, words, pos, end, n, out[0], tmp, False, tab)
        if pos < 0:
            return -1
    if nl and not _dec_lanes(buf, end, n, lanes, nl, flat, scratch, tab):
        return -1
    return pos


@nb.njit(cache=True, nogil=True)
def _dec_groups(buf: np.ndarray, offsets: np.ndarray, ts_out: np.ndarray,
                out: np.ndarray, tab: tuple) -> int:  # pragma: no cover - numba
    """Decode G groups of equal shape: ts_out (G, T), out (G, k, T); returns 0 or -1-index."""
    k = out.shape[1]
    which = np.ones(k, np.bool_)
    words = _be_words(buf)
    for gi in range(offsets.size - 1):
        p, kk, n = _dec_header(buf, offsets[gi], offsets[gi + 1])
        if p < 0 or kk != k or n != ts_out.shape[1]:
            return -1 - gi
        if _dec_group(buf, words, offsets[gi], offsets[gi + 1], which, ts_out[gi], out[gi], tab) != offsets[
                gi + 1]:
            return -1 - gi
    return 0


@nb.njit(cache=True, nogil=True)
def _sample_counts(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, colptr: np.ndarray,
                   cols: np.ndarray) -> np.ndarray:  # pragma: no cover - numba
    """T of each blob, or -1 when its header is bad or its column selection is not strictly
    increasing within range."""
    out = np.empty(starts.size, np.int64)
    for r in range(starts.size):
        p, k, n = _dec_header(buf, starts[r], ends[r])
        out[r] = n if p >= 0 else -1
        for q in range(colptr[r], colptr[r + 1]):
            if cols[q] < 0 or cols[q] >= k or (q > colptr[r] and cols[q] <= cols[q - 1]):
                out[r] = -1
    return out


@nb.njit(inline="always", cache=True)
def _fill_words(buf: np.ndarray, words: np.ndarray, a: int, b: int) -> None:
    # pragma: no cover - numba
    """Big-endian words covering bytes [a, b) plus the reader's look-ahead."""
    for j in range(a >> 3, min((b >> 3) + 3, words.size)):
        v = U64(0)
        for i in range(8):
            v = (v << U64(8)) | U64(buf[8 * j + i])
        words[j] = v


@nb.njit(cache=True, nogil=True)
def _dec_selected(buf: np.ndarray, starts: np.ndarray, ends: np.ndarray, colptr: np.ndarray,
                  cols: np.ndarray, ts_off: np.ndarray, val_off: np.ndarray, ts_out: np.ndarray,
                  val_out: np.ndarray, tab: tuple) -> int:  # pragma: no cover - numba
    """Decode the selected (sorted) columns of many blobs into flat outputs; -1-r on error.

    Only the bytes of decoded sections are turned into words: skipping a column reads its
    header alone, so a narrow read of a wide group costs little more than its columns.
    """
    words = np.empty(buf.size // 8, np.uint64)
    tmp = np.empty(9, np.int64)
    scratch = np.empty((LANES + 1, 9), np.int64)
    lanes = np.empty((5, LANES), np.int64)
    for r in range(starts.size):
        end = ends[r]
        pos, k, n = _dec_header(buf, starts[r], end)
        if pos < 0:
            return -1 - r
        if n == 0 or colptr[r] == colptr[r + 1]:
            continue
        if tmp.size < n + 8:
            tmp = np.empty(n + 8, np.int64)
            scratch = np.empty((LANES + 1, n + 8), np.int64)
        _fill_words(buf, words, pos, min(end, pos + 10 + (n * 68 + 71) // 8))
        pos = _dec_ts(buf, words, pos, end, n, ts_out[ts_off[r]:ts_off[r] + n])
        if pos < 0:
            return -1 - r
        q = colptr[r]
        base = val_off[r]
        nl = 0
        for j in range(k):
            nxt = _skip_or_dec_column(buf, words, pos, end, n, val_out[base:base + n], tmp, False,
                                      tab)
            if nxt < 0:
                return -1 - r
            if q < colptr[r + 1] and cols[q] == j:
                a = base + (q - colptr[r]) * n
                if _is_ans(buf, pos, end):  # queued; decoded four at a time
                    lanes[0, nl] = pos
                    lanes[1, nl] = a
                    nl += 1
                    if nl == LANES:
                        if not _dec_lanes(buf, end, n, lanes, nl, val_out, scratch, tab):
                            return -1 - r
                        nl = 0
                else:
                    _fill_words(buf, words, pos, nxt)
                    if _skip_or_dec_column(buf, words, pos, end, n, val_out[a:a + n], tmp,
                                           True, tab) != nxt:
                        return -1 - r
                q += 1
            pos = nxt
            if q == colptr[r + 1]:
                break  # the rest of the blob holds no wanted column
        if nl and not _dec_lanes(buf, end, n, lanes, nl, val_out, scratch, tab):
            return -1 - r
    return 0


@nb.njit(cache=True)
def _enc_gorilla(ts: np.ndarray, bits: np.ndarray, buf: np.ndarray) -> int:  # pragma: no cover
    pos = _varint(buf, 0, U64(ts.size))
    if ts.size == 0:
        return pos
    pos = _enc_ts(ts, buf, pos)
    buf[pos] = C_XOR
    return _enc_xor(bits, buf, pos + 1)


@nb.njit(cache=True)
def _gorilla_sizes(ts: np.ndarray, cols: np.ndarray) -> int:  # pragma: no cover - numba
    """Total plain-Gorilla bytes of every series of ts (G, T), cols (G, k, T)."""
    n = ts.shape[1]
    buf = np.zeros(n * 18 + 64, np.uint8)
    total = 0
    for gi in range(ts.shape[0]):
        for j in range(cols.shape[1]):
            total += _enc_gorilla(ts[gi], cols[gi, j].view(np.uint64), buf)
    return total


# ---------------------------------------------------------------------------- Python API


def _bound(k: int, n: int) -> int:
    """Upper bound of one group's encoded size, plus room for a trial XOR column."""
    return 32 + (n * 9 + 32) + k * (n * 9 + 48) + (n * 10 + 48)


def _check_group(ts: npt.ArrayLike, values: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    t = np.ascontiguousarray(ts, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    if t.ndim != 1:
        raise ValueError(f"ts must be 1-D, got shape {t.shape}")
    if v.ndim == 1:
        v = v.reshape(-1, 1)
    if v.ndim != 2 or v.shape[0] != t.size:
        raise ValueError(f"values must be (T, k) with T = {t.size}, got shape {v.shape}")
    return t, np.ascontiguousarray(v.T)


def encode_group(ts: npt.ArrayLike, values: npt.ArrayLike, entropy_coded: bool = False) -> bytes:
    """Encode T timestamps (int64 ms) and ``values`` (float64, shape (T, k)) as one chunk.

    ``entropy_coded`` also tries the rANS stage on every residual stream (about half the
    speed; the store uses it when it compacts a finished segment, not on ingest)."""
    t, cols = _check_group(ts, values)
    buf = np.zeros(_bound(cols.shape[0], t.size) + PAD, np.uint8)
    end = _enc_group(t, cols, buf, 0, entropy_coded, entropy.TABLES)
    return buf[:end].tobytes()


def _padded(blob: bytes | np.ndarray) -> tuple[np.ndarray, int]:
    """A copy with >= PAD zero bytes after it, a whole number of 8-byte words long."""
    raw = np.frombuffer(blob, dtype=np.uint8) if isinstance(blob, bytes | bytearray | memoryview) \
        else np.asarray(blob, dtype=np.uint8)
    buf = np.zeros((raw.size + PAD + 7) // 8 * 8, np.uint8)
    buf[:raw.size] = raw
    return buf, raw.size


def decode_group(blob: bytes, columns: npt.ArrayLike | None = None
                 ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Decode a chunk: ``(ts int64[T], values float64[T, c])`` for the chosen columns.

    ``columns`` (indices into the group's k series, in any order, repeats allowed)
    defaults to all. ``values`` is a transposed view of a (c, T) array.
    """
    buf, end = _padded(blob)
    pos, k, n = _dec_header(buf, 0, end)
    if pos < 0:
        raise CodecError(f"not a chunk: bad header ({end} bytes)")
    if columns is None:  # the common case, without the selection's array work
        which = np.ones(k, np.bool_)
        cols = uniq = None
    else:
        cols = np.asarray(columns, dtype=np.int64).reshape(-1)
        if cols.size and (cols.min() < 0 or cols.max() >= k):
            raise CodecError(f"column index out of range for a group of {k} series")
        which = np.zeros(k, np.bool_)
        which[cols] = True
        uniq = np.flatnonzero(which)
    ts = np.empty(n, np.int64)
    out = np.empty((k if uniq is None else uniq.size, n), np.uint64)
    got = _dec_group(buf, _be_words(buf), 0, end, which, ts, out, entropy.TABLES)
    if got != end:
        raise CodecError(f"corrupt chunk of {end} bytes (k={k}, T={n}): decoding stopped at {got}")
    vals = out.view(np.float64)
    if uniq is not None and not np.array_equal(uniq, cols):
        vals = vals[np.searchsorted(uniq, cols)]
    return ts, vals.T


def encode_groups(ts: npt.ArrayLike, values: npt.ArrayLike, entropy_coded: bool = False
                  ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Encode G groups at once: ts (G, T) int64, values (G, T, k) float64
    (``entropy_coded`` as in :func:`encode_group`).

    Returns ``(buffer, offsets)``: group g is ``buffer[offsets[g]:offsets[g+1]]``, a
    blob that :func:`decode_group` reads.
    """
    t = np.ascontiguousarray(ts, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    if t.ndim != 2 or v.ndim != 3 or v.shape[:2] != t.shape:
        raise ValueError(f"want ts (G, T) and values (G, T, k), got {t.shape} and {v.shape}")
    cols = np.ascontiguousarray(v.transpose(0, 2, 1))
    g, n = t.shape
    buf = np.zeros(g * _bound(cols.shape[1], n) + PAD, np.uint8)
    offsets = np.zeros(g + 1, np.int64)
    _enc_groups(t, cols, buf, offsets, entropy_coded, entropy.TABLES)
    return buf[:offsets[-1]], offsets


def encode_ragged(ts: Sequence[npt.NDArray[np.int64]], values: Sequence[npt.NDArray[np.float64]]
                  ) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """Encode groups of any shapes at once: ``ts[g]`` int64[T_g], ``values[g]`` float64
    (T_g, k_g); returns ``(buffer, offsets)`` as :func:`encode_groups` does. One call for
    the tens of thousands of small groups a store flushes, each a call of its own before
    (a one-row group cost more to hand over than to encode)."""
    if len(ts) != len(values):
        raise ValueError(f"{len(ts)} timestamp arrays for {len(values)} value arrays")
    for t, v in zip(ts, values, strict=True):
        if t.ndim != 1 or v.ndim != 2 or v.shape[0] != t.size:
            raise ValueError(f"want ts (T,) and values (T, k), got {t.shape} and {v.shape}")
    ns = np.fromiter((t.size for t in ts), np.int64, len(ts))
    ks = np.fromiter((v.shape[1] for v in values), np.int64, len(ts))
    ts_off = np.zeros(ns.size + 1, np.int64)
    np.cumsum(ns, out=ts_off[1:])
    v_off = np.zeros(ns.size + 1, np.int64)
    np.cumsum(ns * ks, out=v_off[1:])
    flat_ts = np.concatenate([np.asarray(t, np.int64) for t in ts]) if len(ts) else \
        np.zeros(0, np.int64)
    flat_v = np.concatenate([np.asarray(v, np.float64).T.reshape(-1) for v in values]) \
        if len(values) else np.zeros(0, np.float64)
    size = sum(map(_bound, ks.tolist(), ns.tolist()))
    buf = np.zeros(size + PAD, np.uint8)
    offsets = np.zeros(ns.size + 1, np.int64)
    _enc_ragged(flat_ts, ts_off, flat_v, v_off, ks, buf, offsets, False, entropy.TABLES)
    return buf[:offsets[-1]], offsets


def decode_groups(buffer: npt.ArrayLike, offsets: npt.ArrayLike, k: int, n: int
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Decode what :func:`encode_groups` wrote: ts (G, T), values (G, T, k) (a view)."""
    buf, end = _padded(np.asarray(buffer, dtype=np.uint8))
    off = np.ascontiguousarray(offsets, dtype=np.int64)
    if off.ndim != 1 or off.size < 1 or off[-1] > end or np.any(np.diff(off) < 0):
        raise CodecError(f"offsets do not fit a buffer of {end} bytes")
    g = off.size - 1
    ts = np.empty((g, n), np.int64)
    out = np.empty((g, k, n), np.uint64)
    rc = _dec_groups(buf, off, ts, out, entropy.TABLES)
    if rc != 0:
        raise CodecError(f"group {-1 - rc} of {g} is corrupt or not of shape k={k}, T={n}")
    return ts, out.view(np.float64).transpose(0, 2, 1)


def decode_selected(buffer: npt.ArrayLike, starts: npt.ArrayLike, ends: npt.ArrayLike,
                    colptr: npt.ArrayLike, columns: npt.ArrayLike
                    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                               npt.NDArray[np.float64]]:
    """Decode chosen columns of many chunks in one call (the store's read path).

    Chunk r is ``buffer[starts[r]:ends[r]]``; its wanted columns are
    ``columns[colptr[r]:colptr[r+1]]``, strictly increasing. Returns ``(counts, ts, values)``:
    chunk r has ``counts[r]`` samples; its timestamps are the next ``counts[r]`` of ``ts``
    and its values the next ``counts[r] * c_r`` of ``values``, one column after another.
    Trailing bytes after a chunk's last wanted column are not checked (the store's records
    carry their own CRC).
    """
    raw = np.asarray(buffer, dtype=np.uint8)
    if raw.size % 8 == 0 and raw.size >= PAD and not raw[-PAD:].any():
        buf, end = raw, raw.size - PAD  # already padded by the caller: no copy
    else:
        buf, end = _padded(raw)
    st = np.ascontiguousarray(starts, dtype=np.int64)
    en = np.ascontiguousarray(ends, dtype=np.int64)
    ptr = np.ascontiguousarray(colptr, dtype=np.int64)
    cols = np.ascontiguousarray(columns, dtype=np.int64)
    if (st.ndim != 1 or en.shape != st.shape or ptr.size != st.size + 1
            or (st.size and (st.min() < 0 or en.max() > end or np.any(en < st)))
            or ptr[0] != 0 or ptr[-1] != cols.size or np.any(np.diff(ptr) < 0)):
        raise CodecError(f"starts / ends / colptr do not fit a buffer of {end} bytes and "
                         f"{cols.size} columns")
    counts = _sample_counts(buf, st, en, ptr, cols)
    if counts.size and counts.min() < 0:
        bad = int(np.argmin(counts))
        raise CodecError(f"chunk {bad} of {counts.size}: bad header or column selection")
    widths = np.diff(ptr)
    counts = np.where(widths > 0, counts, 0)
    ts_off = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=ts_off[1:])
    val_off = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts * widths, out=val_off[1:])
    ts = np.empty(int(ts_off[-1]), np.int64)
    vals = np.empty(int(val_off[-1]), np.uint64)
    rc = _dec_selected(buf, st, en, ptr, cols, ts_off, val_off, ts, vals, entropy.TABLES)
    if rc != 0:
        raise CodecError(f"chunk {-1 - rc} of {counts.size} is corrupt")
    return counts, ts, vals.view(np.float64)


def encode_gorilla(ts: npt.ArrayLike, values: npt.ArrayLike) -> bytes:
    """Plain Gorilla of one series (the baseline): own timestamps, XOR values."""
    t = np.ascontiguousarray(ts, dtype=np.int64)
    v = np.ascontiguousarray(values, dtype=np.float64)
    if t.ndim != 1 or v.shape != t.shape:
        raise ValueError(f"ts and values must be 1-D of one length, got {t.shape}, {v.shape}")
    buf = np.zeros(t.size * 18 + 64, np.uint8)
    return buf[:_enc_gorilla(t, v.view(np.uint64), buf)].tobytes()


def decode_gorilla(blob: bytes) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Inverse of :func:`encode_gorilla`."""
    buf, end = _padded(blob)
    n, pos = _rvarint(buf, 0, end)
    if pos < 0 or n > MAX_SAMPLES:
        raise CodecError(f"not a Gorilla series: bad length ({end} bytes)")
    ts = np.empty(int(n), np.int64)
    out = np.empty(int(n), np.uint64)
    if n:
        words = _be_words(buf)
        pos = _dec_ts(buf, words, pos, end, int(n), ts)
        if pos < 0 or pos >= end or buf[pos] != C_XOR:
            raise CodecError(f"corrupt Gorilla series ({end} bytes)")
        pos = _dec_xor(buf, words, pos + 1, end, int(n), out)
    if pos != end:
        raise CodecError(f"corrupt Gorilla series ({end} bytes): stopped at {pos}")
    return ts, out.view(np.float64)


def gorilla_bytes(ts: npt.ArrayLike, values: npt.ArrayLike) -> int:
    """Plain-Gorilla size of every series of ts (G, T), values (G, T, k), without copies."""
    t = np.ascontiguousarray(ts, dtype=np.int64)
    v = np.asarray(values, dtype=np.float64)
    return int(_gorilla_sizes(t, np.ascontiguousarray(v.transpose(0, 2, 1))))


def column_layout(blob: bytes) -> tuple[int, list[int], list[int]]:
    """(header + timestamp bytes, per-column tag, per-column bytes) of a chunk.

    For statistics (bytes per metric in the benchmark) and tests; walks headers only.
    """
    buf, end = _padded(blob)
    pos, k, n = _dec_header(buf, 0, end)
    if pos < 0:
        raise CodecError("not a chunk")
    if n == 0:
        return int(pos), [], []
    ts = np.empty(n, np.int64)
    words = _be_words(buf)
    pos = _dec_ts(buf, words, pos, end, n, ts)
    head = pos
    tags: list[int] = []
    sizes: list[int] = []
    tmp = np.empty(n + 8, np.int64)
    scratch = np.empty(n, np.uint64)
    for _ in range(k):
        if pos < 0:
            raise CodecError("corrupt chunk")
        tags.append(int(buf[pos]))
        nxt = _skip_or_dec_column(buf, words, pos, end, n, scratch, tmp, False, entropy.TABLES)
        sizes.append(int(nxt - pos))
        pos = nxt
    if pos != end:
        raise CodecError("corrupt chunk")
    return int(head), tags, sizes


def column_residuals(blob: bytes) -> list[npt.NDArray[np.int64] | None]:
    """Per column, the residuals its DELTA / DOD stream codes (None for other tags).

    For the benchmark's distance to the entropy floor: their empirical entropy is what any
    coder of these streams could reach at best."""
    buf, end = _padded(blob)
    pos, k, n = _dec_header(buf, 0, end)
    if pos < 0 or n == 0:
        return []
    words = _be_words(buf)
    pos = _dec_ts(buf, words, pos, end, n, np.empty(n, np.int64))
    out: list[npt.NDArray[np.int64] | None] = []
    tmp = np.empty(n + 8, np.int64)
    scratch = np.empty(n, np.uint64)
    for _ in range(k):
        if pos < 0:
            raise CodecError("corrupt chunk")
        tag = int(buf[pos])
        streamed = tag in (C_DELTA, C_DOD, C_DELTA_ANS, C_DOD_ANS)
        if streamed:
            _skip_or_dec_column(buf, words, pos, end, n, scratch, tmp, True, entropy.TABLES, True)
            out.append(tmp[:n - (1 if tag in (C_DELTA, C_DELTA_ANS) else 2)].copy())
        else:
            out.append(None)
        pos = _skip_or_dec_column(buf, words, pos, end, n, scratch, tmp, False, entropy.TABLES)
    return out


def column_tags(blob: bytes) -> list[int]:
    """The encoding tag of each column of a chunk."""
    return column_layout(blob)[1]


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels the store calls: seal and read.

    Sealing a chunk is the first encode; in a fresh checkout that compiles for a minute on a
    busy 2-core machine, and inside a consumer loop it got the aggregator expelled from its
    group (issue 16). Values of every column kind (constant, scaled integers, decimals,
    XOR) go through so that each kernel's signatures are compiled now, not at the first seal.
    """
    t = 1_000 * np.arange(16, dtype=np.int64)
    ramp = np.arange(16, dtype=np.float64)
    values = np.stack([np.zeros(16), ramp * 15e6, ramp * 0.37, np.sqrt(ramp + 0.5),
                       np.full(16, np.nan)], axis=1)
    blob = encode_group(t, values)
    decode_group(blob)
    decode_group(encode_group(t, values, entropy_coded=True))  # what compaction writes
    decode_selected(np.frombuffer(blob, np.uint8), np.zeros(1, np.int64), np.asarray([len(blob)], np.int64),
                    np.asarray([0, 2], np.int64), np.asarray([1, 3], np.int64))
    buf, offsets = encode_groups(t.reshape(1, -1), values.reshape(1, 16, 5))
    decode_groups(buf, offsets, 5, 16)
    encode_ragged([t, t[:1]], [values, values[:1]])  # what a flush writes

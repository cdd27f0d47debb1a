# numba kernels mix Python ints with numpy scalars; mypy cannot follow them (as in codec.py).
# mypy: disable-error-code="arg-type,assignment,return-value,call-arg"
"""Column-wise protobuf encoding of Prometheus' remote-storage answers: no object per sample.

A remote-read answer or a remote-write body is mostly samples. Building them with protobuf
message objects costs a Python object per sample; here the repeated parts are written by
numba kernels straight from the store's columns (``ts``, ``values``, per-series
``offsets``), and only the per-series framing is Python.

Wire layouts written (field numbers from ``prompb``, see :mod:`aggregator.prompb`)::

    Sample        := 0x09 f64le(value) | 0x10 varint(timestamp)
    TimeSeries    := (0x0a len Label)* | (0x12 len Sample)*
    Label         := 0x0a len name | 0x12 len value
    ChunkedSeries := (0x0a len Label)* | (0x12 len Chunk)*
    Chunk         := 0x08 varint(min_t) | 0x10 varint(max_t) | 0x18 0x01 (XOR) | 0x22 len data

XOR chunk ``data`` is Prometheus' TSDB float chunk (``chunkenc`` XOR): u16 big-endian
sample count, then an MSB-first bit stream: the first timestamp as a zigzag varint, the
first value's 64 bits, the second timestamp's delta as a varint; from the third sample on
the delta-of-delta in the buckets ``'0'`` | ``'10'`` 14 bits | ``'110'`` 17 | ``'1110'`` 20 |
``'1111'`` 64 (two's complement); every value after the first is Gorilla's XOR with the
control bits ``'0'`` (same) | ``'10'`` (inside the previous window) | ``'11'`` lz:5 sig:6.
The XOR value coding is the store codec's own (:mod:`aggregator.store.codec`), whose bit
writer this module shares.

Streamed frames (``STREAMED_XOR_CHUNKS``): varint(len) | u32 big-endian CRC-32C of the
message | the ``ChunkedReadResponse`` message.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

import numba as nb
import numpy as np
import numpy.typing as npt

from aggregator.store.codec import _bitlen, _ctz, _finish, _put, _varint, _varint_len

__all__ = ["CHUNK_SAMPLES", "crc32c", "encode_labels", "field", "frame", "series_blocks",
           "uvarint", "warm_up", "xor_chunks"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
U64 = np.uint64
CHUNK_SAMPLES: Final = 120
"""Samples per XOR chunk, as Prometheus' head cuts them."""


def uvarint(n: int) -> bytes:
    """Protobuf varint of ``n`` (a negative int64 as its 64-bit two's complement)."""
    n &= (1 << 64) - 1
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field: tag, length, payload."""
    return uvarint(number << 3 | 2) + uvarint(len(payload)) + payload


def encode_labels(labels: Iterable[tuple[str, str]], number: int = 1) -> bytes:
    """Repeated ``Label`` messages as field ``number`` (labels in the order given)."""
    return b"".join(field(number, field(1, k.encode()) + field(2, v.encode()))
                    for k, v in labels)


@nb.njit(cache=True)
def _put_varint(buf: np.ndarray, q: int, acc: np.uint64, nacc: int, u: np.uint64
                ) -> tuple[int, np.uint64, int]:  # pragma: no cover - numba
    """A varint's bytes into the bit stream (aligned where Prometheus writes them)."""
    while u >= U64(0x80):
        q, acc, nacc = _put(buf, q, acc, nacc, (u & U64(0x7F)) | U64(0x80), 8)
        u >>= U64(7)
    return _put(buf, q, acc, nacc, u, 8)


@nb.njit(cache=True)
def _dod_code(dod: np.int64) -> tuple[np.uint64, int]:  # pragma: no cover - numba
    """(bits, width) of a delta-of-delta up to 20 bits with its prefix; width 0: 64-bit case."""
    if dod == 0:
        return U64(0), 1
    for prefix, plen, size in ((0b10, 2, 14), (0b110, 3, 17), (0b1110, 4, 20)):
        half = np.int64(1) << (size - 1)
        if -(half - 1) <= dod <= half:
            mask = (U64(1) << U64(size)) - U64(1)
            return (U64(prefix) << U64(size)) | (U64(dod) & mask), plen + size
    return U64(0), 0


@nb.njit(cache=True)
def _xor_chunks(ts: np.ndarray, vals: np.ndarray, offsets: np.ndarray, per: int
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    n = ts.size
    n_chunks = 0
    for s in range(offsets.size - 1):
        n_chunks += (offsets[s + 1] - offsets[s] + per - 1) // per
    buf = np.zeros(n * 19 + n_chunks * 48 + 16, np.uint8)
    bounds = np.zeros(n_chunks + 1, np.int64)
    first = np.zeros(n_chunks + 1, np.int64)
    series_chunks = np.zeros(offsets.size, np.int64)
    bits = vals.view(np.uint64)
    p = 0
    c = 0
    for s in range(offsets.size - 1):
        a = offsets[s]
        while a < offsets[s + 1]:
            b = min(a + per, offsets[s + 1])
            first[c] = a
            count = b - a
            buf[p] = np.uint8(count >> 8)
            buf[p + 1] = np.uint8(count & 0xFF)
            t0 = ts[a]
            q, acc, nacc = _put_varint(buf, p + 2, U64(0), 0,
                                       U64((t0 << np.int64(1)) ^ (t0 >> np.int64(63))))
            q, acc, nacc = _put(buf, q, acc, nacc, bits[a], 64)
            plz = 0xFF
            ptz = 0
            delta = np.int64(0)
            for i in range(a + 1, b):
                d = ts[i] - ts[i - 1]
                if i == a + 1:
                    q, acc, nacc = _put_varint(buf, q, acc, nacc, U64(d))
                else:
                    code, width = _dod_code(d - delta)
                    if width == 0:
                        q, acc, nacc = _put(buf, q, acc, nacc, U64(0b1111), 4)
                        code, width = U64(d - delta), 64
                    q, acc, nacc = _put(buf, q, acc, nacc, code, width)
                delta = d
                x = bits[i] ^ bits[i - 1]
                if x == U64(0):
                    q, acc, nacc = _put(buf, q, acc, nacc, U64(0), 1)
                    continue
                lz = min(64 - _bitlen(x), 31)
                tz = _ctz(x)
                if plz != 0xFF and lz >= plz and tz >= ptz:
                    head, hbits, sig, shift = U64(0b10), 2, 64 - plz - ptz, ptz
                else:
                    sig = 64 - lz - tz
                    head = (U64(0b11) << U64(11)) | (U64(lz) << U64(6)) | U64(sig & 63)
                    hbits, shift, plz, ptz = 13, tz, lz, tz
                q, acc, nacc = _put(buf, q, acc, nacc, head, hbits)
                q, acc, nacc = _put(buf, q, acc, nacc, x >> U64(shift), sig)
            p = _finish(buf, q, acc, nacc)
            c += 1
            bounds[c] = p
            a = b
        series_chunks[s + 1] = c
    first[c] = n
    return buf[:p], bounds, first, series_chunks


def xor_chunks(ts: I64, vals: F64, offsets: I64, per: int = CHUNK_SAMPLES
               ) -> tuple[bytes, list[int], list[int], list[int]]:
    """Every series cut into XOR chunks of at most ``per`` samples.

    Returns (data, bounds, first, series_chunks): chunk ``c`` is ``data[bounds[c]:bounds[c+1]]``
    and holds samples ``first[c]`` to ``first[c+1] - 1``; series ``s`` has chunks
    ``series_chunks[s]`` to ``series_chunks[s+1] - 1``.
    """
    if not 1 <= per <= 65_535:
        raise ValueError(f"samples per chunk must be 1..65535, not {per}")
    buf, bounds, first, series_chunks = _xor_chunks(
        np.ascontiguousarray(ts, np.int64), np.ascontiguousarray(vals, np.float64),
        np.ascontiguousarray(offsets, np.int64), per)
    return buf.tobytes(), bounds.tolist(), first.tolist(), series_chunks.tolist()


def _crc_table() -> npt.NDArray[np.uint32]:
    table = np.zeros(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table[i] = c
    return table


_CRC_TABLE: Final = _crc_table()


@nb.njit(cache=True)
def _crc32c(data: np.ndarray, table: np.ndarray) -> np.uint32:  # pragma: no cover - numba
    c = np.uint32(0xFFFFFFFF)
    for b in data:
        c = table[(c ^ np.uint32(b)) & np.uint32(0xFF)] ^ (c >> np.uint32(8))
    return c ^ np.uint32(0xFFFFFFFF)


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli), the checksum of a streamed remote-read frame."""
    return int(_crc32c(np.frombuffer(data, np.uint8), _CRC_TABLE))


def frame(message: bytes) -> bytes:
    """One streamed remote-read frame around an encoded ``ChunkedReadResponse``."""
    return uvarint(len(message)) + crc32c(message).to_bytes(4, "big") + message


def warm_up() -> None:
    """Compile (or load from numba's cache) the kernels before the first remote read or
    write: a cold compile takes seconds, longer than a client's read timeout on a busy host."""
    ts, vals, offsets = np.zeros(2, np.int64), np.zeros(2), np.asarray([0, 2])
    series_blocks([b"\x0a\x00"], np.zeros((1, 1), np.int64), ts, vals, offsets)
    xor_chunks(ts, vals, offsets)
    crc32c(b"")


@nb.njit(cache=True)
def _series_blocks(blob: np.ndarray, blob_off: np.ndarray, parts: np.ndarray, ts: np.ndarray,
                   vals: np.ndarray, offsets: np.ndarray) -> np.ndarray:  # pragma: no cover
    n_series, n_parts = parts.shape
    lab = np.zeros(n_series, np.int64)
    body = np.zeros(n_series, np.int64)
    total = 0
    for s in range(n_series):
        for k in range(n_parts):
            p = parts[s, k]
            if p >= 0:
                lab[s] += blob_off[p + 1] - blob_off[p]
        size = lab[s]
        for i in range(offsets[s], offsets[s + 1]):
            size += 12 + _varint_len(U64(ts[i]))
        body[s] = size
        total += 1 + _varint_len(U64(size)) + size
    buf = np.empty(total, np.uint8)
    bits = vals.view(np.uint64)
    q = 0
    for s in range(n_series):
        buf[q] = 0x0A
        q = _varint(buf, q + 1, U64(body[s]))
        for k in range(n_parts):
            p = parts[s, k]
            if p >= 0:
                for j in range(blob_off[p], blob_off[p + 1]):
                    buf[q] = blob[j]
                    q += 1
        for i in range(offsets[s], offsets[s + 1]):
            t = U64(ts[i])
            buf[q] = 0x12
            buf[q + 1] = np.uint8(10 + _varint_len(t))
            buf[q + 2] = 0x09
            b = bits[i]
            for k in range(8):
                buf[q + 3 + k] = np.uint8((b >> U64(8 * k)) & U64(0xFF))
            buf[q + 11] = 0x10
            q = _varint(buf, q + 12, t)
    return buf


def series_blocks(blobs: list[bytes], parts: npt.NDArray[np.int64], ts: I64, vals: F64,
                  offsets: I64) -> bytes:
    """Repeated ``TimeSeries`` (field 1 of a WriteRequest or a QueryResult), in one pass.

    Series ``s`` has the labels ``blobs[parts[s, 0]] + blobs[parts[s, 1]] + ...`` (each blob
    already encoded Label fields, -1 for none: shared by every series that has them) and the
    samples ``ts[offsets[s]:offsets[s+1]]``.
    """
    blob_off = np.zeros(len(blobs) + 1, np.int64)
    np.cumsum([len(b) for b in blobs], out=blob_off[1:])
    table = np.frombuffer(b"".join(blobs), np.uint8) if blobs else np.zeros(0, np.uint8)
    return _series_blocks(table, blob_off, np.ascontiguousarray(parts, np.int64),
                          np.ascontiguousarray(ts, np.int64),
                          np.ascontiguousarray(vals, np.float64),
                          np.ascontiguousarray(offsets, np.int64)).tobytes()

"""Append-only segment files: CRC-checked chunk records, torn-tail recovery, an index.

One segment file holds the chunks of one tier whose first timestamp falls in
``[start_ms, start_ms + span_ms)``; chunks never cross a segment boundary, so retention
deletes whole files.

Byte layout (little-endian)::

    file   := file_header record*
    file_header (32 B) := b"FPSEG001" | i64 start_ms | i64 span_ms | u32 crc32(previous 24 B)
                          | u32 reserved (0)
    record := u32 magic 0x52435046 ("FPCR") | u32 body_len | u32 crc32(body) | body
    body   := u8 kind (1 sealed, 2 partial) | u8 ids_form | u16 reserved | u32 k | u32 n
              | i64 t_min | i64 t_max | i64 chunk_key | ids | codec blob
    ids    := ids_form 0: i64 first | i64 step               (an arithmetic sequence)
              ids_form 1, 2, 4: i64 first | int{8,16,32} deltas[k-1] (consecutive differences)
              ids_form 8: i64 series_ids[k]

``kind`` says whether the record holds a whole chunk (sealed) or the samples of an open
chunk made durable by a flush (partial); ``chunk_key`` (the chunk's first timestamp) lets
compaction drop partial records once their chunk is sealed. The codec blob is
:func:`aggregator.store.codec.encode_group` output (self-describing): prefix-coded as
written on ingest, entropy-coded once compaction has rewritten the segment.

Recovery: :func:`scan_segment` walks the records; the first one that is short, has a bad
magic, or fails its CRC ends the valid prefix and the file is truncated there (a crash can
only tear the tail of an append-only file; anything after a bad record is unreachable).
"""

from __future__ import annotations

import io
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

FILE_MAGIC: Final = b"FPSEG001"
FILE_HEADER: Final = struct.Struct("<8sqqII")
RECORD_MAGIC: Final = 0x52435046
RECORD_HEADER: Final = struct.Struct("<III")
BODY_HEADER: Final = struct.Struct("<BBHIIqqq")
KIND_SEALED: Final = 1
KIND_PARTIAL: Final = 2
MAX_BODY: Final = 1 << 30


class SegmentError(Exception):
    """A segment file's header is unreadable (not a torn tail: the file is not ours)."""


@dataclass(frozen=True, slots=True)
class RecordInfo:
    """Where one record lies and what it covers (the in-memory index entry)."""

    offset: int
    """File offset of the record header."""
    length: int
    """Whole record length, header included."""
    kind: int
    n: int
    t_min: int
    t_max: int
    chunk_key: int
    series_ids: npt.NDArray[np.int64]


def segment_name(start_ms: int) -> str:
    """File name of the segment starting at ``start_ms`` (sorts by time; negative allowed)."""
    return f"seg{start_ms:+021d}.fps"


def parse_segment_name(name: str) -> int | None:
    if not (name.startswith("seg") and name.endswith(".fps")):
        return None
    try:
        return int(name[3:-4])
    except ValueError:
        return None


def write_file_header(start_ms: int, span_ms: int) -> bytes:
    head = FILE_HEADER.pack(FILE_MAGIC, start_ms, span_ms, 0, 0)[:24]
    return head + struct.pack("<II", zlib.crc32(head), 0)


_DELTA_TYPES: Final = {1: "<i1", 2: "<i2", 4: "<i4"}


def encode_ids(ids: npt.NDArray[np.int64]) -> tuple[int, bytes]:
    """(ids_form, bytes): a group's ids are usually a run or close together, so they
    cost 16 bytes or 1-4 bytes each instead of 8 in every record."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if ids.size >= 2:
        d = np.diff(ids)
        if (d == d[0]).all():
            return 0, struct.pack("<qq", int(ids[0]), int(d[0]))
        for width, dt in _DELTA_TYPES.items():
            info = np.iinfo(dt)
            if d.min() >= info.min and d.max() <= info.max:
                return width, struct.pack("<q", int(ids[0])) + d.astype(dt).tobytes()
    return 8, ids.astype("<i8").tobytes()


def decode_ids(form: int, k: int, body: bytes, offset: int) -> tuple[npt.NDArray[np.int64], int]:
    """Inverse of :func:`encode_ids`: (ids, offset after them)."""
    if form == 0:
        first, step = struct.unpack_from("<qq", body, offset)
        return first + step * np.arange(k, dtype=np.int64), offset + 16
    if form in _DELTA_TYPES:
        (first,) = struct.unpack_from("<q", body, offset)
        d = np.frombuffer(body, dtype=_DELTA_TYPES[form], count=k - 1, offset=offset + 8)
        ids = np.empty(k, np.int64)
        ids[0] = first
        np.cumsum(d, dtype=np.int64, out=ids[1:])
        ids[1:] += first
        return ids, offset + 8 + form * (k - 1)
    if form == 8:
        return np.frombuffer(body, dtype="<i8", count=k, offset=offset).astype(np.int64), \
            offset + 8 * k
    raise ValueError(f"unknown ids form {form}")


def encode_record(kind: int, ids: tuple[int, int, bytes], n: int, t_min: int, t_max: int,
                  chunk_key: int, blob: bytes) -> bytes:
    """One framed record ready to append; ``ids`` is (k, *encode_ids(series_ids)), which a
    store computes once per group (a group's ids never change, and encoding them was a
    fifth of what writing a one-row record cost)."""
    k, form, raw = ids
    body = b"".join((BODY_HEADER.pack(kind, form, 0, k, n, t_min, t_max, chunk_key), raw,
                     blob))
    return RECORD_HEADER.pack(RECORD_MAGIC, len(body), zlib.crc32(body)) + body


def decode_record_body(body: bytes) -> tuple[RecordInfo, bytes]:
    """Split a CRC-verified body into its index entry (offset 0) and codec blob."""
    kind, form, _, k, n, t_min, t_max, chunk_key = BODY_HEADER.unpack_from(body, 0)
    ids, end = decode_ids(form, k, body, BODY_HEADER.size)
    return RecordInfo(0, 0, kind, n, t_min, t_max, chunk_key, ids), body[end:]


def _ids_length(form: int, k: int) -> int:
    """Bytes of a body's ids section (see :func:`encode_ids`)."""
    return 16 if form == 0 else 8 * k if form == 8 else 8 + form * (k - 1)


def checked_blob(record: bytes) -> bytes:
    """The codec blob of a whole framed record, after checking its magic, length and CRC
    (compaction reads the records it rewrites through this); :class:`SegmentError` if bad."""
    magic, body_len, crc = RECORD_HEADER.unpack_from(record, 0)
    body = record[RECORD_HEADER.size:]
    if magic != RECORD_MAGIC or len(body) != body_len or zlib.crc32(body) != crc:
        raise SegmentError("record failed its check")
    return body[BODY_HEADER.size + _ids_length(body[1], int.from_bytes(body[4:8], "little")):]


def read_records_into(f: io.BufferedReader, offsets: list[int], lengths: list[int], out: memoryview,
                      at: int) -> list[tuple[int, int]]:
    """Read records (each CRC-checked) into ``out`` from byte ``at`` on, back to back.

    Returns each record's codec blob as (start, end) within ``out``. The read path uses
    this to hand every blob of a query to one decoder call without a copy per record.
    """
    spans = []
    for offset, length in zip(offsets, lengths, strict=True):
        f.seek(offset)
        rec = out[at:at + length]
        if f.readinto(rec) != length:
            raise SegmentError(f"record at offset {offset} is short on read")
        magic, body_len, crc = RECORD_HEADER.unpack_from(rec, 0)
        body = rec[RECORD_HEADER.size:]
        if magic != RECORD_MAGIC or len(body) != body_len or zlib.crc32(body) != crc:
            raise SegmentError(f"record at offset {offset} failed its check on read")
        ids_len = _ids_length(body[1], int.from_bytes(body[4:8], "little"))
        start = at + RECORD_HEADER.size + BODY_HEADER.size + ids_len
        spans.append((start, at + length))
        at += length
    return spans


def scan_segment(path: Path, truncate: bool = True) -> tuple[int, int, list[RecordInfo]]:
    """Index a segment file, truncating a torn tail. Returns (start_ms, span_ms, records).

    Raises :class:`SegmentError` when the 32-byte file header itself is bad (the caller
    decides what to do with a file it cannot identify; an empty or short file left by a
    crash during creation is reported the same way).
    """
    records: list[RecordInfo] = []
    with open(path, "rb") as f:
        head = f.read(FILE_HEADER.size)
        if len(head) < FILE_HEADER.size:
            raise SegmentError(f"{path}: short file header ({len(head)} bytes)")
        magic, start_ms, span_ms, crc, _ = FILE_HEADER.unpack(head)
        if magic != FILE_MAGIC or zlib.crc32(head[:24]) != crc:
            raise SegmentError(f"{path}: bad file header")
        offset = FILE_HEADER.size
        while True:
            rh = f.read(RECORD_HEADER.size)
            if not rh:
                break
            if len(rh) < RECORD_HEADER.size:
                break
            magic, body_len, crc = RECORD_HEADER.unpack(rh)
            if magic != RECORD_MAGIC or body_len > MAX_BODY or body_len < BODY_HEADER.size:
                break
            body = f.read(body_len)
            if len(body) < body_len or zlib.crc32(body) != crc:
                break
            try:
                info, _ = decode_record_body(body)
            except (ValueError, struct.error):  # a valid CRC over a body we cannot read
                break
            length = RECORD_HEADER.size + body_len
            records.append(RecordInfo(offset, length, info.kind, info.n, info.t_min,
                                      info.t_max, info.chunk_key, info.series_ids))
            offset += length
        size = os.fstat(f.fileno()).st_size
    if truncate and size > offset:
        with open(path, "r+b") as f:
            f.truncate(offset)
            os.fsync(f.fileno())
    return start_ms, span_ms, records


def fsync_dir(path: Path) -> None:
    """Make a file creation, rename or deletion in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

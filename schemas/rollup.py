"""The rollup frame: one entity's aggregates for one window, on the rollups topic.

Rack-level aggregators publish one frame per rack and closed window (keyed by row); the
row/cluster stage merges them. Like the sample frame it is columnar, one frame per
entity-window rather than one record per metric.

Byte layout (all integers little-endian)::

    offset  size  field
    0       4     magic  b"FPRF"
    4       1     version (1)
    5       1     flags (0)
    6       2     reserved, 0
    8       4     H = length of the JSON header
    12      H     JSON header (orjson), an object:
                    level                 "rack" or "row" (the entity's level)
                    cluster, row, rack    identity strings; rack is "" for level "row"
                    start_ms, width_ms    the window [start_ms, start_ms + width_ms)
                    metrics               catalog ids, length M
                    sketch_slots          number of sketch slots S (slot < S)
                    n_sketch              number of sketch entries N
    12+H    P     zero padding to an 8-byte boundary
    ...     8M    last_ts   int64, timestamp of ``last`` per metric
    ...     56M   aggs      float64 [7, M]: count, sum, min, max, last, sumsq, increase
    ...     8N    counts    float64, sketch bucket counts (> 0)
    ...     4N    columns   int32, index into ``metrics`` of each sketch entry
    ...     4N    slots     int32, sketch slot of each entry (see aggregator.sketch)

(level, cluster, row, rack, start_ms, width_ms) identifies a frame: a replayed frame is the
same frame, so consumers replace rather than add. Decoding raises DecodeError only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from schemas.catalog import BY_ID
from schemas.errors import DecodeError
from schemas.identity import check_name

__all__ = ["AGG_ROWS", "ROLLUP_LEVELS", "RollupFrame", "decode_rollup", "encode_rollup"]

MAGIC: Final = b"FPRF"
VERSION: Final = 1
ROLLUP_LEVELS: Final = ("rack", "row")
AGG_ROWS: Final = ("count", "sum", "min", "max", "last", "sumsq", "increase")
MAX_METRICS: Final = 1024
MAX_SKETCH: Final = 1 << 22
MAX_HEADER: Final = 1 << 16
_FIXED = struct.Struct("<4sBBHI")


@dataclass(frozen=True, slots=True, eq=False)
class RollupFrame:
    """One entity's window. ``aggs[i]`` is the row named ``AGG_ROWS[i]``."""

    level: str
    cluster: str
    row: str
    rack: str
    start_ms: int
    width_ms: int
    metric_ids: npt.NDArray[np.uint16]
    last_ts: npt.NDArray[np.int64]
    aggs: npt.NDArray[np.float64]
    sketch_slots: int
    sketch_cols: npt.NDArray[np.int32]
    sketch_slot: npt.NDArray[np.int32]
    sketch_counts: npt.NDArray[np.float64]

    @property
    def key(self) -> tuple[str, str, str, str, int, int]:
        """What identifies the frame (replays carry the same key)."""
        return (self.level, self.cluster, self.row, self.rack, self.start_ms, self.width_ms)


def encode_rollup(frame: RollupFrame) -> bytes:
    """Serialise ``frame``; raises ValueError when its arrays disagree in shape."""
    m = len(frame.metric_ids)
    n = len(frame.sketch_counts)
    if frame.aggs.shape != (len(AGG_ROWS), m) or frame.last_ts.shape != (m,):
        raise ValueError(f"aggs {frame.aggs.shape} / last_ts {frame.last_ts.shape} vs {m} metrics")
    if frame.sketch_cols.shape != (n,) or frame.sketch_slot.shape != (n,):
        raise ValueError("sketch arrays must have one entry each")
    header = orjson.dumps({
        "level": frame.level, "cluster": frame.cluster, "row": frame.row, "rack": frame.rack,
        "start_ms": frame.start_ms, "width_ms": frame.width_ms,
        "metrics": frame.metric_ids.tolist(), "sketch_slots": frame.sketch_slots,
        "n_sketch": n,
    })
    pad = -(_FIXED.size + len(header)) % 8
    return b"".join((
        _FIXED.pack(MAGIC, VERSION, 0, 0, len(header)), header, b"\0" * pad,
        np.ascontiguousarray(frame.last_ts, "<i8").tobytes(),
        np.ascontiguousarray(frame.aggs, "<f8").tobytes(),
        np.ascontiguousarray(frame.sketch_counts, "<f8").tobytes(),
        np.ascontiguousarray(frame.sketch_cols, "<i4").tobytes(),
        np.ascontiguousarray(frame.sketch_slot, "<i4").tobytes(),
    ))


def _int(header: dict[str, Any], key: str, lo: int, hi: int) -> int:
    value = header.get(key)
    if type(value) is not int or not lo <= value <= hi:
        raise DecodeError(f"rollup header field {key!r} must be an integer in [{lo}, {hi}]")
    return value


def decode_rollup(data: bytes | bytearray | memoryview) -> RollupFrame:
    """Parse and validate one rollup frame; raises DecodeError saying what is wrong."""
    buf = bytes(data)
    size = len(buf)
    if size < _FIXED.size:
        raise DecodeError(f"rollup frame too short: {size} bytes")
    magic, version, flags, reserved, hlen = _FIXED.unpack_from(buf, 0)
    if magic != MAGIC:
        raise DecodeError(f"bad rollup magic {magic!r}, expected {MAGIC!r}")
    if version != VERSION or flags or reserved:
        raise DecodeError(f"unsupported rollup version {version} / flags {flags} / {reserved}")
    if hlen > min(MAX_HEADER, size - _FIXED.size):
        raise DecodeError(f"rollup header length {hlen} exceeds the bytes left")
    try:
        header = orjson.loads(buf[_FIXED.size:_FIXED.size + hlen])
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"rollup header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise DecodeError("rollup header must be a JSON object")
    level = header.get("level")
    if level not in ROLLUP_LEVELS:
        raise DecodeError(f"rollup level {level!r:.20} is not one of {ROLLUP_LEVELS}")
    cluster = check_name("cluster", header.get("cluster"))
    row = check_name("row", header.get("row"))
    rack_raw = header.get("rack")
    if level == "row" and rack_raw != "":
        raise DecodeError("a row-level rollup has rack \"\"")
    rack = check_name("rack", rack_raw) if level == "rack" else ""
    start = _int(header, "start_ms", 0, 1 << 62)
    width = _int(header, "width_ms", 1, 1 << 40)
    slots = _int(header, "sketch_slots", 1, 1 << 20)
    n = _int(header, "n_sketch", 0, MAX_SKETCH)
    ids = header.get("metrics")
    if (not isinstance(ids, list) or len(ids) > MAX_METRICS
            or not all(type(i) is int and i in BY_ID for i in ids)):
        raise DecodeError("rollup metrics must be a list of catalog ids")
    if len(set(ids)) != len(ids):
        raise DecodeError("rollup metric ids must not repeat")
    m = len(ids)
    start_arr = _FIXED.size + hlen
    start_arr += -start_arr % 8
    expected = start_arr + 8 * m + 8 * len(AGG_ROWS) * m + 16 * n
    if size != expected:
        raise DecodeError(f"rollup frame is {size} bytes, its header needs {expected}")
    off = start_arr
    last_ts = np.frombuffer(buf, "<i8", m, off)
    off += 8 * m
    aggs = np.frombuffer(buf, "<f8", len(AGG_ROWS) * m, off).reshape(len(AGG_ROWS), m)
    off += 8 * len(AGG_ROWS) * m
    counts = np.frombuffer(buf, "<f8", n, off)
    off += 8 * n
    cols = np.frombuffer(buf, "<i4", n, off)
    off += 4 * n
    slot = np.frombuffer(buf, "<i4", n, off)
    if n and (cols.min() < 0 or cols.max() >= m or slot.min() < 0 or slot.max() >= slots
              or not (np.isfinite(counts).all() and (counts > 0).all())):
        raise DecodeError("rollup sketch entries out of range (column, slot or count)")
    return RollupFrame(level, cluster, row, rack, start, width,
                       np.asarray(ids, np.uint16), last_ts, aggs, slots, cols, slot, counts)

"""The sample frame: one node x a few ticks of every metric, columnar.

Byte layout (all integers little-endian)::

    offset  size  field
    0       4     magic  b"FPSF"
    4       1     version (1)
    5       1     flags   (no bits defined in version 1; must be 0)
    6       2     reserved, 0
    8       4     H = length of the JSON header in bytes
    12      H     JSON header (orjson), an object:
                    cluster, row, rack, node   identity strings (schemas.identity)
                    agent                      agent incarnation id (string)
                    seq                        sequence number, monotonic per agent (int >= 0)
                    metrics                    catalog ids, length Mc
                    extra                      names of metrics outside the catalog, length Me
                    gpus                       GPU indices, length G
                    uuids                      GPU UUIDs, length G
                    shape                      [T, G, M] with M = Mc + Me
    12+H    P     zero padding so that the arrays start 8-byte aligned
    ...     8T    timestamps, int64 ms since the epoch, strictly increasing
    ...     8TGM  values, float64, C order [tick, gpu, metric]; NaN = not sampled

Decoding validates everything and raises :class:`schemas.errors.DecodeError` only. The
arrays of a decoded frame are read-only views of the input bytes (no copy), which is what
makes decode cost per frame rather than per metric.

(``agent``, ``seq``) is the de-duplication key downstream: a frame replayed from the
agent's spool or re-read after a consumer crash carries the same pair.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import orjson

from schemas.catalog import BY_ID, MAX_ID
from schemas.errors import DecodeError
from schemas.identity import NodeIdentity, check_name

__all__ = [
    "MAGIC",
    "MAX_GPUS",
    "MAX_METRICS",
    "MAX_TICKS",
    "VERSION",
    "SampleFrame",
    "decode_frame",
    "encode_frame",
]

MAGIC: Final = b"FPSF"
VERSION: Final = 1
KNOWN_FLAGS: Final = 0
MAX_TICKS: Final = 4096
MAX_GPUS: Final = 1024
MAX_METRICS: Final = 1024
MAX_HEADER: Final = 1 << 20

_FIXED = struct.Struct("<4sBBHI")
_EXTRA_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,199}")
_KNOWN_ID = np.zeros(MAX_ID + 1, dtype=bool)
_KNOWN_ID[list(BY_ID)] = True


@dataclass(frozen=True, slots=True, eq=False)
class SampleFrame:
    """A decoded (or to-be-encoded) frame. Arrays are columnar; see the module docstring."""

    identity: NodeIdentity
    agent: str
    seq: int
    metric_ids: npt.NDArray[np.uint16]
    gpus: npt.NDArray[np.int32]
    uuids: tuple[str, ...]
    ts: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    extra: tuple[str, ...] = field(default=())

    @property
    def shape(self) -> tuple[int, int, int]:
        t, g, m = self.values.shape
        return int(t), int(g), int(m)

    @property
    def n_values(self) -> int:
        return int(self.values.size)


def encode_frame(frame: SampleFrame) -> bytes:
    """Serialise ``frame``; raises ValueError if the frame breaks the contract.

    Encoding checks shapes (a cheap guard against sending what no consumer can read) but
    trusts the caller's ids; decode re-validates everything.
    """
    t, g, m = frame.values.shape if frame.values.ndim == 3 else (-1, -1, -1)
    if t < 0 or frame.ts.shape != (t,) or len(frame.gpus) != g or len(frame.uuids) != g:
        raise ValueError(
            f"inconsistent frame: values {frame.values.shape}, ts {frame.ts.shape}, "
            f"{len(frame.gpus)} gpus, {len(frame.uuids)} uuids"
        )
    if len(frame.metric_ids) + len(frame.extra) != m:
        raise ValueError(
            f"values have {m} metrics but {len(frame.metric_ids)} ids + "
            f"{len(frame.extra)} extra names"
        )
    ident = frame.identity
    header = orjson.dumps(
        {
            "cluster": ident.cluster,
            "row": ident.row,
            "rack": ident.rack,
            "node": ident.node,
            "agent": frame.agent,
            "seq": frame.seq,
            "metrics": frame.metric_ids.tolist(),
            "extra": list(frame.extra),
            "gpus": frame.gpus.tolist(),
            "uuids": list(frame.uuids),
            "shape": [t, g, m],
        }
    )
    pad = -(_FIXED.size + len(header)) % 8
    return b"".join(
        (
            _FIXED.pack(MAGIC, VERSION, 0, 0, len(header)),
            header,
            b"\0" * pad,
            np.ascontiguousarray(frame.ts, dtype="<i8").tobytes(),
            np.ascontiguousarray(frame.values, dtype="<f8").tobytes(),
        )
    )


def _int_list(header: dict[str, Any], key: str, length: int | None = None) -> list[int]:
    value = header.get(key)
    if not isinstance(value, list) or not all(type(v) is int for v in value):
        raise DecodeError(f"header field {key!r} must be a list of integers")
    if length is not None and len(value) != length:
        raise DecodeError(f"header field {key!r} has {len(value)} entries, shape says {length}")
    return value


def _str_list(header: dict[str, Any], key: str, length: int | None = None) -> list[str]:
    value = header.get(key, [] if key == "extra" else None)
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise DecodeError(f"header field {key!r} must be a list of strings")
    if length is not None and len(value) != length:
        raise DecodeError(f"header field {key!r} has {len(value)} entries, shape says {length}")
    return value


def decode_frame(data: bytes | bytearray | memoryview) -> SampleFrame:
    """Parse and validate one frame; raises DecodeError saying what is wrong."""
    buf = memoryview(data).cast("B") if not isinstance(data, bytes) else data
    size = len(buf)
    if size < _FIXED.size:
        raise DecodeError(f"frame too short: {size} bytes, the fixed header alone is 12")
    magic, version, flags, reserved, hlen = _FIXED.unpack_from(buf, 0)
    if magic != MAGIC:
        raise DecodeError(f"bad magic {bytes(magic)!r}, expected {MAGIC!r}")
    if version != VERSION:
        raise DecodeError(f"unsupported frame version {version}, this build reads {VERSION}")
    if flags & ~KNOWN_FLAGS or reserved:
        raise DecodeError(f"unknown flags 0x{flags:02x} / reserved 0x{reserved:04x}")
    if hlen > min(MAX_HEADER, size - _FIXED.size):
        raise DecodeError(f"header length {hlen} exceeds the {size - _FIXED.size} bytes left")
    try:
        header = orjson.loads(bytes(buf[_FIXED.size : _FIXED.size + hlen]))
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"header is not valid JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise DecodeError("header must be a JSON object")

    shape = _int_list(header, "shape", 3)
    t, g, m = shape
    if not (0 <= t <= MAX_TICKS and 0 <= g <= MAX_GPUS and 0 <= m <= MAX_METRICS):
        raise DecodeError(
            f"shape {shape} out of range (ticks <= {MAX_TICKS}, gpus <= {MAX_GPUS}, "
            f"metrics <= {MAX_METRICS})"
        )
    extra = _str_list(header, "extra")
    for name in extra:
        if _EXTRA_NAME.fullmatch(name) is None:
            raise DecodeError(f"extra metric name {name!r:.80} is not a valid metric name")
    id_list = _int_list(header, "metrics", m - len(extra))
    ids = np.asarray(id_list, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() > MAX_ID or not _KNOWN_ID[ids].all()):
        bad = [int(i) for i in ids if not (0 <= i <= MAX_ID and _KNOWN_ID[i])]
        raise DecodeError(f"metric ids not in the catalog: {bad[:5]}")
    # A set of a few dozen Python ints, not np.unique (a sort per frame): 2 % of a
    # 31,000-GPU aggregator's store thread.
    if len(set(id_list)) != len(id_list) or len(set(extra)) != len(extra):
        raise DecodeError("metric ids and extra names must not repeat")
    gpus = _int_list(header, "gpus", g)
    if any(not 0 <= i < 65536 for i in gpus) or len(set(gpus)) != len(gpus):
        raise DecodeError("GPU indices must be unique and in [0, 65536)")
    uuids = _str_list(header, "uuids", g)
    if any(len(u) > 128 for u in uuids):
        raise DecodeError("GPU UUIDs are at most 128 characters")
    seq = header.get("seq")
    if type(seq) is not int or seq < 0:
        raise DecodeError(f"seq must be a non-negative integer, got {seq!r:.40}")
    agent = check_name("agent", header.get("agent"))
    identity = NodeIdentity(
        header.get("cluster"),  # type: ignore[arg-type]
        header.get("row"),  # type: ignore[arg-type]
        header.get("rack"),  # type: ignore[arg-type]
        header.get("node"),  # type: ignore[arg-type]
    )
    start = _FIXED.size + hlen
    start += -start % 8
    expected = start + 8 * t + 8 * t * g * m
    if size != expected:
        raise DecodeError(f"frame is {size} bytes, header and shape {shape} need {expected}")
    ts = np.frombuffer(buf, dtype="<i8", count=t, offset=start)
    if t and (ts[0] < 0 or (t > 1 and not (np.diff(ts) > 0).all())):
        raise DecodeError("timestamps must be non-negative and strictly increasing")
    values = np.frombuffer(buf, dtype="<f8", count=t * g * m, offset=start + 8 * t)
    return SampleFrame(
        identity=identity,
        agent=agent,
        seq=seq,
        metric_ids=ids.astype(np.uint16),
        gpus=np.asarray(gpus, dtype=np.int32),
        uuids=tuple(uuids),
        ts=ts,
        values=values.reshape(t, g, m),
        extra=tuple(extra),
    )

"""Checkpoints of a shard: models, thresholds, rules, open alerts and the consumed offset.

One per samples partition, kept in the detector group's changelog topic
(:mod:`fleetpulse.changelog`: chunked, checksummed, the newest one kept by compaction), so
it follows the partition to whichever instance owns it next. State and offset are saved
together: the shard is restored and the partition read again from exactly the saved
offset, so what the models learn after a crash or a rebalance equals what they would have
learned without it.

Format: an ``.npz`` (``allow_pickle=False``) holding

- ``meta``: UTF-8 JSON (format version, offset, engine name and config, registry, open
  alert records, counters);
- the state arrays of every component under their dotted names (``fold.*``: each GPU's
  open step, ``tick_counters``: the rules' previous counters; both absent from checkpoints
  written before steps were folded, which then restart those clocks; ``jobs.*``: each GPU's
  job and straggler state, ``detector.job_peers``, absent before it, which starts jobless);
- ``gpu_blobs`` / ``gpu_blob_ends`` and ``rack_blobs`` / ``rack_blob_ends``: the engine's
  per-model checkpoint bytes, concatenated, with end offsets.
"""

from __future__ import annotations

import io
import zipfile
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from detector.engines import ForestEngine
from detector.shard import DetectorShard
from fleetpulse.atomic_file import atomic_write
from schemas.errors import DecodeError
from schemas.records import AlertRecord

__all__ = [
    "CheckpointError",
    "atomic_write",
    "restore_shard",
    "shard_bytes",
]

FORMAT_VERSION = 4
"""2: thermal models with candidate lags, windowed error bursts, the thermal-excess rule.
3: the frozen-sensor rule keeps each candidate lag's range and its time off the reading.
4: the thermal-excess rule keeps the lags plausible while the GPU last ran as predicted."""


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be used (corrupt, other version or engine)."""


def _unblob(engine: ForestEngine, blob: npt.NDArray[np.uint8], ends: npt.NDArray[np.int64]
            ) -> None:
    data = blob.tobytes()
    start = 0
    for i, end in enumerate(ends.tolist()):
        engine.restore(i, data[start:end])
        start = end


def shard_bytes(shard: DetectorShard, offsets: dict[str, int]) -> bytes:
    """Serialise ``shard`` with the offsets (topic -> next offset) its state covers."""
    arrays: dict[str, Any] = {}
    arrays.update(shard.features.state_arrays())
    arrays.update(shard.fold.state_arrays())
    arrays["tick_counters"] = shard.tick_counters
    arrays.update(shard.gpu_bank.state_arrays("gpu"))
    arrays.update(shard.rules.state_arrays())
    arrays.update(shard.jobs.state_arrays())
    arrays.update(shard.rack_windows.state_arrays())
    arrays.update(shard.rack_heat.state_arrays())
    arrays.update(shard.rack_bank.state_arrays("rack"))
    arrays["rack_of"] = shard.rack_of
    arrays["last_anomalous_ms"] = shard.last_anomalous_ms
    arrays["gpu_blobs"], arrays["gpu_blob_ends"] = shard.gpu_bank.engine.checkpoint_models(
        len(shard.gpu_paths))
    arrays["rack_blobs"], arrays["rack_blob_ends"] = shard.rack_bank.engine.checkpoint_models(
        len(shard.rack_paths))
    meta = {
        "version": FORMAT_VERSION,
        "offsets": offsets,
        "engine": shard.engine_name,
        "dims": shard.engine_config.dims,
        "shingle": shard.engine_config.shingle,
        "gpu_paths": shard.gpu_paths,
        "gpu_uuid": shard.gpu_uuid,
        "rack_paths": shard.rack_paths,
        "node_ids": shard.node_ids,
        "node_last_ts": shard.node_last_ts,
        "open_alerts": [rec.to_bytes().decode() for rec in shard.open_alerts.values()],
        "last_ts_ms": shard.last_ts_ms,
        "steps": shard.steps,
        "skipped_steps": shard.skipped_steps,
        "late": shard.rack_windows.late,
    }
    arrays["meta"] = np.frombuffer(orjson.dumps(meta), dtype=np.uint8)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def restore_shard(shard: DetectorShard, data: bytes) -> dict[str, int]:
    """Load checkpoint ``data`` into a fresh ``shard``; returns the saved offsets."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
        meta = orjson.loads(arrays["meta"].tobytes())
    except (ValueError, KeyError, OSError, zipfile.BadZipFile) as exc:
        raise CheckpointError(f"checkpoint is corrupt: {exc}") from exc
    if meta.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"checkpoint version {meta.get('version')} != {FORMAT_VERSION}")
    if meta["engine"] != shard.engine_name or meta["dims"] != shard.engine_config.dims:
        raise CheckpointError(
            f"checkpoint is for engine {meta['engine']} with {meta['dims']} features; this "
            f"detector runs {shard.engine_name} with {shard.engine_config.dims}"
        )
    shard.gpu_paths = list(meta["gpu_paths"])
    shard.gpu_uuid = list(meta["gpu_uuid"])
    shard.gpu_ids = {p: i for i, p in enumerate(shard.gpu_paths)}
    shard.rack_paths = list(meta["rack_paths"])
    shard.rack_ids = {p: i for i, p in enumerate(shard.rack_paths)}
    shard.node_ids = {str(k): int(v) for k, v in meta["node_ids"].items()}
    shard.node_last_ts = {str(k): int(v) for k, v in meta["node_last_ts"].items()}
    shard.rack_of = np.array(arrays["rack_of"], dtype=np.int64)
    shard.last_anomalous_ms = np.array(arrays["last_anomalous_ms"], dtype=np.int64)
    shard.last_ts_ms = int(meta["last_ts_ms"])
    shard.steps = int(meta["steps"])
    n, r = len(shard.gpu_paths), len(shard.rack_paths)
    shard.features.load_arrays(arrays, n)
    shard.fold.load_arrays(arrays, n)
    shard.tick_counters = (np.array(arrays["tick_counters"], dtype=np.float64)
                           if "tick_counters" in arrays
                           else np.full((n, shard.tick_counters.shape[1]), np.nan))
    shard.node_of = np.zeros(n, dtype=np.int64)
    shard.skipped_steps = int(meta.get("skipped_steps", 0))
    shard.gpu_bank.load_arrays(arrays, "gpu", n)
    shard.rules.load_arrays(arrays)
    shard.jobs.load_arrays(arrays, n)
    shard.rack_windows.load_arrays(arrays)
    shard.rack_heat.load_arrays(arrays)
    shard.rack_windows.late = int(meta["late"])
    shard.rack_bank.load_arrays(arrays, "rack", r)
    try:
        _unblob(shard.gpu_bank.engine, arrays["gpu_blobs"], arrays["gpu_blob_ends"])
        _unblob(shard.rack_bank.engine, arrays["rack_blobs"], arrays["rack_blob_ends"])
    except ValueError as exc:
        raise CheckpointError(f"model checkpoint rejected: {exc}") from exc
    shard.open_alerts = {}
    for raw in meta["open_alerts"]:
        try:
            rec = AlertRecord.from_bytes(raw.encode())
        except DecodeError as exc:
            raise CheckpointError(f"open alert in checkpoint: {exc}") from exc
        shard.open_alerts[(rec.entity, rec.source)] = rec
    return {str(k): int(v) for k, v in meta["offsets"].items()}

"""Per-partition checkpoints: what a replay from the committed offset needs to be exact.

The committed Kafka offset of a partition is the *resume* offset: the first message that
still feeds an open window. Re-reading from there rebuilds the open windows; to make the
same decisions as the run that wrote the checkpoint, the replay also needs the partition's
watermark (which windows are closed, which samples are late), the (agent, seq) table and
each counter's last value of its newest closed window. Those are written here, atomically
(write, fsync, rename), after the store's flush and before the offset commit.

Instances of one consumer group must share ``state_dir`` (one directory per group) for a
partition's checkpoint to follow it across a rebalance; a single instance may keep it
under its data directory.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

__all__ = ["PartitionCheckpoint", "load_checkpoint", "save_checkpoint"]


@dataclass(slots=True)
class PartitionCheckpoint:
    topic: str
    partition: int
    resume_offset: int
    """Committed offset: replay starts here."""
    position: int
    """Every message below this was processed (raw samples written, dedup recorded)."""
    watermark: int
    dedup: dict[str, Any] = field(default_factory=dict)
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    """entity path -> {metric column: last value of the newest closed window}."""
    downsampled: dict[str, int] = field(default_factory=dict)
    """tier -> end of the last window derived from the tier below."""
    extra: dict[str, Any] = field(default_factory=dict)


def _path(state_dir: Path, topic: str, partition: int) -> Path:
    return state_dir / f"{topic}-{partition}.ckpt.json"


def save_checkpoint(state_dir: str | Path, ckpt: PartitionCheckpoint) -> None:
    d = Path(state_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = _path(d, ckpt.topic, ckpt.partition)
    tmp = final.with_suffix(f".tmp{os.getpid()}")
    data = orjson.dumps({
        "topic": ckpt.topic, "partition": ckpt.partition, "resume_offset": ckpt.resume_offset,
        "position": ckpt.position, "watermark": ckpt.watermark, "dedup": ckpt.dedup,
        "counters": ckpt.counters, "downsampled": ckpt.downsampled, "extra": ckpt.extra,
    })
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, final)
    dfd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def load_checkpoint(state_dir: str | Path, topic: str, partition: int) -> PartitionCheckpoint | None:
    path = _path(Path(state_dir), topic, partition)
    try:
        obj = orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    return PartitionCheckpoint(
        topic=obj["topic"], partition=int(obj["partition"]),
        resume_offset=int(obj["resume_offset"]), position=int(obj["position"]),
        watermark=int(obj["watermark"]), dedup=obj.get("dedup", {}),
        counters=obj.get("counters", {}), downsampled=obj.get("downsampled", {}),
        extra=obj.get("extra", {}),
    )

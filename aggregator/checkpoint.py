"""Per-partition checkpoints: what a replay from the committed offset needs to be exact.

The committed Kafka offset of a partition is the *resume* offset: the first message that
still feeds an open window. Re-reading from there rebuilds the open windows; to make the
same decisions as the run that wrote the checkpoint, the replay also needs the partition's
watermark (which windows are closed, which samples are late), the (agent, seq) table and
each counter's last value of its newest closed window. They go to the group's changelog
topic (:mod:`fleetpulse.changelog`) after the store's flush and before the offset commit,
and come back from it when the partition is assigned, on whichever instance that is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["PartitionCheckpoint", "checkpoint_bytes", "checkpoint_from_bytes"]


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
    replay_watermark: int | None = None
    """The watermark just before the message at ``resume_offset``: a replay starts from it
    and raises it message by message as the run did, so each replayed sample is judged
    late or on time as it was then (``watermark`` is where the run had got to, later)."""
    closed_through: int | None = None
    """Windows starting at or before this were closed (written) by the run, and a replay
    never opens them again; the windows after it were still open, also those that were
    due but left for a later batch by the close budget. None: a checkpoint written before
    these two fields, whose replay judges by ``watermark``."""


def checkpoint_bytes(ckpt: PartitionCheckpoint) -> bytes:
    """The checkpoint as the changelog record stores it (JSON)."""
    return orjson.dumps({
        "topic": ckpt.topic, "partition": ckpt.partition, "resume_offset": ckpt.resume_offset,
        "position": ckpt.position, "watermark": ckpt.watermark, "dedup": ckpt.dedup,
        "counters": ckpt.counters, "downsampled": ckpt.downsampled, "extra": ckpt.extra,
        **({"replay_watermark": ckpt.replay_watermark}
           if ckpt.replay_watermark is not None else {}),
        **({"closed_through": ckpt.closed_through} if ckpt.closed_through is not None else {}),
    }, option=orjson.OPT_SERIALIZE_NUMPY)


def checkpoint_from_bytes(data: bytes) -> PartitionCheckpoint:
    """Parse :func:`checkpoint_bytes`; a record that is not one raises ValueError."""
    obj = orjson.loads(data)
    return PartitionCheckpoint(
        topic=obj["topic"], partition=int(obj["partition"]),
        resume_offset=int(obj["resume_offset"]), position=int(obj["position"]),
        watermark=int(obj["watermark"]), dedup=obj.get("dedup", {}),
        counters=obj.get("counters", {}), downsampled=obj.get("downsampled", {}),
        extra=obj.get("extra", {}),
        replay_watermark=_int_or_none(obj.get("replay_watermark")),
        closed_through=_int_or_none(obj.get("closed_through")),
    )


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)

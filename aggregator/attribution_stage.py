"""The events- and alerts-topic stage: attributions, XIDs, GPU alerts -> the table.

It has the shape of the other stages (assign / revoke / process / checkpoint), so the
service drives it with the same consumer loop and durability cycle: the table is handed to
the OS per fact, fsynced in :meth:`checkpoint`, and only then is the partition's offset
committed. Replaying from an older offset folds events the table already has, which changes
nothing (the table is keyed by facts), so the workload rollups are the same after a kill -9.

A record that does not decode, or an attribution that fails validation, is dead-lettered
with its reason; other event kinds are skipped (the detector reads them). One instance per
topic (``alerts=True`` for the alerts topic: incident records are skipped).
"""

from __future__ import annotations

from aggregator.attribution_table import AttributionTable
from aggregator.checkpoint import PartitionCheckpoint
from fleetpulse.transport.base import Message
from schemas.errors import DecodeError
from schemas.records import AlertRecord, EventRecord, decode_alerts_topic

__all__ = ["AttributionStage"]


class AttributionStage:
    """See the module docstring."""

    def __init__(self, table: AttributionTable, *, topic: str, alerts: bool = False) -> None:
        self.table = table
        self.topic = topic
        self.alerts = alerts
        self.positions: dict[int, int] = {}
        self.events = 0
        self.decode_errors = 0

    @property
    def parts(self) -> dict[int, _Position]:
        """What the service reads for lag: ``parts[p].position``."""
        return {p: _Position(pos) for p, pos in self.positions.items()}

    def assign(self, partition: int, ckpt: PartitionCheckpoint | None) -> int:
        self.positions[partition] = ckpt.resume_offset if ckpt is not None else 0
        return self.positions[partition]

    def revoke(self, partition: int) -> None:
        self.positions.pop(partition, None)

    def process(self, msgs: list[Message]) -> tuple[list[tuple[Message, str]], list[object]]:
        dead: list[tuple[Message, str]] = []
        for msg in msgs:
            pos = self.positions.get(msg.partition, 0)
            if msg.offset < pos:
                continue
            self.positions[msg.partition] = msg.offset + 1
            try:
                if self.alerts:
                    rec = decode_alerts_topic(msg.value)
                    new = isinstance(rec, AlertRecord) and self.table.observe_alert(rec)
                else:
                    new = self.table.observe(EventRecord.from_bytes(msg.value))
                self.events += int(new)
            except DecodeError as exc:
                self.decode_errors += 1
                dead.append((msg, f"{'alert' if self.alerts else 'event'} record: {exc}"))
        return dead, []

    def checkpoint(self, partition: int) -> PartitionCheckpoint:
        """Call after the table's flush (the service's cycle flushes it with the store)."""
        pos = self.positions.get(partition, 0)
        return PartitionCheckpoint(topic=self.topic, partition=partition, resume_offset=pos,
                                   position=pos, watermark=0)

    def open_windows(self) -> int:
        return 0

    def pending_close(self) -> bool:
        """Nothing waits to be closed: each record is folded into the table at once."""
        return False


class _Position:
    __slots__ = ("position",)

    def __init__(self, position: int) -> None:
        self.position = position

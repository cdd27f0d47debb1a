"""The workload on each GPU, from ``attribution`` events, to name it in every alert.

An SRE paged about a GPU first asks which job is on it; an alert should answer. The
detector already reads the events topic, so each ``attribution`` event (agent side:
:mod:`agent.attribution.tracker`) is folded here: per GPU entity, the recent attachments
``[from_ms, to_ms)`` with their labels. :meth:`WorkloadMap.tag` then adds to a GPU alert the
workload that was attached when the alert *started* -- ``job``, ``pod``, ``namespace``,
``tenant`` in ``context`` -- so firing and resolved transitions name the same job, even if it
ended in between. Alerts above GPU level stay as they are (a rack has many jobs).

One map per events partition (an agent's events share a partition, so a GPU lives in one),
checkpointed beside that partition's event-rules checkpoint: after a restart the alerts of a
long-running job still name it, though its start event is older than the committed offset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Final

import orjson

from schemas.attribution import WORKLOAD_LABELS, Attachment
from schemas.errors import DecodeError
from schemas.records import AlertRecord, EventKind, EventRecord

__all__ = ["KEEP_PER_GPU", "WorkloadMap", "tag_alerts"]

KEEP_PER_GPU: Final = 16
"""Attachments remembered per GPU (the newest); enough for any alert still being tracked."""


class WorkloadMap:
    """GPU entity path (``.../node/gpu-N``) -> recent attachments, newest last."""

    def __init__(self) -> None:
        self.gpus: dict[str, list[Attachment]] = {}

    def observe(self, event: EventRecord) -> bool:
        """Fold one event; True if it was an attribution (a bad one raises DecodeError)."""
        if event.kind is not EventKind.ATTRIBUTION:
            return False
        att = Attachment.from_event(event)
        if event.gpu is None:
            return True
        spans = self.gpus.setdefault(f"{event.identity.path}/gpu-{event.gpu}", [])
        for i, old in enumerate(spans):
            if old.workload == att.workload and old.from_ms == att.from_ms:
                if att.to_ms is not None:
                    spans[i] = att
                return True
        spans.append(att)
        spans.sort(key=lambda a: a.from_ms)
        del spans[:-KEEP_PER_GPU]
        return True

    def at(self, entity: str, ts_ms: int) -> Attachment | None:
        """The attachment of ``entity`` at ``ts_ms`` (an open one ends at the next start)."""
        spans = self.gpus.get(entity)
        if not spans:
            return None
        for i in range(len(spans) - 1, -1, -1):
            a = spans[i]
            end = a.to_ms
            if i + 1 < len(spans) and (end is None or end > spans[i + 1].from_ms):
                end = spans[i + 1].from_ms
            if a.from_ms <= ts_ms and (end is None or ts_ms < end):
                return a
        return None

    def to_bytes(self) -> bytes:
        return orjson.dumps({"version": 1, "gpus": {
            k: [dataclasses.asdict(a) for a in v] for k, v in self.gpus.items()}})

    @classmethod
    def from_bytes(cls, data: bytes) -> WorkloadMap:
        obj = orjson.loads(data)
        if obj.get("version") != 1:
            raise DecodeError(f"workload map version {obj.get('version')} is not 1")
        out = cls()
        out.gpus = {k: [Attachment(**a) for a in v] for k, v in obj["gpus"].items()}
        return out


def tag_alerts(records: list[AlertRecord], maps: Iterable[WorkloadMap]) -> list[AlertRecord]:
    """``records`` with the workload of each GPU alert in its context (see the module)."""
    maps = list(maps)
    out = []
    for rec in records:
        if rec.level == "gpu" and "job" not in rec.context:
            att = next((a for m in maps if (a := m.at(rec.entity, rec.started_ms))), None)
            if att is not None:
                labels: dict[str, str] = {"job": att.workload}
                labels.update({k: att.labels[k] for k in WORKLOAD_LABELS[1:]
                               if k in att.labels})
                rec = dataclasses.replace(rec, context={**rec.context, **labels})
        out.append(rec)
    return out

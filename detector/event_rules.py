"""Health rules over the events topic (XID and GPU-lost events pushed by the agent).

The agent reports an XID or a lost GPU the moment NVML signals it, before the next sample
frame; these rules turn such events into alerts. Their sources (``rule:event_xid``,
``rule:event_gpu_lost``) differ from the sample-based rules on purpose: the events topic
is partitioned by node, not by rack, so another detector instance may own the samples of
the same GPU, and distinct sources keep two instances from fighting over one alert key.

An event alert resolves after ``hold_s`` of event time without a recurrence (event time is
the highest timestamp this partition has seen, advanced also by the samples' clock via
:meth:`EventShard.tick`).
"""

from __future__ import annotations

from typing import Any

import orjson

from detector.rules import CRITICAL_XIDS, HARDWARE_XIDS
from detector.shard import alert_id
from schemas.records import AlertRecord, AlertState, Attribution, EventKind, EventRecord, Severity

__all__ = ["EventShard"]


class EventShard:
    """Open event alerts of one events partition, and its consumed offset."""

    def __init__(self, hold_s: float) -> None:
        self.hold_ms = int(hold_s * 1000)
        self.open: dict[tuple[str, str], tuple[AlertRecord, int]] = {}
        """(entity, source) -> (firing record, last occurrence ms)."""
        self.now_ms = 0

    def observe(self, event: EventRecord) -> list[AlertRecord]:
        """Alerts that ``event`` opens (a repeat only extends an open one)."""
        self.now_ms = max(self.now_ms, event.ts_ms)
        if event.gpu is None:
            return []
        entity = f"{event.identity.path}/gpu-{event.gpu}"
        if event.kind is EventKind.XID:
            code = event.data.get("xid")
            if type(code) is not int or code not in HARDWARE_XIDS:
                return []
            source = "rule:event_xid"
            severity = Severity.CRITICAL if code in CRITICAL_XIDS else Severity.WARNING
            summary = f"XID {code} reported by the driver"
            metric = "fleetpulse_gpu_xid"
            context: dict[str, Any] = {"xid": code, "uuid": event.uuid or ""}
        elif event.kind is EventKind.GPU_LOST:
            source = "rule:event_gpu_lost"
            severity = Severity.CRITICAL
            summary = "NVML reports the GPU lost (fallen off the bus)"
            metric = "fleetpulse_gpu_xid"
            context = {"uuid": event.uuid or ""}
        else:
            return []
        key = (entity, source)
        if key in self.open:
            rec, _ = self.open[key]
            self.open[key] = (rec, event.ts_ms)
            return []
        rec = AlertRecord(
            id=alert_id(entity, source, event.ts_ms), entity=entity, level="gpu",
            state=AlertState.FIRING, severity=severity, source=source, summary=summary,
            score=1.0, threshold=1.0, started_ms=event.ts_ms, updated_ms=event.ts_ms,
            attribution=(Attribution(metric, "high", 1.0),), context=context,
        )
        self.open[key] = (rec, event.ts_ms)
        return [rec]

    def tick(self, now_ms: int) -> list[AlertRecord]:
        """Resolve alerts whose last occurrence is ``hold_s`` in the past."""
        self.now_ms = max(self.now_ms, now_ms)
        out = []
        for key, (rec, last) in list(self.open.items()):
            if self.now_ms - last >= self.hold_ms:
                del self.open[key]
                out.append(AlertRecord(
                    id=rec.id, entity=rec.entity, level=rec.level, state=AlertState.RESOLVED,
                    severity=rec.severity, source=rec.source, summary=rec.summary,
                    score=0.0, threshold=rec.threshold, started_ms=rec.started_ms,
                    updated_ms=self.now_ms, attribution=rec.attribution, context=rec.context))
        return out

    def to_bytes(self, offset: int) -> bytes:
        return orjson.dumps({
            "version": 1, "offset": offset, "now_ms": self.now_ms,
            "open": [[rec.to_bytes().decode(), last] for rec, last in self.open.values()],
        })

    def load(self, data: bytes) -> int:
        """Restore from ``to_bytes``; returns the saved offset."""
        obj = orjson.loads(data)
        if obj.get("version") != 1:
            raise ValueError(f"events checkpoint version {obj.get('version')} is not 1")
        self.now_ms = int(obj["now_ms"])
        self.open = {}
        for raw, last in obj["open"]:
            rec = AlertRecord.from_bytes(raw.encode())
            self.open[(rec.entity, rec.source)] = (rec, int(last))
        return int(obj["offset"])

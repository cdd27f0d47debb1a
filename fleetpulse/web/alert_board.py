"""The alerts the web page lists: recent transitions from the alerts topic, kept in memory.

The page needs "what is firing now and what fired in the last hour" to colour cells, ring
GPUs and replay alert state with the time scrubber. The alerts topic is the source of truth;
this board is a bounded view of it (latest transition per alert id, oldest resolved ones
dropped first), so a long-running demo does not grow without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import asdict
from typing import Any

from fleetpulse.health_rank import HealthRank
from fleetpulse.transport.base import Transport
from schemas.errors import DecodeError
from schemas.records import AlertRecord, AlertState, IncidentRecord, decode_alerts_topic
from schemas.topics import Topics

__all__ = ["AlertBoard", "follow_alerts"]

log = logging.getLogger(__name__)


class AlertBoard:
    """Latest state of recent alerts, plus optional per-entity anomaly scores.

    ``clock`` returns the current time in milliseconds on the data's clock; the demo runs a
    simulated clock faster than real time, and the page asks for "the last hour" of *that*.
    """

    def __init__(self, capacity: int = 1000, clock: Callable[[], int] | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.clock: Callable[[], int] = clock or (lambda: int(time.time() * 1000))
        self._alerts: OrderedDict[str, AlertRecord] = OrderedDict()
        self._scores: dict[str, tuple[float, float]] = {}
        self.received = 0
        """Alert records taken, including repeated transitions of one alert."""
        self.bad_records = 0
        """Records on the alerts topic that did not decode (dead-lettered by follow_alerts)."""
        self.health = HealthRank()
        """The worst GPUs, from every record taken (``/web/health``)."""

    def add_incident(self, record: IncidentRecord) -> None:
        self.health.add(record)

    def add(self, record: AlertRecord) -> None:
        """Take one transition; the newest state of an alert id replaces the older one."""
        self.received += 1
        self.health.add(record)
        self._alerts.pop(record.id, None)
        self._alerts[record.id] = record
        while len(self._alerts) > self.capacity:
            victim = next(
                (k for k, a in self._alerts.items() if a.state is AlertState.RESOLVED),
                next(iter(self._alerts)),
            )
            del self._alerts[victim]

    def set_scores(self, scores: Mapping[str, tuple[float, float]]) -> None:
        """Replace the latest (score, threshold) per entity path (from the detector, if any)."""
        self._scores = dict(scores)

    def firing(self) -> list[AlertRecord]:
        return [a for a in self._alerts.values() if a.state is AlertState.FIRING]

    def alerts(self) -> list[AlertRecord]:
        """Every kept alert, oldest transition first."""
        return list(self._alerts.values())

    def snapshot(self, limit: int) -> dict[str, Any]:
        """The JSON body of ``GET /web/alerts``: newest transitions first, firing ones kept."""
        items = list(self._alerts.values())
        items.sort(key=lambda a: (a.state is AlertState.FIRING, a.updated_ms), reverse=True)
        return {
            "now_ms": int(self.clock()),
            "alerts": [_alert_json(a) for a in items[:limit]],
            "firing": sum(1 for a in items if a.state is AlertState.FIRING),
            "scores": {k: {"score": s, "threshold": t} for k, (s, t) in self._scores.items()},
        }


def _alert_json(a: AlertRecord) -> dict[str, Any]:
    out = asdict(a)
    out["state"] = a.state.value
    out["severity"] = a.severity.value
    return out


async def follow_alerts(
    transport: Transport,
    topics: Topics,
    board: AlertBoard,
    *,
    group_id: str = "fleetpulse-web",
    stop: asyncio.Event | None = None,
    on_record: Callable[[AlertRecord], None] | None = None,
    on_incident: Callable[[IncidentRecord], None] | None = None,
) -> None:
    """Feed ``board`` from the alerts topic until ``stop`` is set (or the task is cancelled).

    Undecodable records go to the dead-letter topic with the reason and are counted; the
    page keeps working. Offsets are committed as read: the board is a view, not a store.
    ``on_record`` sees every decoded alert too (the demo's terminal view and scorecard),
    ``on_incident`` every incident record (the board shows alerts only).
    """
    consumer = transport.consumer([topics.alerts], group_id, from_beginning=True)
    try:
        while stop is None or not stop.is_set():
            batch = await consumer.getmany(timeout_ms=200, max_records=1000)
            for msg in batch:
                try:
                    record = decode_alerts_topic(msg.value)
                except DecodeError as exc:
                    board.bad_records += 1
                    log.warning("alerts topic: %s", exc)
                    await transport.dead_letter(topics.deadletter, msg, str(exc))
                    continue
                if isinstance(record, IncidentRecord):
                    board.add_incident(record)
                    if on_incident is not None:
                        on_incident(record)
                    continue
                board.add(record)
                if on_record is not None:
                    on_record(record)
            if batch:
                await consumer.commit()
    finally:
        with contextlib.suppress(Exception):
            await consumer.stop()

"""Turning what a source saw into event records for the events topic.

Sources report :class:`~agent.sources.base.SourceEvent` (kind, time, GPU, data) without
knowing where they run; this module adds the node identity and the agent incarnation and
encodes :class:`schemas.records.EventRecord` keyed by node (DESIGN.md's topic table). Events
go through their own :class:`~agent.publisher.Publisher` and spool, so an XID seen during a
broker outage is delivered later like any frame.
"""

from __future__ import annotations

import time
from typing import Any

from agent.sources.base import SourceEvent
from schemas.identity import NodeIdentity
from schemas.records import EventKind, EventRecord

__all__ = ["agent_event", "to_record"]


def to_record(ev: SourceEvent, identity: NodeIdentity, agent: str) -> EventRecord:
    """The wire record for ``ev`` as seen by ``agent`` on ``identity``."""
    return EventRecord(kind=ev.kind, identity=identity, agent=agent, ts_ms=ev.ts_ms,
                       gpu=ev.gpu, uuid=ev.uuid, data=dict(ev.data))


def agent_event(kind: EventKind, identity: NodeIdentity, agent: str,
                **data: Any) -> EventRecord:
    """An agent lifecycle record (start / stop) stamped now."""
    if kind not in (EventKind.AGENT_START, EventKind.AGENT_STOP):
        raise ValueError(f"{kind} is not an agent lifecycle event")
    return EventRecord(kind=kind, identity=identity, agent=agent,
                       ts_ms=time.time_ns() // 1_000_000, data=data)

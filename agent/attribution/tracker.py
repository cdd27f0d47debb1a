"""Attribution changes -> ``attribution`` events: merge the sources, compare, emit on change.

Each poll asks every configured source (:mod:`agent.attribution.base`) for its labels per
GPU and merges them in config order (an earlier source's label wins; ``static`` labels only
add what the others did not say). The merged labels name a workload
(:func:`schemas.attribution.workload_id`); a GPU whose merged labels name none has no
attachment.

Compared with the previous poll, per GPU:

* a workload appeared: one event with ``from_ms`` = now and ``to_ms`` = null;
* it disappeared (the pod is gone, the job file emptied): the same attachment again with
  ``to_ms`` = now -- so an ended workload is detached at the first poll that misses it;
* it changed (another job, other labels): the old one ends and the new one starts, both at
  now.

Nothing is sent while nothing changes. A source that fails a poll keeps its previous answer
(a kubelet restart must not detach every pod for one poll); the failure is counted in
``errors`` and logged at most once a minute. The tracker keeps no state across agent
restarts: a new incarnation re-announces what it finds with a new ``from_ms``, and a consumer
reads an open attachment followed by another on the same GPU as the first ending there.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence

from agent.attribution.base import AttributionSource, GpuView, Labels
from agent.sources.base import SourceError, SourceEvent
from schemas.attribution import Attachment, workload_id
from schemas.records import EventKind

__all__ = ["AttributionTracker", "merge_labels"]

log = logging.getLogger(__name__)


def merge_labels(answers: Sequence[Labels]) -> Labels:
    """Per GPU, the union of the answers' labels; the first answer naming a label wins."""
    out: Labels = {}
    for answer in answers:
        for uuid, labels in answer.items():
            merged = out.setdefault(uuid, {})
            for k, v in labels.items():
                merged.setdefault(k, v)
    return out


class AttributionTracker:
    """See the module docstring. ``poll`` is called from one asyncio task."""

    def __init__(self, sources: Sequence[AttributionSource]) -> None:
        self.sources = list(sources)
        self.current: dict[str, Attachment] = {}
        self.errors: dict[str, int] = {s.name: 0 for s in self.sources}
        self.events = 0
        self._answers: dict[str, Labels] = {}
        self._last_log = -math.inf

    def describe(self) -> str:
        return "; ".join(s.describe() for s in self.sources)

    async def start(self) -> None:
        for s in self.sources:
            await s.start()

    async def close(self) -> None:
        for s in self.sources:
            await s.close()

    async def poll(self, view: GpuView, now_ms: int) -> list[SourceEvent]:
        """Ask every source, then :meth:`diff` against the previous poll."""
        for s in self.sources:
            try:
                self._answers[s.name] = await s.poll(view)
            except SourceError as exc:
                self.errors[s.name] += 1
                if time.monotonic() - self._last_log >= 60:
                    self._last_log = time.monotonic()
                    log.warning("attribution source %s failed (%d so far), keeping its last "
                                "answer: %s", s.name, self.errors[s.name], exc)
        merged = merge_labels([self._answers.get(s.name, {}) for s in self.sources])
        return self.diff(merged, view, now_ms)

    def diff(self, merged: Labels, view: GpuView, now_ms: int) -> list[SourceEvent]:
        """Events that take ``current`` to ``merged`` at ``now_ms``; updates ``current``."""
        index = dict(zip(view.uuids, view.gpus, strict=True))
        events: list[SourceEvent] = []
        for uuid in sorted(set(self.current) | set(merged)):
            labels = merged.get(uuid, {})
            workload = workload_id(labels)
            old = self.current.get(uuid)
            if old is not None and old.workload == workload and old.labels == labels:
                continue
            if old is not None:
                events.append(self._event(old.ended(now_ms), index))
                del self.current[uuid]
            if workload:
                new = Attachment(uuid, workload, dict(labels), now_ms, None)
                self.current[uuid] = new
                events.append(self._event(new, index))
        self.events += len(events)
        return events

    @staticmethod
    def _event(att: Attachment, index: dict[str, int]) -> SourceEvent:
        return SourceEvent(EventKind.ATTRIBUTION, att.to_ms or att.from_ms,
                           index.get(att.uuid), att.uuid, att.to_data())

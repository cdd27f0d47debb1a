"""Workload attribution: which workload (pod, HPC job) a GPU serves, and from when to when.

An attribution is an :class:`~schemas.records.EventRecord` of kind ``attribution`` on the
events topic, sent only when something changed (DESIGN.md: never repeated in frames). Its
``uuid`` is the GPU (or MIG instance) and its ``data`` is :meth:`Attachment.to_data`:

* ``workload``: the id the rollups are keyed by -- the HPC job id(s) when a job-mapping
  source names one, else ``<namespace>/<pod>``;
* ``labels``: ``job``, ``pod``, ``namespace``, ``container``, ``tenant``, ... (strings);
* ``from_ms``: when the agent first saw the workload on the GPU; ``to_ms``: when it saw it
  gone (``null`` while it is still attached).

So one attachment produces two records: ``to_ms = null`` when it starts and the same
``from_ms`` with ``to_ms`` set when it ends. A consumer that keys them by
``(uuid, workload, from_ms)`` reads a replayed record as the same attachment again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from schemas.errors import DecodeError
from schemas.records import EventKind, EventRecord

__all__ = ["MAX_LABELS", "WORKLOAD_LABELS", "Attachment", "workload_id"]

WORKLOAD_LABELS: Final = ("job", "pod", "namespace", "container", "tenant")
"""The labels that name a workload; alerts and the query API select on these."""
MAX_LABELS: Final = 32
_MAX_TEXT: Final = 256


def workload_id(labels: dict[str, str]) -> str:
    """The rollup key of a workload: its HPC job, else ``namespace/pod``, else ''."""
    if labels.get("job"):
        return labels["job"]
    if labels.get("pod"):
        return f"{labels.get('namespace', '')}/{labels['pod']}"
    return ""


def _text(what: str, value: object) -> str:
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_TEXT:
        raise DecodeError(f"attribution {what} must be a string of 1-{_MAX_TEXT} characters, "
                          f"got {value!r:.60}")
    return value


@dataclass(frozen=True, slots=True)
class Attachment:
    """One workload on one GPU over ``[from_ms, to_ms)`` (``to_ms`` None: still there)."""

    uuid: str
    workload: str
    labels: dict[str, str] = field(default_factory=dict)
    from_ms: int = 0
    to_ms: int | None = None

    def to_data(self) -> dict[str, Any]:
        return {"workload": self.workload, "labels": dict(self.labels),
                "from_ms": self.from_ms, "to_ms": self.to_ms}

    def ended(self, to_ms: int) -> Attachment:
        return Attachment(self.uuid, self.workload, self.labels, self.from_ms, to_ms)

    @classmethod
    def from_event(cls, rec: EventRecord) -> Attachment:
        """Validate an ``attribution`` event; DecodeError with the reason if it is not one."""
        if rec.kind is not EventKind.ATTRIBUTION:
            raise DecodeError(f"event of kind {rec.kind} is not an attribution")
        uuid = _text("uuid", rec.uuid)
        d = rec.data
        workload = _text("workload", d.get("workload"))
        labels = d.get("labels", {})
        if not isinstance(labels, dict) or len(labels) > MAX_LABELS:
            raise DecodeError(f"attribution labels must be an object of at most {MAX_LABELS} "
                              f"entries")
        for k, v in labels.items():
            _text("label name", k)
            _text(f"label {k!r:.40}", v)
        start, end = d.get("from_ms"), d.get("to_ms")
        if type(start) is not int or start < 0:
            raise DecodeError(f"attribution from_ms must be a non-negative integer, "
                              f"got {start!r:.30}")
        if end is not None and (type(end) is not int or end < start):
            raise DecodeError(f"attribution to_ms must be null or an integer >= from_ms, "
                              f"got {end!r:.30}")
        return cls(uuid, workload, dict(labels), start, end)

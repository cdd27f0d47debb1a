"""Inventory drift: racks and nodes whose GPUs run mixed driver, VBIOS, InfoROM or firmware
versions, and every change of version on one GPU.

Agents send an ``inventory`` event per GPU when they start and whenever a periodic re-read
differs (``agent.sources.nvml``, ``agent.sources.dcgm``). A fleet that upgrades drivers rack by
rack is mixed for a while on purpose, but a node with two drivers or a rack whose one GPU kept
an old VBIOS is how "same job, different results" tickets start. :class:`InventoryLedger`
keeps the newest versions per GPU (by node path and index) from those events;
:meth:`InventoryLedger.drift` lists each rack and node that mixes versions of a field, with
how many GPUs run each; :attr:`InventoryLedger.changes` every version change seen on one GPU.
Jobs too: the ``attribution`` events on the same topic say which workload each GPU runs
(folded by the detector's :class:`~detector.workloads.WorkloadMap`), and a job whose GPUs
run mixed versions when the report is made (the newest event's time) is listed at level
``job`` -- the "same job, different results" ticket named by its job.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from detector.workloads import WorkloadMap
from schemas.records import EventKind, EventRecord

__all__ = ["FIELDS", "Change", "InventoryLedger", "Mix"]

FIELDS = ("driver", "vbios", "inforom", "firmware")
"""Inventory fields compared (those an event lacks are not judged)."""
_ORDER = {"rack": 0, "node": 1, "job": 2}


@dataclass(frozen=True, slots=True)
class Change:
    gpu: str
    """GPU path (``cluster/row/rack/node/gpu-i``)."""
    field: str
    old: str
    new: str
    ts_ms: int


@dataclass(frozen=True, slots=True)
class Mix:
    level: str
    """``rack``, ``node`` or ``job``."""
    entity: str
    field: str
    versions: dict[str, int]
    """Version -> GPUs running it."""


@dataclass(slots=True)
class InventoryLedger:
    versions: dict[str, dict[str, str]] = field(default_factory=dict)
    """GPU path -> field -> newest version."""
    changes: list[Change] = field(default_factory=list)
    workloads: WorkloadMap = field(default_factory=WorkloadMap)
    """The workloads on each GPU, from the attribution events."""
    newest_ms: int = 0
    """The newest event's time: the moment the job report describes."""

    def observe(self, event: EventRecord) -> list[Change]:
        """Take one event (inventory and attribution; others are ignored); returns the
        version changes it is. A malformed attribution raises DecodeError."""
        self.newest_ms = max(self.newest_ms, event.ts_ms)
        if self.workloads.observe(event) or event.kind is not EventKind.INVENTORY \
                or event.gpu is None:
            return []
        gpu = f"{event.identity.path}/gpu-{event.gpu}"
        known = self.versions.setdefault(gpu, {})
        out = []
        for f in FIELDS:
            value = event.data.get(f)
            if value is None or value == "":
                continue
            value = str(value)
            if f in known and known[f] != value:
                out.append(Change(gpu, f, known[f], value, event.ts_ms))
            known[f] = value
        self.changes.extend(out)
        return out

    def drift(self) -> list[Mix]:
        """Racks, then nodes, then jobs that mix versions of a field (each sorted by entity,
        field)."""
        groups: dict[tuple[str, str, str], dict[str, int]] = {}
        for gpu, known in self.versions.items():
            parts = gpu.split("/")
            where = [("rack", "/".join(parts[:3])), ("node", "/".join(parts[:4]))]
            job = self.workloads.at(gpu, self.newest_ms)
            if job is not None and job.workload:
                where.append(("job", job.workload))
            for level, entity in where:
                for f, v in known.items():
                    counts = groups.setdefault((level, entity, f), {})
                    counts[v] = counts.get(v, 0) + 1
        return [Mix(level, entity, f, dict(sorted(counts.items())))
                for (level, entity, f), counts in sorted(
                    groups.items(), key=lambda kv: (_ORDER[kv[0][0]], kv[0][1], kv[0][2]))
                if len(counts) > 1]

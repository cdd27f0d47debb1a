"""Jobs on the synthetic fleet: a scheduler, and the job-mapping files it leaves behind.

Real fleets run jobs of every size -- one GPU for a notebook, a node for fine-tuning, racks
or whole rows for pre-training -- for minutes to days. :class:`JobScheduler` places such
jobs on free GPUs (a job smaller than a node on contiguous GPUs of one node, a multi-node job
on contiguous free nodes of one rack, rack and row jobs on a wholly free rack or row) and
ends them when their time is up, keeping the fleet about ``occupancy`` busy. It is
deterministic from its seed and uses a generator of its own, so adding it to a fleet changes
nothing else the model draws. A fleet model given the scheduler (``FleetModel(jobs=...)``)
runs its jobs' load (:mod:`agent.fleet.job_load`); without it a node's workload phases come
from :mod:`agent.fleet.workloads` and the jobs are labels only.

:class:`JobMapping` writes what a scheduler's prolog and epilog would: one directory per
node in dcgm-exporter's ``--hpc-job-mapping-dir`` format (a file per GPU index holding the
job id, replaced atomically; removed when the job ends). :class:`FleetAttribution` then
reads those directories with the agent's own ``job_mapping`` source and tracker
(:mod:`agent.attribution`), one tracker per node, so the attribution events the fleet
publishes are the ones real agents would send.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import numpy as np
import numpy.typing as npt

from agent.attribution.base import GpuView
from agent.attribution.job_mapping import JobMappingSource
from agent.attribution.tracker import AttributionTracker
from agent.fleet.topology import Topology
from schemas.attribution import Attachment
from schemas.records import EventRecord

__all__ = ["SIZE_CLASSES", "FleetAttribution", "Job", "JobMapping", "JobScheduler",
           "job_attachments"]

SIZE_CLASSES: Final = (("gpu", 0.25), ("gpus", 0.20), ("node", 0.22), ("nodes", 0.18),
                       ("rack", 0.10), ("row", 0.05))
"""Job size classes and how often each is drawn: 1 GPU, 2-4 GPUs, a node, 2+ nodes of a
rack, a whole rack, a whole row."""
_TRIES: Final = 8
"""Placement attempts per scheduling pass (a class that does not fit now is drawn again)."""


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    size: str
    """Its size class (:data:`SIZE_CLASSES`)."""
    gpus: npt.NDArray[np.intp]
    """Global GPU indices."""
    start_ms: int
    end_ms: int


class JobScheduler:
    """See the module docstring. ``advance(now_ms)`` once per scheduling step."""

    def __init__(self, topo: Topology, seed: int = 0, *, min_s: float = 300.0,
                 max_s: float = 3 * 86400.0, occupancy: float = 0.75) -> None:
        if not 0 < min_s <= max_s or not 0 < occupancy <= 1:
            raise ValueError("need 0 < min_s <= max_s and 0 < occupancy <= 1")
        self.topo = topo
        self.rng = np.random.default_rng([seed, 0x10B5])
        self.min_s, self.max_s, self.occupancy = min_s, max_s, occupancy
        self.owner = np.full(topo.gpus, -1, np.int64)
        """Job number per GPU (-1: free)."""
        self.jobs: dict[int, Job] = {}
        self.started = 0
        self.reserved: tuple[str, npt.NDArray[np.intp]] | None = None
        """A rack or row job waiting for its GPUs to drain: nothing else starts there (as a
        real scheduler's reservation; without it, big jobs would starve behind small ones)."""
        self._names, self._p = zip(*SIZE_CLASSES, strict=True)
        rows = topo.rack_of_node // topo.racks_per_row
        self._row_of_gpu = rows[topo.node_of_gpu]
        self._rack_of_gpu = topo.rack_of_node[topo.node_of_gpu]

    def advance(self, now_ms: int) -> tuple[list[Job], list[Job]]:
        """End the jobs whose time is up, start new ones; (started, ended)."""
        ended = [j for j in self.jobs.values() if j.end_ms <= now_ms]
        for job in ended:
            self.owner[job.gpus] = -1
            del self.jobs[int(job.id.rsplit("-", 1)[1])]
        started: list[Job] = []
        if self.reserved is not None and (self.owner[self.reserved[1]] < 0).all():
            big, where = self.reserved
            self.reserved = None
            started.append(self._start(big, where, now_ms))
        for _ in range(_TRIES):
            if np.count_nonzero(self.owner >= 0) >= self.occupancy * self.topo.gpus:
                break
            size = str(self.rng.choice(self._names, p=self._p))
            gpus = self._place(size)
            if gpus is None:
                if size in ("rack", "row") and self.reserved is None:
                    self.reserved = (size, self._reserve(size))
                continue
            started.append(self._start(size, gpus, now_ms))
        return started, ended

    def _start(self, size: str, gpus: npt.NDArray[np.intp], now_ms: int) -> Job:
        dur = math.exp(self.rng.uniform(math.log(self.min_s), math.log(self.max_s)))
        n = self.started
        self.started += 1
        job = Job(f"job-{n:06d}", size, gpus, now_ms, now_ms + int(dur * 1000))
        self.jobs[n] = job
        self.owner[gpus] = n
        return job

    def _groups(self, size: str) -> npt.NDArray[np.intp]:
        return self._rack_of_gpu if size == "rack" else self._row_of_gpu

    def _reserve(self, size: str) -> npt.NDArray[np.intp]:
        """The rack (or row) with the fewest busy GPUs, for a job that does not fit now."""
        groups = self._groups(size)
        ids = np.unique(groups)
        busy = [np.count_nonzero(self.owner[groups == g] >= 0) for g in ids.tolist()]
        return np.flatnonzero(groups == ids[int(np.argmin(busy))]).astype(np.intp)

    def _place(self, size: str) -> npt.NDArray[np.intp] | None:
        topo, free = self.topo, self.owner < 0
        if self.reserved is not None:
            free = free.copy()
            free[self.reserved[1]] = False
        gpn = topo.gpn
        by_node = free.reshape(topo.nodes, gpn)
        if size in ("gpu", "gpus"):
            k = 1 if size == "gpu" else int(self.rng.integers(2, min(4, gpn) + 1))
            if k > gpn:
                return None
            for node in self.rng.permutation(topo.nodes).tolist():
                run = np.convolve(by_node[node].astype(int), np.ones(k, int), "valid")
                hits = np.flatnonzero(run == k)
                if hits.size:
                    first = node * gpn + int(hits[0])
                    return np.arange(first, first + k, dtype=np.intp)
            return None
        whole = np.asarray(by_node.all(axis=1), bool)
        if size in ("node", "nodes"):
            m = 1 if size == "node" else int(self.rng.integers(2, topo.nodes_per_rack + 1))
            racks = topo.rack_of_node
            for start in self.rng.permutation(topo.nodes).tolist():
                stop = start + m
                if stop <= topo.nodes and whole[start:stop].all() \
                        and racks[start] == racks[stop - 1]:
                    return np.arange(start * gpn, stop * gpn, dtype=np.intp)
            return None
        groups = self._groups(size)
        for g in self.rng.permutation(np.unique(groups)).tolist():
            gpus = np.flatnonzero(groups == g)
            if free[gpus].all() and gpus.size > gpn:  # a one-node rack is a node job
                return gpus.astype(np.intp)
        return None


def job_attachments(started: list[Job], ended: list[Job], uuids: Sequence[str],
                    now_ms: int) -> list[tuple[int, Attachment]]:
    """(GPU, attachment) for what one ``advance(now_ms)`` changed, ends first: what the
    agents' trackers would announce at a poll right after it, without the files (for
    offline runs; live fleets go through :class:`FleetAttribution`)."""
    out = [(g, Attachment(uuids[g], job.id, {}, job.start_ms, now_ms))
           for job in ended for g in job.gpus.tolist()]
    out += [(g, Attachment(uuids[g], job.id, {}, now_ms))
            for job in started for g in job.gpus.tolist()]
    return out


class JobMapping:
    """A job-mapping directory per node under ``root`` (``<root>/<node>/<gpu index>``)."""

    def __init__(self, root: str | Path, topo: Topology) -> None:
        self.root = Path(root)
        self.topo = topo
        self.dirs = [self.root / ident.node for ident in topo.identities]
        for d in self.dirs:
            d.mkdir(parents=True, exist_ok=True)

    def apply(self, started: list[Job], ended: list[Job]) -> set[int]:
        """Write the prolog's files for ``started``, remove the epilog's for ``ended``;
        returns the nodes whose directory changed."""
        gpn, changed = self.topo.gpn, set()
        for job in ended:
            for g in job.gpus.tolist():
                path = self.dirs[g // gpn] / str(g % gpn)
                if path.exists() and path.read_text().strip() == job.id:
                    path.unlink()
                changed.add(g // gpn)
        for job in started:
            for g in job.gpus.tolist():
                d = self.dirs[g // gpn]
                tmp = d / f".{g % gpn}.tmp"
                tmp.write_text(job.id + "\n")
                os.replace(tmp, d / str(g % gpn))
                changed.add(g // gpn)
        return changed


class FleetAttribution:
    """Scheduler + mapping dirs + one agent tracker per node: attribution events out."""

    def __init__(self, topo: Topology, root: str | Path, uuids: Sequence[str],
                 seed: int = 0, *, min_s: float = 300.0, max_s: float = 3 * 86400.0,
                 occupancy: float = 0.75, scheduler: JobScheduler | None = None) -> None:
        """``scheduler``: one the fleet model's load follows (``FleetModel(jobs=...)``);
        otherwise a new one from ``seed``, ``min_s``, ``max_s`` and ``occupancy``."""
        self.topo = topo
        self.scheduler = scheduler if scheduler is not None else JobScheduler(
            topo, seed, min_s=min_s, max_s=max_s, occupancy=occupancy)
        self.mapping = JobMapping(root, topo)
        self.trackers = [AttributionTracker([JobMappingSource(d)]) for d in self.mapping.dirs]
        gpn = topo.gpn
        self.views = [GpuView(tuple(range(gpn)), tuple(uuids[n * gpn:(n + 1) * gpn]))
                      for n in range(topo.nodes)]
        self.agents = [f"{ident.node}.jobs" for ident in topo.identities]

    async def step(self, now_ms: int) -> list[EventRecord]:
        """Advance the scheduler to ``now_ms``; the attribution events of what changed."""
        started, ended = self.scheduler.advance(now_ms)
        out: list[EventRecord] = []
        for node in sorted(self.mapping.apply(started, ended)):
            ident = self.topo.identities[node]
            for ev in await self.trackers[node].poll(self.views[node], now_ms):
                out.append(EventRecord(ev.kind, ident, self.agents[node], ev.ts_ms, ev.gpu,
                                       ev.uuid, dict(ev.data)))
        return out

    def running(self) -> list[Job]:
        return sorted(self.scheduler.jobs.values(), key=lambda j: (-j.gpus.size, j.id))

"""Load that follows the scheduler's jobs: a job's GPUs run its workload, free GPUs idle.

Why. :mod:`agent.fleet.workloads` gives each *node* a phase (one job per node), which is
what the detection benchmarks are tuned and scored on, and it stays the default. But a fleet
that also schedules jobs (:class:`agent.fleet.jobs.JobScheduler`: one GPU to whole rows)
must then run them, or the jobs it announces are labels on unrelated load: the GPUs of one
512-GPU training job would sit in eight different phases, and a detector comparing a GPU
with its job's other GPUs (``detector.job_peers``) would see stragglers everywhere. Here the
*job* is the unit: its GPUs, on whatever nodes, share its kind, step period, phase and
inference bursts, so a data-parallel job runs in lock step across nodes as it does on a real
fleet, and a GPU no job holds idles.

What a job runs, by its size class: a one-GPU job serves bursty inference; a 2-4 GPU job
trains or serves (even odds); a node or more trains in lock step (compute, then an
all-reduce). The per-GPU noise, traffic and framebuffer rules are the node model's
(:func:`agent.fleet.workloads.gpu_load`), so only who-runs-with-whom changes.

Faults that need load or idleness (:data:`agent.fleet.faults.NEEDS_LOAD`,
``NEEDS_IDLE``) pin whole nodes as before: a pinned-busy node whose GPUs no training job
holds trains on a node-level job of its own for as long as the pin lasts.

Draws come from a generator of this module's own, so the scheduler's stream (and the job
ids it announces) does not depend on the load.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from agent.fleet.jobs import JobScheduler
from agent.fleet.topology import Topology
from agent.fleet.workloads import (
    BURST_OFF_TO_ON,
    BURST_ON_TO_OFF,
    FB_IDLE_MIB,
    IDLE,
    INFER,
    TRAIN,
    Load,
    WorkloadParams,
    gpu_load,
    rhythm,
)

__all__ = ["JobLoad"]

_TRAIN_SIZES: Final = frozenset({"node", "nodes", "rack", "row"})


class JobLoad:
    """Per-GPU load driven by ``scheduler``'s running jobs; the interface of
    :class:`agent.fleet.workloads.Workloads` (``advance`` then ``load`` each tick)."""

    def __init__(self, topology: Topology, scheduler: JobScheduler, seed: int = 0,
                 params: WorkloadParams | None = None) -> None:
        self.topo = topology
        self.scheduler = scheduler
        self.params = WorkloadParams() if params is None else params
        g, n = topology.gpus, topology.nodes
        self.rng = np.random.default_rng([seed, topology.first_node, g, 0x10B7])
        # Rows of the job tables: one per GPU (no more jobs than GPUs run at once), then one
        # per node for a pinned-busy node's own job, then the idle row.
        rows = g + n + 1
        self.idle_row = g + n
        self.kind = np.full(rows, IDLE, dtype=np.int8)
        self.period_s = np.ones(rows)
        self.phase0_s = np.zeros(rows)
        self.compute_frac = np.ones(rows)
        self.burst_on = np.zeros(rows, dtype=bool)
        self.burst_level = np.zeros(rows)
        self.fb_base = np.zeros(rows)
        self._draw(np.arange(g, g + n), TRAIN)
        self._row: dict[int, int] = {}
        """Job number -> its row, for the running jobs."""
        self._row_of = np.full(64, self.idle_row, dtype=np.intp)
        """The same as an array indexed by job number (the idle row once a job ended)."""
        self._seen = (-1, -1)
        """(jobs started, jobs running) when the rows were last synced."""
        self._free = list(range(g - 1, -1, -1))
        self.unit = np.full(g, self.idle_row, dtype=np.intp)
        """Per GPU: the row whose workload it runs."""
        self.gpu_bias = self.rng.normal(0.0, 1.0, g)
        self.fb_target = np.full(g, FB_IDLE_MIB)
        self.fb_growth = np.full(g, 4.0)
        self.fb_used = np.full(g, FB_IDLE_MIB)

    def _draw(self, rows: npt.NDArray[np.intp], kind: int | npt.NDArray[np.int8]) -> None:
        """A new job's parameters for ``rows``."""
        rng, k = self.rng, rows.size
        self.kind[rows] = kind
        self.period_s[rows] = rng.uniform(*self.params.period_s, k)
        self.phase0_s[rows] = rng.uniform(0.0, 10.0, k)
        self.compute_frac[rows] = rng.uniform(0.7, 0.88, k)
        self.burst_on[rows] = rng.random(k) < 0.5
        self.burst_level[rows] = rng.uniform(55.0, 95.0, k)
        trains = self.kind[rows] == TRAIN
        self.fb_base[rows] = np.where(trains, rng.uniform(52_000, 74_000, k),
                                      rng.uniform(18_000, 62_000, k))

    def _sync_jobs(self) -> None:
        """Give new jobs a row and their parameters; free the rows of jobs that ended."""
        jobs = self.scheduler.jobs
        seen = (self.scheduler.started, len(jobs))
        if seen == self._seen:
            return
        self._seen = seen
        for num in [j for j in self._row if j not in jobs]:
            self._free.append(self._row.pop(num))
            self._row_of[num] = self.idle_row
        if self.scheduler.started > self._row_of.size:
            grown = np.full(2 * self.scheduler.started, self.idle_row, dtype=np.intp)
            grown[: self._row_of.size] = self._row_of
            self._row_of = grown
        for num, job in jobs.items():
            if num in self._row:
                continue
            row = self._free.pop()
            self._row[num] = row
            self._row_of[num] = row
            kind = TRAIN if job.size in _TRAIN_SIZES or (
                job.size == "gpus" and self.rng.random() < 0.5) else INFER
            self._draw(np.array([row]), kind)

    def advance(self, dt: float, rng: np.random.Generator,
                force_train: npt.NDArray[np.bool_] | None = None,
                force_idle: npt.NDArray[np.bool_] | None = None) -> None:
        """Follow the scheduler's jobs and the faults' pins; ``rng`` (the model's) is not
        drawn from, so the model's own stream does not depend on the jobs."""
        self._sync_jobs()
        owner = self.scheduler.owner
        unit = np.where(owner >= 0, self._row_of[np.maximum(owner, 0)], self.idle_row)
        gpn = self.topo.gpn
        if force_train is not None:
            pinned = np.repeat(force_train, gpn) & (self.kind[unit] != TRAIN)
            unit = np.where(pinned, self.topo.gpus + self.topo.node_of_gpu, unit)
        if force_idle is not None:
            unit = np.where(np.repeat(force_idle, gpn), self.idle_row, unit)
        changed = np.flatnonzero(unit != self.unit)
        self.unit = unit
        flip = self.rng.random(self.kind.size)
        on = self.burst_on
        self.burst_on = np.where(on, flip >= BURST_ON_TO_OFF * dt,
                                 flip < BURST_OFF_TO_ON * dt)
        started = self.burst_on & ~on
        if started.any():
            self.burst_level[started] = self.rng.uniform(55.0, 95.0, int(started.sum()))
        if changed.size:
            self._footprint(changed)
        self.fb_used = np.minimum(self.fb_used + self.fb_growth * dt, self.fb_target)

    def _footprint(self, gpus: npt.NDArray[np.intp]) -> None:
        """Framebuffer of GPUs that just changed job: the job's footprint, grown into."""
        u = self.unit[gpus]
        kind = self.kind[u]
        idle = kind == IDLE
        train = kind == TRAIN
        base = self.fb_base[u] + self.rng.normal(0.0, 150.0, gpus.size)
        cap = np.where(train, base + self.rng.uniform(500, 3000, gpus.size),
                       base + self.rng.uniform(4000, 12_000, gpus.size))
        self.fb_target[gpus] = np.where(idle, FB_IDLE_MIB, np.minimum(cap, 80_500))
        self.fb_growth[gpus] = np.where(train, 8.0, 4.0)
        self.fb_used[gpus] = np.where(idle, FB_IDLE_MIB, base)

    def load(self, t_s: float, rng: np.random.Generator) -> Load:
        """The load of every GPU at ``t_s``: its row's level plus per-GPU noise."""
        kind = self.kind
        training = kind == TRAIN
        serving = kind == INFER
        computing, row_util = rhythm(t_s, training, serving, self.phase0_s, self.period_s,
                                     self.compute_frac, self.burst_on, self.burst_level)
        u = self.unit
        noise = self.rng.standard_normal(self.topo.gpus)
        busy = kind[u] != IDLE
        util = row_util[u] + (noise * 2.5 + self.gpu_bias) * busy
        np.clip(util, 0.0, 100.0, out=util)
        serve_g = serving[u]
        return gpu_load(busy, util, training[u], serve_g, computing[u],
                        self.burst_on[u] & serve_g, noise, self.gpu_bias, self.fb_used,
                        training, computing)

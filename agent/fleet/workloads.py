"""What each node is doing: idle, training with an all-reduce rhythm, serving bursts, and
(in zoo profiles) pipeline-parallel training, per-second random inference, and jobs on part of
a node.

A workload belongs to a node (one job spans its 8 GPUs), so the state machine runs over
node arrays and the per-GPU load is one gather plus per-GPU noise. Phases last minutes
(exponential durations); a node that finishes a phase draws its next one. Everything the
load implies for the GPUs (utilisation, memory traffic, PCIe and NVLink throughput,
framebuffer footprint) comes out of :meth:`Workloads.load` in NVML's native units, rounded to
NVML's granularity by the model.

Training alternates a compute phase (utilisation ~100 %, little NVLink traffic) with an
all-reduce (utilisation drops, NVLink carries hundreds of GB/s) at a per-job period of a
few seconds, so at 1 Hz sampling the rhythm shows as a beat in power and NVLink rather than
as a clean square wave, as it does on real fleets.

The zoo's kinds (:mod:`agent.fleet.zoo`; weight 0 in the default mix, so the default model
never draws them and its random stream is unchanged):

``PIPELINE``      pipeline-parallel training: every GPU of the node is one stage and idles in
                  a bubble of ``bubble`` x period once per period, stage ``s`` shifted by
                  ``s / gpus_per_node`` of a period, so the node's GPUs are out of phase.
``INFER_RANDOM``  inference whose utilisation is drawn uniformly in the job's [lo, hi] on
                  every GPU on every tick (request mix changes faster than the sample rate).
``PARTIAL``       a job on ``k`` of the node's GPUs (1 <= k < gpus_per_node, contiguous from a
                  random slot): lock-step training or random inference there, idle elsewhere.

Their per-job and per-tick draws come from a second generator (``aux``), never from the
model's main stream.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from agent.fleet.topology import Topology

__all__ = [
    "IDLE",
    "INFER",
    "INFER_RANDOM",
    "KIND_NAMES",
    "PARTIAL",
    "PIPELINE",
    "TRAIN",
    "Load",
    "WorkloadParams",
    "Workloads",
    "gpu_load",
    "rhythm",
]

IDLE: Final = 0
TRAIN: Final = 1
INFER: Final = 2
PIPELINE: Final = 3
INFER_RANDOM: Final = 4
PARTIAL: Final = 5
KIND_NAMES: Final = ("idle", "train", "infer", "pipeline", "infer_random", "partial")
"""Workload kinds by index: the order of :class:`WorkloadParams` ``mix`` and ``mean_s``."""

FB_TOTAL_MIB: Final = 81_559
"""H100 80GB HBM3 as NVML reports it (nvmlDeviceGetMemoryInfo.total / 2**20)."""
FB_IDLE_MIB: Final = 1.0
BURST_ON_TO_OFF: Final = 0.08
"""Per-second probability that an inference burst ends / an idle gap ends."""
BURST_OFF_TO_ON: Final = 0.15

F64 = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class WorkloadParams:
    """What a fleet runs; the defaults are the default model's (see :mod:`agent.fleet.zoo`)."""

    mix: tuple[float, ...] = (0.2, 0.45, 0.35)
    """Probability of each kind (``KIND_NAMES`` order; missing tail = 0) for a new phase."""
    mean_s: tuple[float, ...] = (300.0, 1800.0, 900.0)
    """Mean phase length per kind in seconds (exponential durations)."""
    period_s: tuple[float, float] = (2.5, 9.0)
    """Range of a training job's step period (compute + all-reduce, or one pipeline step)."""
    bubble: tuple[float, float] = (0.1, 0.3)
    """Range of a pipeline job's bubble: the fraction of a step each stage idles."""
    random_util_pct: tuple[float, float, float, float] = (0.0, 30.0, 60.0, 100.0)
    """A random-inference job's [lo, hi]: lo in the first pair's range, hi in the second's."""

    @property
    def extended(self) -> bool:
        """Whether any zoo kind (pipeline, random inference, partial node) can be drawn."""
        return any(w > 0 for w in self.mix[3:])


_DEFAULT_PARAMS: Final = WorkloadParams()


@dataclass(slots=True)
class Load:
    """One tick of per-GPU load, native units (percent, KiB/s, bytes/s, MiB)."""

    busy: npt.NDArray[np.bool_]
    """The GPU's node runs a job (clocks boost); False means idle clocks and P8."""
    util_pct: F64
    mem_util_pct: F64
    pcie_tx_kib: F64
    pcie_rx_kib: F64
    nvlink_tx_bps: F64
    nvlink_rx_bps: F64
    fb_used_mib: F64
    training: npt.NDArray[np.bool_]
    """Per node (per job with :mod:`agent.fleet.job_load`): lock-step training."""
    computing: npt.NDArray[np.bool_]
    """Per node (per job): in the compute part of the all-reduce rhythm."""
    computing_gpu: npt.NDArray[np.bool_]
    """Per GPU: computing (the node's rhythm, or the GPU's own pipeline stage)."""


class Workloads:
    """Per-node phase machine plus the load it puts on each GPU."""

    def __init__(self, topology: Topology, rng: np.random.Generator,
                 params: WorkloadParams | None = None,
                 aux: np.random.Generator | None = None) -> None:
        self.topo = topology
        params = _DEFAULT_PARAMS if params is None else params
        self.params = params
        n, g = topology.nodes, topology.gpus
        mix = list(params.mix)
        while len(mix) > 1 and mix[-1] == 0:
            mix.pop()  # the default mix draws rng.choice(3, ...) as it always did
        self._p = np.array(mix)
        self._mean_s = np.array(params.mean_s[: len(mix)], dtype=np.float64)
        self.extended = params.extended
        self.kind = rng.choice(self._p.size, size=n, p=self._p).astype(np.int8)
        # Start mid-phase so a short run already sees every workload, not only fresh jobs.
        self.remaining_s = rng.exponential(self._mean_s[self.kind])
        self.period_s = rng.uniform(*params.period_s, n)
        self.phase0_s = rng.uniform(0.0, 10.0, n)
        self.compute_frac = rng.uniform(0.7, 0.88, n)
        self.burst_on = rng.random(n) < 0.5
        self.burst_level = rng.uniform(55.0, 95.0, n)
        self.gpu_bias = rng.normal(0.0, 1.0, g)
        """Persistent per-GPU offset: identical GPUs never read identically."""
        self.fb_target = np.empty(g)
        self.fb_growth = np.empty(g)
        self.fb_used = np.empty(g)
        if self.extended:
            self.aux = aux if aux is not None else np.random.default_rng([n, g, 0x200])
            self.bubble = np.zeros(n)
            self.rand_lo = np.zeros(n)
            self.rand_hi = np.zeros(n)
            self.part_sub = np.zeros(n, dtype=np.int8)
            """Per node: what a partial job runs, 0 lock-step training, 1 random inference."""
            self.active_gpu = np.ones(g, dtype=bool)
            """Per GPU: its node's job uses it (False only on a partial node's free GPUs)."""
            self.stage_shift = topology.local_gpu / float(topology.gpn)
            """Per GPU: its pipeline stage's offset, as a fraction of the step period."""
        self._start_jobs(np.arange(n), rng, warm=True)

    def _start_zoo_jobs(self, nodes: npt.NDArray[np.intp]) -> None:
        """Draw the zoo kinds' per-job parameters for ``nodes`` (from ``aux``)."""
        aux, prm, gpn = self.aux, self.params, self.topo.gpn
        k = nodes.size
        self.bubble[nodes] = aux.uniform(*prm.bubble, k)
        lo = aux.uniform(prm.random_util_pct[0], prm.random_util_pct[1], k)
        hi = aux.uniform(prm.random_util_pct[2], prm.random_util_pct[3], k)
        self.rand_lo[nodes] = lo
        self.rand_hi[nodes] = np.maximum(hi, lo)
        self.part_sub[nodes] = aux.random(k) < 0.5
        used = aux.integers(1, max(gpn, 2), k)  # 1 .. gpn-1 GPUs
        first = aux.integers(0, gpn, k)
        partial = self.kind[nodes] == PARTIAL
        gpus = (nodes[:, None] * gpn + np.arange(gpn)).ravel()
        slot = (np.arange(gpn)[None, :] - first[:, None]) % gpn
        self.active_gpu[gpus] = (~partial[:, None] | (slot < used[:, None])).ravel()

    def _start_jobs(self, nodes: npt.NDArray[np.intp], rng: np.random.Generator,
                    warm: bool = False) -> None:
        """Give ``nodes`` (which just changed phase) their job's framebuffer footprint."""
        if nodes.size == 0:
            return
        gpn = self.topo.gpn
        gpus = (nodes[:, None] * gpn + np.arange(gpn)).ravel()
        node_kind = self.kind[nodes]
        if self.extended:
            self._start_zoo_jobs(nodes)
            trains = ((node_kind == TRAIN) | (node_kind == PIPELINE)
                      | ((node_kind == PARTIAL) & (self.part_sub[nodes] == 0)))
            idle = np.repeat(node_kind == IDLE, gpn) | ~self.active_gpu[gpus]
        else:
            trains = node_kind == TRAIN
            idle = np.repeat(node_kind == IDLE, gpn)
        train_g = np.repeat(trains, gpn)
        base = np.repeat(
            np.where(trains, rng.uniform(52_000, 74_000, nodes.size),
                     rng.uniform(18_000, 62_000, nodes.size)), gpn)
        base = base + rng.normal(0.0, 150.0, gpus.size)
        cap = np.where(train_g, base + rng.uniform(500, 3000, gpus.size),
                       base + rng.uniform(4000, 12_000, gpus.size))
        self.fb_target[gpus] = np.where(idle, FB_IDLE_MIB, np.minimum(cap, 80_500))
        self.fb_growth[gpus] = np.where(train_g, 8.0, 4.0)
        start = np.where(idle, FB_IDLE_MIB, base)
        if warm:
            start = start + (self.fb_target[gpus] - start) * rng.random(gpus.size)
        self.fb_used[gpus] = start

    def advance(self, dt: float, rng: np.random.Generator,
                force_train: npt.NDArray[np.bool_] | None = None,
                force_idle: npt.NDArray[np.bool_] | None = None) -> None:
        """Move every node on by ``dt`` seconds; nodes whose phase ended draw a new one.

        ``force_train`` (per node) pins nodes into training (a pipeline job may stay one): an
        injected fault that only shows under load (a straggler, a power brake) must have load
        to show on. ``force_idle`` pins nodes into idle (a GPU that heats up while idle).
        """
        self.remaining_s -= dt
        flip = rng.random(self.kind.size)
        on = self.burst_on
        self.burst_on = np.where(on, flip >= BURST_ON_TO_OFF * dt, flip < BURST_OFF_TO_ON * dt)
        started = self.burst_on & ~on
        if started.any():
            self.burst_level[started] = rng.uniform(55.0, 95.0, int(started.sum()))
        if force_train is not None:
            pinned = np.flatnonzero(force_train & (self.kind != TRAIN) & (self.kind != PIPELINE))
            if pinned.size:
                self.kind[pinned] = TRAIN
                self.remaining_s[pinned] = np.maximum(self.remaining_s[pinned], 60.0)
                self._start_jobs(pinned, rng)
        if force_idle is not None:
            pinned = np.flatnonzero(force_idle & (self.kind != IDLE))
            if pinned.size:
                self.kind[pinned] = IDLE
                self.remaining_s[pinned] = np.maximum(self.remaining_s[pinned], 60.0)
                self._start_jobs(pinned, rng)
        done = np.flatnonzero(self.remaining_s <= 0)
        if force_train is not None and done.size:
            done = done[~force_train[done]]
        if force_idle is not None and done.size:
            done = done[~force_idle[done]]
        if done.size:
            self.kind[done] = rng.choice(self._p.size, size=done.size, p=self._p)
            self.remaining_s[done] = rng.exponential(self._mean_s[self.kind[done]])
            self.period_s[done] = rng.uniform(*self.params.period_s, done.size)
            self.compute_frac[done] = rng.uniform(0.7, 0.88, done.size)
            self._start_jobs(done, rng)
        # Allocators grow towards the job's footprint; a finished job (lower target) frees
        # its memory at once.
        self.fb_used = np.minimum(self.fb_used + self.fb_growth * dt, self.fb_target)

    def load(self, t_s: float, rng: np.random.Generator) -> Load:
        """The load of every GPU at time ``t_s`` (seconds since the first tick)."""
        topo = self.topo
        nog = topo.node_of_gpu
        kind = self.kind
        ext = self.extended
        if ext:
            partial = kind == PARTIAL
            training = (kind == TRAIN) | (partial & (self.part_sub == 0))
        else:
            training = kind == TRAIN
        serving = kind == INFER
        # Node-level levels, then one gather to GPUs and per-GPU noise.
        computing, node_util = rhythm(t_s, training, serving, self.phase0_s, self.period_s,
                                      self.compute_frac, self.burst_on, self.burst_level)
        noise = rng.standard_normal(topo.gpus)
        busy = (kind != IDLE)[nog]
        if ext:
            busy &= self.active_gpu
        util = node_util[nog] + (noise * 2.5 + self.gpu_bias) * busy
        comp_g = computing[nog]
        train_g = training[nog]
        serve_g = serving[nog]
        if ext:
            pipe_g = (kind == PIPELINE)[nog]
            rand_g = ((kind == INFER_RANDOM) | (partial & (self.part_sub == 1)))[nog] & busy
            if pipe_g.any():
                period = self.period_s[nog]
                stage = np.mod((t_s + self.phase0_s[nog]) / period + self.stage_shift, 1.0)
                in_step = stage < 1.0 - self.bubble[nog]
                util = np.where(pipe_g, np.where(in_step, 97.0, 9.0) + noise * 2.5
                                + self.gpu_bias, util)
                comp_g = np.where(pipe_g, in_step, comp_g)
            if rand_g.any():
                u = self.aux.random(topo.gpus)
                lo = self.rand_lo[nog]
                util = np.where(rand_g, lo + (self.rand_hi[nog] - lo) * u + self.gpu_bias, util)
            util = np.where(busy, util, 0.0)  # a partial node's free GPUs idle
            comp_g = comp_g & busy
        np.clip(util, 0.0, 100.0, out=util)
        if ext:
            train_g = (train_g | pipe_g) & busy
            serve_g = (serve_g | rand_g) & busy
        burst_g = self.burst_on[nog] & serve_g
        return gpu_load(busy, util, train_g, serve_g, comp_g, burst_g, noise, self.gpu_bias,
                        self.fb_used, training, computing, pipe_g if ext else None,
                        rand_g if ext else None)


def rhythm(t_s: float, training: npt.NDArray[np.bool_], serving: npt.NDArray[np.bool_],
           phase0_s: F64, period_s: F64, compute_frac: F64, burst_on: npt.NDArray[np.bool_],
           burst_level: F64) -> tuple[npt.NDArray[np.bool_], F64]:
    """Per unit that runs one workload (a node here, a job in :mod:`agent.fleet.job_load`):
    whether it is in the compute part of its training step at ``t_s``, and its utilisation
    level in percent (compute or all-reduce, an inference burst or the gap between, idle)."""
    computing = training & (np.mod((t_s + phase0_s) / period_s, 1.0) < compute_frac)
    level = np.where(training, np.where(computing, 98.5, 52.0),
                     np.where(serving, np.where(burst_on, burst_level, 7.0), 0.0))
    return computing, level


def gpu_load(busy: npt.NDArray[np.bool_], util: F64, train_g: npt.NDArray[np.bool_],
             serve_g: npt.NDArray[np.bool_], comp_g: npt.NDArray[np.bool_],
             burst_g: npt.NDArray[np.bool_], noise: F64, gpu_bias: F64, fb_used: F64,
             training: npt.NDArray[np.bool_], computing: npt.NDArray[np.bool_],
             pipe_g: npt.NDArray[np.bool_] | None = None,
             rand_g: npt.NDArray[np.bool_] | None = None) -> Load:
    """The traffic a GPU's utilisation and role imply (memory, NVLink, PCIe): one formula
    for the node phases here and the job-driven load of :mod:`agent.fleet.job_load`.
    ``pipe_g`` / ``rand_g`` mark the zoo's pipeline stages and random-inference GPUs."""
    mem = np.where(train_g, util * 0.42 + 4.0, util * 0.65)
    nvl = np.where(train_g, np.where(comp_g, 4.0e9, 2.4e11),
                   np.where(serve_g, util * 4.0e8, 0.0))
    if pipe_g is not None:
        # Pipeline stages send activations to their neighbours all along the step.
        nvl = np.where(pipe_g, np.where(comp_g, 3.0e10, 9.0e10), nvl)
    nvl = nvl * (1.0 + 0.05 * noise)
    if rand_g is not None:
        burst_g = burst_g & ~rand_g
    pcie_rx = np.where(train_g, 30_000.0, np.where(burst_g, 180_000.0,
                                                       np.where(serve_g, 3_000.0, 12.0)))
    if rand_g is not None:
        pcie_rx = np.where(rand_g, 3_000.0 + util * 1_800.0, pcie_rx)
    pcie_tx = pcie_rx * 0.15 + 8.0
    return Load(
        busy=busy,
        util_pct=util,
        mem_util_pct=mem,
        pcie_tx_kib=pcie_tx * (1.0 + 0.2 * np.abs(noise)),
        pcie_rx_kib=pcie_rx * (1.0 + 0.2 * np.abs(gpu_bias)),
        nvlink_tx_bps=nvl,
        nvlink_rx_bps=nvl * 0.98,
        fb_used_mib=fb_used,
        training=training,
        computing=computing,
        computing_gpu=comp_g,
    )

"""What each node is doing: idle, training with an all-reduce rhythm, or serving bursts.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from agent.fleet.topology import Topology

__all__ = ["IDLE", "INFER", "TRAIN", "Load", "Workloads"]

IDLE: Final = 0
TRAIN: Final = 1
INFER: Final = 2

_MEAN_DURATION_S: Final = np.array([300.0, 1800.0, 900.0])
"""Mean phase length for idle, training, inference."""
_NEXT_P: Final = np.array([0.2, 0.45, 0.35])
"""Probability of each workload when a node starts a new phase."""
FB_TOTAL_MIB: Final = 81_559
"""H100 80GB HBM3 as NVML reports it (nvmlDeviceGetMemoryInfo.total / 2**20)."""
_FB_IDLE_MIB: Final = 1.0
_BURST_ON_TO_OFF: Final = 0.08
"""Per-second probability that an inference burst ends / an idle gap ends."""
_BURST_OFF_TO_ON: Final = 0.15

F64 = npt.NDArray[np.float64]


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
    """Per node: training (stragglers only matter there)."""
    computing: npt.NDArray[np.bool_]
    """Per node: in the compute part of the all-reduce rhythm."""


class Workloads:
    """Per-node phase machine plus the load it puts on each GPU."""

    def __init__(self, topology: Topology, rng: np.random.Generator) -> None:
        self.topo = topology
        n, g = topology.nodes, topology.gpus
        self.kind = rng.choice(3, size=n, p=_NEXT_P).astype(np.int8)
        # Start mid-phase so a short run already sees every workload, not only fresh jobs.
        self.remaining_s = rng.exponential(_MEAN_DURATION_S[self.kind])
        self.period_s = rng.uniform(2.5, 9.0, n)
        self.phase0_s = rng.uniform(0.0, 10.0, n)
        self.compute_frac = rng.uniform(0.7, 0.88, n)
        self.burst_on = rng.random(n) < 0.5
        self.burst_level = rng.uniform(55.0, 95.0, n)
        self.gpu_bias = rng.normal(0.0, 1.0, g)
        """Persistent per-GPU offset: identical GPUs never read identically."""
        self.fb_target = np.empty(g)
        self.fb_growth = np.empty(g)
        self.fb_used = np.empty(g)
        self._start_jobs(np.arange(n), rng, warm=True)

    def _start_jobs(self, nodes: npt.NDArray[np.intp], rng: np.random.Generator,
                    warm: bool = False) -> None:
        """Give ``nodes`` (which just changed phase) their job's framebuffer footprint."""
        if nodes.size == 0:
            return
        gpn = self.topo.gpn
        gpus = (nodes[:, None] * gpn + np.arange(gpn)).ravel()
        kind = np.repeat(self.kind[nodes], gpn)
        base = np.repeat(
            np.where(self.kind[nodes] == TRAIN, rng.uniform(52_000, 74_000, nodes.size),
                     rng.uniform(18_000, 62_000, nodes.size)), gpn)
        base = base + rng.normal(0.0, 150.0, gpus.size)
        cap = np.where(kind == TRAIN, base + rng.uniform(500, 3000, gpus.size),
                       base + rng.uniform(4000, 12_000, gpus.size))
        self.fb_target[gpus] = np.where(kind == IDLE, _FB_IDLE_MIB, np.minimum(cap, 80_500))
        self.fb_growth[gpus] = np.where(kind == TRAIN, 8.0, 4.0)
        start = np.where(kind == IDLE, _FB_IDLE_MIB, base)
        if warm:
            start = start + (self.fb_target[gpus] - start) * rng.random(gpus.size)
        self.fb_used[gpus] = start

    def advance(self, dt: float, rng: np.random.Generator,
                force_train: npt.NDArray[np.bool_] | None = None) -> None:
        """Move every node on by ``dt`` seconds; nodes whose phase ended draw a new one.

        ``force_train`` (per node) pins nodes into training: an injected fault that only
        shows under load (a straggler, a power brake) must have load to show on.
        """
        self.remaining_s -= dt
        flip = rng.random(self.kind.size)
        on = self.burst_on
        self.burst_on = np.where(on, flip >= _BURST_ON_TO_OFF * dt, flip < _BURST_OFF_TO_ON * dt)
        started = self.burst_on & ~on
        if started.any():
            self.burst_level[started] = rng.uniform(55.0, 95.0, int(started.sum()))
        if force_train is not None:
            pinned = np.flatnonzero(force_train & (self.kind != TRAIN))
            if pinned.size:
                self.kind[pinned] = TRAIN
                self.remaining_s[pinned] = np.maximum(self.remaining_s[pinned], 60.0)
                self._start_jobs(pinned, rng)
        done = np.flatnonzero(self.remaining_s <= 0)
        if force_train is not None and done.size:
            done = done[~force_train[done]]
        if done.size:
            self.kind[done] = rng.choice(3, size=done.size, p=_NEXT_P)
            self.remaining_s[done] = rng.exponential(_MEAN_DURATION_S[self.kind[done]])
            self.period_s[done] = rng.uniform(2.5, 9.0, done.size)
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
        training = kind == TRAIN
        serving = kind == INFER
        computing = training & (
            np.mod((t_s + self.phase0_s) / self.period_s, 1.0) < self.compute_frac)
        # Node-level levels, then one gather to GPUs and per-GPU noise.
        node_util = np.where(
            training, np.where(computing, 98.5, 52.0),
            np.where(serving, np.where(self.burst_on, self.burst_level, 7.0), 0.0))
        noise = rng.standard_normal(topo.gpus)
        busy = (kind != IDLE)[nog]
        util = node_util[nog] + (noise * 2.5 + self.gpu_bias) * busy
        np.clip(util, 0.0, 100.0, out=util)
        mem = np.where(training[nog], util * 0.42 + 4.0, util * 0.65)
        comp_g = computing[nog]
        train_g = training[nog]
        serve_g = serving[nog]
        nvl = np.where(train_g, np.where(comp_g, 4.0e9, 2.4e11),
                       np.where(serve_g, util * 4.0e8, 0.0))
        nvl = nvl * (1.0 + 0.05 * noise)
        burst_g = self.burst_on[nog] & serve_g
        pcie_rx = np.where(train_g, 30_000.0, np.where(burst_g, 180_000.0,
                                                           np.where(serve_g, 3_000.0, 12.0)))
        pcie_tx = pcie_rx * 0.15 + 8.0
        return Load(
            busy=busy,
            util_pct=util,
            mem_util_pct=mem,
            pcie_tx_kib=pcie_tx * (1.0 + 0.2 * np.abs(noise)),
            pcie_rx_kib=pcie_rx * (1.0 + 0.2 * np.abs(self.gpu_bias)),
            nvlink_tx_bps=nvl,
            nvlink_rx_bps=nvl * 0.98,
            fb_used_mib=self.fb_used,
            training=training,
            computing=computing,
        )

"""The synthetic fleet: every NVML metric of N GPUs, one tick at a time, as numpy columns.

Each tick costs a fixed number of numpy operations over arrays of G GPUs (and of nodes and
racks), never Python work per GPU, so generation runs at tens of millions of metrics per
second on one core. The order of random draws per tick depends only on the seed and the
fault plan, which makes a run reproducible bit for bit.

Values are produced in NVML's native units and granularity (integer degrees C, integer mW,
integer percent, MiB, MHz in 15 MHz steps, integer mJ, integer KiB/s, integer counters) and
then converted with the catalog's exact ``(mul, div)`` scales, the same conversion the NVML
source applies, so a synthetic power of 123.456 W is the double that 123456 / 1000.0 gives.

A :class:`~agent.fleet.zoo.FleetProfile` changes the constants (time constants, resistances,
inlet, sensor resolution and noise, power limit, workload mix, missing metrics); the default
profile is the model as it always was, bit for bit. What a profile adds that the default model
never does (the zoo's workload kinds) draws from a second generator, so the main stream, and
with it every default run, is unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from agent.fleet import thermal
from agent.fleet.faults import NEEDS_IDLE, NEEDS_LOAD, STUCK_VISIBLE_C, Fault, FaultKind
from agent.fleet.job_load import JobLoad
from agent.fleet.jobs import JobScheduler
from agent.fleet.thermal import Governor, Inlet
from agent.fleet.topology import Topology
from agent.fleet.workloads import FB_TOTAL_MIB, Workloads
from agent.fleet.zoo import FleetProfile
from schemas.catalog import BY_NAME, CATALOG

__all__ = ["DEFAULT_START_MS", "METRICS", "METRIC_IDS", "FleetModel"]

METRICS: Final[tuple[str, ...]] = tuple(m.name for m in CATALOG if m.nvml is not None)
"""The catalog metrics NVML provides, in catalog order: the columns of every tick."""
METRIC_IDS: Final = np.array([BY_NAME[n].id for n in METRICS], dtype=np.uint16)
METRIC_IDS.setflags(write=False)
_COL: Final = {name.removeprefix("fleetpulse_gpu_"): i for i, name in enumerate(METRICS)}
_MUL: Final = np.array([float(BY_NAME[n].nvml_scale[0]) for n in METRICS])
_DIV: Final = np.array([float(BY_NAME[n].nvml_scale[1]) for n in METRICS])

DEFAULT_START_MS: Final = 1_767_225_600_000
"""2026-01-01T00:00:00Z: exports are reproducible, so they do not start at "now"."""

_XID_BACKGROUND: Final = np.array([13.0, 31.0, 43.0])
"""Application-caused XIDs (graphics exception, MMU fault, GPU stopped processing)."""

F64 = npt.NDArray[np.float64]


@dataclass(slots=True)
class _Effects:
    """What the faults active in this tick change, gathered before the physics runs."""

    inlet_extra: F64 | None = None
    heat_extra: F64 | None = None
    cap: F64 | None = None
    cap_bits: npt.NDArray[np.int64] | None = None


class FleetModel:
    """N GPUs, stepped tick by tick. See :mod:`agent.fleet` for the public API."""

    def __init__(
        self,
        topology: Topology,
        *,
        hz: float = 1.0,
        seed: int = 0,
        start_ms: int = DEFAULT_START_MS,
        faults: Sequence[Fault] = (),
        profile: FleetProfile | None = None,
        jobs: JobScheduler | None = None,
    ) -> None:
        """``profile`` (default: today's model) sets the fleet's constants; ``hz`` is still the
        caller's (pass ``profile.hz`` for the profile's own rate). With ``jobs`` the load
        follows that scheduler's jobs (:mod:`agent.fleet.job_load`; whoever advances the
        scheduler decides when jobs start) instead of per-node phases."""
        if not 0 < hz <= 50:
            raise ValueError(f"hz must be in (0, 50], got {hz}")
        prof = FleetProfile() if profile is None else profile
        prof.validate()
        self.profile = prof
        self.topo = topology
        self.hz = float(hz)
        self.dt = 1.0 / self.hz
        self.seed = seed
        self.start_ms = int(start_ms)
        self.faults = tuple(faults)
        for f in self.faults:
            if f.gpus and (min(f.gpus) < 0 or max(f.gpus) >= topology.gpus):
                raise ValueError(f"fault {f.kind} names GPUs outside the fleet: {f.gpus}")
        self.tick = 0
        g, n = topology.gpus, topology.nodes
        # Seeded by (seed, first node, size): a one-node slice of a fleet is its own stream.
        rng = np.random.default_rng([seed, topology.first_node, g])
        self.rng = rng
        self.uuids: tuple[str, ...] = tuple(
            "GPU-{}-{}-{}-{}-{}".format(*(h[a:b] for a, b in
                                          ((0, 8), (8, 12), (12, 16), (16, 20), (20, 32))))
            for h in (bytes(rng.integers(0, 256, 16, dtype=np.uint8)).hex() for _ in range(g))
        )
        params = prof.workload_params()
        aux = (np.random.default_rng([seed, topology.first_node, g, 0x200])
               if params.extended else None)
        self.work: Workloads | JobLoad = (
            Workloads(topology, rng, params, aux) if jobs is None
            else JobLoad(topology, jobs, seed, params))
        self.inlet = Inlet(topology.racks.size, rng, prof.inlet_c, prof.inlet_swing_c)
        self.gov = Governor(
            idle_w=rng.uniform(prof.idle_w[0], prof.idle_w[1], g),
            dynamic_w=prof.dynamic_w * (1.0 + rng.normal(0.0, prof.dynamic_spread, g)),
            limit_w=np.full(g, prof.power_limit_w),
        )
        self.r_die = rng.uniform(prof.r_die_c_per_w[0], prof.r_die_c_per_w[1], g)
        self.r_mem = rng.uniform(prof.r_mem_c_per_w[0], prof.r_mem_c_per_w[1], g)
        self.slot_warm = topology.slot_of_node[topology.node_of_gpu] * 0.4 + rng.normal(0, 0.3, g)
        self.node_offset_ms = rng.integers(0, 3, n)
        inlet0 = self.inlet.at(0.0)[topology.rack_index_of_gpu] + self.slot_warm
        start_w = 250.0 * prof.power_limit_w / 700.0
        self.temp = inlet0 + self.r_die * start_w
        self.mem_temp = inlet0 + self.r_mem * start_w + 4.0
        self.reported_temp = thermal.quantize_temp(self.temp, prof.temp_steps_per_c)
        self._temp_steps = prof.temp_steps_per_c
        self._power_step_mw = prof.power_step_mw
        # Noise never reads below this (20 W, or less for boards that idle near 20 W).
        self._power_floor_w = min(20.0, 0.6 * prof.idle_w[0])
        self._alpha = thermal.lag_factor(self.dt, prof.die_tau_s)
        self._mem_alpha = (self._alpha * 0.7 if prof.mem_tau_s is None
                           else thermal.lag_factor(self.dt, prof.mem_tau_s))
        self._missing = np.array([METRICS.index(m) for m in prof.missing], dtype=np.intp)
        self.energy_mj = rng.integers(10**9, 5 * 10**10, g)
        self.sbe_agg = np.where(rng.random(g) < 0.1, rng.integers(1, 40, g), 0)
        self.dbe_agg = np.zeros(g, dtype=np.int64)
        self.sbe_vol = np.zeros(g, dtype=np.int64)
        self.dbe_vol = np.zeros(g, dtype=np.int64)
        self.pcie_replay = np.where(rng.random(g) < 0.05, rng.integers(1, 5, g), 0)
        self.nvl_crc = np.zeros(g, dtype=np.int64)
        self.nvl_replay = np.zeros(g, dtype=np.int64)
        self.nvl_recovery = np.zeros(g, dtype=np.int64)
        self.remap_corr = np.where(rng.random(g) < 0.03, 1, 0).astype(np.int64)
        self.remap_unc = np.zeros(g, dtype=np.int64)
        self.remap_fail = np.zeros(g, dtype=np.int64)
        self._stuck: dict[int, float] = {}
        self.stuck_visible_s: dict[tuple[float, int], float] = {}
        """(fault start, GPU) -> seconds since the first tick when the die first stood
        ``STUCK_VISIBLE_C`` from its frozen reading (see :data:`STUCK_VISIBLE_C`)."""
        self._fault_nodes = {
            f: np.unique(np.asarray(f.gpus) // topology.gpn) for f in self.faults
        }
        self._force = np.zeros(n, dtype=bool)
        self._force_idle = np.zeros(n, dtype=bool)

    @property
    def metrics(self) -> tuple[str, ...]:
        return METRICS

    @property
    def t_s(self) -> float:
        """Seconds since the first tick, for the tick about to be generated."""
        return self.tick / self.hz

    def _effects(self, active: list[Fault]) -> _Effects:
        eff = _Effects()
        if not active:
            return eff
        g = self.topo.gpus
        t = self.t_s
        for f in active:
            idx = np.asarray(f.gpus)
            size = f.magnitude * f.level(t, self.dt)
            if f.kind is FaultKind.COOLING_RACK:
                if eff.inlet_extra is None:
                    eff.inlet_extra = np.zeros(self.topo.racks.size)
                racks = np.unique(self.topo.rack_index_of_gpu[idx])
                eff.inlet_extra[racks] += 21.0 * size
            elif f.kind in (FaultKind.THERMAL_RUNAWAY, FaultKind.HOT_IDLE):
                if eff.heat_extra is None:
                    eff.heat_extra = np.zeros(g)
                eff.heat_extra[idx] += (42.0 if f.kind is FaultKind.THERMAL_RUNAWAY
                                        else 25.0) * size
            elif f.kind in (FaultKind.POWER_BRAKE, FaultKind.STRAGGLER):
                if eff.cap is None or eff.cap_bits is None:
                    eff.cap = np.ones(g)
                    eff.cap_bits = np.zeros(g, dtype=np.int64)
                brake = f.kind is FaultKind.POWER_BRAKE
                eff.cap[idx] = 1.0 - (0.75 if brake else 0.4) * size
                if brake:
                    eff.cap_bits[idx] |= thermal.HW_SLOWDOWN | thermal.HW_POWER_BRAKE_SLOWDOWN
        return eff

    def step(self, out: F64 | None = None) -> tuple[npt.NDArray[np.int64], F64]:
        """Generate one tick: timestamps per node (nodes,) and values (G, M) in base units.

        ``out`` may be a (G, M) array (or strided view) to write into; otherwise a new one.
        """
        topo, rng, dt, t = self.topo, self.rng, self.dt, self.t_s
        g = topo.gpus
        active = [f for f in self.faults if f.active(t)]
        if active or self._force.any() or self._force_idle.any():
            self._force[:] = False
            self._force_idle[:] = False
            for f in active:
                if f.kind in NEEDS_LOAD:
                    self._force[self._fault_nodes[f]] = True
                elif f.kind in NEEDS_IDLE:
                    self._force_idle[self._fault_nodes[f]] = True
        self.work.advance(dt, rng, self._force if self._force.any() else None,
                          self._force_idle if self._force_idle.any() else None)
        load = self.work.load(t, rng)
        eff = self._effects(active)

        util = load.util_pct
        stragglers = [f for f in active if f.kind is FaultKind.STRAGGLER]
        for f in stragglers:
            idx = np.asarray(f.gpus)
            # Peers of a straggler wait for it: their compute phase thins out.
            nodes = self._fault_nodes[f]
            peers = np.flatnonzero(np.isin(topo.node_of_gpu, nodes))
            wait = 1.0 - 0.2 * f.magnitude * f.level(t, dt)
            util[peers] = np.where(load.computing_gpu[peers], util[peers] * wait, util[peers])
            util[idx] = 100.0
        util = np.rint(util)

        inlet = self.inlet.at(t, eff.inlet_extra)[topo.rack_index_of_gpu] + self.slot_warm
        frac, sm_mhz, reasons = self.gov.decide(util, load.busy, self.reported_temp,
                                             eff.cap, eff.cap_bits)
        noise = rng.standard_normal((4, g))
        prof = self.profile
        power_w = (self.gov.idle_w + self.gov.dynamic_w * (util * 0.01) * frac * frac
                   + prof.power_noise_w * noise[0])
        power_w = np.clip(power_w, self._power_floor_w, self.gov.limit_w + 4.0)
        if self._power_step_mw == 1:
            power_mw = np.rint(power_w * 1000.0)
        else:
            step = float(self._power_step_mw)
            power_mw = np.rint(power_w * (1000.0 / step)) * step
        self.energy_mj += np.rint(power_mw * dt).astype(np.int64)

        alpha = self._alpha
        p = power_mw * 0.001
        target = inlet + self.r_die * p
        if eff.heat_extra is not None:
            target += eff.heat_extra
        self.temp += (target - self.temp) * alpha
        self.mem_temp += (inlet + self.r_mem * p + 4.0 + 0.04 * load.mem_util_pct
                          - self.mem_temp) * self._mem_alpha
        temp = thermal.quantize_temp(self.temp + prof.temp_noise_c * noise[1], self._temp_steps)
        for fl in active:
            if fl.kind is FaultKind.STUCK_SENSOR:
                for gi in fl.gpus:
                    temp[gi] = self._stuck.setdefault(gi, float(self.reported_temp[gi]))
                    if abs(self.temp[gi] - temp[gi]) >= STUCK_VISIBLE_C:
                        self.stuck_visible_s.setdefault((fl.start_s, gi), round(t, 3))
        self.reported_temp = temp

        xid = self._counters(active, dt, rng)

        native = np.empty((g, len(METRICS))) if out is None else out
        c = _COL
        native[:, c["temperature_celsius"]] = temp
        native[:, c["memory_temperature_celsius"]] = thermal.quantize_temp(
            self.mem_temp + prof.temp_noise_c * noise[2], self._temp_steps)
        native[:, c["power_usage_watts"]] = power_mw
        native[:, c["power_limit_watts"]] = self.gov.limit_w * 1000.0
        native[:, c["energy_consumption_joules_total"]] = self.energy_mj
        native[:, c["utilization_ratio"]] = util
        native[:, c["memory_utilization_ratio"]] = np.rint(np.clip(load.mem_util_pct, 0, 100))
        fb_used = np.rint(load.fb_used_mib)
        native[:, c["framebuffer_used_bytes"]] = fb_used * 1048576.0
        native[:, c["framebuffer_free_bytes"]] = (FB_TOTAL_MIB - fb_used) * 1048576.0
        native[:, c["sm_clock_hertz"]] = sm_mhz
        native[:, c["memory_clock_hertz"]] = thermal.MEM_CLOCK_MHZ
        native[:, c["clock_event_reasons"]] = reasons
        native[:, c["pcie_transmit_bytes_per_second"]] = np.rint(load.pcie_tx_kib)
        native[:, c["pcie_receive_bytes_per_second"]] = np.rint(load.pcie_rx_kib)
        nvl_tx = np.rint(load.nvlink_tx_bps * (1.0 / 1024.0))
        nvl_rx = np.rint(load.nvlink_rx_bps * (1.0 / 1024.0))
        for fl in active:
            if fl.kind is FaultKind.NVLINK_ERRORS:
                idx = np.asarray(fl.gpus)
                keep = 1.0 - 0.45 * fl.magnitude * fl.level(t, dt)
                nvl_tx[idx] = np.rint(nvl_tx[idx] * keep)
                nvl_rx[idx] = np.rint(nvl_rx[idx] * keep)
        nvl_tx *= 1024.0  # NVLink counters tick in KiB
        nvl_rx *= 1024.0
        native[:, c["nvlink_transmit_bytes_per_second"]] = nvl_tx
        native[:, c["nvlink_receive_bytes_per_second"]] = nvl_rx
        native[:, c["pcie_replay_errors_total"]] = self.pcie_replay
        native[:, c["nvlink_crc_errors_total"]] = self.nvl_crc
        native[:, c["nvlink_replay_errors_total"]] = self.nvl_replay
        native[:, c["nvlink_recovery_errors_total"]] = self.nvl_recovery
        native[:, c["ecc_sbe_volatile_total"]] = self.sbe_vol
        native[:, c["ecc_dbe_volatile_total"]] = self.dbe_vol
        native[:, c["ecc_sbe_aggregate_total"]] = self.sbe_agg
        native[:, c["ecc_dbe_aggregate_total"]] = self.dbe_agg
        native[:, c["retired_pages_sbe"]] = 0.0
        native[:, c["retired_pages_dbe"]] = 0.0
        native[:, c["remapped_rows_correctable"]] = self.remap_corr
        native[:, c["remapped_rows_uncorrectable"]] = self.remap_unc
        native[:, c["row_remap_failure"]] = self.remap_fail
        native[:, c["fan_speed_ratio"]] = np.rint(np.clip(30.0 + (temp - 35.0) * 1.6, 30, 100))
        native[:, c["performance_state"]] = np.where(load.busy, 0.0, 8.0)
        native[:, c["xid"]] = xid
        native[:, c["slowdown_temperature_celsius"]] = thermal.SLOWDOWN_C
        np.multiply(native, _MUL, out=native)
        np.divide(native, _DIV, out=native)

        for fl in active:
            if fl.kind is FaultKind.FALLEN_OFF_BUS:
                idx = np.asarray(fl.gpus)
                native[idx] = np.nan
                if self.tick == round(fl.start_s * self.hz):
                    native[idx, c["xid"]] = 79.0
        if self._missing.size:
            native[:, self._missing] = np.nan  # the fleet's exporter has no such metric

        jitter = np.minimum(rng.exponential(1.2, topo.nodes), 9.0)
        ts = (self.start_ms + round(self.tick * 1000.0 / self.hz)
              + self.node_offset_ms + np.rint(jitter).astype(np.int64))
        self.tick += 1
        return ts, native

    def _counters(self, active: list[Fault], dt: float, rng: np.random.Generator) -> F64:
        """Advance the error counters; return the XID column (NaN where none)."""
        g = self.topo.gpus
        xid = np.full(g, np.nan)
        u = rng.random(g)
        # One uniform draw decides every rare background event (disjoint intervals).
        p_replay, p_sbe, p_crc, p_xid = 2e-5 * dt, 1e-5 * dt, 1e-5 * dt, 3e-7 * dt
        hits = np.flatnonzero(u < p_replay + p_sbe + p_crc + p_xid)
        if hits.size:
            uh = u[hits]
            self.pcie_replay[hits[uh < p_replay]] += 1
            sbe = hits[(uh >= p_replay) & (uh < p_replay + p_sbe)]
            self.sbe_vol[sbe] += 1
            self.sbe_agg[sbe] += 1
            self.nvl_crc[hits[(uh >= p_replay + p_sbe) & (uh < p_replay + p_sbe + p_crc)]] += 1
            xh = hits[uh >= p_replay + p_sbe + p_crc]
            xid[xh] = _XID_BACKGROUND[xh % 3]
        t = self.t_s
        for f in active:
            idx = np.asarray(f.gpus)
            size = f.magnitude * f.level(t, dt)
            if f.kind is FaultKind.ECC_STORM:
                n = rng.poisson(40.0 * size * dt, idx.size)
                self.sbe_vol[idx] += n
                self.sbe_agg[idx] += n
                r = rng.random((2, idx.size))
                remap = idx[r[0] < 0.03 * size * dt]
                self.remap_corr[remap] += 1
                xid[remap] = 63.0
                dbe = idx[r[1] < 0.004 * size * dt]
                self.dbe_vol[dbe] += 1
                self.dbe_agg[dbe] += 1
                self.remap_unc[dbe] += 1
                xid[dbe] = 48.0
            elif f.kind is FaultKind.NVLINK_ERRORS:
                self.nvl_crc[idx] += rng.poisson(150.0 * size * dt, idx.size)
                self.nvl_replay[idx] += rng.poisson(3.0 * size * dt, idx.size)
                r = rng.random((2, idx.size))
                self.nvl_recovery[idx[r[0] < 0.05 * size * dt]] += 1
                xid[idx[r[1] < 0.02 * size * dt]] = 74.0
        return xid

"""Injected faults and their ground truth.

A fault is (kind, GPUs, start, end, magnitude, ramp) in seconds since the first sample; the
model applies it while ``start_s <= t < end_s`` and the same object writes the labels, so the
labels cannot disagree with what was injected. Labels file: a JSON list with one object per
affected GPU::

    {"gpu": 1234, "kind": "cooling_rack", "start_s": 120.0, "end_s": 600.0,
     "magnitude": 1.0, "ramp_s": 120.0}

``magnitude`` scales the fault's size (1.0 is the size below); ``ramp_s`` is how long the fault
takes from its start to full size (0 abrupt). Files written before these two fields existed
read back with ``magnitude`` 1.0 and ``ramp_s`` None (unknown).

What each kind does to the readings (see :mod:`agent.fleet.model` for the mechanics):

``thermal_runaway``  the GPU's heat path degrades: its temperature climbs far above peers at
                     the same power, the governor throttles (SW/HW thermal bits), power drops.
``cooling_rack``     the rack's inlet air warms by ~20 C over two minutes: every GPU of the
                     rack runs hot together; the rack is the anomaly, no single GPU is odd.
``ecc_storm``        corrected ECC errors by the dozen per second, rows remapped, XID 63 and
                     occasionally an uncorrectable error with XID 48.
``power_brake``      the board asserts power brake: SM clock ~25 % of maximum with
                     HW_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN, power falls while the job still runs.
``stuck_sensor``     the temperature reading freezes while power keeps moving.
``straggler``        the GPU runs at ~60 % clock with no reason bit set and never waits for
                     the all-reduce (utilisation pinned at 100 %) while its peers wait for it.
``nvlink_errors``    NVLink CRC errors by the hundred per second, replays and recoveries,
                     XID 74, throughput down.
``fallen_off_bus``   XID 79, then every metric is NaN: the GPU stops answering until the end.
``hot_idle``         (zoo kind, not in :data:`CLASSIC_KINDS`) the heat path degrades on a GPU
                     whose node is kept idle: +25 C over ~5 minutes at idle power.

Sizes at magnitude 1.0 and what ``magnitude`` (m) and the ramp fraction (r, 0 -> 1 over
``ramp_s``) scale:

==================  ==========================================================================
thermal_runaway     +42 C * m * r on the die's target temperature
cooling_rack        +21 C * m * r on the rack's inlet
hot_idle            +25 C * m * r on the die's target temperature (node pinned idle)
ecc_storm           40/s * m * r corrected errors; remaps 0.03/s, DBE 0.004/s, both * m * r
nvlink_errors       150/s * m * r CRC, 3/s replays, throughput * (1 - 0.45 * m * r)
straggler           clock cap 1 - 0.4 * m * r, peers' compute utilisation * (1 - 0.2 * m * r)
power_brake         clock cap 1 - 0.75 * m * r, HW_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN bits
stuck_sensor        (no size) the reading freezes
fallen_off_bus      (no size) XID 79 then NaN
==================  ==========================================================================

``ramp_s=None`` keeps the classic ramps: cooling over min(120 s, 30 % of the window), thermal
runaway over 60 % of the window, hot_idle over min(300 s, 60 %), the others abrupt.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from agent.fleet.topology import Topology
from agent.fleet.zoo import FleetProfile

__all__ = [
    "CLASSIC_KINDS",
    "EVIDENCE",
    "REALISTIC_FAULTS_PER_1000_GPU_DAYS",
    "STUCK_VISIBLE_C",
    "ZOO_MAGNITUDES",
    "ZOO_SLOW_RAMP_S",
    "Fault",
    "FaultKind",
    "labels_of",
    "observable_kinds",
    "plan_faults",
    "plan_zoo_faults",
    "read_labels",
    "realistic_fault_count",
    "write_labels",
]


class FaultKind(StrEnum):
    THERMAL_RUNAWAY = "thermal_runaway"
    COOLING_RACK = "cooling_rack"
    ECC_STORM = "ecc_storm"
    POWER_BRAKE = "power_brake"
    STUCK_SENSOR = "stuck_sensor"
    STRAGGLER = "straggler"
    NVLINK_ERRORS = "nvlink_errors"
    FALLEN_OFF_BUS = "fallen_off_bus"
    HOT_IDLE = "hot_idle"


CLASSIC_KINDS: Final = tuple(FaultKind)[:8]
"""The default model's eight kinds: what :func:`plan_faults` cycles through by default."""

TYPICAL_DURATION_S: Final[dict[FaultKind, float]] = {
    FaultKind.THERMAL_RUNAWAY: 600.0,
    FaultKind.COOLING_RACK: 900.0,
    FaultKind.ECC_STORM: 300.0,
    FaultKind.POWER_BRAKE: 180.0,
    FaultKind.STUCK_SENSOR: 900.0,
    FaultKind.STRAGGLER: 900.0,
    FaultKind.NVLINK_ERRORS: 300.0,
    FaultKind.FALLEN_OFF_BUS: float("inf"),
    FaultKind.HOT_IDLE: 600.0,
}
"""How long each kind lasts in a long run; short runs scale it down."""

NEEDS_LOAD: Final = frozenset(
    {FaultKind.THERMAL_RUNAWAY, FaultKind.POWER_BRAKE, FaultKind.STRAGGLER}
)
"""Kinds that only show under load: the model keeps their node training meanwhile."""
NEEDS_IDLE: Final = frozenset({FaultKind.HOT_IDLE})
"""Kinds defined on an idle GPU: the model keeps their node idle meanwhile."""
_RAMPS_BY_DEFAULT: Final = frozenset(
    {FaultKind.COOLING_RACK, FaultKind.THERMAL_RUNAWAY, FaultKind.HOT_IDLE})


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault. ``gpus`` are global indices, ``end_s`` is exclusive."""

    kind: FaultKind
    gpus: tuple[int, ...]
    start_s: float
    end_s: float
    magnitude: float = 1.0
    """Size relative to the kind's classic one (see the module docstring's table)."""
    ramp_s: float | None = None
    """Seconds from the start to full size (0: abrupt); None: the kind's classic ramp."""

    def __post_init__(self) -> None:
        if not self.magnitude > 0:
            raise ValueError(f"fault magnitude must be > 0, got {self.magnitude}")
        if self.ramp_s is not None and not self.ramp_s >= 0:
            raise ValueError(f"fault ramp_s must be >= 0 or None, got {self.ramp_s}")

    def active(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    @property
    def ramp_seconds(self) -> float:
        """Seconds from the start to full size, the classic ramp resolved (what labels say)."""
        if self.ramp_s is not None:
            return float(self.ramp_s)
        length = self.end_s - self.start_s
        if self.kind is FaultKind.COOLING_RACK:
            return min(120.0, 0.3 * length)
        if self.kind is FaultKind.THERMAL_RUNAWAY:
            return 0.6 * length
        if self.kind is FaultKind.HOT_IDLE:
            return min(300.0, 0.6 * length)
        return 0.0

    def level(self, t_s: float, dt_s: float) -> float:
        """How far the fault has ramped at ``t_s``: 0 at its start, 1 from ``ramp_seconds``."""
        if self.ramp_s is None:
            if self.kind not in _RAMPS_BY_DEFAULT:
                return 1.0
            return min(1.0, (t_s - self.start_s) / max(self.ramp_seconds, dt_s))
        if self.ramp_s <= 0:
            return 1.0
        return min(1.0, (t_s - self.start_s) / self.ramp_s)

    def labels(self, visible_s: Mapping[tuple[float, int], float] | None = None
               ) -> list[dict[str, Any]]:
        """One label per GPU; with ``visible_s`` (a model's record, see
        :data:`STUCK_VISIBLE_C`) a stuck sensor's labels also say when it showed."""
        ramp = self.ramp_seconds
        shows = visible_s is not None and self.kind is FaultKind.STUCK_SENSOR
        out: list[dict[str, Any]] = []
        for g in self.gpus:
            lab: dict[str, Any] = {"gpu": g, "kind": self.kind.value, "start_s": self.start_s,
                                   "end_s": self.end_s, "magnitude": self.magnitude,
                                   "ramp_s": ramp}
            if shows and visible_s is not None:
                lab["visible_s"] = visible_s.get((self.start_s, g))
            out.append(lab)
        return out


def labels_of(faults: Sequence[Fault],
              visible_s: Mapping[tuple[float, int], float] | None = None
              ) -> list[dict[str, Any]]:
    """The ground truth: one object per affected GPU, ordered by start then GPU (with
    ``visible_s``, stuck sensors' labels say when the freeze first showed)."""
    out = [lab for f in faults for lab in f.labels(visible_s)]
    out.sort(key=lambda lab: (lab["start_s"], lab["gpu"]))
    return out


def write_labels(path: str | Path, faults: Sequence[Fault]) -> None:
    Path(path).write_text(json.dumps(labels_of(faults), indent=1) + "\n")


def read_labels(path: str | Path) -> list[dict[str, Any]]:
    """Read a labels file back, checking each object's fields (for the benchmarks)."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"{path}: labels must be a JSON list")
    kinds = {k.value for k in FaultKind}
    for i, lab in enumerate(data):
        if (not isinstance(lab, dict) or type(lab.get("gpu")) is not int
                or lab.get("kind") not in kinds
                or not isinstance(lab.get("start_s"), int | float)
                or not isinstance(lab.get("end_s"), int | float)):
            raise ValueError(f"{path}: label {i} is not {{gpu, kind, start_s, end_s}}: {lab!r}")
        magnitude = lab.setdefault("magnitude", 1.0)
        ramp = lab.setdefault("ramp_s", None)
        if (not isinstance(magnitude, int | float) or isinstance(magnitude, bool)
                or not (ramp is None or isinstance(ramp, int | float))):
            raise ValueError(f"{path}: label {i} has a bad magnitude or ramp_s: {lab!r}")
        visible = lab.get("visible_s")
        if visible is not None and (not isinstance(visible, int | float)
                                    or isinstance(visible, bool)):
            raise ValueError(f"{path}: label {i} has a bad visible_s: {lab!r}")
    return data


class _Picker:
    """Chooses the GPUs of planned faults so that no two faults share a GPU.

    Single-GPU faults take the next free GPU of a seeded permutation; a cooling fault takes a
    rack with no other faulted GPU; a hot_idle fault takes a GPU whose whole node is free and
    keeps the node for itself (it pins the node idle, which another fault would fight).
    """

    def __init__(self, topology: Topology, rng: np.random.Generator, count: int) -> None:
        self.topo = topology
        self.count = count
        self.used = np.zeros(topology.gpus, dtype=bool)
        self.candidates = rng.permutation(topology.gpus).tolist()
        self.racks = rng.permutation(topology.racks).tolist()

    def take(self, kind: FaultKind) -> npt.NDArray[np.intp]:
        topo, used = self.topo, self.used
        if kind is FaultKind.COOLING_RACK:
            free = [g for r in self.racks
                    if (g := topo.gpus_of_rack(r)).size and not used[g].any()]
            if not free:
                raise ValueError(f"no rack left without another fault for {self.count} faults")
            gpus = free[0]
            self.racks = [r for r in self.racks
                          if not np.isin(topo.gpus_of_rack(r), gpus).any()]
            used[gpus] = True
            return gpus
        if kind is FaultKind.HOT_IDLE:
            gpn = topo.gpn
            gi = next((c for c in self.candidates
                       if not used[c // gpn * gpn : c // gpn * gpn + gpn].any()), None)
            if gi is None:
                raise ValueError(f"no node left without another fault for {self.count} faults")
            used[gi // gpn * gpn : gi // gpn * gpn + gpn] = True
            return np.array([gi])
        gi = next((c for c in self.candidates if not used[c]), None)
        if gi is None:
            raise ValueError(f"{self.count} faults do not fit in {topo.gpus} GPUs")
        used[gi] = True
        return np.array([gi])


def plan_faults(
    topology: Topology,
    count: int,
    duration_s: float,
    hz: float,
    seed: int,
    kinds: Sequence[FaultKind | str] | None = None,
) -> list[Fault]:
    """Choose ``count`` faults for a run of ``duration_s`` seconds, deterministically.

    Kinds cycle through ``kinds`` (default: the eight :data:`CLASSIC_KINDS`) in a seeded
    order, so any ``count >= len(kinds)`` includes every kind. Faults never share a GPU (a
    cooling fault takes a rack with no other faulted GPU), start after the first 20 % of the
    run (the detector's warm-up) and end before it does, except fallen_off_bus, which lasts to
    the end. Times fall on tick boundaries. Every fault has the classic size and ramp
    (magnitude 1.0, ``ramp_s`` None); :func:`plan_zoo_faults` varies both.
    """
    if count <= 0:
        return []
    pool = [FaultKind(k) for k in kinds] if kinds else list(CLASSIC_KINDS)
    if duration_s * hz < 10:
        raise ValueError("faults need a run of at least 10 ticks")
    rng = np.random.default_rng([seed, 0xFA17])
    order = rng.permutation(len(pool))
    chosen = [pool[order[i % len(pool)]] for i in range(count)]
    picker = _Picker(topology, rng, count)
    tick = 1.0 / hz

    def snap(s: float) -> float:
        # k / hz exactly as the model computes tick times, so boundaries agree bit for bit.
        return round(s * hz) / hz

    faults: list[Fault] = []
    for kind in chosen:
        gpus = picker.take(kind)
        start = snap(rng.uniform(0.2, 0.6) * duration_s)
        length = min(TYPICAL_DURATION_S[kind], 0.3 * duration_s) * rng.uniform(0.7, 1.0)
        if np.isinf(TYPICAL_DURATION_S[kind]):
            end = snap(duration_s)
        else:
            end = snap(min(start + length, duration_s * 0.95))
        end = max(end, snap(start + 2 * tick))
        faults.append(Fault(kind, tuple(int(x) for x in gpus), start, end))
    return faults


ZOO_MAGNITUDES: Final[dict[FaultKind, tuple[float, ...]]] = {
    FaultKind.THERMAL_RUNAWAY: (0.35, 0.6, 1.0),   # +15, +25, +42 C
    FaultKind.COOLING_RACK: (0.35, 0.6, 1.0),      # inlet +7, +13, +21 C
    FaultKind.HOT_IDLE: (0.35, 0.6, 1.0),          # +9, +15, +25 C at idle
    FaultKind.ECC_STORM: (0.075, 0.3, 1.0),        # 3, 12, 40 corrected errors / s
    FaultKind.NVLINK_ERRORS: (0.05, 0.3, 1.0),     # 7.5, 45, 150 CRC errors / s
    FaultKind.STRAGGLER: (0.35, 0.6, 1.0),         # clock at 86 %, 76 %, 60 %
    FaultKind.POWER_BRAKE: (0.35, 0.6, 1.0),       # clock at 74 %, 55 %, 25 %
    FaultKind.STUCK_SENSOR: (1.0,),
    FaultKind.FALLEN_OFF_BUS: (1.0,),
}
"""Sizes :func:`plan_zoo_faults` draws from, per kind: barely visible, medium, classic.
The smallest are what the issue's detector missed (an ECC storm of ~3/s) or near it."""

STUCK_VISIBLE_C: Final = 2.0
"""Degrees the die must stand from a frozen reading before the freeze shows. A frozen
sensor on a die that does not move reads what a working one would (an idle GPU, or a cold
plate that averages a job's rhythm away): nothing in the data can tell, and nothing is
hidden from the operator yet. Two degrees is twice the coarsest sensor's step, so a working
sensor of any resolution would have shown the move. The model records when each stuck
GPU's die first stood that far off (``visible_s`` in its labels, None if never), and the
detection benchmarks count a stuck sensor among the faults to find only from then."""

ZOO_SLOW_RAMP_S: Final = (300.0, 1800.0)
"""Range of a slow fault's ramp (5-30 minutes), drawn uniformly."""

_RAMPABLE: Final = frozenset({
    FaultKind.THERMAL_RUNAWAY, FaultKind.COOLING_RACK, FaultKind.HOT_IDLE, FaultKind.ECC_STORM,
    FaultKind.NVLINK_ERRORS, FaultKind.STRAGGLER,
})
"""Kinds that can come on slowly; the rest (brake, stuck, off the bus) are events."""

EVIDENCE: Final[dict[FaultKind, tuple[str, ...]]] = {
    FaultKind.THERMAL_RUNAWAY: ("temperature_celsius",),
    FaultKind.COOLING_RACK: ("temperature_celsius",),
    FaultKind.HOT_IDLE: ("temperature_celsius",),
    FaultKind.STUCK_SENSOR: ("temperature_celsius",),
    FaultKind.ECC_STORM: ("ecc_sbe_volatile_total", "ecc_sbe_aggregate_total"),
    FaultKind.NVLINK_ERRORS: ("nvlink_crc_errors_total", "nvlink_replay_errors_total",
                              "nvlink_transmit_bytes_per_second"),
    FaultKind.STRAGGLER: ("sm_clock_hertz", "utilization_ratio"),
    FaultKind.POWER_BRAKE: ("clock_event_reasons", "sm_clock_hertz"),
    FaultKind.FALLEN_OFF_BUS: ("temperature_celsius", "power_usage_watts", "utilization_ratio"),
}
"""Metrics (``fleetpulse_gpu_`` names without the prefix) in which each kind shows first; a
profile missing all of a kind's evidence cannot show it, so the zoo does not plan it."""

REALISTIC_FAULTS_PER_1000_GPU_DAYS: Final = 0.5
"""Meta's Llama 3 run: 419 unexpected interruptions in 54 days on 16,384 H100s, ~0.5 per 1000
GPU-days (about 60 % of them GPU-related): a soak run of 1000 GPU-days mostly has none."""


def observable_kinds(missing: Sequence[str] = ()) -> tuple[FaultKind, ...]:
    """The kinds that still show when the metrics named in ``missing`` are absent."""
    gone = {m.removeprefix("fleetpulse_gpu_") for m in missing}
    return tuple(k for k in FaultKind if any(e not in gone for e in EVIDENCE[k]))


def realistic_fault_count(gpus: int, duration_s: float, seed: int,
                          per_1000_gpu_days: float = REALISTIC_FAULTS_PER_1000_GPU_DAYS) -> int:
    """How many faults a run of ``gpus`` x ``duration_s`` has at a real fleet's rate (Poisson)."""
    lam = per_1000_gpu_days * gpus * duration_s / 86_400.0 / 1000.0
    return int(np.random.default_rng([seed, 0xDE75]).poisson(lam))


def plan_zoo_faults(
    topology: Topology,
    count: int,
    duration_s: float,
    hz: float,
    seed: int,
    profile: FleetProfile | None = None,
    *,
    kinds: Sequence[FaultKind | str] | None = None,
    magnitudes: Sequence[float] | None = None,
    slow_fraction: float = 0.5,
    ramp_range_s: tuple[float, float] = ZOO_SLOW_RAMP_S,
) -> list[Fault]:
    """Choose ``count`` faults of varied size and speed, deterministically.

    Kinds cycle (seeded order) through ``kinds``, default every kind the profile's metrics can
    show (:func:`observable_kinds` of ``profile.missing``; hot_idle included; cooling_rack only
    in a fleet of two racks or more). Each fault's
    magnitude is drawn from ``magnitudes`` (default :data:`ZOO_MAGNITUDES` of its kind); with
    probability ``slow_fraction`` a rampable kind comes on over a ramp drawn from
    ``ramp_range_s``, else abruptly (``ramp_s`` 0). The window is the ramp plus a hold of the
    kind's typical duration; in a short run both shrink to fit (the ramp to at most 60 % of
    what is left). GPU choice, warm-up (start after 20 % of the run) and tick snapping are
    those of :func:`plan_faults`.
    """
    if count <= 0:
        return []
    if duration_s * hz < 10:
        raise ValueError("faults need a run of at least 10 ticks")
    if kinds:
        pool = [FaultKind(k) for k in kinds]
    else:
        pool = list(observable_kinds(profile.missing if profile is not None else ()))
        if topology.racks.size < 2:
            pool.remove(FaultKind.COOLING_RACK)  # a one-rack fleet has no peer rack
    if not pool:
        raise ValueError("no fault kind is observable with this profile's metrics")
    rng = np.random.default_rng([seed, 0x200F])
    order = rng.permutation(len(pool))
    chosen = [pool[order[i % len(pool)]] for i in range(count)]
    picker = _Picker(topology, rng, count)
    tick = 1.0 / hz

    def snap(s: float) -> float:
        return round(s * hz) / hz

    faults: list[Fault] = []
    for kind in chosen:
        gpus = picker.take(kind)
        sizes = tuple(magnitudes) if magnitudes else ZOO_MAGNITUDES[kind]
        magnitude = float(sizes[int(rng.integers(len(sizes)))])
        if kind in (FaultKind.STUCK_SENSOR, FaultKind.FALLEN_OFF_BUS):
            magnitude = 1.0
        slow = kind in _RAMPABLE and rng.random() < slow_fraction
        ramp = float(rng.uniform(*ramp_range_s)) if slow else 0.0
        start = snap(rng.uniform(0.2, 0.6) * duration_s)
        left = duration_s * 0.95 - start
        ramp = min(ramp, 0.6 * left)
        hold = min(TYPICAL_DURATION_S[kind], 0.3 * duration_s) * rng.uniform(0.7, 1.0)
        if np.isinf(TYPICAL_DURATION_S[kind]):
            end = snap(duration_s)
        else:
            end = snap(min(start + ramp + hold, duration_s * 0.95))
        end = max(end, snap(start + 2 * tick))
        faults.append(Fault(kind, tuple(int(x) for x in gpus), start, end, magnitude,
                            round(ramp, 3)))
    return faults

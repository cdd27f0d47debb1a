"""Injected faults and their ground truth.

A fault is (kind, GPUs, start, end) in seconds since the first sample; the model applies it
while ``start_s <= t < end_s`` and the same object writes the labels, so the labels cannot
disagree with what was injected. Labels file: a JSON list with one object per affected GPU::

    {"gpu": 1234, "kind": "cooling_rack", "start_s": 120.0, "end_s": 600.0}

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
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any, Final

import numpy as np

from agent.fleet.topology import Topology

__all__ = ["Fault", "FaultKind", "labels_of", "plan_faults", "read_labels", "write_labels"]


class FaultKind(StrEnum):
    THERMAL_RUNAWAY = "thermal_runaway"
    COOLING_RACK = "cooling_rack"
    ECC_STORM = "ecc_storm"
    POWER_BRAKE = "power_brake"
    STUCK_SENSOR = "stuck_sensor"
    STRAGGLER = "straggler"
    NVLINK_ERRORS = "nvlink_errors"
    FALLEN_OFF_BUS = "fallen_off_bus"


TYPICAL_DURATION_S: Final[dict[FaultKind, float]] = {
    FaultKind.THERMAL_RUNAWAY: 600.0,
    FaultKind.COOLING_RACK: 900.0,
    FaultKind.ECC_STORM: 300.0,
    FaultKind.POWER_BRAKE: 180.0,
    FaultKind.STUCK_SENSOR: 900.0,
    FaultKind.STRAGGLER: 900.0,
    FaultKind.NVLINK_ERRORS: 300.0,
    FaultKind.FALLEN_OFF_BUS: float("inf"),
}
"""How long each kind lasts in a long run; short runs scale it down."""

NEEDS_LOAD: Final = frozenset(
    {FaultKind.THERMAL_RUNAWAY, FaultKind.POWER_BRAKE, FaultKind.STRAGGLER}
)
"""Kinds that only show under load: the model keeps their node training meanwhile."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault. ``gpus`` are global indices, ``end_s`` is exclusive."""

    kind: FaultKind
    gpus: tuple[int, ...]
    start_s: float
    end_s: float

    def active(self, t_s: float) -> bool:
        return self.start_s <= t_s < self.end_s

    def labels(self) -> list[dict[str, Any]]:
        return [{"gpu": g, "kind": self.kind.value, "start_s": self.start_s,
                 "end_s": self.end_s} for g in self.gpus]


def labels_of(faults: Sequence[Fault]) -> list[dict[str, Any]]:
    """The ground truth: one object per affected GPU, ordered by start then GPU."""
    out = [lab for f in faults for lab in f.labels()]
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
    return data


def plan_faults(
    topology: Topology,
    count: int,
    duration_s: float,
    hz: float,
    seed: int,
    kinds: Sequence[FaultKind | str] | None = None,
) -> list[Fault]:
    """Choose ``count`` faults for a run of ``duration_s`` seconds, deterministically.

    Kinds cycle through ``kinds`` (default: all eight) in a seeded order, so any
    ``count >= len(kinds)`` includes every kind. Faults never share a GPU (a cooling fault
    takes a rack with no other faulted GPU), start after the first 20 % of the run (the
    detector's warm-up) and end before it does, except fallen_off_bus, which lasts to the
    end. Times fall on tick boundaries.
    """
    if count <= 0:
        return []
    pool = [FaultKind(k) for k in kinds] if kinds else list(FaultKind)
    if duration_s * hz < 10:
        raise ValueError("faults need a run of at least 10 ticks")
    rng = np.random.default_rng([seed, 0xFA17])
    order = rng.permutation(len(pool))
    chosen = [pool[order[i % len(pool)]] for i in range(count)]
    used = np.zeros(topology.gpus, dtype=bool)
    candidates = iter(rng.permutation(topology.gpus).tolist())
    racks = rng.permutation(topology.racks).tolist()
    tick = 1.0 / hz

    def snap(s: float) -> float:
        # k / hz exactly as the model computes tick times, so boundaries agree bit for bit.
        return round(s * hz) / hz

    faults: list[Fault] = []
    for kind in chosen:
        if kind is FaultKind.COOLING_RACK:
            free = [g for r in racks
                    if (g := topology.gpus_of_rack(r)).size and not used[g].any()]
            if not free:
                raise ValueError(f"no rack left without another fault for {count} faults")
            gpus = free[0]
            racks = [r for r in racks if not np.isin(topology.gpus_of_rack(r), gpus).any()]
        else:
            gi = next((c for c in candidates if not used[c]), None)
            if gi is None:
                raise ValueError(f"{count} faults do not fit in {topology.gpus} GPUs")
            gpus = np.array([gi])
        used[gpus] = True
        start = snap(rng.uniform(0.2, 0.6) * duration_s)
        length = min(TYPICAL_DURATION_S[kind], 0.3 * duration_s) * rng.uniform(0.7, 1.0)
        if np.isinf(TYPICAL_DURATION_S[kind]):
            end = snap(duration_s)
        else:
            end = snap(min(start + length, duration_s * 0.95))
        end = max(end, snap(start + 2 * tick))
        faults.append(Fault(kind, tuple(int(x) for x in gpus), start, end))
    return faults

"""Per-GPU feature vectors, computed columnar over every GPU of a block at once.

The forest sees ``len(FEATURES)`` numbers per GPU and step (the engine shingles them over
recent steps). Each feature is scaled to a *physical unit*: one unit is a change an SRE
would notice (5 degC, a fifth of the power limit, ...). Fixed units rather than per-GPU
standardisation keep a slow level shift visible (a running z-score would normalise it
away) and make attributions comparable across GPUs. Random Cut Forest chooses cut
dimensions in proportion to their range, so balanced units also keep one noisy feature
from drowning the others.

Features (``FEATURES`` order; a metric that is not sampled makes its feature 0, so the
detector works on any subset of the catalog). Features that swing with the workload get
coarse units, features that are near 0 on a healthy GPU (residuals, peer deviations, error
counters) fine ones: RCF isolates a point by cutting the dimensions in proportion to their
range, so a residual that is normally flat must not be drowned by utilisation's swings.

===================  ===========================================================================
temperature          GPU die temperature, ``(T - 30) / 10`` (1 unit = 10 degC)
memory_temperature   HBM temperature, same scale
temp_residual        die temperature minus what this GPU's own history predicts from its
                     (smoothed) power draw, ``/ 2`` (1 unit = 2 degC). Exponentially weighted
                     least squares per GPU; catches cooling trouble and a stuck sensor that
                     raw temperature hides under workload swings.
power                power draw / enforced limit * 2.5 (1 unit = 40 % of the limit; 500 W
                     assumed when the limit is not sampled)
utilization          GPU utilisation * 2.5 (1 unit = 40 %). With temperature in the same
                     vector, "hot while training" and "hot while idle" land in different
                     regions.
sm_clock             SM clock / the highest clock this GPU has shown * 2.5 (1 unit = 40 %)
util_vs_node         utilisation minus the median of the GPUs of the same node * 20: a
                     straggler is pinned at 100 % while its peers wait for it
power_vs_node        power fraction minus the node median * 20
throttle             clock-event reason bits: 2 for a hardware slowdown (HW slowdown,
                     HW thermal, HW power brake), 1 for software thermal slowdown, else 0
ecc_sbe_increase     ``2 * log1p(increase / 4)`` of the volatile single-bit ECC counter: a
                     lone corrected error (routine) is small, a storm of dozens is large
link_error_increase  the same of NVLink CRC + replay + recovery and PCIe replay counters
===================  ===========================================================================

Counters are differenced per GPU; a reset (value below the previous) counts as no increase.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numba
import numpy as np
import numpy.typing as npt

from schemas.catalog import BY_NAME

__all__ = [
    "FEATURES",
    "GATHERED",
    "THROTTLE_HW_BITS",
    "THROTTLE_SW_THERMAL",
    "FeatureState",
    "gather",
    "group_median",
]


@dataclass(frozen=True, slots=True)
class Feature:
    name: str
    metric: str
    """The catalog metric an alert names when this feature is the one that moved."""


def _m(name: str) -> str:
    full = f"fleetpulse_gpu_{name}"
    if full not in BY_NAME:
        raise AssertionError(f"{full} is not in the catalog")
    return full


FEATURES: Final[tuple[Feature, ...]] = (
    Feature("temperature", _m("temperature_celsius")),
    Feature("memory_temperature", _m("memory_temperature_celsius")),
    Feature("temp_residual", _m("temperature_celsius") + ":residual_vs_power"),
    Feature("power", _m("power_usage_watts")),
    Feature("utilization", _m("utilization_ratio")),
    Feature("sm_clock", _m("sm_clock_hertz")),
    Feature("util_vs_node", _m("utilization_ratio") + ":vs_node_median"),
    Feature("power_vs_node", _m("power_usage_watts") + ":vs_node_median"),
    Feature("throttle", _m("clock_event_reasons")),
    Feature("ecc_sbe_increase", _m("ecc_sbe_volatile_total")),
    Feature("link_error_increase", _m("nvlink_crc_errors_total") + "+replays"),
)

# The catalog metrics the detector reads, in the column order of ``gather``'s output.
GATHERED: Final[tuple[str, ...]] = tuple(
    _m(n)
    for n in (
        "temperature_celsius",  # 0
        "memory_temperature_celsius",  # 1
        "power_usage_watts",  # 2
        "power_limit_watts",  # 3
        "utilization_ratio",  # 4
        "sm_clock_hertz",  # 5
        "clock_event_reasons",  # 6
        "ecc_sbe_volatile_total",  # 7
        "ecc_dbe_volatile_total",  # 8
        "nvlink_crc_errors_total",  # 9
        "nvlink_replay_errors_total",  # 10
        "nvlink_recovery_errors_total",  # 11
        "pcie_replay_errors_total",  # 12
        "row_remap_failure",  # 13
        "xid",  # 14
        "ecc_dbe_aggregate_total",  # 15
    )
)
COL: Final = {name.removeprefix("fleetpulse_gpu_"): i for i, name in enumerate(GATHERED)}
_GATHER_INDEX = np.full(max(m.id for m in BY_NAME.values()) + 1, -1, dtype=np.int64)
for _i, _name in enumerate(GATHERED):
    _GATHER_INDEX[BY_NAME[_name].id] = _i

THROTTLE_HW_BITS: Final = 0x08 | 0x40 | 0x80
"""nvmlClocksEventReason HwSlowdown | HwThermalSlowdown | HwPowerBrakeSlowdown."""
THROTTLE_SW_THERMAL: Final = 0x20
"""nvmlClocksEventReasonSwThermalSlowdown."""

# Counters differenced per GPU, as columns of ``gather``'s output.
COUNTER_COLS: Final = (7, 8, 9, 10, 11, 12, 15)

_RESID_ALPHA: Final = 1.0 / 3600.0
"""Weight of one step in the temperature-on-power regression (an hour's memory at 1 Hz)."""
_POWER_SMOOTH: Final = 1.0 / 15.0
"""Power is smoothed (about 15 steps) before regressing: the die lags the power draw."""
_RESID_WARMUP: Final = 120
"""Steps before the residual is reported (0 until then)."""


def gather(
    values: npt.NDArray[np.float64], metric_ids: npt.NDArray[np.integer]
) -> npt.NDArray[np.float64]:
    """Pick the detector's metrics out of a frame's ``(T, G, M)`` values.

    Returns ``(T, G, len(GATHERED))`` with NaN where the frame does not carry a metric.
    """
    t, g = values.shape[:2]
    out = np.full((t, g, len(GATHERED)), np.nan)
    ids = np.asarray(metric_ids, dtype=np.int64)
    ok = ids < len(_GATHER_INDEX)
    cols = np.full(len(ids), -1, dtype=np.int64)
    cols[ok] = _GATHER_INDEX[ids[ok]]
    src = np.flatnonzero(cols >= 0)
    out[:, :, cols[src]] = values[:, :, src]
    return out


@numba.njit(cache=True)
def _group_median(values: npt.NDArray[np.float64], groups: npt.NDArray[np.int64]
                  ) -> npt.NDArray[np.float64]:  # pragma: no cover - compiled
    n = values.shape[0]
    out = np.full(n, np.nan)
    start = 0
    while start < n:
        end = start + 1
        while end < n and groups[end] == groups[start]:
            end += 1
        seg = values[start:end]
        finite = seg[np.isfinite(seg)]
        if finite.size:
            med = np.median(finite)
            for i in range(start, end):
                out[i] = med
        start = end
    return out


def group_median(
    values: npt.NDArray[np.float64], groups: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """Median of the finite ``values`` of each run of equal ``groups`` (groups contiguous)."""
    return _group_median(np.ascontiguousarray(values, dtype=np.float64),
                         np.ascontiguousarray(groups, dtype=np.int64))


class FeatureState:
    """What features need to remember per GPU (model id): previous counters, the power
    smoother, the temperature-on-power regression, the highest clock."""

    ARRAYS: Final = ("prev_counters", "power_ema", "rs_n", "rs_mx", "rs_my", "rs_vxx",
                     "rs_vxy", "max_clock")

    def __init__(self) -> None:
        self.n = 0
        self.prev_counters = np.zeros((0, len(COUNTER_COLS)))
        self.power_ema = np.zeros(0)
        self.rs_n = np.zeros(0)
        self.rs_mx = np.zeros(0)
        self.rs_my = np.zeros(0)
        self.rs_vxx = np.zeros(0)
        self.rs_vxy = np.zeros(0)
        self.max_clock = np.zeros(0)

    def ensure(self, n: int) -> None:
        if n <= self.n:
            return
        extra = n - self.n
        for name in self.ARRAYS:
            arr = getattr(self, name)
            fill = np.nan if name in ("prev_counters", "power_ema") else 0.0
            pad = np.full((extra, *arr.shape[1:]), fill)
            setattr(self, name, np.concatenate([arr, pad]))
        self.n = n

    def state_arrays(self) -> dict[str, npt.NDArray[np.float64]]:
        return {f"features.{name}": getattr(self, name)[: self.n].copy() for name in self.ARRAYS}

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.float64]], n: int) -> None:
        self.n = 0
        self.__init__()  # type: ignore[misc]
        self.ensure(n)
        for name in self.ARRAYS:
            getattr(self, name)[:] = arrays[f"features.{name}"]

    def step(
        self,
        ids: npt.NDArray[np.int64],
        row: npt.NDArray[np.float64],
        node_groups: npt.NDArray[np.int64],
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float64]]:
        """Features of one step for GPUs ``ids`` from their gathered metrics ``row`` (G, K).

        ``node_groups`` labels GPUs of the same node (contiguous runs) for the peer features.
        Returns (features (G, D) float32, counter increases (G, len(COUNTER_COLS))).
        """
        g = len(ids)
        feats = np.zeros((g, len(FEATURES)), dtype=np.float64)
        temp = row[:, COL["temperature_celsius"]]
        power = row[:, COL["power_usage_watts"]]
        limit = row[:, COL["power_limit_watts"]]
        util = row[:, COL["utilization_ratio"]]
        clock = row[:, COL["sm_clock_hertz"]]

        feats[:, 0] = (temp - 30.0) / 10.0
        feats[:, 1] = (row[:, COL["memory_temperature_celsius"]] - 30.0) / 10.0
        pfrac = power / np.where(np.isfinite(limit) & (limit > 0), limit, 500.0)
        feats[:, 3] = pfrac * 2.5
        feats[:, 4] = util * 2.5

        # SM clock relative to the highest this GPU has shown.
        mc = np.fmax(self.max_clock[ids], np.where(np.isfinite(clock), clock, 0.0))
        self.max_clock[ids] = mc
        feats[:, 5] = np.where(mc > 0, clock / np.where(mc > 0, mc, 1.0), np.nan) * 2.5

        # Peers on the same node.
        feats[:, 6] = (util - group_median(util, node_groups)) * 20.0
        feats[:, 7] = (pfrac - group_median(pfrac, node_groups)) * 20.0

        bits = row[:, COL["clock_event_reasons"]]
        ibits = np.where(np.isfinite(bits), bits, 0.0).astype(np.int64)
        feats[:, 8] = np.where(
            ibits & THROTTLE_HW_BITS, 2.0, np.where(ibits & THROTTLE_SW_THERMAL, 1.0, 0.0)
        )

        # Counter increases (reset or first sight -> 0).
        cur = row[:, list(COUNTER_COLS)]
        prev = self.prev_counters[ids]
        inc = cur - prev
        inc = np.where(np.isfinite(inc) & (inc > 0), inc, 0.0)
        self.prev_counters[ids] = np.where(np.isfinite(cur), cur, prev)
        feats[:, 9] = np.log1p(inc[:, 0] / 4.0) * 2.0
        feats[:, 10] = np.log1p(inc[:, 2:6].sum(axis=1) / 4.0) * 2.0

        feats[:, 2] = self._residual(ids, temp, power) / 2.0
        np.nan_to_num(feats, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        return feats.astype(np.float32), inc

    def _residual(
        self, ids: npt.NDArray[np.int64], temp: npt.NDArray[np.float64],
        power: npt.NDArray[np.float64],
    ) -> npt.NDArray[np.float64]:
        """Temperature minus the per-GPU linear prediction from smoothed power, then learn.

        The prediction is made before learning the step, so a sudden jump shows in full.
        """
        ok = np.isfinite(temp) & np.isfinite(power)
        ema = self.power_ema[ids]
        ema = np.where(np.isfinite(ema), ema + _POWER_SMOOTH * (power - ema), power)
        ema = np.where(ok, ema, self.power_ema[ids])
        self.power_ema[ids] = ema
        n = self.rs_n[ids]
        mx, my = self.rs_mx[ids], self.rs_my[ids]
        vxx, vxy = self.rs_vxx[ids], self.rs_vxy[ids]
        slope = np.where(vxx > 1e-6, vxy / np.where(vxx > 1e-6, vxx, 1.0), 0.0)
        slope = np.clip(slope, 0.0, 1.0)  # degC per watt: physical, never negative
        pred = my + slope * (ema - mx)
        resid = np.where(ok & (n >= _RESID_WARMUP), temp - pred, 0.0)
        # Learn (only where both readings exist).
        a = np.maximum(1.0 / (n + 1.0), _RESID_ALPHA)
        x = np.where(ok, ema, mx)
        y = np.where(ok, temp, my)
        dx, dy = x - mx, y - my
        mx = mx + a * dx
        my = my + a * dy
        vxx = (1 - a) * (vxx + a * dx * dx)
        vxy = (1 - a) * (vxy + a * dx * dy)
        self.rs_mx[ids] = np.where(ok, mx, self.rs_mx[ids])
        self.rs_my[ids] = np.where(ok, my, self.rs_my[ids])
        self.rs_vxx[ids] = np.where(ok, vxx, self.rs_vxx[ids])
        self.rs_vxy[ids] = np.where(ok, vxy, self.rs_vxy[ids])
        self.rs_n[ids] = n + ok
        return resid

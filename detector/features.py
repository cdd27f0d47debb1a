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
temp_residual        die temperature minus what this GPU's own thermal response predicts
                     from its power draw (``detector.thermal_model``: the best of a few
                     candidate lags, regressed over an hour), ``/ 2`` (1 unit = 2 degC);
                     catches cooling trouble that raw temperature hides under workload swings.
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

from detector.state_arrays import grow_rows
from detector.thermal_model import TAUS_S, ThermalModels
from schemas.catalog import BY_NAME

__all__ = [
    "FEATURES",
    "GATHERED",
    "LOAD_MIN_W",
    "LOAD_SHARE",
    "LOAD_UTIL",
    "THROTTLE_HW_BITS",
    "THROTTLE_SW_THERMAL",
    "FeatureState",
    "RuleContext",
    "evidence_rate",
    "follow_floor",
    "gather",
    "gather_evidence",
    "group_median",
    "group_quantile",
    "held_since",
    "node_median",
    "same_load_median",
    "same_load_peers",
    "same_peers_moved",
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


@dataclass(frozen=True, slots=True)
class RuleContext:
    """What the feature state knows of one step's GPUs that the health rules judge by."""

    predicted_c: npt.NDArray[np.float64]
    """The die temperature each GPU's thermal model predicts (NaN: none yet)."""
    candidates_c: npt.NDArray[np.float64]
    """(G, lags) every candidate lag's prediction (NaN where none is given) ..."""
    plausible: npt.NDArray[np.bool_]
    """... and which of the lags the GPU's history cannot rule out (``ThermalModels.step``)."""
    error_c: npt.NDArray[np.float64]
    """That model's recent prediction error (RMS, degC)."""
    excess_c: npt.NDArray[np.float64]
    """Reading minus prediction, less the node peers' median of the same where that is
    positive (heat the node shares; NaN: none yet) ..."""
    lag_excess_c: npt.NDArray[np.float64]
    """... and the same (G, lags) for every candidate lag's prediction."""
    clock_ref_hz: npt.NDArray[np.float64]
    """The SM clock the GPU should run at: the median of its node's busy peers, or (with
    fewer than two of them) the highest clock the GPU itself has shown."""
    power_bin: npt.NDArray[np.int64]
    """The band of smoothed power the GPU is in (``detector.thermal_model``) ..."""
    dwell_s: npt.NDArray[np.float64]
    """... and how many seconds its thermal model has learned in that band."""
    node: npt.NDArray[np.intp]
    """Which node of this step each GPU is on (0..nodes-1), for judging a GPU by its peers."""
    power_smoothed_w: npt.NDArray[np.float64]
    """(G, lags) each GPU's power smoothed with every candidate lag (the thermal models'
    own): the heat its die has taken in over each time scale it may follow ..."""
    power_w: npt.NDArray[np.float64]
    """... and with the lag its model chose (W), the measure of ``power_bin``."""
    tau_s: npt.NDArray[np.float64]
    """The lag each GPU's thermal model chose (s): how fast its die follows its heat."""


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
def _group_quantile(values: npt.NDArray[np.float64], groups: npt.NDArray[np.int64], q: float
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
            v = np.quantile(finite, q)
            for i in range(start, end):
                out[i] = v
        start = end
    return out


def group_quantile(
    values: npt.NDArray[np.float64], groups: npt.NDArray[np.int64], q: float
) -> npt.NDArray[np.float64]:
    """The ``q`` quantile (linear between order statistics) of the finite ``values`` of each
    run of equal ``groups`` (groups contiguous), on every row of the run; NaN for a run
    with none."""
    return _group_quantile(np.ascontiguousarray(values, dtype=np.float64),
                           np.ascontiguousarray(groups, dtype=np.int64), float(q))


def group_median(
    values: npt.NDArray[np.float64], groups: npt.NDArray[np.int64]
) -> npt.NDArray[np.float64]:
    """Median of the finite ``values`` of each run of equal ``groups`` (groups contiguous)."""
    return group_quantile(values, groups, 0.5)


LOAD_SHARE: Final = 0.2
LOAD_MIN_W: Final = 50.0
"""Two GPUs run one load where their power is within ``LOAD_SHARE`` of the judged one's,
``LOAD_MIN_W`` at least (idle draws differ by tens of watts) ..."""
LOAD_UTIL: Final = 0.15
"""... or, where either reads no power, their utilisation is within this."""


@numba.njit(cache=True)
def _alike(loads: npt.NDArray[np.float64], util: npt.NDArray[np.float64], use_util: bool,
           g: int, h: int) -> bool:  # pragma: no cover - compiled
    """Whether GPU ``h`` runs GPU ``g``'s load (``same_load_median`` says how)."""
    if np.isfinite(loads[g, 0]) and np.isfinite(loads[h, 0]):
        for k in range(loads.shape[1]):
            w = loads[g, k]
            if not abs(loads[h, k] - w) <= max(LOAD_SHARE * abs(w), LOAD_MIN_W):
                return False
        return True
    return use_util and abs(util[h] - util[g]) <= LOAD_UTIL


@numba.njit(cache=True)
def _same_load_median(temp: npt.NDArray[np.float64], loads: npt.NDArray[np.float64],
                      util: npt.NDArray[np.float64], use_util: bool,
                      order: npt.NDArray[np.int64], starts: npt.NDArray[np.int64],
                      out: npt.NDArray[np.float64]) -> None:  # pragma: no cover - compiled
    buf = np.empty(order.shape[0])
    for n in range(starts.shape[0] - 1):
        lo, hi = starts[n], starts[n + 1]
        for i in range(lo, hi):
            g = order[i]
            m = 0
            for j in range(lo, hi):
                h = order[j]
                if np.isfinite(temp[h]) and _alike(loads, util, use_util, g, h):
                    buf[m] = temp[h]
                    m += 1
            if m >= 3:
                part = np.sort(buf[:m])
                out[g] = 0.5 * (part[(m - 1) // 2] + part[m // 2])
            else:
                out[g] = np.nan


@numba.njit(cache=True)
def _same_load_peers(temp: npt.NDArray[np.float64], loads: npt.NDArray[np.float64],
                     ids: npt.NDArray[np.int64], slot: npt.NDArray[np.int64],
                     order: npt.NDArray[np.int64], starts: npt.NDArray[np.int64],
                     peer_ids: npt.NDArray[np.int64], peer_c: npt.NDArray[np.float64]
                     ) -> None:  # pragma: no cover - compiled
    none = np.zeros(1)
    for n in range(starts.shape[0] - 1):
        lo, hi = starts[n], starts[n + 1]
        for i in range(lo, hi):
            g = order[i]
            if slot[g] < 0:
                continue
            m = 0
            for j in range(lo, hi):
                h = order[j]
                if (h != g and m < peer_ids.shape[1] and np.isfinite(temp[h])
                        and _alike(loads, none, False, g, h)):
                    peer_ids[slot[g], m] = ids[h] + 1
                    peer_c[slot[g], m] = temp[h]
                    m += 1


@numba.njit(cache=True)
def _same_peers_moved(temp: npt.NDArray[np.float64], loads: npt.NDArray[np.float64],
                      ids: npt.NDArray[np.int64], row_of: npt.NDArray[np.int64],
                      which: npt.NDArray[np.bool_], peer_ids: npt.NDArray[np.int64], peer_c: npt.NDArray[np.float64],
                      went: npt.NDArray[np.float64], level: npt.NDArray[np.float64]
                      ) -> None:  # pragma: no cover - compiled
    none = np.zeros(1)
    moved = np.empty(peer_ids.shape[1] + 1)
    now = np.empty(peer_ids.shape[1] + 1)
    for g in range(temp.shape[0]):
        if not which[g] or not np.isfinite(temp[g]):
            continue
        moved[0] = 0.0
        now[0] = temp[g]
        m = 1
        for k in range(peer_ids.shape[1]):
            pid = peer_ids[ids[g], k] - 1
            if pid < 0:
                break
            h = row_of[pid] if pid < row_of.shape[0] else -1
            if h >= 0 and np.isfinite(temp[h]) and _alike(loads, none, False, g, h):
                moved[m] = temp[h] - peer_c[ids[g], k]
                now[m] = temp[h]
                m += 1
        if m >= 3:
            part = np.sort(moved[:m])
            went[g] = 0.5 * (part[(m - 1) // 2] + part[m // 2])
            part = np.sort(now[:m])
            level[g] = 0.5 * (part[(m - 1) // 2] + part[m // 2])


def _by_node(node: npt.NDArray[np.intp]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The GPUs in node order, and where each node's run of them starts (and the last ends)."""
    order = np.argsort(node, kind="stable").astype(np.int64)
    starts = np.concatenate([[0], np.cumsum(np.bincount(node))]).astype(np.int64)
    return order, starts


def same_load_median(temp: npt.NDArray[np.float64], loads: npt.NDArray[np.float64],
                     util: npt.NDArray[np.float64] | None, node: npt.NDArray[np.intp]
                     ) -> npt.NDArray[np.float64]:
    """Each GPU's median die temperature over its node's GPUs (itself included) that run its
    load: power within a fifth of its own (50 W at least) in every column of ``loads``
    (G, k: power now, or also smoothed over time scales), or, where either reads no power
    now, utilisation within 15 points (``util`` None: such GPUs are not alike); NaN with
    fewer than three of them (two cannot outvote each other).

    Unlike a node's median over the GPUs at its typical load, this is each GPU's own load,
    so a node half idle and half training gives each half its own."""
    out = np.full(len(node), np.nan)
    if len(node) == 0:
        return out
    order, starts = _by_node(node)
    _same_load_median(np.ascontiguousarray(temp, dtype=np.float64),
                      np.ascontiguousarray(loads, dtype=np.float64),
                      np.ascontiguousarray(np.zeros(len(node)) if util is None else util,
                                           dtype=np.float64),
                      util is not None, order, starts, out)
    return out


PEERS_KEPT: Final = 15
"""How many node peers ``same_load_peers`` keeps for a GPU: all of a 16-GPU node's."""


def same_load_peers(temp: npt.NDArray[np.float64], loads: npt.NDArray[np.float64],
                    node: npt.NDArray[np.intp], ids: npt.NDArray[np.int64],
                    which: npt.NDArray[np.bool_]
                    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """For each GPU where ``which`` (one row each, in order), the node peers (itself not
    counted, ``PEERS_KEPT`` at most) that run its load at every time scale of ``loads`` as
    ``same_load_median`` reads it: their ``ids`` + 1 (0: no more) and their readings now,
    for ``same_peers_moved`` to follow the same dies later."""
    slot = np.cumsum(which) - 1
    slot = np.where(which, slot, -1).astype(np.int64)
    k = int(which.sum())
    peer_ids = np.zeros((k, PEERS_KEPT), dtype=np.int64)
    peer_c = np.full((k, PEERS_KEPT), np.nan)
    if k:
        order, starts = _by_node(node)
        _same_load_peers(np.ascontiguousarray(temp, dtype=np.float64),
                         np.ascontiguousarray(loads, dtype=np.float64),
                         np.ascontiguousarray(ids, dtype=np.int64), slot, order, starts,
                         peer_ids, peer_c)
    return peer_ids, peer_c


def same_peers_moved(temp: npt.NDArray[np.float64], loads: npt.NDArray[np.float64],
                     ids: npt.NDArray[np.int64], which: npt.NDArray[np.bool_],
                     peer_ids: npt.NDArray[np.int64], peer_c: npt.NDArray[np.float64]
                     ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """How far the peers ``same_load_peers`` kept for each GPU where ``which`` have moved
    since, and where they stand: the median of their changes and of their readings now,
    over those in this step that still run its load, the GPU itself counted as unmoved
    (NaN with fewer than three in all). ``peer_ids`` and ``peer_c`` are indexed by id (the
    rows of ``ids``), as a rule book keeps them.

    The same dies, before and after: a median over whichever GPUs run a load now changes
    with its membership, and seats of one node differ by degrees, so stages of a pipeline
    that take turns at a power move that median with no die moving at all."""
    went = np.full(len(temp), np.nan)
    level = np.full(len(temp), np.nan)
    if len(temp) and which.any():
        row_of = np.full(int(ids.max()) + 1, -1, dtype=np.int64)
        row_of[ids] = np.arange(len(ids))
        _same_peers_moved(np.ascontiguousarray(temp, dtype=np.float64),
                          np.ascontiguousarray(loads, dtype=np.float64),
                          np.ascontiguousarray(ids, dtype=np.int64), row_of, which,
                          peer_ids, peer_c, went, level)
    return went, level


def held_since(since_ms: npt.NDArray[np.int64], cond: npt.NDArray[np.bool_],
               now_ms: int | npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Since when each condition has held without a break: ``now_ms`` (one time, or one per
    row) where it starts, its
    old start where it goes on, 0 where it does not hold (0 is never a real start). The
    rules' "held for N seconds" clocks are this one step."""
    return np.where(cond, np.where(since_ms > 0, since_ms, now_ms), 0)


def gather_evidence(before: npt.NDArray[np.float64], on: npt.NDArray[np.bool_],
                    clear: npt.NDArray[np.bool_], gain_s: npt.NDArray[np.float64],
                    dt_s: npt.NDArray[np.float64] | float, fade_s: float
                    ) -> npt.NDArray[np.float64]:
    """Evidence in seconds after one step: a step ``on`` adds ``gain_s`` (the first counts no
    time yet: a tiny mark says it began), one that clears starts it over, and any other is
    no evidence either way, what was gathered fading over ``fade_s``."""
    faded = np.where(clear, 0.0, before * np.exp(-dt_s / fade_s))
    return np.where(on, np.where(before > 0, before + gain_s, 1e-9), faded)


def follow_floor(floor: npt.NDArray[np.float64], x: npt.NDArray[np.float64],
                 cool: npt.NDArray[np.bool_], judged: npt.NDArray[np.bool_] | bool = True
                 ) -> npt.NDArray[np.float64]:
    """A recovery's floor after one step: the least a figure read since its alert ended as
    the trouble did (0: none), following its decay down and gone once it reads ``cool``;
    kept as it was where the step is not ``judged``. A heat still shedding a trouble that is
    over is the same recovery, so a new alert must rise a bar above this floor."""
    followed = np.where(cool, 0.0, np.where(floor > 0, np.fmin(floor, np.maximum(x, 0.0)),
                                            floor))
    return np.where(judged, followed, floor)


def evidence_rate(excess: npt.NDArray[np.float64], bar: npt.NDArray[np.float64] | float,
                  exponent: float = 2.0) -> npt.NDArray[np.float64]:
    """Seconds of evidence a second of a condition adds, by how far past its bar it stands:
    the bar counts its time, more counts as the square of the ratio, four times at most, so
    no rule waits less than a quarter of its hold. A die 30 degC over its model or a clock at
    half its peers' is no borderline case, and a rule's hold is there for those. The square
    is how evidence of a shift grows in a sequential test (a CUSUM's log-likelihood gain per
    sample, and so its time to alarm, goes with the shift squared over the noise): each bar
    already stands past what healthy GPUs reach (the heat bars at twice the widest healthy
    spread), so a GPU half as far again past it is that much plainer. Counted from twice
    the bar (76cb2ab), a clock at 74 % of its peers' (three times its bar) took 40 s (tuning
    draw zoo-2); linearly from the bar (8d2ddd7) 20 s; a straggler at 86 % (1.75 bars) took
    35.5 s linearly and 21 s squared (tuning draws zoo-10, zoo-11).

    ``exponent`` 1 counts proportionally (as before d61974b), for a quantity that is not a
    measurement in noise: ``temperature_stuck``'s model paths judge how far the thermal
    models' predictions moved, whose error is the model's (a lag it has wrong) and does not
    average out over time (``rules.STUCK_EVIDENCE_EXPONENT``)."""
    ratio = np.abs(excess) / np.asarray(bar, dtype=np.float64)
    return np.clip(np.nan_to_num(ratio, nan=1.0, posinf=4.0) ** exponent, 1.0, 4.0)


def node_median(values: npt.NDArray[np.float64], inv: npt.NDArray[np.intp]
                 ) -> npt.NDArray[np.float64]:
    """``group_median`` for groups in any order (the rules see ticks in time order)."""
    order = np.argsort(inv, kind="stable")
    out = np.empty_like(values, dtype=np.float64)
    out[order] = group_median(values[order], inv[order].astype(np.int64))
    return out


class FeatureState:
    """What features need to remember per GPU (model id): previous counters, the highest
    clock, and the GPU's thermal model."""

    ARRAYS: Final = ("prev_counters", "max_clock")

    def __init__(self) -> None:
        self.n = 0
        self.prev_counters = np.zeros((0, len(COUNTER_COLS)))
        self.max_clock = np.zeros(0)
        self.thermal = ThermalModels()
        self.last_pred = np.zeros(0)
        """The thermal model's prediction for each GPU's latest reading (degC, NaN: none)."""
        self.last_cand = np.zeros((0, len(TAUS_S)))
        self.last_plaus = np.zeros((0, len(TAUS_S)), dtype=bool)
        """The thermal model's candidate-lag predictions of the last step, and which of the
        lags the GPU's history cannot rule out."""
        self.last_resid = np.zeros(0)
        """Latest reading minus that prediction, where the rules may judge it (degC, NaN)."""
        self.last_lag_resid = np.zeros((0, len(TAUS_S)))
        """The same for every candidate lag (NaN where the prediction is not given)."""

    def ensure(self, n: int) -> None:
        if n <= self.n:
            return
        unknown = {k: np.nan for k in ("prev_counters", "last_pred", "last_cand",
                                       "last_resid", "last_lag_resid")}
        grow_rows(self, (*self.ARRAYS, "last_pred", "last_cand", "last_plaus", "last_resid",
                         "last_lag_resid"), n, unknown)
        self.thermal.ensure(n)
        self.n = n

    def state_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        out: dict[str, npt.NDArray[np.generic]] = {
            f"features.{name}": getattr(self, name)[: self.n].copy() for name in self.ARRAYS}
        out.update(self.thermal.state_arrays("features.thermal"))
        return out

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]], n: int) -> None:
        self.__init__()  # type: ignore[misc]
        self.ensure(n)
        for name in self.ARRAYS:
            getattr(self, name)[:] = arrays[f"features.{name}"]
        self.thermal.load_arrays(arrays, "features.thermal")

    def rule_context(self, ids: npt.NDArray[np.int64], row: npt.NDArray[np.float64],
                     node_groups: npt.NDArray[np.int64]) -> RuleContext:
        """What the rules need of the step just taken (``step`` must have run on it).

        The excess over the node's median residual takes out what a node's GPUs share (the
        inlet air, a fan curve); a node with one reporting GPU keeps its own residual.
        """
        resid = self.last_resid[ids]
        _, inv = np.unique(node_groups, return_inverse=True)
        peers = node_median(resid, inv)
        finite = np.bincount(inv, weights=np.isfinite(resid).astype(np.float64))
        reading = np.bincount(inv, weights=np.isfinite(row[:, COL["temperature_celsius"]])
                              .astype(np.float64))
        # Peers judge where three or more of them have a judged residual; a node with one GPU
        # reading temperature is its own yardstick; a node whose other GPUs cannot be judged
        # yet (their models are learning a new power) gives no excess at all.
        # Peers take out only heat they share: a node whose models read its dies too hot (a
        # power the models learned with the wrong lag, right after a job ended) does not make
        # a GPU that matches its own model "hotter than its peers". The GPU must be hotter
        # than its own model and than the peers' median both.
        shared = np.where(reading[inv] < 2, 0.0,
                          np.where(finite[inv] >= 3, np.maximum(peers, 0.0), np.nan))
        excess = resid - shared
        lag_excess = self.last_lag_resid[ids] - shared[:, None]
        util = row[:, COL["utilization_ratio"]]
        clock = row[:, COL["sm_clock_hertz"]]
        busy_clock = np.where(np.isfinite(util) & (util >= 0.5), clock, np.nan)
        busy = np.bincount(inv, weights=np.isfinite(busy_clock).astype(np.float64))
        ref = np.where(busy[inv] >= 3, node_median(busy_clock, inv),
                       np.where(self.max_clock[ids] > 0, self.max_clock[ids], np.nan))
        band, dwell, power_w = self.thermal.power_bin(ids)
        return RuleContext(self.last_pred[ids], self.last_cand[ids], self.last_plaus[ids],
                           self.thermal.error_c(ids), excess, lag_excess, ref, band, dwell, inv,
                           self.thermal.ema[ids], power_w, self.thermal.tau_s(ids))

    def step(
        self,
        ids: npt.NDArray[np.int64],
        row: npt.NDArray[np.float64],
        node_groups: npt.NDArray[np.int64],
        ts_ms: int,
    ) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float64]]:
        """Features of one step at ``ts_ms`` for GPUs ``ids`` from their gathered metrics
        ``row`` (G, K).

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

        resid, pred, cand, plaus = self.thermal.step(ids, temp, power, ts_ms)
        self.last_pred[ids] = pred
        self.last_cand[ids] = cand
        self.last_plaus[ids] = plaus
        self.last_resid[ids] = np.where(np.isfinite(pred), resid, np.nan)
        self.last_lag_resid[ids] = temp[:, None] - cand
        feats[:, 2] = resid / 2.0
        np.nan_to_num(feats, copy=False, nan=0.0, posinf=0.0, neginf=0.0)
        return feats.astype(np.float32), inc

"""The baselines ``benchmarks.detection`` runs beside the detector, on the same data.

Each returns alert records in the detector's shape, so one scorer judges them all:

- ``static_baseline``: the rules an SRE would write in Prometheus (die >= 80 degC, HBM >= 90
  degC, slowdown bits, hardware XIDs, ECC / link error bursts, NaN), with the detector's
  hysteresis;
- ``mad_baseline``: per-node outlier detection as Grafana's and Datadog's outlier features
  do it: a GPU whose reading is more than ``k`` median absolute deviations from its node's
  median (per metric, per step) is an outlier, with the detector's hysteresis;
- ``random_baseline``: as many alerts as the detector raised, of the same lengths, on
  random GPUs at random times: the recall that luck alone buys with that alert budget;
- ``hst_baseline``: river's HalfSpaceTrees per GPU over the detector's own feature vectors,
  with the detector's adaptive threshold and hysteresis (pure Python, so on a subset).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from detector.config import DetectorConfig
from detector.episodes import EpisodeParams, Episodes
from detector.features import (
    COL,
    FEATURES,
    THROTTLE_HW_BITS,
    THROTTLE_SW_THERMAL,
    FeatureState,
    group_median,
)
from detector.rules import HARDWARE_XIDS
from detector.thresholds import AdaptiveThresholds, ThresholdParams
from schemas.records import AlertRecord, AlertState, Severity

if TYPE_CHECKING:
    from benchmarks.detection import Fleet

__all__ = ["hst_baseline", "hst_subset", "mad_baseline", "random_baseline", "static_baseline"]


def _record(entity: str, source: str, state: AlertState, ts: int) -> AlertRecord:
    return AlertRecord(id="", entity=entity, level="gpu", state=state,
                       severity=Severity.WARNING, source=source, summary="", score=0.0,
                       threshold=0.0, started_ms=ts, updated_ms=ts)


def _hysteresis(fleet: Fleet, source: str, ep: EpisodeParams, flags: npt.NDArray[np.bool_],
                k: int, episodes: Episodes, rows: npt.NDArray[np.int64] | None = None
                ) -> list[AlertRecord]:
    """Advance the episodes of GPUs ``rows`` (default all) by one step of ``flags``."""
    ids = np.arange(len(flags))
    ts = int(fleet.step_ms[k])
    opened, resolved = episodes.step(ids, flags, flags.astype(float), ts)
    paths = fleet.paths if rows is None else [fleet.paths[r] for r in rows]
    return ([_record(paths[i], source, AlertState.FIRING, ts) for i in opened]
            + [_record(paths[i], source, AlertState.RESOLVED, ts) for i in resolved])


def static_baseline(fleet: Fleet, ep: EpisodeParams) -> list[AlertRecord]:
    """Fixed-threshold rules with the detector's hysteresis."""
    g = fleet.gpus
    episodes = Episodes(ep)
    episodes.ensure(g)
    prev = np.full((g, 4), np.nan)
    out: list[AlertRecord] = []
    hw_xid = np.zeros(256, dtype=bool)
    hw_xid[list(HARDWARE_XIDS)] = True
    for k in range(fleet.steps):
        row = fleet.gathered[k]
        temp, mem = row[:, COL["temperature_celsius"]], row[:, COL["memory_temperature_celsius"]]
        bits = np.nan_to_num(row[:, COL["clock_event_reasons"]]).astype(np.int64)
        xid = np.nan_to_num(row[:, COL["xid"]]).astype(np.int64).clip(0, 255)
        cnt = row[:, [COL["ecc_sbe_volatile_total"], COL["ecc_dbe_volatile_total"],
                      COL["nvlink_crc_errors_total"], COL["pcie_replay_errors_total"]]]
        inc = np.nan_to_num(cnt - prev)
        prev = np.where(np.isfinite(cnt), cnt, prev)
        bad = ((temp >= 80) | (mem >= 90) | (bits & (THROTTLE_HW_BITS | THROTTLE_SW_THERMAL) > 0)
               | hw_xid[xid] | (inc[:, 0] >= 10) | (inc[:, 1] > 0) | (inc[:, 2] >= 10)
               | (inc[:, 3] >= 10) | ~np.isfinite(row).any(axis=1))
        out += _hysteresis(fleet, "static", ep, bad, k, episodes)
    return out


MAD_METRICS = ("temperature_celsius", "memory_temperature_celsius", "power_usage_watts",
               "utilization_ratio", "sm_clock_hertz")
"""What the MAD baseline compares across a node's GPUs."""
_MAD_FLOOR = np.array([1.0, 1.0, 10.0, 0.05, 30e6])
"""Smallest spread per metric (one sensor step, 10 W, 5 %, two clock steps): a node whose
GPUs read identically would otherwise make every flicker an outlier."""


def mad_baseline(fleet: Fleet, ep: EpisodeParams, k: float = 3.0) -> list[AlertRecord]:
    """Per-node median absolute deviation outliers, per metric, with hysteresis.

    A GPU is anomalous in a step when any metric is more than ``k`` scaled MADs (1.4826 x
    MAD, never below the metric's floor) from its node's median.
    """
    g = fleet.gpus
    node_index = {n: i for i, n in enumerate(dict.fromkeys(fleet.node_paths))}
    groups = np.array([node_index[n] for n in fleet.node_paths], dtype=np.int64)
    order = np.argsort(groups, kind="stable")
    cols = [COL[m] for m in MAD_METRICS]
    episodes = Episodes(ep)
    episodes.ensure(g)
    out: list[AlertRecord] = []
    for k_step in range(fleet.steps):
        x = fleet.gathered[k_step][order][:, cols]
        gs = groups[order]
        bad = np.zeros(g, dtype=bool)
        for c in range(x.shape[1]):
            med = group_median(x[:, c], gs)
            dev = np.abs(x[:, c] - med)
            mad = group_median(dev, gs) * 1.4826
            bad |= np.nan_to_num(dev > k * np.maximum(mad, _MAD_FLOOR[c]))
        flags = np.empty(g, dtype=bool)
        flags[order] = bad
        out += _hysteresis(fleet, "mad", ep, flags, k_step, episodes)
    return out


def random_baseline(fleet: Fleet, like: list[AlertRecord], seed: int) -> list[AlertRecord]:
    """The episodes of ``like`` (count and lengths) moved to random GPUs and times."""
    rng = np.random.default_rng([seed, 0x5A4D])
    t0, t1 = int(fleet.step_ms[0]), int(fleet.step_ms[-1])
    opened: dict[tuple[str, str], int] = {}
    lengths: list[int] = []
    for a in like:
        key = (a.entity, a.source)
        if a.state is AlertState.FIRING:
            opened[key] = a.started_ms
        elif key in opened:
            lengths.append(a.updated_ms - opened.pop(key))
    lengths += [t1 - s for s in opened.values()]
    out: list[AlertRecord] = []
    for length in lengths:
        start = int(rng.integers(t0, max(t0 + 1, t1 - length)))
        path = fleet.paths[int(rng.integers(fleet.gpus))]
        out.append(_record(path, "random", AlertState.FIRING, start))
        out.append(_record(path, "random", AlertState.RESOLVED, min(t1, start + length)))
    out.sort(key=lambda a: a.updated_ms)
    return out


_HST_LO = np.array([-6, -6, -10, 0, 0, 0, -5, -5, 0, 0, 0], dtype=np.float64)
_HST_HI = np.array([14, 14, 10, 6, 5, 10, 5, 5, 2, 10, 10], dtype=np.float64)


def hst_baseline(fleet: Fleet, subset: npt.NDArray[np.int64], config: DetectorConfig
                 ) -> tuple[list[AlertRecord], float]:
    """river HalfSpaceTrees per GPU on the detector's features, same threshold/hysteresis."""
    from river.anomaly import HalfSpaceTrees  # a dependency of the project itself

    n = len(subset)
    models = [HalfSpaceTrees(n_trees=10, height=8, window_size=250, seed=i)
              for i in range(n)]
    feats = FeatureState()
    feats.ensure(n)
    mc = config.model
    thr = AdaptiveThresholds(ThresholdParams(z=mc.z, floor=0.5, horizon=mc.horizon,
                                             warmup=mc.warmup, std_floor=0.02))
    thr.ensure(n)
    episodes = Episodes(config.alerts.episode_params())
    episodes.ensure(n)
    ids = np.arange(n)
    node_index = {p: i for i, p in enumerate(dict.fromkeys(fleet.node_paths[i] for i in subset))}
    groups = np.array([node_index[fleet.node_paths[i]] for i in subset], dtype=np.int64)
    ts = fleet.step_ms
    names = [f.name for f in FEATURES]
    out: list[AlertRecord] = []
    t0 = time.process_time()
    for k in range(fleet.steps):
        row = fleet.gathered[k][subset]
        x, _ = feats.step(ids, row, groups, int(ts[k]))
        x = np.clip((x - _HST_LO) / (_HST_HI - _HST_LO), 0.0, 1.0)
        valid = np.isfinite(row).any(axis=1)
        scores = np.zeros(n)
        for i in np.flatnonzero(valid):
            point = dict(zip(names, x[i].tolist(), strict=True))
            scores[i] = models[i].score_one(point) + 1e-9
            models[i].learn_one(point)
        _, anomalous = thr.update(ids, scores)
        anomalous |= ~valid
        out += _hysteresis(fleet, "hst", config.alerts.episode_params(), anomalous, k,
                           episodes, subset)
    return out, time.process_time() - t0


def hst_subset(fleet: Fleet, size: int, seed: int) -> npt.NDArray[np.int64]:
    """Every faulty GPU (at most two per fault), plus healthy ones up to ``size``."""
    chosen: list[int] = []
    per_fault: dict[tuple[str, float], int] = {}
    for lab in fleet.labels:
        key = (lab["kind"], lab["start_s"])
        if per_fault.get(key, 0) < 2:
            per_fault[key] = per_fault.get(key, 0) + 1
            chosen.append(lab["gpu"])
    faulty = {lab["gpu"] for lab in fleet.labels}
    healthy = [i for i in range(fleet.gpus) if i not in faulty]
    rng = np.random.default_rng(seed)
    extra = max(0, size - len(chosen))
    chosen += rng.permutation(healthy)[:extra].tolist()
    return np.array(sorted(set(chosen)), dtype=np.int64)

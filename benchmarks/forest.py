"""Forest engines side by side: the numba engine against krcf (AWS's Rust RCF), one run.

Both engines see identical streams with identical parameters (the issue's: 8 features,
shingle 4, 50 trees, sample size 256, AWS's time decay and output_after):

* Synthetic stream (documented here, seeded): ``--models`` series of 8 features, each a sine
  (period 60 or 300 steps, random phase) plus Gaussian noise (sd 0.15), with labelled
  anomalies injected after the warm-up: spikes (one step, +-2..6 on one feature), level
  shifts (+-2..4 on one feature from then on; the first 20 steps are labelled) and drifts
  (a ramp to +-3..5 over 150 steps on one feature, then back; the second half is labelled).
* The fault fleet (``agent.fleet``): GPUs with injected faults (thermal runaway, ECC storm,
  stragglers, ...) turned into the detector's feature vectors (``detector.features``), one
  model per GPU, labelled by the fleet's ground truth: the first 60 s of each fault count
  as anomalous, the rest of it is left out (a forest learns a lasting fault as the new
  normal; the detector's hysteresis holds the alert). Skipped with ``--no-fleet``.

Measured:

* updates/s per core: score + learn of one point of one model, CPU seconds of this process
  (both engines are single-threaded, so this is per core and robust to other load on the
  machine), after ``--warm`` steps (reservoirs accept ~75 % of points at first and settle
  towards ~13 %, so early updates cost more), numba's compile time excluded (a warm-up run
  on a tiny config first; kernels are cached on disk).
* bytes per model: what the engine reports (numba: its arrays, exact; krcf: its serialized
  size), the resident growth per model of a fresh process that runs 8 models for 700 steps
  (RSS delta), and checkpoint bytes.
* Spearman rank correlation of the two engines' scores on the synthetic stream; the same for
  krcf against krcf with another seed (how far apart RCF's randomness alone puts two runs).
* detection quality from scores alone (no thresholds): ROC AUC of anomalous against normal
  points, and recall of injected anomalies (events) at a 0.1 % point false-positive rate.
* with ``--seeds N`` (N > 1), both engines again with seeds ``seed+1 .. seed+N-1``, on the
  synthetic stream and on the fault fleet: the spread of each figure that comes from RCF's
  randomness alone (rank correlation of every numba run and every other krcf run with the
  krcf run above; AUC and recall of each).

krcf is a peer from the ``bench`` extra: without it the numba engine is still measured
(speed, bytes, detection quality) and every figure against krcf is left out (null).

    python -m benchmarks.forest [--json] [--models N] [--steps T] [--no-fleet] [--seeds N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.peers import import_peer, missing_peers
from detector.engines import EngineConfig, ForestEngine, make_engine

RESULTS = Path(__file__).parent / "results" / "forest.json"
ISSUE_CONFIG = EngineConfig(dims=8, shingle=4, trees=50, sample_size=256, seed=11)
FPR = 0.001
FLEET_ONSET_S = 60
TARGETS = {"updates_per_s": 20_000, "bytes_per_model": 256 * 1024, "spearman_vs_krcf": 0.9}


@dataclass
class Stream:
    """Points (steps, models, dims), per-point labels, and labelled events."""

    points: npt.NDArray[np.float32]
    labels: npt.NDArray[np.bool_]
    events: list[tuple[int, int, int, str]] = field(default_factory=list)
    """(model, first labelled step, end step exclusive, kind)"""
    ignore: npt.NDArray[np.bool_] | None = None
    """Points counted neither as anomalous nor as normal (a fault after its onset)."""


@dataclass
class Run:
    engine: str
    scores: npt.NDArray[np.float64]
    updates_per_s: float
    model_bytes: int
    checkpoint_bytes: int
    rss_bytes_per_model: float


def synthetic_stream(models: int, steps: int, warm: int, seed: int) -> Stream:
    rng = np.random.default_rng(seed)
    dims = ISSUE_CONFIG.dims
    t = np.arange(steps, dtype=np.float64)[:, None, None]
    period = rng.choice([60.0, 300.0], size=(1, models, dims))
    phase = rng.uniform(0, 2 * np.pi, size=(1, models, dims))
    x = np.sin(2 * np.pi * t / period + phase) + rng.normal(0, 0.15, (steps, models, dims))
    labels = np.zeros((steps, models), dtype=bool)
    events: list[tuple[int, int, int, str]] = []
    for m in range(models):
        start = warm + int(rng.integers(0, 40))
        while start < steps - 200:
            kind = str(rng.choice(["spike", "spike", "level_shift", "drift"]))
            dim = int(rng.integers(dims))
            sign = float(rng.choice([-1.0, 1.0]))
            if kind == "spike":
                x[start, m, dim] += sign * rng.uniform(2.0, 6.0)
                first, end = start, start + 1
            elif kind == "level_shift":
                x[start:, m, dim] += sign * rng.uniform(2.0, 4.0)
                first, end = start, start + 20
            else:
                ramp = np.linspace(0.0, sign * rng.uniform(3.0, 5.0), 150)
                x[start : start + 150, m, dim] += ramp
                first, end = start + 75, start + 150
            labels[first:end, m] = True
            events.append((m, first, end, kind))
            start = end + int(rng.integers(150, 400))
    return Stream(x.astype(np.float32), labels, events)


def fleet_stream(gpus: int, duration_s: float, faults: int, seed: int) -> tuple[Stream, int]:
    """The fault fleet's GPUs as detector feature vectors; returns (stream, dims)."""
    from agent.fleet.export import generate
    from detector.features import FEATURES, FeatureState, gather
    from schemas.catalog import BY_NAME

    data = generate(gpus, 1.0, duration_s, faults=faults, seed=seed)
    ids = np.array([BY_NAME[m].id for m in data.metrics], dtype=np.int64)
    rows = gather(np.ascontiguousarray(data.values.transpose(1, 0, 2)), ids)
    nodes = list(dict.fromkeys(data.nodes)) if data.nodes else []
    groups = (np.array([nodes.index(n) for n in data.nodes], dtype=np.int64) if nodes
              else np.arange(gpus, dtype=np.int64) // 8)
    state = FeatureState()
    state.ensure(gpus)
    gids = np.arange(gpus, dtype=np.int64)
    steps = rows.shape[0]
    points = np.zeros((steps, gpus, len(FEATURES)), dtype=np.float32)
    for s in range(steps):
        points[s], _ = state.step(gids, rows[s], groups, 1000 * s)
    labels = np.zeros((steps, gpus), dtype=bool)
    ignore = np.zeros((steps, gpus), dtype=bool)
    events = []
    for lab in data.labels:
        first = max(0, int(np.ceil(lab["start_s"])))
        end = min(steps, int(np.ceil(min(lab["end_s"], steps))))
        onset = min(end, first + FLEET_ONSET_S)
        if end > first:
            # A per-GPU forest learns a lasting fault as the new normal (the detector's
            # hysteresis keeps the alert open), so only the onset counts as anomalous.
            labels[first:onset, lab["gpu"]] = True
            ignore[onset:end, lab["gpu"]] = True
            events.append((int(lab["gpu"]), first, onset, str(lab["kind"])))
    return Stream(points, labels, events, ignore), len(FEATURES)


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _rss_probe(name: str, config: EngineConfig, models: int, steps: int) -> float:
    """Run in a fresh process: resident growth per model after ``steps`` updates."""
    stream = synthetic_stream(models, steps, steps, seed=config.seed)
    ids = np.arange(models, dtype=np.int64)
    # Loading the compiled code is not model memory; the warm-up engine stays alive until
    # the end, so the measured one cannot reuse pages it freed.
    if name == "numba":
        warm_engine = warm_up_numba(config)
    else:
        warm_engine = make_engine(name, replace(config, trees=2, sample_size=8))
        warm_engine.ensure_models(1)
        warm_engine.update(ids[:1], stream.points[0, :1])
    before = rss_bytes()
    engine = make_engine(name, config)
    engine.ensure_models(models)
    for s in range(steps):
        engine.update(ids, stream.points[s], attribute_above=np.inf)
    grown = (rss_bytes() - before) / models
    del warm_engine
    return grown


def resident_bytes_per_model(name: str, config: EngineConfig, models: int = 8,
                             steps: int = 700) -> int:
    """Process-RSS growth per model, measured in a fresh interpreter so that memory freed
    by earlier runs of this benchmark cannot hide an engine's allocations."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(1) as pool:
        return round(pool.apply(_rss_probe, (name, config, models, steps)))


def run_engine(name: str, config: EngineConfig, stream: Stream, warm: int,
               measure_rss: bool = True) -> Run:
    steps, models = stream.points.shape[:2]
    ids = np.arange(models, dtype=np.int64)
    engine: ForestEngine = make_engine(name, config)
    engine.ensure_models(models)
    scores = np.zeros((steps, models))
    cpu = 0.0
    for s in range(steps):
        start = time.process_time()
        # Attribution is what the detector reads for alerts only; skip it as the detector
        # does for points below threshold (numba computes it in the same pass anyway).
        scores[s] = engine.update(ids, stream.points[s], attribute_above=np.inf).scores
        if s >= warm:
            cpu += time.process_time() - start
    checkpoint = int(np.mean([len(engine.checkpoint(m)) for m in range(min(models, 4))]))
    return Run(name, scores, models * (steps - warm) / max(cpu, 1e-9),
               engine.model_bytes(0), checkpoint,
               resident_bytes_per_model(name, config) if measure_rss else 0)


def warm_up_numba(config: EngineConfig) -> ForestEngine:
    """Compile (or load from numba's cache) every kernel outside the timed region.

    Kernels are specialised on the state arrays' index types, which follow the config's
    sizes, so the warm-up runs the config itself (scoring from the first point, a few
    steps): a smaller stand-in can pick narrower types and leave a compile in the measured
    region (it showed as 8 MB of "resident memory per model" once). Returns the warm-up
    engine: a caller measuring memory keeps it alive so its freed pages are not reused."""
    warm = replace(config, output_after=1)
    engine = make_engine("numba", warm)
    engine.ensure_models(2)
    rng = np.random.default_rng(0)
    ids = np.arange(2, dtype=np.int64)
    for _ in range(30):
        engine.update(ids, rng.normal(size=(2, warm.dims)).astype(np.float32))
    engine.score(ids, rng.normal(size=(2, warm.dims)).astype(np.float32))
    engine.restore(1, engine.checkpoint(0))
    return engine


def ranks(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Average ranks (ties share their mean rank), as Spearman's coefficient needs."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_x)) + 1]
    ends = np.r_[starts[1:], len(x)]
    mean_rank = (starts + ends - 1) / 2.0
    r = np.empty(len(x))
    r[order] = np.repeat(mean_rank, ends - starts)
    return r


def spearman(a: npt.NDArray[np.float64], b: npt.NDArray[np.float64]) -> float:
    return float(np.corrcoef(ranks(a.ravel()), ranks(b.ravel()))[0, 1])


def auc(scores: npt.NDArray[np.float64], labels: npt.NDArray[np.bool_]) -> float:
    """ROC AUC by the rank-sum formula (ties count half)."""
    r = ranks(scores.ravel())
    pos = labels.ravel()
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if not n_pos or not n_neg:
        return float("nan")
    return float((r[pos].sum() - n_pos * (n_pos - 1) / 2) / (n_pos * n_neg))


def quality(run: Run, stream: Stream, warm: int) -> dict[str, Any]:
    keep = np.ones(stream.labels.shape, dtype=bool)
    if stream.ignore is not None:
        keep = ~stream.ignore
    scores, labels = run.scores[warm:][keep[warm:]], stream.labels[warm:][keep[warm:]]
    normal = scores[~labels]
    threshold = float(np.quantile(normal, 1.0 - FPR))
    by_kind: dict[str, list[bool]] = {}
    for model, first, end, kind in stream.events:
        if end <= warm:
            continue
        hit = bool((run.scores[max(first, warm) : end, model] > threshold).any())
        by_kind.setdefault(kind, []).append(hit)
    hits = [h for v in by_kind.values() for h in v]
    return {
        "auc": round(auc(scores, labels), 4),
        "recall_at_fpr": round(float(np.mean(hits)), 4) if hits else None,
        "recall_by_kind": {k: round(float(np.mean(v)), 3) for k, v in sorted(by_kind.items())},
        "events": len(hits),
    }


def seed_spread(config: EngineConfig, stream: Stream, warm: int, runs: dict[str, Run],
                seeds: int, engines: tuple[str, ...]) -> dict[str, Any]:
    """Each engine with ``seeds`` seeds (those above reused): min, mean and max of its rank
    correlation with the krcf run above (when krcf ran), its AUC and its recall."""
    ref = runs["krcf"].scores[warm:] if "krcf" in runs else None
    spread: dict[str, Any] = {"seeds": list(range(config.seed, config.seed + seeds))}
    for name in engines:
        rho: list[float] = []
        aucs: list[float] = []
        recalls: list[float | None] = []
        for seed in spread["seeds"]:
            if seed == config.seed:
                run = runs[name]
            elif name == "krcf" and seed == config.seed + 1 and "krcf_other_seed" in runs:
                run = runs["krcf_other_seed"]
            else:
                run = run_engine(name, replace(config, seed=seed), stream, warm,
                                 measure_rss=False)
            if ref is not None and not (name == "krcf" and seed == config.seed):
                rho.append(spearman(run.scores[warm:], ref))  # krcf against itself is 1
            q = quality(run, stream, warm)
            aucs.append(q["auc"])
            recalls.append(q["recall_at_fpr"])
        spread[name] = {key: {"min": round(min(v), 4), "mean": round(float(np.mean(v)), 4),
                              "max": round(max(v), 4)}
                        for key, v in (("spearman_vs_krcf", rho), ("auc", aucs),
                                       ("recall_at_fpr", [r for r in recalls if r is not None]))
                        if v}
    return spread


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--models", type=int, default=16, help="synthetic series (models)")
    parser.add_argument("--steps", type=int, default=3000, help="synthetic steps per model")
    parser.add_argument("--warm", type=int, default=2000,
                        help="untimed, unscored warm-up (the reservoirs' acceptance rate "
                             "settles over ~1/time_decay = 2560 points)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--no-fleet", action="store_true", help="skip the fault fleet")
    parser.add_argument("--fleet-gpus", type=int, default=128)
    parser.add_argument("--fleet-seconds", type=float, default=1200.0)
    parser.add_argument("--fleet-faults", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=1,
                        help="also run both engines with this many seeds in all and report "
                             "the spread of rho, AUC and recall")
    parser.add_argument("--no-aws-layout", action="store_true",
                        help="skip numba with AWS's one reservoir per tree")
    args = parser.parse_args()

    config = replace(ISSUE_CONFIG, seed=args.seed)
    engines = ("numba", "krcf") if import_peer("krcf") is not None else ("numba",)
    warm_up_numba(config)
    stream = synthetic_stream(args.models, args.steps, args.warm, args.seed)
    runs = {"numba": run_engine("numba", config, stream, args.warm)}
    if not args.no_aws_layout:
        aws = replace(config, sample_groups=config.trees)
        runs["numba_per_tree_reservoirs"] = run_engine("numba", aws, stream, args.warm)
    if "krcf" in engines:
        runs["krcf"] = run_engine("krcf", config, stream, args.warm)
        # The same engine with another seed: how far apart RCF's own randomness puts two
        # runs (the yardstick for the score agreement and quality differences above).
        runs["krcf_other_seed"] = run_engine("krcf", replace(config, seed=args.seed + 1),
                                             stream, args.warm)

    w = args.warm
    ref = runs["krcf"].scores[w:] if "krcf" in runs else None
    result: dict[str, Any] = {
        "params": {"dims": config.dims, "shingle": config.shingle, "trees": config.trees,
                   "sample_size": config.sample_size, "models": args.models,
                   "steps": args.steps, "warm": w, "seed": args.seed},
        "engines": {},
    }
    for key, run in runs.items():
        result["engines"][key] = {
            "updates_per_s": round(run.updates_per_s),
            "bytes_per_model": run.model_bytes,
            "rss_bytes_per_model": round(run.rss_bytes_per_model),
            "checkpoint_bytes": run.checkpoint_bytes,
            "spearman_vs_krcf": (None if ref is None
                                 else round(spearman(run.scores[w:], ref), 4)),
            "synthetic": quality(run, stream, w),
        }
    result["krcf_self_spearman"] = (result["engines"]["krcf_other_seed"]["spearman_vs_krcf"]
                                    if "krcf_other_seed" in runs else None)
    if args.seeds > 1:
        result["seed_spread"] = seed_spread(config, stream, w, runs, args.seeds, engines)

    if not args.no_fleet:
        fleet, fdims = fleet_stream(args.fleet_gpus, args.fleet_seconds, args.fleet_faults,
                                    args.seed)
        fconfig = replace(config, dims=fdims)
        fruns = {}
        for key in engines:
            fruns[key] = run_engine(key, fconfig, fleet, fconfig.sample_size, measure_rss=False)
            result["engines"][key]["fleet"] = {
                **quality(fruns[key], fleet, fconfig.sample_size),
                "updates_per_s": round(fruns[key].updates_per_s),
            }
        result["fleet"] = {"gpus": args.fleet_gpus, "seconds": args.fleet_seconds,
                           "faults": args.fleet_faults, "labels": len(fleet.events),
                           "dims": fdims}
        if args.seeds > 1:
            result["fleet_seed_spread"] = seed_spread(fconfig, fleet, fconfig.sample_size,
                                                      fruns, args.seeds, engines)

    result["summary"] = summarise(result)
    result["missing_peers"] = missing_peers()

    print_table(result)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    if args.json:
        print(json.dumps(result["summary"]))


def summarise(result: dict[str, Any]) -> dict[str, Any]:
    """The headline figures; every figure about krcf is None when krcf did not run."""
    numba = result["engines"]["numba"]
    krcf: dict[str, Any] | None = result["engines"].get("krcf")
    other: dict[str, Any] | None = result["engines"].get("krcf_other_seed")

    def of_krcf(*keys: str, engine: dict[str, Any] | None = krcf) -> Any:
        value: Any = engine
        for key in keys:
            if value is None:
                return None
            value = value.get(key)
        return value

    summary: dict[str, Any] = {
        "updates_per_s": numba["updates_per_s"],
        "krcf_updates_per_s": of_krcf("updates_per_s"),
        "speedup_vs_krcf": (None if krcf is None
                            else round(numba["updates_per_s"] / krcf["updates_per_s"], 2)),
        "bytes_per_model": numba["bytes_per_model"],
        "checkpoint_bytes": numba["checkpoint_bytes"],
        "krcf_bytes_per_model": of_krcf("rss_bytes_per_model"),
        "krcf_checkpoint_bytes": of_krcf("checkpoint_bytes"),
        "spearman_vs_krcf": numba["spearman_vs_krcf"],
        "krcf_self_spearman": result["krcf_self_spearman"],
        "auc": numba["synthetic"]["auc"],
        "krcf_auc": of_krcf("synthetic", "auc"),
        "krcf_other_seed_auc": of_krcf("synthetic", "auc", engine=other),
        "recall_at_0.1pct_fpr": numba["synthetic"]["recall_at_fpr"],
        "krcf_recall_at_0.1pct_fpr": of_krcf("synthetic", "recall_at_fpr"),
    }
    if "fleet" in numba:
        summary["fleet_auc"] = numba["fleet"]["auc"]
        summary["krcf_fleet_auc"] = of_krcf("fleet", "auc")
        summary["fleet_recall_at_0.1pct_fpr"] = numba["fleet"]["recall_at_fpr"]
        summary["krcf_fleet_recall_at_0.1pct_fpr"] = of_krcf("fleet", "recall_at_fpr")
    if "fleet_seed_spread" in result:
        fleet_spread = result["fleet_seed_spread"]
        summary["fleet_auc_mean"] = fleet_spread["numba"]["auc"]["mean"]
        summary["krcf_fleet_auc_mean"] = of_krcf("krcf", "auc", "mean", engine=fleet_spread)
    if "seed_spread" in result:
        spread = result["seed_spread"]
        rho = spread["numba"].get("spearman_vs_krcf")
        summary["seeds"] = len(spread["seeds"])
        summary["spearman_vs_krcf_mean"] = None if rho is None else rho["mean"]
        summary["spearman_vs_krcf_min"] = None if rho is None else rho["min"]
        summary["auc_mean"] = spread["numba"]["auc"]["mean"]
        summary["krcf_auc_mean"] = of_krcf("krcf", "auc", "mean", engine=spread)
    rho_now = summary["spearman_vs_krcf"]
    summary["targets_met"] = {
        "updates_per_s": summary["updates_per_s"] >= TARGETS["updates_per_s"],
        "bytes_per_model": summary["bytes_per_model"] <= TARGETS["bytes_per_model"],
        "spearman_vs_krcf": None if rho_now is None else rho_now >= TARGETS["spearman_vs_krcf"],
    }
    return summary


def _cell(value: Any, fmt: str = "") -> str:
    """A table cell; "-" for a figure that was not measured (a peer was missing)."""
    return "-" if value is None else format(value, fmt)


def print_table(result: dict[str, Any]) -> None:
    rows = [("engine", "upd/s/core", "bytes/model", "RSS/model", "checkpoint", "rho vs krcf",
             "AUC", "recall@0.1%", "fleet AUC", "fleet recall")]
    for key, e in result["engines"].items():
        fleet = e.get("fleet", {})
        rows.append((key, f"{e['updates_per_s']:,}", f"{e['bytes_per_model']:,}",
                     f"{e['rss_bytes_per_model']:,}", f"{e['checkpoint_bytes']:,}",
                     _cell(e["spearman_vs_krcf"], ".3f"), f"{e['synthetic']['auc']:.3f}",
                     f"{e['synthetic']['recall_at_fpr']}", f"{fleet.get('auc', '-')}",
                     f"{fleet.get('recall_at_fpr', '-')}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))
    if result["krcf_self_spearman"] is not None:
        print(f"krcf vs krcf with another seed: rho = {result['krcf_self_spearman']:.3f}")
    for label, key in (("", "seed_spread"), ("fleet, ", "fleet_seed_spread")):
        spread = result.get(key)
        if not spread:
            continue
        first, last = spread["seeds"][0], spread["seeds"][-1]
        for name in ("numba", "krcf"):
            if name not in spread:
                continue
            parts = [f"{k} {v['min']:.3f}..{v['max']:.3f} (mean {v['mean']:.3f})"
                     for k, v in spread[name].items()]
            print(f"{label}{name}, seeds {first}..{last}: " + ", ".join(parts))


if __name__ == "__main__":
    main()

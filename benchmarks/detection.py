"""Detection quality and speed of the detector on a fleet with labelled faults.

    python -m benchmarks.detection [--npz FILE --labels FILE] [--gpus G --duration S] --json

Without ``--npz`` it generates the synthetic fleet (``agent.fleet``; default 256 GPUs in
8 racks for 1 h at 1 Hz with 16 faults, every kind twice: 256 GPU-hours, 0.92 M GPU-steps,
about two minutes on 2 idle cores with the numba engine, the default here). Any
file in the fleet export shape works (``ts`` (G, T), ``values`` (G, T, M), ``metrics``);
metrics the file lacks are simply not sampled. Without a ``nodes`` array GPUs are grouped
8 per node and 4 nodes per rack.

The detector runs exactly as in the service (``detector.shard.DetectorShard``: features,
forest, adaptive thresholds, hysteresis, health rules, rack model), fed every GPU of a
step in one call, as one shard. Measured:

- recall per fault kind and overall: a fault (the labels sharing kind, start and end) is
  found when an alert on one of its GPUs, or on their rack, starts between its start and
  its end + 60 s; delay = alert start - fault start;
- false incidents per 1000 GPU-hours: alert episodes (on a GPU or a rack) that overlap no
  labelled fault of that GPU or its rack, each fault widened by 60 s of grace on both
  sides; GPU-hours are counted after the detector's cold start (models may not alert
  before it);
- point FPR: the fraction of GPU-steps after the cold start, outside every labelled fault
  of the GPU's rack (with grace), on which an alert covering that GPU is open;
- median detection delay over the faults found;
- speed: GPU-updates per CPU-second of the whole detector path (features, forest, rules),
  single-threaded, so per core; bytes per GPU model as the engine reports it.

Baselines in the same run and on the same data: static thresholds (the rules an SRE would
write in Prometheus: die >= 80 degC, HBM >= 90 degC, slowdown bits, hardware XIDs, ECC /
link error bursts, NaN) with the same hysteresis; and river's HalfSpaceTrees per GPU over
the detector's own feature vectors with the detector's adaptive threshold and hysteresis.
HalfSpaceTrees is pure Python (about 10 k updates/s), so it runs on a subset of GPUs
(every faulty GPU, at most two of a cooling rack, plus healthy ones up to ``--hst-gpus``)
and the detector is scored on the same subset beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    gather,
)
from detector.rules import HARDWARE_XIDS
from detector.shard import DetectorShard
from detector.thresholds import AdaptiveThresholds, ThresholdParams
from schemas.catalog import BY_NAME
from schemas.records import AlertRecord, AlertState

RESULTS = Path(__file__).parent / "results" / "detection.json"
GRACE_S = 60.0


@dataclass(slots=True)
class Fleet:
    ts: npt.NDArray[np.int64]  # (G, T)
    gathered: npt.NDArray[np.float64]  # (T, G, K)
    labels: list[dict[str, Any]]
    paths: list[str]
    rack_paths: list[str]
    node_paths: list[str]
    rack_of_gpu: npt.NDArray[np.int64]
    hz: float
    source: str

    @property
    def gpus(self) -> int:
        return self.gathered.shape[1]

    @property
    def steps(self) -> int:
        return self.gathered.shape[0]


@dataclass(slots=True)
class Episode:
    gpus: npt.NDArray[np.int64]
    start_s: float
    end_s: float
    source: str


def load_fleet(args: argparse.Namespace) -> Fleet:
    from agent.fleet.export import generate, load_npz
    from agent.fleet.faults import read_labels

    if args.npz:
        data = load_npz(args.npz)
        labels = read_labels(args.labels) if args.labels else []
        source = str(args.npz)
    else:
        data = generate(args.gpus, args.hz, args.duration, faults=args.faults, seed=args.seed)
        labels = data.labels
        source = (f"synthetic fleet: {args.gpus} GPUs, {args.duration:.0f} s at {args.hz:g} Hz, "
                  f"{args.faults} faults, seed {args.seed}")
    g = data.values.shape[0]
    if data.nodes:
        node_paths = list(data.nodes)
    else:
        node_paths = [f"bench/row-0/rack-{i // 32:03d}/node-{i // 8:04d}" for i in range(g)]
    rack_paths = [p.rsplit("/", 1)[0] for p in node_paths]
    paths = [f"{node_paths[i]}/gpu-{i}" for i in range(g)]
    racks = {r: k for k, r in enumerate(dict.fromkeys(rack_paths))}
    ids = np.array([BY_NAME[m].id for m in data.metrics], dtype=np.int64)
    gathered = gather(np.ascontiguousarray(data.values.transpose(1, 0, 2)), ids)
    ts = data.ts
    steps = ts.shape[1]
    hz = 1000.0 * (steps - 1) / max(float(np.median(ts[:, -1] - ts[:, 0])), 1.0) \
        if steps > 1 else 1.0
    return Fleet(ts, gathered, labels, paths, rack_paths, node_paths,
                 np.array([racks[r] for r in rack_paths]), round(hz, 3), source)


def step_times_ms(fleet: Fleet) -> npt.NDArray[np.int64]:
    return np.asarray(fleet.ts.min(axis=0), dtype=np.int64)


def run_detector(fleet: Fleet, config: DetectorConfig, engine: str | None
                 ) -> tuple[list[AlertRecord], float, int, DetectorShard]:
    # Compile / warm the engine outside the timed run (numba kernels, caches).
    warm = DetectorShard(config, engine)
    wids, wnodes = warm.register(fleet.paths[:8], fleet.rack_paths[:8], fleet.node_paths[:8])
    warm.process(wids, wnodes, step_times_ms(fleet)[:40], fleet.gathered[:40, :8])
    shard = DetectorShard(config, engine)
    ids, nodes = shard.register(fleet.paths, fleet.rack_paths, fleet.node_paths)
    ts = step_times_ms(fleet)
    alerts: list[AlertRecord] = []
    chunk = 60
    t0 = time.process_time()
    for s in range(0, fleet.steps, chunk):
        alerts.extend(shard.process(ids, nodes, ts[s:s + chunk], fleet.gathered[s:s + chunk]))
    cpu = time.process_time() - t0
    per_model = int(np.mean([shard.gpu_bank.engine.model_bytes(i)
                             for i in range(0, len(fleet.paths), max(1, len(fleet.paths) // 16))]))
    return alerts, cpu, per_model, shard


def peer_speed(fleet: Fleet, config: DetectorConfig, engine: str, gpus: int = 16,
               steps: int = 400) -> dict[str, Any]:
    """The same detector path with another engine on a slice of the data, for a same-run
    ratio: GPU-updates per CPU-second and bytes per model."""
    g, t = min(gpus, fleet.gpus), min(steps, fleet.steps)
    shard = DetectorShard(config, engine)
    ids, nodes = shard.register(fleet.paths[:g], fleet.rack_paths[:g], fleet.node_paths[:g])
    ts = step_times_ms(fleet)
    shard.process(ids, nodes, ts[:20], fleet.gathered[:20, :g])  # warm
    t0 = time.process_time()
    shard.process(ids, nodes, ts[20:t], fleet.gathered[20:t, :g])
    cpu = time.process_time() - t0
    return {"engine": engine, "gpus": g, "steps": t - 20,
            "updates_per_s": round(g * (t - 20) / cpu, 1),
            "bytes_per_model": int(np.mean([shard.gpu_bank.engine.model_bytes(i)
                                            for i in range(g)]))}


def episodes_from_alerts(fleet: Fleet, alerts: list[AlertRecord]) -> list[Episode]:
    t0 = float(fleet.ts.min())
    end_s = (float(fleet.ts.max()) - t0) / 1000.0 + 1.0
    gpu_index = {p: i for i, p in enumerate(fleet.paths)}
    rack_gpus = {r: np.flatnonzero(np.array(fleet.rack_paths) == r)
                 for r in set(fleet.rack_paths)}
    open_: dict[tuple[str, str], AlertRecord] = {}
    out: list[Episode] = []

    def gpus_of(entity: str) -> npt.NDArray[np.int64]:
        if entity in gpu_index:
            return np.array([gpu_index[entity]])
        return rack_gpus.get(entity, np.zeros(0, dtype=np.int64))

    for a in alerts:
        key = (a.entity, a.source)
        if a.state is AlertState.FIRING:
            open_[key] = a
        elif key in open_:
            f = open_.pop(key)
            out.append(Episode(gpus_of(a.entity), (f.started_ms - t0) / 1000.0,
                               (a.updated_ms - t0) / 1000.0, a.source))
    for f in open_.values():
        out.append(Episode(gpus_of(f.entity), (f.started_ms - t0) / 1000.0, end_s, f.source))
    return out


def evaluate(fleet: Fleet, episodes: list[Episode], cold_start_s: float,
             subset: npt.NDArray[np.int64] | None = None) -> dict[str, Any]:
    """Recall, false incidents, point FPR and delay of ``episodes`` against the labels."""
    g, t = fleet.gpus, fleet.steps
    sel = np.ones(g, dtype=bool) if subset is None else np.isin(np.arange(g), subset)
    step_s = np.arange(t) / fleet.hz
    rack = fleet.rack_of_gpu
    # Label intervals by rack (a fault excuses alerts on its rack), with grace.
    excused = np.zeros((g, t), dtype=bool)
    for lab in fleet.labels:
        r = rack[lab["gpu"]]
        win = (step_s >= lab["start_s"] - GRACE_S) & (step_s < lab["end_s"] + GRACE_S)
        excused[np.ix_(rack == r, win)] = True
    # Faults = labels grouped by (kind, start, end).
    faults: dict[tuple[str, float, float], list[int]] = {}
    for lab in fleet.labels:
        faults.setdefault((lab["kind"], lab["start_s"], lab["end_s"]), []).append(lab["gpu"])
    per_kind: dict[str, list[int]] = {}
    delays: list[float] = []
    for (kind, start, end), gpus_ in faults.items():
        gpus = np.array(gpus_)
        if not sel[gpus].any():
            continue
        found = [e.start_s - start for e in episodes
                 if start <= e.start_s <= end + GRACE_S and np.isin(e.gpus, gpus).any()]
        per_kind.setdefault(kind, []).append(1 if found else 0)
        if found:
            delays.append(max(0.0, min(found)))
    is_open = np.zeros((g, t), dtype=bool)
    false_incidents = 0
    for e in episodes:
        gsel = e.gpus[sel[e.gpus]]
        if gsel.size == 0:
            continue
        a, b = np.searchsorted(step_s, [e.start_s, e.end_s])
        is_open[np.ix_(gsel, np.arange(a, b))] = True
        if not excused[np.ix_(gsel, np.arange(a, max(b, a + 1)))].any():
            false_incidents += 1
    after = step_s >= cold_start_s
    normal = ~excused & after[None, :] & sel[:, None]
    gpu_hours = float(sel.sum()) * max(0.0, (t - after.argmax()) / fleet.hz) / 3600.0
    n_faults = sum(len(v) for v in per_kind.values())
    return {
        "faults": n_faults,
        "recall": round(sum(sum(v) for v in per_kind.values()) / max(n_faults, 1), 4),
        "recall_per_kind": {k: round(sum(v) / len(v), 3) for k, v in sorted(per_kind.items())},
        "false_incidents": false_incidents,
        "gpu_hours": round(gpu_hours, 2),
        "false_incidents_per_1000_gpu_hours": round(1000.0 * false_incidents
                                                    / max(gpu_hours, 1e-9), 3),
        "point_fpr": float(f"{is_open[normal].mean() if normal.any() else 0.0:.3g}"),
        "median_delay_s": round(float(np.median(delays)), 1) if delays else None,
    }


def static_baseline(fleet: Fleet, ep: EpisodeParams) -> list[AlertRecord]:
    """Fixed-threshold rules with the detector's hysteresis, as alert records."""
    from schemas.records import Severity

    g = fleet.gpus
    episodes = Episodes(ep)
    episodes.ensure(g)
    ids = np.arange(g)
    prev = np.full((g, 4), np.nan)
    out: list[AlertRecord] = []
    ts = step_times_ms(fleet)
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
        opened, resolved = episodes.step(ids, bad, bad.astype(float), int(ts[k]))
        for i in opened:
            out.append(_record(fleet.paths[i], "static", AlertState.FIRING, int(ts[k]), Severity))
        for i in resolved:
            out.append(_record(fleet.paths[i], "static", AlertState.RESOLVED, int(ts[k]),
                               Severity))
    return out


def _record(entity: str, source: str, state: AlertState, ts: int, sev: Any) -> AlertRecord:
    return AlertRecord(id="", entity=entity, level="gpu", state=state, severity=sev.WARNING,
                       source=source, summary="", score=0.0, threshold=0.0, started_ms=ts,
                       updated_ms=ts)


_HST_LO = np.array([-6, -6, -10, 0, 0, 0, -5, -5, 0, 0, 0], dtype=np.float64)
_HST_HI = np.array([14, 14, 10, 6, 5, 10, 5, 5, 2, 10, 10], dtype=np.float64)


def hst_baseline(fleet: Fleet, subset: npt.NDArray[np.int64], config: DetectorConfig
                 ) -> tuple[list[AlertRecord], float]:
    """river HalfSpaceTrees per GPU on the detector's features, same threshold/hysteresis."""
    from river.anomaly import HalfSpaceTrees

    n = len(subset)
    models = [HalfSpaceTrees(n_trees=10, height=8, window_size=250, seed=i) for i in range(n)]
    feats = FeatureState()
    feats.ensure(n)
    mc = config.model
    thr = AdaptiveThresholds(ThresholdParams(z=mc.z, floor=0.5, horizon=mc.horizon,
                                             warmup=mc.warmup, std_floor=0.02))
    thr.ensure(n)
    episodes = Episodes(config.alerts.episode_params())
    episodes.ensure(n)
    ids = np.arange(n)
    groups = np.array([hash(fleet.node_paths[i]) for i in subset], dtype=np.int64)
    ts = step_times_ms(fleet)
    names = [f.name for f in FEATURES]
    out: list[AlertRecord] = []
    from schemas.records import Severity

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
        opened, resolved = episodes.step(ids, anomalous, scores, int(ts[k]))
        for i in opened:
            out.append(_record(fleet.paths[subset[i]], "hst", AlertState.FIRING, int(ts[k]),
                               Severity))
        for i in resolved:
            out.append(_record(fleet.paths[subset[i]], "hst", AlertState.RESOLVED, int(ts[k]),
                               Severity))
    return out, time.process_time() - t0


def hst_subset(fleet: Fleet, size: int, seed: int) -> npt.NDArray[np.int64]:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--npz", type=Path, help="fleet export file (default: generate one)")
    parser.add_argument("--labels", type=Path, help="labels JSON for --npz")
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds")
    parser.add_argument("--hz", type=float, default=1.0)
    parser.add_argument("--faults", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--engine", default=None,
                        help="forest engine (default: numba when present, krcf is too slow "
                        "for a fleet-sized run in minutes)")
    parser.add_argument("--config", type=Path, help="detector TOML (model/alerts/rules)")
    parser.add_argument("--hst-gpus", type=int, default=24, help="0 skips HalfSpaceTrees")
    parser.add_argument("--peer-engine", default="krcf",
                        help="engine timed on a 16-GPU slice for a same-run speed ratio "
                        "('' skips it)")
    parser.add_argument("--json", action="store_true", help="also print the JSON object")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--dump-alerts", type=Path, help="write the detector's alert records "
                        "(JSON lines) and each false incident, for tuning")
    args = parser.parse_args(argv)

    from fleetpulse.config import load_config

    config = load_config(DetectorConfig, args.config) if args.config else DetectorConfig()
    if args.engine is None:
        from detector.engines import DEFAULT_ENGINE, ENGINE_NAMES

        args.engine = config.model.engine or ("numba" if "numba" in ENGINE_NAMES
                                              else DEFAULT_ENGINE)
    wall0 = time.perf_counter()
    fleet = load_fleet(args)
    gen_s = time.perf_counter() - wall0
    print(f"data: {fleet.source} ({fleet.gpus} GPUs x {fleet.steps} steps, "
          f"{len(fleet.labels)} labels) in {gen_s:.1f} s", file=sys.stderr)

    alerts, cpu, per_model, shard = run_detector(fleet, config, args.engine)
    engine_cfg = shard.engine_config
    cold_start_s = (config.model.warmup + engine_cfg.effective_output_after
                    + engine_cfg.shingle) / fleet.hz
    det = evaluate(fleet, episodes_from_alerts(fleet, alerts), cold_start_s)
    if args.dump_alerts:
        with args.dump_alerts.open("w") as fh:
            for a in alerts:
                fh.write(a.to_bytes().decode() + "\n")
    updates = fleet.gpus * fleet.steps
    det["updates_per_s"] = round(updates / cpu, 1)
    det["bytes_per_model"] = per_model
    det["engine"] = shard.engine_name
    det["alerts"] = len(alerts)
    # Which half found what: the forests alone (GPU and rack) and the rules alone.
    models_only = [a for a in alerts if a.source.startswith("model:")]
    rules_only = [a for a in alerts if a.source.startswith("rule:")]
    det["forest_only"] = {k: v for k, v in evaluate(
        fleet, episodes_from_alerts(fleet, models_only), cold_start_s).items()
        if k in ("recall", "recall_per_kind", "false_incidents", "median_delay_s")}
    det["rules_only"] = {k: v for k, v in evaluate(
        fleet, episodes_from_alerts(fleet, rules_only), cold_start_s).items()
        if k in ("recall", "recall_per_kind", "false_incidents", "median_delay_s")}
    det["by_source"] = {}
    for a in alerts:
        if a.state is AlertState.FIRING:
            det["by_source"][a.source] = det["by_source"].get(a.source, 0) + 1

    static = evaluate(fleet, episodes_from_alerts(
        fleet, static_baseline(fleet, config.alerts.episode_params())), cold_start_s)

    peer: dict[str, Any] | None = None
    if args.peer_engine and args.peer_engine != shard.engine_name:
        peer = peer_speed(fleet, config, args.peer_engine)
        peer["detector_speedup"] = round(det["updates_per_s"] / peer["updates_per_s"], 2)
    hst: dict[str, Any] | None = None
    det_subset: dict[str, Any] | None = None
    if args.hst_gpus > 0:
        subset = hst_subset(fleet, args.hst_gpus, args.seed)
        hst_alerts, hst_cpu = hst_baseline(fleet, subset, config)
        hst = evaluate(fleet, episodes_from_alerts(fleet, hst_alerts), cold_start_s, subset)
        hst["gpus"] = len(subset)
        hst["updates_per_s"] = round(len(subset) * fleet.steps / hst_cpu, 1)
        det_subset = evaluate(fleet, episodes_from_alerts(fleet, alerts), cold_start_s, subset)

    rows = [("detector (" + shard.engine_name + ")", det), ("static thresholds", static)]
    if hst is not None and det_subset is not None:
        rows += [(f"detector, HST subset ({hst['gpus']} GPUs)", det_subset),
                 ("river HalfSpaceTrees", hst)]
    print(f"\n{'method':<34} {'recall':>7} {'false/1000h':>12} {'point FPR':>10} "
          f"{'delay s':>8} {'upd/s':>9}")
    for name, r in rows:
        delay = r["median_delay_s"]
        print(f"{name:<34} {r['recall']:>7.3f} {r['false_incidents_per_1000_gpu_hours']:>12.2f} "
              f"{r['point_fpr']:>10.2e} {delay if delay is not None else '-':>8} "
              f"{r.get('updates_per_s', '-'):>9}")
    print("\nrecall per kind:")
    kinds = sorted(det["recall_per_kind"])
    print("  " + "  ".join(f"{k}={det['recall_per_kind'][k]:.2f}" for k in kinds))
    print(f"detector alerts by source: {det['by_source']}")
    for part in ("forest_only", "rules_only"):
        r = det[part]
        print(f"{part.replace('_', ' ')}: recall {r['recall']:.3f}, {r['false_incidents']} false "
              f"incidents, median delay {r['median_delay_s']} s; "
              + "  ".join(f"{k}={v:.2f}" for k, v in r["recall_per_kind"].items()))
    print(f"bytes per GPU model ({shard.engine_name}): {per_model}")
    if peer is not None:
        print(f"same detector path with {peer['engine']} on {peer['gpus']} GPUs x "
              f"{peer['steps']} steps: {peer['updates_per_s']:,.0f} updates/s, "
              f"{peer['bytes_per_model']} bytes/model; {shard.engine_name} is "
              f"{peer['detector_speedup']}x faster")

    result: dict[str, Any] = {
        "recall": det["recall"],
        "false_incidents_per_1000_gpu_hours": det["false_incidents_per_1000_gpu_hours"],
        "point_fpr": det["point_fpr"],
        "median_delay_s": det["median_delay_s"],
        "updates_per_s": det["updates_per_s"],
        "bytes_per_model": per_model,
        "engine": shard.engine_name,
        "data": fleet.source,
        "gpus": fleet.gpus,
        "steps": fleet.steps,
        "hz": fleet.hz,
        "cold_start_s": round(cold_start_s, 1),
        "detector": det,
        "static_thresholds": static,
        "halfspacetrees": hst,
        "peer_engine": peer,
        "detector_on_hst_subset": det_subset,
        "targets": {"recall": 0.95, "false_incidents_per_1000_gpu_hours": 1.0,
                    "point_fpr": 1e-4, "median_delay_s": 30.0},
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: result[k] for k in ("recall", "false_incidents_per_1000_gpu_hours",
                                      "point_fpr", "median_delay_s", "updates_per_s",
                                      "bytes_per_model", "engine")}
    summary["static_recall"] = static["recall"]
    summary["hst_recall"] = hst["recall"] if hst else None
    summary["peer_updates_per_s"] = peer["updates_per_s"] if peer else None
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())



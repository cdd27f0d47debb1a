"""Detection quality and speed of the detector on a fleet with labelled faults.

    python -m benchmarks.detection [--npz FILE --labels FILE] [--gpus G --duration S] --json
    python -m benchmarks.detection --job-peers   # stragglers: job peers beside node peers

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
  its end + 60 s; delay = alert start - fault start. A stuck sensor whose labels say when
  its die first stood 2 degC off the frozen reading (``visible_s``, written by the fleet
  model) is late only from then, and one whose die never did is counted apart as latent
  (``latent_by_kind``): it changed nothing in the data;
- false incidents per 1000 GPU-hours: alert episodes (on a GPU or a rack) that overlap no
  labelled fault of that GPU or its rack, each fault widened by 60 s of grace on both
  sides; GPU-hours are counted after the detector's cold start (models may not alert
  before it);
- point FPR: the fraction of GPU-steps after the cold start, outside every labelled fault
  of the GPU's rack (with grace), on which an alert covering that GPU is open;
- median detection delay over the faults found;
- all of these over the *pages*, the alerts of severity warning or critical; ``info``
  alerts (the forests' by default, ``alerts.model_severity``) page nobody and are counted
  apart as signals per 1000 GPU-days;
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
import dataclasses
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.detection_baselines import (
    hst_baseline,
    hst_subset,
    mad_baseline,
    random_baseline,
    static_baseline,
)
from detector.config import DetectorConfig
from detector.features import gather
from detector.shard import DetectorShard
from schemas.attribution import Attachment
from schemas.catalog import BY_NAME
from schemas.records import AlertRecord, AlertState, Severity

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
    attachments: tuple[tuple[int, int, Attachment], ...] = ()
    """(time ms, GPU, attachment) of a fleet that ran jobs, in time order."""

    @property
    def gpus(self) -> int:
        return self.gathered.shape[1]

    @property
    def steps(self) -> int:
        return self.gathered.shape[0]

    @property
    def step_ms(self) -> npt.NDArray[np.int64]:
        """One time per step: the earliest GPU's (nodes report with a few ms of jitter)."""
        return np.asarray(self.ts.min(axis=0), dtype=np.int64)


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
        labels = read_labels(args.labels) if args.labels else []
        return fleet_from_data(load_npz(args.npz), str(args.npz), labels)
    data = generate(args.gpus, args.hz, args.duration, faults=args.faults, seed=args.seed,
                    jobs=args.jobs)
    return fleet_from_data(data, f"synthetic fleet: {args.gpus} GPUs, {args.duration:.0f} s at "
                           f"{args.hz:g} Hz, {args.faults} faults, seed {args.seed}"
                           + (", load following scheduled jobs" if args.jobs else ""))


def run_detector(fleet: Fleet, config: DetectorConfig, engine: str | None
                 ) -> tuple[list[AlertRecord], float, int, DetectorShard]:
    # Compile / warm the engine outside the timed run (numba kernels, caches).
    warm = DetectorShard(config, engine)
    wids, wnodes = warm.register(fleet.paths[:8], fleet.rack_paths[:8], fleet.node_paths[:8])
    warm.process(wids, wnodes, fleet.step_ms[:40], fleet.gathered[:40, :8])
    shard = DetectorShard(config, engine)
    ids, nodes = shard.register(fleet.paths, fleet.rack_paths, fleet.node_paths)
    ts = fleet.step_ms
    alerts: list[AlertRecord] = []
    chunk = 60
    # A chunk ends where a job attachment comes due, which is applied before the step of
    # its time (the service applies attribution events as it reads them, beside samples).
    due = np.searchsorted(ts, [ms for ms, _, _ in fleet.attachments])
    cuts = np.unique(np.concatenate([np.arange(0, fleet.steps, chunk), due, [fleet.steps]]))
    k = 0
    t0 = time.process_time()
    for s, e in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        while k < len(fleet.attachments) and due[k] <= s:
            _, gid, att = fleet.attachments[k]
            shard.jobs.attach(int(ids[gid]), att)
            k += 1
        alerts.extend(shard.process(ids, nodes, ts[s:e], fleet.gathered[s:e]))
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
    ts = fleet.step_ms
    shard.process(ids, nodes, ts[:20], fleet.gathered[:20, :g])  # warm
    t0 = time.process_time()
    shard.process(ids, nodes, ts[20:t], fleet.gathered[20:t, :g])
    cpu = time.process_time() - t0
    return {"engine": engine, "gpus": g, "steps": t - 20,
            "updates_per_s": round(g * (t - 20) / cpu, 1),
            "bytes_per_model": int(np.mean([shard.gpu_bank.engine.model_bytes(i)
                                            for i in range(g)]))}


def pages(alerts: list[AlertRecord]) -> list[AlertRecord]:
    """The alerts that page someone: every severity but ``info`` (a signal)."""
    return [a for a in alerts if a.severity is not Severity.INFO]


def signals(alerts: list[AlertRecord]) -> list[AlertRecord]:
    """The ``info`` alerts: signals that page nobody (the rest of :func:`pages`)."""
    return [a for a in alerts if a.severity is Severity.INFO]


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
    faults: dict[tuple[str, float, float], list[dict[str, Any]]] = {}
    for lab in fleet.labels:
        faults.setdefault((lab["kind"], lab["start_s"], lab["end_s"]), []).append(lab)
    per_kind: dict[str, list[int]] = {}
    delays: list[float] = []
    missed: list[dict[str, Any]] = []
    # Each fault found: what it was, how late, and the source that found it first (where
    # the delay comes from, which the medians do not say).
    found_faults: list[dict[str, Any]] = []
    delays_by_kind: dict[str, list[float]] = {}
    # Delays of faults at full strength from their first second (no ramp): a ramp's delay
    # also counts the minutes it spent too small to see, which is the fault's, not the rule's.
    delays_abrupt: list[float] = []
    latent: dict[str, int] = {}
    for (kind, start, end), labs in faults.items():
        gpus = np.array([lab["gpu"] for lab in labs])
        if not sel[gpus].any():
            continue
        # A stuck sensor whose die never moved from the frozen reading left no trace in the
        # data (``agent.fleet.faults.STUCK_VISIBLE_C``): it is no fault to find (its window
        # still excuses alerts), and one that showed is late only from when it showed.
        onset = start
        if any("visible_s" in lab for lab in labs):
            shown = [lab["visible_s"] for lab in labs if lab.get("visible_s") is not None]
            if not shown:
                latent[kind] = latent.get(kind, 0) + 1
                continue
            onset = max(start, min(shown))
        hits = [e for e in episodes
                if start <= e.start_s <= end + GRACE_S and np.isin(e.gpus, gpus).any()]
        per_kind.setdefault(kind, []).append(1 if hits else 0)
        if hits:
            first = min(hits, key=lambda e: e.start_s)
            delays.append(max(0.0, first.start_s - onset))
            delays_by_kind.setdefault(kind, []).append(round(delays[-1], 1))
            ramp_s = max((lab.get("ramp_s") or 0.0) for lab in labs)
            found_faults.append({"kind": kind, "gpu": int(gpus[0]), "gpus": len(gpus),
                                 "magnitude": labs[0].get("magnitude"), "ramp_s": ramp_s,
                                 "delay_s": round(delays[-1], 1), "source": first.source})
            if ramp_s <= 0.0:
                delays_abrupt.append(delays[-1])
        else:
            lab = labs[0]
            missed.append({"kind": kind, "gpu": int(gpus[0]), "gpus": len(gpus),
                           "start_s": start, "end_s": end,
                           "magnitude": lab.get("magnitude"), "ramp_s": lab.get("ramp_s")}
                          | ({"visible_s": onset} if onset != start else {}))
    after = step_s >= cold_start_s
    normal = ~excused & after[None, :] & sel[:, None]
    is_open = np.zeros((g, t), dtype=bool)
    false_eps: list[Episode] = []
    # Open GPU-steps outside every fault (and its grace) by source: where point FPR comes from.
    fpr_steps: dict[str, int] = {}
    for e in episodes:
        gsel = e.gpus[sel[e.gpus]]
        if gsel.size == 0:
            continue
        a, b = np.searchsorted(step_s, [e.start_s, e.end_s])
        is_open[np.ix_(gsel, np.arange(a, b))] = True
        outside = int(normal[np.ix_(gsel, np.arange(a, b))].sum())
        if outside:
            fpr_steps[e.source] = fpr_steps.get(e.source, 0) + outside
        # An episode that opens at the last sample (or later: a rule's hold ends past the
        # data) is judged by the last step.
        if not excused[np.ix_(gsel, np.arange(min(a, t - 1), min(max(b, a + 1), t)))].any():
            false_eps.append(e)
    false_incidents = len(incidents_of(false_eps, rack))
    false_by_source: dict[str, int] = {}
    for e in false_eps:
        false_by_source[e.source] = false_by_source.get(e.source, 0) + 1
    gpu_days = float(sel.sum()) * max(0.0, (t - after.argmax()) / fleet.hz) / 86_400.0
    n_faults = sum(len(v) for v in per_kind.values())
    return {
        "faults": n_faults,
        "found": sum(sum(v) for v in per_kind.values()),
        "recall": round(sum(sum(v) for v in per_kind.values()) / max(n_faults, 1), 4),
        "recall_per_kind": {k: round(sum(v) / len(v), 3) for k, v in sorted(per_kind.items())},
        "recall_per_kind_counts": {k: [sum(v), len(v)] for k, v in sorted(per_kind.items())},
        "latent_by_kind": dict(sorted(latent.items())),
        "false_incidents": false_incidents,
        "false_episodes_by_source": dict(sorted(false_by_source.items())),
        "gpu_days": round(gpu_days, 3),
        "false_incidents_per_1000_gpu_days": round(1000.0 * false_incidents
                                                   / max(gpu_days, 1e-9), 2),
        "false_per_1000_gpu_days_upper95": round(1000.0 * poisson_upper(false_incidents)
                                                 / max(gpu_days, 1e-9), 2),
        "point_fpr": float(f"{is_open[normal].mean() if normal.any() else 0.0:.3g}"),
        "median_delay_s": round(float(np.median(delays)), 1) if delays else None,
        "delays_s": [round(d, 1) for d in sorted(delays)],
        "median_delay_abrupt_s": (round(float(np.median(delays_abrupt)), 1)
                                  if delays_abrupt else None),
        "delays_abrupt_s": [round(d, 1) for d in sorted(delays_abrupt)],
        "delays_by_kind": {k: sorted(v) for k, v in sorted(delays_by_kind.items())},
        "missed": missed,
        "found_faults": found_faults,
        "normal_steps": int(normal.sum()),
        "outside_steps_by_source": dict(sorted(fpr_steps.items())),
    }


def incidents_of(episodes: list[Episode], rack: npt.NDArray[np.int64]) -> list[list[Episode]]:
    """Episodes grouped as an SRE sees them: one cause, one incident.

    Episodes on GPUs of the same rack that overlap in time (within ``GRACE_S``) are one
    incident: a GPU alert beside its rack's, a rule and a model on the same GPU.
    """
    racks_of: list[set[int]] = []
    ends: list[float] = []
    members: list[list[Episode]] = []
    for e in sorted(episodes, key=lambda e: e.start_s):
        racks = {int(r) for r in rack[e.gpus]}
        i = next((i for i in range(len(members))
                  if racks & racks_of[i] and e.start_s <= ends[i] + GRACE_S), None)
        if i is None:
            racks_of.append(racks)
            ends.append(e.end_s)
            members.append([e])
        else:
            racks_of[i] |= racks
            ends[i] = max(ends[i], e.end_s)
            members[i].append(e)
    return members


def poisson_upper(k: int, confidence: float = 0.95) -> float:
    """Upper confidence bound of a Poisson mean after ``k`` events (exact, by bisection)."""
    lo, hi = float(k), float(k) + 10.0 + 10.0 * np.sqrt(k + 1.0)

    i = np.arange(k + 1, dtype=np.float64)
    log_fact = np.cumsum(np.log(np.maximum(i, 1.0)))

    def cdf(mu: float) -> float:
        # In logs: exp(-mu) alone underflows to 0 for mu above ~745 (hundreds of events).
        log_terms = i * np.log(mu) - mu - log_fact
        top = float(log_terms.max())
        return float(np.exp(top) * np.exp(log_terms - top).sum())

    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if cdf(mid) > 1.0 - confidence:
            lo = mid
        else:
            hi = mid
    return hi


def fleet_from_data(data: Any, source: str, labels: list[dict[str, Any]] | None = None
                    ) -> Fleet:
    """A :class:`Fleet` from a fleet export (``agent.fleet.FleetData`` or a loaded npz)."""
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
    return Fleet(ts, gathered, data.labels if labels is None else labels, paths, rack_paths,
                 node_paths, np.array([racks[r] for r in rack_paths]), round(hz, 3), source,
                 tuple(getattr(data, "attachments", ())))


BASELINES = ("static", "mad", "random", "hst")


def cold_start(config: DetectorConfig, hz: float) -> float:
    """Seconds before the models may alert: their warm-up in model steps, one per
    ``model.step_s`` (or per sample, when samples are sparser than that)."""
    mc = config.model
    step = max(mc.step_s, 1.0 / hz)
    return (mc.warmup + mc.sample_size // 4 + mc.shingle) * step


def run_methods(fleet: Fleet, config: DetectorConfig, engine: str, *, seed: int,
                baselines: tuple[str, ...] = BASELINES, hst_gpus: int = 24,
                dump_alerts: Path | None = None) -> dict[str, Any]:
    """The detector and the chosen baselines on one fleet, each scored by ``evaluate``."""
    alerts, cpu, per_model, shard = run_detector(fleet, config, engine)
    paging = pages(alerts)
    cold_start_s = cold_start(config, fleet.hz)
    det = evaluate(fleet, episodes_from_alerts(fleet, paging), cold_start_s)
    info = evaluate(fleet, episodes_from_alerts(fleet, signals(alerts)), cold_start_s)
    det["signals"] = {k: info[k] for k in ("false_incidents",
                                           "false_incidents_per_1000_gpu_days")}
    if dump_alerts:
        with dump_alerts.open("w") as fh:
            for a in alerts:
                fh.write(a.to_bytes().decode() + "\n")
    det["updates_per_s"] = round(fleet.gpus * fleet.steps / max(cpu, 1e-9), 1)
    det["bytes_per_model"] = per_model
    det["engine"] = shard.engine_name
    det["alerts"] = len(alerts)
    # Which half found what: the forests alone (GPU and rack) and the rules alone.
    keep = ("recall", "recall_per_kind", "false_incidents", "median_delay_s")
    for part, prefix in (("forest_only", "model:"), ("rules_only", "rule:")):
        mine = [a for a in alerts if a.source.startswith(prefix)]
        det[part] = {k: v for k, v in evaluate(
            fleet, episodes_from_alerts(fleet, mine), cold_start_s).items() if k in keep}
    det["by_source"] = {}
    for a in alerts:
        if a.state is AlertState.FIRING:
            det["by_source"][a.source] = det["by_source"].get(a.source, 0) + 1
    out: dict[str, Any] = {"detector": det, "cold_start_s": round(cold_start_s, 1),
                           "engine": shard.engine_name}
    ep = config.alerts.episode_params()
    if "static" in baselines:
        out["static"] = evaluate(fleet, episodes_from_alerts(fleet, static_baseline(fleet, ep)),
                                 cold_start_s)
    if "mad" in baselines:
        out["mad"] = evaluate(fleet, episodes_from_alerts(fleet, mad_baseline(fleet, ep)),
                              cold_start_s)
    if "random" in baselines:
        out["random"] = evaluate(fleet, episodes_from_alerts(
            fleet, random_baseline(fleet, paging, seed)), cold_start_s)
    if "hst" in baselines and hst_gpus > 0:
        subset = hst_subset(fleet, hst_gpus, seed)
        hst_alerts, hst_cpu = hst_baseline(fleet, subset, config)
        hst = evaluate(fleet, episodes_from_alerts(fleet, hst_alerts), cold_start_s, subset)
        hst["gpus"] = len(subset)
        hst["updates_per_s"] = round(len(subset) * fleet.steps / max(hst_cpu, 1e-9), 1)
        out["hst"] = hst
        out["detector_on_hst_subset"] = evaluate(fleet, episodes_from_alerts(fleet, paging),
                                                 cold_start_s, subset)
    out["_shard"] = shard
    return out


METHOD_NAMES = {
    "detector": "detector",
    "static": "static thresholds",
    "mad": "per-node MAD outliers",
    "random": "random, same alert budget",
    "detector_node_peers": "detector, jobs unknown",
    "detector_on_hst_subset": "detector, HST subset",
    "hst": "river HalfSpaceTrees",
}


def print_table(rows: list[tuple[str, dict[str, Any]]]) -> None:
    print(f"\n{'method':<34} {'recall':>7} {'found':>7} {'false/1000d':>12} {'(95% up)':>9} "
          f"{'point FPR':>10} {'delay s':>8}")
    for name, r in rows:
        delay = r["median_delay_s"]
        print(f"{name:<34} {r['recall']:>7.3f} {r['found']:>3}/{r['faults']:<3} "
              f"{r['false_incidents_per_1000_gpu_days']:>12.1f} "
              f"{r['false_per_1000_gpu_days_upper95']:>9.1f} {r['point_fpr']:>10.2e} "
              f"{delay if delay is not None else '-':>8}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--npz", type=Path, help="fleet export file (default: generate one)")
    parser.add_argument("--labels", type=Path, help="labels JSON for --npz")
    parser.add_argument("--zoo", action="store_true",
                        help="the fleet zoo: tuning and held-out profiles, reported apart "
                        "(benchmarks.detection_zoo; see --zoo-* there)")
    parser.add_argument("--job-peers", action="store_true",
                        help="stragglers with job peers beside node peers, on fleets whose "
                        "load follows jobs (benchmarks.detection_jobs; see its options)")
    parser.add_argument("--jobs", action="store_true",
                        help="the synthetic fleet schedules jobs and its load follows them; "
                        "the detector runs with its job attachments (job peers) and again "
                        "without (node peers only), both reported")
    parser.add_argument("--gpus", type=int, default=256)
    parser.add_argument("--duration", type=float, default=3600.0, help="seconds")
    parser.add_argument("--hz", type=float, default=1.0)
    parser.add_argument("--faults", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--engine", default=None,
                        help="forest engine (default: numba when present, krcf is too slow "
                        "for a fleet-sized run in minutes)")
    parser.add_argument("--config", type=Path, help="detector TOML (model/alerts/rules)")
    parser.add_argument("--baselines", default=",".join(BASELINES),
                        help=f"comma-separated subset of {','.join(BASELINES)} ('' for none)")
    parser.add_argument("--hst-gpus", type=int, default=24, help="0 skips HalfSpaceTrees")
    parser.add_argument("--peer-engine", default="krcf",
                        help="engine timed on a 16-GPU slice for a same-run speed ratio "
                        "('' skips it)")
    parser.add_argument("--json", action="store_true", help="also print the JSON object")
    parser.add_argument("--out", type=Path, default=None,
                        help=f"result JSON (default {RESULTS.name}, or detection_zoo.json)")
    parser.add_argument("--dump-alerts", type=Path, help="write the detector's alert records "
                        "(JSON lines) and each false incident, for tuning")
    args, rest = parser.parse_known_args(argv)
    if args.zoo:
        from benchmarks.detection_zoo import main as zoo_main

        return zoo_main(rest, args)
    if args.job_peers:
        from benchmarks.detection_jobs import main as jobs_main

        return jobs_main(rest + ["--json"] * args.json
                         + (["--out", str(args.out)] if args.out else []))
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    from fleetpulse.config import load_config

    config = load_config(DetectorConfig, args.config) if args.config else DetectorConfig()
    engine = resolve_engine(args.engine, config)
    wall0 = time.perf_counter()
    fleet = load_fleet(args)
    gen_s = time.perf_counter() - wall0
    print(f"data: {fleet.source} ({fleet.gpus} GPUs x {fleet.steps} steps, "
          f"{len(fleet.labels)} labels) in {gen_s:.1f} s", file=sys.stderr)
    baselines = tuple(b for b in args.baselines.split(",") if b)
    unknown = set(baselines) - set(BASELINES)
    if unknown:
        parser.error(f"--baselines: unknown {sorted(unknown)}; choose from {BASELINES}")
    res = run_methods(fleet, config, engine, seed=args.seed, baselines=baselines,
                      hst_gpus=args.hst_gpus, dump_alerts=args.dump_alerts)
    shard = res.pop("_shard")
    det = res["detector"]
    no_jobs: dict[str, Any] | None = None
    if args.jobs:
        if not fleet.attachments:
            parser.error("--jobs: the fleet scheduled no jobs")
        off = dataclasses.replace(config, job_peers=dataclasses.replace(config.job_peers,
                                                                        enabled=False))
        no_jobs = run_methods(fleet, off, engine, seed=args.seed, baselines=())["detector"]
        res["detector_node_peers"] = no_jobs
    from benchmarks.peers import import_peer, missing_peers

    peer: dict[str, Any] | None = None
    if (args.peer_engine and args.peer_engine != shard.engine_name
            and (args.peer_engine != "krcf" or import_peer("krcf") is not None)):
        peer = peer_speed(fleet, config, args.peer_engine)
        peer["detector_speedup"] = round(det["updates_per_s"] / peer["updates_per_s"], 2)

    print_table([(METHOD_NAMES[k] + (f" ({shard.engine_name})" if k == "detector" else ""), r)
                 for k, r in res.items() if k in METHOD_NAMES])
    print("\nrecall per kind:")
    kinds = sorted(det["recall_per_kind"])
    print("  " + "  ".join(f"{k}={det['recall_per_kind'][k]:.2f}" for k in kinds))
    print(f"detector alerts by source: {det['by_source']}")
    print(f"detector false episodes by source: {det['false_episodes_by_source']}")
    if no_jobs is not None:
        print(f"jobs unknown: alerts by source {no_jobs['by_source']}; false episodes by "
              f"source {no_jobs['false_episodes_by_source']}")
    for part in ("forest_only", "rules_only"):
        r = det[part]
        print(f"{part.replace('_', ' ')}: recall {r['recall']:.3f}, {r['false_incidents']} false "
              f"incidents, median delay {r['median_delay_s']} s; "
              + "  ".join(f"{k}={v:.2f}" for k, v in r["recall_per_kind"].items()))
    print(f"detector: {det['updates_per_s']:,.0f} GPU-updates per CPU-second; "
          f"bytes per GPU model ({shard.engine_name}): {det['bytes_per_model']}")
    if peer is not None:
        print(f"same detector path with {peer['engine']} on {peer['gpus']} GPUs x "
              f"{peer['steps']} steps: {peer['updates_per_s']:,.0f} updates/s, "
              f"{peer['bytes_per_model']} bytes/model; {shard.engine_name} is "
              f"{peer['detector_speedup']}x faster")

    result: dict[str, Any] = {
        "recall": det["recall"],
        "false_incidents_per_1000_gpu_days": det["false_incidents_per_1000_gpu_days"],
        "point_fpr": det["point_fpr"],
        "median_delay_s": det["median_delay_s"],
        "updates_per_s": det["updates_per_s"],
        "bytes_per_model": det["bytes_per_model"],
        "engine": shard.engine_name,
        "data": fleet.source,
        "gpus": fleet.gpus,
        "steps": fleet.steps,
        "hz": fleet.hz,
        "cold_start_s": res["cold_start_s"],
        "detector": det,
        "static_thresholds": res.get("static"),
        "mad_outliers": res.get("mad"),
        "random": res.get("random"),
        "halfspacetrees": res.get("hst"),
        "detector_on_hst_subset": res.get("detector_on_hst_subset"),
        "detector_jobs_unknown": no_jobs,
        "peer_engine": peer,
        "missing_peers": missing_peers(),
        "targets": TARGETS,
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    out = args.out or RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: result[k] for k in ("recall", "false_incidents_per_1000_gpu_days",
                                      "point_fpr", "median_delay_s", "updates_per_s",
                                      "bytes_per_model", "engine")}
    for key in ("static", "mad", "random", "hst"):
        summary[f"{key}_recall"] = res[key]["recall"] if key in res else None
    summary["peer_updates_per_s"] = peer["updates_per_s"] if peer else None
    print(json.dumps(summary))
    return 0


TARGETS: dict[str, float] = {"recall": 0.95, "false_incidents_per_1000_gpu_days": 1.0,
                             "point_fpr": 1e-4, "median_delay_s": 30.0}


def resolve_engine(name: str | None, config: DetectorConfig) -> str:
    if name:
        return name
    from detector.engines import DEFAULT_ENGINE, ENGINE_NAMES

    return config.model.engine or ("numba" if "numba" in ENGINE_NAMES else DEFAULT_ENGINE)


if __name__ == "__main__":
    sys.exit(main())

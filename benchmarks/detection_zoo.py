"""Detection on the fleet zoo: settings chosen on tuning draws, reported on held-out ones.

    python -m benchmarks.detection --zoo [--zoo-splits tuning,heldout,named]
        [--zoo-count N] [--zoo-gpus G] [--zoo-duration S] [--zoo-faults K] [--zoo-max-hz H]

One synthetic fleet teaches a detector that fleet's habits, so every threshold here was
chosen on the tuning draws of the zoo (``agent.fleet.zoo.ZOO_TUNING_SEEDS``: profiles drawn
from wide, documented ranges of cooling, sensors, power, workloads, missing metrics and
sample rates) and is reported, separately, on draws it never saw
(``ZOO_HELDOUT_SEEDS``: the same ranges, other seeds) and on the hand-set corners
(``NAMED_PROFILES``, among them the independent fleet the detector once failed on).

Each profile runs the whole detector and the baselines of ``benchmarks.detection`` (static
thresholds, per-node MAD outliers, a random detector with the detector's alert budget) on
the same data, scored the same way: event-level incident recall (no point adjustment),
false incidents per 1000 GPU-days with a 95 % upper bound, point FPR, median delay; per
split, per profile and per fault kind. The faults are the zoo's: every kind the profile's
metrics can show, from barely visible to classic, abrupt or ramping over 5-30 minutes.

The false-incident rate from these runs is a rough one (tens of GPU-days); the soak
benchmark (``benchmarks.detection_soak``) measures it over 1000 GPU-days and more.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.detection import (
    BASELINES,
    METHOD_NAMES,
    TARGETS,
    cold_start,
    fleet_from_data,
    print_table,
    resolve_engine,
    run_methods,
)
from detector.config import DetectorConfig

RESULTS = Path(__file__).parent / "results" / "detection_zoo.json"
SPLITS = ("tuning", "heldout", "named")


def profiles_of(split: str, count: int, heldout_from: int = 0) -> list[int | str]:
    """The draws of ``split``; held-out ones from index ``heldout_from`` on."""
    from agent.fleet.zoo import NAMED_PROFILES, ZOO_HELDOUT_SEEDS, ZOO_TUNING_SEEDS

    if split == "tuning":
        return list(ZOO_TUNING_SEEDS[:count])
    if split == "heldout":
        return list(ZOO_HELDOUT_SEEDS[heldout_from:heldout_from + count])
    named: list[int | str] = [n for n in NAMED_PROFILES if n != "default"]
    return named[:count]


def describe(profile: Any) -> str:
    # One name per family of metrics (five nvlink counters read "nvlink" once).
    missing = ",".join(dict.fromkeys(m.removeprefix("fleetpulse_gpu_").split("_")[0]
                                     for m in profile.missing))
    return (f"{profile.cooling} tau {profile.die_tau_s:.0f}s, {profile.temp_resolution_c:g}C, "
            f"{profile.hz:g}Hz, {profile.power_limit_w:.0f}W"
            + (f", no {missing}" if missing else ""))


def pool(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """One method's results over several fleets: counts add, rates are recomputed."""
    from benchmarks.detection import poisson_upper

    faults = sum(r["faults"] for r in rows)
    found = sum(r["found"] for r in rows)
    false = sum(r["false_incidents"] for r in rows)
    days = sum(r["gpu_days"] for r in rows)
    delays = sorted(d for r in rows for d in r["delays_s"])
    abrupt = sorted(d for r in rows for d in r.get("delays_abrupt_s", []))
    kinds: dict[str, list[float]] = {}
    for r in rows:
        for k, v in r["recall_per_kind_counts"].items():
            acc = kinds.setdefault(k, [0.0, 0.0])
            acc[0] += v[0]
            acc[1] += v[1]
    latent: dict[str, int] = {}
    for r in rows:
        for k, n in r.get("latent_by_kind", {}).items():
            latent[k] = latent.get(k, 0) + n
    by_source: dict[str, int] = {}
    for r in rows:
        for k, v in r["false_episodes_by_source"].items():
            by_source[k] = by_source.get(k, 0) + v
    fpr = float(np.average([r["point_fpr"] for r in rows],
                           weights=[max(r["gpu_days"], 1e-9) for r in rows]))
    outside: dict[str, int] = {}
    for r in rows:
        for k, v in r.get("outside_steps_by_source", {}).items():
            outside[k] = outside.get(k, 0) + v
    normal = sum(r.get("normal_steps", 0) for r in rows)
    return {
        "faults": faults, "found": found, "recall": round(found / max(faults, 1), 4),
        "recall_per_kind": {k: round(v[0] / v[1], 3) for k, v in sorted(kinds.items())},
        "recall_per_kind_counts": {k: v for k, v in sorted(kinds.items())},
        "latent_by_kind": dict(sorted(latent.items())),
        "false_incidents": false, "gpu_days": round(days, 3),
        "false_incidents_per_1000_gpu_days": round(1000.0 * false / max(days, 1e-9), 2),
        "false_per_1000_gpu_days_upper95": round(1000.0 * poisson_upper(false)
                                                 / max(days, 1e-9), 2),
        "false_episodes_by_source": dict(sorted(by_source.items())),
        "point_fpr": float(f"{fpr:.3g}"),
        "median_delay_s": round(float(np.median(delays)), 1) if delays else None,
        "delays_s": delays,
        "median_delay_abrupt_s": round(float(np.median(abrupt)), 1) if abrupt else None,
        "delays_abrupt_s": abrupt,
        "delays_by_kind": {k: sorted(d for r in rows for d in r.get("delays_by_kind", {})
                                     .get(k, [])) for k in sorted(kinds)},
        "missed": [m for r in rows for m in r.get("missed", [])],
        # Point FPR per source: open GPU-steps outside every fault over all normal GPU-steps.
        "point_fpr_by_source": {k: float(f"{v / max(normal, 1):.3g}")
                                for k, v in sorted(outside.items())},
    }


def main(argv: list[str], base: argparse.Namespace) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks.detection --zoo")
    parser.add_argument("--zoo-splits", default="tuning,heldout",
                        help=f"comma-separated subset of {','.join(SPLITS)}")
    parser.add_argument("--zoo-count", type=int, default=6, help="profiles per split")
    parser.add_argument("--zoo-profiles", default="",
                        help="run only these (seeds or names, comma-separated), as split 'chosen'")
    parser.add_argument("--zoo-gpus", type=int, default=64)
    parser.add_argument("--zoo-heldout-from", type=int, default=0,
                        help="index (not seed) of the first held-out draw: a draw whose misses "
                        "someone has studied is tuning data in all but name, so report on the "
                        "next")
    parser.add_argument("--zoo-duration", type=float, default=7200.0, help="seconds")
    parser.add_argument("--zoo-faults", type=int, default=12)
    parser.add_argument("--zoo-max-hz", type=float, default=2.0,
                        help="profiles sampled faster run at this rate (the detector steps "
                        "per sample; 0 keeps every profile's own rate)")
    args = parser.parse_args(argv)

    from agent.fleet.export import generate_zoo
    from agent.fleet.zoo import named_or_drawn
    from fleetpulse.config import load_config

    config = load_config(DetectorConfig, base.config) if base.config else DetectorConfig()
    engine = resolve_engine(base.engine, config)
    baselines = tuple(b for b in base.baselines.split(",") if b and b != "hst")
    wall0 = time.perf_counter()
    if args.zoo_profiles:
        plan = {"chosen": [int(p) if p.lstrip("-").isdigit() else p
                           for p in args.zoo_profiles.split(",")]}
    else:
        splits = [s for s in args.zoo_splits.split(",") if s]
        bad = set(splits) - set(SPLITS)
        if bad:
            parser.error(f"--zoo-splits: unknown {sorted(bad)}; choose from {SPLITS}")
        plan = {s: profiles_of(s, args.zoo_count, args.zoo_heldout_from) for s in splits}
        short = {s: len(p) for s, p in plan.items() if len(p) < args.zoo_count}
        if short:
            from agent.fleet.zoo import ZOO_HELDOUT_SEEDS

            parser.error(f"--zoo-count {args.zoo_count}: split(s) {short} have fewer draws"
                         + (f"; --zoo-heldout-from is an index into the "
                            f"{len(ZOO_HELDOUT_SEEDS)} held-out draws (seeds "
                            f"{ZOO_HELDOUT_SEEDS[0]}-{ZOO_HELDOUT_SEEDS[-1]}), not a seed"
                            if "heldout" in short else ""))

    per_profile: dict[str, list[dict[str, Any]]] = {}
    for split, specs in plan.items():
        for spec in specs:
            t0 = time.perf_counter()
            seed = spec if isinstance(spec, int) else 7000 + sorted(plan[split]).index(spec)
            prof = named_or_drawn(spec)
            hz = min(prof.hz, args.zoo_max_hz) if args.zoo_max_hz > 0 else prof.hz
            # Faults start after the first fifth of a run: long enough that the models are
            # out of their cold start (counted in steps, so longer at a slow rate).
            duration = max(args.zoo_duration, 5.0 * cold_start(config, hz))
            # A profile whose fleet cannot hold every fault apart (a rack per cooling fault,
            # a node per straggler) gets as many as fit, and says so.
            for faults in range(args.zoo_faults, -1, -1):
                try:
                    prof, data = generate_zoo(seed, args.zoo_gpus, duration, faults,
                                              profile=prof, hz=hz)
                    break
                except ValueError as exc:
                    if faults == 0:
                        raise
                    print(f"[{split}] {prof.name}: {exc}; trying {faults - 1}",
                          file=sys.stderr, flush=True)
            fleet = fleet_from_data(data, f"zoo {prof.name}: {describe(prof)}")
            dump = None
            if base.dump_alerts:  # a folder here: one JSON-lines file per profile
                base.dump_alerts.mkdir(parents=True, exist_ok=True)
                dump = base.dump_alerts / f"{split}-{prof.name}.jsonl"
            res = run_methods(fleet, config, engine, seed=seed, baselines=baselines,
                              hst_gpus=0, dump_alerts=dump)
            res.pop("_shard")
            row = {"split": split, "profile": prof.name, "seed": seed, "hz_run": hz,
                   "duration_s": duration,
                   "describe": describe(prof), "labels": len(data.labels),
                   "wall_s": round(time.perf_counter() - t0, 1)}
            row.update({k: v for k, v in res.items() if k in METHOD_NAMES})
            for m in METHOD_NAMES:
                for miss in row.get(m, {}).get("missed", []):
                    miss["profile"] = prof.name
            per_profile.setdefault(split, []).append(row)
            d = res["detector"]
            print(f"[{split}] {prof.name:<26} {describe(prof):<52} recall {d['found']}/"
                  f"{d['faults']} false {d['false_incidents']} ({d['gpu_days']:.2f} GPU-days) "
                  f"FPR {d['point_fpr']:.1e} delay {d['median_delay_s']} "
                  f"missed {[k for k, v in d['recall_per_kind'].items() if v < 1]} "
                  f"false by source {d['false_episodes_by_source']} [{row['wall_s']} s]",
                  file=sys.stderr, flush=True)

    methods = ["detector", *baselines]
    pooled: dict[str, dict[str, Any]] = {}
    for split, rows in per_profile.items():
        pooled[split] = {m: pool([r[m] for r in rows]) for m in methods}
        print(f"\n== {split}: {len(rows)} profiles x {args.zoo_gpus} GPUs x "
              f">= {args.zoo_duration:.0f} s ==")
        print_table([(METHOD_NAMES[m], pooled[split][m]) for m in methods])
        det = pooled[split]["detector"]
        print("detector recall per kind: " + "  ".join(
            f"{k}={v:.2f}" for k, v in det["recall_per_kind"].items()))
        if det["latent_by_kind"]:
            print(f"latent faults (nothing in the data showed them, not counted): "
                  f"{det['latent_by_kind']}")
        print(f"detector false episodes by source: {det['false_episodes_by_source']}")
        print(f"detector point FPR by source: {det['point_fpr_by_source']}")
        print(f"detector median delay on abrupt faults (no ramp): "
              f"{det['median_delay_abrupt_s']} s of {len(det['delays_abrupt_s'])} found")
        print("detector delays (s) by kind: " + "  ".join(
            f"{k}={v}" for k, v in det["delays_by_kind"].items()))
        for miss in det["missed"]:
            print(f"  missed {miss['kind']:<16} {miss['profile']:<10} gpu {miss['gpu']:<4} "
                  f"magnitude {miss['magnitude']} ramp {miss['ramp_s']} s "
                  f"[{miss['start_s']:.0f}, {miss['end_s']:.0f}) s")

    result = {
        "splits": pooled,
        "profiles": per_profile,
        "config": {"gpus": args.zoo_gpus, "duration_s": args.zoo_duration,
                   "faults": args.zoo_faults, "max_hz": args.zoo_max_hz, "engine": engine,
                   "heldout_from": args.zoo_heldout_from,
                   "detector_config": str(base.config) if base.config else "defaults"},
        "targets": TARGETS,
        "wall_s": round(time.perf_counter() - wall0, 1),
    }
    out = base.out or RESULTS
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    summary = {split: {m: {k: p[m][k] for k in ("recall", "false_incidents_per_1000_gpu_days",
                                                  "point_fpr", "median_delay_s",
                                                  "median_delay_abrupt_s")}
                       for m in methods} for split, p in pooled.items()}
    print(json.dumps(summary))
    return 0


__all__ = ["BASELINES", "main"]

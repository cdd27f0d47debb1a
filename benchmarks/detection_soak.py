"""Soak: false incidents per 1000 GPU-days on healthy fleets with normal job churn.

    python -m benchmarks.detection_soak [--parts N] [--gpus G] [--hours H] [--split heldout]
        [--resume] [--out FILE]

Real GPU faults arrive at about 0.5 per 1000 GPU-days, so a detector worth paging on must
raise less than about one false incident in that time; no short run can show it. The soak
runs the whole detector (as ``benchmarks.detection`` does) over ``parts`` healthy zoo fleets
of ``gpus`` x ``hours``, each a profile of the chosen split (held-out by default: the draws
no setting was chosen on), and adds up GPU-days and false incidents. 1024 GPUs x 24 h is
1024 GPU-days: e.g. 16 parts of 256 GPUs x 6 h. Each part is written to the result file as it
finishes, so ``--resume`` continues a soak run in pieces.

Reported: false incidents and GPU-days per part and in total, the rate per 1000 GPU-days with
an exact Poisson 95 % upper bound, the false episodes by source (which part of the detector
raised them), the signals (``info`` alerts, which page nobody) apart, and the detector's
speed. Not in CI: a full soak takes hours of CPU.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.detection import (
    cold_start,
    episodes_from_alerts,
    evaluate,
    fleet_from_data,
    pages,
    poisson_upper,
    resolve_engine,
    run_detector,
)
from detector.config import DetectorConfig
from schemas.records import Severity

RESULTS = Path(__file__).parent / "results" / "detection_soak.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=256, help="GPUs per part")
    parser.add_argument("--hours", type=float, default=6.0, help="hours per part")
    parser.add_argument("--split", choices=("tuning", "heldout"), default="heldout")
    parser.add_argument("--max-hz", type=float, default=1.0,
                        help="profiles sampled faster run at this rate (the detector steps "
                        "per sample)")
    parser.add_argument("--config", type=Path, help="detector TOML")
    parser.add_argument("--engine", default=None)
    parser.add_argument("--resume", action="store_true",
                        help="keep the parts already in --out and run the rest")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    from agent.fleet.export import generate_zoo
    from agent.fleet.zoo import ZOO_HELDOUT_SEEDS, ZOO_TUNING_SEEDS, draw_profile
    from fleetpulse.config import load_config

    config = load_config(DetectorConfig, args.config) if args.config else DetectorConfig()
    engine = resolve_engine(args.engine, config)
    seeds = ZOO_HELDOUT_SEEDS if args.split == "heldout" else ZOO_TUNING_SEEDS
    done: list[dict[str, Any]] = []
    if args.resume and args.out.exists():
        done = json.loads(args.out.read_text()).get("parts", [])
    for part in range(len(done), args.parts):
        t0 = time.perf_counter()
        seed = seeds[part % len(seeds)]
        prof = draw_profile(seed)
        hz = min(prof.hz, args.max_hz)
        # A different fleet each time a profile comes round again.
        fleet_seed = seed + 100_000 * (part // len(seeds))
        prof, data = generate_zoo(fleet_seed, args.gpus, args.hours * 3600.0, 0,
                                  profile=prof, hz=hz)
        fleet = fleet_from_data(data, f"soak part {part}: {prof.name}")
        alerts, cpu, _, _ = run_detector(fleet, config, engine)
        cold = cold_start(config, fleet.hz)
        r = evaluate(fleet, episodes_from_alerts(fleet, pages(alerts)), cold)
        info = [a for a in alerts if a.severity is Severity.INFO]
        signals = evaluate(fleet, episodes_from_alerts(fleet, info), cold)["false_incidents"]
        row = {"part": part, "profile": prof.name, "hz": hz, "gpus": args.gpus,
               "hours": args.hours, "gpu_days": r["gpu_days"],
               "false_incidents": r["false_incidents"],
               "false_episodes_by_source": r["false_episodes_by_source"],
               "point_fpr": r["point_fpr"],
               "signals": signals,
               "updates_per_s": round(fleet.gpus * fleet.steps / max(cpu, 1e-9), 1),
               "wall_s": round(time.perf_counter() - t0, 1)}
        done.append(row)
        print(f"part {part}: {prof.name} at {hz:g} Hz, {r['gpu_days']:.1f} GPU-days, "
              f"{r['false_incidents']} false incidents {r['false_episodes_by_source']} "
              f"[{row['wall_s']} s]", file=sys.stderr, flush=True)
        _write(args, done, engine)
    summary = _write(args, done, engine)
    print(json.dumps(summary))
    return 0


def _write(args: argparse.Namespace, parts: list[dict[str, Any]], engine: str
           ) -> dict[str, Any]:
    days = sum(p["gpu_days"] for p in parts)
    false = sum(p["false_incidents"] for p in parts)
    by_source: dict[str, int] = {}
    for p in parts:
        for k, v in p["false_episodes_by_source"].items():
            by_source[k] = by_source.get(k, 0) + v
    summary = {
        "parts": len(parts), "gpu_days": round(days, 2), "false_incidents": false,
        "false_incidents_per_1000_gpu_days": round(1000.0 * false / max(days, 1e-9), 2),
        "false_per_1000_gpu_days_upper95": round(1000.0 * poisson_upper(false)
                                                 / max(days, 1e-9), 2),
        "false_episodes_by_source": dict(sorted(by_source.items())),
        "split": args.split, "engine": engine,
        "target_per_1000_gpu_days": 1.0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "parts": parts}, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(main())

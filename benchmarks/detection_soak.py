"""Soak: false incidents per 1000 GPU-days on healthy fleets with normal job churn.

    python -m benchmarks.detection_soak [--parts N] [--gpus G] [--hours H] [--split heldout]
        [--draws-from K] [--pages-only] [--workers W] [--resume] [--out FILE]

Real GPU faults arrive at about 0.5 per 1000 GPU-days, so a detector worth paging on must
raise less than about one false incident in that time; no short run can show it. The soak
runs the whole detector (as ``benchmarks.detection`` does) over ``parts`` healthy zoo fleets
of ``gpus`` x ``hours``, each a profile of the chosen split (held-out by default: the draws
no setting was chosen on), and adds up GPU-days and false incidents. 1024 GPUs x 24 h is
1024 GPU-days: e.g. 16 parts of 256 GPUs x 6 h. Part k runs draw ``draws_from + k`` of the
split (cycling, with another fleet seed each time round), so a soak on draws nobody has
studied starts past the ones already looked at. Each part is written to the result file as
it finishes, so ``--resume`` continues a soak run in pieces; ``--workers`` runs that many
parts at once, each in its own process.

``--pages-only`` turns the per-GPU forests off (``model.enabled = false``): they page
nobody unless ``alerts.model_severity`` says so (refused then), and without them a GPU-step
costs about a fifth, so a soak long enough to bound a rate near 1 per 1000 GPU-days fits in
hours. The pages are exactly those of the whole detector
(``tests/test_detector_shard.py::test_turning_the_forests_off_changes_no_page``); the
signals counted are then the rack model's alone.

Reported: false incidents and GPU-days per part and in total, the rate per 1000 GPU-days with
an exact Poisson 95 % upper bound, the false episodes by source (which part of the detector
raised them), the signals (``info`` alerts, which page nobody) apart, and the detector's
speed. Not in CI: a full soak takes hours of CPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import functools
import json
import sys
import time
from collections.abc import Callable, Iterator
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
    signals,
)
from detector.config import DetectorConfig

RESULTS = Path(__file__).parent / "results" / "detection_soak.json"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=256, help="GPUs per part")
    parser.add_argument("--hours", type=float, default=6.0, help="hours per part")
    parser.add_argument("--split", choices=("tuning", "heldout"), default="heldout")
    parser.add_argument("--draws-from", type=int, default=0,
                        help="part k runs the split's draw K + k (an index into its seeds)")
    parser.add_argument("--pages-only", action="store_true",
                        help="per-GPU forests off: the same pages at a fraction of the cost")
    parser.add_argument("--max-hz", type=float, default=1.0,
                        help="profiles sampled faster run at this rate (the detector steps "
                        "per sample)")
    parser.add_argument("--config", type=Path, help="detector TOML")
    parser.add_argument("--engine", default=None)
    parser.add_argument("--workers", type=int, default=1,
                        help="parts run in this many processes at once (one core each)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the parts already in --out and run the rest")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)

    config = _config(args.config, args.pages_only)
    engine = resolve_engine(args.engine, config)
    if args.draws_from < 0:
        parser.error("--draws-from must be >= 0")
    if args.pages_only and config.alerts.model_severity != "info":
        parser.error("--pages-only: the forests page under alerts.model_severity = "
                     f"{config.alerts.model_severity!r}, so they cannot be left out")
    done: list[dict[str, Any]] = []
    if args.resume and args.out.exists():
        previous = json.loads(args.out.read_text())
        kept = {k: previous.get("summary", {}).get(k) for k in _RUN_KEYS}
        asked = {k: getattr(args, k) for k in _RUN_KEYS}
        if kept != asked:
            parser.error(f"--resume: {args.out} was run with {kept}, not {asked}")
        done = previous.get("parts", [])
    todo = [p for p in range(args.parts) if p not in {r["part"] for r in done}]
    job = functools.partial(run_part, split=args.split, draws_from=args.draws_from,
                            gpus=args.gpus, hours=args.hours, max_hz=args.max_hz,
                            config_path=args.config, pages_only=args.pages_only, engine=engine)
    with concurrent.futures.ProcessPoolExecutor(max(1, args.workers)) as pool:
        for row in _as_done(pool, job, todo, args.workers):
            done.append(row)
            done.sort(key=lambda r: int(r["part"]))
            print(f"part {row['part']}: {row['profile']} at {row['hz']:g} Hz, "
                  f"{row['gpu_days']:.1f} GPU-days, {row['false_incidents']} false incidents "
                  f"{row['false_episodes_by_source']}, {row['signals']} signals "
                  f"[{row['wall_s']} s]", file=sys.stderr, flush=True)
            _write(args, done, engine)
    summary = _write(args, done, engine)
    print(json.dumps(summary))
    return 0


_RUN_KEYS = ("split", "draws_from", "pages_only", "gpus", "hours")
"""What a resumed soak must share with the parts already in its file."""


def _config(path: Path | None, pages_only: bool) -> DetectorConfig:
    from fleetpulse.config import load_config

    config = load_config(DetectorConfig, path) if path else DetectorConfig()
    if pages_only:
        config = dataclasses.replace(config,
                                     model=dataclasses.replace(config.model, enabled=False))
    return config


def _as_done(pool: concurrent.futures.Executor, job: Callable[[int], dict[str, Any]],
             parts: list[int], workers: int) -> Iterator[dict[str, Any]]:
    """Each part's row as it finishes (in this process when ``workers`` is 1)."""
    if workers <= 1:
        yield from map(job, parts)
        return
    futures = [pool.submit(job, p) for p in parts]
    for f in concurrent.futures.as_completed(futures):
        yield f.result()


def run_part(part: int, *, split: str, draws_from: int, gpus: int, hours: float,
             max_hz: float, config_path: Path | None, pages_only: bool, engine: str
             ) -> dict[str, Any]:
    """One healthy zoo fleet of the split through the whole detector, scored."""
    from agent.fleet.export import generate_zoo
    from agent.fleet.zoo import ZOO_HELDOUT_SEEDS, ZOO_TUNING_SEEDS, draw_profile

    t0 = time.perf_counter()
    config = _config(config_path, pages_only)
    seeds = ZOO_HELDOUT_SEEDS if split == "heldout" else ZOO_TUNING_SEEDS
    draw = draws_from + part
    seed = seeds[draw % len(seeds)]
    prof = draw_profile(seed)
    hz = min(prof.hz, max_hz)
    # A different fleet each time a profile comes round again.
    fleet_seed = seed + 100_000 * (draw // len(seeds))
    prof, data = generate_zoo(fleet_seed, gpus, hours * 3600.0, 0, profile=prof, hz=hz)
    fleet = fleet_from_data(data, f"soak part {part}: {prof.name}")
    alerts, cpu, _, _ = run_detector(fleet, config, engine)
    cold = cold_start(config, fleet.hz)
    r = evaluate(fleet, episodes_from_alerts(fleet, pages(alerts)), cold)
    info = evaluate(fleet, episodes_from_alerts(fleet, signals(alerts)), cold)
    return {"part": part, "profile": prof.name, "hz": hz, "gpus": gpus, "hours": hours,
            "gpu_days": r["gpu_days"], "false_incidents": r["false_incidents"],
            "false_episodes_by_source": r["false_episodes_by_source"],
            "point_fpr": r["point_fpr"], "signals": info["false_incidents"],
            "updates_per_s": round(fleet.gpus * fleet.steps / max(cpu, 1e-9), 1),
            "wall_s": round(time.perf_counter() - t0, 1)}


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
        "signals": sum(int(p.get("signals", 0)) for p in parts),
        "false_incidents_per_1000_gpu_days": round(1000.0 * false / max(days, 1e-9), 2),
        "false_per_1000_gpu_days_upper95": round(1000.0 * poisson_upper(false)
                                                 / max(days, 1e-9), 2),
        "false_episodes_by_source": dict(sorted(by_source.items())),
        "split": args.split, "draws_from": args.draws_from, "pages_only": args.pages_only,
        "gpus": args.gpus, "hours": args.hours, "engine": engine,
        "target_per_1000_gpu_days": 1.0,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "parts": parts}, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    sys.exit(main())

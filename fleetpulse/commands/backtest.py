"""``fleetpulse backtest``: the detector over a CSV of history, to tune before going live.

    fleetpulse backtest FILE.csv --time-column C --columns a,b,... --out scores.csv
                        [--episodes alerts.csv|alerts.jsonl] [--season auto|none|1d,7d]
                        [--config config/detector.toml] [--engine NAME]

Same model, threshold and hysteresis as ``fleetpulse detector`` (see ``detector.backtest``);
the output has one row per input row: timestamp, score, threshold, anomaly (0/1). The
episodes file has one line per alert (onset, end, peak_score, duration_s, rows; JSON lines
if its name ends in .jsonl or .json), which stderr lists too. Daily and weekly cycles are
detected per column from the cold-start rows (``--season auto``) or named.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fleetpulse.config import ConfigError, load_config

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("backtest", help="run the detector over a CSV series",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("csv", type=Path, help="input CSV with a header row")
    p.add_argument("--time-column", required=True, help="column holding the time")
    p.add_argument("--columns", required=True, help="comma-separated value columns")
    p.add_argument("--out", type=Path, required=True, help="scores CSV to write")
    p.add_argument("--episodes", type=Path,
                   help="alerts file to write, one line per episode (CSV, or JSON lines "
                        "for .jsonl/.json)")
    p.add_argument("--season", default="auto",
                   help="seasonal periods to take out: auto (detect 1d / 7d per column), "
                        "none, or a list such as 1d,7d or 12h")
    p.add_argument("--config", type=Path, help="detector TOML ([model], [alerts])")
    p.add_argument("--engine", help="forest engine name")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detector.backtest import (
        BacktestError,
        backtest,
        episode_record,
        read_series,
        write_episodes,
        write_scores,
    )
    from detector.config import DetectorConfig
    from detector.seasonal import parse_seasons

    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    if not columns:
        print("backtest: --columns names no column", file=sys.stderr)
        return 2
    try:
        seasons = parse_seasons(args.season)
    except ValueError as exc:
        print(f"backtest: --season: {exc}", file=sys.stderr)
        return 2
    try:
        config = load_config(DetectorConfig, args.config)
        stamps, ms, values = read_series(args.csv, args.time_column, columns)
        result = backtest(values, ms, config, args.engine, seasons)
        write_scores(args.out, stamps, result)
        if args.episodes is not None:
            write_episodes(args.episodes, stamps, ms, result)
    except (ConfigError, BacktestError) as exc:
        print(f"backtest: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"backtest: cannot write: {exc}", file=sys.stderr)
        return 2
    for c, periods in zip(columns, result.periods, strict=True):
        if periods:
            names = ", ".join(_duration(p) for p in periods)
            print(f"backtest: {c}: seasonal periods {names} taken out", file=sys.stderr)
    for n, ep in enumerate(result.episodes, start=1):
        rec = episode_record(ep, stamps, ms)
        end = rec["end"] if rec["end"] is not None else "(open)"
        print(f"backtest: episode {n}: {rec['onset']} -> {end}, {rec['duration_s']:g} s, "
              f"{rec['rows']} rows, peak score {ep.peak:.2f}", file=sys.stderr)
    dest = f"{args.out}" + (f", {args.episodes}" if args.episodes is not None else "")
    print(f"backtest: {len(stamps)} rows, {len(columns)} columns, "
          f"{int(result.anomaly.sum())} anomalous rows in {len(result.episodes)} episode(s) "
          f"-> {dest}", file=sys.stderr)
    return 0


def _duration(ms: int) -> str:
    for unit, size in (("w", 604_800_000), ("d", 86_400_000), ("h", 3_600_000),
                       ("m", 60_000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms / 1000:g}s"

"""``fleetpulse backtest``: the detector over a CSV of history, to tune before going live.

    fleetpulse backtest FILE.csv --time-column C --columns a,b,... --out scores.csv
                        [--config config/detector.toml] [--engine NAME]

Same model, threshold and hysteresis as ``fleetpulse detector`` (see ``detector.backtest``);
the output has one row per input row: timestamp, score, threshold, anomaly (0/1).
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
    p.add_argument("--config", type=Path, help="detector TOML ([model], [alerts])")
    p.add_argument("--engine", help="forest engine name")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from detector.backtest import BacktestError, backtest, read_series, write_scores
    from detector.config import DetectorConfig

    columns = [c.strip() for c in args.columns.split(",") if c.strip()]
    if not columns:
        print("backtest: --columns names no column", file=sys.stderr)
        return 2
    try:
        config = load_config(DetectorConfig, args.config)
        stamps, ms, values = read_series(args.csv, args.time_column, columns)
        result = backtest(values, ms, config, args.engine)
        write_scores(args.out, stamps, result)
    except (ConfigError, BacktestError) as exc:
        print(f"backtest: {exc}", file=sys.stderr)
        return 2
    episodes = int((result.anomaly[1:] & ~result.anomaly[:-1]).sum() + result.anomaly[0])
    print(f"backtest: {len(stamps)} rows, {len(columns)} columns, "
          f"{int(result.anomaly.sum())} anomalous rows in {episodes} episode(s) -> {args.out}",
          file=sys.stderr)
    return 0

"""The detector over one CSV series, offline: what ``fleetpulse backtest`` runs.

The same scoring path as the live detector (:class:`~detector.model_bank.ModelBank`:
forest with internal shingling, adaptive threshold with cold start, hysteresis with
cooldown) over the chosen columns of a CSV file, one row per step. Columns have arbitrary
units, so each is scaled by its median and median absolute deviation over the cold-start
rows (the rows the model could not alert on anyway): one unit is one typical deviation.
A missing cell repeats the column's last value (0 before the first).

Output rows: ``timestamp`` (as in the input), ``score``, ``threshold``, ``anomaly`` (1 while
an episode is open, which is what an SRE would have been paged for).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt

from detector.config import DetectorConfig
from detector.engines import DEFAULT_ENGINE, EngineConfig, make_engine
from detector.model_bank import ModelBank

__all__ = ["BacktestError", "BacktestResult", "backtest", "read_series", "write_scores"]


class BacktestError(ValueError):
    """The input cannot be backtested (missing column, unparsable time); says which."""


@dataclass(frozen=True, slots=True)
class BacktestResult:
    timestamps: list[str]
    scores: npt.NDArray[np.float64]
    thresholds: npt.NDArray[np.float64]
    anomaly: npt.NDArray[np.bool_]


def _parse_time(text: str, row: int) -> int:
    """Milliseconds since the epoch from a number (s or ms) or an ISO 8601 string."""
    try:
        value = float(text)
    except ValueError:
        try:
            return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
        except ValueError:
            raise BacktestError(f"row {row}: time {text!r:.40} is neither a number nor "
                                f"ISO 8601") from None
    return int(value if value > 1e11 else value * 1000)


def read_series(path: Path, time_column: str, columns: Sequence[str]
                ) -> tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """(timestamps as written, ms, values (T, C) with NaN for missing cells)."""
    try:
        with open(path, newline="") as fh:
            return _read(fh, path, time_column, columns)
    except OSError as exc:
        raise BacktestError(f"cannot read {path}: {exc}") from exc


def _read(fh: TextIO, path: Path, time_column: str, columns: Sequence[str]
          ) -> tuple[list[str], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    reader = csv.DictReader(fh)
    header = reader.fieldnames or []
    missing = [c for c in (time_column, *columns) if c not in header]
    if missing:
        raise BacktestError(f"{path}: no column(s) {missing}; the header has {header}")
    stamps: list[str] = []
    ms: list[int] = []
    rows: list[list[float]] = []
    for i, rec in enumerate(reader, start=2):
        stamps.append(rec[time_column])
        ms.append(_parse_time(rec[time_column], i))
        vals = []
        for c in columns:
            cell = (rec.get(c) or "").strip()
            try:
                v = float(cell) if cell else math.nan
            except ValueError:
                v = math.nan
            vals.append(v)
        rows.append(vals)
    if not rows:
        raise BacktestError(f"{path} has no data rows")
    return stamps, np.array(ms, dtype=np.int64), np.array(rows, dtype=np.float64)


def _fill_and_scale(values: npt.NDArray[np.float64], cold: int) -> npt.NDArray[np.float32]:
    x = values.copy()
    for c in range(x.shape[1]):
        col = x[:, c]
        ok = np.isfinite(col)
        idx = np.where(ok, np.arange(len(col)), -1)
        np.maximum.accumulate(idx, out=idx)
        x[:, c] = np.where(idx >= 0, col[np.maximum(idx, 0)], 0.0)
    head = x[: max(cold, 1)]
    med = np.median(head, axis=0)
    mad = np.median(np.abs(head - med), axis=0) * 1.4826
    spread = np.where(mad > 0, mad, np.maximum(np.abs(med) * 0.01, 1e-6))
    return ((x - med) / spread).astype(np.float32)


def backtest(values: npt.NDArray[np.float64], ms: npt.NDArray[np.int64],
             config: DetectorConfig, engine: str | None = None) -> BacktestResult:
    """Score ``values`` (T, C) step by step exactly as the live detector would."""
    mc = config.model
    engine_config = EngineConfig(dims=values.shape[1], shingle=mc.shingle, trees=mc.trees,
                                 sample_size=mc.sample_size, time_decay=mc.time_decay or None,
                                 seed=mc.seed)
    bank = ModelBank(make_engine(engine or mc.engine or DEFAULT_ENGINE, engine_config),
                     mc.threshold_params(), config.alerts.episode_params())
    bank.ensure(1)
    points = _fill_and_scale(values, mc.warmup + engine_config.effective_output_after)
    ids = np.zeros(1, dtype=np.int64)
    t = len(points)
    scores, thr = np.zeros(t), np.zeros(t)
    anomaly = np.zeros(t, dtype=bool)
    for i in range(t):
        res = bank.step(ids, points[i : i + 1], int(ms[i]))
        scores[i] = res.batch.scores[0]
        thr[i] = res.thresholds[0]
        anomaly[i] = bank.episodes.open[0]
    return BacktestResult([], scores, thr, anomaly)


def write_scores(path: Path, stamps: Sequence[str], result: BacktestResult) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["timestamp", "score", "threshold", "anomaly"])
        for i, stamp in enumerate(stamps):
            w.writerow([stamp, f"{result.scores[i]:.6f}", f"{result.thresholds[i]:.6f}",
                        int(result.anomaly[i])])

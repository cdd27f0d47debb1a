"""The detector over one CSV series, offline: what ``fleetpulse backtest`` runs.

The same scoring path as the live detector (:class:`~detector.model_bank.ModelBank`:
forest with internal shingling, adaptive threshold with cold start, hysteresis with
cooldown) over the chosen columns of a CSV file, one row per step. Columns have arbitrary
units, so each is scaled by its median and median absolute deviation over the cold-start
rows (the rows the model could not alert on anyway): one unit is one typical deviation.
A missing cell repeats the column's last value (0 before the first).

Seasonality: a column whose cold-start rows show a daily or weekly cycle (or every column,
for the periods the caller names) reaches the forest as its residual against a streaming
seasonal baseline (:mod:`detector.seasonal`: level plus per-phase profile, in robust scales)
instead of its raw value, so the 02:00 backup job is not an alert every night and a level
shift is one episode while the level catches up.

Output rows: ``timestamp`` (as in the input), ``score``, ``threshold``, ``anomaly`` (1 while
an episode is open, which is what an SRE would have been paged for). Output episodes: one
per alert the model bank's hysteresis opened (onset, resolution or still open, peak score):
what a tool that scores alerts, not rows, should be given.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TextIO

import numpy as np
import numpy.typing as npt

from detector.config import DetectorConfig
from detector.engines import DEFAULT_ENGINE, make_engine
from detector.model_bank import ModelBank
from detector.seasonal import (
    SeasonalBaseline,
    candidate_periods,
    detect_periods,
    median_step_ms,
)

__all__ = ["BacktestError", "BacktestResult", "Episode", "backtest", "episode_record",
           "read_series", "write_episodes", "write_scores"]


class BacktestError(ValueError):
    """The input cannot be backtested (missing column, unparsable time); says which."""


@dataclass(frozen=True, slots=True)
class Episode:
    """One alert: opened and resolved by the model bank's :class:`~detector.episodes.Episodes`."""

    rows: range
    """Input rows during which it was open (``anomaly`` = 1)."""
    onset_ms: int
    """Time of the row at which it opened."""
    end_ms: int | None
    """Time of the row at which it resolved; None if still open at the last row."""
    peak: float
    """Highest score while open."""


@dataclass(frozen=True, slots=True)
class BacktestResult:
    timestamps: list[str]
    scores: npt.NDArray[np.float64]
    thresholds: npt.NDArray[np.float64]
    anomaly: npt.NDArray[np.bool_]
    episodes: list[Episode]
    periods: list[list[int]]
    """Per column, the seasonal periods (ms) taken out before the forest saw it."""


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


def _fill(values: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Each missing cell repeats its column's last value (0 before the first)."""
    x = values.copy()
    for c in range(x.shape[1]):
        col = x[:, c]
        ok = np.isfinite(col)
        idx = np.where(ok, np.arange(len(col)), -1)
        np.maximum.accumulate(idx, out=idx)
        x[:, c] = np.where(idx >= 0, col[np.maximum(idx, 0)], 0.0)
    return x


def _fill_and_scale(values: npt.NDArray[np.float64], cold: int) -> npt.NDArray[np.float32]:
    x = _fill(values)
    head = x[: max(cold, 1)]
    med = np.median(head, axis=0)
    mad = np.median(np.abs(head - med), axis=0) * 1.4826
    spread = np.where(mad > 0, mad, np.maximum(np.abs(med) * 0.01, 1e-6))
    return ((x - med) / spread).astype(np.float32)


def _seasonal_baseline(filled: npt.NDArray[np.float64], ms: npt.NDArray[np.int64], cold: int,
                       seasons: list[int] | None) -> SeasonalBaseline | None:
    """The baseline for the periods named (all columns) or detected per column (None)."""
    head, head_ms = filled[: max(cold, 1)], ms[: max(cold, 1)]
    step = median_step_ms(ms)
    if seasons is None:
        periods = candidate_periods(ms, cold)
        active = detect_periods(head, head_ms, periods)
    else:
        for p in seasons:
            if step <= 0 or p < 2 * step:
                raise BacktestError(f"season of {p / 1000:g} s is under two rows of this "
                                    f"series (one row per {step / 1000:g} s)")
        periods = list(seasons)
        active = np.ones((len(periods), filled.shape[1]), dtype=bool)
    keep = [k for k in range(len(periods)) if active[k].any()]
    if not keep:
        return None
    baseline = SeasonalBaseline([periods[k] for k in keep], step)
    baseline.fit(head, head_ms, active[keep])
    return baseline


def backtest(values: npt.NDArray[np.float64], ms: npt.NDArray[np.int64],
             config: DetectorConfig, engine: str | None = None,
             seasons: Sequence[int] | None = None) -> BacktestResult:
    """Score ``values`` (T, C) step by step exactly as the live detector would.

    ``seasons``: periods in ms taken out of every column; None detects them per column from
    the cold-start rows, an empty list turns seasonal handling off.
    """
    mc = config.model
    engine_config = mc.engine_config(values.shape[1])
    bank = ModelBank(make_engine(engine or mc.engine or DEFAULT_ENGINE, engine_config),
                     mc.threshold_params(), config.alerts.episode_params())
    bank.ensure(1)
    cold = mc.warmup + engine_config.effective_output_after
    filled = _fill(values)
    points = _fill_and_scale(values, cold)
    baseline = _seasonal_baseline(filled, ms, cold, None if seasons is None else list(seasons))
    seasonal_cols = (baseline.active.any(axis=0) if baseline is not None
                     else np.zeros(values.shape[1], dtype=bool))
    ids = np.zeros(1, dtype=np.int64)
    t = len(points)
    scores, thr = np.zeros(t), np.zeros(t)
    anomaly = np.zeros(t, dtype=bool)
    episodes: list[Episode] = []
    onset, peak = -1, 0.0
    for i in range(t):
        point = points[i : i + 1]
        if baseline is not None:
            resid = baseline.step(filled[i], int(ms[i]))
            point = np.where(seasonal_cols, resid, point[0]).astype(np.float32)[None, :]
        res = bank.step(ids, point, int(ms[i]))
        scores[i] = res.batch.scores[0]
        thr[i] = res.thresholds[0]
        anomaly[i] = bank.episodes.open[0]
        if len(res.resolved):
            episodes.append(Episode(range(onset, i), int(ms[onset]), int(ms[i]), peak))
        if len(res.opened):
            onset = i
        if anomaly[i]:
            peak = float(bank.episodes.peak[0])
    if anomaly[-1]:
        episodes.append(Episode(range(onset, t), int(ms[onset]), None, peak))
    periods = [[p for k, p in enumerate(baseline.periods) if baseline.active[k, c]]
               if baseline is not None else [] for c in range(values.shape[1])]
    return BacktestResult([], scores, thr, anomaly, episodes, periods)


def write_scores(path: Path, stamps: Sequence[str], result: BacktestResult) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["timestamp", "score", "threshold", "anomaly"])
        for i, stamp in enumerate(stamps):
            w.writerow([stamp, f"{result.scores[i]:.6f}", f"{result.thresholds[i]:.6f}",
                        int(result.anomaly[i])])


EPISODE_FIELDS = ("onset", "end", "peak_score", "duration_s", "rows")


def episode_record(ep: Episode, stamps: Sequence[str], ms: npt.NDArray[np.int64]
                   ) -> dict[str, str | float | int | None]:
    """``onset`` and ``end`` as written in the input (``end`` None while open),
    ``duration_s`` up to the resolution (the last row while open)."""
    end_ms = ep.end_ms if ep.end_ms is not None else int(ms[-1])
    return {"onset": stamps[ep.rows.start],
            "end": stamps[ep.rows.stop] if ep.end_ms is not None else None,
            "peak_score": round(ep.peak, 6), "duration_s": (end_ms - ep.onset_ms) / 1000,
            "rows": len(ep.rows)}


def write_episodes(path: Path, stamps: Sequence[str], ms: npt.NDArray[np.int64],
                   result: BacktestResult) -> None:
    """One line per episode: JSON lines if ``path`` ends in .jsonl / .json / .ndjson, else
    CSV with a header (an open episode has an empty ``end``)."""
    records = [episode_record(ep, stamps, ms) for ep in result.episodes]
    with open(path, "w", newline="") as fh:
        if path.suffix.lower() in (".jsonl", ".json", ".ndjson"):
            for rec in records:
                fh.write(json.dumps(rec) + "\n")
            return
        w = csv.writer(fh)
        w.writerow(EPISODE_FIELDS)
        for rec in records:
            w.writerow(["" if rec[k] is None else rec[k] for k in EPISODE_FIELDS])

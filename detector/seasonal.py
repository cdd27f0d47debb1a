"""A streaming seasonal baseline: what is left of a series once its daily and weekly cycle
and its current level are taken out.

A forest over the raw values of a series with a daily cycle sees the 02:00 backup job as a
rare point every night, and a spike at noon as ordinary because noon is always high. Fed the
*residual* instead (value minus the level minus the profile of that phase of the cycle),
it sees what an SRE would call unusual for the time of day.

Model, per column: ``x = level + sum_k profile_k[phase_k(t)] + residual``.

- **Periods** come from the timestamps: a candidate (one day, one week) is kept when the
  cold-start rows hold at least two cycles of it and the autocorrelation at that lag of
  what the shorter periods left over (minus its moving average over one cycle, or its
  straight line when fewer than three cycles are in, so that trends do not count) is at
  least ``min_acf``. A user who knows better passes
  them (``--season 1d,7d``).
- **Cold start** (vectorised): level = median of the cold rows, each profile = per-phase
  median of what is left after the level and the shorter profiles (phases seen twice or
  more; the others start empty, a week named by the user before a week has passed); scale = MAD of the
  residuals (robust, like the raw scaling of ``detector.backtest``).
- **Streaming step** (one row, vectorised over columns): the innovation, clipped to
  ``clip`` scales so a spike does not teach the baseline, moves the profile of the current
  phase (weight ``max(1/visits, alpha)``) and the level (weight ``1/level_rows``). After a
  sustained level shift the level catches up within a few ``level_rows`` and the residual
  returns to its usual band, so the shift is one episode, not an alert every day.

Phases are the time of day (week) in bins of the series' median step, so gaps and jitter
in the timestamps do not shift the cycle.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["DAY_MS", "WEEK_MS", "SeasonalBaseline", "SeasonalParams", "candidate_periods",
           "detect_periods", "parse_seasons"]

DAY_MS = 86_400_000
WEEK_MS = 7 * DAY_MS
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": DAY_MS, "w": WEEK_MS}


@dataclass(frozen=True, slots=True)
class SeasonalParams:
    min_acf: float = 0.4
    """Autocorrelation at one cycle (after removing the cycle's moving average) needed to
    keep a candidate period."""
    alpha: float = 0.1
    """Weight of a phase's newest visit once it has had ``1/alpha`` of them (memory of
    about ten cycles)."""
    level_rows: float = 1.0
    """Time constant of the level, in cycles of the shortest period."""
    clip: float = 3.0
    """The innovation is clipped to this many residual scales before it is learned."""


def parse_seasons(text: str) -> list[int] | None:
    """Periods in ms from ``"1d,7d"`` (units s, m, h, d, w); ``"auto"`` gives None (detect)
    and ``"none"`` an empty list. Raises ValueError naming the bad part."""
    text = text.strip().lower()
    if text == "auto":
        return None
    if text == "none":
        return []
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", part)
        if m is None or float(m.group(1)) <= 0:
            raise ValueError(f"season {part.strip()!r} is not a positive duration such as "
                             f"12h, 1d or 7d (or 'auto', 'none')")
        out.append(int(float(m.group(1)) * _UNIT_MS[m.group(2)]))
    return sorted(set(out))


def median_step_ms(ms: npt.NDArray[np.int64]) -> int:
    d = np.diff(ms)
    d = d[d > 0]
    return int(np.median(d)) if len(d) else 0


def candidate_periods(ms: npt.NDArray[np.int64], cold: int) -> list[int]:
    """One day and one week, where the first ``cold`` rows hold two cycles of at least 4
    rows each."""
    step = median_step_ms(ms[:cold])
    if step <= 0:
        return []
    return [p for p in (DAY_MS, WEEK_MS) if 4 * step <= p and 2 * p <= cold * step]


def _phases(ms: npt.NDArray[np.int64], period_ms: int, bins: int) -> npt.NDArray[np.int64]:
    return ((ms % period_ms) * bins // period_ms).astype(np.int64)


def _phase_medians(x: npt.NDArray[np.float64], phase: npt.NDArray[np.int64], bins: int
                   ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.int64]]:
    """Per-phase median of ``x`` (T, C) -> (C, bins) and the visits per phase (bins,)."""
    order = np.argsort(phase, kind="stable")
    counts = np.bincount(phase, minlength=bins)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    srt = np.sort(_group_pad(x[order], phase[order], starts, counts), axis=1)
    lo = np.clip((counts - 1) // 2, 0, None)
    hi = np.clip(counts // 2, 0, None)
    med = 0.5 * (np.take_along_axis(srt, lo[:, None, None], 1)
                 + np.take_along_axis(srt, hi[:, None, None], 1))[:, 0, :]
    return np.where(counts[:, None] > 0, med, 0.0).T.copy(), counts


def _group_pad(xs: npt.NDArray[np.float64], ph: npt.NDArray[np.int64],
               starts: npt.NDArray[np.int64], counts: npt.NDArray[np.int64]
               ) -> npt.NDArray[np.float64]:
    """(bins, max visits, C), rows of each phase first and +inf after them."""
    width = max(int(counts.max()), 1)
    out = np.full((len(counts), width, xs.shape[1]), np.inf)
    out[ph, np.arange(len(ph)) - starts[ph]] = xs
    return out


def _robust_scale(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    med = np.median(x, axis=0)
    mad = np.median(np.abs(x - med), axis=0) * 1.4826
    return np.where(mad > 0, mad, np.maximum(np.abs(med) * 0.01, 1e-6))


def _cycle_acf(x: npt.NDArray[np.float64], lag: int) -> npt.NDArray[np.float64]:
    """Autocorrelation at ``lag`` of ``x`` (T, C) minus its trend: its moving average over
    ``lag`` where three cycles allow it, else its least-squares line."""
    z = (x - np.median(x, axis=0)) / _robust_scale(x)
    z = np.clip(z, -5.0, 5.0)
    if len(z) >= 3 * lag:
        c = np.cumsum(np.vstack([np.zeros((1, z.shape[1])), z]), axis=0)
        ma = (c[lag:] - c[:-lag]) / lag  # mean of z[i : i + lag]
        y = z[lag // 2 : lag // 2 + len(ma)] - ma
    else:
        t = np.arange(len(z), dtype=np.float64)[:, None] - (len(z) - 1) / 2
        y = z - z.mean(0) - t * ((t * z).sum(0) / (t * t).sum())
    a, b = y[:-lag] - y[:-lag].mean(0), y[lag:] - y[lag:].mean(0)
    den = np.sqrt((a * a).sum(0) * (b * b).sum(0))
    return np.where(den > 0, (a * b).sum(0) / np.where(den > 0, den, 1.0), 0.0)


def detect_periods(values: npt.NDArray[np.float64], ms: npt.NDArray[np.int64],
                   candidates: Sequence[int], min_acf: float = 0.4
                   ) -> npt.NDArray[np.bool_]:
    """(len(candidates), C): which candidate periods each column of ``values`` (the
    cold-start rows, NaN filled) shows. Shorter periods are taken out before longer ones
    are tested, so a daily cycle does not make a week look periodic."""
    step = median_step_ms(ms)
    rest = values - np.median(values, axis=0)
    keep = np.zeros((len(candidates), values.shape[1]), dtype=bool)
    for k, period in enumerate(sorted(candidates)):
        lag = round(period / step) if step > 0 else 0
        if lag < 2 or len(rest) < 2 * lag + 2:
            continue
        keep[k] = _cycle_acf(rest, lag) >= min_acf
        prof, _ = _phase_medians(rest, _phases(ms, period, lag), lag)
        rest = rest - np.where(keep[k], prof[:, _phases(ms, period, lag)].T, 0.0)
    return keep


class SeasonalBaseline:
    """Level and per-phase profiles of ``C`` columns; :meth:`step` gives scaled residuals."""

    def __init__(self, periods_ms: Sequence[int], step_ms: int,
                 params: SeasonalParams | None = None) -> None:
        self.params = params or SeasonalParams()
        self.periods = sorted(periods_ms)
        self.bins = [max(round(p / step_ms), 1) for p in self.periods]
        self.active = np.zeros((len(self.periods), 0), dtype=bool)
        self.profiles: list[npt.NDArray[np.float64]] = []
        self.visits: list[npt.NDArray[np.float64]] = []
        self.level = np.zeros(0)
        self.scale = np.ones(0)
        shortest = self.bins[0] if self.bins else 1
        self.level_weight = 1.0 / max(self.params.level_rows * shortest, 1.0)

    def fit(self, values: npt.NDArray[np.float64], ms: npt.NDArray[np.int64],
            active: npt.NDArray[np.bool_]) -> None:
        """Initial level, profiles and scale from the cold-start rows ``values`` (T, C);
        ``active[k, c]``: column ``c`` follows period ``k``."""
        self.active = active.copy()
        self.level = np.median(values, axis=0)
        rest = values - self.level
        self.profiles, self.visits = [], []
        for k, (period, bins) in enumerate(zip(self.periods, self.bins, strict=True)):
            ph = _phases(ms, period, bins)
            prof, counts = _phase_medians(rest, ph, bins)
            # One visit would make the profile the row itself and the residual 0: such a
            # phase starts empty and is learned as it comes round.
            counts = np.where(counts >= 2, counts, 0)
            prof = np.where(active[k][:, None] & (counts > 0), prof, 0.0)
            self.profiles.append(prof)
            self.visits.append(counts.astype(np.float64))
            rest = rest - prof[:, ph].T
        self.scale = _robust_scale(rest)

    def seasonal(self, ms: int) -> npt.NDArray[np.float64]:
        """The profiles' sum at time ``ms``, per column."""
        s = np.zeros(len(self.level))
        for period, bins, prof in zip(self.periods, self.bins, self.profiles, strict=True):
            s += prof[:, (ms % period) * bins // period]
        return s

    def step(self, x: npt.NDArray[np.float64], ms: int) -> npt.NDArray[np.float64]:
        """Residual of row ``x`` (C,) at time ``ms`` in scales, then learn the row."""
        p = self.params
        phases = [(ms % period) * bins // period
                  for period, bins in zip(self.periods, self.bins, strict=True)]
        s = np.zeros(len(x))
        for prof, ph in zip(self.profiles, phases, strict=True):
            s += prof[:, ph]
        r = x - self.level - s
        e = np.clip(r, -p.clip * self.scale, p.clip * self.scale)
        for k, (prof, ph) in enumerate(zip(self.profiles, phases, strict=True)):
            self.visits[k][ph] += 1.0
            a = max(1.0 / self.visits[k][ph], p.alpha)
            prof[:, ph] += np.where(self.active[k], a * e, 0.0)
        self.level += self.level_weight * e
        return r / self.scale

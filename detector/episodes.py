"""Hysteresis: turning per-step anomaly flags into alert episodes (open, then resolved).

A single high score is not an alert: an episode opens once about ``open_after`` of the last
``open_window`` steps were anomalous (an exponentially weighted count, which ``open_after``
consecutive anomalous steps reach exactly, so one quiet step inside a real anomaly does not
start the count again) and resolves after ``resolve_after`` consecutive quiet ones. A caller
may reset a model's count (the GPU models' node veto does, when a change turns out to be
shared by the whole node). After an
episode resolves, the same entity may not open a new one for ``cooldown_s`` seconds: a level
shift (a new job, a changed fan curve) keeps scoring high now and then while the forest
fills its samples with the new level, and SREs should hear about it once.

Vectorised over model ids; the caller turns the returned transitions into alert records.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from detector.state_arrays import grow_rows

__all__ = ["EpisodeParams", "Episodes"]


@dataclass(frozen=True, slots=True)
class EpisodeParams:
    open_after: int = 3
    """Anomalous steps (consecutive, or nearly so within ``open_window``) that open an episode."""
    open_window: int = 10
    """Memory of the anomalous-step count, in steps."""
    resolve_after: int = 60
    """Consecutive quiet steps that resolve it."""
    cooldown_s: float = 900.0
    """Seconds after a resolution during which the entity does not open again."""


class Episodes:
    """Open/quiet counters per model id."""

    ARRAYS = ("level", "quiet", "open", "started_ms", "cooldown_until_ms", "peak")

    def __init__(self, params: EpisodeParams) -> None:
        self.params = params
        self.level = np.zeros(0, dtype=np.float64)
        self.quiet = np.zeros(0, dtype=np.int64)
        self.open = np.zeros(0, dtype=bool)
        self.started_ms = np.zeros(0, dtype=np.int64)
        self.cooldown_until_ms = np.zeros(0, dtype=np.int64)
        self.peak = np.zeros(0, dtype=np.float64)

    def ensure(self, n: int) -> None:
        grow_rows(self, self.ARRAYS, n)

    def step(
        self,
        ids: npt.NDArray[np.int64],
        anomalous: npt.NDArray[np.bool_],
        scores: npt.NDArray[np.float64],
        ts_ms: int | npt.NDArray[np.int64],
        reset: npt.NDArray[np.bool_] | None = None,
    ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Advance one step; returns (row indices that opened, row indices that resolved)."""
        p = self.params
        ts = np.broadcast_to(np.asarray(ts_ms, dtype=np.int64), ids.shape)
        keep = 1.0 - 1.0 / p.open_window
        level = self.level[ids] * keep + anomalous
        if reset is not None:
            level = np.where(reset, 0.0, level)
        # ``open_after`` consecutive anomalous steps reach exactly this level.
        needed = (1.0 - keep ** p.open_after) / (1.0 - keep) - 1e-9
        quiet = np.where(anomalous, 0, self.quiet[ids] + 1)
        was_open = self.open[ids]
        opens = ~was_open & (level >= needed) & (ts >= self.cooldown_until_ms[ids])
        resolves = was_open & (quiet >= p.resolve_after)
        now_open = (was_open & ~resolves) | opens
        self.level[ids] = level
        self.quiet[ids] = quiet
        self.open[ids] = now_open
        started = self.started_ms[ids]
        self.started_ms[ids] = np.where(opens, ts, started)
        self.peak[ids] = np.where(opens, scores, np.where(now_open,
                                  np.maximum(self.peak[ids], scores), 0.0))
        cool = self.cooldown_until_ms[ids]
        self.cooldown_until_ms[ids] = np.where(resolves, ts + int(p.cooldown_s * 1000), cool)
        return np.flatnonzero(opens), np.flatnonzero(resolves)

    def state_arrays(self, prefix: str) -> dict[str, npt.NDArray[np.generic]]:
        return {f"{prefix}.{k}": getattr(self, k).copy() for k in self.ARRAYS}

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]], prefix: str) -> None:
        for k in self.ARRAYS:
            cur = getattr(self, k)
            setattr(self, k, np.array(arrays[f"{prefix}.{k}"], dtype=cur.dtype))

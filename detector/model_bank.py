"""Forest -> adaptive threshold -> hysteresis, for a bank of models advanced together.

The one scoring path of the detector: per-GPU models, rack models and ``fleetpulse
backtest`` all go through :meth:`ModelBank.step`, so an SRE tuning thresholds on history
with ``backtest`` tunes exactly what runs live.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from detector.engines import ForestEngine, ScoreBatch
from detector.episodes import EpisodeParams, Episodes
from detector.thresholds import AdaptiveThresholds, ThresholdParams

__all__ = ["BankStep", "ModelBank"]


@dataclass(frozen=True, slots=True)
class BankStep:
    """What one step did, rows in the order of the ids passed in."""

    batch: ScoreBatch
    thresholds: npt.NDArray[np.float64]
    anomalous: npt.NDArray[np.bool_]
    opened: npt.NDArray[np.int64]
    """Row indices whose episode opened at this step."""
    resolved: npt.NDArray[np.int64]
    """Row indices whose episode resolved at this step."""


class ModelBank:
    """Models ``0..n-1`` of one engine, each with its threshold and episode state."""

    def __init__(self, engine: ForestEngine, thresholds: ThresholdParams,
                 episodes: EpisodeParams) -> None:
        self.engine = engine
        self.thresholds = AdaptiveThresholds(thresholds)
        self.episodes = Episodes(episodes)
        self.n = 0

    def ensure(self, n: int) -> None:
        if n > self.n:
            self.engine.ensure_models(n)
            self.thresholds.ensure(n)
            self.episodes.ensure(n)
            self.n = n

    def step(self, ids: npt.NDArray[np.int64], points: npt.NDArray[np.float32],
             ts_ms: int | npt.NDArray[np.int64],
             judge: Callable[[npt.NDArray[np.bool_], ScoreBatch, npt.NDArray[np.float64]],
                             npt.NDArray[np.bool_]] | None = None,
             admit_at_most: int | None = None) -> BankStep:
        """Score and learn one point per model, judge it, advance the episodes.

        ``judge`` may overrule the threshold's verdict before the episodes see it (the GPU
        models' node veto, the rack models' "hot, not idle" test, see ``DetectorShard``): it
        gets the anomalous flags, the scored batch (with attributions of every row above its
        threshold) and the thresholds, and returns the flags that count. ``admit_at_most`` is
        the engine's (how many models whose cold start ends now may leave it; None: all).
        """
        thr_now = self.thresholds.threshold(ids)
        # Attribution is only read when an episode opens, i.e. on an anomalous step.
        batch = self.engine.update(ids, points, attribute_above=thr_now,
                                   admit_at_most=admit_at_most)
        thr, anomalous = self.thresholds.update(ids, batch.scores)
        reset = None
        if judge is not None:
            judged = judge(anomalous, batch, thr)
            reset = anomalous & ~judged
            anomalous = judged
        opened, resolved = self.episodes.step(ids, anomalous, batch.scores, ts_ms, reset)
        return BankStep(batch, thr, anomalous, opened, resolved)

    def warming(self, n: int) -> int:
        """Of models ``0..n-1``, those that cannot alert yet: fewer than ``warmup`` scored
        steps (a model the bank has not grown to has seen none)."""
        seen = self.thresholds.seen[:n]
        return int(np.count_nonzero(seen < self.thresholds.params.warmup)) + n - len(seen)

    def held(self, n: int) -> int:
        """Of models ``0..n-1``, those the engine holds in their cold start (not admitted
        while the detector was behind)."""
        return self.engine.held(min(n, self.n))

    def state_arrays(self, prefix: str) -> dict[str, npt.NDArray[np.generic]]:
        out: dict[str, npt.NDArray[np.generic]] = {}
        out.update(self.thresholds.state_arrays(f"{prefix}.thresholds"))
        out.update(self.episodes.state_arrays(f"{prefix}.episodes"))
        return out

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]], prefix: str,
                    n: int) -> None:
        self.thresholds.load_arrays(arrays, f"{prefix}.thresholds")  # type: ignore[arg-type]
        self.episodes.load_arrays(arrays, f"{prefix}.episodes")
        self.engine.ensure_models(n)
        self.n = n

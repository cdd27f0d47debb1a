"""Adaptive score thresholds per model, as AWS's ThresholdedRandomCutForest does.

A raw RCF score means different things for different GPUs (a GPU that alternates between
idle and training has a wider normal than one that idles all day), so each model keeps
exponentially weighted running statistics of its own scores and calls a score anomalous
when it exceeds ``mean + z * std``, never below an absolute floor. Scores above the
threshold enter the statistics clipped to the threshold and with a tenth of the weight, so
an anomaly does not teach the model to tolerate itself. During a model's cold start (``warmup`` scored steps) nothing is
anomalous.

Everything is one vector operation over the models of a call.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from detector.state_arrays import grow_rows

__all__ = ["AdaptiveThresholds", "ThresholdParams"]


@dataclass(frozen=True, slots=True)
class ThresholdParams:
    z: float = 6.0
    """How many running standard deviations above the running mean a score must be."""
    floor: float = 1.6
    """Absolute lower bound of the threshold (RCF scores are about 1 for ordinary points)."""
    horizon: int = 2000
    """Steps of memory of the running statistics (EW weight 1/horizon once warmed up)."""
    warmup: int = 600
    """Scored steps per model before it may flag anything (the cold start)."""
    std_floor: float = 0.05
    """Lower bound of the standard deviation, so a very steady GPU is not hair-triggered."""
    anomalous_weight: float = 0.1
    """Anomalous scores are learned (clipped) with this fraction of the usual weight: the
    threshold creeps up under a lasting change instead of jumping, and the forest, which
    learns the new level itself, brings the scores down meanwhile."""


class AdaptiveThresholds:
    """Running score mean and variance per model id (arrays grown on demand)."""

    ARRAYS = ("seen", "count", "mean", "var")

    def __init__(self, params: ThresholdParams) -> None:
        self.params = params
        self.seen = np.zeros(0)
        self.count = np.zeros(0)
        self.mean = np.zeros(0)
        self.var = np.zeros(0)

    def ensure(self, n: int) -> None:
        grow_rows(self, self.ARRAYS, n)

    def threshold(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        p = self.params
        std = np.maximum(np.sqrt(self.var[ids]), p.std_floor)
        return np.maximum(self.mean[ids] + p.z * std, p.floor)

    def update(
        self, ids: npt.NDArray[np.int64], scores: npt.NDArray[np.float64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Judge ``scores`` against each model's threshold, then learn them.

        A score of 0 (the engine's own cold start) is neither judged nor learned. The first
        half of the warm-up is burn-in: a forest whose samples are still filling scores
        erratically, and learning those scores would inflate the spread for a long time.
        Returns (threshold used, anomalous).
        """
        p = self.params
        thr = self.threshold(ids)
        scored = scores > 0.0
        seen = self.seen[ids]
        count = self.count[ids]
        anomalous = scored & (seen >= p.warmup) & (scores > thr)
        learn = scored & (seen >= p.warmup // 2)
        # Once a few scores are in, clip outliers even during the warm-up.
        x = np.where(count >= 30, np.minimum(scores, thr), scores)
        a = np.maximum(1.0 / (count + 1.0), 1.0 / p.horizon)
        # Scores in the upper half of the band learn slowly too: a gradual rise must not
        # drag the threshold up with it (the boiling frog).
        std = np.maximum(np.sqrt(self.var[ids]), p.std_floor)
        high = (count >= 30) & (scores > self.mean[ids] + 0.5 * p.z * std)
        a = np.where(anomalous | high, a * p.anomalous_weight, a)
        mean = self.mean[ids]
        d = x - mean
        new_mean = mean + a * d
        new_var = (1.0 - a) * (self.var[ids] + a * d * d)
        self.mean[ids] = np.where(learn, new_mean, mean)
        self.var[ids] = np.where(learn, new_var, self.var[ids])
        self.count[ids] = count + learn
        self.seen[ids] = seen + scored
        return thr, anomalous

    def state_arrays(self, prefix: str) -> dict[str, npt.NDArray[np.float64]]:
        return {f"{prefix}.{k}": getattr(self, k).copy() for k in self.ARRAYS}

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.float64]], prefix: str) -> None:
        for k in self.ARRAYS:
            setattr(self, k, np.array(arrays[f"{prefix}.{k}"], dtype=np.float64))

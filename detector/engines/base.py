"""The forest engine interface: many per-GPU models advanced in one call.

One model per GPU (per entity), addressed by a dense integer id. A call takes the current
base feature vector of many models at once (all GPUs of a frame), so Python overhead is
paid per frame, not per GPU. Shingling is the engine's job (as in AWS RCF's internal
shingling): the caller passes one step of ``dims`` features per model, and the engine
keeps each model's last ``shingle`` steps.

Scores follow AWS RCF's definition (mean over trees of the displacement-based score, about
1 for an ordinary point and higher for outliers); a model returns 0.0 until it has seen
``output_after`` points. Every engine passes ``tests/test_engine_conformance.py``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["EngineConfig", "ForestEngine", "ScoreBatch", "check_batch", "model_seed"]


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """Parameters shared by every engine (names as in AWS RCF)."""

    dims: int
    """Base features per step."""
    shingle: int = 4
    """Steps per shingled point; a point has ``dims * shingle`` dimensions."""
    trees: int = 50
    sample_size: int = 256
    """Points kept per tree (reservoir)."""
    time_decay: float | None = None
    """Reservoir decay (lambda); None means AWS's default 1 / (10 * sample_size)."""
    output_after: int | None = None
    """Points seen before scores are reported; None means sample_size / 4."""
    seed: int = 0
    sample_groups: int | None = None
    """Independent reservoirs per model; the trees are split evenly among them and the
    trees of one group share its sample (``trees`` = AWS's one reservoir per tree). None
    means the engine's default: one per tree for krcf (the only layout it has), two for
    numba (one if ``trees`` is odd): 50 independent reservoirs keep ~5,600 distinct points
    per model (600-900 KB) where two keep ~510 (under 256 KB), and
    ``python -m benchmarks.forest`` measures their scores agreeing with krcf about as well
    as krcf with another seed does, at equal detection quality
    (benchmarks/results/forest.json)."""

    screen_trees: int = 0
    """Trees per group walked first; when their mean score is below ``screen_below`` times
    the row's threshold (``attribute_above``) the rest are skipped and the score is their
    estimate (0, or at least the trees per group: every tree always). Numba only: the
    cost of a model step is nearly all in walking trees, and almost every point of a
    healthy GPU scores far below its threshold."""
    screen_below: float = 0.5

    def validate(self) -> None:
        if self.screen_trees < 0 or not 0.0 <= self.screen_below <= 1.0:
            raise ValueError(f"invalid screen in engine config {self}")
        if self.dims < 1 or self.shingle < 1 or self.trees < 1 or self.sample_size < 4:
            raise ValueError(f"invalid engine config {self}")
        if self.sample_groups is not None and (
            self.sample_groups < 1 or self.trees % self.sample_groups
        ):
            raise ValueError(
                f"sample_groups must divide trees ({self.trees}), got {self.sample_groups}"
            )
        if self.time_decay is not None and not 0.0 <= self.time_decay < 1.0:
            raise ValueError(f"time_decay must be in [0, 1), got {self.time_decay}")
        if self.output_after is not None and self.output_after < 0:
            raise ValueError(f"output_after must be >= 0, got {self.output_after}")

    @property
    def effective_time_decay(self) -> float:
        """``time_decay`` with AWS's default filled in."""
        if self.time_decay is not None:
            return self.time_decay
        return 1.0 / (10.0 * self.sample_size)

    @property
    def effective_output_after(self) -> int:
        """``output_after`` with AWS's default (a quarter of the sample size) filled in."""
        if self.output_after is not None:
            return self.output_after
        return self.sample_size // 4


@dataclass(frozen=True, slots=True)
class ScoreBatch:
    """Result of one batched call; rows follow the order of ``model_ids``."""

    scores: npt.NDArray[np.float64]
    """(n,) anomaly score of each point before it was learned."""
    attribution: npt.NDArray[np.float64]
    """(n, dims): how much each base feature contributed (summed over the shingle), high
    and low directions added; ``direction`` says which dominated."""
    direction: npt.NDArray[np.int8]
    """(n, dims): +1 if the point is above what the model expects in that feature, -1 below,
    0 where the feature contributed nothing (or the row was not attributed)."""
    admitted: int = 0
    """Models whose cold start ended in this call and that built their trees (see
    ``ForestEngine.update``'s ``admit_at_most``)."""


class ForestEngine(ABC):
    """Many independent forests, one per model id."""

    name: str = "abstract"

    def __init__(self, config: EngineConfig) -> None:
        config.validate()
        self.config = config

    @abstractmethod
    def ensure_models(self, n: int) -> None:
        """Make model ids ``0 .. n-1`` exist (new ones are empty, in cold start)."""

    @abstractmethod
    def _run(
        self,
        model_ids: npt.NDArray[np.int64],
        points: npt.NDArray[np.float32],
        attribute_above: float | npt.NDArray[np.float64],
        learn: bool,
        admit_at_most: int | None = None,
    ) -> ScoreBatch:
        """The one batched pass both :meth:`update` and :meth:`score` make; an engine
        implements this, with ``learn`` saying whether the points are then learned."""

    def update(
        self,
        model_ids: npt.NDArray[np.int64],
        points: npt.NDArray[np.float32],
        attribute_above: float | npt.NDArray[np.float64] = 0.0,
        admit_at_most: int | None = None,
    ) -> ScoreBatch:
        """Score each point against its model, then learn it. Ids in one call are unique.

        ``attribute_above`` (a scalar or one value per row) lets a caller skip attribution
        where it will not be read: attribution and direction are only guaranteed for rows
        whose score exceeds it, other rows may be zero. Engines whose attribution costs a
        second pass over the trees (krcf) skip it; engines that get it for free fill every
        row. The default attributes every scored row.

        ``admit_at_most`` (None: no limit) caps how many models whose cold start ends with
        this point may leave it in this call (``ScoreBatch.admitted`` says how many did);
        an engine that defers its trees until then (numba) keeps the others sampling,
        unscored, until a call admits them, so a caller short of CPU can put off their
        dearest steps (a forest's first thousand points) and start them at the pace it can
        afford; an engine that grows its trees point by point (krcf) has nothing to hold
        back and ignores it.
        """
        return self._run(model_ids, points, attribute_above, learn=True,
                         admit_at_most=admit_at_most)

    def score(
        self,
        model_ids: npt.NDArray[np.int64],
        points: npt.NDArray[np.float32],
        attribute_above: float | npt.NDArray[np.float64] = 0.0,
    ) -> ScoreBatch:
        """Score without learning: no side effect on any model (same ``attribute_above``)."""
        return self._run(model_ids, points, attribute_above, learn=False)

    @abstractmethod
    def checkpoint(self, model_id: int) -> bytes:
        """Compact, versioned bytes of one model (shingle buffer included)."""

    def checkpoint_models(self, n: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        """``checkpoint(m)`` of models ``0..n-1`` concatenated, and where each one ends.

        A shard's checkpoint holds every model of the shard, tens of thousands at a large
        site, every ``checkpoint_interval_s``; an engine whose models share arrays
        overrides this to write them in one pass instead of one Python call per model."""
        parts = [self.checkpoint(m) for m in range(n)]
        ends = np.cumsum([len(p) for p in parts], dtype=np.int64)
        return np.frombuffer(b"".join(parts), dtype=np.uint8), ends

    @abstractmethod
    def restore(self, model_id: int, data: bytes) -> None:
        """Load bytes from ``checkpoint``; later scores equal those of the original model."""

    @abstractmethod
    def model_bytes(self, model_id: int) -> int:
        """Resident memory of one model, in bytes."""

    def held(self, n: int) -> int:
        """Of models ``0..n-1``, those held in their cold start past ``output_after``
        (``update(admit_at_most=...)``): sampling, unscored, until a call admits them. An engine
        that cannot hold one back has none."""
        return 0


def check_batch(
    config: EngineConfig, model_ids: npt.NDArray[np.int64], points: npt.NDArray[np.float32]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """Validate one batched call (shapes, finite values, unique ids) the same way for
    every engine, so a caller's mistake reads the same whichever engine runs."""
    ids = np.ascontiguousarray(model_ids, dtype=np.int64).reshape(-1)
    pts = np.ascontiguousarray(points, dtype=np.float32)
    if pts.ndim != 2 or pts.shape != (len(ids), config.dims):
        raise ValueError(
            f"points must have shape ({len(ids)}, {config.dims}), got {tuple(pts.shape)}"
        )
    if not np.isfinite(pts).all():
        raise ValueError("points must be finite (impute NaN before the engine)")
    if len(ids) > 1 and len(np.unique(ids)) != len(ids):
        raise ValueError("model ids in one call must be unique")
    return ids, pts


def model_seed(seed: int, model_id: int) -> int:
    """A distinct, reproducible 63-bit seed per model, so two GPUs never share random cuts."""
    x = (seed * 0x9E3779B97F4A7C15 + model_id * 0xBF58476D1CE4E5B9 + 1) & (2**64 - 1)
    x ^= x >> 31
    x = (x * 0x94D049BB133111EB) & (2**64 - 1)
    return (x ^ (x >> 29)) & 0x7FFF_FFFF_FFFF_FFFF

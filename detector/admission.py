"""How many GPU forests may leave their cold start now: the detector's pace of admission.

Why: a forest costs about 1 us a step while it only samples (its cold start) and 50-80 us
once its trees are built and its reservoirs fill. In a mass cold start (a new cluster, a
restart without checkpoints) every forest reaches the end of its cold start within the same
second; admitting them all then asks one core for tens of microseconds per GPU at once, and
a detector that learns it is short of CPU only from its lag, seconds later, has by then
taken on more than it can carry and must shed model steps. So forests are admitted at a
bounded pace, and only while the detector has room: its oldest record waited less than
``admit_within_s`` and its worker spent less than ``admit_busy_below`` of the last seconds
processing. The others sample on, unscored, and start as room appears; how many wait is
on /metrics (``models_held``), with the busy share (``busy_ratio``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

__all__ = ["Admission"]

_WINDOW_S = 2.0
"""The busy share is measured over windows of at least this long ..."""
_SMOOTHING = 0.3
"""... and smoothed across them (weight of the newest window)."""


class Admission:
    """A token bucket of admissions, open while the detector keeps up with room to spare."""

    def __init__(self, per_s: float, within_s: float, busy_below: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``per_s``: admissions a second at most (0: no limit); ``within_s``: the oldest
        record of a chunk waited less than this (0: admit every forest, always);
        ``busy_below``: the busy share under which forests are admitted."""
        self.per_s = per_s
        self.within_s = within_s
        self.busy_below = busy_below
        self.clock = clock
        self.busy_ratio = 0.0
        """Share of wall time the worker spent processing, smoothed over recent windows."""
        self._tokens = self._burst()
        self._refilled = clock()
        self._window_start = self._refilled
        self._busy_s = 0.0

    def _burst(self) -> float:
        return max(1.0, self.per_s)  # one second's worth

    def allowance(self, waited_s: float) -> int | None:
        """Forests a chunk whose oldest record waited ``waited_s`` may admit (None: any)."""
        if self.within_s <= 0:
            return None
        if waited_s >= self.within_s or self.busy_ratio >= self.busy_below:
            return 0
        if self.per_s <= 0:
            return None
        now = self.clock()
        self._tokens = min(self._burst(), self._tokens + (now - self._refilled) * self.per_s)
        self._refilled = now
        return math.floor(self._tokens)

    def admitted(self, n: int) -> None:
        """``n`` forests left their cold start (spends the bucket)."""
        if self.per_s > 0:
            self._tokens = max(0.0, self._tokens - n)

    def worked(self, seconds: float) -> None:
        """The worker spent ``seconds`` processing a chunk, just now."""
        self._busy_s += seconds
        now = self.clock()
        span = now - self._window_start
        if span < _WINDOW_S:
            return
        share = min(1.0, self._busy_s / span)
        self.busy_ratio += _SMOOTHING * (share - self.busy_ratio)
        self._window_start, self._busy_s = now, 0.0

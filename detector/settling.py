"""Where a cooling die's heat is heading: the level a first-order fall settles at.

A die follows its air and its heat path with its thermal lag (``detector.thermal_model``).
When trouble ends (a rack's cooling recovers, a GPU's fan or pump does), its heat over what
its model predicts falls along that lag, from ``x0`` towards a level ``L``:
``x(t) - L = (x0 - L) exp(-t / tau)``. A fall of ``d`` over ``span_s`` seconds to ``x`` then
puts it ``d / (exp(span_s / tau) - 1)`` above where it settles. So a rule can end an alert
once the trouble is over rather than once the die has cooled, which on a liquid-cooled die
of two minutes' lag is minutes later, past the grace an SRE gives a page to outlast its
trouble (held-out zoo-1590's rack, 85 s after its trouble; zoo-1625's runaway, 186 s).

A lag taken too long reads an easing that stays as heading lower than it does, so a
projection is read only on a fall a noisy plateau does not make (``FALL_SHARE`` of the
rule's bar, both spans falling), and the callers say which lag they trust.
``settle_level`` is the projection; ``Settling`` follows one figure per GPU in spans of
``SPAN_S`` (means, so an integer sensor's flicker averages out) and says where it heads.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from detector.state_arrays import grow_rows

__all__ = ["FALL_SHARE", "SPAN_S", "Settling", "settle_level"]

SPAN_S: Final = 10.0
"""Seconds of a span whose mean is one point of a fall (the rack windows' length)."""
FALL_SHARE: Final = 0.25
"""Fall over two spans, as a share of the rule's bar, below which no projection is read:
a plateau's span-to-span noise, not a recovery."""


def settle_level(x: npt.NDArray[np.float64], fall_c: npt.NDArray[np.float64],
                 span_s: float | npt.NDArray[np.float64], tau_s: npt.NDArray[np.float64]
                 ) -> npt.NDArray[np.float64]:
    """The level a heat that fell by ``fall_c`` to ``x`` over ``span_s`` heads to along a
    lag of ``tau_s`` (NaN where the lag is not given)."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        return np.asarray(x - fall_c / np.expm1(span_s / tau_s), dtype=np.float64)


class Settling:
    """Per GPU: the mean of a heat figure over the current span and the two before it, how
    many spans in a row it fell, and whether the last fall heads under half the bar."""

    ARRAYS = ("start_ms", "sum_c", "n", "m1_c", "m2_c", "falls", "settled")

    def __init__(self) -> None:
        self.start_ms = np.zeros(0, dtype=np.int64)
        """Start of the current span (0: none)."""
        self.sum_c = np.zeros(0)
        self.n = np.zeros(0)
        """Sum and count of the figure's finite readings in the current span."""
        self.m1_c = np.zeros(0)
        self.m2_c = np.zeros(0)
        """The means of the last span and of the one before it."""
        self.falls = np.zeros(0, dtype=np.int64)
        """Spans in a row whose mean fell below the one before."""
        self.settled = np.zeros(0, dtype=bool)
        """Whether the last closed span's fall heads under half the bar."""

    def ensure(self, n: int) -> None:
        grow_rows(self, self.ARRAYS, n)

    def step(self, ids: npt.NDArray[np.int64], x: npt.NDArray[np.float64], ts_ms: int,
             tau_s: npt.NDArray[np.float64], bar_c: npt.NDArray[np.float64]
             ) -> npt.NDArray[np.bool_]:
        """Add one step's figure (degC over the model, NaN: not judged) of GPUs ``ids``, whose
        lags are ``tau_s`` and rule's bar ``bar_c``; returns whether each one's heat is
        settling: its last two spans fell, by ``FALL_SHARE`` of the bar or more, along its
        lag to a level under half the bar."""
        start = self.start_ms[ids]
        closes = (start > 0) & (ts_ms - start >= SPAN_S * 1000)
        # Only the GPUs whose span closes on this step are judged (one step in ten at 1 Hz).
        c, bar = ids[closes], bar_c[closes]
        n = self.n[c]
        mean = np.where(n > 0, self.sum_c[c] / np.maximum(n, 1.0), np.nan)
        m1 = self.m1_c[c]
        falls = np.where(mean < m1, self.falls[c] + 1, 0)
        fall = self.m2_c[c] - mean
        level = settle_level(mean, fall, 2.0 * SPAN_S, tau_s[closes])
        self.falls[c] = falls
        self.settled[c] = (falls >= 2) & (fall >= FALL_SHARE * bar) & (level < 0.5 * bar)
        self.m2_c[c] = m1
        self.m1_c[c] = mean
        fresh = closes | (start == 0)
        self.start_ms[ids[fresh]] = ts_ms
        self.sum_c[ids[fresh]] = 0.0
        self.n[ids[fresh]] = 0.0
        ok = np.isfinite(x)
        self.sum_c[ids[ok]] += x[ok]
        self.n[ids[ok]] += 1.0
        return np.asarray(self.settled[ids], dtype=bool)

    def state_arrays(self, prefix: str) -> dict[str, npt.NDArray[np.generic]]:
        return {f"{prefix}.{k}": getattr(self, k).copy() for k in self.ARRAYS}

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]], prefix: str,
                    n: int) -> None:
        """Restore; a checkpoint without these arrays starts every GPU's spans anew."""
        for k in self.ARRAYS:
            got = arrays.get(f"{prefix}.{k}")
            dtype = getattr(self, k).dtype
            setattr(self, k, np.zeros(n, dtype=dtype) if got is None
                    else np.array(got, dtype=dtype))

"""A columnar, mergeable, relative-error quantile sketch (the DDSketch mapping, no objects).

Why not the ``ddsketch`` library: it keeps one Python object per sketch and is fed one value
at a time, which is ~1 us per sample; the aggregator must roll up >= 1 M samples/s on one
core. So the same idea is applied to whole arrays: a value ``x > 0`` falls in bucket
``k = ceil(log(x) / log(gamma))`` with ``gamma = (1 + a) / (1 - a)``; reporting
``2 gamma^k / (gamma + 1)`` for the bucket is within relative error ``a`` of every value in
it. A sketch is just ``(bucket, count)`` pairs, so merging sketches (GPU samples into a
rack, racks into a row, 10 s windows into an hour) is adding counts, exactly, in any order.

Error bound: with ``RELATIVE_ACCURACY = 0.01`` every quantile answered is within 1 % (relative)
of a sample value of the merged data whose rank is the requested one, for |x| in
[1e-13, 1e30]; values closer to zero than 1e-13 fall in the zero bucket (reported as 0),
larger magnitudes are clamped to the outermost bucket.

Bucket *slots* are small non-negative integers (``0 .. N_SLOTS - 1``) so that a sketch can be
stored as an ordinary series: slot ``s`` of the window starting at ``w`` is the sample
``(w + s, count)`` (every tier's window is at least 10,000 ms wide, and ``N_SLOTS`` < 10,000).
"""

from __future__ import annotations

import math
from typing import Final

import numba as nb
import numpy as np
import numpy.typing as npt

__all__ = [
    "N_SLOTS",
    "RELATIVE_ACCURACY",
    "quantiles_from_slots",
    "slot_of",
    "slot_value",
]

RELATIVE_ACCURACY: Final = 0.01
GAMMA: Final = (1 + RELATIVE_ACCURACY) / (1 - RELATIVE_ACCURACY)
_INV_LOG_GAMMA: Final = 1.0 / math.log(GAMMA)
K_MIN: Final = -1499
K_MAX: Final = 3499
_SPAN: Final = K_MAX - K_MIN + 1  # 4999 buckets per sign
ZERO_SLOT: Final = _SPAN  # positives 0..4998, zero 4999, negatives 5000..9998
N_SLOTS: Final = 2 * _SPAN + 1
_MIN_MAG: Final = GAMMA ** (K_MIN - 1)


@nb.njit(cache=True)
def slot_of(x: float) -> int:  # pragma: no cover - numba
    """Slot of one finite value; the order of slots is the order of values.

    Positives sit above the zero slot (increasing with the bucket index), negatives below
    it (a larger magnitude gives a smaller slot).
    """
    mag = abs(x)
    if mag <= _MIN_MAG:
        return ZERO_SLOT
    if mag > 1e300:  # +-inf (and the edge of float64): the outermost buckets
        return N_SLOTS - 1 if x > 0 else 0
    k = math.ceil(math.log(mag) * _INV_LOG_GAMMA)
    k = min(max(k, K_MIN), K_MAX)
    if x > 0:
        return ZERO_SLOT + 1 + (k - K_MIN)
    return K_MAX - k


def slot_value(slots: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    """The representative value of each slot (within RELATIVE_ACCURACY of its members)."""
    s = np.asarray(slots, dtype=np.int64)
    out = np.zeros(s.shape, dtype=np.float64)
    pos = s > ZERO_SLOT
    neg = s < ZERO_SLOT
    kp = s[pos] - ZERO_SLOT - 1 + K_MIN
    kn = K_MAX - s[neg]
    out[pos] = 2.0 * np.power(GAMMA, kp) / (GAMMA + 1.0)
    out[neg] = -2.0 * np.power(GAMMA, kn) / (GAMMA + 1.0)
    return out


def quantiles_from_slots(dense: npt.NDArray[np.float64], q: float) -> npt.NDArray[np.float64]:
    """Quantile ``q`` of each dense sketch row (NaN for an empty one).

    The rank convention is the lower one (``ceil(q * (n - 1))``-th smallest, 0-based), as in
    DDSketch, so q=0 is the minimum bucket and q=1 the maximum.
    """
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile must be within [0, 1], got {q}")
    total = dense.sum(axis=1)
    cum = np.cumsum(dense, axis=1)
    rank = np.floor(q * (total - 1.0) + 1e-9)
    idx = np.argmax(cum > rank[:, None], axis=1)
    out = slot_value(idx.astype(np.int64))
    out[total <= 0] = np.nan
    return out

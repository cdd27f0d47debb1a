"""Generic bucket reducers for deriving a tier from the one below.

The store is value-agnostic: a rollup tier holds one series per aggregate (the aggregator
appends e.g. the 10 s ``max`` of temperature as its own series). Coarser tiers are derived
with the reducer that merges that aggregate exactly: ``sum`` for sums and counts, ``min``,
``max``, ``last``; ``count`` counts samples (to build a count series from raw data).

NaN means "not sampled" in fleetpulse frames, so NaN samples are skipped; a bucket with no
finite-or-infinite sample is not emitted.
"""

from __future__ import annotations

from typing import Final

import numba as nb
import numpy as np
import numpy.typing as npt

__all__ = ["REDUCERS", "reduce_buckets", "warm_up"]

REDUCERS: Final = ("count", "sum", "min", "max", "last")
_CODE: Final = {name: i for i, name in enumerate(REDUCERS)}


@nb.njit(cache=True)
def _reduce(ts: np.ndarray, values: np.ndarray, offsets: np.ndarray, res: int,
            op: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover - numba
    n_series = offsets.size - 1
    out_ts = np.empty(ts.size, np.int64)
    out_v = np.empty(ts.size, np.float64)
    out_off = np.zeros(n_series + 1, np.int64)
    k = 0
    for s in range(n_series):
        cur = np.int64(0)
        have = False
        acc = 0.0
        for i in range(offsets[s], offsets[s + 1]):
            v = values[i]
            if np.isnan(v):
                continue
            b = (ts[i] // res) * res
            if not have or b != cur:
                if have:
                    out_ts[k] = cur
                    out_v[k] = acc
                    k += 1
                cur = b
                have = True
                acc = 1.0 if op == 0 else v
                continue
            if op == 0:
                acc += 1.0
            elif op == 1:
                acc += v
            elif op == 2:
                acc = min(acc, v)
            elif op == 3:
                acc = max(acc, v)
            else:
                acc = v
        if have:
            out_ts[k] = cur
            out_v[k] = acc
            k += 1
        out_off[s + 1] = k
    return out_ts[:k], out_v[:k], out_off


def reduce_buckets(ts: npt.NDArray[np.int64], values: npt.NDArray[np.float64],
                   offsets: npt.NDArray[np.int64], resolution_ms: int, reducer: str
                   ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64],
                              npt.NDArray[np.int64]]:
    """Reduce CSR series (time-ordered within each) into aligned buckets.

    Returns ``(bucket_start_ts, values, offsets)`` in the same CSR form.
    """
    if reducer not in _CODE:
        raise ValueError(f"unknown reducer {reducer!r}; have {REDUCERS}")
    if resolution_ms <= 0:
        raise ValueError(f"resolution_ms must be positive, not {resolution_ms}")
    return _reduce(np.ascontiguousarray(ts, np.int64), np.ascontiguousarray(values, np.float64),
                   np.ascontiguousarray(offsets, np.int64), int(resolution_ms), _CODE[reducer])


def warm_up() -> None:
    """Compile (or load from numba's cache) the bucket reducer before a consumer joins."""
    reduce_buckets(np.zeros(2, np.int64), np.ones(2), np.asarray([0, 2], np.int64), 10, "max")

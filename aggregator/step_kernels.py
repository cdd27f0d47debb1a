"""numba kernels that turn stored windows into a query's output steps.

Output point ``i`` (time ``t0 + i * step``) merges every stored sample whose timestamp
``s`` lies in ``[t_i - span, t_i)``: with ``span = step`` each window lands in exactly one
point (a 1 h step over the 1 min tier merges 60 windows), with ``span`` = the tier's width
and a finer step a window is repeated, as a step-function should be.
"""

from __future__ import annotations

import numba as nb
import numpy as np

__all__ = ["OPS", "sketch_quantiles", "step_reduce"]

OPS = {"sum": 0, "min": 1, "max": 2, "last": 3, "count": 4}


@nb.njit(cache=True)
def step_reduce(ts, values, offsets, t0, step, span, n_out, op):  # pragma: no cover - numba
    """[series, n_out] of the op over each output's samples; NaN where there are none."""
    n_series = offsets.size - 1
    out = np.full((n_series, n_out), np.nan)
    for s in range(n_series):
        for j in range(offsets[s], offsets[s + 1]):
            v = values[j]
            if np.isnan(v):
                continue
            rel = ts[j] - t0
            lo = rel // step + 1
            hi = (rel + span) // step
            lo = max(lo, 0)
            hi = min(hi, n_out - 1)
            for i in range(lo, hi + 1):
                cur = out[s, i]
                if op == 4:
                    out[s, i] = 1.0 if np.isnan(cur) else cur + 1.0
                elif np.isnan(cur) or op == 3:
                    out[s, i] = v
                elif op == 0:
                    out[s, i] = cur + v
                elif op == 1:
                    if v < cur:
                        out[s, i] = v
                elif v > cur:
                    out[s, i] = v
    return out


@nb.njit(cache=True)
def _emit(dense, lo_slot, hi_slot, q, values_of_slot):  # pragma: no cover - numba
    total = 0.0
    for k in range(lo_slot, hi_slot + 1):
        total += dense[k]
    rank = np.floor(q * (total - 1.0) + 1e-9)
    cum = 0.0
    res = np.nan
    for k in range(lo_slot, hi_slot + 1):
        cum += dense[k]
        if cum > rank:
            res = values_of_slot[k]
            break
    dense[lo_slot:hi_slot + 1] = 0.0
    return res


@nb.njit(cache=True)
def sketch_quantiles(ts, counts, offsets, width, t0, step, span, n_out, q,
                     values_of_slot):  # pragma: no cover - numba
    """Quantile ``q`` per output step from sketch series (sample = window start + slot).

    Samples are time-ordered, so windows come in order and map to non-decreasing outputs:
    one dense row of bucket counts is filled per output and emitted when the output moves
    on, scanning only the slots that were touched.
    """
    n_series = offsets.size - 1
    n_slots = values_of_slot.size
    out = np.full((n_series, n_out), np.nan)
    dense = np.zeros(n_slots)
    for s in range(n_series):
        cur_lo = -1
        cur_hi = -1
        smin = n_slots
        smax = -1
        for j in range(offsets[s], offsets[s + 1] + 1):
            if j < offsets[s + 1]:
                slot = ts[j] % width
                rel = ts[j] - slot - t0
                lo = max(rel // step + 1, 0)
                hi = min((rel + span) // step, n_out - 1)
            else:
                lo = -2
                hi = -2
            if (lo != cur_lo or hi != cur_hi) and cur_lo >= 0 and smax >= 0:
                v = _emit(dense, smin, smax, q, values_of_slot)
                for i in range(cur_lo, cur_hi + 1):
                    out[s, i] = v
                smin = n_slots
                smax = -1
            cur_lo = lo
            cur_hi = hi
            if lo < 0 or hi < lo:
                continue
            dense[slot] += counts[j]
            smin = min(smin, slot)
            smax = max(smax, slot)
    return out

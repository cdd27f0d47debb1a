"""numba kernels of the rollup hot path: frames into windows, children into parents.

Window state is dense and columnar: for every open window (a *pool* slot) and every GPU slot
and metric column, the running count, sum, min, max, last (+ its timestamp), sum of squares,
and, for counters, the first value and the reset-aware increase between consecutive samples.
One call folds a whole batch of decoded frames (all ticks x GPUs x metrics) into that state;
no Python object is made per metric.

Sums are order-dependent in floating point, so every reduction here walks its inputs in an
order the caller fixes (message order within a partition, children sorted by name): a replay
after a crash then yields the same bits as the uninterrupted run.
"""

from __future__ import annotations

import numba as nb
import numpy as np

from aggregator.sketch import N_SLOTS, slot_of

__all__ = ["AGG_ARRAYS", "accumulate", "apply_counter_boundary", "reduce_rows", "warm_up"]

AGG_ARRAYS = ("cnt", "sum", "min", "max", "last", "last_ts", "sumsq", "first", "inc")
"""The per-window arrays, in the order the kernels take them (last_ts is int64)."""


@nb.njit(cache=True, nogil=True)
def accumulate(values, v_off, t_off, tick_pool, tick_ts, g_off, gslots, m_off, mcols,
               cnt, sm, mn, mx, last, last_ts, sq, first, inc,
               sketch_col, rack_of, n_racks, codes):  # pragma: no cover - numba
    """Fold frames into pool windows; returns how many sketch codes were written.

    Frame ``f`` has values ``values[v_off[f]:v_off[f+1]]`` in [tick, gpu, metric] order, its
    ticks ``t_off[f]:t_off[f+1]`` (``tick_pool`` = window pool slot or -1 to skip a late
    tick), its GPU slots ``gslots[g_off[f]:g_off[f+1]]`` and metric columns
    ``mcols[m_off[f]:m_off[f+1]]`` (-1 = not rolled up). For gauge columns
    (``sketch_col``) each value also leaves a sketch code
    ``((pool * n_racks + rack) * n_cols + col) * N_SLOTS + slot``.
    """
    n_cols = cnt.shape[2]
    n = 0
    for f in range(v_off.size - 1):
        t0 = t_off[f]
        g0 = g_off[f]
        m0 = m_off[f]
        G = g_off[f + 1] - g0
        M = m_off[f + 1] - m0
        base = v_off[f]
        for ti in range(t_off[f + 1] - t0):
            p = tick_pool[t0 + ti]
            if p < 0:
                continue
            ts = tick_ts[t0 + ti]
            for gi in range(G):
                g = gslots[g0 + gi]
                r = rack_of[g]
                row = base + (ti * G + gi) * M
                for mi in range(M):
                    c = mcols[m0 + mi]
                    if c < 0:
                        continue
                    v = values[row + mi]
                    if np.isnan(v):
                        continue
                    k = cnt[p, g, c]
                    if k == 0.0:
                        sm[p, g, c] = v
                        mn[p, g, c] = v
                        mx[p, g, c] = v
                        last[p, g, c] = v
                        last_ts[p, g, c] = ts
                        sq[p, g, c] = v * v
                        first[p, g, c] = v
                        inc[p, g, c] = 0.0
                    else:
                        d = v - last[p, g, c]
                        inc[p, g, c] += d if d >= 0.0 else v
                        sm[p, g, c] += v
                        sq[p, g, c] += v * v
                        if v < mn[p, g, c]:
                            mn[p, g, c] = v
                        if v > mx[p, g, c]:
                            mx[p, g, c] = v
                        if ts >= last_ts[p, g, c]:
                            last[p, g, c] = v
                            last_ts[p, g, c] = ts
                    cnt[p, g, c] = k + 1.0
                    if sketch_col[c]:
                        codes[n] = ((p * n_racks + r) * n_cols + c) * N_SLOTS + slot_of(v)
                        n += 1
    return n


@nb.njit(cache=True, nogil=True)
def apply_counter_boundary(cnt, first, last, inc, closed_last, counter_col):
    """Add the step from the previous closed window's last value to this window's first.

    ``closed_last`` (NaN = no earlier sample) is updated to this window's last value, so
    the increase of a window depends only on closed windows, never on open ones, which
    is what makes it the same after a replay. Arrays are ``[rows, cols]``.
    """  # pragma: no cover - numba
    for i in range(cnt.shape[0]):
        for c in range(cnt.shape[1]):
            if not counter_col[c] or cnt[i, c] == 0.0:
                continue
            prev = closed_last[i, c]
            if not np.isnan(prev):
                d = first[i, c] - prev
                inc[i, c] += d if d >= 0.0 else first[i, c]
            closed_last[i, c] = last[i, c]


@nb.njit(cache=True, nogil=True)
def reduce_rows(order, parent, n_parent, cnt, sm, mn, mx, last, last_ts, sq, inc):
    """Merge child rows into parent rows, walking children in ``order``.

    Returns the parent's (cnt, sum, min, max, last, last_ts, sumsq, inc); ``last`` is the
    value with the latest timestamp (the first child in ``order`` wins a tie).
    """  # pragma: no cover - numba
    n_cols = cnt.shape[1]
    pc = np.zeros((n_parent, n_cols))
    ps = np.zeros((n_parent, n_cols))
    pmn = np.full((n_parent, n_cols), np.nan)
    pmx = np.full((n_parent, n_cols), np.nan)
    pl = np.full((n_parent, n_cols), np.nan)
    plt = np.full((n_parent, n_cols), np.iinfo(np.int64).min)
    psq = np.zeros((n_parent, n_cols))
    pinc = np.zeros((n_parent, n_cols))
    for j in range(order.size):
        i = order[j]
        q = parent[i]
        for c in range(n_cols):
            k = cnt[i, c]
            if k == 0.0:
                continue
            if pc[q, c] == 0.0:
                ps[q, c] = sm[i, c]
                pmn[q, c] = mn[i, c]
                pmx[q, c] = mx[i, c]
                psq[q, c] = sq[i, c]
                pinc[q, c] = inc[i, c]
            else:
                ps[q, c] += sm[i, c]
                psq[q, c] += sq[i, c]
                pinc[q, c] += inc[i, c]
                if mn[i, c] < pmn[q, c]:
                    pmn[q, c] = mn[i, c]
                if mx[i, c] > pmx[q, c]:
                    pmx[q, c] = mx[i, c]
            pc[q, c] += k
            if last_ts[i, c] > plt[q, c]:
                plt[q, c] = last_ts[i, c]
                pl[q, c] = last[i, c]
    return pc, ps, pmn, pmx, pl, plt, psq, pinc


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel of the hot path now.

    A first call can take tens of seconds on a busy machine; done inside a consumer loop it
    would stall heartbeats and get the instance thrown out of its group, so the service
    calls this before it joins.
    """
    from aggregator.prom_wire import warm_up as warm_prom_wire
    from aggregator.step_kernels import sketch_quantiles, step_reduce
    from aggregator.store.codec import warm_up as warm_codec
    from aggregator.store.downsample import warm_up as warm_downsample
    from aggregator.tier_chain import warm_up as warm_tiers

    f = np.zeros((1, 1, 2))
    i64 = np.zeros((1, 1, 2), np.int64)
    z = np.zeros(2, np.int64)
    accumulate(np.zeros(2), np.asarray([0, 2]), np.asarray([0, 1]), np.zeros(1, np.int32),
               np.zeros(1, np.int64), np.asarray([0, 1]), np.zeros(1, np.int32),
               np.asarray([0, 2]), np.asarray([0, 1], np.int32), f, f.copy(), f.copy(),
               f.copy(), f.copy(), i64, f.copy(), f.copy(), f.copy(), np.ones(2, bool),
               np.zeros(1, np.int32), 1, np.zeros(2, np.int64))
    two = np.zeros((1, 2))
    apply_counter_boundary(two, two.copy(), two.copy(), two.copy(), two.copy(),
                           np.ones(2, bool))
    reduce_rows(np.zeros(1, np.int64), np.zeros(1, np.int64), 1, two, two, two, two, two,
                np.zeros((1, 2), np.int64), two, two)
    step_reduce(z, np.zeros(2), np.asarray([0, 2]), 0, 1, 1, 1, 0)
    sketch_quantiles(z, np.ones(2), np.asarray([0, 2]), 10, 0, 10, 10, 1, 0.5, np.zeros(3))
    warm_tiers()
    warm_codec()
    warm_downsample()
    warm_prom_wire()

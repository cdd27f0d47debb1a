"""Deriving the coarse tiers (1m, 1h, 1d) from the tier below, for a set of series.

Each stored aggregate merges with one of the store's generic reducers (a count or a sum of
sums is a ``sum``; min, max, last are themselves); sketches merge by adding bucket counts,
which the store cannot do, so that is here. A coarse window is derived once every window
below it is closed; re-deriving rewrites the same points (the store's last write wins), so
a crash between deriving and checkpointing costs a little work, never correctness.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import Final

import numpy as np
import numpy.typing as npt

from aggregator.store import SeriesStore

__all__ = ["AGG_REDUCER", "ROLLUP_TIERS", "derive_tiers", "merge_sketch_window"]

ROLLUP_TIERS: Final = ("10s", "1m", "1h", "1d")
AGG_REDUCER: Final = {"count": "sum", "sum": "sum", "min": "min", "max": "max",
                      "last": "last", "sumsq": "sum", "increase": "sum"}


def merge_sketch_window(store: SeriesStore, src: str, dst: str, sids: npt.NDArray[np.int64],
                        start: int, end: int) -> None:
    """Add up the sketch buckets of ``src`` windows in [start, end) into one ``dst`` window."""
    if sids.size == 0:
        return
    data = store.read(src, sids, start, end)
    res = store.tiers[src].resolution_ms
    for i in range(sids.size):
        a, b = int(data.offsets[i]), int(data.offsets[i + 1])
        if a == b:
            continue
        slots = data.ts[a:b] % res
        uniq, inv = np.unique(slots, return_inverse=True)
        counts = np.bincount(inv, weights=data.values[a:b])
        store.append(dst, sids[i:i + 1], start + uniq, counts[:, None])


def derive_tiers(store: SeriesStore,
                 series: Callable[[], Mapping[str, npt.NDArray[np.int64]]],
                 sketch_sids: npt.NDArray[np.int64], done: dict[str, int],
                 closed_end: int) -> None:
    """Derive every coarse window that ends at or before ``closed_end`` and is not done yet.

    ``series()`` gives the stored series ids by reducer; it is called only if some window
    is due. ``done[tier]`` is the end of the last derived window of ``tier`` (updated here); a tier
    missing from ``done`` starts at the window containing ``done["base"]`` (the first base
    window ever closed), which the caller seeds.
    """
    reducers: Mapping[str, npt.NDArray[np.int64]] | None = None
    src_end = closed_end
    for src, dst in itertools.pairwise(ROLLUP_TIERS):
        res = store.tiers[dst].resolution_ms
        first = done.get(dst)
        if first is None:
            seed = done.get("base")
            if seed is None:
                return
            first = seed - seed % res
        end = src_end - src_end % res
        a = first
        while a + res <= end:
            if reducers is None:
                reducers = series()  # built only when a coarse window is actually due
            for reducer, sids in reducers.items():
                if sids.size:
                    store.downsample(src, dst, sids, reducer, a, a + res)
            merge_sketch_window(store, src, dst, sketch_sids, a, a + res)
            a += res
        done[dst] = max(a, first)
        src_end = done[dst]

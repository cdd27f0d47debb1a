"""From dense per-level window arrays to store appends, one group per (rack, level, metric).

A *group* is a set of series written together (the store stores its timestamps once and
keeps it as one open chunk): here the series of one level inside one rack for one metric,
i.e. entities x the aggregates of the metric's kind (the caller picks the grouping). Its layout is
computed once per topology change (:func:`build_groups`) and every window is then a single
fancy-index gather per level plus one append per group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from aggregator.series_layout import (
    AGG_CODES,
    AGG_SLOTS,
    ENTITY_STRIDE,
    KIND_OF_COLUMN,
    STORED_AGGS,
)
from aggregator.store import SeriesStore

__all__ = ["AGG_STACK", "GroupSpec", "LevelArrays", "append_groups", "build_groups", "group_values",
           "write_groups"]

AGG_STACK: Final = ("count", "sum", "min", "max", "last", "sumsq", "increase")
"""Order of :meth:`LevelArrays.stack` (and of schemas.rollup.AGG_ROWS)."""
_STACK_INDEX: Final = {a: i for i, a in enumerate(AGG_STACK)}

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


@dataclass(slots=True)
class LevelArrays:
    """One level's window aggregates, ``[entities, columns]`` each."""

    cnt: F64
    sum: F64
    min: F64
    max: F64
    last: F64
    last_ts: I64
    sumsq: F64
    inc: F64

    def stack(self) -> F64:
        return np.stack([self.cnt, self.sum, self.min, self.max, self.last, self.sumsq,
                         self.inc])


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """Where each series of each group takes its value from in the level's stack."""

    sids: I64
    agg_idx: I64
    ent_idx: I64
    col_idx: I64
    bounds: I64
    """Group ``g`` is ``[bounds[g], bounds[g+1])`` of the arrays above."""

    @property
    def n_groups(self) -> int:
        return self.bounds.size - 1

    def by_reducer(self) -> dict[str, list[I64]]:
        """Series ids grouped by the store reducer that derives coarser tiers."""
        from aggregator.tiers import AGG_REDUCER

        out: dict[str, list[I64]] = {}
        codes = self.sids % AGG_SLOTS
        for agg, reducer in AGG_REDUCER.items():
            sel = self.sids[codes == AGG_CODES[agg]]
            if sel.size:
                out.setdefault(reducer, []).append(sel)
        return out


def build_groups(groups: Sequence[tuple[I64, I64, I64]]) -> GroupSpec:
    """``groups``: (entity row indices, their entity ids, metric columns) per group."""
    sids: list[I64] = []
    aggs: list[I64] = []
    ents: list[I64] = []
    cols: list[I64] = []
    bounds = [0]
    for rows, eids, columns in groups:
        n_before = len(sids)
        for c in np.asarray(columns).tolist():
            kind = KIND_OF_COLUMN[c]
            if kind is None:
                continue
            for agg in STORED_AGGS[kind]:
                sids.append(eids * ENTITY_STRIDE + c * AGG_SLOTS + AGG_CODES[agg])
                aggs.append(np.full(rows.size, _STACK_INDEX[agg], np.int64))
                ents.append(rows)
                cols.append(np.full(rows.size, c, np.int64))
        bounds.append(bounds[-1] + sum(a.size for a in sids[n_before:]))
    def cat(xs):
        return (np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64))
    return GroupSpec(cat(sids), cat(aggs), cat(ents), cat(cols), np.asarray(bounds, np.int64))


def group_values(spec: GroupSpec, arrays: LevelArrays) -> F64:
    """Every series' value of one window, in ``spec.sids`` order; NaN where not sampled."""
    vals = arrays.stack()[spec.agg_idx, spec.ent_idx, spec.col_idx]
    vals[arrays.cnt[spec.ent_idx, spec.col_idx] == 0] = np.nan
    return vals


def append_groups(store: SeriesStore, tier: str, start: int, sids: I64, bounds: I64,
                  vals: F64) -> None:
    """One point at ``start`` per series, in groups ``[bounds[g], bounds[g+1])``."""
    store.append_points(tier, start, sids, bounds, vals)


def write_groups(store: SeriesStore, tier: str, start: int, spec: GroupSpec,
                 arrays: LevelArrays) -> int:
    """Append one window of every group; series without samples are NaN. Returns values."""
    if spec.sids.size == 0:
        return 0
    vals = group_values(spec, arrays)
    append_groups(store, tier, start, spec.sids, spec.bounds, vals)
    return int(vals.size)

"""The rack stage's coarse tiers (1 m, 1 h, 1 d), accumulated in memory as windows close.

Why not derive them from the store, as :mod:`aggregator.tiers` does for the small row
stage: that re-reads and re-decodes every series of the finer tier at each coarse boundary.
At 8,000 GPUs the first 1-minute boundary took 8 s in one call, which stalled the consumer
past Kafka's session timeout: the aggregator was expelled from its group about a minute
into every load test. Here each closing window is folded into running 1 m, 1 h and 1 d
accumulators (one vector pass per window), and a coarse window is written once its last
finer window is in.

Exactness: a coarse point must not depend on whether the process crashed. The fold has the
store reducers' semantics exactly (:mod:`aggregator.store.downsample`: per series, NaN
skipped, the first value taken as is, then ``+``, ``min``, ``max`` or "last" in time order),
so folding windows in memory and folding them back from the store give the same bits.
After an assignment (restart, rebalance) the finer windows this process did not see are
read back from the store: *seeding*. Seeding is the only store read here; it runs in slices
of a time budget (:meth:`TierChain.work`), so a restart at fleet scale does not stall the
consumer either, and the windows that close meanwhile wait, in order, until it is done.

A coarse point is written with the same group layout as the base tier (GPU groups per rack
and metric), so a query of one GPU over a day decodes narrow records in every tier.
``done[tier]`` (checkpointed) is the end of the last coarse window written.

Moving to another instance: instances share no store, so a successor cannot read back the
finer windows its predecessor wrote. The running coarse windows (one per tier) travel in the
partition's checkpoint instead (:meth:`TierChain.export`, :meth:`TierChain.restore`), and
the successor folds on from exactly the accumulator the predecessor had: each coarse window
is written whole, once, by whichever instance owns the partition when it completes, with
the same bits as a run that never moved. Seeding from the local store remains for a
checkpoint without that state (one written while seeding).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numba as nb
import numpy as np
import numpy.typing as npt

from aggregator.handover import array_from_json, array_to_json, sids_from_json, sids_to_json
from aggregator.level_writer import GroupSpec, append_groups
from aggregator.series_index import EntityIndex
from aggregator.series_layout import AGG_CODES, AGG_SLOTS
from aggregator.store import SeriesStore
from aggregator.store.downsample import REDUCERS
from aggregator.tiers import AGG_REDUCER, ROLLUP_TIERS

__all__ = ["FlatLayout", "SketchBlock", "TierChain"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]

_SUM: Final = REDUCERS.index("sum")
_MIN: Final = REDUCERS.index("min")
_MAX: Final = REDUCERS.index("max")
_OP_OF_CODE = np.full(AGG_SLOTS, -1, np.int8)
for _agg, _red in AGG_REDUCER.items():
    _OP_OF_CODE[AGG_CODES[_agg]] = REDUCERS.index(_red)

SEED_POINTS: Final = 262_144
"""Points per store read while seeding (~0.1 s): the series of one read are as many as fit
with one point per finer window of the range, so a read is a bounded slice of work."""


@dataclass(frozen=True, slots=True)
class FlatLayout:
    """A partition's stored rollup series in write order (its GPU, node and rack groups)."""

    version: int
    sids: I64
    ops: npt.NDArray[np.int8]
    """The store reducer (index into ``REDUCERS``) that merges each series over time."""
    bounds: I64
    """Group ``g`` is ``[bounds[g], bounds[g+1])``, the base tier's grouping."""
    sketch_sids: I64

    @classmethod
    def from_specs(cls, version: int, specs: Sequence[GroupSpec], sketch_sids: I64
                   ) -> FlatLayout:
        sids = np.concatenate([s.sids for s in specs]) if specs else np.zeros(0, np.int64)
        bounds, base = [np.zeros(1, np.int64)], 0
        for s in specs:
            bounds.append(s.bounds[1:] + base)
            base += int(s.sids.size)
        ops = _OP_OF_CODE[sids % AGG_SLOTS]
        if (ops < 0).any():
            raise ValueError("a rollup series has an aggregate without a reducer")
        return cls(version, sids.astype(np.int64), ops, np.concatenate(bounds),
                   np.asarray(sketch_sids, np.int64))

    def positions_in(self, newer: FlatLayout) -> I64:
        """Where each of this layout's series sits in ``newer`` (a grown topology's)."""
        order = np.argsort(newer.sids, kind="stable")
        at = np.searchsorted(newer.sids, self.sids, sorter=order)
        at = np.minimum(at, max(newer.sids.size - 1, 0))
        pos = order[at] if newer.sids.size else np.zeros(0, np.int64)
        if self.sids.size and not np.array_equal(newer.sids[pos], self.sids):
            raise ValueError("topology shrank: a stored series vanished from the layout")
        return pos.astype(np.int64)


@dataclass(frozen=True, slots=True)
class SketchBlock:
    """Sketch bucket counts of one window: (series id, slot, count) triples."""

    sids: I64
    slots: I64
    counts: F64

    @staticmethod
    def merge(blocks: Sequence[SketchBlock]) -> SketchBlock:
        """Counts added per (series, slot), sorted by series then slot (exact: integers)."""
        blocks = [b for b in blocks if b.sids.size]
        if not blocks:
            return SketchBlock(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        sids = np.concatenate([b.sids for b in blocks])
        slots = np.concatenate([b.slots for b in blocks])
        counts = np.concatenate([b.counts for b in blocks])
        order = np.lexsort((slots, sids))
        sids, slots, counts = sids[order], slots[order], counts[order]
        new = np.ones(sids.size, bool)
        new[1:] = (sids[1:] != sids[:-1]) | (slots[1:] != slots[:-1])
        starts = np.flatnonzero(new)
        return SketchBlock(sids[starts], slots[starts], np.add.reduceat(counts, starts))

    def write(self, store: SeriesStore, tier: str, start: int) -> None:
        """Each sketch series its buckets as points ``start + slot``."""
        if self.sids.size:
            store.append_series(tier, self.sids, start + self.slots, self.counts)


@dataclass(frozen=True, slots=True)
class _Window:
    """A finished window travelling up the chain: its values in ``layout`` order."""

    start: int
    layout: FlatLayout
    values: F64
    sketch: SketchBlock


@nb.njit(cache=True, inline="always")
def _merge(a: float, v: float, op: int) -> float:  # pragma: no cover - numba
    if op == _SUM:
        return a + v
    if op == _MIN:
        return min(a, v)
    if op == _MAX:
        return max(a, v)
    return v  # last


@nb.njit(cache=True, nogil=True)
def _fold_dense(acc: F64, have: npt.NDArray[np.bool_], pos: I64, vals: F64,
                ops: npt.NDArray[np.int8]) -> None:  # pragma: no cover - numba
    """Fold one window's values (series ``i`` at ``acc[pos[i]]``) into the accumulator."""
    for i in range(vals.size):
        v = vals[i]
        if np.isnan(v):
            continue
        p = pos[i]
        if have[p]:
            acc[p] = _merge(acc[p], v, ops[p])
        else:
            acc[p] = v
            have[p] = True


@nb.njit(cache=True, nogil=True)
def _fold_stored(acc: F64, have: npt.NDArray[np.bool_], first: int, offsets: I64, ts: I64,
                 vals: F64, ops: npt.NDArray[np.int8], lo: int, hi: int
                 ) -> bool:  # pragma: no cover - numba
    """Fold stored points with ``lo <= ts < hi`` of series ``first + i`` (CSR, time order).

    Returns whether any point (NaN included) fell in the range: a window whose finer
    windows were written, even all-NaN, is written too, as it would have been live.
    """
    touched = False
    for s in range(offsets.size - 1):
        p = first + s
        op = ops[p]
        for j in range(offsets[s], offsets[s + 1]):
            t = ts[j]
            if t < lo or t >= hi:
                continue
            touched = True
            v = vals[j]
            if np.isnan(v):
                continue
            if have[p]:
                acc[p] = _merge(acc[p], v, op)
            else:
                acc[p] = v
                have[p] = True
    return touched


def warm_up() -> None:
    """Compile (or load from numba's cache) the fold kernels; see window_kernel.warm_up."""
    ops = np.zeros(1, np.int8)
    _fold_dense(np.zeros(1), np.zeros(1, bool), np.zeros(1, np.int64), np.ones(1), ops)
    _fold_stored(np.zeros(1), np.zeros(1, bool), 0, np.asarray([0, 1]), np.zeros(1, np.int64),
                 np.ones(1), ops, 0, 1)


class _Acc:
    """One coarse window being accumulated."""

    __slots__ = ("acc", "folds", "have", "layout", "sketch", "start", "touched")

    def __init__(self, start: int, layout: FlatLayout) -> None:
        self.start = start
        self.layout = layout
        self.acc = np.zeros(layout.sids.size)
        self.have = np.zeros(layout.sids.size, bool)
        self.touched = False
        self.sketch: list[SketchBlock] = []
        self.folds = 0
        """Windows folded in since it was made (what its export depends on)."""

    def _adopt(self, layout: FlatLayout) -> None:
        """Move onto a grown layout (new GPUs or metrics appeared mid-window)."""
        pos = self.layout.positions_in(layout)
        acc, have = np.zeros(layout.sids.size), np.zeros(layout.sids.size, bool)
        acc[pos], have[pos] = self.acc, self.have
        self.acc, self.have, self.layout = acc, have, layout

    def fold(self, win: _Window) -> None:
        if win.layout.version > self.layout.version:
            self._adopt(win.layout)
        if win.layout is self.layout or win.layout.version == self.layout.version:
            pos = np.arange(self.layout.sids.size, dtype=np.int64)
        else:
            pos = win.layout.positions_in(self.layout)
        _fold_dense(self.acc, self.have, pos, win.values, self.layout.ops)
        self.sketch.append(win.sketch)
        self.touched = True
        self.folds += 1

    def finish(self) -> _Window:
        return _Window(self.start, self.layout, np.where(self.have, self.acc, np.nan),
                       SketchBlock.merge(self.sketch))


class _Seed:
    """Reading back the finer tier's windows in ``[lo, hi)`` that this process did not see."""

    def __init__(self, src: str, src_res: int, res: int, lo: int, hi: int,
                 layout: FlatLayout) -> None:
        self.src, self.src_res, self.res = src, src_res, res
        self.lo, self.hi = lo, hi
        self.layout = layout
        self.next = 0
        self.sketched = False
        self.accs: dict[int, _Acc] = {}
        self.chunk = max(1, SEED_POINTS // max(1, -(-(hi - lo) // src_res)))

    def _acc(self, w: int) -> _Acc:
        acc = self.accs.get(w)
        if acc is None:
            acc = self.accs[w] = _Acc(w, self.layout)
        return acc

    def step(self, store: SeriesStore) -> bool:
        """One bounded read; True once everything is read."""
        lay = self.layout
        if self.next < lay.sids.size:
            a, b = self.next, min(self.next + self.chunk, lay.sids.size)
            data = store.read(self.src, lay.sids[a:b], self.lo, self.hi)
            if data.ts.size:
                for w in np.unique(data.ts - data.ts % self.res).tolist():
                    acc = self._acc(w)
                    if _fold_stored(acc.acc, acc.have, a, data.offsets, data.ts, data.values,
                                    lay.ops, w, w + self.res):
                        acc.touched = True
            self.next = b
            return False
        if not self.sketched and lay.sketch_sids.size:
            data = store.read(self.src, lay.sketch_sids, self.lo, self.hi)
            sids = np.repeat(data.series_ids, np.diff(data.offsets))
            win = data.ts - data.ts % self.res
            for w in np.unique(win).tolist():
                sel = win == w
                acc = self._acc(w)
                acc.sketch.append(SketchBlock(sids[sel], data.ts[sel] % self.src_res,
                                              data.values[sel]))
                acc.touched = True
        self.sketched = True
        return True


@dataclass
class _Tier:
    name: str
    src: str
    res: int
    src_res: int
    cur: _Acc | None = None
    started: bool = False
    seed: _Seed | None = None
    backlog: list[_Window] = field(default_factory=list)
    """Finer windows that closed while ``seed`` runs, folded in order once it is done."""


class TierChain:
    """The 1 m, 1 h and 1 d windows of one partition, fed by its base windows as they close."""

    def __init__(self, store: SeriesStore, done: dict[str, int],
                 layout: Callable[[], FlatLayout]) -> None:
        """``done``: the partition's checkpointed progress, updated in place (``done["base"]``
        is the first base window ever closed, set by the caller before the first feed)."""
        self.store = store
        self.done = done
        self.layout = layout
        res = {t: store.tiers[t].resolution_ms for t in ROLLUP_TIERS}
        self.tiers = [_Tier(dst, src, res[dst], res[src])
                      for src, dst in itertools.pairwise(ROLLUP_TIERS)]
        self._exported: list[tuple[_Acc, int, dict[str, Any]] | None] = [None] * len(self.tiers)
        """Each tier's last export and the window (and its fold count) it was made of."""

    def feed(self, start: int, layout: FlatLayout, values: F64, sketch: SketchBlock) -> None:
        """A base window closed (``values`` in ``layout`` order, NaN where not sampled)."""
        self._feed(0, _Window(start, layout, values, sketch))

    @property
    def seeding(self) -> bool:
        return any(t.seed is not None for t in self.tiers)

    def export(self, index: EntityIndex) -> list[dict[str, Any] | None] | None:
        """The running window of each tier, by entity key (for another instance's index);
        None while seeding, whose partial reads are not worth carrying."""
        if self.seeding:
            return None
        out: list[dict[str, Any] | None] = []
        for k, t in enumerate(self.tiers):
            acc = t.cur
            if acc is None:
                out.append(None)
                continue
            # A coarse window changes only when a finer one is folded in (the hour's once a
            # minute, the day's once an hour), and exporting one of a 31,000-GPU partition
            # (every series' accumulator, by entity key) took a few percent of the store
            # thread at every checkpoint: an unchanged window's export is the last one.
            last = self._exported[k]
            if last is not None and last[0] is acc and last[1] == acc.folds:
                out.append(last[2])
                continue
            have = np.flatnonzero(acc.have)
            sk = SketchBlock.merge(acc.sketch)
            state = {"start": acc.start, "touched": acc.touched,
                     "sids": sids_to_json(index, acc.layout.sids[have]),
                     "values": array_to_json(acc.acc[have]),
                     "sketch": sids_to_json(index, sk.sids),
                     "slots": array_to_json(sk.slots), "counts": array_to_json(sk.counts)}
            self._exported[k] = (acc, acc.folds, state)
            out.append(state)
        return out

    def restore(self, state: list[dict[str, Any] | None], index: EntityIndex) -> int:
        """Continue from :meth:`export`'s state; no tier seeds. Returns how many series of
        the state are not in this partition's layout (dropped: a GPU that fell silent
        before the hand-over and was not met again in the replay)."""
        lay = self.layout()
        order = np.argsort(lay.sids, kind="stable")
        dropped = 0
        for t, st in zip(self.tiers, state, strict=True):
            t.started = True
            if st is None:
                continue
            acc = _Acc(int(st["start"]), lay)
            sids = sids_from_json(index, st["sids"])
            values = array_from_json(st["values"], np.float64)
            at = np.minimum(np.searchsorted(lay.sids, sids, sorter=order),
                            max(lay.sids.size - 1, 0))
            pos = order[at] if lay.sids.size else np.zeros(0, np.int64)
            ok = lay.sids[pos] == sids if lay.sids.size else np.zeros(sids.size, bool)
            dropped += int(np.count_nonzero(~ok))
            acc.acc[pos[ok]] = values[ok]
            acc.have[pos[ok]] = True
            acc.touched = bool(st["touched"])
            sketch = SketchBlock(sids_from_json(index, st["sketch"]),
                                 array_from_json(st["slots"], np.int64),
                                 array_from_json(st["counts"], np.float64))
            acc.sketch = [sketch] if sketch.sids.size else []
            t.cur = acc
        return dropped

    def work(self, deadline: float) -> None:
        """Advance seeding until ``deadline`` (``time.perf_counter``); at least one read."""
        for k, t in enumerate(self.tiers):
            while t.seed is not None:
                if t.seed.step(self.store):
                    self._seeded(k)
                elif time.perf_counter() > deadline:
                    return

    # ------------------------------------------------------------------ internals
    def _feed(self, k: int, win: _Window) -> None:
        t = self.tiers[k]
        if not t.started:
            t.started = True
            t.seed = self._plan_seed(t, win.start)
        if t.seed is not None:
            t.backlog.append(win)
            return
        self._fold(k, win)

    def _plan_seed(self, t: _Tier, first: int) -> _Seed | None:
        """The finer windows before ``first`` (this process's first) still to be folded."""
        base = self.done.get("base")
        if base is None:
            return None
        src_from = base - base % t.src_res  # the first finer window that can exist
        lo = self.done.get(t.name, src_from - src_from % t.res)
        lo = min(lo, first - first % t.res)  # never write a coarse window half-filled
        lo = max(lo, src_from)
        if lo >= first:
            return None
        return _Seed(t.src, t.src_res, t.res, lo, first, self.layout())

    def _seeded(self, k: int) -> None:
        t = self.tiers[k]
        seed, backlog = t.seed, t.backlog
        assert seed is not None
        t.seed, t.backlog = None, []
        for w in sorted(seed.accs):
            acc = seed.accs[w]
            if w + t.res <= seed.hi:
                if acc.touched:
                    self._finish(k, acc)
            else:
                t.cur = acc  # the window the first live one belongs to
        for win in backlog:
            self._fold(k, win)

    def _fold(self, k: int, win: _Window) -> None:
        t = self.tiers[k]
        w = win.start - win.start % t.res
        if t.cur is not None and t.cur.start != w:
            self._finish(k, t.cur)  # finer windows arrive in order: it can get no more
            t.cur = None
        if t.cur is None:
            t.cur = _Acc(w, win.layout)
        t.cur.fold(win)
        if win.start + t.src_res >= w + t.res:
            self._finish(k, t.cur)
            t.cur = None

    def _finish(self, k: int, acc: _Acc) -> None:
        t = self.tiers[k]
        win = acc.finish()
        lay = win.layout
        append_groups(self.store, t.name, win.start, lay.sids, lay.bounds, win.values)
        win.sketch.write(self.store, t.name, win.start)
        self.done[t.name] = max(self.done.get(t.name, 0), win.start + t.res)
        if k + 1 < len(self.tiers):
            self._feed(k + 1, win)

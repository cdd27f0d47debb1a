"""The row/cluster stage: rack rollups -> row windows -> (published) -> cluster windows.

It consumes the rollups topic. Rack frames (keyed by row) merge into row windows; each
closed row window is stored and published back as a row frame keyed by cluster, which the
same stage (on whichever instance owns that key) merges into cluster windows. So the stage
scales out like the rack stage and needs no all-to-one hop except per cluster.

A child frame is identified by (level, entity, window); a replayed frame replaces the one
held, so re-reading after a crash cannot double count. A parent window closes when every
child of the parent has reported a later window (children publish their windows in order,
so nothing more can come for it), or, so that a dead rack cannot hold its row forever,
once the most advanced child is ``lateness`` past the window's end. Closing on the
children's progress rather than on one partition-wide watermark is what keeps the result
independent of how fast the different sample partitions were consumed (a backlog replay
runs them at very different speeds). Children arriving for a closed window are counted as
late. Children are merged in name order, so sums are bit-for-bit the same on every replay.

"Every child" means every child this partition has seen (persisted in the checkpoint). So
that a rack whose first rollup comes a little after its siblings' (an instance slower to
start, a partition consumed later) is not late for the first windows, a parent closes on
its children's progress only once ``settle`` of event time has passed since the parent
was first seen; until then only lateness closes its windows. A rack that first appears
later than that (a rack added to a running fleet) is late for the windows already closed.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from aggregator.checkpoint import PartitionCheckpoint
from aggregator.handover import array_from_json, array_to_json, sids_from_json, sids_to_json
from aggregator.level_writer import LevelArrays, build_groups, write_groups
from aggregator.rack_stage import BASE_TIER, WINDOW_MS
from aggregator.series_index import EntityIndex, EntityKey
from aggregator.series_layout import AGG_CODES, AGG_SLOTS, ENTITY_STRIDE, KIND_OF_COLUMN, N_COLUMNS
from aggregator.sketch import N_SLOTS
from aggregator.store import SeriesStore
from aggregator.tiers import ROLLUP_TIERS, derive_tiers
from aggregator.window_kernel import reduce_rows
from fleetpulse.transport.base import Message
from schemas.catalog import Kind
from schemas.errors import DecodeError
from schemas.rollup import RollupFrame, decode_rollup

__all__ = ["RowStage"]

_NEG_INF: Final = -(1 << 62)
_FAR_FUTURE: Final = 1 << 62
_GAUGE = np.asarray([k is Kind.GAUGE for k in KIND_OF_COLUMN], bool)
I64 = npt.NDArray[np.int64]

def _cat(parts: list[np.ndarray], dtype: type) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


ParentKey = tuple[str, str, str]
"""(parent level, cluster, row) -- row is "" for a cluster."""


@dataclass(slots=True)
class _ParentTiers:
    """What the coarse tiers of one parent need: its series and how far they are derived.

    Per parent, not per partition: parents sharing a partition close independently."""

    done: dict[str, int] = field(default_factory=dict)
    sids: dict[str, set[int]] = field(default_factory=dict)
    sketch_sids: set[int] = field(default_factory=set)

    def all_sids(self) -> I64:
        both = set(self.sketch_sids).union(*self.sids.values())
        return np.fromiter(sorted(both), np.int64, len(both))

    def to_json(self, index: EntityIndex, store: SeriesStore) -> dict[str, Any]:
        """Series by entity key (ids differ between instances) and the tail: the finer
        points of every open coarse window, which the next owner's store does not have."""
        return {"done": self.done,
                "sids": {k: sids_to_json(index, np.fromiter(sorted(v), np.int64, len(v)))
                         for k, v in self.sids.items()},
                "sketch": sids_to_json(index, np.fromiter(sorted(self.sketch_sids), np.int64,
                                                          len(self.sketch_sids))),
                "tail": self._tail(index, store)}

    def _tail(self, index: EntityIndex, store: SeriesStore) -> list[dict[str, Any]]:
        base = self.done.get("base")
        if base is None:
            return []
        sids = self.all_sids()
        out = []
        for src, dst in itertools.pairwise(ROLLUP_TIERS):
            res = store.tiers[dst].resolution_ms
            lo = self.done.get(dst, base - base % res)
            data = store.read(src, sids, lo, _FAR_FUTURE)
            if data.ts.size:
                out.append({"tier": src, "sids": sids_to_json(index, data.series_ids),
                            "offsets": array_to_json(data.offsets),
                            "ts": array_to_json(data.ts), "values": array_to_json(data.values)})
        return out

    @classmethod
    def from_json(cls, obj: dict[str, Any], index: EntityIndex, store: SeriesStore
                  ) -> _ParentTiers:
        """Read :meth:`to_json` back, writing its tail into this instance's store."""
        for tail in obj.get("tail", []):
            sids = sids_from_json(index, tail["sids"])
            offsets = array_from_json(tail["offsets"], np.int64)
            ts = array_from_json(tail["ts"], np.int64)
            values = array_from_json(tail["values"], np.float64)
            for i in range(sids.size):
                a, b = int(offsets[i]), int(offsets[i + 1])
                if a < b:
                    store.append(tail["tier"], sids[i:i + 1], ts[a:b], values[a:b, None])
        return cls(dict(obj.get("done", {})),
                   {k: set(sids_from_json(index, v).tolist())
                    for k, v in obj.get("sids", {}).items()},
                   set(sids_from_json(index, obj["sketch"]).tolist()) if "sketch" in obj
                   else set())


@dataclass(slots=True)
class _Part:
    watermark: int = _NEG_INF
    open: dict[tuple[ParentKey, int], dict[str, RollupFrame]] = field(default_factory=dict)
    first_offset: dict[tuple[ParentKey, int], int] = field(default_factory=dict)
    child_wm: dict[ParentKey, dict[str, int]] = field(default_factory=dict)
    """Per parent, the newest window start each child reported."""
    first_ms: dict[ParentKey, int] = field(default_factory=dict)
    """Per parent, the window start of the first frame seen (when its settle began)."""
    position: int = 0
    tiers: dict[ParentKey, _ParentTiers] = field(default_factory=dict)

    @property
    def resume(self) -> int:
        return min(self.first_offset.values(), default=self.position)


class RowStage:
    """Row and cluster rollups for the rollups-topic partitions this instance owns."""

    def __init__(self, store: SeriesStore, index: EntityIndex, *, topic: str,
                 lateness_ms: int = 300_000, settle_ms: int = 60_000) -> None:
        self.store = store
        self.index = index
        self.topic = topic
        self.lateness = lateness_ms
        self.settle = settle_ms
        self.parts: dict[int, _Part] = {}
        self.late = 0
        self.decode_errors = 0
        self.windows_closed = 0

    def assign(self, partition: int, ckpt: PartitionCheckpoint | None) -> int:
        part = _Part()
        if ckpt is not None:
            part.watermark = ckpt.watermark
            part.position = ckpt.resume_offset
            part.tiers = {(lv, cl, rw): _ParentTiers.from_json(obj, self.index, self.store)
                          for lv, cl, rw, obj in ckpt.extra.get("tiers", [])}
            part.child_wm = {
                (lv, cl, rw): dict(children)
                for lv, cl, rw, children in ckpt.extra.get("child_wm", [])}
            # a checkpoint from before first_ms: its parents' children are long known
            first = {(lv, cl, rw): int(ms) for lv, cl, rw, ms in ckpt.extra.get("first_ms", [])}
            part.first_ms = {k: first.get(k, _NEG_INF) for k in part.child_wm}
        self.parts[partition] = part
        return part.position

    def revoke(self, partition: int) -> None:
        self.parts.pop(partition, None)

    def process(self, msgs: list[Message]) -> tuple[list[tuple[Message, str]], list[RollupFrame]]:
        dead: list[tuple[Message, str]] = []
        touched: set[int] = set()
        for msg in msgs:
            part = self.parts.get(msg.partition)
            if part is None:
                part = self.parts[msg.partition] = _Part(position=msg.offset)
            if msg.offset < part.position:
                continue
            part.position = msg.offset + 1
            try:
                fr = decode_rollup(msg.value)
            except DecodeError as exc:
                self.decode_errors += 1
                dead.append((msg, f"rollup frame: {exc}"))
                continue
            touched.add(msg.partition)
            part.watermark = max(part.watermark, fr.start_ms)
            if fr.level == "rack":
                parent: ParentKey = ("row", fr.cluster, fr.row)
                child = fr.rack
            else:
                parent = ("cluster", fr.cluster, "")
                child = fr.row
            wms = part.child_wm.setdefault(parent, {})
            first = part.first_ms.setdefault(parent, fr.start_ms)
            if self._closed(wms, first, fr.start_ms):
                self.late += 1
                continue
            wms[child] = max(wms.get(child, _NEG_INF), fr.start_ms)
            key = (parent, fr.start_ms)
            part.open.setdefault(key, {})[child] = fr
            part.first_offset.setdefault(key, msg.offset)
        out: list[RollupFrame] = []
        for p in sorted(touched):
            out.extend(self._close_due(p))
        return dead, out

    def _closed(self, wms: dict[str, int], first_ms: int, start: int) -> bool:
        """Whether the parent window starting at ``start`` is complete (see module doc)."""
        if not wms:
            return False
        newest = max(wms.values())
        if start + WINDOW_MS + self.lateness <= newest:
            return True
        return newest - first_ms >= self.settle and min(wms.values()) > start

    def _close_due(self, partition: int) -> list[RollupFrame]:
        part = self.parts[partition]
        due = sorted((k for k in part.open
                      if self._closed(part.child_wm[k[0]], part.first_ms[k[0]], k[1])),
                     key=lambda k: (k[1], k[0]))
        out = []
        ends: dict[ParentKey, int] = {}
        for key in due:
            tiers = part.tiers.setdefault(key[0], _ParentTiers())
            frame = self._close(tiers, key[0], key[1], part.open.pop(key))
            part.first_offset.pop(key, None)
            tiers.done.setdefault("base", key[1])
            ends[key[0]] = key[1] + WINDOW_MS
            self.windows_closed += 1
            if frame is not None:
                out.append(frame)
        for parent, end in sorted(ends.items()):
            t = part.tiers[parent]
            def series(t: _ParentTiers = t) -> dict[str, I64]:
                return {r: np.fromiter(sorted(v), np.int64) for r, v in t.sids.items()}
            derive_tiers(self.store, series, np.fromiter(sorted(t.sketch_sids), np.int64),
                         t.done, end)
        return out

    def _close(self, part: _ParentTiers, parent: ParentKey, start: int,
               children: dict[str, RollupFrame]) -> RollupFrame | None:
        names = sorted(children)
        n = len(names)
        cnt = np.zeros((n, N_COLUMNS))
        arrs = {k: np.zeros((n, N_COLUMNS)) for k in ("sum", "sumsq", "inc")}
        arrs.update({k: np.full((n, N_COLUMNS), np.nan) for k in ("min", "max", "last")})
        last_ts = np.full((n, N_COLUMNS), np.iinfo(np.int64).min, np.int64)
        present = np.zeros(N_COLUMNS, bool)
        sk = np.zeros((N_COLUMNS, N_SLOTS))
        for i, name in enumerate(names):
            fr = children[name]
            cols = fr.metric_ids.astype(np.int64)
            keep = cols < N_COLUMNS
            cols = cols[keep]
            present[cols] = True
            a = fr.aggs[:, keep]
            cnt[i, cols] = np.nan_to_num(a[0])
            arrs["sum"][i, cols] = a[1]
            arrs["min"][i, cols] = a[2]
            arrs["max"][i, cols] = a[3]
            arrs["last"][i, cols] = a[4]
            arrs["sumsq"][i, cols] = a[5]
            arrs["inc"][i, cols] = a[6]
            last_ts[i, cols] = fr.last_ts[keep]
            if fr.sketch_counts.size:
                fcols = fr.metric_ids.astype(np.int64)[fr.sketch_cols]
                ok = fcols < N_COLUMNS
                np.add.at(sk, (fcols[ok], fr.sketch_slot[ok]), fr.sketch_counts[ok])
        level, cluster, row = parent
        ekey: EntityKey = (level, cluster, row, "", "", "")
        eid = self.index.add(ekey)
        cols = np.flatnonzero(present)
        self.index.add_metrics([eid], cols.tolist())
        res = LevelArrays(*reduce_rows(np.arange(n, dtype=np.int64), np.zeros(n, np.int64), 1,
                                       cnt, arrs["sum"], arrs["min"], arrs["max"], arrs["last"],
                                       last_ts, arrs["sumsq"], arrs["inc"]))
        spec = build_groups([(np.zeros(1, np.int64), np.asarray([eid], np.int64), cols)])
        write_groups(self.store, BASE_TIER, start, spec, res)
        for red, arr in spec.by_reducer().items():
            part.sids.setdefault(red, set()).update(np.concatenate(arr).tolist())
        sk_cols, sk_slots, sk_counts = [], [], []
        for c in cols[_GAUGE[cols]].tolist():
            slots = np.flatnonzero(sk[c])
            if slots.size == 0:
                continue
            sid = eid * ENTITY_STRIDE + c * AGG_SLOTS + AGG_CODES["sketch"]
            part.sketch_sids.add(sid)
            self.store.append(BASE_TIER, np.asarray([sid]), start + slots, sk[c, slots][:, None])
            sk_cols.append(np.full(slots.size, int(np.searchsorted(cols, c)), np.int32))
            sk_slots.append(slots.astype(np.int32))
            sk_counts.append(sk[c, slots])
        if level != "row":
            return None
        return RollupFrame(
            "row", cluster, row, "", start, WINDOW_MS, cols.astype(np.uint16),
            res.last_ts[0, cols].astype(np.int64),
            np.stack([res.cnt[0, cols], res.sum[0, cols], res.min[0, cols], res.max[0, cols],
                      res.last[0, cols], res.sumsq[0, cols], res.inc[0, cols]]),
            N_SLOTS, _cat(sk_cols, np.int32), _cat(sk_slots, np.int32), _cat(sk_counts, np.float64))

    def checkpoint(self, partition: int) -> PartitionCheckpoint:
        part = self.parts[partition]
        return PartitionCheckpoint(
            topic=self.topic, partition=partition, resume_offset=part.resume,
            position=part.position, watermark=part.watermark,
            extra={"tiers": [[*k, v.to_json(self.index, self.store)]
                             for k, v in part.tiers.items()],
                   "child_wm": [[*k, v] for k, v in part.child_wm.items()],
                   "first_ms": [[*k, v] for k, v in part.first_ms.items()]})

    def open_windows(self) -> int:
        return sum(len(p.open) for p in self.parts.values())

    def pending_close(self) -> bool:
        return False  # closes everything due in the batch that made it due

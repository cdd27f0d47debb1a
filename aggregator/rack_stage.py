"""The rack-level stage: sample frames -> GPU, node and rack windows -> store + rollups.

Synchronous core, no I/O besides the store: :meth:`RackStage.process` takes a batch of
consumed messages and returns what to dead-letter and which rack rollups to publish; the
service (:mod:`aggregator.service`) does the Kafka side. That keeps the hot path testable
and benchmarkable without a broker.

Per partition (samples are keyed by rack, so a rack lives in one partition):

- the watermark is the newest sample timestamp seen; a tick is accepted iff its window
  ``[s, s + W)`` satisfies ``s + W + lateness > watermark``, else its samples are late:
  counted, never silently dropped; windows close in start order once that stops holding;
- frames are de-duplicated by (agent, seq) (:mod:`aggregator.dedup`);
- the resume offset is the first message that still feeds an open window; the service
  commits it after :meth:`checkpoint` made the store durable (Kafka is the write-ahead log).

Raw samples go to the ``raw`` tier as they arrive (one append per frame, the frame's own
ticks x GPUs x metrics group). At close a window's GPU arrays reduce to nodes and racks in
name order and every level is written to the ``10s`` tier; coarser tiers are derived from
the tier below (:mod:`aggregator.tiers`).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from aggregator.checkpoint import PartitionCheckpoint
from aggregator.dedup import SeqDeduper
from aggregator.level_writer import (
    GroupSpec,
    LevelArrays,
    append_groups,
    build_groups,
    group_values,
)
from aggregator.series_index import EntityIndex
from aggregator.series_layout import AGG_CODES, AGG_SLOTS, ENTITY_STRIDE, KIND_OF_COLUMN, N_COLUMNS
from aggregator.sketch import N_SLOTS, RELATIVE_ACCURACY
from aggregator.store import SeriesStore
from aggregator.tier_chain import FlatLayout, SketchBlock, TierChain
from aggregator.topology import Topology
from aggregator.window_kernel import accumulate, apply_counter_boundary, reduce_rows
from fleetpulse.transport.base import Message
from schemas.catalog import Kind
from schemas.errors import DecodeError
from schemas.frame import SampleFrame, decode_frame
from schemas.rollup import RollupFrame

__all__ = ["BASE_TIER", "RackStage", "StageStats"]

BASE_TIER: Final = "10s"
WINDOW_MS: Final = 10_000
CLOSE_BUDGET_S: Final = 0.5
"""Time per batch for closing due windows (each partition's close is one unit of ~0.2 s at
2,500 GPUs a partition): at 30,000 GPUs closing every partition at once took several
seconds, too close to Kafka's session timeout; the rest waits for the next batch (a due
window only stays open longer -- late data for it is still counted late)."""
SEED_BUDGET_S: Final = 0.05
"""Time per batch for coarse tiers catching up from the store after an assignment: bounded
so that a restart at fleet scale never stalls the consumer (see aggregator.tier_chain)."""
_NEG_INF: Final = -(1 << 62)
_GAUGE = np.asarray([k is Kind.GAUGE for k in KIND_OF_COLUMN], bool)
_COUNTER = np.asarray([k is Kind.COUNTER for k in KIND_OF_COLUMN], bool)
_ARRAYS: Final = ("cnt", "sum", "min", "max", "last", "sumsq", "first", "inc")

I64 = npt.NDArray[np.int64]
log = logging.getLogger("fleetpulse.aggregator")
_FUTURE_LOG_EVERY_S: Final = 60.0


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(slots=True)
class StageStats:
    """Counters exported on /metrics."""

    frames: int = 0
    metrics: int = 0
    duplicates: int = 0
    late_samples: int = 0
    decode_errors: int = 0
    windows_closed: int = 0
    replayed: int = 0
    future_samples: int = 0
    """Values stamped more than ``max_future_ms`` ahead of this aggregator's clock."""


@dataclass(slots=True)
class _Part:
    watermark: int = _NEG_INF
    open: dict[int, int] = field(default_factory=dict)
    """window start -> first offset feeding it."""
    opened_wm: dict[int, int] = field(default_factory=dict)
    """window start -> the watermark just before the message that opened it (the replay
    watermark of a checkpoint whose resume offset is that message)."""
    closed_through: int = _NEG_INF
    """Every window starting at or before this is closed (the limit of the last close):
    a replayed sample never opens one of them again."""
    position: int = 0
    raw_through: int = 0
    dedup: SeqDeduper = field(default_factory=SeqDeduper)
    done: dict[str, int] = field(default_factory=dict)
    pending_counters: dict[str, dict[str, float]] = field(default_factory=dict)
    chain: TierChain | None = None
    """The coarse tiers' running windows; made at the first close after assignment."""
    chain_state: list[dict[str, Any] | None] | None = None
    """The predecessor's running coarse windows (checkpoint), until ``chain`` takes them."""

    @property
    def resume(self) -> int:
        return min(self.open.values(), default=self.position)


class _Pool:
    """Dense window arrays ``[pool slot, gpu slot, column]`` and which window holds a slot."""

    def __init__(self) -> None:
        self.cap_gpus = 64
        self.n_slots = 4
        self.arr: dict[str, np.ndarray] = {}
        self.last_ts = np.zeros(0, np.int64)
        self._alloc(self.n_slots, self.cap_gpus)
        self.slot_of: dict[int, int] = {}
        self.free = list(range(self.n_slots))[::-1]
        self.codes: dict[int, list[I64]] = {}
        """Sketch codes (rack, column, bucket) folded into a slot, one per sample ..."""
        self.split: dict[int, dict[int, list[I64]]] = {}
        """... and those sorted out by partition since (see ``RackStage._sketches``)."""

    def _alloc(self, n_slots: int, cap: int) -> None:
        old, old_ts = self.arr, self.last_ts
        self.arr = {k: np.zeros((n_slots, cap, N_COLUMNS)) for k in _ARRAYS}
        self.last_ts = np.zeros((n_slots, cap, N_COLUMNS), np.int64)
        if old:
            s, c = old["cnt"].shape[:2]
            for k in _ARRAYS:
                self.arr[k][:s, :c] = old[k]
            self.last_ts[:s, :c] = old_ts

    def ensure_gpus(self, n: int) -> None:
        if n > self.cap_gpus:
            # Growing copies every open window: at least doubled, so it happens rarely (a
            # fleet's GPUs all appear within its first frames), and an eighth over what is
            # seen, not the power of four above it: 31,000 GPUs took 65,536 rows a window
            # slot (179 MB of them, 2.9 GB at 16 slots), 34,875 now.
            self.cap_gpus = max(2 * self.cap_gpus, n + n // 8)
            self._alloc(self.n_slots, self.cap_gpus)

    def slot(self, start: int) -> int:
        s = self.slot_of.get(start)
        if s is None:
            if not self.free:
                self.free = list(range(self.n_slots, 2 * self.n_slots))[::-1]
                self.n_slots *= 2
                self._alloc(self.n_slots, self.cap_gpus)
            s = self.slot_of[start] = self.free.pop()
            self.codes[s] = []
            self.split[s] = {}
        return s

    def release(self, start: int) -> None:
        s = self.slot_of.pop(start)
        self.arr["cnt"][s] = 0.0
        self.codes.pop(s, None)
        self.split.pop(s, None)
        self.free.append(s)


class RackStage:
    """GPU -> node -> rack rollups for the partitions this instance owns."""

    def __init__(self, store: SeriesStore, index: EntityIndex, *, topic: str,
                 lateness_ms: int = 20_000, raw: bool = True, max_future_ms: int = 0,
                 wall_ms: Callable[[], int] = _wall_ms) -> None:
        self.store = store
        self.max_future_ms = max_future_ms
        """Ticks stamped further ahead of ``wall_ms()`` are counted, not rolled up (0: off).
        Without it one agent whose clock jumped a year ahead would move its partition's
        watermark there and make every honest sample after it late."""
        self.wall_ms = wall_ms
        self._future_logged: dict[str, float] = {}
        self.index = index
        self.topic = topic
        self.lateness = lateness_ms
        self.raw = raw
        self.topo = Topology(index)
        self.pool = _Pool()
        self.parts: dict[int, _Part] = {}
        self.stats = StageStats()
        self._due: set[int] = set()
        """Partitions that received data since their windows were last checked for closing."""
        self.closed_last = np.full((64, N_COLUMNS), np.nan)
        self._mcols: dict[bytes, np.ndarray] = {}
        self._raw_sids: dict[tuple[bytes, bytes], I64] = {}
        self._noted: set[tuple[bytes, bytes]] = set()
        self._groups: dict[int, tuple[int, list[GroupSpec], I64]] = {}
        self._flat: dict[int, FlatLayout] = {}

    # ------------------------------------------------------------- partitions
    def assign(self, partition: int, ckpt: PartitionCheckpoint | None) -> int:
        """Take a partition; returns the offset to read from (None -> committed)."""
        part = _Part()
        if ckpt is not None:
            # From the watermark at the resume offset, not the one at the checkpoint: a
            # window that was due but left open by the close budget is rebuilt by the
            # replay and closed, where judged by the later watermark its samples would
            # look late and the window would be lost.
            part.watermark = (ckpt.watermark if ckpt.replay_watermark is None
                              else ckpt.replay_watermark)
            if ckpt.closed_through is not None:
                part.closed_through = ckpt.closed_through
            part.position = ckpt.resume_offset
            part.raw_through = ckpt.position
            part.dedup = SeqDeduper.from_json(ckpt.dedup)
            part.done = dict(ckpt.downsampled)
            part.pending_counters = ckpt.counters
            part.chain_state = ckpt.extra.get("chain")
        self.parts[partition] = part
        return part.position

    def revoke(self, partition: int) -> None:
        """Forget a partition (after its checkpoint); its open windows are rebuilt elsewhere."""
        part = self.parts.pop(partition, None)
        if part is None:
            return
        lay = self.topo.layout(partition)
        if self.closed_last.shape[0] > (lay.gslots.max() if lay.gslots.size else -1):
            self.closed_last[lay.gslots] = np.nan
        for start in list(part.open):
            s = self.pool.slot_of[start]
            self.pool.arr["cnt"][s, lay.gslots] = 0.0
            self._sketches(s, partition)  # drops this partition's pending codes
            if not any(start in p.open for p in self.parts.values()):
                self.pool.release(start)

    # ------------------------------------------------------------- hot path
    def _columns(self, metric_ids: np.ndarray, n_extra: int) -> np.ndarray:
        key = metric_ids.tobytes() + n_extra.to_bytes(2, "little")
        cols = self._mcols.get(key)
        if cols is None:
            cols = np.concatenate([metric_ids.astype(np.int32), np.full(n_extra, -1, np.int32)])
            cols[cols >= N_COLUMNS] = -1
            self._mcols[key] = cols
        return cols

    def process(self, msgs: list[Message]) -> tuple[list[tuple[Message, str]], list[RollupFrame]]:
        """Fold a batch into the windows, close what is due; (dead letters, rollups)."""
        dead: list[tuple[Message, str]] = []
        vals: list[np.ndarray] = []
        ticks_pool: list[int] = []
        ticks_ts: list[np.ndarray] = []
        n_ticks: list[int] = []
        gsl: list[np.ndarray] = []
        mcl: list[np.ndarray] = []
        touched: set[int] = set()
        width, late = WINDOW_MS, self.lateness
        for msg in msgs:
            part = self.parts.get(msg.partition)
            if part is None:
                part = self.parts[msg.partition] = _Part(position=msg.offset)
            if msg.offset < part.position:
                continue  # redelivered after a seek; already folded in
            part.position = msg.offset + 1
            try:
                fr = decode_frame(msg.value)
            except DecodeError as exc:
                self.stats.decode_errors += 1
                dead.append((msg, f"sample frame: {exc}"))
                continue
            if part.dedup.is_duplicate(fr.agent, fr.seq, msg.offset):
                self.stats.duplicates += 1
                continue
            t = fr.ts.size
            if t == 0 or fr.values.size == 0:
                continue
            if self.max_future_ms > 0:
                fr = self._drop_future(fr)
                t = fr.ts.size
                if t == 0:
                    continue
            if msg.offset < part.raw_through:
                self.stats.replayed += 1
            try:
                gslots = self.topo.gslots_for(fr.identity, fr.gpus, msg.partition)
            except ValueError as exc:
                self.stats.decode_errors += 1
                dead.append((msg, f"sample frame: {exc}"))
                continue
            cols = self._columns(fr.metric_ids, len(fr.extra))
            if len(self.topo.gpu_key) > self.pool.cap_gpus:
                self.pool.ensure_gpus(len(self.topo.gpu_key))
            ts_list = fr.ts.tolist()
            before = part.watermark
            wm = max(before, ts_list[-1])
            part.watermark = wm
            limit = max(wm - width - late, part.closed_through)
            touched.add(msg.partition)
            noted = (gslots.tobytes(), cols.tobytes())
            if noted not in self._noted:
                self._noted.add(noted)
                self.topo.note_metrics(gslots, cols)
            for i, tsv in enumerate(ts_list):
                start = tsv - tsv % width
                if start > limit:
                    ticks_pool.append(self.pool.slot(start))
                    if start not in part.open:
                        part.open[start] = msg.offset
                        part.opened_wm[start] = before
                else:
                    ticks_pool.append(-1)
                    if msg.offset >= part.raw_through:  # a replayed one was seen before
                        self.stats.late_samples += int(np.count_nonzero(~np.isnan(fr.values[i])))
            if self.raw and msg.offset >= part.raw_through:
                self._write_raw(fr.metric_ids, gslots, fr.ts, fr.values, cols)
            vals.append(fr.values.reshape(-1))
            ticks_ts.append(fr.ts)
            n_ticks.append(t)
            gsl.append(gslots)
            mcl.append(cols)
            self.stats.frames += 1
            self.stats.metrics += fr.values.size
        if vals:
            self._fold(vals, ticks_pool, ticks_ts, n_ticks, gsl, mcl)
        rollups: list[RollupFrame] = []
        self._due |= touched
        deadline = time.perf_counter() + CLOSE_BUDGET_S
        for p in sorted(self._due):
            if time.perf_counter() > deadline:
                break  # the rest next batch: their windows just stay open a little longer
            self._due.discard(p)
            if p in self.parts:
                rollups.extend(self._close_due(p))
        self._seed(time.perf_counter() + SEED_BUDGET_S)
        return dead, rollups

    def _drop_future(self, fr: SampleFrame) -> SampleFrame:
        """The frame without its ticks from the future (counted and logged, rate-limited)."""
        horizon = self.wall_ms() + self.max_future_ms
        ahead = fr.ts > horizon
        if not ahead.any():
            return fr
        self.stats.future_samples += int(np.count_nonzero(~np.isnan(fr.values[ahead])))
        now = time.monotonic()
        if now - self._future_logged.get(fr.agent, -_FUTURE_LOG_EVERY_S) >= \
                _FUTURE_LOG_EVERY_S:
            if len(self._future_logged) > 10_000:
                self._future_logged.clear()
            self._future_logged[fr.agent] = now
            log.warning("agent %s (%s) stamps samples %.0f s ahead of this aggregator's clock "
                        "(more than max_future_ms=%d): not rolled up, counted in "
                        "fleetpulse_aggregator_future_samples_total", fr.agent,
                        fr.identity.node, (int(fr.ts.max()) - horizon + self.max_future_ms)
                        / 1000, self.max_future_ms)
        keep = ~ahead
        return dataclasses.replace(fr, ts=fr.ts[keep], values=fr.values[keep])

    def _seed(self, deadline: float) -> None:
        """Let coarse tiers that are reading back windows from the store advance a little."""
        for p in sorted(self.parts):
            chain = self.parts[p].chain
            if chain is not None and chain.seeding:
                chain.work(deadline)
                if time.perf_counter() > deadline:
                    return

    def _write_raw(self, metric_ids: np.ndarray, gslots: np.ndarray, ts: np.ndarray,
                   values: np.ndarray, cols: np.ndarray) -> None:
        key = (gslots.tobytes(), cols.tobytes())
        sids = self._raw_sids.get(key)
        mc = metric_ids.size
        if sids is None:
            eids = np.asarray([self.topo.gpu_eid[s] for s in gslots.tolist()], np.int64)
            sids = (eids[:, None] * ENTITY_STRIDE + metric_ids.astype(np.int64)[None, :]
                    * AGG_SLOTS + AGG_CODES["raw"]).reshape(-1)
            self._raw_sids[key] = sids
        t, g, m = values.shape
        block = values.reshape(t, g * m) if m == mc else values[:, :, :mc].reshape(t, g * mc)
        self.store.append("raw", sids, ts, block)

    def _fold(self, vals: list[np.ndarray], ticks_pool: list[int], ticks_ts: list[np.ndarray],
              n_ticks: list[int], gsl: list[np.ndarray], mcl: list[np.ndarray]) -> None:
        v = np.concatenate(vals)
        v_off = np.zeros(len(vals) + 1, np.int64)
        np.cumsum([a.size for a in vals], out=v_off[1:])
        t_off = np.zeros(len(vals) + 1, np.int64)
        np.cumsum(n_ticks, out=t_off[1:])
        g_off = np.zeros(len(vals) + 1, np.int64)
        np.cumsum([a.size for a in gsl], out=g_off[1:])
        m_off = np.zeros(len(vals) + 1, np.int64)
        np.cumsum([a.size for a in mcl], out=m_off[1:])
        pool = self.pool
        n_racks = max(self.topo.n_racks, 1)
        codes = np.empty(v.size, np.int64)
        a = pool.arr
        n = accumulate(v, v_off, t_off, np.asarray(ticks_pool, np.int32),
                       np.concatenate(ticks_ts), g_off, np.concatenate(gsl), m_off,
                       np.concatenate(mcl), a["cnt"], a["sum"], a["min"], a["max"], a["last"],
                       pool.last_ts, a["sumsq"], a["first"], a["inc"], _GAUGE,
                       self.topo.rack_of_gslot, n_racks, codes)
        if n:
            codes = codes[:n]
            per_pool = n_racks * N_COLUMNS * N_SLOTS
            used = {p for p in ticks_pool if p >= 0}
            if len(used) == 1:
                pool.codes[used.pop()].append(codes % per_pool)
            else:
                slots = codes // per_pool
                rest = codes % per_pool
                for s in sorted(used):
                    pool.codes[s].append(rest[slots == s])

    # ------------------------------------------------------------- closing
    def _layout_groups(self, partition: int) -> tuple[list[GroupSpec], I64]:
        """Group specs for the gpu, node and rack levels + the rack sketch series ids.

        GPU groups are (rack, metric): the store checksums and decodes whole records, so a
        group must not be much wider than what one query reads (one metric of a GPU, or of
        every GPU for a heatmap). Node and rack groups hold all metrics of a rack's nodes /
        of the rack: few columns each, and fewer groups to flush.
        """
        cached = self._groups.get(partition)
        if cached is not None and cached[0] == self.topo.version:
            return cached[1], cached[2]
        lay = self.topo.layout(partition)
        gpu_groups, node_groups, rack_groups = [], [], []
        sketch: list[I64] = []
        node_of_gpu = lay.gpu_node
        for ri, r in enumerate(lay.rack_slots.tolist()):
            cols = np.flatnonzero(self.topo.rack_metrics[r])
            nodes = np.flatnonzero(lay.node_rack == ri)
            gpus = np.flatnonzero(np.isin(node_of_gpu, nodes))
            for c in cols.tolist():  # per metric: a heatmap reads one metric of every GPU
                gpu_groups.append((gpus, lay.gpu_eids[gpus], np.asarray([c])))
            node_groups.append((nodes, lay.node_eids[nodes], cols))
            rack_groups.append((np.asarray([ri]), lay.rack_eids[ri:ri + 1], cols))
            gcols = cols[_GAUGE[cols]]
            sketch.append(int(lay.rack_eids[ri]) * ENTITY_STRIDE + gcols * AGG_SLOTS
                          + AGG_CODES["sketch"])
        specs = [build_groups(gpu_groups), build_groups(node_groups), build_groups(rack_groups)]
        sk = np.concatenate(sketch).astype(np.int64) if sketch else np.zeros(0, np.int64)
        self._groups[partition] = (self.topo.version, specs, sk)
        return specs, sk

    def _flat_layout(self, partition: int) -> FlatLayout:
        """The partition's groups as one flat series list (cached per topology version)."""
        hit = self._flat.get(partition)
        if hit is not None and hit.version == self.topo.version:
            return hit
        specs, sketch = self._layout_groups(partition)
        flat = self._flat[partition] = FlatLayout.from_specs(self.topo.version, specs, sketch)
        return flat

    def _restore_counters(self, part: _Part, partition: int) -> None:
        """Checkpointed counter state -> closed_last rows (after the layout is known)."""
        if not part.pending_counters:
            return
        lay = self.topo.layout(partition)
        for row, path in zip(lay.gslots.tolist(), lay.gpu_paths, strict=True):
            saved = part.pending_counters.pop(path, None)
            if saved:
                for col, value in saved.items():
                    self.closed_last[row, int(col)] = value

    def _close_due(self, partition: int) -> list[RollupFrame]:
        part = self.parts[partition]
        limit = part.watermark - WINDOW_MS - self.lateness
        out: list[RollupFrame] = []
        due = sorted(s for s in part.open if s <= limit)
        if not due:
            return out
        if self.closed_last.shape[0] < self.pool.cap_gpus:
            grown = np.full((self.pool.cap_gpus, N_COLUMNS), np.nan)
            grown[: self.closed_last.shape[0]] = self.closed_last
            self.closed_last = grown
        self._restore_counters(part, partition)
        if part.chain is None:
            part.chain = TierChain(self.store, part.done,
                                   lambda: self._flat_layout(partition))
            if part.chain_state is not None:
                dropped = part.chain.restore(part.chain_state, self.index)
                part.chain_state = None
                if dropped:
                    log.warning("partition %d: %d series of the running coarse windows are "
                                "not in its layout here; their 1m/1h/1d points lose the "
                                "windows before the hand-over", partition, dropped)
        for start in due:
            part.done.setdefault("base", start)
            out.extend(self._close(partition, part, start))
            del part.open[start]
            del part.opened_wm[start]
            if not any(start in p.open for p in self.parts.values()):
                self.pool.release(start)
            self.stats.windows_closed += 1
        part.closed_through = max(part.closed_through, limit)
        return out

    def _close(self, partition: int, part: _Part, start: int) -> list[RollupFrame]:
        pool = self.pool
        s = pool.slot_of[start]
        lay = self.topo.layout(partition)
        rows = lay.gslots
        a = {k: pool.arr[k][s][rows] for k in _ARRAYS}
        last_ts = pool.last_ts[s][rows]
        cl = self.closed_last[rows]
        apply_counter_boundary(a["cnt"], a["first"], a["last"], a["inc"], cl, _COUNTER)
        self.closed_last[rows] = cl
        gpu = LevelArrays(a["cnt"], a["sum"], a["min"], a["max"], a["last"], last_ts,
                          a["sumsq"], a["inc"])
        order = np.arange(rows.size, dtype=np.int64)
        node = LevelArrays(*reduce_rows(order, lay.gpu_node, lay.node_eids.size, gpu.cnt,
                                        gpu.sum, gpu.min, gpu.max, gpu.last, gpu.last_ts,
                                        gpu.sumsq, gpu.inc))
        norder = np.arange(lay.node_eids.size, dtype=np.int64)
        rack = LevelArrays(*reduce_rows(norder, lay.node_rack, lay.rack_eids.size, node.cnt,
                                        node.sum, node.min, node.max, node.last, node.last_ts,
                                        node.sumsq, node.inc))
        specs, _ = self._layout_groups(partition)
        flat = self._flat_layout(partition)
        values = np.concatenate([group_values(spec, arrays)
                                 for spec, arrays in zip(specs, (gpu, node, rack), strict=True)])
        append_groups(self.store, BASE_TIER, start, flat.sids, flat.bounds, values)
        sketches = self._sketches(s, partition)
        sk_blocks: list[SketchBlock] = []
        frames = []
        for ri, r in enumerate(lay.rack_slots.tolist()):
            cols = np.flatnonzero(self.topo.rack_metrics[r])
            entry = sketches.get(r)
            sk_cols, sk_slot, sk_cnt = entry if entry else (np.zeros(0, np.int64),) * 3
            eid = int(lay.rack_eids[ri])
            if sk_cols.size:
                sk_blocks.append(SketchBlock(
                    eid * ENTITY_STRIDE + sk_cols * AGG_SLOTS + AGG_CODES["sketch"],
                    sk_slot, sk_cnt.astype(np.float64)))
            colpos = np.searchsorted(cols, sk_cols)
            _, cl_, rw, rk, _, _ = lay.rack_keys[ri]
            frames.append(RollupFrame(
                "rack", cl_, rw, rk, start, WINDOW_MS, cols.astype(np.uint16),
                rack.last_ts[ri, cols].astype(np.int64),
                np.stack([rack.cnt[ri, cols], rack.sum[ri, cols], rack.min[ri, cols],
                          rack.max[ri, cols], rack.last[ri, cols], rack.sumsq[ri, cols],
                          rack.inc[ri, cols]]),
                N_SLOTS, colpos.astype(np.int32), sk_slot.astype(np.int32),
                sk_cnt.astype(np.float64)))
        sketch = SketchBlock.merge(sk_blocks)
        sketch.write(self.store, BASE_TIER, start)
        assert part.chain is not None
        part.chain.feed(start, flat, values, sketch)
        return frames

    def _sketches(self, pool_slot: int, partition: int) -> dict[int, tuple[I64, I64, I64]]:
        """Sketch (column, slot, count) per rack of ``partition``, from the pooled codes."""
        per_rack = N_COLUMNS * N_SLOTS
        parts = self.pool.codes.get(pool_slot) or []
        mine = self.pool.split.setdefault(pool_slot, {})
        if parts:
            # Sorted out by partition once: each partition's close then takes its own, where
            # every close sorting through what the others left went through the window's
            # samples 78 times over with twelve partitions (a tenth of a 31,000-GPU
            # aggregator's store thread).
            codes = np.concatenate(parts)
            self.pool.codes[pool_slot] = []
            owner = np.asarray(self.topo.rack_partition, np.int32)[codes // per_rack]
            order = np.argsort(owner, kind="stable")
            owner = owner[order]
            cuts = np.flatnonzero(np.diff(owner)) + 1
            for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), owner.size], strict=True):
                mine.setdefault(int(owner[a]), []).append(codes[order[a:b]])
        taken = mine.pop(partition, [])
        if not taken:
            return {}
        codes = np.concatenate(taken)
        lo = int(codes.min())
        span = int(codes.max()) - lo + 1
        if span <= 4 * codes.size:  # counting beats sorting when the code range is dense
            hist = np.bincount(codes - lo, minlength=span)
            nz = np.flatnonzero(hist)
            uniq, counts = nz + lo, hist[nz]
        else:
            uniq, counts = np.unique(codes, return_counts=True)
        out: dict[int, tuple[I64, I64, I64]] = {}
        if uniq.size == 0:
            return out
        r = uniq // per_rack
        cs = uniq % per_rack
        bounds = np.flatnonzero(np.diff(r)) + 1
        for seg_r, seg_c, seg_n in zip(np.split(r, bounds), np.split(cs, bounds),
                                       np.split(counts, bounds), strict=True):
            out[int(seg_r[0])] = (seg_c // N_SLOTS, seg_c % N_SLOTS, seg_n.astype(np.int64))
        return out

    # ------------------------------------------------------------- durability
    def checkpoint(self, partition: int) -> PartitionCheckpoint:
        """State as of now for ``partition``; call after the store's flush."""
        part = self.parts[partition]
        part.dedup.prune(part.resume)
        lay = self.topo.layout(partition)
        counters = dict(part.pending_counters)
        ccols = np.flatnonzero(_COUNTER)
        if lay.gslots.size and self.closed_last.shape[0] >= lay.gslots.max() + 1:
            block = self.closed_last[lay.gslots][:, ccols]
            gaps = np.isnan(block)
            names = [str(int(c)) for c in ccols]
            # Row by row in Python floats: numpy calls per GPU cost a 31,000-GPU aggregator
            # a few percent of its store thread at every checkpoint.
            for path, row, some, none in zip(lay.gpu_paths, block.tolist(),
                                             gaps.any(axis=1).tolist(),
                                             gaps.all(axis=1).tolist(), strict=True):
                if none:
                    continue
                counters[path] = ({n: v for n, v in zip(names, row, strict=True) if v == v}
                                  if some else dict(zip(names, row, strict=True)))
        return PartitionCheckpoint(
            topic=self.topic, partition=partition, resume_offset=part.resume,
            position=part.position, watermark=part.watermark, dedup=part.dedup.to_json(),
            replay_watermark=self._replay_watermark(part), closed_through=part.closed_through,
            counters=counters, downsampled=dict(part.done),
            extra={"sketch_relative_accuracy": RELATIVE_ACCURACY,
                   "chain": (part.chain.export(self.index) if part.chain is not None
                             else part.chain_state)})

    @staticmethod
    def _replay_watermark(part: _Part) -> int:
        """The watermark before the message at the resume offset (the oldest open window's
        first one; with none open, the resume offset is the position)."""
        if not part.open:
            return part.watermark
        first = min(part.open, key=lambda s: part.open[s])
        return part.opened_wm[first]

    def open_windows(self) -> int:
        return sum(len(p.open) for p in self.parts.values())

    def pending_close(self) -> bool:
        """Due windows left over by a batch's close budget: ``process([])`` closes them
        (the service calls it when no message came, so the end of the data closes too)."""
        return bool(self._due)

    def catching_up(self) -> int:
        """Partitions whose coarse tiers are still reading back windows from the store (after
        an assignment): their 1 min / 1 h / 1 d points appear once that is done."""
        return sum(1 for p in self.parts.values() if p.chain is not None and p.chain.seeding)

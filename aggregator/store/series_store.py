"""The series store: tiers of segment files, an in-memory head of open chunks, reads.

Write path: :meth:`SeriesStore.append` copies a group's samples into its open head chunk;
a chunk is sealed (encoded with :mod:`aggregator.store.codec` and appended to its segment
file as one record) when it holds ``chunk_samples`` samples or the next sample falls into
another segment. :meth:`SeriesStore.flush` makes the still-open part durable too, as a
*partial* record of only the samples appended since the last flush, then fsyncs every file
written and every directory changed. So a flush costs bytes proportional to what was
appended, not to the open chunk, and data is never held only in memory past a flush.

Partial records are superseded once their chunk is sealed: reads skip them, and
compaction (:meth:`SeriesStore.maintain`, run by ``flush`` when a tier's newest sample enters
a new segment) rewrites each finished segment once without them (write, fsync, rename) and
saves its index beside it. With ``StoreConfig.compact_recode`` (on by default) it also
recodes every chunk it keeps with the codec's rANS stage (``entropy_coded``) and joins
sealed chunks of a group: smaller, at about half the encode speed and a slower decode of
what it wrote, so it is paid once per finished segment, off the ingest path that seals
chunks with the fast prefix codes. Reads decode either form. Retention deletes whole
segments by event time.

A rewrite inside ``flush`` is incremental: it goes into ``<segment>.tmp`` record by record,
each flush spending at most ``StoreConfig.compact_budget_s`` on it (and at least one record),
so a large segment is rewritten over many flushes instead of stalling one. Until the last
record is written the segment's own file and index serve every read (they stay valid: the
file is append-only); then the copy is fsynced, renamed over it and its index saved, in one
flush. A write into that segment meanwhile (late data), retention deleting it, a refusal by
the disk or :meth:`SeriesStore.close` abandon the copy (deleted) and the rewrite starts over
later; a ``.tmp`` left by a crash is deleted on open. :meth:`SeriesStore.compact` and
:meth:`SeriesStore.maintain` finish every rewrite before they return.

Read path: per tier, series map to groups (:class:`~aggregator.store.index.GroupRegistry`);
per segment, a columnar record index (loaded from the saved ``.idx`` of a finished segment,
otherwise rebuilt at open by scanning the records, which also truncates a torn tail) holds
each record's group and time range. A read reads the overlapping records of the wanted
groups into one buffer, decodes only the wanted columns in one kernel call, adds the head's
samples, then orders by time and keeps the last write per timestamp.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import itertools
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Final

import numpy as np
import numpy.typing as npt

from aggregator.store import codec
from aggregator.store.downsample import REDUCERS, reduce_buckets
from aggregator.store.index import GroupRegistry, RecordIndex, load_index, save_index
from aggregator.store.segment import (
    FILE_HEADER,
    KIND_PARTIAL,
    KIND_SEALED,
    SegmentError,
    checked_blob,
    encode_record,
    fsync_dir,
    parse_segment_name,
    read_records_into,
    scan_segment,
    segment_name,
    write_file_header,
)

log = logging.getLogger("fleetpulse.aggregator.store")

__all__ = ["DEFAULT_TIERS", "ReadResult", "SeriesStore", "StoreConfig", "StoreError", "TierSpec"]

_HOUR: Final = 3_600_000
_DAY: Final = 24 * _HOUR

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
_FLUSH_BATCH: Final = 2048
"""Groups a flush encodes and writes at once: a whole tier at a time held a copy of every
unflushed row, its encoding and its records at once (half a GB more peak memory at
31,000 GPUs); this many keeps the calls few and the copies small."""
_Rec = tuple[int, int, int, int, int, bytes]
"""A record compaction writes: group, t_min, t_max, kind, chunk key, the framed bytes."""


class StoreError(Exception):
    """Bad arguments (shapes, unknown tier) or a store directory that cannot be used."""


@dataclass(frozen=True, slots=True)
class TierSpec:
    """One tier: a series space with its own resolution, retention and segment span."""

    name: str
    """Tier name used in every call ("raw", "10s", ...)."""
    resolution_ms: int
    """Bucket width of the tier's samples; 0 for raw samples. Used by downsample()."""
    retention_ms: int
    """Segments whose whole span is older than this are deleted; 0 keeps forever."""
    segment_ms: int
    """Time span of one segment file, the unit of retention."""
    chunk_samples: int | None = None
    """At most this many samples per sealed chunk in this tier (a smaller
    StoreConfig.chunk_samples wins; None: that one). The open chunk of every group lives
    in memory as float64, so this bounds the head's memory: coarse tiers fill slowly, and
    at 120 a 1 h tier would hold 5 days of every series in memory."""

    def validate(self) -> None:
        if not self.name or "/" in self.name or self.name.startswith("."):
            raise StoreError(f"tier name {self.name!r} is not a plain directory name")
        if self.resolution_ms < 0 or self.retention_ms < 0 or self.segment_ms <= 0:
            raise StoreError(f"tier {self.name}: negative resolution/retention or empty span")
        if self.chunk_samples is not None and not 2 <= self.chunk_samples <= 65_536:
            raise StoreError(f"tier {self.name}: chunk_samples must be in [2, 65536]")


DEFAULT_TIERS: Final[tuple[TierSpec, ...]] = (
    TierSpec("raw", 0, 12 * _HOUR, 2 * _HOUR),
    TierSpec("10s", 10_000, 7 * _DAY, 12 * _HOUR, chunk_samples=60),
    TierSpec("1m", 60_000, 35 * _DAY, 2 * _DAY, chunk_samples=60),
    TierSpec("1h", _HOUR, 400 * _DAY, 30 * _DAY, chunk_samples=24),
    TierSpec("1d", _DAY, 5 * 365 * _DAY, 365 * _DAY, chunk_samples=7),
)
"""Raw for hours, 10 s and 1 min for days, 1 h for months, 1 d for years (DESIGN.md).
Rollup chunks span 10 minutes, an hour, a day and a week, so their open chunks stay small in
memory (see TierSpec.chunk_samples); measured on the aggregator's 10 s tier, 60 points a
chunk instead of 120 cost 0.9 % more bytes (3.31 vs 3.29 per sample) for half the memory."""
_HEAD_ROWS: Final = 8
"""Rows an open chunk starts with; it doubles up to the tier's chunk size as it fills."""


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Where and how the store keeps its data."""

    path: str = "data/store"
    """Store directory (created if missing); one writer process at a time."""
    tiers: tuple[TierSpec, ...] = DEFAULT_TIERS
    """The tiers, finest first."""
    chunk_samples: int = 120
    """Samples per sealed chunk (per group); larger compresses better, reads coarser."""
    fsync: bool = True
    """fsync on flush(); turn off only for throwaway benchmarks."""
    auto_maintain: bool = True
    """Let flush() run maintain() whenever a tier's newest sample enters a new segment:
    compaction of finished segments and retention, both by event time."""
    grace_ms: int = 120_000
    """How long after its end a segment still expects late samples before it is compacted."""
    maintain_retry_s: float = 60.0
    """After the disk refused a compaction (a segment rewrite needs the segment's size
    free), how long flush() waits before it tries again; the data itself is durable."""
    compact_recode: bool = True
    """Compaction also re-encodes each finished segment: every chunk entropy-coded (codec
    tags 7/8) and up to ``COMPACT_CHUNKS`` sealed chunks of a group joined into one record
    where that is smaller. 22-35 % below VictoriaMetrics on the compression benchmark, and
    the compacted form decodes at 0.8-1.3x the speed of the sealed one. The re-encode (25-60
    M samples/s on one core) runs in steps of ``compact_budget_s`` per flush(), not in one
    call. Off, compaction only drops superseded partial records. Reads decode tags 7/8
    whatever this says."""
    compact_budget_s: float = 0.25
    """Most time one flush() spends rewriting finished segments (plus one record: each
    flush makes progress); the rest waits for the next flush. At the aggregator's 10 s
    flushes 0.25 s is 2.5 % of a core, so a 2 h raw segment of 10,000 GPUs x 33 metrics at
    1 Hz (2.4 G samples, 40-100 s of recode) is rewritten in about 30-70 minutes, inside
    the next segment's 2 h; a budget below what a tier needs lets rewrites fall behind.
    ``compact()`` and ``maintain()`` ignore it and finish."""

    def validate(self) -> None:
        if not self.tiers:
            raise StoreError("store.tiers: at least one tier is needed")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise StoreError(f"store.tiers: duplicate tier names {names}")
        for t in self.tiers:
            t.validate()
        if self.grace_ms < 0:
            raise StoreError("store.grace_ms must not be negative")
        if not 2 <= self.chunk_samples <= 65_536:
            raise StoreError(f"store.chunk_samples must be in [2, 65536], not {self.chunk_samples}")
        if not self.compact_budget_s > 0:  # (NaN too)
            raise StoreError(f"store.compact_budget_s must be positive, not {self.compact_budget_s}")


@dataclass(frozen=True, slots=True)
class ReadResult:
    """Samples of several series in CSR form: series ``i`` is ``ts[offsets[i]:offsets[i+1]]``.

    Within a series samples are ordered by time, one per timestamp.
    """

    series_ids: I64
    offsets: I64
    ts: I64
    values: F64

    def series(self, i: int) -> tuple[I64, F64]:
        a, b = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.ts[a:b], self.values[a:b]

    @property
    def counts(self) -> I64:
        return np.diff(self.offsets)

    def take(self, which: I64, series_ids: I64) -> ReadResult:
        """The series ``which[i]`` of this result as series i of a new one (repeats allowed)."""
        counts = self.counts[which]
        offsets = np.zeros(which.size + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        idx = np.repeat(self.offsets[which] - offsets[:-1], counts) + np.arange(int(offsets[-1]))
        return ReadResult(series_ids.copy(), offsets, self.ts[idx], self.values[idx])


@dataclass(slots=True)
class _Segment:
    """One segment file and its record index."""

    path: Path
    start_ms: int
    span_ms: int
    records: RecordIndex = field(default_factory=RecordIndex)
    size: int = 0
    write_fd: int = -1
    dirty: bool = False
    indexed: bool = False
    """Its saved ``.idx`` matches the file (set by compaction, cleared by any write)."""

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.span_ms

    def close_writer(self) -> None:
        if self.write_fd >= 0:
            os.close(self.write_fd)
            self.write_fd = -1


@dataclass(slots=True)
class _Rewrite:
    """A compaction rewrite of one finished segment into ``tmp``, done a few records per
    flush: ``records`` (the generator of :meth:`SeriesStore._recoded` or :func:`_copied`)
    yields the next record to write; ``new`` indexes what ``tmp`` holds so far."""

    tier: str
    seg: _Segment
    tmp: Path
    records_at_start: int
    """``seg.records.n`` when it began: a different count means the segment was written
    to since (late data), so the plan no longer covers it and the copy is abandoned."""
    src: BinaryIO | None = None
    dst: BinaryIO | None = None
    records: Iterator[_Rec] | None = None
    new: RecordIndex = field(default_factory=RecordIndex)
    offset: int = 0
    steps: int = 0
    """Records written to ``tmp`` so far."""

    def close_files(self) -> None:
        for f in (self.dst, self.src):  # dst first: its buffer may hold bytes for the disk
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self.src = self.dst = None
        self.records = None


@dataclass(slots=True)
class _HeadGroup:
    """The open chunk of one group: preallocated columns filled up to ``n``."""

    gid: int
    ids: I64
    ts: I64
    values: F64
    seg_start: int = 0
    n: int = 0
    flushed: int = 0

    def grow(self, rows: int) -> None:
        """More rows for the open chunk (it starts small: memory follows what is in it)."""
        ts, values = np.empty(rows, np.int64), np.empty((rows, self.values.shape[1]))
        ts[:self.n], values[:self.n] = self.ts[:self.n], self.values[:self.n]
        self.ts, self.values = ts, values


COMPACT_CHUNKS: Final = 4
"""Sealed chunks of a group that compaction joins into one record when
``StoreConfig.compact_recode`` is on (each chunk restarts its columns' headers and the rANS
state; four per record cost 5-6 % fewer bytes on noisy fleets while a read still decodes at
most four chunks' worth around its range)."""


class StoreWriteError(StoreError, OSError):
    """The disk refused a write (full, quota, read-only). Nothing torn stays behind: the
    file was cut back to its last whole record, and the data is still in memory, so the
    same flush may simply be tried again once there is space."""


def _write_whole(fd: int, data: bytes, offset: int, path: Path) -> None:
    """Append ``data`` at ``offset`` (the file's valid end) completely, or not at all."""
    try:
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(data)} bytes)")
    except OSError as exc:
        os.ftruncate(fd, offset)  # shrinking needs no space
        raise StoreWriteError(f"cannot write {path}: {exc.strerror or exc}") from exc


class SeriesStore:
    """Tiered, compressed, crash-safe storage of float64 series (see the package docstring)."""

    def __init__(self, config: StoreConfig) -> None:
        config.validate()
        self.config = config
        self.root = Path(config.path)
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.root / "LOCK", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(self._lock_fd)
            raise StoreError(f"{self.root} is locked by another writer") from exc
        self.tiers = {t.name: t for t in config.tiers}
        self._segments: dict[str, dict[int, _Segment]] = {}
        self._groups: dict[str, GroupRegistry] = {t.name: GroupRegistry() for t in config.tiers}
        self._head: dict[str, dict[int, _HeadGroup]] = {t.name: {} for t in config.tiers}
        self._dirty_dirs: set[Path] = set()
        self._newest: dict[str, int] = {}
        """Per tier, the newest timestamp appended since open: the clock of maintain()."""
        self._maintained: dict[str, int] = {}
        self._unsealed: dict[str, list[_HeadGroup]] = {t.name: [] for t in config.tiers}
        """Per tier, chunks whose seal the disk refused, detached from the head: read like
        the head, written (oldest first) before anything else the next time."""
        self._maintain_after = 0.0
        """monotonic() before which flush() does not retry a refused compaction."""
        self.maintain_errors = 0
        """Compactions the disk refused (retried after ``maintain_retry_s``)."""
        self._rewrites: dict[tuple[str, int], _Rewrite] = {}
        """Segment rewrites begun and not finished, by (tier, segment start), oldest first."""
        self.rewrites_done = 0
        """Segments rewritten by compaction since open."""
        self.clock: Callable[[], float] = time.perf_counter
        """The clock of ``compact_budget_s`` (seconds; a test may set its own)."""
        self.before_write: Callable[[], None] | None = None
        """Called before each record is written; may raise StoreWriteError to refuse it (the
        entity index, while a line of its own waits for the disk: see
        :mod:`aggregator.series_index`)."""
        self.on_append: Callable[[str, I64, I64, F64], None] | None = None
        """Called with (tier, series_ids, ts, values[T, k]) after every append: how
        :mod:`aggregator.remote_write` sees each point the store takes, re-derived ones too."""
        self.truncated_bytes = 0
        """Bytes of torn tails cut off while opening (0 after a clean shutdown)."""
        self.deferred_seals = 0
        """Chunks detached to wait in memory because the disk refused their seal (_seal)."""
        try:
            for spec in config.tiers:
                self._open_tier(spec)
        except BaseException:
            os.close(self._lock_fd)  # a store that failed to open holds no lock
            raise
        self._closed = False

    # ------------------------------------------------------------------ opening
    def _open_tier(self, spec: TierSpec) -> None:
        tdir = self.root / spec.name
        tdir.mkdir(exist_ok=True)
        segs: dict[int, _Segment] = {}
        groups = self._groups[spec.name]
        for entry in sorted(tdir.iterdir()):
            if entry.name.endswith(".tmp"):  # a compaction cut short: the original stands
                entry.unlink()
                continue
            start = parse_segment_name(entry.name)
            if start is None:
                continue
            size_before = entry.stat().st_size
            if size_before < FILE_HEADER.size:
                entry.unlink()  # torn while being created: it never held a record
                self._dirty_dirs.add(tdir)
                continue
            seg = _Segment(entry, start, spec.segment_ms)
            saved = load_index(_index_path(entry), size_before)
            seg.indexed = saved is not None
            if saved is not None:
                for ids, kind, t_min, t_max, chunk_key, offset, length in saved:
                    seg.records.add(groups.gid(ids), t_min, t_max, kind, chunk_key, offset,
                                    length)
            else:
                _index_path(entry).unlink(missing_ok=True)
                try:
                    s0, span, records = scan_segment(entry)
                except SegmentError as exc:
                    raise StoreError(str(exc)) from exc
                seg.start_ms, seg.span_ms = s0, span
                for r in records:
                    seg.records.add(groups.gid(r.series_ids), r.t_min, r.t_max, r.kind,
                                    r.chunk_key, r.offset, r.length)
            seg.size = entry.stat().st_size
            self.truncated_bytes += size_before - seg.size
            segs[seg.start_ms] = seg
        self._segments[spec.name] = segs

    def _spec(self, tier: str) -> TierSpec:
        try:
            return self.tiers[tier]
        except KeyError:
            raise StoreError(f"unknown tier {tier!r}; have {sorted(self.tiers)}") from None

    # ------------------------------------------------------------------ writing
    def append(self, tier: str, series_ids: npt.ArrayLike, ts: npt.ArrayLike,
               values: npt.ArrayLike) -> None:
        """Append T ticks of a group of k series sharing timestamps.

        ``series_ids`` int64[k] (distinct), ``ts`` int64[T] in ms, ``values`` float64[T, k].
        Not durable until :meth:`flush` returns.
        """
        self._check_open()
        spec = self._spec(tier)
        ids = np.ascontiguousarray(series_ids, dtype=np.int64)
        t = np.ascontiguousarray(ts, dtype=np.int64)
        v = np.asarray(values, dtype=np.float64)
        if ids.ndim != 1 or ids.size == 0:
            raise StoreError(f"series_ids must be a non-empty 1-D array, got shape {ids.shape}")
        if t.ndim != 1 or v.shape != (t.size, ids.size):
            raise StoreError(f"shapes disagree: ts {t.shape}, values {v.shape}, "
                             f"series_ids {ids.shape} (want values (T, k))")
        if t.size == 0:
            return
        self._put(tier, spec, self._head_group(tier, spec, ids), t, v)
        if self.on_append is not None:
            self.on_append(tier, ids, t, v)

    def append_series(self, tier: str, series_ids: npt.ArrayLike, ts: npt.ArrayLike,
                      values: npt.ArrayLike) -> None:
        """Points of many one-series groups at once: ``series_ids`` int64[n] in runs (each
        run one series), ``ts`` int64[n] and ``values`` float64[n] beside them. What
        :meth:`append` does per run, with its checks once: a window's sketches are tens of
        thousands of one-series groups (bucket counts as points)."""
        self._check_open()
        spec = self._spec(tier)
        ids = np.ascontiguousarray(series_ids, dtype=np.int64)
        t = np.ascontiguousarray(ts, dtype=np.int64)
        v = np.ascontiguousarray(values, dtype=np.float64)
        if ids.ndim != 1 or t.shape != ids.shape or v.shape != ids.shape:
            raise StoreError(f"shapes disagree: series_ids {ids.shape}, ts {t.shape}, "
                             f"values {v.shape} (want three arrays of one length)")
        if ids.size == 0:
            return
        self._saw_newest(tier, t)
        # The segments and the series' runs for all points at once, then one piece (a run
        # within one segment) at a time: numpy calls per one-series group were 2 % of a
        # 31,000-GPU aggregator's store thread.
        seg_of = np.floor_divide(t, spec.segment_ms) * spec.segment_ms
        runs = np.flatnonzero(np.diff(ids)) + 1
        edges = np.union1d(runs, np.flatnonzero(np.diff(seg_of)) + 1).tolist()
        run_starts = runs.tolist()
        starts = set(run_starts)
        rows = v[:, None]
        group = self._head_group(tier, spec, ids[:1])
        for a, b in itertools.pairwise([0, *edges, ids.size]):
            if a in starts:
                group = self._head_group(tier, spec, ids[a:a + 1])
            self._fill(tier, spec, group, int(seg_of[a]), t[a:b], rows[a:b])
        if self.on_append is not None:
            for a, b in itertools.pairwise([0, *run_starts, ids.size]):
                self.on_append(tier, ids[a:a + 1], t[a:b], rows[a:b])

    def _saw_newest(self, tier: str, t: I64) -> None:
        newest = int(t.max())
        if newest > self._newest.get(tier, newest - 1):
            self._newest[tier] = newest

    def _put(self, tier: str, spec: TierSpec, group: _HeadGroup, t: I64, v: F64) -> None:
        """Rows ``t`` (ascending or not), ``v`` (T, k) into ``group``'s open chunk, sealing it
        when full or when the rows enter another segment."""
        self._saw_newest(tier, t)
        seg_of = np.floor_divide(t, spec.segment_ms) * spec.segment_ms
        cuts = np.flatnonzero(np.diff(seg_of)) + 1
        for a, b in itertools.pairwise([0, *cuts.tolist(), t.size]):
            self._fill(tier, spec, group, int(seg_of[a]), t[a:b], v[a:b])

    def _fill(self, tier: str, spec: TierSpec, group: _HeadGroup, seg: int, t: I64,
              v: F64) -> None:
        """Rows of one segment into ``group``'s open chunk, sealing it when full."""
        self._enter_segment(tier, spec, group, seg)
        cap = self._chunk(spec)
        i = 0
        while i < t.size:
            m = min(self._room(group, cap), t.size - i)
            group.ts[group.n:group.n + m] = t[i:i + m]
            group.values[group.n:group.n + m] = v[i:i + m]
            group.n += m
            i += m
            self._seal_if_full(tier, spec, group, cap)

    def _enter_segment(self, tier: str, spec: TierSpec, group: _HeadGroup, seg: int) -> None:
        """Rows of segment ``seg`` come next: a chunk never spans two segments, so one
        holding rows of another is sealed first."""
        if group.n and group.seg_start != seg:
            self._seal(tier, spec, group, may_defer=True)
        group.seg_start = seg

    @staticmethod
    def _room(group: _HeadGroup, cap: int) -> int:
        """Free rows in ``group``'s open chunk, grown (doubling, up to ``cap``) when full."""
        if group.n == group.ts.size:
            group.grow(min(cap, 2 * group.ts.size))
        return group.ts.size - group.n

    def _seal_if_full(self, tier: str, spec: TierSpec, group: _HeadGroup, cap: int) -> None:
        if group.n >= cap:
            self._seal(tier, spec, group, may_defer=True)

    def append_points(self, tier: str, ts: int, series_ids: npt.ArrayLike,
                      bounds: npt.ArrayLike, values: npt.ArrayLike) -> None:
        """One sample at ``ts`` for each group ``series_ids[bounds[g]:bounds[g + 1]]``
        (``values`` float64 in ``series_ids`` order): what :meth:`append` does per group,
        with its checks once for all of them. A closing window writes one point to tens of
        thousands of groups, and the per-call work of ``append`` was a fifth of a 31,000-GPU
        aggregator's store thread. Not durable until :meth:`flush` returns."""
        self._check_open()
        spec = self._spec(tier)
        ids = np.ascontiguousarray(series_ids, dtype=np.int64)
        cuts = np.ascontiguousarray(bounds, dtype=np.int64)
        v = np.ascontiguousarray(values, dtype=np.float64)
        if ids.ndim != 1 or v.shape != ids.shape or cuts.ndim != 1 or cuts.size < 1 \
                or cuts[0] != 0 or cuts[-1] != ids.size or (np.diff(cuts) < 0).any():
            raise StoreError(f"shapes disagree: series_ids {ids.shape}, values {v.shape}, "
                             f"bounds {cuts.shape} (want bounds from 0 to {ids.size})")
        if ids.size == 0:
            return
        t = int(ts)
        if t > self._newest.get(tier, t - 1):
            self._newest[tier] = t
        seg = t // spec.segment_ms * spec.segment_ms
        cap = self._chunk(spec)
        edges = cuts.tolist()
        for a, b in itertools.pairwise(edges):
            if b == a:
                continue
            group = self._head_group(tier, spec, ids[a:b])
            self._enter_segment(tier, spec, group, seg)
            self._room(group, cap)
            group.ts[group.n] = t
            group.values[group.n] = v[a:b]
            group.n += 1
            self._seal_if_full(tier, spec, group, cap)
        if self.on_append is not None:
            self.on_append(tier, ids, np.asarray([t], np.int64), v[None, :])

    def _head_group(self, tier: str, spec: TierSpec, ids: I64) -> _HeadGroup:
        """The open chunk of the group of ``ids`` (made, and its ids checked, on first sight)."""
        head = self._head[tier]
        gid = self._groups[tier].gid(ids)
        group = head.get(gid)
        if group is None:
            if ids.size > 1 and not _distinct(ids):
                raise StoreError("series_ids of a group must be distinct")
            rows = min(_HEAD_ROWS, self._chunk(spec))
            group = _HeadGroup(gid, self._groups[tier].ids[gid], np.empty(rows, np.int64),
                               np.empty((rows, ids.size)))
            head[gid] = group
        return group

    def _chunk(self, spec: TierSpec) -> int:
        return min(spec.chunk_samples or self.config.chunk_samples, self.config.chunk_samples)

    def _seal(self, tier: str, spec: TierSpec, group: _HeadGroup, *,
              may_defer: bool = False) -> None:
        """Write the open chunk as one sealed record (after any chunk still waiting).

        When the disk refuses and the seal comes from an append (``may_defer``: the chunk
        is full, or its segment ended), the chunk is detached whole into ``_unsealed`` and
        the group goes on with a new one: an append never fails for a full disk (the
        consumer loop must not die of it), the samples stay readable, and the next flush
        writes them first or raises StoreWriteError, so nothing is committed meanwhile.
        Memory grows with what arrives while the disk is full; the aggregator shows it
        (``store_writable`` 0) and Kafka keeps everything after the last commit.
        """
        if group.n:
            try:
                self._write_unsealed()
                self._write(tier, spec, group, KIND_SEALED, 0, group.n)
            except StoreWriteError:
                if not may_defer:
                    raise
                self.deferred_seals += 1
                self._unsealed[tier].append(_HeadGroup(
                    group.gid, group.ids, group.ts, group.values, group.seg_start, group.n,
                    group.flushed))
                rows = min(_HEAD_ROWS, self._chunk(spec))
                group.ts, group.values = np.empty(rows, np.int64), np.empty((rows,
                                                                             group.ids.size))
        group.n = group.flushed = 0

    def _write_unsealed(self) -> None:
        """Seal the chunks that waited for the disk, oldest first (StoreWriteError if it
        still refuses; what was written is off the list)."""
        for tier, waiting in self._unsealed.items():
            while waiting:
                g = waiting[0]
                self._write(tier, self.tiers[tier], g, KIND_SEALED, 0, g.n)
                waiting.pop(0)

    def _write(self, tier: str, spec: TierSpec, group: _HeadGroup, kind: int, a: int,
               b: int) -> None:
        if self.before_write is not None:
            self.before_write()
        ts = group.ts[a:b]
        blob = codec.encode_group(ts, group.values[a:b])
        rec = encode_record(kind, self._groups[tier].coded(group.gid), b - a, int(ts.min()),
                            int(ts.max()), int(group.ts[0]), blob)
        seg = self._segment_for_write(tier, spec, group.seg_start)
        offset = self._append_to(seg, rec)
        seg.records.add(group.gid, int(ts.min()), int(ts.max()), kind, int(group.ts[0]), offset,
                        len(rec))

    def _append_to(self, seg: _Segment, data: bytes) -> int:
        """Append whole records to ``seg`` (once more after dropping compaction's copies if
        the disk refused); returns the offset they start at."""
        offset = seg.size
        try:
            _write_whole(seg.write_fd, data, offset, seg.path)
        except StoreWriteError as exc:
            if not self._rewrites:
                raise
            self._drop_rewrites(exc)  # data before compaction: their copies take space
            _write_whole(seg.write_fd, data, offset, seg.path)
        seg.size += len(data)
        seg.dirty = True
        seg.indexed = False
        return offset

    def _write_partials(self, tier: str, spec: TierSpec, groups: list[_HeadGroup]) -> None:
        """What :meth:`_write` does for each group's rows since its last flush, as partial
        records: encoded in one call, and written with one write per segment. A flush of a
        31,000-GPU aggregator writes some 50,000 of them, most of one row, and handing each
        to the codec and the disk alone cost more than encoding it (70 us a record)."""
        if self.before_write is not None:
            self.before_write()
        ts = [g.ts[g.flushed:g.n] for g in groups]
        buf, offsets = codec.encode_ragged(ts, [g.values[g.flushed:g.n] for g in groups])
        ends = offsets.tolist()
        # Each record's time range, for all groups in two calls (a min and a max of each
        # group's few points cost more than the rest of its record).
        flat = np.concatenate(ts)
        starts = np.zeros(len(ts), np.int64)
        np.cumsum([t.size for t in ts[:-1]], out=starts[1:])
        t_lo = np.minimum.reduceat(flat, starts).tolist()
        t_hi = np.maximum.reduceat(flat, starts).tolist()
        reg = self._groups[tier]
        by_seg: dict[int, list[int]] = {}
        for i, g in enumerate(groups):
            by_seg.setdefault(g.seg_start, []).append(i)
        for start, members in by_seg.items():
            seg = self._segment_for_write(tier, spec, start)
            recs: list[bytes] = []
            spans: list[tuple[int, int, int, int]] = []
            for i in members:
                g, t, lo, hi = groups[i], ts[i], t_lo[i], t_hi[i]
                rec = encode_record(KIND_PARTIAL, reg.coded(g.gid), t.size, lo, hi,
                                    int(g.ts[0]), buf[ends[i]:ends[i + 1]].tobytes())
                recs.append(rec)
                spans.append((lo, hi, int(g.ts[0]), len(rec)))
            offset = self._append_to(seg, b"".join(recs))
            for i, (lo, hi, key, length) in zip(members, spans, strict=True):
                g = groups[i]
                seg.records.add(g.gid, lo, hi, KIND_PARTIAL, key, offset, length)
                offset += length
                g.flushed = g.n

    def _segment_for_write(self, tier: str, spec: TierSpec, start: int) -> _Segment:
        segs = self._segments[tier]
        seg = segs.get(start)
        if seg is None:
            path = self.root / tier / segment_name(start)
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_whole(fd, write_file_header(start, spec.segment_ms), 0, path)
            except StoreWriteError:
                os.close(fd)  # a file without a whole header would not open again
                path.unlink(missing_ok=True)
                raise
            seg = _Segment(path, start, spec.segment_ms, size=FILE_HEADER.size, write_fd=fd)
            segs[start] = seg
            self._dirty_dirs.add(path.parent)
        elif seg.write_fd < 0:
            seg.write_fd = os.open(seg.path, os.O_WRONLY | os.O_APPEND)
        return seg

    def flush(self) -> None:
        """Make every sample appended so far durable; returns after the fsyncs.

        With ``auto_maintain`` it then compacts and applies retention to any tier whose
        newest sample has entered a new segment since the last time (a few times a day
        per tier, each finished segment rewritten once), and spends up to
        ``compact_budget_s`` on the segment rewrites that compaction began.
        """
        self._check_open()
        self._flush_data()
        if self.config.auto_maintain:
            for tier, spec in self.tiers.items():
                newest = self._newest.get(tier)
                if newest is None:
                    continue
                epoch = (newest - self.config.grace_ms) // spec.segment_ms
                if self._maintained.get(tier) != epoch and \
                        time.monotonic() >= self._maintain_after:
                    if self._try_compact(tier, newest - self.config.grace_ms):
                        self._maintained[tier] = epoch
                    self._retain_tier(tier, newest)  # frees space: even if compaction failed
            if self._rewrites and time.monotonic() >= self._maintain_after:
                try:
                    self._advance_rewrites(self.clock() + self.config.compact_budget_s)
                except StoreWriteError as exc:  # that rewrite is dropped, begun again later
                    self._compaction_refused("", exc)

    def _try_compact(self, tier: str, now_ms: int) -> bool:
        """Compact ``tier`` (its rewrites are only begun); False if the disk refused (the
        data is durable already: the flush goes on, the compaction is retried after
        ``maintain_retry_s``)."""
        try:
            self._compact_tier(tier, now_ms)
        except StoreWriteError as exc:
            self._compaction_refused(tier, exc)
            return False
        return True

    def _compaction_refused(self, tier: str, exc: StoreWriteError) -> None:
        self.maintain_errors += 1
        self._maintain_after = time.monotonic() + self.config.maintain_retry_s
        if self.maintain_errors == 1 or self.maintain_errors % 100 == 0:
            log.error("compacting %s: %s; the data is durable, compaction is retried in "
                      "%.0f s (%d refused so far)", f"tier {tier}" if tier else "a segment",
                      exc, self.config.maintain_retry_s, self.maintain_errors)

    def _flush_data(self) -> None:
        self._write_unsealed()
        for tier, head in self._head.items():
            todo = [g for g in head.values() if g.n > g.flushed]
            for i in range(0, len(todo), _FLUSH_BATCH):
                self._write_partials(tier, self.tiers[tier], todo[i:i + _FLUSH_BATCH])
        for segs in self._segments.values():
            newest = max(segs) if segs else 0
            for seg in segs.values():
                if seg.dirty:
                    if self.config.fsync:
                        os.fsync(seg.write_fd)
                    seg.dirty = False
                if seg.start_ms < newest:  # older segments rarely get writes: free the fd
                    seg.close_writer()
        if self.config.fsync:
            for d in self._dirty_dirs:
                fsync_dir(d)
        self._dirty_dirs.clear()

    # ------------------------------------------------------------------ reading
    def read(self, tier: str, series_ids: npt.ArrayLike, start_ms: int, end_ms: int) -> ReadResult:
        """Samples of ``series_ids`` with ``start_ms <= ts < end_ms`` (flushed or not)."""
        self._check_open()
        self._spec(tier)
        asked = np.ascontiguousarray(series_ids, dtype=np.int64).reshape(-1)
        wanted, inverse = np.unique(asked, return_inverse=True)
        w_idx, w_gid, w_col = self._groups[tier].lookup(wanted)
        by_gid: dict[int, tuple[I64, I64]] = {}  # group -> (wanted index, column), by column
        for g in np.unique(w_gid).tolist():
            sel = np.flatnonzero(w_gid == g)
            order = np.argsort(w_col[sel])
            by_gid[g] = (w_idx[sel][order], w_col[sel][order])
        gids = np.fromiter(by_gid, np.int64, len(by_gid))
        pieces = _Pieces()
        plan: list[tuple[_Segment, I64]] = []
        if gids.size:
            for start in sorted(self._segments[tier]):
                seg = self._segments[tier][start]
                if seg.end_ms <= start_ms or seg.start_ms >= end_ms:
                    continue
                recs = seg.records.select(gids, start_ms, end_ms)
                if recs.size:
                    plan.append((seg, recs))
        if plan:
            total = sum(seg.records.length[r] for seg, recs in plan for r in recs.tolist())
            buf = np.zeros((total + codec.PAD + 7) // 8 * 8, np.uint8)
            spans: list[tuple[int, int]] = []
            rec_w: list[I64] = []
            rec_c: list[I64] = []
            for seg, recs in plan:
                rows = recs.tolist()
                with open(seg.path, "rb") as f:
                    try:
                        spans += read_records_into(
                            f, [seg.records.offset[r] for r in rows],
                            [seg.records.length[r] for r in rows], buf.data,
                            spans[-1][1] if spans else 0)
                    except SegmentError as exc:
                        raise StoreError(f"{seg.path}: {exc} (changed on disk since open?); "
                                         "no data returned") from exc
                for r in rows:
                    widx, cols = by_gid[int(seg.records.gid[r])]
                    rec_w.append(widx)
                    rec_c.append(cols)
            pieces.add_records(buf, spans, rec_w, rec_c)
        for waiting in self._unsealed[tier]:  # older than the head's chunk of its group
            if waiting.gid in by_gid:
                widx, cols = by_gid[waiting.gid]
                pieces.add(widx, waiting.ts[:waiting.n].copy(),
                           waiting.values[:waiting.n][:, cols])
        head = self._head[tier]
        for g, (widx, cols) in by_gid.items():
            grp = head.get(g)
            if grp is not None and grp.n:
                pieces.add(widx, grp.ts[:grp.n].copy(), grp.values[:grp.n][:, cols])
        result = pieces.assemble(wanted, start_ms, end_ms)
        if wanted.size == asked.size and np.array_equal(wanted, asked):
            return result
        return result.take(inverse.reshape(-1), asked)

    def series_ids(self, tier: str) -> I64:
        """Every series id the tier has held since open (on disk or in the head), sorted."""
        self._check_open()
        return self._groups[self._spec(tier).name].all_series()

    # ------------------------------------------------------------------ tiers
    def downsample(self, src_tier: str, dst_tier: str, series_ids: npt.ArrayLike,
                   reducer: str, start_ms: int, end_ms: int) -> int:
        """Derive ``dst_tier`` buckets in [start_ms, end_ms) from ``src_tier`` samples.

        Each series is reduced on its own (``reducer`` in :data:`REDUCERS`: count, sum, min,
        max, last) into buckets of the destination tier's resolution, stamped with the
        bucket start, and appended under the same series id. Re-running a range rewrites the
        same points (last write wins). Returns the number of points appended.
        """
        dst = self._spec(dst_tier)
        self._spec(src_tier)
        if reducer not in REDUCERS:
            raise StoreError(f"unknown reducer {reducer!r}; have {REDUCERS}")
        res = dst.resolution_ms
        if res <= 0 or start_ms % res or end_ms % res:
            raise StoreError(f"downsample to {dst_tier}: range must align to {res} ms buckets")
        data = self.read(src_tier, series_ids, start_ms, end_ms)
        bts, bvals, boff = reduce_buckets(data.ts, data.values, data.offsets, res, reducer)
        groups: dict[bytes, list[int]] = {}
        for i in range(data.series_ids.size):
            a, b = int(boff[i]), int(boff[i + 1])
            if b > a:
                groups.setdefault(bts[a:b].tobytes(), []).append(i)
        total = 0
        for members in groups.values():
            a0, b0 = int(boff[members[0]]), int(boff[members[0] + 1])
            cols = np.stack([bvals[boff[i]:boff[i + 1]] for i in members], axis=1)
            self.append(dst_tier, data.series_ids[members], bts[a0:b0], cols)
            total += cols.size
        return total

    def maintain(self, now_ms: int | None = None) -> tuple[int, int]:
        """Compact finished segments and apply retention in every tier.

        ``now_ms`` defaults to each tier's newest appended timestamp (event time, so a
        replay of old data is not deleted on arrival). Every segment rewrite, also one a
        flush began, is finished on return. Returns (rewritten, deleted).
        """
        self._check_open()
        deleted = 0
        for tier in self.tiers:
            now = self._newest.get(tier) if now_ms is None else now_ms
            if now is not None:
                self._compact_tier(tier, now - self.config.grace_ms)
                deleted += self._retain_tier(tier, now)
        return self._advance_rewrites(None), deleted

    def enforce_retention(self, now_ms: int) -> int:
        """Delete every segment whose whole span is past its tier's retention; returns count."""
        self._check_open()
        return sum(self._retain_tier(tier, now_ms) for tier in self.tiers)

    def _retain_tier(self, tier: str, now_ms: int) -> int:
        spec = self.tiers[tier]
        if spec.retention_ms <= 0:
            return 0
        horizon = now_ms - spec.retention_ms
        segs = self._segments[tier]
        deleted = 0
        for start in [s for s, seg in segs.items() if seg.end_ms <= horizon]:
            self._abandon_rewrite((tier, start))
            seg = segs.pop(start)
            seg.close_writer()
            seg.path.unlink(missing_ok=True)
            _index_path(seg.path).unlink(missing_ok=True)
            self._dirty_dirs.add(seg.path.parent)
            deleted += 1
        for g in self._head[tier].values():
            if g.n and g.seg_start + spec.segment_ms <= horizon:
                g.n = g.flushed = 0
        self._unsealed[tier] = [g for g in self._unsealed[tier]
                                if g.seg_start + spec.segment_ms > horizon]
        if deleted and self.config.fsync:
            for d in self._dirty_dirs:
                fsync_dir(d)
            self._dirty_dirs.clear()
        return deleted

    def compact(self, now_ms: int) -> int:
        """Seal chunks of segments that ended by ``now_ms``, rewrite those segments without
        superseded partial records (atomic rename) and save their index; every rewrite,
        also one a flush began, is finished on return. Returns the number of segments
        rewritten."""
        self._check_open()
        for tier in self.tiers:
            self._compact_tier(tier, now_ms)
        return self._advance_rewrites(None)

    def _compact_tier(self, tier: str, now_ms: int) -> None:
        """Seal the open chunks of segments that ended by ``now_ms``; of those segments,
        begin a rewrite of each that needs one (:meth:`_advance_rewrites` does it) and save
        the index of the others."""
        spec = self.tiers[tier]
        for g in self._head[tier].values():
            if g.n and g.seg_start + spec.segment_ms <= now_ms:
                self._seal(tier, spec, g)
        self._flush_data()
        for seg in list(self._segments[tier].values()):
            if seg.end_ms > now_ms or seg.indexed:
                continue
            key = (tier, seg.start_ms)
            rw = self._rewrites.get(key)
            if rw is not None and rw.records_at_start == seg.records.n:
                continue  # under way and still valid
            self._abandon_rewrite(key)
            if self.config.compact_recode or KIND_PARTIAL in seg.records.kind:
                self._rewrites[key] = _Rewrite(tier, seg, seg.path.with_suffix(".tmp"),
                                               seg.records.n)
            else:
                self._save_index(tier, seg)
                seg.indexed = True

    def _advance_rewrites(self, deadline: float | None) -> int:
        """Go on with the begun rewrites, oldest first, until ``self.clock()`` passes
        ``deadline`` (None: until all are done); returns how many were finished.

        A rewrite whose segment was written to since it began is abandoned, and its tier
        compacted again at the next flush. One that fails (a full disk: StoreWriteError) is
        dropped with its copy, and the error raised; its tier is compacted again later."""
        done = 0
        while self._rewrites:
            key, rw = next(iter(self._rewrites.items()))
            if rw.records_at_start != rw.seg.records.n:
                self._abandon_rewrite(key)
                self._maintained.pop(rw.tier, None)
                continue
            try:
                finished = self._rewrite_step(rw, deadline)
            except BaseException:
                del self._rewrites[key]  # its copy is gone already
                self._maintained.pop(rw.tier, None)
                raise
            if not finished:
                break
            del self._rewrites[key]
            done += 1
            if deadline is not None and self.clock() >= deadline:
                break
        return done

    def _rewrite_step(self, rw: _Rewrite, deadline: float | None) -> bool:
        """Write more of a segment anew, without its superseded partial records, each kept
        record copied as it is or, with ``compact_recode``, re-encoded (:meth:`_recoded`):
        at least one record, and more until ``deadline``. Once every record is written:
        fsync, rename over the segment, its index saved; returns True then."""
        seg = rw.seg
        with _refused_as_store_write_error(rw.tmp):
            try:
                if rw.records is None:
                    rw.src = open(seg.path, "rb")  # noqa: SIM115 (open across flushes)
                    rw.dst = open(rw.tmp, "wb")  # noqa: SIM115
                    rw.dst.write(write_file_header(seg.start_ms, seg.span_ms))
                    rw.offset = FILE_HEADER.size
                    keep = _kept(seg.records)
                    rw.records = self._recoded(rw.tier, seg, rw.src, keep) \
                        if self.config.compact_recode else _copied(seg.records, rw.src, keep)
                assert rw.dst is not None
                wrote = False
                for gid, t_min, t_max, kind, chunk_key, raw in rw.records:
                    rw.dst.write(raw)
                    rw.new.add(gid, t_min, t_max, kind, chunk_key, rw.offset, len(raw))
                    rw.offset += len(raw)
                    rw.steps += 1
                    wrote = True
                    if deadline is not None and self.clock() >= deadline:
                        return False  # the generator keeps its place for the next flush
                if deadline is not None and wrote and self.clock() >= deadline:
                    return False
                rw.dst.flush()
                os.fsync(rw.dst.fileno())
            except BaseException:
                rw.close_files()  # before the copy is removed: an open file keeps its space
                raise
            rw.close_files()
        seg.close_writer()
        os.replace(rw.tmp, seg.path)
        fsync_dir(seg.path.parent)
        seg.records = rw.new
        seg.size = rw.offset
        self._save_index(rw.tier, seg)
        seg.indexed = True
        self.rewrites_done += 1
        return True

    def _drop_rewrites(self, exc: StoreWriteError) -> None:
        """The disk refused data while unfinished segment copies hold space: delete them
        (a refused compaction, begun again after ``maintain_retry_s``)."""
        for key in list(self._rewrites):
            self._maintained.pop(key[0], None)
            self._abandon_rewrite(key)
        self._compaction_refused("", exc)

    def _abandon_rewrite(self, key: tuple[str, int]) -> None:
        """Drop the rewrite of a segment, if one is under way, and delete its copy."""
        rw = self._rewrites.pop(key, None)
        if rw is not None:
            rw.close_files()
            rw.tmp.unlink(missing_ok=True)

    @property
    def rewrites_pending(self) -> int:
        """Segment rewrites begun by compaction and not finished yet."""
        return len(self._rewrites)

    def _recoded(self, tier: str, seg: _Segment, src: BinaryIO,
                 keep: list[int]) -> Iterator[_Rec]:
        """The kept records of ``seg`` entropy-coded, sealed runs of a group joined where
        that is smaller (:func:`_merge_runs`, :func:`compacted_blobs`); StoreError if one
        cannot be read (the segment is then left as it was)."""
        recs = seg.records
        for run in _merge_runs(recs, keep):
            members = []
            sealed_bytes = 0
            for i in run:
                src.seek(recs.offset[i])
                try:
                    blob = checked_blob(src.read(recs.length[i]))
                    members.append(codec.decode_group(blob))
                except (SegmentError, codec.CodecError) as exc:
                    raise StoreError(f"{seg.path}: compaction cannot read a record ({exc}); "
                                     "the segment is left as it was") from exc
                sealed_bytes += len(blob)
            blobs = compacted_blobs(members, sealed_bytes)
            parts = [(run, np.concatenate([m[0] for m in members]))] if len(blobs) == 1 \
                else [([i], m[0]) for i, m in zip(run, members, strict=True)]
            for (rows, ts), blob in zip(parts, blobs, strict=True):
                first, gid = rows[0], int(recs.gid[rows[0]])
                t_min, t_max = int(ts.min()), int(ts.max())
                raw = encode_record(recs.kind[first], self._groups[tier].coded(gid), ts.size,
                                    t_min, t_max, int(recs.chunk_key[first]), blob)
                yield gid, t_min, t_max, recs.kind[first], recs.chunk_key[first], raw

    def _save_index(self, tier: str, seg: _Segment) -> None:
        idx = _index_path(seg.path)
        with _refused_as_store_write_error(idx.with_suffix(".idx.tmp")):
            save_index(idx, seg.size, seg.records, self._groups[tier])

    def disk_bytes(self, tier: str | None = None) -> int:
        """Bytes of segment files (all tiers, or one)."""
        tiers = [tier] if tier else list(self.tiers)
        return sum(seg.size for t in tiers for seg in self._segments[t].values())

    def close(self) -> None:
        """Seal every open chunk, flush, and release the directory lock."""
        if self._closed:
            return
        try:  # a full disk raises StoreWriteError here; the files and the lock are let go
            for tier, head in self._head.items():
                for g in head.values():
                    self._seal(tier, self.tiers[tier], g)
            self._flush_data()
        finally:
            for key in list(self._rewrites):  # not finished here: begun again after open
                self._abandon_rewrite(key)
            for segs in self._segments.values():
                for seg in segs.values():
                    seg.close_writer()
            os.close(self._lock_fd)
            self._closed = True

    def __enter__(self) -> SeriesStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_open(self) -> None:
        if getattr(self, "_closed", False):
            raise StoreError("the store is closed")


def compacted_blobs(members: list[tuple[I64, F64]], sealed_bytes: int) -> list[bytes]:
    """What compaction writes for a run of chunks (ts, values[T, k]) of one group.

    One entropy-coded chunk of them all where that is smaller than the ``sealed_bytes``
    they took as sealed, else each entropy-coded on its own (a NaN in one chunk turns its
    whole joined column to XOR, and one chunk's jump can widen every residual)."""
    if len(members) > 1:
        joined = codec.encode_group(np.concatenate([m[0] for m in members]),
                                    np.concatenate([m[1] for m in members]), entropy_coded=True)
        if len(joined) < sealed_bytes:
            return [joined]
    return [codec.encode_group(ts, values, entropy_coded=True) for ts, values in members]


def _merge_runs(recs: RecordIndex, keep: list[int]) -> list[list[int]]:
    """The kept records (file order) cut into runs that compaction writes as one record each.

    A run is up to :data:`COMPACT_CHUNKS` sealed records of one group, each the group's next
    in the file and wholly later in time than the one before, so that reads (last write
    wins in file order) see the same samples; any other record stays a run of its own. The
    runs come out in the file order of their first record.
    """
    runs: list[list[int]] = []
    last: dict[int, list[int]] = {}  # group -> its latest run
    for i in keep:
        g = int(recs.gid[i])
        run = last.get(g)
        if (run is not None and len(run) < COMPACT_CHUNKS and recs.kind[i] == KIND_SEALED
                and recs.kind[run[-1]] == KIND_SEALED and recs.t_min[i] > recs.t_max[run[-1]]):
            run.append(i)
        else:
            last[g] = [i]
            runs.append(last[g])
    return runs


def _kept(recs: RecordIndex) -> list[int]:
    """The records (file order) a rewrite keeps: every sealed one, and each partial one
    whose chunk was not sealed since (vectorised: a 2 h segment of a large fleet flushed
    every 10 s holds about a million records, mostly partial)."""
    n = recs.n
    kind = np.asarray(recs.kind, dtype=np.int64)
    if not recs.sealed:
        return list(range(n))
    gid, key = recs.gid[:n], np.asarray(recs.chunk_key, dtype=np.int64)
    order = np.lexsort((key, gid))
    g, k = gid[order], key[order]
    new = np.ones(n, bool)  # first record of each (group, chunk key)
    new[1:] = (g[1:] != g[:-1]) | (k[1:] != k[:-1])
    chunk = np.cumsum(new) - 1
    has_sealed = np.zeros(int(chunk[-1]) + 1, bool)
    has_sealed[chunk[kind[order] == KIND_SEALED]] = True
    superseded = np.empty(n, bool)
    superseded[order] = has_sealed[chunk]
    return np.flatnonzero((kind == KIND_SEALED) | ~superseded).tolist()


def _copied(recs: RecordIndex, src: BinaryIO, keep: list[int]) -> Iterator[_Rec]:
    """The kept records as they are on disk (compaction without ``compact_recode``)."""
    for i in keep:
        src.seek(recs.offset[i])
        yield (int(recs.gid[i]), int(recs.t_min[i]), int(recs.t_max[i]), recs.kind[i],
               recs.chunk_key[i], src.read(recs.length[i]))


def _index_path(segment: Path) -> Path:
    return segment.with_suffix(".idx")


@contextlib.contextmanager
def _refused_as_store_write_error(tmp: Path) -> Iterator[None]:
    """A whole-file rewrite through ``tmp`` that failed: ``tmp`` removed (it holds the space
    the disk lacks) and the original file stands; a refusal by the disk is raised as
    StoreWriteError."""
    try:
        yield
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and not isinstance(exc, StoreWriteError):
            raise StoreWriteError(f"cannot write {tmp}: {exc.strerror or exc}") from exc
        raise


class _Pieces:
    """Decoded pieces of a read, assembled in one vectorised pass at the end."""

    def __init__(self) -> None:
        self.w: list[I64] = []
        self.ts: list[I64] = []
        self.v: list[F64] = []

    def add_records(self, buf: npt.NDArray[np.uint8], spans: list[tuple[int, int]],
                    rec_w: list[I64], rec_c: list[I64]) -> None:
        """Decode the chosen columns of many records (blobs at ``spans`` of ``buf``) at once."""
        widths = np.fromiter((c.size for c in rec_c), np.int64, len(rec_c))
        colptr = np.zeros(len(rec_c) + 1, np.int64)
        np.cumsum(widths, out=colptr[1:])
        se = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
        try:
            counts, ts, vals = codec.decode_selected(buf, se[:, 0], se[:, 1], colptr,
                                                     np.concatenate(rec_c))
        except codec.CodecError as exc:
            raise StoreError(f"{exc}; no data returned") from exc
        n_per_col = np.repeat(counts, widths)  # samples of each decoded column
        ts_start = np.zeros(counts.size, np.int64)
        np.cumsum(counts[:-1], out=ts_start[1:])
        starts = np.repeat(ts_start, widths)  # where each column's timestamps begin in ts
        seg_start = np.cumsum(n_per_col) - n_per_col
        idx = np.repeat(starts - seg_start, n_per_col) + np.arange(int(n_per_col.sum()))
        self.w.append(np.repeat(np.concatenate(rec_w), n_per_col))
        self.ts.append(ts[idx])
        self.v.append(vals)

    def add(self, widx: I64, ts: I64, vals: F64) -> None:
        """``vals`` is (T, c): column j belongs to wanted series ``widx[j]``."""
        self.w.append(np.repeat(widx, ts.size))
        self.ts.append(np.tile(ts, widx.size))
        self.v.append(np.ascontiguousarray(vals.T).reshape(-1))

    def assemble(self, wanted: I64, start_ms: int, end_ms: int) -> ReadResult:
        """Keep [start, end), order by (series, time), last write wins per timestamp."""
        offsets = np.zeros(wanted.size + 1, np.int64)
        if not self.w:
            return ReadResult(wanted.copy(), offsets, np.zeros(0, np.int64), np.zeros(0))
        w = np.concatenate(self.w)
        ts = np.concatenate(self.ts)
        v = np.concatenate(self.v)
        m = (ts >= start_ms) & (ts < end_ms)
        w, ts, v = w[m], ts[m], v[m]
        o = np.lexsort((np.arange(ts.size), ts, w))  # stable: later pieces sort later
        w, ts, v = w[o], ts[o], v[o]
        last = np.ones(ts.size, bool)
        last[:-1] = (ts[1:] != ts[:-1]) | (w[1:] != w[:-1])
        w, ts, v = w[last], ts[last], v[last]
        np.cumsum(np.bincount(w, minlength=wanted.size), out=offsets[1:])
        return ReadResult(wanted.copy(), offsets, ts, v)


def _distinct(ids: I64) -> bool:
    """Whether ``ids`` repeat no value: one pass when they are sorted, as a layout's groups
    are, else a sort. A window's close meets tens of thousands of new groups, and sorting
    each in ``np.unique`` was 3 % of a 31,000-GPU aggregator's store thread."""
    step = np.diff(ids)
    if (step > 0).all():
        return True
    return bool(np.unique(ids).size == ids.size)

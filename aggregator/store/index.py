"""In-memory indexes: which group holds a series, and which records a segment holds.

Reads must not scan every series of every record: a rack-level aggregator writes tens of
thousands of records per segment, each of a group of hundreds of series. So series map to
*groups* once per tier (:class:`GroupRegistry`: a group is a distinct ``series_ids``
array, numbered in order of first sight), and a segment only lists, per record, its group
number and time range in growable numpy columns (:class:`RecordIndex`). A read looks up
its series' groups with one ``searchsorted`` and filters the records with one vectorised
mask per segment. A finished (compacted) segment also gets its index saved beside it
(``.idx``), so reopening a large store reads indexes instead of every record.
"""

from __future__ import annotations

import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

from aggregator.store.segment import encode_ids

I64 = npt.NDArray[np.int64]


class GroupRegistry:
    """Group numbers for the distinct ``series_ids`` arrays of one tier.

    Reads look series up in a table of every group's series, sorted by series id. Groups
    keep arriving while an aggregator runs (a window whose series set is new), often between
    two reads, so the table is not rebuilt from every group then: the new groups' entries are
    sorted alone and merged into a small table of recent groups, which is merged into the
    main one only once it holds an eighth as many entries. Sorting all again cost a
    rack-level aggregator of 31,000 GPUs about a sixth of its store thread; merging into the
    main table at every read after a new group (5.8 million entries, the row stage's reads
    between its windows) still cost it 7 %. A lookup answers as one table would: entries of
    one series in group order, as a stable sort of every group in turn leaves them (the main
    table's groups are all older than the recent one's).
    """

    def __init__(self) -> None:
        self._by_key: dict[bytes, int] = {}
        self.ids: list[I64] = []
        self._coded: list[tuple[int, int, bytes] | None] = []
        empty = np.zeros(0, np.int64)
        self._table: tuple[I64, I64, I64] = (empty, empty, empty)
        self._recent: tuple[I64, I64, I64] = (empty, empty, empty)
        self._merged = 0
        """Groups the two tables hold: the first ``_merged`` of ``ids``."""

    def gid(self, ids: I64) -> int:
        """The group number of ``ids`` (registered on first sight)."""
        key = ids.tobytes()
        g = self._by_key.get(key)
        if g is None:
            g = len(self.ids)
            self._by_key[key] = g
            self.ids.append(np.array(ids, dtype=np.int64))
            self._coded.append(None)
        return g

    def coded(self, g: int) -> tuple[int, int, bytes]:
        """Group ``g``'s ids as a record carries them: (k, form, bytes) of ``encode_ids``."""
        c = self._coded[g]
        if c is None:
            ids = self.ids[g]
            c = self._coded[g] = (ids.size, *encode_ids(ids))
        return c

    def _tables(self) -> tuple[tuple[I64, I64, I64], tuple[I64, I64, I64]]:
        """(series id, group, column) of every group's series, by series id, then group: the
        main table and the recent groups' (whose groups all come after the main's)."""
        if self._merged < len(self.ids):
            new = self.ids[self._merged:]
            sid = np.concatenate(new)
            sizes = np.fromiter((a.size for a in new), np.int64, len(new))
            gid = np.repeat(np.arange(self._merged, len(self.ids), dtype=np.int64), sizes)
            col = np.arange(sid.size, dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes,
                                                                  sizes)
            order = np.argsort(sid, kind="stable")
            self._recent = _merge(self._recent, (sid[order], gid[order], col[order]))
            self._merged = len(self.ids)
            if self._recent[0].size * 8 > self._table[0].size:
                self._table = _merge(self._table, self._recent)
                empty = np.zeros(0, np.int64)
                self._recent = (empty, empty, empty)
        return self._table, self._recent

    def lookup(self, wanted: I64) -> tuple[I64, I64, I64]:
        """Every (index into ``wanted``, group, column) where a wanted series lives."""
        main, recent = self._tables()
        found = _find(main, wanted)
        if recent[0].size == 0:
            return found
        more = _find(recent, wanted)
        if more[0].size == 0:
            return found
        # By wanted index, the main table's entries first: the stable order of one table.
        order = np.argsort(np.concatenate([found[0], more[0]]), kind="stable")
        w, gid, col = (np.concatenate([a, b])[order] for a, b in zip(found, more, strict=True))
        return w, gid, col

    def all_series(self) -> I64:
        main, recent = self._tables()
        sid = _merge(main, recent)[0] if recent[0].size else main[0]
        return sid[np.r_[True, sid[1:] != sid[:-1]]] if sid.size else sid


def _merge(old: tuple[I64, I64, I64], new: tuple[I64, I64, I64]) -> tuple[I64, I64, I64]:
    """Sorted ``new`` entries into sorted ``old``, after the entries of the same series
    already there (theirs are older groups). Into an empty table, ``new`` as it is: a
    coarse tier's first window registers the 5.8 million series entries of a 31,000-GPU
    fleet at once, and ``np.insert`` took 0.3 s to place them in nothing."""
    if not old[0].size or not new[0].size:
        return new if old[0].size == 0 else old
    at = np.searchsorted(old[0], new[0], side="right")
    sid, gid, col = (np.insert(o, at, n) for o, n in zip(old, new, strict=True))
    return sid, gid, col


def _find(table: tuple[I64, I64, I64], wanted: I64) -> tuple[I64, I64, I64]:
    sid, gid, col = table
    lo = np.searchsorted(sid, wanted, side="left")
    hi = np.searchsorted(sid, wanted, side="right")
    counts = hi - lo
    w = np.repeat(np.arange(wanted.size, dtype=np.int64), counts)
    pos = np.repeat(lo - (np.cumsum(counts) - counts), counts) + np.arange(counts.sum())
    return w, gid[pos], col[pos]


@dataclass(slots=True)
class RecordIndex:
    """Per segment, one row per record: group, time range, kind, chunk key, file extent."""

    gid: I64 = field(default_factory=lambda: np.zeros(16, np.int64))
    t_min: I64 = field(default_factory=lambda: np.zeros(16, np.int64))
    t_max: I64 = field(default_factory=lambda: np.zeros(16, np.int64))
    kind: list[int] = field(default_factory=list)
    chunk_key: list[int] = field(default_factory=list)
    offset: list[int] = field(default_factory=list)
    length: list[int] = field(default_factory=list)
    sealed: set[tuple[int, int]] = field(default_factory=set)
    """(group, chunk key) of every sealed record: partial records of those are superseded."""
    n: int = 0

    def add(self, gid: int, t_min: int, t_max: int, kind: int, chunk_key: int, offset: int,
            length: int) -> None:
        if self.n == self.gid.size:
            self.gid = np.concatenate([self.gid, np.zeros_like(self.gid)])
            self.t_min = np.concatenate([self.t_min, np.zeros_like(self.t_min)])
            self.t_max = np.concatenate([self.t_max, np.zeros_like(self.t_max)])
        self.gid[self.n] = gid
        self.t_min[self.n] = t_min
        self.t_max[self.n] = t_max
        self.kind.append(kind)
        self.chunk_key.append(chunk_key)
        self.offset.append(offset)
        self.length.append(length)
        if kind == 1:  # segment.KIND_SEALED
            self.sealed.add((gid, chunk_key))
        self.n += 1

    def select(self, gids: I64, start_ms: int, end_ms: int) -> I64:
        """Record numbers of the given groups overlapping [start_ms, end_ms), in file order,
        without partial records whose chunk has been sealed since (same samples)."""
        g = self.gid[:self.n]
        hit = (self.t_max[:self.n] >= start_ms) & (self.t_min[:self.n] < end_ms)
        rows = np.flatnonzero(hit & np.isin(g, gids))
        if self.sealed and rows.size:
            keep = [r for r in rows.tolist() if self.kind[r] == 1
                    or (int(g[r]), self.chunk_key[r]) not in self.sealed]
            rows = np.asarray(keep, dtype=np.int64)
        return rows


_IDX_MAGIC = b"FPIDX001"
_IDX_HEAD = struct.Struct("<8sQII")


def save_index(path: Path, segment_size: int, records: RecordIndex,
               groups: GroupRegistry) -> None:
    """Write a finished segment's record index beside it (tmp, fsync, rename).

    Layout (little-endian): b"FPIDX001" | u64 segment size | u32 records | u32 groups |
    per group: u32 k, i64 ids[k] | u32 local group[records] | u8 kind[records] |
    i64 t_min, t_max, chunk_key, offset, length [records each] | u32 crc32 of all before.
    Opening trusts it only when the segment still has exactly ``segment size`` bytes.
    """
    n = records.n
    gids = records.gid[:n]
    uniq, local = np.unique(gids, return_inverse=True)
    parts = [_IDX_HEAD.pack(_IDX_MAGIC, segment_size, n, uniq.size)]
    for g in uniq.tolist():
        ids = groups.ids[g]
        parts.append(struct.pack("<I", ids.size) + ids.astype("<i8").tobytes())
    parts.append(local.astype("<u4").tobytes())
    parts.append(np.asarray(records.kind, dtype=np.uint8).tobytes())
    for col in (records.t_min[:n], records.t_max[:n], records.chunk_key, records.offset,
                records.length):
        parts.append(np.asarray(col, dtype="<i8").tobytes())
    body = b"".join(parts)
    tmp = path.with_suffix(".idx.tmp")
    with open(tmp, "wb") as f:
        f.write(body + struct.pack("<I", zlib.crc32(body)))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_index(path: Path, segment_size: int) -> list[tuple[I64, int, int, int, int, int, int]] | None:
    """Records of a saved index as (ids, kind, t_min, t_max, chunk_key, offset, length), or
    None when the file is missing, damaged, or the segment changed since it was written."""
    try:
        raw = path.read_bytes()
    except OSError:
        return None
    if len(raw) < _IDX_HEAD.size + 4 or zlib.crc32(raw[:-4]) != struct.unpack("<I", raw[-4:])[0]:
        return None
    magic, size, n, n_groups = _IDX_HEAD.unpack_from(raw, 0)
    if magic != _IDX_MAGIC or size != segment_size:
        return None
    pos = _IDX_HEAD.size
    group_ids = []
    for _ in range(n_groups):
        (k,) = struct.unpack_from("<I", raw, pos)
        group_ids.append(np.frombuffer(raw, "<i8", k, pos + 4).astype(np.int64))
        pos += 4 + 8 * k
    local = np.frombuffer(raw, "<u4", n, pos)
    pos += 4 * n
    kind = np.frombuffer(raw, np.uint8, n, pos)
    pos += n
    cols = []
    for _ in range(5):
        cols.append(np.frombuffer(raw, "<i8", n, pos).tolist())
        pos += 8 * n
    if pos != len(raw) - 4:
        return None
    return [(group_ids[int(local[i])], int(kind[i]), cols[0][i], cols[1][i], cols[2][i],
             cols[3][i], cols[4][i]) for i in range(n)]

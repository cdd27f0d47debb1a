"""Compaction's rewrite of a finished segment spread over flushes (``compact_budget_s``).

flush() used to rewrite (and, with ``compact_recode``, re-encode) a whole finished segment
inside one call: seconds to minutes on a large fleet. Now it writes the copy a few records
per flush, reads use the old file meanwhile, and the copy replaces it only when complete.
The budget is measured on a fake clock that advances one unit per reading, so what one
flush may do is a count of records, not a timing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from test_full_disk import _segments_whole, small_disk  # noqa: F401 (a fixture)
from test_store import _tags_and_bytes

from aggregator.config import AggregatorConfig
from aggregator.store import SeriesStore, StoreConfig, StoreError, TierSpec, codec
from aggregator.store.index import load_index
from aggregator.store.segment import scan_segment
from fleetpulse.config import ConfigError

H = 3_600_000
TIERS = (TierSpec("raw", 0, 0, H),)
GROUPS = 6
K = 4
SEG0 = "seg+00000000000000000000"


class Ticks:
    """A clock that advances by one each time it is read."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def _store(path: Path, **kw: object) -> SeriesStore:
    kw.setdefault("compact_budget_s", 0.5)  # on Ticks: one record, then the time is up
    kw.setdefault("fsync", False)
    st = SeriesStore(StoreConfig(path=str(path), tiers=TIERS, grace_ms=0, **kw))
    st.clock = Ticks()
    return st


def _data(seed: int, seconds: int = 2 * 3600) -> tuple[np.ndarray, np.ndarray]:
    """GROUPS groups of K noisy series, 1 Hz for ``seconds`` (shared timestamps)."""
    rng = np.random.default_rng(seed)
    ts = np.arange(seconds, dtype=np.int64) * 1000 + rng.integers(0, 5, seconds)
    vals = np.round(rng.normal(300, 5, (seconds, GROUPS * K)) * 1000) / 1000
    return ts, vals


def _ids(g: int) -> np.ndarray:
    return np.arange(100 * g, 100 * g + K, dtype=np.int64)


def _append(st: SeriesStore, ts: np.ndarray, vals: np.ndarray, a: int, b: int) -> None:
    for g in range(GROUPS):
        st.append("raw", _ids(g), ts[a:b], vals[a:b, g * K:(g + 1) * K])


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def _check(st: SeriesStore, want: dict[int, dict[int, float]], hours: int = 2) -> None:
    """Every series reads back exactly ``want`` (series -> ts -> value)."""
    ids = np.concatenate([_ids(g) for g in range(GROUPS)])
    r = st.read("raw", ids, 0, hours * H)
    for j, sid in enumerate(ids.tolist()):
        ts, vals = r.series(j)
        exp = want[sid]
        assert ts.tolist() == sorted(exp)
        assert np.array_equal(_bits(vals), _bits(np.array([exp[t] for t in sorted(exp)])))


def _want(ts: np.ndarray, vals: np.ndarray, a: int, b: int,
          into: dict[int, dict[int, float]] | None = None) -> dict[int, dict[int, float]]:
    out = into if into is not None else {}
    for g in range(GROUPS):
        for c, sid in enumerate(_ids(g).tolist()):
            out.setdefault(sid, {}).update(zip(ts[a:b].tolist(),
                                               vals[a:b, g * K + c].tolist(), strict=True))
    return out


def _begin(st: SeriesStore, ts: np.ndarray, vals: np.ndarray) -> int:
    """Hour 0 in blocks of 300 s (partial records), then the first block of hour 1: the
    flush after it begins the rewrite of hour 0. Returns the next row to append."""
    for a in range(0, 3600, 300):
        _append(st, ts, vals, a, a + 300)
        st.flush()
    _append(st, ts, vals, 3600, 3610)
    return 3610


def test_one_flush_rewrites_at_most_its_budget_and_reads_stay_exact(tmp_path: Path) -> None:
    ts, vals = _data(1)
    seg = tmp_path / "raw" / f"{SEG0}.fps"
    with _store(tmp_path) as st:
        row = _begin(st, ts, vals)
        before = seg.read_bytes()
        st.flush()  # hour 0 finished: its rewrite begins, one record of it written
        assert seg.read_bytes() == before, "rewritten inside one flush"
        assert st.rewrites_pending == 1 and seg.with_suffix(".tmp").exists()
        assert not seg.with_suffix(".idx").exists()
        (rw,) = st._rewrites.values()
        done, flushes = rw.steps, 1
        assert done == 1
        while st.rewrites_pending:
            _append(st, ts, vals, row, row + 10)
            row += 10
            st.flush()
            flushes += 1
            assert rw.steps - done <= 1  # the budget: one record a flush on this clock
            done = rw.steps
            if st.rewrites_pending:  # the old file serves reads until the copy is whole
                assert seg.read_bytes() == before
            _check(st, _want(ts, vals, 0, row))
        _, _, recs = scan_segment(seg, truncate=False)
        # 6 groups x 30 chunks of 120, four a record: 48 records, one per flush, and the
        # flush after the last one fsyncs, renames and saves the index
        assert len(recs) == rw.steps == GROUPS * 8 and flushes == GROUPS * 8 + 1
        assert st.rewrites_done == 1 and not seg.with_suffix(".tmp").exists()
        assert len(seg.read_bytes()) < len(before)
        assert codec.C_DELTA_ANS in _tags_and_bytes(seg)[0]
        assert load_index(seg.with_suffix(".idx"), seg.stat().st_size) is not None
        assert [r.n for r in recs] == [480] * 7 * GROUPS + [240] * GROUPS
        _check(st, _want(ts, vals, 0, row))
    with _store(tmp_path) as st:  # and from the saved index
        assert st.rewrites_pending == 0
        _check(st, _want(ts, vals, 0, row))


def test_compact_finishes_a_rewrite_that_a_flush_began(tmp_path: Path) -> None:
    ts, vals = _data(2)
    seg = tmp_path / "raw" / f"{SEG0}.fps"
    with _store(tmp_path) as st:
        row = _begin(st, ts, vals)
        st.flush()
        st.flush()
        assert st.rewrites_pending == 1
        assert st.compact(now_ms=H) == 1  # callers expect the work done on return
        assert st.rewrites_pending == 0 and not seg.with_suffix(".tmp").exists()
        assert seg.with_suffix(".idx").exists() and codec.C_DELTA_ANS in _tags_and_bytes(seg)[0]
        _check(st, _want(ts, vals, 0, row))


def test_late_data_abandons_the_copy_and_the_segment_is_compacted_again(
        tmp_path: Path) -> None:
    ts, vals = _data(3)
    seg = tmp_path / "raw" / f"{SEG0}.fps"
    rng = np.random.default_rng(4)
    with _store(tmp_path) as st:
        row = _begin(st, ts, vals)
        for _ in range(5):
            st.flush()
        assert st.rewrites_pending == 1 and seg.with_suffix(".tmp").exists()
        want = _want(ts, vals, 0, row)
        # late: hour 0 written again at 100 of its timestamps (last write wins), plus one
        # timestamp it never had
        late_rows = np.sort(rng.choice(3600, 100, replace=False))
        late_ts = np.concatenate([ts[late_rows], [3_599_999]])
        late_vals = rng.normal(0, 1, (late_ts.size, GROUPS * K))
        for g in range(GROUPS):
            st.append("raw", _ids(g), late_ts, late_vals[:, g * K:(g + 1) * K])
        _want(late_ts, late_vals, 0, late_ts.size, want)
        st.flush()
        assert not seg.with_suffix(".tmp").exists(), "the copy outlived the late data"
        _check(st, want)
        flushes = 0
        while not seg.with_suffix(".idx").exists():
            _append(st, ts, vals, row, row + 10)
            _want(ts, vals, row, row + 10, want)
            row += 10
            st.flush()
            flushes += 1
            _check(st, want)
            assert flushes < 500, "never compacted again"
        assert st.rewrites_pending == 0 and st.rewrites_done == 1
        _, _, recs = scan_segment(seg, truncate=False)
        assert {r.kind for r in recs} == {1}  # sealed only: no partial record is left
        assert codec.C_DELTA_ANS in _tags_and_bytes(seg)[0]
    with _store(tmp_path) as st:
        _check(st, want)


def test_close_mid_rewrite_and_a_crash_mid_rewrite_lose_nothing(tmp_path: Path) -> None:
    ts, vals = _data(5)
    raw = tmp_path / "live" / "raw"
    with _store(tmp_path / "live") as st:
        row = _begin(st, ts, vals)
        for _ in range(4):
            st.flush()
        assert st.rewrites_pending == 1 and (raw / f"{SEG0}.tmp").exists()
        want = _want(ts, vals, 0, row)
        # what kill -9 would leave now: the old segment and a part of the copy
        shutil.copytree(tmp_path / "live", tmp_path / "crashed",
                        ignore=shutil.ignore_patterns("LOCK"))
    assert (tmp_path / "crashed" / "raw" / f"{SEG0}.tmp").exists()
    assert not list(raw.glob("*.tmp")), "close() left its unfinished copy behind"
    assert not (raw / f"{SEG0}.idx").exists()
    for where in ("live", "crashed"):
        want = _want(ts, vals, 0, row)
        with _store(tmp_path / where) as st:
            assert not list((tmp_path / where / "raw").glob("*.tmp"))
            assert st.truncated_bytes == 0
            _check(st, want)
            # the first flush after new data (maintain's clock is the newest sample
            # appended since open) compacts again, from the start
            _append(st, ts, vals, row, row + 10)
            st.flush()
            assert st.rewrites_pending == 1
            while st.rewrites_pending:
                st.flush()
            assert (tmp_path / where / "raw" / f"{SEG0}.idx").exists()
            _want(ts, vals, row, row + 10, want)
            _check(st, want)
        with _store(tmp_path / where) as st:
            _check(st, want)


def test_a_full_disk_midway_drops_the_copy_and_compaction_resumes_with_space(
        small_disk) -> None:  # noqa: F811 (the fixture)
    """As tests/test_full_disk.py's compaction test, with the rewrite spread over flushes:
    the disk runs out a few flushes in, for the copy or for the flush's own records (the
    copy holds space between flushes; data comes first). Each flush still succeeds (the
    data is durable), the copy is deleted at once, and once the retry delay has passed
    with space the segment is compacted."""
    disk = small_disk(4 << 20)
    root = disk.path / "store"
    ts, vals = _data(6)
    seg = root / "raw" / f"{SEG0}.fps"
    st = _store(root, fsync=True, maintain_retry_s=3600.0)
    try:
        for a in range(0, 3600, 60):  # 60 partial records per group
            _append(st, ts, vals, a, a + 60)
            st.flush()
        disk.fill(keep=seg.stat().st_size // 10)  # room for flushes, not for the copy
        row = 3600
        saw_copy = False
        while st.maintain_errors == 0:
            _append(st, ts, vals, row, row + 1)
            row += 1
            st.flush()  # never raises: the refusal is the compaction's, not the flush's
            saw_copy |= seg.with_suffix(".tmp").exists()
            assert row < 3600 + 200, "the disk never refused the copy"
        assert saw_copy, "refused in the first flush: not spread over flushes"
        assert st.rewrites_pending == 0 and not list(seg.parent.glob("*.tmp"))
        assert not seg.with_suffix(".idx").exists()
        _segments_whole(root)
        want = _want(ts, vals, 0, row)
        _check(st, want)
        disk.release()
        st._maintain_after = 0.0  # as if maintain_retry_s had passed
        refused = st.maintain_errors
        while not seg.with_suffix(".idx").exists():
            _append(st, ts, vals, row, row + 1)
            row += 1
            st.flush()
            assert row < 3600 + 1000, "not compacted once there was space"
        assert st.maintain_errors == refused
        _check(st, _want(ts, vals, 0, row))
    finally:
        st.close()
    with _store(root) as again:
        _check(again, _want(ts, vals, 0, row))


@pytest.mark.parametrize("budget", [0.0, -1.0, float("nan")])
def test_the_budget_must_be_positive(tmp_path: Path, budget: float) -> None:
    with pytest.raises(StoreError, match="compact_budget_s"):
        SeriesStore(StoreConfig(path=str(tmp_path), compact_budget_s=budget))
    with pytest.raises(ConfigError, match="compact_budget_s"):
        AggregatorConfig(compact_budget_s=budget).validate()
    assert StoreConfig().compact_recode and AggregatorConfig().compact_recode

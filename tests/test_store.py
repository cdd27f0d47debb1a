"""The series store on real files: round trips, tiers, retention, downsampling, kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from aggregator.store import SeriesStore, StoreConfig, StoreError, TierSpec, codec, reduce_buckets
from aggregator.store.segment import decode_record_body, scan_segment

H = 3_600_000
TIERS = (
    TierSpec("raw", 0, 4 * H, H),
    TierSpec("10s", 10_000, 48 * H, 6 * H),
)


def _store(path: Path, chunk: int = 120, **kw: object) -> SeriesStore:
    """A store whose flush() finishes the compaction it begins (no time budget: these
    tests look at the files right after it; tests/test_store_background_recode.py runs
    the budgeted rewrite)."""
    kw.setdefault("compact_budget_s", float("inf"))
    return SeriesStore(StoreConfig(path=str(path), tiers=TIERS, chunk_samples=chunk, **kw))


def _group(t0: int, n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ts = t0 + np.arange(n, dtype=np.int64) * 1000 + rng.integers(0, 5, n)
    vals = np.round(rng.normal(300, 5, (n, k)) * 1000) / 1000
    vals[:, 0] = np.nan  # not sampled
    return ts, vals


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64).view(np.uint64)


def test_round_trip_across_chunks_segments_head_and_reopen(tmp_path: Path) -> None:
    ids = np.array([10, 11, 12, 13], np.int64)
    ts, vals = _group(H - 300_000, 1000, 4, 1)  # crosses a segment boundary
    with _store(tmp_path) as st:
        st.append("raw", ids, ts[:500], vals[:500])
        st.flush()
        st.append("raw", ids, ts[500:], vals[500:])  # part stays in the head, unflushed
        r = st.read("raw", ids[[2, 0]], 0, 10 * H)
        assert r.counts.tolist() == [1000, 1000]
        assert np.array_equal(r.series(0)[0], ts)
        assert np.array_equal(_bits(r.series(0)[1]), _bits(vals[:, 2]))
        assert np.array_equal(_bits(r.series(1)[1]), _bits(vals[:, 0]))
    assert len(list((tmp_path / "raw").glob("*.fps"))) == 2
    with _store(tmp_path) as st:
        assert st.truncated_bytes == 0
        r = st.read("raw", ids, int(ts[100]), int(ts[900]))
        assert r.counts.tolist() == [800] * 4
        assert np.array_equal(_bits(r.values[r.offsets[3]:]), _bits(vals[100:900, 3]))
        assert st.series_ids("raw").tolist() == ids.tolist()


def test_last_write_wins_and_unknown_series(tmp_path: Path) -> None:
    ids = np.array([1, 2], np.int64)
    ts = np.arange(10, dtype=np.int64) * 1000
    with _store(tmp_path, chunk=4) as st:
        st.append("raw", ids, ts, np.zeros((10, 2)))
        st.flush()
        st.append("raw", ids, ts[3:5], np.ones((2, 2)))  # a replay that rewrites two points
        r = st.read("raw", [2, 99], 0, 10_000)
        assert r.counts.tolist() == [10, 0]
        assert r.series(0)[1].tolist() == [0, 0, 0, 1, 1, 0, 0, 0, 0, 0]


def test_bad_arguments_are_clear_errors(tmp_path: Path) -> None:
    with _store(tmp_path) as st:
        with pytest.raises(StoreError, match="unknown tier"):
            st.append("5m", [1], [0], [[1.0]])
        with pytest.raises(StoreError, match="shapes disagree"):
            st.append("raw", [1, 2], [0], [[1.0]])
        with pytest.raises(StoreError, match="distinct"):
            st.append("raw", [1, 1], [0], [[1.0, 2.0]])
        with pytest.raises(StoreError, match="locked"):
            _store(tmp_path)


def test_retention_deletes_whole_segments_and_compaction_keeps_data(tmp_path: Path) -> None:
    ids = np.array([5, 6, 7], np.int64)
    ts, vals = _group(0, 3 * 3600, 3, 2)  # three raw segments of one hour
    with _store(tmp_path, auto_maintain=False) as st:
        for a in range(0, ts.size, 100):  # flush often: many partial records
            st.append("raw", ids, ts[a:a + 100], vals[a:a + 100])
            st.flush()
        before = st.disk_bytes("raw")
        assert st.compact(now_ms=2 * H) == 2  # the two finished hours
        assert st.disk_bytes("raw") < before
        r = st.read("raw", ids, 0, 3 * H)
        assert np.array_equal(_bits(r.values[r.offsets[1]:r.offsets[2]]), _bits(vals[:, 1]))
        assert st.enforce_retention(now_ms=5 * H + 1) == 1  # hour 0 is past 4 h retention
        assert not (tmp_path / "raw" / "seg+00000000000000000000.fps").exists()
        r = st.read("raw", ids, 0, 3 * H)
        assert r.counts.tolist() == [2 * 3600] * 3
        assert int(r.ts[0]) >= H


def test_downsample_matches_numpy_for_every_reducer(tmp_path: Path) -> None:
    ids = np.array([1, 2], np.int64)
    ts, vals = _group(0, 600, 2, 3)
    vals[:, 0] = np.arange(600) * 0.5
    vals[::7, 1] = np.nan
    with _store(tmp_path) as st:
        st.append("raw", ids, ts, vals)
        for red, fn in [("count", lambda x: float(x.size)), ("sum", np.sum), ("min", np.min),
                        ("max", np.max), ("last", lambda x: x[-1])]:
            n = st.downsample("raw", "10s", ids, red, 0, 600_000)
            assert n == 2 * 60
            r = st.read("10s", ids, 0, 600_000)
            for j in range(2):
                bts, bv = r.series(j)
                assert bts.tolist() == list(range(0, 600_000, 10_000))
                for b, v in zip(bts.tolist(), bv.tolist(), strict=True):
                    x = vals[(ts >= b) & (ts < b + 10_000), j]
                    x = x[~np.isnan(x)]
                    assert v == pytest.approx(fn(x), rel=1e-12), (red, j, b)
        with pytest.raises(StoreError, match="align"):
            st.downsample("raw", "10s", ids, "max", 5, 600_000)


def test_reduce_buckets_skips_nan_only_buckets() -> None:
    ts = np.array([0, 5, 12, 13, 30], np.int64)
    v = np.array([1.0, 2.0, np.nan, np.nan, 4.0])
    bts, bv, off = reduce_buckets(ts, v, np.array([0, 5]), 10, "sum")
    assert bts.tolist() == [0, 30] and bv.tolist() == [3.0, 4.0] and off.tolist() == [0, 2]


def test_torn_tail_is_truncated_and_never_read(tmp_path: Path) -> None:
    ids = np.array([1, 2, 3], np.int64)
    ts, vals = _group(0, 300, 3, 4)
    with _store(tmp_path) as st:
        st.append("raw", ids, ts, vals)
    seg = next((tmp_path / "raw").glob("*.fps"))
    _, _, recs = scan_segment(seg, truncate=False)
    assert len(recs) == 3
    whole = seg.stat().st_size
    # cut the last record in half, then add garbage: as if the machine died mid-append
    with open(seg, "r+b") as f:
        f.truncate(recs[-1].offset + recs[-1].length // 2)
        f.seek(0, os.SEEK_END)
        f.write(b"\x46\x50\x43\x52garbage")
    with _store(tmp_path) as st:
        assert st.truncated_bytes > 0
        assert seg.stat().st_size == recs[-1].offset
        r = st.read("raw", ids, 0, H)
        assert r.counts.tolist() == [240] * 3
        assert np.array_equal(_bits(r.values[:240]), _bits(vals[:240, 0]))
    # a flipped bit inside a record body fails its CRC: that record and the rest are cut
    with open(seg, "r+b") as f:
        f.seek(recs[1].offset + 40)
        b = f.read(1)
        f.seek(recs[1].offset + 40)
        f.write(bytes([b[0] ^ 0x10]))
    with _store(tmp_path) as st:
        r = st.read("raw", ids, 0, H)
        assert r.counts.tolist() == [120] * 3
    assert whole > seg.stat().st_size


_WRITER = textwrap.dedent("""
    import sys
    import numpy as np
    from aggregator.store import SeriesStore, StoreConfig, TierSpec
    H = 3_600_000
    st = SeriesStore(StoreConfig(path=sys.argv[1], chunk_samples=50,
                                 tiers=(TierSpec("raw", 0, 0, 60_000),)))
    ids = np.arange(100, 140, dtype=np.int64)
    t = 0
    while True:
        ts = np.arange(t, t + 7, dtype=np.int64) * 1000
        vals = np.sin(ts[:, None] * 1e-4 + ids[None, :]).round(3)
        st.append("raw", ids, ts, vals)
        t += 7
        if t % 21 == 0:
            st.flush()
            print(t, flush=True)
""")


def test_survives_kill_9_mid_write(tmp_path: Path) -> None:
    """A real writer process killed with SIGKILL while appending and flushing."""
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    acked = 0
    try:
        for line in proc.stdout:
            acked = int(line)
            if acked >= 4200:  # several segments, many records, writer still running
                break
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert acked >= 4200
    ids = np.arange(100, 140, dtype=np.int64)
    with SeriesStore(StoreConfig(path=str(tmp_path), chunk_samples=50,
                                 tiers=(TierSpec("raw", 0, 0, 60_000),))) as st:
        r = st.read("raw", ids, 0, 10**12)
        for i, sid in enumerate(ids.tolist()):
            ts, v = r.series(i)
            assert ts.size >= acked  # everything acknowledged by flush() is there
            assert np.array_equal(ts, np.arange(ts.size) * 1000)  # no holes, no extras
            want = np.sin(ts * 1e-4 + sid).round(3)
            assert np.array_equal(_bits(v), _bits(want))  # nothing corrupt
        # the restarted writer replays from its last acknowledged point and goes on
        t = np.arange(acked, acked + 500, dtype=np.int64) * 1000
        st.append("raw", ids, t, np.sin(t[:, None] * 1e-4 + ids[None, :]).round(3))
        st.flush()
    with SeriesStore(StoreConfig(path=str(tmp_path), chunk_samples=50,
                                 tiers=(TierSpec("raw", 0, 0, 60_000),))) as st:
        r = st.read("raw", ids, 0, 10**12)
        ts, v = r.series(7)
        assert np.array_equal(ts, np.arange(acked + 500) * 1000)
        assert np.array_equal(_bits(v), _bits(np.sin(ts * 1e-4 + ids[7]).round(3)))


@pytest.mark.parametrize("ids", [np.arange(5, 600), np.array([3]), np.array([1, 5, 2, 100_000]),
                                 np.array([7, 3, -1]), np.array([1, 2, 4, 2**62]),
                                 np.array([0, 300, 200, -40_000, 2**31 - 1])])
def test_series_ids_in_records_round_trip_compactly(ids: np.ndarray) -> None:
    from aggregator.store.segment import decode_ids, encode_ids

    form, raw = encode_ids(ids.astype(np.int64))
    back, end = decode_ids(form, ids.size, b"xx" + raw, 2)
    assert back.tolist() == ids.tolist() and end == len(raw) + 2
    assert len(raw) <= 8 * ids.size + 8


def _tags_and_bytes(seg: Path) -> tuple[set[int], int]:
    """Every column tag in the records of a segment file, and the file's size."""
    _, _, recs = scan_segment(seg, truncate=False)
    data = seg.read_bytes()
    tags: set[int] = set()
    for r in recs:
        _, blob = decode_record_body(data[r.offset + 12:r.offset + r.length])
        tags.update(codec.column_tags(blob))
    return tags, len(data)


def test_compaction_without_recode_copies_records_as_sealed(tmp_path: Path) -> None:
    ids = np.arange(10, 14, dtype=np.int64)
    ts, vals = _group(0, 2 * 3600, 4, 12)  # as in the test below, where the flag is on
    seg = tmp_path / "raw" / "seg+00000000000000000000.fps"
    with _store(tmp_path, auto_maintain=False, compact_recode=False) as st:
        for a in range(0, ts.size, 500):  # partial records, so that the hour is rewritten
            st.append("raw", ids, ts[a:a + 500], vals[a:a + 500])
            st.flush()
        assert st.compact(now_ms=H) == 1
        tags, _ = _tags_and_bytes(seg)
        assert codec.C_DELTA in tags
        assert not tags & {codec.C_DELTA_ANS, codec.C_DOD_ANS}
        _, _, recs = scan_segment(seg, truncate=False)
        assert [r.n for r in recs] == [120] * 30  # sealed chunks only, none joined
        r = st.read("raw", ids, 0, 2 * H)
        assert np.array_equal(_bits(r.values), _bits(vals.T.ravel()))


def test_compaction_rewrites_sealed_chunks_entropy_coded(tmp_path: Path) -> None:
    ids = np.arange(10, 14, dtype=np.int64)
    ts, vals = _group(0, 2 * 3600, 4, 12)  # noisy readings: where the rANS stage wins

    seg = tmp_path / "raw" / "seg+00000000000000000000.fps"
    with _store(tmp_path, auto_maintain=False, compact_recode=True) as st:
        st.append("raw", ids, ts, vals)
        st.flush()
        sealed_tags, sealed_bytes = _tags_and_bytes(seg)
        assert st.compact(now_ms=H) == 1  # a finished hour without partials is recoded too
        tags, compacted = _tags_and_bytes(seg)
        assert codec.C_DELTA in sealed_tags and codec.C_DELTA_ANS not in sealed_tags
        assert codec.C_DELTA_ANS in tags and compacted < sealed_bytes
        r = st.read("raw", ids, 0, 2 * H)
        for j in range(4):
            assert np.array_equal(_bits(r.values[r.offsets[j]:r.offsets[j + 1]]),
                                  _bits(vals[:, j]))
        _, _, recs = scan_segment(seg, truncate=False)
        assert [r.n for r in recs] == [480] * 7 + [240]  # 30 chunks of 120, four a record
    with _store(tmp_path) as st:  # and from the saved index after a reopen with the flag off
        r = st.read("raw", ids, 0, 2 * H)
        assert np.array_equal(_bits(r.values), _bits(vals.T.ravel()))


def test_compaction_joins_chunks_without_changing_which_write_wins(tmp_path: Path) -> None:
    ids = np.array([3, 4], np.int64)
    ts, vals = _group(0, 3600, 2, 13)
    again = vals + 1.0  # a replay of minutes 10-20 with other values: the later write wins
    with _store(tmp_path, auto_maintain=False, compact_recode=True) as st:
        st.append("raw", ids, ts, vals)
        st.append("raw", ids, ts[600:1200], again[600:1200])
        st.append("raw", ids, ts[1200:1260], vals[1200:1260])  # and back to the first values
        st.flush()
        want = st.read("raw", ids, 0, H)
        assert st.compact(now_ms=H) == 1
        got = st.read("raw", ids, 0, H)
        assert np.array_equal(got.ts, want.ts)
        assert np.array_equal(_bits(got.values), _bits(want.values))
        expect = vals.copy()
        expect[600:1200] = again[600:1200]
        assert np.array_equal(_bits(got.values[3600:7200]), _bits(expect[:, 1]))


def test_flush_maintains_by_event_time_and_reopen_uses_saved_index(tmp_path: Path) -> None:
    ids = np.arange(40, 48, dtype=np.int64)
    ts, vals = _group(0, 6 * 3600, 8, 6)  # six hours: raw retention is four
    with _store(tmp_path) as st:
        for a in range(0, ts.size, 300):
            st.append("raw", ids, ts[a:a + 300], vals[a:a + 300])
            st.flush()  # flush also compacts finished hours and drops expired ones
        segs = sorted(p.name for p in (tmp_path / "raw").glob("*.fps"))
        assert len(segs) == 5  # hour 0 is past retention at 6 h
        idx = sorted((tmp_path / "raw").glob("*.idx"))
        assert len(idx) == 4  # every finished hour; the current one is still written
        live = st.read("raw", ids, 0, 7 * H)
    with _store(tmp_path) as st:
        again = st.read("raw", ids, 0, 7 * H)
        assert np.array_equal(again.ts, live.ts)
        assert np.array_equal(_bits(again.values), _bits(live.values))
        assert again.counts.tolist() == [5 * 3600] * 8
    # a damaged index is ignored (the segment is scanned instead), never trusted
    victim = idx[0]
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    with _store(tmp_path) as st:
        r = st.read("raw", ids, 0, 7 * H)
        assert np.array_equal(_bits(r.values), _bits(live.values))


def test_saved_index_describes_the_segment_exactly(tmp_path: Path) -> None:
    from aggregator.store.index import load_index
    from aggregator.store.segment import scan_segment

    ids = np.arange(3, dtype=np.int64)
    ts, vals = _group(0, 2 * 3600, 3, 8)
    with _store(tmp_path) as st:
        st.append("raw", ids, ts, vals)
        st.flush()
    seg = tmp_path / "raw" / "seg+00000000000000000000.fps"
    saved = load_index(seg.with_suffix(".idx"), seg.stat().st_size)
    assert saved is not None
    _, _, scanned = scan_segment(seg, truncate=False)
    assert [(s[0].tolist(), s[1], s[2], s[3], s[4], s[5], s[6]) for s in saved] == [
        (r.series_ids.tolist(), r.kind, r.t_min, r.t_max, r.chunk_key, r.offset, r.length)
        for r in scanned]
    assert load_index(seg.with_suffix(".idx"), seg.stat().st_size + 1) is None


def test_late_sample_into_a_compacted_segment_survives_reopen(tmp_path: Path) -> None:
    ids = np.array([1, 2], np.int64)
    ts, vals = _group(0, 2 * 3600, 2, 9)
    with _store(tmp_path) as st:
        st.append("raw", ids, ts, vals)
        st.flush()  # hour 0 is finished: compacted and indexed
        assert (tmp_path / "raw" / "seg+00000000000000000000.idx").exists()
        st.append("raw", ids, [1_800_500], [[7.5, 8.5]])  # late, into hour 0
    with _store(tmp_path) as st:  # the saved index no longer matches: the file is scanned
        r = st.read("raw", ids, 1_800_500, 1_800_501)
        assert r.values.tolist() == [7.5, 8.5]
        assert st.read("raw", ids, 0, 3 * H).counts.tolist() == [2 * 3600 + 1] * 2


def test_leftovers_of_a_compaction_cut_short_are_removed(tmp_path: Path) -> None:
    ids = np.array([1, 2], np.int64)
    ts, vals = _group(0, 2 * 3600, 2, 10)
    with _store(tmp_path, auto_maintain=False) as st:
        for a in range(0, ts.size, 500):
            st.append("raw", ids, ts[a:a + 500], vals[a:a + 500])
            st.flush()
    raw = tmp_path / "raw"
    seg = raw / "seg+00000000000000000000.fps"
    # as if killed while rewriting: a half-written copy and a half-written index
    (raw / "seg+00000000000000000000.tmp").write_bytes(seg.read_bytes()[:1000])
    (raw / "seg+00000000000000000000.idx.tmp").write_bytes(b"FPIDX001junk")
    with _store(tmp_path) as st:
        assert sorted(p.name for p in raw.iterdir() if p.suffix == ".tmp") == []
        r = st.read("raw", ids, 0, 3 * H)
        assert np.array_equal(_bits(r.values[:r.offsets[1]]), _bits(vals[:, 0]))


def test_a_file_that_is_not_a_segment_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "raw").mkdir()
    (tmp_path / "raw" / "seg+00000000000000000000.fps").write_bytes(b"not a segment at all" * 3)
    with pytest.raises(StoreError, match="bad file header"):
        _store(tmp_path)
    (tmp_path / "raw" / "seg+00000000000000000000.fps").unlink()
    with _store(tmp_path) as st:  # the failed open released its lock
        assert st.series_ids("raw").size == 0


def test_open_chunks_hold_only_what_is_in_them_and_coarse_tiers_seal_sooner(
        tmp_path: Path) -> None:
    """The head's memory follows its contents (an open chunk starts at 8 rows and doubles),
    and a tier's own chunk size seals it sooner, e.g. a day of the 1 h tier."""
    tiers = (*TIERS, TierSpec("1h", H, 400 * 24 * H, 30 * 24 * H, chunk_samples=24))
    ids = np.arange(1000, dtype=np.int64)
    with SeriesStore(StoreConfig(path=str(tmp_path), tiers=tiers, fsync=False)) as store:
        for h in range(3):
            store.append("1h", ids, [h * H], np.full((1, ids.size), float(h)))
        (group,) = store._head["1h"].values()
        assert group.values.shape == (8, ids.size)  # not 120 x 1000 floats for 3 points
        for h in range(3, 30):
            store.append("1h", ids, [h * H], np.full((1, ids.size), float(h)))
        assert group.n == 30 - 24 and group.values.shape[0] <= 24  # one day sealed
        got = store.read("1h", ids[:2], 0, 30 * H)
        assert np.array_equal(got.series(1)[1], np.arange(30.0))


def test_groups_arriving_between_reads_are_looked_up_as_if_registered_at_once() -> None:
    """The registry merges groups that arrive between reads into its sorted table instead of
    sorting everything again; a lookup must answer exactly what one registry that saw every
    group before its first lookup answers (a series in several groups: oldest group first)."""
    from aggregator.store.index import GroupRegistry

    rng = np.random.default_rng(5)
    groups = [np.unique(rng.integers(0, 300, int(rng.integers(1, 40)))) for _ in range(60)]
    rng.shuffle(groups)  # series ids in no group order
    wanted = np.unique(rng.integers(0, 320, 200))
    growing = GroupRegistry()
    recent_seen = 0
    for i, ids in enumerate(groups):
        assert growing.gid(ids) == i
        if (i >= 30 and i % 2 == 0) or i == len(groups) - 1:  # reads between arrivals
            got = growing.lookup(wanted)
            recent_seen += growing._recent[0].size > 0  # answered from two tables
            at_once = GroupRegistry()
            for seen in groups[:i + 1]:
                at_once.gid(seen)
            for mine, want in zip(got, at_once.lookup(wanted), strict=True):
                np.testing.assert_array_equal(mine, want)
    assert recent_seen >= 3  # the recent groups' table was read, not only the main one
    np.testing.assert_array_equal(growing.all_series(), np.unique(np.concatenate(groups)))
    w, gid, col = growing.lookup(wanted)
    for i, g, c in zip(w.tolist(), gid.tolist(), col.tolist(), strict=True):
        assert groups[g][c] == wanted[i]
    assert growing.gid(groups[10]) == 10  # the same series set is the same group


def test_a_flush_gives_each_partial_record_its_points_time_range(tmp_path: Path) -> None:
    """Reads pass over records by their time range, so a partial record's must be the min
    and max of its own points (the flush finds them for all groups at once)."""
    wide, narrow = np.array([1, 2], np.int64), np.array([3], np.int64)
    with _store(tmp_path, auto_maintain=False) as st:
        st.append("raw", wide, np.array([1_000, 5_000, 9_000]), np.ones((3, 2)))
        st.append("raw", narrow, np.array([4_000]), np.ones((1, 1)))
        st.flush()
        st.append("raw", wide, np.array([11_000, 12_000]), np.ones((2, 2)))
        st.flush()
        records = st._segments["raw"][0].records
        got = sorted((int(records.gid[i]), int(records.t_min[i]), int(records.t_max[i]))
                     for i in range(records.n))
        assert got == [(0, 1_000, 9_000), (0, 11_000, 12_000), (1, 4_000, 4_000)]
        r = st.read("raw", wide, 10_000, 20_000)
        assert r.ts[r.offsets[0]:r.offsets[1]].tolist() == [11_000, 12_000]

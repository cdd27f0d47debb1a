"""The row/cluster stage: exact merges of rack rollups, completeness, duplicates, late data."""

from __future__ import annotations

import pytest
from test_aggregator_support import POWER, TEMP, make_fleet, open_store, process_all

from aggregator.rack_stage import RackStage
from aggregator.row_stage import RowStage
from aggregator.series_index import EntityIndex
from aggregator.series_layout import series_ids
from fleetpulse.transport.base import Message
from schemas.rollup import encode_rollup


@pytest.fixture
def stages(tmp_path):
    store = open_store(tmp_path / "store")
    index = EntityIndex(tmp_path / "entities.jsonl")
    yield (RackStage(store, index, topic="s", lateness_ms=5000),
           # settle 0: these tests are about closing on the children's progress alone
           RowStage(store, index, topic="r", lateness_ms=60_000, settle_ms=0), store, index)
    index.close()
    store.close()


def _as_messages(frames, start_offset=0):
    return [Message("r", 0, start_offset + i, fr.row.encode(), encode_rollup(fr), 0)
            for i, fr in enumerate(frames)]


def _read(store, index, key, metric, agg):
    r = store.read("10s", series_ids([index.get(key)], [metric], agg)[0], 0, 1 << 62)
    return dict(zip(r.ts.tolist(), r.values.tolist(), strict=True))


def test_row_and_cluster_merge_their_children_exactly(stages):
    rack, row, store, index = stages
    fl = make_fleet(n_racks=4, nodes_per_rack=2, gpus=2, seconds=80, partitions=2, rows=2)
    _, rollups = process_all(rack, fl.messages)
    _, row_frames = row.process(_as_messages(rollups))
    assert row_frames and {f.level for f in row_frames} == {"row"}
    _, none = row.process(_as_messages(row_frames, 10_000))
    assert none == []  # cluster windows are not published further
    racks = sorted({(n.row, n.rack) for n in fl.nodes})
    for rw in ("row0", "row1"):
        mine = [rk for r, rk in racks if r == rw]
        got = _read(store, index, ("row", "c1", rw, "", "", ""), TEMP, "sum")
        assert got
        for t, v in got.items():
            parts = [_read(store, index, ("rack", "c1", rw, rk, "", ""), TEMP, "sum")[t]
                     for rk in mine]
            acc = parts[0]
            for p in parts[1:]:
                acc += p
            assert v == acc  # added in name order, bit for bit
    cmax = _read(store, index, ("cluster", "c1", "", "", "", ""), POWER, "max")
    assert cmax
    for t, v in cmax.items():
        assert v == max(_read(store, index, ("row", "c1", r, "", "", ""), POWER, "max")[t]
                        for r in ("row0", "row1"))


def test_duplicates_replace_and_windows_wait_for_every_rack(stages):
    rack, row, store, index = stages
    fl = make_fleet(n_racks=2, nodes_per_rack=1, gpus=2, seconds=60, partitions=2, rows=1)
    _, rollups = process_all(rack, fl.messages)
    by_rack = {r: [f for f in rollups if f.rack == r] for r in ("rack00", "rack01")}
    # both racks known, rack00 far ahead, rack01 stalled: nothing closes (within the
    # 60 s lateness) because rack01 has not moved past any window yet
    row.process(_as_messages(by_rack["rack01"][:1] + by_rack["rack00"]))
    assert row.windows_closed == 0
    # rack01 catches up, and one of its frames arrives twice
    r1 = by_rack["rack01"]
    msgs = _as_messages(r1[1:2] + r1[1:2] + r1[2:], 100)
    row.process(msgs)
    closed = row.windows_closed
    assert closed == len(by_rack["rack01"]) - 1  # the newest window waits for a later one
    cnt = _read(store, index, ("row", "c1", "row0", "", "", ""), TEMP, "count")
    first = r1[1].start_ms
    want = sum(f.aggs[0, list(f.metric_ids).index(TEMP)] for f in rollups
               if f.start_ms == first)
    assert cnt[first] == want  # the duplicate replaced, not added
    # a frame for a window that already closed is late, counted
    assert row.late == 0
    row.process(_as_messages(by_rack["rack00"][:1], 500))
    assert row.late == 1


@pytest.mark.parametrize("settle_ms", [0, 60_000])
def test_a_rack_first_seen_late_counts_within_the_settle(tmp_path, settle_ms):
    """rack01's first rollup arrives after rack00 reached its fifth window (an instance
    slower to start). Within the settle it is still counted in the first windows; without
    one those windows closed on rack00 alone and rack01 is late for them."""
    store = open_store(tmp_path / "store")
    index = EntityIndex(tmp_path / "entities.jsonl")
    try:
        fl = make_fleet(n_racks=2, nodes_per_rack=1, gpus=2, seconds=120, partitions=2, rows=1)
        _, rollups = process_all(RackStage(store, index, topic="s", lateness_ms=5000),
                                  fl.messages)
        r0 = [f for f in rollups if f.rack == "rack00"]
        r1 = [f for f in rollups if f.rack == "rack01"]
        row = RowStage(store, index, topic="r", lateness_ms=300_000, settle_ms=settle_ms)
        # rack00 reports once alone, then rack01 joins; both then advance window by window
        row.process(_as_messages(r0[:1]))
        row.process(_as_messages(r0[1:5] + r1[:5], 10))
        row.process(_as_messages([f for pair in zip(r0[5:], r1[5:], strict=True)
                                  for f in pair], 100))
        cnt = _read(store, index, ("row", "c1", "row0", "", "", ""), TEMP, "count")
        first = r0[0].start_ms
        both = sum(f.aggs[0, list(f.metric_ids).index(TEMP)] for f in r0[:1] + r1[:1])
        if settle_ms:
            assert row.late == 0
            assert cnt[first] == both
            assert len(cnt) == len(r0) - 1  # every window but the newest closed
        else:
            assert row.late == 4  # windows 0-30 s closed on rack00 alone (it was at 40 s)
            assert cnt[first] < both
    finally:
        index.close()
        store.close()

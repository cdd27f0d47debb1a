"""RackStage against a plain numpy reference: every level, aggregate, lateness, dedup, replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_aggregator_support import (
    ENERGY,
    POWER,
    PSTATE,
    T0,
    TEMP,
    make_fleet,
    open_store,
    process_all,
)

from aggregator.checkpoint import (
    PartitionCheckpoint,
    checkpoint_bytes,
    checkpoint_from_bytes,
)
from aggregator.rack_stage import RackStage
from aggregator.series_index import EntityIndex
from aggregator.series_layout import series_ids
from aggregator.sketch import RELATIVE_ACCURACY
from fleetpulse.transport.base import Message
from schemas.rollup import decode_rollup, encode_rollup

LATE = 5000
_OPEN: list = []

def save_checkpoint(state: Path, ckpt: PartitionCheckpoint) -> None:
    """What the changelog holds for a partition, kept as a file for these in-process runs."""
    state.mkdir(parents=True, exist_ok=True)
    (state / f"{ckpt.topic}-{ckpt.partition}").write_bytes(checkpoint_bytes(ckpt))


def load_checkpoint(state: Path, topic: str, partition: int) -> PartitionCheckpoint | None:
    path = state / f"{topic}-{partition}"
    return checkpoint_from_bytes(path.read_bytes()) if path.exists() else None



@pytest.fixture(autouse=True)
def _close_everything():
    yield
    while _OPEN:
        obj = _OPEN.pop()
        obj.close()


def _stage(tmp_path, name="a"):
    store = open_store(tmp_path / name / "store")
    index = EntityIndex(tmp_path / name / "entities.jsonl")
    _OPEN.extend([store, index])
    return RackStage(store, index, topic="t.samples", lateness_ms=LATE), store, index


def _read(store, index, key, metric, agg, tier="10s"):
    eid = index.get(key)
    assert eid is not None, key
    r = store.read(tier, series_ids([eid], [metric], agg)[0], 0, 1 << 62)
    return r.ts, r.values


def _windows(ts, width=10_000):
    return (ts - ts % width)


def test_gpu_node_rack_rollups_match_numpy(tmp_path):
    fl = make_fleet(seconds=60)
    st, store, index = _stage(tmp_path)
    dead, rollups = process_all(st, fl.messages)
    assert dead == []
    # windows close once the watermark (last ts) passes end + lateness
    closed = [w for w in np.unique(_windows(fl.ts)) if w + 10_000 + LATE <= fl.ts[-1]]
    assert len(closed) == 5
    node0 = fl.nodes[0]
    v = fl.values[0]  # [T, G, M] of node 0
    gkey = ("gpu", "c1", node0.row, node0.rack, node0.node, "1")
    ts, got = _read(store, index, gkey, TEMP, "sum")
    assert ts.tolist() == closed
    for i, w in enumerate(closed):
        sel = (fl.ts >= w) & (fl.ts < w + 10_000)
        col = v[sel, 1, 0]
        assert got[i] == np.nansum(col)
        assert _read(store, index, gkey, TEMP, "count")[1][i] == np.count_nonzero(~np.isnan(col))
        assert _read(store, index, gkey, TEMP, "min")[1][i] == np.nanmin(col)
        assert _read(store, index, gkey, TEMP, "max")[1][i] == np.nanmax(col)
        assert _read(store, index, gkey, TEMP, "last")[1][i] == col[~np.isnan(col)][-1]
        assert _read(store, index, gkey, TEMP, "sumsq")[1][i] == pytest.approx(
            np.nansum(col * col))
    # rack level: all GPUs of both nodes of rack00, every closed window
    rack_nodes = [i for i, n in enumerate(fl.nodes) if n.rack == node0.rack]
    rkey = ("rack", "c1", node0.row, node0.rack, "", "")
    for metric_i, metric in ((0, TEMP), (1, POWER), (3, PSTATE)):
        agg_max = _read(store, index, rkey, metric, "max")[1]
        cnt = _read(store, index, rkey, metric, "count")[1]
        for i, w in enumerate(closed):
            sel = (fl.ts >= w) & (fl.ts < w + 10_000)
            block = np.concatenate([fl.values[n][sel, :, metric_i].ravel() for n in rack_nodes])
            assert agg_max[i] == np.nanmax(block)
            assert cnt[i] == np.count_nonzero(~np.isnan(block))
    # node level sum equals the sum of its GPUs' sums, added in name order
    nkey = ("node", "c1", node0.row, node0.rack, node0.node, "")
    nsum = _read(store, index, nkey, POWER, "sum")[1]
    gsums = [_read(store, index, ("gpu", "c1", node0.row, node0.rack, node0.node, str(g)),
                   POWER, "sum")[1] for g in range(4)]
    acc = gsums[0].copy()
    for g in gsums[1:]:
        acc = acc + g
    assert np.array_equal(nsum, acc)
    # one rack rollup per rack and closed window, and they survive the wire format
    assert len(rollups) == 2 * len(closed)
    again = decode_rollup(encode_rollup(rollups[0]))
    assert again.key == rollups[0].key and np.array_equal(again.aggs, rollups[0].aggs,
                                                           equal_nan=True)


def test_counter_increase_handles_resets(tmp_path):
    fl = make_fleet(seconds=60)
    st, store, index = _stage(tmp_path)
    process_all(st, fl.messages)
    node0 = fl.nodes[0]  # its energy counter resets at t=30 s
    for g in range(4):
        e = fl.values[0][:, g, 2]
        ok = ~np.isnan(e)
        tsv, ev = fl.ts[ok], e[ok]
        d = np.diff(ev)
        step = np.where(d >= 0, d, ev[1:])  # a reset counts the new value
        gkey = ("gpu", "c1", node0.row, node0.rack, node0.node, str(g))
        wts, inc = _read(store, index, gkey, ENERGY, "increase")
        for w, got in zip(wts.tolist(), inc.tolist(), strict=True):
            sel = (tsv[1:] >= w) & (tsv[1:] < w + 10_000)
            assert got == pytest.approx(step[sel].sum(), abs=1e-9)


def test_rack_sketch_quantile_within_error_bound(tmp_path):
    fl = make_fleet(seconds=60, nodes_per_rack=3, gpus=8)
    st, store, index = _stage(tmp_path)
    process_all(st, fl.messages)
    from aggregator.query_engine import QueryEngine

    qe = QueryEngine(store, index)
    node0 = fl.nodes[0]
    res = qe.query_range(f'fleetpulse_gpu_power_usage_watts{{level="rack",rack="{node0.rack}",'
                         'agg="p95"}', T0 + 10_000, T0 + 50_000, 10_000)
    assert len(res.labels) == 1
    rack_nodes = [i for i, n in enumerate(fl.nodes) if n.rack == node0.rack]
    for i, t in enumerate(range(T0 + 10_000, T0 + 50_001, 10_000)):
        sel = (fl.ts >= t - 10_000) & (fl.ts < t)
        block = np.concatenate([fl.values[n][sel, :, 1].ravel() for n in rack_nodes])
        block = np.sort(block[~np.isnan(block)])
        true = block[int(np.floor(0.95 * (block.size - 1)))]
        assert abs(res.values[0, i] - true) <= RELATIVE_ACCURACY * abs(true) + 1e-12


def test_late_duplicate_and_malformed_input(tmp_path):
    fl = make_fleet(seconds=40)
    st, _store, _index = _stage(tmp_path)
    msgs = list(fl.messages)
    n = len(msgs)
    dup = msgs[3]
    bad = Message("t.samples", 0, n + 1, b"k", b"FPSF\x01garbage", 0)
    late = msgs[0]  # replayed at a new offset long after its window closed
    extra = [Message(dup.topic, dup.partition, 10_000, dup.key, dup.value, 0),
             bad,
             Message(late.topic, late.partition, 10_001, late.key, late.value, 0)]
    dead, _ = st.process(msgs + extra)
    assert [reason.startswith("sample frame:") for _, reason in dead] == [True]
    assert st.stats.decode_errors == 1
    assert st.stats.duplicates == 2  # same (agent, seq) at a later offset, twice
    # a frame with a *new* seq but old timestamps is late, counted per value
    from schemas.frame import SampleFrame, decode_frame, encode_frame

    f0 = decode_frame(late.value)
    old = SampleFrame(f0.identity, f0.agent, 10_000, f0.metric_ids, f0.gpus, f0.uuids, f0.ts,
                      f0.values.copy())
    st.process([Message(late.topic, late.partition, 10_002, late.key, encode_frame(old), 0)])
    assert st.stats.late_samples == np.count_nonzero(~np.isnan(f0.values))


def _run_all(tmp_path, name, fl):
    st, store, index = _stage(tmp_path, name)
    process_all(st, fl.messages)
    return st, store, index


def _dump(store, index, tier="10s"):
    out = {}
    for eid, key in enumerate(index.keys):
        for metric in (TEMP, POWER, ENERGY, PSTATE):
            for agg in ("count", "sum", "min", "max", "last", "increase", "sketch"):
                r = store.read(tier, series_ids([eid], [metric], agg)[0], 0, 1 << 62)
                if r.ts.size:
                    out[(key, metric, agg)] = (r.ts.tobytes(), r.values.tobytes())
    return out


def _checkpoint_all(tmp_path, st, store, index):
    """A durable cycle: the index and the store flushed, then every partition's checkpoint."""
    index.flush()
    store.flush()
    for p in list(st.parts):
        save_checkpoint(tmp_path / "state", st.checkpoint(p))


def _restart(tmp_path, name, store, index):
    """The process gone (nothing more flushed) and a new stage on the same directories,
    assigned both partitions from their checkpoints."""
    _OPEN.remove(store)
    _OPEN.remove(index)
    store.close()
    index.close()
    st2, store2, index2 = _stage(tmp_path, name)
    for p in (0, 1):
        ck = load_checkpoint(tmp_path / "state", "t.samples", p)
        assert ck is not None
        start = st2.assign(p, ck)
        assert start <= ck.position
    return st2, store2, index2


def test_replay_from_checkpoint_is_bit_identical(tmp_path):
    """Crash after a checkpoint: replaying from the resume offset rebuilds the same bits."""
    fl = make_fleet(seconds=90, ticks_per_frame=1)
    _ref_stage, ref_store, ref_index = _run_all(tmp_path, "ref", fl)

    st, store, index = _stage(tmp_path, "crash")
    cut = len(fl.messages) * 2 // 3
    st.process(fl.messages[:cut // 2])
    st.process(fl.messages[cut // 2:cut])
    _checkpoint_all(tmp_path, st, store, index)
    # more work after the checkpoint that is lost with the process (not flushed)
    st.process(fl.messages[cut:cut + 10])
    # restart: new stage, same directories, replay from each resume offset
    st2, store2, index2 = _restart(tmp_path, "crash", store, index)
    by_part = {p: [m for m in fl.messages if m.partition == p] for p in (0, 1)}
    replay = [m for p in (0, 1) for m in by_part[p] if m.offset >= st2.parts[p].position]
    replay.sort(key=lambda m: fl.messages.index(m))
    st2.process(replay)
    assert st2.stats.replayed > 0
    assert _dump(store2, index2) == _dump(ref_store, ref_index)
    assert _dump(store2, index2, "1m") == _dump(ref_store, ref_index, "1m")
    assert st2.stats.duplicates == 0


def test_infinities_and_repeated_gpus_do_not_crash(tmp_path):
    from schemas.frame import SampleFrame, decode_frame, encode_frame

    fl = make_fleet(seconds=30)
    st, store, index = _stage(tmp_path)
    f0 = decode_frame(fl.messages[0].value)
    vals = f0.values.copy()
    vals[0, 0, 0] = np.inf
    vals[0, 1, 0] = -np.inf
    hot = SampleFrame(f0.identity, "other-agent", 0, f0.metric_ids, f0.gpus, f0.uuids, f0.ts,
                      vals)
    twice = SampleFrame(f0.identity, "third-agent", 0, f0.metric_ids,
                        np.asarray([0, 0, 1, 2], np.int32), f0.uuids, f0.ts, f0.values.copy())
    m = fl.messages[0]
    extra = [Message(m.topic, m.partition, 0, m.key, encode_frame(fr), 0) for fr in (hot, twice)]
    msgs, next_offset = [], {}
    for msg in fl.messages[:1] + extra + fl.messages[1:]:  # renumber offsets per partition
        off = next_offset.get(msg.partition, 0)
        next_offset[msg.partition] = off + 1
        msgs.append(Message(msg.topic, msg.partition, off, msg.key, msg.value, 0))
    dead, _ = st.process(msgs)
    assert len(dead) == 1  # the codec or the topology refuses a GPU listed twice
    assert "unique" in dead[0][1] or "GPU index twice" in dead[0][1]
    key = ("gpu", "c1", fl.nodes[0].row, fl.nodes[0].rack, fl.nodes[0].node, "0")
    assert _read(store, index, key, TEMP, "max")[1][0] == np.inf


@pytest.mark.parametrize("closed_first", [0, 1])
def test_replay_rebuilds_a_window_that_was_due_but_left_open(tmp_path, monkeypatch,
                                                             closed_first):
    """The close budget ran out before a batch's due windows were closed, and the
    checkpoint taken then is the one a new owner (a rebalance, a crash) starts from: the
    replay must still close those windows, with the bits one undisturbed stage wrote.
    (The replayed frames are older than the checkpoint's watermark; judged against it,
    their window looked late and was lost without a count.) Mid-run, and at the very
    first windows, where kernels still compile and a close is slowest (a multi-instance
    run once lost a partition's first 10 s window this way when an instance joined)."""
    import aggregator.rack_stage as rack_stage

    fl = make_fleet(seconds=90, ticks_per_frame=1)
    _ref_stage, ref_store, ref_index = _run_all(tmp_path, "ref", fl)

    st, store, index = _stage(tmp_path, "moved")
    cut = len(fl.messages) // (2 if closed_first else 4)
    if closed_first:
        st.process(fl.messages[:cut - 40])
        assert st.stats.windows_closed > 0
    monkeypatch.setattr(rack_stage, "CLOSE_BUDGET_S", -1.0)  # no time left to close
    st.process(fl.messages[cut - 40 if closed_first else 0:cut])
    assert st.pending_close()
    _checkpoint_all(tmp_path, st, store, index)
    monkeypatch.setattr(rack_stage, "CLOSE_BUDGET_S", 0.5)
    st2, store2, index2 = _restart(tmp_path, "moved", store, index)
    replay = [m for m in fl.messages if m.offset >= st2.parts[m.partition].position]
    st2.process(replay)
    assert st2.stats.replayed > 0
    assert _dump(store2, index2) == _dump(ref_store, ref_index)
    assert _dump(store2, index2, "1m") == _dump(ref_store, ref_index, "1m")

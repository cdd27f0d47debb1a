"""A kill -9 at every step of the durability cycle, in process, then a replay: same bits.

The service's cycle (aggregator/service.py) is: fold a batch into the windows (and close
what is due), flush the entity index, flush the store, write each partition's checkpoint,
commit the offsets. A crash can land between any two of those steps, and during a replay
too. Here the service's steps are driven by hand against a real store and index on disk;
a "crash" drops the objects without flushing them (what ``os.write`` handed to the OS
survives, what sits in the process's memory is lost -- exactly what kill -9 does), and the
restart resumes from the *committed* offsets, not the checkpoints', as a real consumer
would. The input has the awkward parts of real traffic: redelivered frames (same agent and
seq at a later offset, some soon after, some much later), frames spanning two windows and
a counter reset. Every stored point of the raw, 10 s and 1 min tiers must equal an
uninterrupted run's, bit for bit (sketch bucket counts included).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from test_aggregator_support import T0, make_fleet, stored_points

from aggregator.checkpoint import (
    PartitionCheckpoint,
    checkpoint_bytes,
    checkpoint_from_bytes,
)
from aggregator.rack_stage import RackStage, StageStats
from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig
from fleetpulse.transport.base import Message

LATE = 5000
TOPIC = "t.samples"
BATCH = 7
CYCLE = 3
"""A durability cycle after every CYCLE batches, as the service does every commit interval."""

def save_checkpoint(state: Path, ckpt: PartitionCheckpoint) -> None:
    """What the changelog holds for a partition, kept as a file for these in-process runs."""
    state.mkdir(parents=True, exist_ok=True)
    (state / f"{ckpt.topic}-{ckpt.partition}").write_bytes(checkpoint_bytes(ckpt))


def load_checkpoint(state: Path, topic: str, partition: int) -> PartitionCheckpoint | None:
    path = state / f"{topic}-{partition}"
    return checkpoint_from_bytes(path.read_bytes()) if path.exists() else None



def _renumber(order: list[Message]) -> list[Message]:
    out, nxt = [], {}
    for m in order:
        off = nxt.get(m.partition, 0)
        nxt[m.partition] = off + 1
        out.append(Message(TOPIC, m.partition, off, m.key, m.value, m.timestamp_ms))
    return out


def _messages() -> list[Message]:
    """The fleet's frames plus redeliveries, renumbered into per-partition offsets."""
    fl = make_fleet(n_racks=3, seconds=80, ticks_per_frame=3, partitions=2)
    order: list[Message] = []
    for i, m in enumerate(fl.messages):
        order.append(m)
        if i % 11 == 5:
            order.append(fl.messages[i - 4])  # a near redelivery
        if i % 37 == 36:
            order.append(fl.messages[i - 30])  # a far one (the original's window is closed)
    return _renumber(order)


HOUR = 3_600_000
LONG_START = (T0 // HOUR + 1) * HOUR - 40 * 60_000
"""The long fleet starts 40 minutes before an hour boundary and runs 75 minutes."""
GAP = (LONG_START + 20 * 60_000 + 30_000, LONG_START + 23 * 60_000)
"""No data in this range: the 1 min windows around it close late or not at all."""


def _long_messages() -> list[Message]:
    """75 minutes across an hour boundary, with a 2.5-minute silence, for the coarse tiers."""
    fl = make_fleet(n_racks=2, nodes_per_rack=1, gpus=2, seconds=75 * 60, ticks_per_frame=10,
                    partitions=2, start_ms=LONG_START)
    return _renumber([m for m in fl.messages
                      if not GAP[0] <= m.timestamp_ms < GAP[1]])


class _Crash(Exception):
    pass


def _open_store(path: Path) -> SeriesStore:
    """Tiny chunks: records reach the files at once, long before a flush (the worst case
    for a crash: the store's files run ahead of the index and the checkpoint)."""
    return SeriesStore(StoreConfig(path=str(path), fsync=False, chunk_samples=2))


class _Instance:
    """One aggregator lifetime: a stage over a store and an index in ``root``."""

    def __init__(self, root: Path, state: Path) -> None:
        self.store = _open_store(root / "store")
        self.index = EntityIndex(root / "entities.jsonl")
        self.stage = RackStage(self.store, self.index, topic=TOPIC, lateness_ms=LATE)
        self.state = state

    def crash(self) -> None:
        """What kill -9 leaves: bytes written to files stay, buffered state is gone."""
        for segs in self.store._segments.values():
            for seg in segs.values():
                seg.close_writer()
        os.close(self.store._lock_fd)
        self.store._closed = True
        appender = self.index._log
        if appender is not None and appender._fd is not None:
            os.close(appender._fd)  # lines not yet handed to the OS are gone with the process
            appender._fd = None

    def close(self) -> None:
        self.store.close()
        self.index.close()


def _run(root: Path, state: Path, msgs: list[Message], committed: dict[int, int],
         crash_at: tuple[int, str] | None, flip: bool = False,
         stats: list[StageStats] | None = None,
         after_batch: Callable[[RackStage], None] | None = None) -> bool:
    """Consume from ``committed`` to the end; crash at (cycle, step). True when it finished.

    ``committed`` is the group's committed offsets, updated in place by each commit.
    ``flip``: interleave the partitions the other way round (highest first), as a
    restarted consumer may, so that entities are met, and numbered, in another order.
    """
    inst = _Instance(root, state)
    st = inst.stage
    if stats is not None:
        stats.append(st.stats)
    for p in sorted({m.partition for m in msgs}):
        st.assign(p, load_checkpoint(state, TOPIC, p))
    todo = [m for m in msgs if m.offset >= committed.get(m.partition, 0)]
    if flip:
        todo.sort(key=lambda m: (m.offset // 4, -m.partition))
    cycle = 0

    def step(name: str) -> None:
        if crash_at == (cycle, name):
            inst.crash()
            raise _Crash

    def durable() -> None:
        step("folded")
        inst.index.flush()
        step("index flushed")
        inst.store.flush()
        step("store flushed")
        offsets = {}
        for i, p in enumerate(sorted(st.parts)):
            ckpt = st.checkpoint(p)
            save_checkpoint(state, ckpt)
            offsets[p] = ckpt.resume_offset
            if i == 0:
                step("one checkpoint")
        step("checkpoints")
        committed.update(offsets)
        step("committed")

    try:
        for b in range(0, len(todo), BATCH):
            st.process(todo[b:b + BATCH])
            if after_batch is not None:
                after_batch(st)
            if (b // BATCH) % CYCLE == CYCLE - 1:
                durable()
                cycle += 1
        durable()
    except _Crash:
        return False
    inst.close()
    return True


def _dump(root: Path, tiers: tuple[str, ...] = ("raw", "10s", "1m")) -> dict[tuple, bytes]:
    """Every stored point of ``tiers``, keyed by entity labels."""
    index = EntityIndex(root / "entities.jsonl")
    store = _open_store(root / "store")
    try:
        return dict(stored_points(store, index, tiers))
    finally:
        store.close()
        index.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    msgs = _messages()
    root = tmp_path_factory.mktemp("crash-ref")
    assert _run(root / "data", root / "state", msgs, {}, None)
    ref = _dump(root / "data")
    assert {k[0] for k in ref} == {"raw", "10s", "1m"}
    assert any(k[3] == "sketch" and k[1][0] == "rack" for k in ref)
    return msgs, ref


STEPS = ("folded", "index flushed", "store flushed", "one checkpoint", "checkpoints",
         "committed")


def _diff(got: dict, want: dict) -> str:
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    return (f"{len(missing)} missing {missing[:3]}, {len(extra)} extra {extra[:3]}, "
            f"{len(differ)} differ "
            f"{[(k, np.frombuffer(got[k]), np.frombuffer(want[k])) for k in differ[:3]]}")


@pytest.mark.parametrize("step", STEPS)
def test_crash_at_each_step_then_replay_is_bit_identical(reference, tmp_path, step):
    msgs, ref = reference
    committed: dict[int, int] = {}
    # Crash in the 3rd cycle, then again in the restarted instance's 2nd, then finish.
    assert not _run(tmp_path / "data", tmp_path / "state", msgs, committed, (2, step))
    assert not _run(tmp_path / "data", tmp_path / "state", msgs, committed, (1, step), True)
    assert _run(tmp_path / "data", tmp_path / "state", msgs, committed, None)
    got = _dump(tmp_path / "data")
    assert got == ref, _diff(got, ref)


def test_crash_at_every_cycle_in_turn(reference, tmp_path):
    """Crash at each cycle's every step in sequence: progress is kept, result exact."""
    msgs, ref = reference
    committed: dict[int, int] = {}
    crashes = 0
    for cycle in (0, 1):
        for step in STEPS:
            flip = crashes % 2 == 0
            if not _run(tmp_path / "data", tmp_path / "state", msgs, committed, (cycle, step),
                        flip):
                crashes += 1
    assert crashes > 10
    assert _run(tmp_path / "data", tmp_path / "state", msgs, committed, None)
    got = _dump(tmp_path / "data")
    assert got == ref, _diff(got, ref)


COARSE = ("10s", "1m", "1h")


@pytest.fixture(scope="module")
def long_reference(tmp_path_factory):
    msgs = _long_messages()
    root = tmp_path_factory.mktemp("crash-long-ref")
    assert _run(root / "data", root / "state", msgs, {}, None)
    return msgs, _dump(root / "data", COARSE), root / "data"


def _check_against_reducers(ref: dict[tuple, bytes], data: Path, hours: int) -> None:
    """Each 1 min and 1 h point is what store.downsample's reducers give over the tier below
    (bit for bit: same order of additions), and a point exists exactly where the finer
    tier has one in its window."""
    from aggregator.series_layout import AGG_NAMES, AGG_SLOTS
    from aggregator.store.downsample import reduce_buckets
    from aggregator.tiers import AGG_REDUCER

    store = _open_store(data / "store")
    try:
        checked = 0
        end = {t: max((k[4] for k in ref if k[0] == t and k[3] != "sketch"), default=0) + r
               for t, r in (("1m", 60_000), ("1h", HOUR))}
        for src, dst, res in (("10s", "1m", 60_000), ("1m", "1h", HOUR)):
            sids = np.sort(store.series_ids(dst))
            fine = store.read(src, sids, 0, 1 << 62)
            coarse = store.read(dst, sids, 0, 1 << 62)
            for i, sid in enumerate(sids.tolist()):
                agg = AGG_NAMES[sid % AGG_SLOTS]
                ts, vals = fine.series(i)
                cts, cvals = coarse.series(i)
                if agg == "sketch":  # bucket counts added per slot
                    ts, vals = ts[ts < end[dst]], vals[ts < end[dst]]
                    win = ts - ts % res
                    want = {(int(w), int(t % (10_000 if src == "10s" else 60_000))): 0.0
                            for w, t in zip(win, ts, strict=True)}
                    for w, t, v in zip(win, ts, vals, strict=True):
                        want[(int(w), int(t % (10_000 if src == "10s" else 60_000)))] += v
                    got = {(int(t - t % res), int(t % res)): v
                           for t, v in zip(cts, cvals, strict=True)}
                    assert got == want
                    continue
                # the newest coarse window is still open when the stream ends
                upto = ts < end[dst]
                ts, vals = ts[upto], vals[upto]
                offs = np.asarray([0, ts.size])
                bts, bvals, _ = reduce_buckets(ts, vals, offs, res, AGG_REDUCER[agg])
                have = ~np.isnan(cvals)
                assert np.array_equal(cts[have], bts), (dst, sid)
                assert np.array_equal(cvals[have].view(np.int64), bvals.view(np.int64))
                assert set(cts.tolist()) == set((ts - ts % res).tolist())
                checked += 1
        assert checked > 100
        assert len({k[4] for k in ref if k[0] == "1h" and k[3] != "sketch"}) == hours
    finally:
        store.close()




def test_coarse_tiers_equal_the_store_reducers_over_the_finer_tier(long_reference):
    _, ref, data = long_reference
    _check_against_reducers(ref, data, hours=1)  # crossing the boundary finished one hour


def test_entities_appearing_mid_window_join_the_coarse_windows(tmp_path):
    """A rack whose frames start 35 s into a minute grows the layout of open 1 min windows."""
    fl = make_fleet(n_racks=3, seconds=200, ticks_per_frame=5, partitions=2)
    late = fl.nodes[-1].rack_key
    msgs = _renumber([m for m in fl.messages
                      if m.key != late or m.timestamp_ms >= T0 + 95_000])
    assert _run(tmp_path / "data", tmp_path / "state", msgs, {}, None)
    ref = _dump(tmp_path / "data", COARSE)
    assert any(k[0] == "1m" and k[1][3] == fl.nodes[-1].rack for k in ref)
    _check_against_reducers(ref, tmp_path / "data", hours=0)


@pytest.mark.parametrize(("first", "second", "seed_points"),
                         [(12, 9, None), (20, 16, None), (34, 3, None), (20, 16, 50)])
def test_crashes_around_an_hour_and_a_gap_then_replay_is_bit_identical(
        long_reference, tmp_path, monkeypatch, first, second, seed_points):
    """Crashes in the gap, before the hour boundary (the successor reads 35 minutes of the
    hour back from the 1 min tier) and after it: the restarted instance reads its coarse
    windows back from the store (seeding) and ends identical. ``seed_points``: read back a
    few series at a time, as a fleet-sized partition does."""
    if seed_points is not None:
        monkeypatch.setattr("aggregator.tier_chain.SEED_POINTS", seed_points)
    msgs, ref, _ = long_reference
    committed: dict[int, int] = {}
    assert not _run(tmp_path / "data", tmp_path / "state", msgs, committed, (first, "committed"))
    assert not _run(tmp_path / "data", tmp_path / "state", msgs, committed, (second, "folded"),
                    True)
    assert _run(tmp_path / "data", tmp_path / "state", msgs, committed, None)
    got = _dump(tmp_path / "data", COARSE)
    assert got == ref, _diff(got, ref)


@pytest.mark.parametrize("step", STEPS)
def test_a_replay_counts_nothing_late(tmp_path, step):
    """Frames span windows (3 ticks each), so messages replayed after a crash carry ticks of
    windows closed before it; those were folded then and are not late now. No late data
    in this stream, so the restarted instance counts none."""
    msgs = _renumber(make_fleet(n_racks=3, seconds=80, ticks_per_frame=3,
                                partitions=2).messages)
    committed: dict[int, int] = {}
    assert not _run(tmp_path / "data", tmp_path / "state", msgs, committed, (2, step))
    stats: list[StageStats] = []
    assert _run(tmp_path / "data", tmp_path / "state", msgs, committed, None, stats=stats)
    assert stats[0].replayed > 0 and stats[0].late_samples == 0, stats[0]


def test_seeding_advances_in_slices_and_is_reported(long_reference, tmp_path, monkeypatch):
    """A few series per read and no time budget: a restarted instance whose checkpoints do
    not carry the running coarse windows (written while seeding, or before they were
    carried) reads its partly-seen coarse windows back over many batches, says so (the
    /metrics gauge's source), holds the windows that close meanwhile, and still ends bit
    for bit identical."""
    monkeypatch.setattr("aggregator.tier_chain.SEED_POINTS", 400)
    monkeypatch.setattr("aggregator.rack_stage.SEED_BUDGET_S", 0.0)
    msgs, ref, _ = long_reference
    committed: dict[int, int] = {}
    assert not _run(tmp_path / "data", tmp_path / "state", msgs, committed, (20, "committed"))
    for path in (tmp_path / "state").iterdir():
        ckpt = checkpoint_from_bytes(path.read_bytes())
        assert ckpt.extra.pop("chain") is not None  # what a restart would fold on from
        save_checkpoint(tmp_path / "state", ckpt)
    seen: list[int] = []
    assert _run(tmp_path / "data", tmp_path / "state", msgs, committed, None,
                after_batch=lambda st: seen.append(st.catching_up()))
    assert max(seen) > 0 and seen[-1] == 0
    assert sum(1 for n in seen if n) > 3  # it took several batches
    got = _dump(tmp_path / "data", COARSE)
    assert got == ref, _diff(got, ref)

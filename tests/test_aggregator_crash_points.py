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

import contextlib
import os
from pathlib import Path

import numpy as np
import pytest
from test_aggregator_support import make_fleet

from aggregator.checkpoint import load_checkpoint, save_checkpoint
from aggregator.rack_stage import RackStage
from aggregator.series_index import EntityIndex
from aggregator.series_layout import split_series_id
from aggregator.store import SeriesStore, StoreConfig
from fleetpulse.transport.base import Message

LATE = 5000
TOPIC = "t.samples"
BATCH = 7
CYCLE = 3
"""A durability cycle after every CYCLE batches, as the service does every commit interval."""


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
    out, nxt = [], {}
    for m in order:
        off = nxt.get(m.partition, 0)
        nxt[m.partition] = off + 1
        out.append(Message(TOPIC, m.partition, off, m.key, m.value, m.timestamp_ms))
    return out


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
        fh = self.index._fh
        if fh is not None:  # drop whatever the file object still buffers, as kill -9 would
            os.close(fh.fileno())
            with contextlib.suppress(OSError):
                fh.close()

    def close(self) -> None:
        self.store.close()
        self.index.close()


def _run(root: Path, state: Path, msgs: list[Message], committed: dict[int, int],
         crash_at: tuple[int, str] | None, flip: bool = False) -> bool:
    """Consume from ``committed`` to the end; crash at (cycle, step). True when it finished.

    ``committed`` is the group's committed offsets, updated in place by each commit.
    ``flip``: interleave the partitions the other way round (highest first), as a
    restarted consumer may, so that entities are met, and numbered, in another order.
    """
    inst = _Instance(root, state)
    st = inst.stage
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
            if (b // BATCH) % CYCLE == CYCLE - 1:
                durable()
                cycle += 1
        durable()
    except _Crash:
        return False
    inst.close()
    return True


def _dump(root: Path) -> dict[tuple, bytes]:
    """Every stored point of the raw, 10 s and 1 min tiers, keyed by entity labels."""
    index = EntityIndex(root / "entities.jsonl")
    store = _open_store(root / "store")
    out: dict[tuple, bytes] = {}
    try:
        for tier in ("raw", "10s", "1m"):
            sids = np.sort(store.series_ids(tier))
            r = store.read(tier, sids, 0, 1 << 62)
            for i, sid in enumerate(r.series_ids.tolist()):
                eid, metric, agg = split_series_id(sid)
                ts, vals = r.series(i)
                for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
                    out[(tier, index.keys[eid], metric, agg, t)] = np.float64(v).tobytes()
    finally:
        store.close()
        index.close()
    return out


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

"""The agent's disk spool on real files: order, restart, torn writes, bounds, policies."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.spool import DropPolicy, FsyncPolicy, Spool


def _values(spool: Spool, n: int = 10_000) -> list[bytes]:
    return [r.value for r in spool.read(n, 1 << 30)]


def _drain(spool: Spool) -> list[bytes]:
    out: list[bytes] = []
    while True:
        batch = spool.read(7)
        if not batch:
            return out
        for rec in batch:
            spool.ack(rec)
            out.append(rec.value)
        spool.commit()


def test_order_keys_and_segments(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=4096)
    for i in range(500):
        assert spool.append(None if i % 3 == 0 else f"k{i}".encode(), f"value-{i}".encode() * 5)
    assert len(list(tmp_path.glob("*.seg"))) > 3, "records must roll over into several segments"
    recs = spool.read(10_000, 1 << 30)
    assert [r.value for r in recs] == [f"value-{i}".encode() * 5 for i in range(500)]
    assert [r.key for r in recs[:4]] == [None, b"k1", b"k2", None]
    assert spool.pending_frames == 500
    for r in recs:
        spool.ack(r)
    spool.commit()
    assert spool.pending_frames == 0 and spool.stats.pending_bytes == 0
    assert not list(tmp_path.glob("*.seg")), "a drained spool deletes its segments"
    spool.close()


def test_restart_resumes_after_the_acknowledged_position(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=2048)
    for i in range(100):
        spool.append(b"k", b"%d" % i)
    recs = spool.read(40)
    for r in recs[:30]:
        spool.ack(r)
    spool.commit()
    spool.close()  # records 30..39 were read but never acknowledged: they must come back

    again = Spool(tmp_path, max_bytes=1 << 20, segment_bytes=2048)
    assert again.pending_frames == 70
    assert _drain(again) == [b"%d" % i for i in range(30, 100)]
    again.close()


def test_rewind_rereads_unacknowledged(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(10):
        spool.append(None, b"%d" % i)
    first = spool.read(6)
    spool.ack(first[0])
    spool.ack(first[1])
    spool.rewind()
    assert _values(spool) == [b"%d" % i for i in range(2, 10)]


def test_torn_tail_is_truncated_and_counted(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(20):
        spool.append(b"k", b"x%d" % i)
    spool.close()
    seg = sorted(tmp_path.glob("*.seg"))[-1]
    with open(seg, "ab") as fh:  # a crash in the middle of a write: header + half a payload
        fh.write((100).to_bytes(4, "little") + b"\0\0\0\0" + b"partial")
    size = seg.stat().st_size
    again = Spool(tmp_path, max_bytes=1 << 20)
    assert again.stats.corrupt_bytes == 15
    assert seg.stat().st_size == size - 15
    assert _values(again) == [b"x%d" % i for i in range(20)]
    again.append(b"k", b"after")  # appending after recovery works and stays readable
    assert _values(again) == [b"after"]


def test_flipped_bit_stops_at_the_bad_record(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(10):
        spool.append(None, b"record-%02d" % i)
    spool.close()
    seg = next(tmp_path.glob("*.seg"))
    data = bytearray(seg.read_bytes())
    rec_size = len(data) // 10
    data[5 * rec_size + 12] ^= 0x01  # payload byte of record 5
    seg.write_bytes(bytes(data))
    again = Spool(tmp_path, max_bytes=1 << 20)
    assert _values(again) == [b"record-%02d" % i for i in range(5)]
    assert again.stats.corrupt_bytes == 5 * rec_size


def test_drop_oldest_keeps_the_newest_and_counts(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=64 << 10, segment_bytes=16 << 10,
                  drop_policy=DropPolicy.DROP_OLDEST)
    payload = b"z" * 1000
    for i in range(200):
        assert spool.append(b"k", b"%04d" % i + payload)
    assert spool.total_bytes <= 64 << 10
    assert spool.stats.dropped_frames > 0
    kept = [int(v[:4]) for v in _values(spool)]
    assert kept == list(range(200 - len(kept), 200)), "the newest records survive, in order"
    assert spool.stats.dropped_frames + len(kept) == 200
    assert spool.pending_frames == len(kept)


def test_drop_newest_refuses_and_counts(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=64 << 10, segment_bytes=16 << 10,
                  drop_policy="drop_newest", fsync=FsyncPolicy.ALWAYS)
    results = [spool.append(None, b"%04d" % i + b"y" * 1000) for i in range(200)]
    n_ok = results.index(False)
    assert all(results[:n_ok]) and not any(results[n_ok:])
    assert spool.stats.dropped_frames == 200 - n_ok
    assert [int(v[:4]) for v in _values(spool)] == list(range(n_ok))


def test_damaged_cursor_replays_everything(tmp_path: Path) -> None:
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(5):
        spool.append(None, b"%d" % i)
    spool.ack(spool.read(2)[1])
    spool.commit()
    spool.close()
    (tmp_path / "cursor").write_bytes(b"garbage")
    again = Spool(tmp_path, max_bytes=1 << 20)
    assert _values(again) == [b"%d" % i for i in range(5)]  # at-least-once, never less


def test_bounds_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="two segments"):
        Spool(tmp_path, max_bytes=100, segment_bytes=100)
    spool = Spool(tmp_path, max_bytes=128 << 10, segment_bytes=64 << 10)
    assert not spool.append(None, os.urandom(100 << 10)), "a record bigger than the spool"
    assert spool.stats.dropped_frames == 1


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 300)),
    st.tuples(st.just("read"), st.integers(1, 9)),
    st.tuples(st.just("ack"), st.integers(0, 9)),
    st.tuples(st.just("rewind"), st.just(0)),
    st.tuples(st.just("commit"), st.just(0)),
    st.tuples(st.just("reopen"), st.just(0)),
), max_size=60))
def test_spool_matches_a_queue_model(tmp_path_factory: pytest.TempPathFactory,
                                     ops: list[tuple[str, int]]) -> None:
    """Against a plain list: order, at-least-once after reopen, pending counts, no loss."""
    path = tmp_path_factory.mktemp("model")
    spool = Spool(path, max_bytes=1 << 24, segment_bytes=1024)
    model: list[bytes] = []
    acked = committed = 0  # indexes into model
    read_pos = 0
    unacked_reads: list = []
    n = 0
    for op, arg in ops:
        if op == "append":
            value = b"%06d" % n + b"v" * arg
            n += 1
            assert spool.append(None, value)
            model.append(value)
        elif op == "read":
            recs = spool.read(arg)
            assert [r.value for r in recs] == model[read_pos:read_pos + len(recs)]
            assert len(recs) == min(arg, len(model) - read_pos)
            read_pos += len(recs)
            unacked_reads += recs
        elif op == "ack":
            for rec in unacked_reads[:arg]:
                spool.ack(rec)
                acked += 1
            unacked_reads = unacked_reads[arg:]
        elif op == "rewind":
            spool.rewind()
            read_pos, unacked_reads = acked, []
        elif op == "commit":
            spool.commit()
            committed = acked
        elif op == "reopen":
            spool.close()
            spool = Spool(path, max_bytes=1 << 24, segment_bytes=1024)
            acked = read_pos = committed
            unacked_reads = []
        assert spool.pending_frames == len(model) - acked
    spool.rewind()
    assert [r.value for r in spool.read(10_000, 1 << 30)] == model[acked:]
    assert spool.stats.dropped_frames == 0 and spool.stats.corrupt_bytes == 0


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(st.one_of(
    st.tuples(st.just("append"), st.integers(1, 3000)),
    st.tuples(st.just("read"), st.integers(1, 9)),
    st.tuples(st.just("ack"), st.integers(0, 9)),
    st.tuples(st.just("rewind"), st.just(0)),
    st.tuples(st.just("commit"), st.just(0)),
), max_size=80))
def test_full_spool_drops_oldest_but_keeps_order_and_counts(
        tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int]]) -> None:
    """With drops happening under reads in flight: reads stay in append order, and every
    appended record is delivered, pending or counted as dropped."""
    spool = Spool(tmp_path_factory.mktemp("full"), max_bytes=16 << 10, segment_bytes=4 << 10)
    n = 0
    last_read = -1
    delivered: set[int] = set()
    unacked: list = []
    for op, arg in ops:
        if op == "append":
            spool.append(None, b"%06d" % n + b"v" * arg)
            n += 1
        elif op == "read":
            recs = spool.read(arg)
            ids = [int(r.value[:6]) for r in recs]
            assert ids == sorted(ids) and (not ids or ids[0] > last_read)
            last_read = ids[-1] if ids else last_read
            unacked += recs
        elif op == "ack":
            for rec in unacked[:arg]:
                spool.ack(rec)
                delivered.add(int(rec.value[:6]))
            unacked = unacked[arg:]
        elif op == "rewind":
            spool.rewind()
            unacked, last_read = [], -1
        else:
            spool.commit()
        assert spool.total_bytes <= 16 << 10
    spool.rewind()
    rest = [int(r.value[:6]) for r in spool.read(10_000, 1 << 30)]
    assert len(rest) == spool.pending_frames
    assert rest == sorted(rest)
    accounted = len(delivered | set(rest)) + spool.stats.dropped_frames
    assert accounted >= n, f"{n} appended, {accounted} delivered/pending/dropped"

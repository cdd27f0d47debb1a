"""Poison messages on every topic each stage consumes, on the real broker.

The aggregator consumes samples and rollups, the detector samples and events. Bad records
(garbage, truncated, a flipped byte, empty, well-formed JSON of the wrong schema) are put
between good ones; each stage must dead-letter every bad one with its reason and source,
count it on /metrics, and go on: every good record after the poison is processed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from pathlib import Path

import aiohttp
import orjson
import pytest
from prometheus_client import generate_latest
from test_aggregator_support import make_fleet, process_all
from test_detector_support import frame, healthy, small_config, timestamps

from aggregator.config import AggregatorConfig
from aggregator.rack_stage import RackStage
from aggregator.series_index import EntityIndex
from aggregator.service import AggregatorService
from aggregator.store import SeriesStore, StoreConfig
from detector.service import DetectorService
from fleetpulse.config import TransportConfig
from fleetpulse.transport import Message, Transport, open_transport
from schemas.errors import DecodeError
from schemas.frame import decode_frame, encode_frame
from schemas.identity import NodeIdentity
from schemas.records import AlertRecord, AlertState, EventKind, EventRecord, decode_alerts_topic
from schemas.rollup import decode_rollup, encode_rollup
from schemas.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]


def _poison_of(good: bytes, decode: Callable[[bytes], object]) -> list[bytes]:
    """Bad variants of one good record: garbage, empty, truncated, a flipped byte.

    The flip is at the first position from the middle (wrapping around) that the decoder can see: the wire
    formats carry no checksum, so a flipped value byte is a valid (wrong) record.
    """
    flips = []
    for i in [*range(len(good) // 2, len(good)), *range(len(good) // 2)]:
        b = bytearray(good)
        b[i] ^= 0x5A
        flips.append(bytes(b))
    out = [b"not a record \x00\xff", b"", good[: len(good) // 2],
           next(f for f in flips if not _decodes(decode, f))]
    assert not any(_decodes(decode, v) for v in out)
    return out


def _decodes(decode: Callable[[bytes], object], value: bytes) -> bool:
    try:
        decode(value)
    except DecodeError:
        return False
    return True


async def _read_all(transport: Transport, topic: str, n: int,
                    timeout_s: float = 60.0) -> list[Message]:
    consumer = transport.consumer([topic], f"check-{uuid.uuid4().hex}")
    out: list[Message] = []
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        while len(out) < n and asyncio.get_running_loop().time() < deadline:
            out.extend(await consumer.getmany(timeout_ms=500))
        # a little longer: nothing more than expected may arrive
        out.extend(await consumer.getmany(timeout_ms=500))
    finally:
        await consumer.stop()
    return out


async def _until(pred: Callable[[], bool], timeout_s: float, what: Callable[[], object]) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, what()
        await asyncio.sleep(0.2)


def _check_parked(parked: list[Message], sent: dict[bytes, tuple[str, str]]) -> None:
    """Every poison record parked once, with its original bytes, source topic and reason."""
    got = sorted((m.value, dict(m.headers)["fp-source-topic"].decode()) for m in parked)
    assert got == sorted((v, t) for v, (t, _) in sent.items()), got
    for m in parked:
        h = dict(m.headers)
        topic, reason_prefix = sent[m.value]
        assert h["fp-reason"].decode().startswith(reason_prefix), h["fp-reason"]
        assert len(h["fp-reason"]) > len(reason_prefix) + 3  # says what is wrong
        assert int(h["fp-source-offset"]) >= 0 and m.key == topic.encode()


def sent_first(sent: dict[bytes, tuple[str, str]], topic: str) -> bytes:
    return next(v for v, (t, _) in sent.items() if t == topic)


async def test_aggregator_dead_letters_bad_samples_and_rollups_and_goes_on(
        kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> None:
    topics = Topics(unique_prefix)
    fl = make_fleet(n_racks=4, nodes_per_rack=2, gpus=2, seconds=90, partitions=2, rows=2)
    # a real rack rollup to mutilate: the rack stage's own output over the same fleet
    store = SeriesStore(StoreConfig(path=str(tmp_path / "ref"), fsync=False))
    index = EntityIndex(tmp_path / "ref-entities.jsonl")
    _, rollups = process_all(RackStage(store, index, topic="t.samples", lateness_ms=5000),
                              fl.messages)
    index.close()
    store.close()
    rollup = encode_rollup(rollups[0])
    sent: dict[bytes, tuple[str, str]] = {}
    for v in _poison_of(fl.frames[0], decode_frame):
        sent[v] = (topics.samples, "sample frame: ")
    for v in _poison_of(rollup, decode_rollup)[1:]:  # (the garbage one is already a samples poison)
        sent[v] = (topics.rollups, "rollup frame: ")
    sent[b'{"level": "rack"}'] = (topics.rollups, "rollup frame: ")

    cfg = AggregatorConfig(
        transport=TransportConfig(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix),
        group_id=f"{unique_prefix}-agg", data_dir=str(tmp_path / "d"), listen="127.0.0.1:0",
        lateness_ms=5000, row_lateness_ms=20_000, commit_interval_ms=200, fsync=False,
        samples_partitions=2, rollups_partitions=2)
    producer = open_transport(cfg.transport)
    await producer.start()
    await producer.ensure_topics({topics.samples: 2, topics.rollups: 2, topics.deadletter: 1})
    half = len(fl.frames) // 2
    for data, key in zip(fl.frames[:half], fl.keys[:half], strict=True):
        await producer.send(topics.samples, data, key=key)
    for value, (topic, _) in sent.items():  # poison between good records, both partitions
        for key in (fl.keys[0], fl.keys[-1]) if topic == topics.samples else (b"row0",):
            await producer.send(topic, value, key=key)
    n_poison = sum(2 if t == topics.samples else 1 for t, _ in sent.values())
    for data, key in zip(fl.frames[half:], fl.keys[half:], strict=True):
        await producer.send(topics.samples, data, key=key)
    await producer.flush()

    svc = AggregatorService(cfg)
    await svc.start()
    run = asyncio.create_task(svc.run())
    try:
        await _until(lambda: svc.dead_letters >= n_poison and
                     svc.rack.stats.frames >= len(fl.frames) and svc.row.windows_closed > 0,
                     120, lambda: (svc.dead_letters, svc.rack.stats.frames,
                                   svc.row.windows_closed))
        async with aiohttp.ClientSession() as s:
            text = await (await s.get(f"http://127.0.0.1:{svc.port}/metrics")).text()
        assert f"fleetpulse_aggregator_dead_letters_total {float(n_poison)}" in text
        parked = await _read_all(producer, topics.deadletter, n_poison)
    finally:
        svc.stop()
        await run
        await producer.close()
    assert not svc.failed
    # every good frame -- before and after the poison -- was rolled up, none twice
    assert svc.rack.stats.frames == len(fl.frames) and svc.rack.stats.duplicates == 0
    assert svc.dead_letters == n_poison == len(parked)
    # the samples poison went in twice (two partitions): each copy parked once
    assert sorted(int(dict(m.headers)["fp-source-partition"]) for m in parked
                  if m.value == sent_first(sent, topics.samples)) == [0, 1]
    _check_parked(list({m.value: m for m in parked}.values()), sent)


async def test_detector_dead_letters_bad_samples_and_events_and_goes_on(
        kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> None:
    topics = Topics(unique_prefix)
    config = small_config(
        transport=TransportConfig(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix),
        group_id=f"{unique_prefix}-detector", state_dir=tmp_path / "state", partitions=2,
        metrics_port=-1, checkpoint_interval_s=1.0)
    steps, gpus = 60, 4
    data = healthy(steps, gpus, seed=3)
    ts = timestamps(steps)
    frames = [encode_frame(frame("node-0", "rack-1", ts[s:s + 5], data[s:s + 5], seq=s // 5))
              for s in range(0, steps, 5)]
    ident = NodeIdentity("c1", "row-a", "rack-1", "node-0")
    xid = EventRecord(EventKind.XID, ident, "node-0.1", int(ts[-1]), gpu=2,
                      uuid="GPU-node-0-2", data={"xid": 79})
    good_event = xid.to_bytes()
    sent: dict[bytes, tuple[str, str]] = {}
    for v in _poison_of(frames[0], decode_frame):
        sent[v] = (topics.samples, "sample frame: ")
    for v in [b"{", good_event[:-7], orjson.dumps({"kind": "xid", "identity": {}}),
              orjson.dumps({**orjson.loads(good_event), "gpu": -1})]:
        sent[v] = (topics.events, "event record")

    transport = open_transport(config.transport)
    await transport.start()
    await transport.ensure_topics({topics.samples: 2, topics.events: 2, topics.alerts: 2,
                                   topics.deadletter: 1})
    key = ident.rack_key
    for f in frames[:6]:
        await transport.send(topics.samples, f, key=key)
    for value, (topic, _) in sent.items():
        await transport.send(topic, value, key=key if topic == topics.samples else ident.path
                             .encode())
    for f in frames[6:]:
        await transport.send(topics.samples, f, key=key)
    await transport.send(topics.events, good_event, key=xid.key)  # after the poison
    await transport.flush()

    service = DetectorService(config, transport)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    n_samples = sum(1 for t, _ in sent.values() if t == topics.samples)
    n_events = len(sent) - n_samples
    try:
        await _until(lambda: sum(service.stats.deadletter.values()) >= len(sent)
                     and service.stats.frames >= len(frames) and service.stats.events >= 1
                     and sum(service.stats.alerts.values()) >= 1, 120,
                     lambda: (service.stats.deadletter, service.stats.frames,
                              service.stats.events, service.stats.alerts))
        metrics = generate_latest(service.stats.registry).decode()
    finally:
        stop.set()
        await task
    try:
        parked = await _read_all(transport, topics.deadletter, len(sent))
        alerts = await _read_all(transport, topics.alerts, 1)
    finally:
        await transport.close()
    assert service.stats.deadletter == {topics.samples: n_samples, topics.events: n_events}
    assert (f'fleetpulse_detector_deadletter_total{{topic="{topics.samples}"}} '
            f"{float(n_samples)}") in metrics
    assert (f'fleetpulse_detector_deadletter_total{{topic="{topics.events}"}} '
            f"{float(n_events)}") in metrics
    # the stage went on: every good frame, and the good event after the poison
    assert service.stats.frames == len(frames) and service.stats.events == 1
    recs = [a for m in alerts if isinstance(a := decode_alerts_topic(m.value), AlertRecord)]
    assert [(r.source, r.state) for r in recs if r.entity.endswith("node-0/gpu-2")] == [
        ("rule:event_xid", AlertState.FIRING)]
    _check_parked(parked, sent)

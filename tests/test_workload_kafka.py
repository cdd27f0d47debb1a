"""Workload rollups across a real kill -9 of ``fleetpulse aggregator`` on a real broker.

One topic prefix holds a 150 s fleet and its attribution events (half of them produced
before the samples, half after, so the crash lands with events partly consumed). The
reference is the same messages folded in this process without a crash (the stages are the
service's own; a whole second instance would double the test's cost); the instance is killed
with SIGKILL a third of the way through and restarted. Every job's and namespace's rollups,
read from its data directory, must be the same bits, and so must the attribution facts.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import numpy as np
import pytest
from test_aggregator_kafka import PARTITIONS, Instance, wait_drained
from test_aggregator_support import T0, make_fleet

from aggregator.attribution_stage import AttributionStage
from aggregator.attribution_table import AttributionTable
from aggregator.query_engine import QueryEngine
from aggregator.rack_stage import RackStage
from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig
from aggregator.workload_query import WorkloadQuery
from fleetpulse.config import TransportConfig
from fleetpulse.transport import Message, open_transport
from schemas.attribution import Attachment
from schemas.records import AlertRecord, AlertState, EventKind, EventRecord, Severity
from schemas.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

QUERIES = (
    'fleetpulse_gpu_temperature_celsius{level="job",agg=~"sum|count|max|p95"}',
    'fleetpulse_gpu_power_usage_watts{level="namespace",agg=~"sum|avg"}',
    'fleetpulse_gpu_energy_consumption_joules_total{level="job"}',
    'fleetpulse_workload_gpu_seconds{level="job"}',
    'fleetpulse_workload_xids{level="job"}',
    'fleetpulse_workload_alerts{level="job"}',
)


def _attribution_events(fl) -> list[tuple[bytes, bytes]]:
    nodes = fl.nodes
    out = []

    def att(n: int, g: int, job: str, ns: str, start: int, end: int | None) -> None:
        node = nodes[n]
        a = Attachment(f"GPU-{node.node}-{g}", job, {"job": job, "namespace": ns}, start, end)
        rec = EventRecord(EventKind.ATTRIBUTION, node, f"agent-{node.node}", end or start, g,
                          a.uuid, a.to_data())
        out.append((rec.to_bytes(), rec.key))

    for n, gpus in ((0, range(4)), (2, range(2)), (5, range(4))):  # J1 spans two rows
        for g in gpus:
            att(n, g, "J1", "ml", T0 + 30_000, None)
    att(7, 1, "J2", "hpc", T0, None)
    for n, gpus in ((0, range(4)), (2, range(2)), (5, range(4))):
        for g in gpus:
            att(n, g, "J1", "ml", T0 + 30_000, T0 + 150_000)
    xid = EventRecord(EventKind.XID, nodes[2], "agent-x", T0 + 60_000, 1, "GPU-x", {"xid": 79})
    out.append((xid.to_bytes(), xid.key))
    return out


@pytest.fixture(scope="module")
def produced_jobs(kafka_bootstrap):
    prefix = f"t-wl-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    fl = make_fleet(n_racks=4, nodes_per_rack=2, gpus=4, seconds=150, partitions=PARTITIONS,
                    rows=2)
    events = _attribution_events(fl)
    half = len(events) // 2

    async def produce() -> None:
        t = open_transport(TransportConfig(bootstrap=kafka_bootstrap, topic_prefix=prefix))
        await t.start()
        topics = Topics(prefix)
        await t.ensure_topics({topics.samples: PARTITIONS, topics.events: PARTITIONS,
                               topics.alerts: 2, topics.rollups: 2, topics.deadletter: 1})
        node = fl.nodes[5]
        alert = AlertRecord("a-1", f"{node.path}/gpu-2", "gpu", AlertState.FIRING,
                            Severity.WARNING, "rule:x", "s", 1.0, 1.0, T0 + 50_000, T0 + 50_000)
        await t.send_and_wait(topics.alerts, alert.to_bytes(), key=alert.key)  # as in _reference
        futs = [await t.send(topics.events, v, key=k) for v, k in events[:half]]
        futs += [await t.send(topics.samples, v, key=k)
                 for v, k in zip(fl.frames, fl.keys, strict=True)]
        futs += [await t.send(topics.events, v, key=k) for v, k in events[half:]]
        await asyncio.gather(*futs)
        await t.close()

    asyncio.run(produce())
    node = fl.nodes[5]
    alert = AlertRecord("a-1", f"{node.path}/gpu-2", "gpu", AlertState.FIRING,
                        Severity.WARNING, "rule:x", "s", 1.0, 1.0, T0 + 50_000, T0 + 50_000)
    return kafka_bootstrap, prefix, len(fl.frames), fl, events, alert


def _drained(inst: Instance) -> None:
    wait_drained([inst])
    deadline = time.monotonic() + 60
    while (m := inst.metrics()).get('fleetpulse_aggregator_partitions{stage="workloads"}') \
            != PARTITIONS or m.get('fleetpulse_aggregator_partitions{stage="workload-alerts"}') \
            != 2 or inst.lag_and_partitions()[0] != 0:
        assert time.monotonic() < deadline, inst.log.read_text()[-2000:]
        time.sleep(0.2)


def _reference(produced: tuple[object, ...], data: Path) -> None:
    """The uninterrupted run: the same frames, events and alert through the same stages."""
    fl, events, alert = produced[3:6]
    store = SeriesStore(StoreConfig(path=str(data / "store"), fsync=False))
    index = EntityIndex(data / "entities.jsonl")
    table = AttributionTable(data / "attribution.jsonl")
    try:
        rack = RackStage(store, index, topic="t.samples", lateness_ms=5000)
        msgs = [Message("t.samples", 0, i, k, v, 0)
                for i, (v, k) in enumerate(zip(fl.frames, fl.keys, strict=True))]
        for i in range(0, len(msgs), 40):
            rack.process(msgs[i:i + 40])
        AttributionStage(table, topic="t.events").process(
            [Message("t.events", 0, i, k, v, 0) for i, (v, k) in enumerate(events)])
        AttributionStage(table, topic="t.alerts", alerts=True).process(
            [Message("t.alerts", 0, 0, b"k", alert.to_bytes(), 0)])
    finally:
        store.close()
        index.close()
        table.close()


def _answers(data: Path) -> dict[tuple[str, str, str], bytes]:
    """Every workload series of QUERIES at the 10 s and 1 min tiers, keyed by labels."""
    store = SeriesStore(StoreConfig(path=str(data / "store"), fsync=False))
    index = EntityIndex(data / "entities.jsonl")
    table = AttributionTable(data / "attribution.jsonl")
    try:
        engine = QueryEngine(store, index, workloads=WorkloadQuery(table, store, index))
        out: dict[tuple[str, str, str], bytes] = {}
        for tier, step in (("10s", 30_000), ("1m", 60_000)):
            for q in QUERIES:
                res = engine.query_range(q, T0, T0 + 150_000, step, resolution=tier)
                for lab, row in zip(res.labels, res.values, strict=True):
                    out[(tier, q, repr(sorted(lab.items())))] = row.tobytes()
        out[("facts", "", "")] = repr(table.spans()).encode() + repr(sorted(
            (k, sorted(v)) for k, v in table.xids.items())).encode()
        return out
    finally:
        store.close()
        index.close()
        table.close()


def test_kill9_then_restart_gives_identical_job_rollups(produced_jobs, tmp_path):
    bootstrap, prefix, n_frames = produced_jobs[:3]
    _reference(produced_jobs, tmp_path / "ref")
    want = _answers(tmp_path / "ref")
    jobs = {k[2] for k in want if "'job', 'J1'" in k[2]}
    assert jobs, sorted(want)[:5]
    sums = [np.frombuffer(v) for k, v in want.items() if "'agg', 'sum'" in k[2]]
    alerts = [np.nansum(np.frombuffer(v)) for k, v in want.items()
              if k[0] == "10s" and "workload_alerts" in k[2]]
    assert sorted(alerts) == [0.0, 1.0]  # J1's one alert; J2 none
    assert sums and all(np.isfinite(s).any() for s in sums)

    crash = Instance(tmp_path, "crash", bootstrap, prefix, f"{prefix}-crash")
    crash.start()
    deadline = time.monotonic() + 180
    while crash.frames() < n_frames / 3:
        assert time.monotonic() < deadline, crash.log.read_text()[-2000:]
        time.sleep(0.02)
    crash.kill9()
    crash.start()
    try:
        _drained(crash)
    finally:
        crash.stop()
    got = _answers(crash.data)
    assert got.keys() == want.keys()
    differ = [k for k in want if got[k] != want[k]]
    assert not differ, [(k, np.frombuffer(got[k]), np.frombuffer(want[k])) for k in differ[:3]]

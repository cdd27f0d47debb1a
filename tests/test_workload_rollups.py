"""Workload rollups (issue 18): a job's values equal the merge of its own GPUs' samples inside
its attachments -- across racks and partitions, in the raw, 10 s and 1 min tiers, with XIDs
and GPU-seconds -- and the attribution table gives the same answers after a crash."""

from __future__ import annotations

import os

import numpy as np
import pytest
from test_aggregator_support import ENERGY, T0, make_fleet, open_store, process_all

from aggregator.attribution_stage import AttributionStage
from aggregator.attribution_table import AttributionTable
from aggregator.query_engine import QueryEngine, QueryError
from aggregator.rack_stage import RackStage
from aggregator.series_index import EntityIndex
from aggregator.series_layout import series_ids
from aggregator.sketch import RELATIVE_ACCURACY
from aggregator.workload_query import WorkloadQuery
from fleetpulse.transport.base import Message
from schemas.attribution import Attachment
from schemas.identity import NodeIdentity
from schemas.records import AlertRecord, AlertState, EventKind, EventRecord, Severity

LATE = 5000
SECONDS = 200
ETOPIC = "t.events"
STEP = 200_000  # one output point merging the whole run


def _event(node: NodeIdentity, gpu: int, workload: str, labels: dict[str, str], start: int,
           end: int | None, ts: int) -> bytes:
    att = Attachment(f"GPU-{node.node}-{gpu}", workload, labels, start, end)
    return EventRecord(EventKind.ATTRIBUTION, node, f"agent-{node.node}", ts, gpu, att.uuid,
                       att.to_data()).to_bytes()


def _events(nodes: list[NodeIdentity]) -> list[Message]:
    """J1: node 0, GPUs 0-1, [10 s, 40 s); J2: node 2 (another rack), GPU 2, from 20 s, open;
    J3: node 1, GPU 3, at unaligned times [12.345 s, 31 s); an XID inside J1 and one after."""
    ml = {"namespace": "ml", "tenant": "acme"}
    vals = []
    for g in (0, 1):
        vals.append(_event(nodes[0], g, "J1", {"job": "J1", **ml}, T0 + 10_000, None,
                           T0 + 10_000))
    vals.append(_event(nodes[2], 2, "J2", {"job": "J2", **ml}, T0 + 20_000, None, T0 + 20_000))
    vals.append(_event(nodes[1], 3, "J3", {"job": "J3", "namespace": "hpc"}, T0 + 12_345,
                       None, T0 + 12_345))
    for g in (0, 1):  # the ends, and one start delivered twice (a replay)
        vals.append(_event(nodes[0], g, "J1", {"job": "J1", **ml}, T0 + 10_000, T0 + 40_000,
                           T0 + 40_000))
    vals.append(vals[2])
    vals.append(_event(nodes[1], 3, "J3", {"job": "J3", "namespace": "hpc"}, T0 + 12_345,
                       T0 + 31_000, T0 + 31_000))
    for ts in (T0 + 15_000, T0 + 50_000):
        vals.append(EventRecord(EventKind.XID, nodes[0], "a", ts, 0, "GPU-x",
                                {"xid": 79}).to_bytes())
    vals.append(b"{not json")
    return [Message(ETOPIC, i % 2, i // 2, b"k", v, 0) for i, v in enumerate(vals)]


@pytest.fixture
def world(tmp_path):
    fl = make_fleet(n_racks=2, nodes_per_rack=2, gpus=4, seconds=SECONDS)
    store = open_store(tmp_path / "store")
    index = EntityIndex(tmp_path / "entities.jsonl")
    table = AttributionTable(tmp_path / "attribution.jsonl")
    rack = RackStage(store, index, topic="t.samples", lateness_ms=LATE)
    stage = AttributionStage(table, topic=ETOPIC)
    msgs = _events(fl.nodes)
    dead, _ = stage.process(msgs[:5])  # events and samples interleave in any order
    process_all(rack, fl.messages)
    dead += stage.process(msgs[5:])[0]
    assert [reason.split(":")[0] for _, reason in dead] == ["event record"]
    alerts = AttributionStage(table, topic="t.alerts", alerts=True)
    n0 = fl.nodes[0]
    recs = [AlertRecord(f"a{i}", f"{n0.path}/gpu-{g}", "gpu", state, Severity.WARNING,
                        "rule:x", "s", 1.0, 1.0, T0 + at, T0 + at + 1)
            for i, (g, at) in enumerate(((0, 20_000), (1, 45_000), (3, 20_000)))
            for state in (AlertState.FIRING, AlertState.RESOLVED)]
    rack_alert = AlertRecord("r", n0.path.rsplit("/", 1)[0], "rack", AlertState.FIRING,
                             Severity.WARNING, "rule:x", "s", 1.0, 1.0, T0 + 20_000, T0)
    amsgs = [Message("t.alerts", 0, i, b"k", r.to_bytes(), 0)
             for i, r in enumerate([*recs, rack_alert])]
    assert alerts.process(amsgs) == ([], [])
    engine = QueryEngine(store, index, workloads=WorkloadQuery(table, store, index))
    yield fl, engine, store, index, table
    store.close()
    index.close()
    table.close()


def _one(engine: QueryEngine, q: str, resolution: str = "10s", step: int = STEP) -> float:
    res = engine.query_range(q, T0 + step, T0 + step, step, resolution=resolution)
    assert len(res.labels) == 1, res.labels
    return float(res.values[0, 0])


def _samples(fl, node: int, gpus: list[int], metric_col: int, lo: int, hi: int) -> np.ndarray:
    sel = (fl.ts >= lo) & (fl.ts < hi)
    v = fl.values[node][sel][:, gpus, metric_col].reshape(-1)
    return v[~np.isnan(v)]


def test_job_rollups_equal_sums_over_the_jobs_own_samples(world) -> None:
    fl, engine, store, index, _ = world
    closed_end = T0 + 190_000  # windows up to 180 s are closed (watermark 199 s, lateness 5 s)
    temps = _samples(fl, 0, [0, 1], 0, T0 + 10_000, T0 + 40_000)
    assert _one(engine, 'fleetpulse_gpu_temperature_celsius{level="job",job="J1",agg="sum"}') \
        == temps.sum()  # integers: exact in any order
    assert _one(engine, 'fleetpulse_gpu_temperature_celsius{level="job",job="J1",agg="count"}') \
        == temps.size
    assert _one(engine, 'fleetpulse_gpu_temperature_celsius{level="job",job="J1",agg="max"}') \
        == temps.max()
    assert _one(engine, 'fleetpulse_gpu_temperature_celsius{level="job",job="J1"}') \
        == temps.sum() / temps.size
    power = _samples(fl, 0, [0, 1], 1, T0 + 10_000, T0 + 40_000)
    assert _one(engine, 'fleetpulse_gpu_power_usage_watts{level="job",job="J1",agg="sum"}') \
        == pytest.approx(power.sum(), rel=1e-13)
    # the open job on another rack (another partition): only its closed windows so far
    j2 = _samples(fl, 2, [2], 0, T0 + 20_000, closed_end)
    assert _one(engine, 'fleetpulse_gpu_temperature_celsius{level="job",job="J2",agg="sum"}') \
        == j2.sum()
    # the namespace is its jobs together; J3 belongs to another one
    assert _one(engine, 'fleetpulse_gpu_temperature_celsius{level="namespace",namespace="ml",'
                'agg="sum"}') == temps.sum() + j2.sum()
    # raw tier: unaligned attachment boundaries hold to the sample
    j3 = _samples(fl, 1, [3], 0, T0 + 12_345, T0 + 31_000)
    assert _one(engine, 'fleetpulse_gpu_temperature_celsius{level="job",job="J3",agg="sum"}',
                resolution="raw") == j3.sum()
    # energy: the job's increase is the sum of its GPU windows' increases
    want = 0.0
    for g in (0, 1):
        n0 = fl.nodes[0]
        eid = index.get(("gpu", "c1", n0.row, n0.rack, n0.node, str(g)))
        r = store.read("10s", series_ids([eid], [ENERGY], "increase")[0], T0 + 10_000,
                       T0 + 40_000)
        want += float(np.nansum(r.values))
    assert _one(engine, 'fleetpulse_gpu_energy_consumption_joules_total{level="job",job="J1"}') \
        == pytest.approx(want, rel=1e-13)
    assert _one(engine, 'fleetpulse_workload_gpu_seconds{level="job",job="J1"}') == 60.0
    assert _one(engine, 'fleetpulse_workload_xids{level="job",job="J1"}') == 1.0
    # one alert on J1's GPUs while attached (another after it ended, one on another GPU)
    assert _one(engine, 'fleetpulse_workload_alerts{level="job",job="J1"}') == 1.0


def test_job_quantiles_and_coarse_tiers(world) -> None:
    fl, engine, _, _, _ = world
    # the 1 min tier: the first minute is not wholly J1's, so it comes from 10 s windows
    temps = _samples(fl, 0, [0, 1], 0, T0 + 10_000, T0 + 40_000)
    assert _one(engine, 'fleetpulse_gpu_temperature_celsius{level="job",job="J1",agg="sum"}',
                resolution="1m", step=240_000) == temps.sum()
    # J2 (open from 20 s): 10 s windows up to its first whole minute (T0 is 20 s past one),
    # then the 1 min windows from 40 s and 100 s; the minute from 160 s is not complete yet
    j2 = _samples(fl, 2, [2], 0, T0 + 20_000, T0 + 160_000)
    assert _one(engine, 'fleetpulse_gpu_temperature_celsius{level="job",job="J2",agg="sum"}',
                resolution="1m", step=240_000) == j2.sum()
    assert _one(engine, 'fleetpulse_gpu_temperature_celsius{level="job",job="J2",agg="max"}',
                resolution="1m", step=240_000) == j2.max()
    # p95 of the job's GPU-windows (window means), within the sketch's relative accuracy
    means = []
    for g in (0, 1):
        for w in range(T0 + 10_000, T0 + 40_000, 10_000):
            v = _samples(fl, 0, [g], 1, w, w + 10_000)
            means.append(v.sum() / v.size)
    m = np.sort(np.asarray(means))
    exact = m[int(np.floor(0.95 * (m.size - 1) + 1e-9))]
    got = _one(engine, 'fleetpulse_gpu_power_usage_watts{level="job",job="J1",agg="p95"}')
    assert abs(got - exact) <= RELATIVE_ACCURACY * exact
    # a series per job and aggregate, labelled with the workload
    res = engine.query_range('fleetpulse_gpu_temperature_celsius{level="job",agg=~"sum|max"}',
                             T0 + STEP, T0 + STEP, STEP, resolution="10s")
    assert sorted((lab["job"], lab["agg"]) for lab in res.labels) == [
        ("J1", "max"), ("J1", "sum"), ("J2", "max"), ("J2", "sum"), ("J3", "max"),
        ("J3", "sum")]
    assert next(lab for lab in res.labels if lab["job"] == "J1")["tenant"] == "acme"
    assert "job" in engine.label_names() and engine.label_values("job") == ["J1", "J2", "J3"]
    assert "job" in engine.label_values("level")
    with pytest.raises(QueryError, match="unknown label"):
        engine.query_range('fleetpulse_gpu_power_usage_watts{level="job",rack="x"}', T0, T0, STEP)


def test_attribution_table_is_the_same_after_a_crash_and_a_replay(tmp_path) -> None:
    nodes = [NodeIdentity("c1", "row0", f"rack{r:02d}", f"node{r:02d}-{n}")
             for r in range(2) for n in range(2)]
    msgs = _events(nodes)
    ref = AttributionTable(tmp_path / "ref.jsonl")
    AttributionStage(ref, topic=ETOPIC).process(msgs)
    want, want_xids = ref.spans(), ref.xids
    ref.close()
    # crash after half: the table object is dropped unflushed (what os.write handed over
    # survives); the restart replays from an older committed offset (the start)
    path = tmp_path / "crash.jsonl"
    crashed = AttributionTable(path)
    stage = AttributionStage(crashed, topic=ETOPIC)
    stage.process(msgs[:7])
    appender = crashed._log
    assert appender is not None and appender._fd is not None
    os.close(appender._fd)  # no fsync, no close(): the process is gone
    appender._fd = None
    with open(path, "ab") as fh:
        fh.write(b'{"gpu": "torn')  # and the last line was torn mid-write
    again = AttributionTable(path)
    AttributionStage(again, topic=ETOPIC).process(msgs)
    assert again.spans() == want
    assert again.xids == want_xids
    again.close()
    reopened = AttributionTable(path)
    assert reopened.spans() == want
    reopened.close()

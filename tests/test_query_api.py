"""The query API over a real aiohttp server, with the requests Grafana sends."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from test_aggregator_support import T0, make_fleet, process_all

from aggregator.config import AggregatorConfig
from aggregator.http_api import build_query_app, openapi_document
from aggregator.query_engine import QueryEngine, QueryLimits
from aggregator.rack_stage import RackStage
from aggregator.series_index import EntityIndex
from aggregator.service import AggregatorService
from aggregator.store import SeriesStore, StoreConfig
from fleetpulse.commands.query import format_table, parse_when
from fleetpulse.config import TransportConfig
from fleetpulse.transport import open_transport
from schemas.topics import Topics

ROOT = Path(__file__).resolve().parents[1]
GRAFANA_HEADERS = {"Content-Type": "application/x-www-form-urlencoded",
                   "User-Agent": "Grafana/11.3.0", "X-Grafana-Org-Id": "1",
                   "Accept": "application/json, text/plain, */*"}


@pytest.fixture
def filled(tmp_path):
    """A store + index holding 2 minutes of a 4-rack fleet, windows closed."""
    store = SeriesStore(StoreConfig(path=str(tmp_path / "store"), fsync=False))
    index = EntityIndex(tmp_path / "entities.jsonl")
    fl = make_fleet(n_racks=4, nodes_per_rack=2, gpus=4, seconds=120, partitions=2)
    process_all(RackStage(store, index, topic="t.samples", lateness_ms=5000), fl.messages)
    yield store, index, fl
    index.close()
    store.close()


async def _server(app):
    from aiohttp.test_utils import TestServer

    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    return server


async def test_grafana_form_post_query_range(filled):
    store, index, fl = filled
    server = await _server(build_query_app(QueryEngine(store, index)))
    try:
        form = {"query": 'fleetpulse_gpu_temperature_celsius{level="gpu",node="node00-0"}',
                "start": str((T0 + 10_000) / 1000), "end": str((T0 + 60_000) / 1000),
                "step": "10"}
        async with aiohttp.ClientSession() as s:
            r = await s.post(server.make_url("/api/v1/query_range"), data=form,
                             headers=GRAFANA_HEADERS)
            assert r.status == 200
            body = await r.json()
        assert body["status"] == "success" and body["data"]["resultType"] == "matrix"
        result = sorted(body["data"]["result"], key=lambda x: x["metric"]["gpu"])
        assert [x["metric"]["gpu"] for x in result] == ["0", "1", "2", "3"]
        m = result[2]["metric"]
        assert m["__name__"] == "fleetpulse_gpu_temperature_celsius" and m["agg"] == "avg"
        t, v = result[2]["values"][0]
        assert t == (T0 + 10_000) / 1000
        col = fl.values[0][:10, 2, 0]
        assert float(v) == pytest.approx(np.nanmean(col))
        assert isinstance(v, str)
    finally:
        await server.close()


async def test_get_and_post_agree_and_aggregations(filled):
    store, index, _ = filled
    server = await _server(build_query_app(QueryEngine(store, index)))
    q = 'max by (rack) (fleetpulse_gpu_power_usage_watts{level="gpu", agg="max"})'
    params = {"query": q, "start": f"{(T0 + 20_000) / 1000}", "end": f"{(T0 + 80_000) / 1000}",
              "step": "20s"}
    try:
        async with aiohttp.ClientSession() as s:
            a = await (await s.get(server.make_url("/api/v1/query_range"), params=params)).json()
            b = await (await s.post(server.make_url("/api/v1/query_range"), data=params)).json()
            direct = await (await s.get(server.make_url("/api/v1/query_range"), params={
                **params, "query": 'fleetpulse_gpu_power_usage_watts{level="rack",agg="max"}'}
            )).json()
        assert a == b
        got = {x["metric"]["rack"]: x["values"] for x in a["data"]["result"]}
        want = {x["metric"]["rack"]: x["values"] for x in direct["data"]["result"]}
        assert got == want and len(got) == 4
        assert set(a["data"]["result"][0]["metric"]) == {"rack"}
    finally:
        await server.close()


async def test_instant_heatmap_series_labels_and_openapi(filled):
    store, index, _ = filled
    server = await _server(build_query_app(QueryEngine(store, index)))
    try:
        async with aiohttp.ClientSession() as s:
            inst = await (await s.post(server.make_url("/api/v1/query"), data={
                "query": 'fleetpulse_gpu_temperature_celsius{level="gpu"}',
                "time": str((T0 + 120_000) / 1000)})).json()
            series = await (await s.get(server.make_url("/api/v1/series"), params={
                "match[]": 'fleetpulse_gpu_energy_consumption_joules_total{level="rack"}'}
            )).json()
            labels = await (await s.get(server.make_url("/api/v1/labels"))).json()
            racks = await (await s.get(server.make_url("/api/v1/label/rack/values"))).json()
            names = await (await s.get(server.make_url("/api/v1/label/__name__/values"))).json()
            health = await (await s.get(server.make_url("/api/v1/query"),
                                        params={"query": "1+1"})).json()
            spec = await (await s.get(server.make_url("/api/v1/openapi.json"))).json()
            meta = await (await s.get(server.make_url("/api/v1/metadata"), params={
                "metric": "fleetpulse_gpu_energy_consumption_joules_total"})).json()
        assert inst["data"]["resultType"] == "vector"
        assert len(inst["data"]["result"]) == 4 * 2 * 4  # every GPU of the fleet
        assert all(x["value"][0] == (T0 + 120_000) / 1000 for x in inst["data"]["result"])
        assert len(series["data"]) == 4 and all(x["agg"] == "increase" for x in series["data"])
        assert {"__name__", "agg", "level", "rack", "node", "gpu"} <= set(labels["data"])
        assert racks["data"] == ["rack00", "rack01", "rack02", "rack03"]
        assert "fleetpulse_gpu_temperature_celsius" in names["data"]
        assert health["data"] == {"resultType": "scalar", "result": [health["data"]["result"][0],
                                                                      "2"]}
        assert spec == openapi_document() and "/api/v1/query_range" in spec["paths"]
        assert meta["data"] == {"fleetpulse_gpu_energy_consumption_joules_total": [
            {"type": "counter", "help": meta["data"][
                "fleetpulse_gpu_energy_consumption_joules_total"][0]["help"],
             "unit": "joules"}]}
    finally:
        await server.close()


@pytest.mark.parametrize(("params", "fragment"), [
    ({"query": "fleetpulse_gpu_temperature_celsius{", "start": "0", "end": "10", "step": "1"},
     "expected"),
    ({"query": "up", "start": "abc", "end": "10", "step": "1"}, "cannot parse"),
    ({"query": "up", "start": "0", "end": "100000", "step": "1"}, "11000 points"),
    ({"query": "up", "start": "0", "end": "10", "step": "0"}, "positive"),
    ({"query": '{gpu=~"("}', "start": "0", "end": "10", "step": "1"}, "regular expression"),
    ({"query": '{foo="x"}', "start": "0", "end": "10", "step": "1"}, "unknown label"),
    ({"start": "0", "end": "10", "step": "1"}, "query"),
    ({"query": '{level="gpu"}', "start": "0", "end": "10", "step": "1"}, "more than the limit"),
])
async def test_errors_are_prometheus_shaped_400s(filled, params, fragment):
    store, index, _ = filled
    engine = QueryEngine(store, index, QueryLimits(max_series=50))
    server = await _server(build_query_app(engine))
    try:
        async with aiohttp.ClientSession() as s:
            r = await s.post(server.make_url("/api/v1/query_range"), data=params)
            body = await r.json()
        assert r.status == 400
        assert body["status"] == "error" and body["errorType"] == "bad_data"
        assert fragment in body["error"]
    finally:
        await server.close()


async def test_bearer_token(filled):
    store, index, _ = filled
    server = await _server(build_query_app(QueryEngine(store, index), bearer_token="s3cret"))
    try:
        async with aiohttp.ClientSession() as s:
            r = await s.get(server.make_url("/api/v1/labels"))
            assert r.status == 401 and (await r.json())["errorType"] == "unauthorized"
            r = await s.get(server.make_url("/api/v1/labels"),
                            headers={"Authorization": "Bearer wrong"})
            assert r.status == 401
            r = await s.get(server.make_url("/api/v1/labels"),
                            headers={"Authorization": "Bearer s3cret"})
            assert r.status == 200
    finally:
        await server.close()


async def test_service_on_memory_transport_end_to_end(tmp_path):
    """The whole service: frames in, rollups + metrics + CLI query out, on 127.0.0.1."""
    cfg = AggregatorConfig(transport=TransportConfig(bootstrap="memory://agg-e2e",
                                                     topic_prefix="e2e"),
                           data_dir=str(tmp_path / "d"), listen="127.0.0.1:0", lateness_ms=5000,
                           row_lateness_ms=20_000, commit_interval_ms=100, fsync=False)
    svc = AggregatorService(cfg)
    await svc.start()
    run = asyncio.create_task(svc.run())
    fl = make_fleet(n_racks=4, nodes_per_rack=2, gpus=2, seconds=90, partitions=8, rows=2)
    producer = open_transport(cfg.transport)
    await producer.start()
    topics = Topics("e2e")
    bad = 0
    try:
        for data, key in zip(fl.frames, fl.keys, strict=True):
            await producer.send_and_wait(topics.samples, data, key=key)
        await producer.send_and_wait(topics.samples, b"not a frame", key=b"x")
        bad += 1
        url = f"http://127.0.0.1:{svc.port}"
        async with aiohttp.ClientSession() as s:
            # Wait for the facts asked about below: the dead letter, and the cluster windows
            # (row rollups make a second trip through Kafka before a cluster window closes;
            # the stages run on the store thread, so their counters move while this polls).
            levels: set[str] = set()
            for _ in range(200):
                await asyncio.sleep(0.05)
                text = await (await s.get(url + "/metrics")).text()
                body = await (await s.get(url + "/api/v1/query_range", params={
                    "query": 'fleetpulse_gpu_temperature_celsius{level=~"row|cluster"}',
                    "start": str((T0 + 10_000) / 1000), "end": str((T0 + 30_000) / 1000),
                    "step": "10"})).json()
                levels = {x["metric"]["level"] for x in body["data"]["result"]}
                if "fleetpulse_aggregator_dead_letters_total 1.0" in text and \
                        levels == {"row", "cluster"}:
                    break
            assert "fleetpulse_aggregator_store_bytes" in text
            assert "fleetpulse_aggregator_store_rewrites_pending 0.0" in text
            assert "fleetpulse_aggregator_store_compaction_errors_total 0.0" in text
            assert "fleetpulse_aggregator_late_samples_total" in text
            assert "fleetpulse_aggregator_tiers_catching_up 0.0" in text
        assert levels == {"row", "cluster"}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "fleetpulse", "query",
            'fleetpulse_gpu_temperature_celsius{level="row"}', "--start",
            str((T0 + 10_000) / 1000), "--end", str((T0 + 30_000) / 1000), "--step", "10",
            "--url", url, "--json", cwd=ROOT, stdout=subprocess.PIPE)
        out, _ = await proc.communicate()
        assert proc.returncode == 0
        assert {x["metric"]["row"] for x in json.loads(out)["data"]["result"]} == {"row0",
                                                                                    "row1"}
        assert svc.dead_letters == bad
    finally:
        svc.stop()
        await run
        await producer.close()


def test_cli_table_and_times():
    assert parse_when("-1h", 10_000.0) == 10_000.0 - 3600
    assert parse_when("2023-11-14T22:13:20Z", 0) == 1_700_000_000.0
    table = format_table([{"metric": {"__name__": "fleetpulse_gpu_temperature_celsius",
                                      "rack": "r1", "agg": "avg"},
                           "values": [[1_700_000_000, "41.5"], [1_700_000_060, "42"]]}])
    lines = table.splitlines()
    assert lines[0].startswith("time (UTC)") and "temperature_celsius{rack=r1,agg=avg}" in lines[0]
    assert lines[1].startswith("2023-11-14 22:13:20") and lines[1].endswith("41.5")


def test_sample_config_loads():
    from fleetpulse.commands.aggregator import load_aggregator_config

    cfg = load_aggregator_config(ROOT / "config" / "aggregator.toml",
                                 environ={"FLEETPULSE_AGGREGATOR_LISTEN": "127.0.0.1:9999",
                                          "FLEETPULSE_AGGREGATOR_TRANSPORT__TOPIC_PREFIX": "x"})
    assert cfg.listen == "127.0.0.1:9999" and cfg.transport.topic_prefix == "x"
    assert cfg.host_port == ("127.0.0.1", 9999)
    assert AggregatorConfig().listen.startswith("127.0.0.1:")


def test_instant_raw_resolution_gives_the_newest_sample(filled):
    """The freshest heatmap: resolution=raw reads each GPU's newest raw sample."""
    store, index, fl = filled
    engine = QueryEngine(store, index)
    node = fl.nodes[0]
    res = engine.query_instant(
        f'fleetpulse_gpu_power_usage_watts{{level="gpu",node="{node.node}",gpu="1"}}',
        int(fl.ts[-1]) + 500, resolution="raw")
    col = fl.values[0][:, 1, 1]
    newest = col[~np.isnan(col)][-1]
    assert res.labels[0]["agg"] == "raw" and res.values[0, 0] == newest

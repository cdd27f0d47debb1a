"""Every panel of the shipped Grafana dashboards returns data, through both data sources.

There is no Grafana here (it is not a Debian package), so this test does what Grafana
does with a dashboard: it resolves the template variables in order with their
``label_values(selector, label)`` queries (``/api/v1/series``, as Grafana's Prometheus
data source sends them), substitutes them (a multi-value variable as ``a|b``), and runs every
panel target as a range query with Grafana's parameters -- against the aggregator's own
query API and against a real Prometheus whose ``remote_read`` points at the aggregator.
The data: a 64-GPU simulated fleet (every catalog metric) rolled up by the rack and row
stages into a real store.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp.test_utils import TestServer
from prometheus import Prometheus, config, needs_prometheus
from test_aggregator_support import process_all

from agent.fleet import FleetModel, Topology
from agent.fleet.model import METRIC_IDS
from aggregator import prom_wire
from aggregator.http_api import build_query_app
from aggregator.query_engine import QueryEngine
from aggregator.rack_stage import RackStage
from aggregator.row_stage import RowStage
from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig
from fleetpulse.transport.base import Message
from schemas.frame import SampleFrame, encode_frame
from schemas.rollup import encode_rollup

ROOT = Path(__file__).resolve().parents[1]
DASHBOARDS = sorted((ROOT / "deploy" / "grafana" / "dashboards").glob("*.json"))
SECONDS = 240
_LABEL_VALUES = re.compile(r"label_values\((.*),\s*(\w+)\)\s*")


def _fleet_messages(start_ms: int) -> list[Message]:
    topo = Topology(64, nodes_per_rack=2, racks_per_row=2)
    model = FleetModel(topo, hz=1.0, seed=5, start_ms=start_ms)
    idents = topo.identities
    msgs, offsets = [], [0, 0]
    for tick in range(SECONDS):
        ts, values = model.step()
        for n, ident in enumerate(idents):
            g = topo.gpus_of_node(n)
            frame = SampleFrame(ident, f"agent-{ident.node}", tick, METRIC_IDS,
                                np.arange(topo.gpn, dtype=np.int32),
                                tuple(model.uuids[g]), ts[n:n + 1],
                                np.ascontiguousarray(values[g][None]))
            p = int(topo.rack_of_node[n]) % 2
            msgs.append(Message("t.samples", p, offsets[p], ident.rack_key,
                                encode_frame(frame), int(ts[n])))
            offsets[p] += 1
    return msgs


@pytest.fixture(scope="module")
def fleet_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("grafana")
    store = SeriesStore(StoreConfig(path=str(path / "store"), fsync=False))
    index = EntityIndex(path / "entities.jsonl")
    start = 1_767_225_600_000
    _, rollups = process_all(RackStage(store, index, topic="t.samples", lateness_ms=5000),
                             _fleet_messages(start))
    # one stage sees every rack from the start: nothing to settle
    rows = RowStage(store, index, topic="t.rollups", lateness_ms=60_000, settle_ms=0)
    offset = 0
    while rollups:  # racks -> rows, then the rows' own rollups -> cluster
        msgs = [Message("t.rollups", 0, offset + i, fr.row.encode(), encode_rollup(fr), 0)
                for i, fr in enumerate(rollups)]
        offset += len(msgs)
        _, rollups = rows.process(msgs)
    yield store, index, start
    index.close()
    store.close()


def test_dashboards_are_grafana_provisioning_json():
    assert {p.stem for p in DASHBOARDS} == {"fleet", "row-rack", "gpu", "alerts"}
    uids = set()
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        uids.add(d["uid"])
        assert d["schemaVersion"] >= 36 and d["panels"], path
        assert d["templating"]["list"][0]["type"] == "datasource", "both endpoints selectable"
        for p in d["panels"]:
            assert p["datasource"]["uid"] == "${datasource}" and p["targets"], (path, p)
            assert all(t["expr"] and t["datasource"]["uid"] == "${datasource}"
                       for t in p["targets"])
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))
    assert len(uids) == len(DASHBOARDS)


async def _get(session: aiohttp.ClientSession, url: str, **params: str) -> list:
    async with session.post(url, data=params) as r:
        body = await r.json()
    assert r.status == 200 and body["status"] == "success", (url, params, body)
    assert not body.get("warnings"), body
    data = body["data"]
    return data["result"] if isinstance(data, dict) else data


async def _variables(session: aiohttp.ClientSession, base: str, dash: dict) -> dict[str, str]:
    values: dict[str, str] = {}
    for var in dash["templating"]["list"][1:]:
        m = _LABEL_VALUES.fullmatch(var["query"]["query"])
        assert m, var
        selector = _substitute(m.group(1), values)
        series = await _get(session, base + "/api/v1/series", **{"match[]": selector})
        found = sorted({s[m.group(2)] for s in series if m.group(2) in s})
        assert found, (dash["uid"], var["name"], selector)
        values[var["name"]] = "|".join(found) if var.get("multi") else found[0]
    return values


def _substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in sorted(values.items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(f"${name}", value)
    return expr


@needs_prometheus
async def test_every_panel_returns_data_from_the_api_and_through_prometheus(
        fleet_store, tmp_path):
    store, index, start = fleet_store
    prom_wire.warm_up()
    server = TestServer(build_query_app(QueryEngine(store, index)), host="127.0.0.1")
    await server.start_server()
    prom = Prometheus(tmp_path / "prom", config([str(server.make_url("/api/v1/read"))]))
    await prom.start()
    rng = {"start": str((start + 90_000) / 1000), "end": str((start + SECONDS * 1000) / 1000),
           "step": "30"}
    checked = 0
    try:
        async with aiohttp.ClientSession() as s:
            for base in (str(server.make_url("")).rstrip("/"), prom.url):
                for path in DASHBOARDS:
                    dash = json.loads(path.read_text())
                    values = await _variables(s, base, dash)
                    for panel in dash["panels"]:
                        for target in panel["targets"]:
                            expr = _substitute(target["expr"], values)
                            assert "$" not in expr, expr
                            result = await _get(s, base + "/api/v1/query_range", query=expr,
                                                **rng)
                            points = [v for r in result for _, v in r["values"]
                                      if v not in ("NaN", "+Inf", "-Inf")]
                            assert points, (base, dash["uid"], panel["title"], expr)
                            checked += 1
    finally:
        prom.stop()
        await server.close()
    targets = sum(len(p["targets"]) for d in DASHBOARDS
                  for p in json.loads(d.read_text())["panels"])
    assert checked == 2 * targets and targets >= 24

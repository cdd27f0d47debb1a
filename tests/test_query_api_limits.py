"""The query API under bad and oversized requests, over a real loopback HTTP server.

Every error, whichever layer raises it (handler, router, body reader, HTTP parser), must
come in Prometheus' JSON error shape; queries that would read too much are refused before
the store is read; and a property test drives every operation of the API's own OpenAPI
document with generated parameters: no 5xx, ever.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import threading
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_aggregator_support import T0, make_fleet, process_all

from aggregator.http_api import MAX_BODY, MAX_QUERY_CHARS, build_query_app, openapi_document
from aggregator.http_errors import JsonErrorRunner
from aggregator.query_engine import QueryEngine, QueryLimits
from aggregator.rack_stage import RackStage
from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig

# 32 GPU series (4 racks x 2 nodes x 4 GPUs) of 2 minutes
N_GPUS = 32


class _Server:
    """The query app behind JsonErrorRunner (as the aggregator serves it) in its own thread."""

    def __init__(self, engine: QueryEngine) -> None:
        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "server did not start"

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.runner = JsonErrorRunner(build_query_app(self.engine), access_log=None)
        self.loop.run_until_complete(self._start())
        self._ready.set()
        self.loop.run_forever()

    async def _start(self) -> None:
        from aiohttp import web

        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = self.runner.addresses[0][1]

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(30)
        self.loop.close()

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, str, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.getheader("Content-Type", ""), r.read()
        finally:
            conn.close()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Server]:
    tmp = tmp_path_factory.mktemp("api-limits")
    store = SeriesStore(StoreConfig(path=str(tmp / "store"), fsync=False))
    index = EntityIndex(tmp / "entities.jsonl")
    fl = make_fleet(n_racks=4, nodes_per_rack=2, gpus=4, seconds=120, partitions=2)
    process_all(RackStage(store, index, topic="t.samples", lateness_ms=5000), fl.messages)
    reads = {"n": 0}
    real_read = store.read

    def counting_read(*args: Any, **kwargs: Any) -> Any:
        reads["n"] += 1
        return real_read(*args, **kwargs)

    store.read = counting_read  # type: ignore[method-assign]
    engine = QueryEngine(store, index, QueryLimits(max_samples=N_GPUS * 20))
    server = _Server(engine)
    server.reads = reads  # type: ignore[attr-defined]
    yield server
    server.close()
    index.close()
    store.close()


def _error_of(status: int, ctype: str, body: bytes) -> dict[str, Any]:
    """Assert Prometheus' error shape and return the decoded body."""
    assert ctype.startswith("application/json"), (status, ctype, body[:200])
    doc = json.loads(body)
    assert doc["status"] == "error", doc
    assert isinstance(doc["errorType"], str) and doc["errorType"], doc
    assert isinstance(doc["error"], str) and doc["error"], doc
    assert set(doc) == {"status", "errorType", "error"}, doc
    return doc


def _range_qs(query: str, seconds: int = 60, step: str = "10") -> str:
    return urllib.parse.urlencode({"query": query, "start": str(T0 / 1000 + 10),
                                   "end": str(T0 / 1000 + 10 + seconds), "step": step})


def test_a_20000_char_grafana_query_is_answered(served: _Server) -> None:
    """A ``node=~"a|b|..."`` expansion over 2,000 nodes: aiohttp's parser used to refuse it
    in plain text; now it reaches the engine and is answered."""
    names = served.engine.index.label_values("node")
    assert len(names) == 8
    names += [f"absent{i:05d}" for i in range(2000)]
    query = 'fleetpulse_gpu_temperature_celsius{level="gpu",node=~"' + "|".join(names) + '"}'
    assert len(query) > 20_000
    status, _, body = served.request("GET", "/api/v1/query_range?" + _range_qs(query))
    assert status == 200, body[:300]
    doc = json.loads(body)
    assert len(doc["data"]["result"]) == N_GPUS


@pytest.mark.parametrize(("method", "path", "body", "headers", "status", "etype", "fragment"), [
    # handler: the query's own length limit, checked before parsing
    ("GET", "/api/v1/query?" + urllib.parse.urlencode({"query": "x" * (MAX_QUERY_CHARS + 1)}),
     None, {}, 400, "bad_data", f"limit of {MAX_QUERY_CHARS}"),
    # HTTP parser: a request line beyond even the raised limit
    ("GET", "/api/v1/query?query=" + "y" * 300_000, None, {}, 400, "bad_data", "longer than"),
    # router
    ("GET", "/api/v1/nope", None, {}, 404, "not_found", "Not Found"),
    ("DELETE", "/api/v1/query", None, {}, 405, "bad_data", "Method Not Allowed"),
    # body reader: declared and actual size over the limit
    ("POST", "/api/v1/query", b"query=" + b"z" * MAX_BODY,
     {"Content-Type": "application/x-www-form-urlencoded"}, 413, "bad_data", "larger than"),
    # parameters
    ("GET", "/api/v1/query_range?" + _range_qs("up", step="-5"), None, {}, 400, "bad_data",
     "positive"),
    ("GET", "/api/v1/label/bad-name/values", None, {}, 400, "bad_data", "invalid label"),
    ("GET", "/api/v1/series?" + urllib.parse.urlencode([("match[]", "up")] * 65), None, {},
     400, "bad_data", "limit of 64"),
])
def test_every_layer_errors_in_prometheus_shape(served: _Server, method: str, path: str,
                                                body: bytes | None, headers: dict[str, str],
                                                status: int, etype: str, fragment: str) -> None:
    got, ctype, raw = served.request(method, path, body, headers)
    assert got == status, raw[:300]
    doc = _error_of(got, ctype, raw)
    assert doc["errorType"] == etype
    assert fragment in doc["error"], doc["error"]


def test_a_query_that_would_read_too_much_is_refused_before_it_reads(served: _Server) -> None:
    reads = served.reads  # type: ignore[attr-defined]
    ok = 'fleetpulse_gpu_temperature_celsius{level="gpu"}'
    # 32 series x 7 points = 224 <= 640: answered (and read)
    before = reads["n"]
    status, _, body = served.request("GET", "/api/v1/query_range?" + _range_qs(ok, 60))
    assert status == 200, body[:300]
    assert reads["n"] > before
    # 32 series x 31 points = 992 > 640: refused with 422 before the store is touched
    before = reads["n"]
    status, ctype, body = served.request("GET", "/api/v1/query_range?" + _range_qs(ok, 300))
    doc = _error_of(status, ctype, body)
    assert status == 422 and doc["errorType"] == "execution"
    assert "too many samples" in doc["error"]
    assert reads["n"] == before


# ------------------------------------------------------------------ fuzzing from the OpenAPI

_PROMQL_BITS = st.sampled_from([
    "fleetpulse_gpu_temperature_celsius", "fleetpulse_gpu_power_watts", "up", "{", "}", "(",
    ")", "[5m]", '{level="gpu"}', '{level=~"rack|row"}', '{node!~"x.*"}', '{gpu="0"}',
    "sum by (rack) ", "avg without (gpu) ", "quantile(0.9, ", "max", "min", ",", "=~", '"',
    "\\", "{__name__=~\".+\"}", '{agg="p99"}', "rate(", "1e308", "-", "+", "NaN", " ", "\n",
    "\x00", "é", "{level=\"gpu\",node=~\"(\"}", "offset 5m", "@ 0",
])
_PROMQL = st.one_of(st.lists(_PROMQL_BITS, max_size=12).map("".join), st.text(max_size=80))
_TIME = st.one_of(
    st.integers(-10**15, 10**15).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
    st.sampled_from([str(T0 / 1000), str(T0 / 1000 + 60), "2023-11-14T22:13:20Z",
                     "2023-11-14T22:13:20", "now", "", "1e400", "-0", "2023-02-30T00:00:00Z"]),
    st.text(max_size=30),
)
_DURATION = st.one_of(
    st.sampled_from(["1", "10", "0.001", "15s", "1h30m", "1y", "0", "-1", "1e-9", "1d", "5ms",
                     "", "1.5", "99999999999y", "NaN"]),
    st.integers(-10**9, 10**12).map(str), st.text(max_size=12))
_BY_NAME: dict[str, st.SearchStrategy[str]] = {
    "query": _PROMQL, "match[]": _PROMQL, "start": _TIME, "end": _TIME, "time": _TIME,
    "step": _DURATION, "metric": st.one_of(_PROMQL_BITS, st.text(max_size=20)),
    "name": st.one_of(st.sampled_from(["level", "node", "gpu", "__name__", "agg", "foo"]),
                      st.text(max_size=20)),
}


def _operations() -> list[tuple[str, str, list[dict[str, Any]]]]:
    """(method, path, parameters) of every operation the OpenAPI document declares; a form
    POST takes the parameters of the GET on the same path."""
    doc = openapi_document()
    ops = []
    for path, item in doc["paths"].items():
        get_params = item.get("get", {}).get("parameters", [])
        for method, op in item.items():
            ops.append((method.upper(), path, op.get("parameters", get_params)))
    return ops


OPERATIONS = _operations()


def _value(param: dict[str, Any]) -> st.SearchStrategy[str]:
    enum = param.get("schema", {}).get("enum")
    base = _BY_NAME.get(param["name"], st.text(max_size=30))
    return st.one_of(st.sampled_from(enum), base) if enum else base


@st.composite
def _requests(draw: st.DrawFn) -> tuple[str, str, bytes | None, dict[str, str]]:
    method, path, params = draw(st.sampled_from(OPERATIONS))
    pairs: list[tuple[str, str]] = []
    for p in params:
        if p["in"] != "query":
            continue
        if p.get("required") or draw(st.booleans()):
            for _ in range(draw(st.integers(1, 2))):
                pairs.append((p["name"], draw(_value(p))))
    if draw(st.booleans()):  # an undeclared parameter now and then
        pairs.append((draw(st.text(min_size=1, max_size=8)), draw(st.text(max_size=8))))
    url_path = path
    for p in params:
        if p["in"] == "path":
            seg = urllib.parse.quote(draw(_value(p)), safe="") or "x"
            url_path = url_path.replace("{" + p["name"] + "}", seg)
    qs = urllib.parse.urlencode(pairs)
    if method == "POST":
        return method, url_path, qs.encode(), {
            "Content-Type": "application/x-www-form-urlencoded"}
    return method, url_path + ("?" + qs if qs else ""), None, {}


@pytest.mark.slow
@settings(max_examples=300, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(req=_requests())
def test_fuzzed_from_openapi_never_5xx_and_errors_are_prometheus_shaped(
        served: _Server, req: tuple[str, str, bytes | None, dict[str, str]]) -> None:
    method, path, body, headers = req
    status, ctype, raw = served.request(method, path, body, headers)
    assert status < 500, (method, path, body, raw[:500])
    assert ctype.startswith("application/json"), (status, ctype, raw[:200])
    doc = json.loads(raw)
    if status == 200:
        assert doc["status"] == "success" and "data" in doc
    else:
        assert status in (400, 413, 422), (status, doc)
        _error_of(status, ctype, raw)


def test_openapi_lists_every_route(served: _Server) -> None:
    """The fuzzer only reaches what the document declares: it must declare every route."""
    declared = {(m, p) for m, p, _ in OPERATIONS}
    app = build_query_app(served.engine)
    routes = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.resource is not None and r.method != "HEAD"}
    routes.discard(("GET", "/api/v1/openapi.json"))
    assert routes <= declared, routes - declared


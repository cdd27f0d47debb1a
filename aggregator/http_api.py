"""The query API: Prometheus' HTTP API (the subset Grafana uses) over the query engine.

Composable: :func:`add_query_routes` adds the routes to any aiohttp Application (the web
page mounts beside them), :func:`build_query_app` makes a fresh one. Parameters come from
the query string or a form-encoded POST body, exactly as Prometheus accepts them; times are
RFC 3339 or Unix seconds, durations seconds or Prometheus durations (``15s``, ``1h30m``).
Responses and errors have Prometheus' JSON shapes::

    {"status": "success", "data": {"resultType": "matrix", "result": [...]}}
    {"status": "error", "errorType": "bad_data", "error": "..."}   (HTTP 400)

Extra parameter: ``resolution`` = raw | 10s | 1m | 1h | 1d | auto picks the tier.

For a fleet heatmap: ``/api/v1/query?query=fleetpulse_gpu_temperature_celsius{level="gpu"}``
returns every GPU's newest window in one vector; ``query_range`` on one GPU drills down.
"""

from __future__ import annotations

import hmac
import math
import re
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Final, TypeVar

import numpy as np
import orjson
from aiohttp import web

from aggregator.http_errors import api_error_middleware, error_response
from aggregator.promql import PromQLError
from aggregator.query_engine import QueryEngine, QueryError, SeriesResult
from aggregator.remote_read import answer as remote_read_answer

__all__ = ["ENGINE_KEY", "MAX_BODY", "MAX_QUERY_CHARS", "Runner", "add_query_routes",
           "build_query_app", "openapi_document"]

T = TypeVar("T")
Runner = Callable[[Callable[[], Any]], Awaitable[Any]]
"""Runs one engine call where the store may be read: the aggregator passes its store thread
(the store is single-threaded and its stages write it there); inline when not given."""

ENGINE_KEY: Final = web.AppKey("fleetpulse_query_engine", QueryEngine)
_RUN_KEY: Final = web.AppKey("fleetpulse_query_runner", object)
_DURATION = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m(?!s))?"
                       r"(?:(\d+)s)?(?:(\d+)ms)?")
_DUR_MS: Final = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
_SCALAR = re.compile(r"\s*([-+]?\d+(?:\.\d*)?)\s*(?:\+\s*([-+]?\d+(?:\.\d*)?)\s*)?")
MAX_BODY: Final = 1 << 20
"""Largest form-encoded POST body (413 above it)."""
MAX_QUERY_CHARS: Final = 65_536
"""Longest PromQL text (query, each match[]): a Grafana ``=~"a|b|..."`` expansion over
thousands of nodes fits; the parser's time stays small against it."""


class _BadRequest(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def _ok(data: Any) -> web.Response:
    return web.Response(body=orjson.dumps({"status": "success", "data": data}),
                        content_type="application/json")


def parse_time(value: str, name: str) -> int:
    """RFC 3339 or Unix seconds (float) -> ms."""
    try:
        f = float(value)
        if math.isfinite(f) and abs(f) < 1e13:
            return round(f * 1000)
    except ValueError:
        pass
    try:
        dt = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise _BadRequest(f"invalid parameter {name!r}: cannot parse {value!r:.60} to a valid "
                          "timestamp") from None
    if dt.tzinfo is None:
        raise _BadRequest(f"invalid parameter {name!r}: timestamp needs a time zone")
    return round(dt.timestamp() * 1000)


def parse_duration(value: str, name: str) -> int:
    """Seconds (float) or a Prometheus duration -> ms."""
    try:
        f = float(value)
        if math.isfinite(f) and abs(f) < 1e13:
            return round(f * 1000)
    except ValueError:
        pass
    m = _DURATION.fullmatch(value)
    if not value or m is None:
        raise _BadRequest(f"invalid parameter {name!r}: cannot parse {value!r:.60} to a valid "
                          "duration")
    return sum(int(g) * mul for g, mul in zip(m.groups(), _DUR_MS, strict=True) if g)


_SPECIAL: Final = {"nan": "NaN", "inf": "+Inf", "-inf": "-Inf"}


def _fmt(v: float) -> str:
    """Prometheus' number strings: shortest repr, no trailing ".0", NaN / +Inf / -Inf."""
    s = repr(v)
    if s.endswith(".0"):
        return s[:-2]
    return _SPECIAL.get(s, s)


def _label_json(res: SeriesResult) -> list[bytes]:
    return res.label_json if res.label_json is not None else [orjson.dumps(x) for x in res.labels]


def _result(result_type: str, items: list[bytes]) -> web.Response:
    """The success envelope around pre-serialised result items (no dict per series)."""
    body = b"".join((b'{"status":"success","data":{"resultType":"', result_type.encode(),
                     b'","result":[', b",".join(items), b"]}}"))
    return web.Response(body=body, content_type="application/json")


def _matrix(res: SeriesResult, start_ms: int, step_ms: int) -> list[bytes]:
    out = []
    times = (start_ms + step_ms * np.arange(res.values.shape[1])) / 1000.0
    for lab, row in zip(_label_json(res), res.values, strict=True):
        ok = ~np.isnan(row)
        if not ok.any():
            continue
        values = orjson.dumps([[t, _fmt(v)] for t, v in zip(times[ok].tolist(),
                                                             row[ok].tolist(), strict=True)])
        out.append(b'{"metric":' + lab + b',"values":' + values + b"}")
    return out


async def _params(request: web.Request) -> dict[str, list[str]]:
    params: dict[str, list[str]] = {}
    for k, v in request.query.items():
        params.setdefault(k, []).append(v)
    if request.method == "POST":
        if request.content_length and request.content_length > MAX_BODY:
            raise _BadRequest(f"request body of {request.content_length} bytes is larger than "
                              f"the limit of {MAX_BODY}", 413)
        form = await request.post()
        for k, fv in form.items():
            if isinstance(fv, str):
                params.setdefault(k, []).append(fv)
    return params


def _one(params: dict[str, list[str]], name: str, default: str | None = None) -> str:
    vals = params.get(name)
    if not vals:
        if default is None:
            raise _BadRequest(f"invalid parameter {name!r}: missing")
        return default
    return vals[-1]


def _promql(text: str, name: str) -> str:
    """A PromQL parameter within :data:`MAX_QUERY_CHARS` (checked before parsing)."""
    if len(text) > MAX_QUERY_CHARS:
        raise _BadRequest(f"invalid parameter {name!r}: {len(text)} characters, more than the "
                          f"limit of {MAX_QUERY_CHARS}")
    return text


Handler = Callable[[web.Request, QueryEngine, dict[str, list[str]]],
                   Awaitable[web.StreamResponse]]


async def _inline(fn: Callable[[], Any]) -> Any:
    return fn()


async def _engine(request: web.Request, fn: Callable[[], T]) -> T:
    """``fn()`` (an engine call) on the app's runner."""
    run: Runner = request.app.get(_RUN_KEY, _inline)  # type: ignore[assignment]
    result: T = await run(fn)
    return result


def _wrap(fn: Handler) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handler(request: web.Request) -> web.StreamResponse:
        engine = request.app[ENGINE_KEY]
        try:
            params = await _params(request)
            return await fn(request, engine, params)
        except _BadRequest as exc:
            return error_response(exc.status, str(exc), "bad_data")
        except PromQLError as exc:
            return error_response(400, str(exc), "bad_data")
        except QueryError as exc:
            # execution: the query is valid but would read too much (Prometheus: 422)
            return error_response(422 if exc.error_type == "execution" else 400, str(exc),
                                  exc.error_type)
    return handler


async def _query_range(request: web.Request, engine: QueryEngine,
                       params: dict[str, list[str]]) -> web.Response:
    query = _promql(_one(params, "query"), "query")
    start = parse_time(_one(params, "start"), "start")
    end = parse_time(_one(params, "end"), "end")
    step = parse_duration(_one(params, "step"), "step")
    res = await _engine(request, lambda: engine.query_range(
        query, start, end, step, params.get("resolution", [None])[-1]))
    return _result("matrix", _matrix(res, start, step))


async def _query(request: web.Request, engine: QueryEngine,
                 params: dict[str, list[str]]) -> web.Response:
    query = _promql(_one(params, "query"), "query")
    t = parse_time(_one(params, "time", str(time.time())), "time")
    scalar = _SCALAR.fullmatch(query)
    if scalar:
        v = float(scalar.group(1)) + float(scalar.group(2) or 0.0)
        return _ok({"resultType": "scalar", "result": [t / 1000.0, _fmt(v)]})
    res = await _engine(request, lambda: engine.query_instant(
        query, t, params.get("resolution", [None])[-1]))
    stamp = b',"value":[' + orjson.dumps(t / 1000.0) + b',"'
    vec = [b'{"metric":' + lab + stamp + _fmt(v).encode() + b'"]}'
           for lab, v in zip(_label_json(res), res.values[:, 0].tolist(), strict=True)
           if v == v]  # NaN: no sample in the lookback, no element
    return _result("vector", vec)


async def _series(request: web.Request, engine: QueryEngine,
                  params: dict[str, list[str]]) -> web.Response:
    match = params.get("match[]")
    if not match:
        raise _BadRequest("no match[] parameter provided")
    selectors = [_promql(m, "match[]") for m in match]
    return _ok(await _engine(request, lambda: engine.series(selectors)))


async def _labels(request: web.Request, engine: QueryEngine,
                  params: dict[str, list[str]]) -> web.Response:
    return _ok(await _engine(request, engine.label_names))


async def _label_values(request: web.Request, engine: QueryEngine,
                        params: dict[str, list[str]]) -> web.Response:
    name = request.match_info["name"]
    if re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", name) is None:
        raise _BadRequest(f"invalid label name: {name!r:.60}")
    return _ok(await _engine(request, lambda: engine.label_values(name)))


async def _buildinfo(request: web.Request, engine: QueryEngine,
                     params: dict[str, list[str]]) -> web.Response:
    from fleetpulse import __version__

    return _ok({"version": __version__, "revision": "", "branch": "", "buildUser": "",
                "buildDate": "", "goVersion": "", "application": "fleetpulse"})


async def _metadata(request: web.Request, engine: QueryEngine,
                    params: dict[str, list[str]]) -> web.Response:
    """Metric metadata from the catalog (Grafana's autocomplete asks for it)."""
    from schemas.catalog import CATALOG, Kind

    kinds = {Kind.GAUGE: "gauge", Kind.COUNTER: "counter", Kind.STATE: "gauge",
             Kind.EVENT: "gauge"}
    wanted = params.get("metric", [None])[-1]
    return _ok({m.name: [{"type": kinds[m.kind], "help": m.help, "unit": m.unit}]
                for m in CATALOG if wanted in (None, m.name)})


async def _remote_read(request: web.Request, engine: QueryEngine,
                       params: dict[str, list[str]]) -> web.StreamResponse:
    """Prometheus' remote read (:mod:`aggregator.remote_read`), on the app's runner."""
    return await remote_read_answer(request, engine, lambda fn: _engine(request, fn), params)


async def _openapi(request: web.Request) -> web.Response:
    return web.Response(body=orjson.dumps(openapi_document()), content_type="application/json")


def _auth_middleware(token: str) -> Any:
    expected = f"Bearer {token}".encode()

    @web.middleware
    async def auth(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.path.startswith("/api/"):
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, expected):
                return error_response(401, "missing or wrong bearer token")
        return await handler(request)
    return auth


def add_query_routes(app: web.Application, engine: QueryEngine,
                     run: Runner | None = None) -> None:
    """Mount the Prometheus-compatible routes (GET and form POST) on ``app``; engine calls
    go through ``run`` when given (see :data:`Runner`).

    Also puts :func:`~aggregator.http_errors.api_error_middleware` on ``app`` (once), so
    aiohttp's own errors under ``/api/`` come in the same JSON shape.
    """
    app[ENGINE_KEY] = engine
    if run is not None:
        app[_RUN_KEY] = run
    if api_error_middleware not in app.middlewares:
        app.middlewares.append(api_error_middleware)
    for path, fn in (("/api/v1/query_range", _query_range), ("/api/v1/query", _query),
                     ("/api/v1/series", _series), ("/api/v1/labels", _labels),
                     ("/api/v1/label/{name}/values", _label_values),
                     ("/api/v1/status/buildinfo", _buildinfo),
                     ("/api/v1/metadata", _metadata)):
        h = _wrap(fn)
        app.router.add_get(path, h)
        if path.endswith(("query_range", "query", "series", "labels")):
            app.router.add_post(path, h)
    app.router.add_post("/api/v1/read", _wrap(_remote_read))
    app.router.add_get("/api/v1/openapi.json", _openapi)


def build_query_app(engine: QueryEngine, *, bearer_token: str = "",
                    run: Runner | None = None) -> web.Application:
    """A new Application with the query routes; protect ``/api/`` with a token if given."""
    app = web.Application(middlewares=[_auth_middleware(bearer_token)] if bearer_token else [],
                          client_max_size=MAX_BODY)
    add_query_routes(app, engine, run)
    return app


def openapi_document() -> dict[str, Any]:
    """OpenAPI 3.0 description of the query API (served at /api/v1/openapi.json)."""
    common = [
        {"name": "query", "in": "query", "required": True, "schema": {"type": "string"},
         "description": "PromQL subset: selectors with =, !=, =~, !~ over __name__, level, "
                        "cluster, row, rack, node, gpu, agg; sum/avg/min/max/quantile by/without"},
        {"name": "resolution", "in": "query", "schema": {
            "type": "string", "enum": ["auto", "raw", "10s", "1m", "1h", "1d"]},
         "description": "tier to read; default chosen from the step"},
    ]
    ok = {"200": {"description": "Prometheus success envelope"},
          "400": {"description": "bad_data: invalid parameters, query or limits exceeded"},
          "401": {"description": "bearer token missing or wrong"},
          "413": {"description": "bad_data: request body over 1 MiB"},
          "422": {"description": "execution: the query would read more samples than allowed"}}
    rng = common + [
        {"name": n, "in": "query", "required": True, "schema": {"type": "string"},
         "description": d} for n, d in (("start", "RFC 3339 or Unix seconds"),
                                        ("end", "RFC 3339 or Unix seconds"),
                                        ("step", "seconds or a duration like 1m"))]
    inst = [*common, {"name": "time", "in": "query", "schema": {"type": "string"},
                      "description": "evaluation time; default now"}]
    form = {"content": {"application/x-www-form-urlencoded": {"schema": {"type": "object"}}}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "fleetpulse query API", "version": "1",
                 "description": "Prometheus-compatible reads of fleetpulse rollups."},
        "paths": {
            "/api/v1/query_range": {
                "get": {"summary": "Range query (matrix)", "parameters": rng, "responses": ok},
                "post": {"summary": "Range query, form-encoded", "requestBody": form,
                         "responses": ok}},
            "/api/v1/query": {
                "get": {"summary": "Instant query (vector): newest window per series",
                        "parameters": inst, "responses": ok},
                "post": {"summary": "Instant query, form-encoded", "requestBody": form,
                         "responses": ok}},
            "/api/v1/series": {
                "get": {"summary": "Series matching match[] selectors (at most 64)",
                        "parameters": [{"name": "match[]", "in": "query", "required": True,
                                        "schema": {"type": "string"}}],
                        "responses": ok},
                "post": {"summary": "Series, form-encoded", "requestBody": form,
                         "responses": ok}},
            "/api/v1/read": {"post": {
                "summary": "Prometheus remote read: snappy-compressed prompb.ReadRequest; "
                           "SAMPLES or STREAMED_XOR_CHUNKS answer",
                "parameters": [{"name": "resolution", "in": "query",
                                "schema": {"type": "string"}}],
                "responses": ok}},
            "/api/v1/labels": {"get": {"summary": "Label names", "responses": ok},
                               "post": {"summary": "Label names", "responses": ok}},
            "/api/v1/status/buildinfo": {"get": {"summary": "Version of this fleetpulse",
                                                 "responses": ok}},
            "/api/v1/metadata": {"get": {"summary": "Type, help and unit of every metric",
                                         "responses": ok}},
            "/api/v1/label/{name}/values": {"get": {
                "summary": "Values of one label",
                "parameters": [{"name": "name", "in": "path", "required": True,
                                "schema": {"type": "string"}}], "responses": ok}},
        },
    }

"""Serves the heatmap page on any aiohttp application (normally the aggregator's query API).

The page is three static files shipped in this package (no CDN, no build step) plus three
small JSON endpoints: ``web/config.json`` (what the page should query), ``web/alerts``
(recent alerts and the data clock) and ``web/health`` (the worst GPUs, which the page's
"health (7 days)" colour mode shows). Every route is a fixed path, so no file name is ever
built from request input. The page expects the Prometheus-compatible API
(``api/v1/query_range``, ``api/v1/label/__name__/values``) on the same origin and root.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources
from typing import Final

from aiohttp import web

from fleetpulse.config import ConfigError
from fleetpulse.health_rank import parse_window
from fleetpulse.web.alert_board import AlertBoard
from schemas.catalog import BY_NAME, CATALOG

__all__ = ["WebConfig", "add_web_routes", "page_config"]

_ASSETS: Final = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "app.css": "text/css",
}
MAX_ALERTS: Final = 1000


def _asset(name: str) -> bytes:
    return resources.files("fleetpulse.web").joinpath(name).read_bytes()


@dataclass(frozen=True, slots=True)
class WebConfig:
    """What the page queries and how it behaves; served to it as ``web/config.json``."""

    default_metric: str = "fleetpulse_gpu_temperature_celsius"
    """Metric the heatmap shows first."""
    range_s: int = 3600
    """How far back the time scrubber reaches (seconds of data time)."""
    min_step_s: int = 10
    """Smallest step of the range query (the aggregator's base window)."""
    max_points: int = 300_000
    """Budget of points (GPUs x steps) for one range fetch; the step grows to stay under it."""
    refresh_s: float = 3.0
    """How often the page polls for new data and alerts (wall-clock seconds)."""
    alert_limit: int = 300
    """Most alerts the page fetches and lists."""
    play_interval_ms: int = 120
    """Delay between frames when replaying the range."""
    gpu_matchers: str = ""
    """Extra label matchers for per-GPU series, e.g. ``agg="max"`` (empty: none)."""
    group_matchers: str = ""
    """Extra label matchers for node/rack/row/cluster series (empty: none)."""
    gpu_entity: str = "{cluster}/{row}/{rack}/{node}/gpu-{gpu}"
    """How an alert names a GPU; must match the detector's entity paths."""
    chart_metrics: tuple[str, ...] = (
        "fleetpulse_gpu_temperature_celsius",
        "fleetpulse_gpu_power_usage_watts",
        "fleetpulse_gpu_utilization_ratio",
        "fleetpulse_gpu_sm_clock_hertz",
        "fleetpulse_gpu_memory_temperature_celsius",
        "fleetpulse_gpu_clock_event_reasons",
    )
    """Metrics charted for one GPU."""
    expected_gpus: int = 0
    """Fleet size hint for the first fetch's step (0: learn it from the data)."""

    def validate(self) -> None:
        if self.default_metric not in BY_NAME:
            raise ConfigError(f"web.default_metric {self.default_metric!r} is not in the catalog")
        for name in self.chart_metrics:
            if name not in BY_NAME:
                raise ConfigError(f"web.chart_metrics: {name!r} is not in the catalog")
        if not 60 <= self.range_s <= 7 * 86400:
            raise ConfigError("web.range_s must be between 60 and 604800")
        if self.min_step_s < 1 or self.max_points < 1000:
            raise ConfigError("web.min_step_s must be >= 1 and web.max_points >= 1000")
        if self.refresh_s <= 0 or self.play_interval_ms < 10:
            raise ConfigError("web.refresh_s must be > 0 and web.play_interval_ms >= 10")
        if not 1 <= self.alert_limit <= MAX_ALERTS:
            raise ConfigError(f"web.alert_limit must be between 1 and {MAX_ALERTS}")
        for part in ("{cluster}", "{row}", "{rack}", "{node}", "{gpu}"):
            if part not in self.gpu_entity:
                raise ConfigError(f"web.gpu_entity must contain {part}")


def page_config(config: WebConfig, now_ms: int) -> dict[str, object]:
    """The JSON the page starts from: the catalog's GPU metrics and the query settings."""
    fields = dataclasses.asdict(config)
    levels = ("cluster", "row", "rack", "node")
    return {
        **fields,
        "chart_metrics": list(config.chart_metrics),
        "api_base": "",
        "now_ms": now_ms,
        "max_alerts": MAX_ALERTS,  # the most rows web/alerts and web/health answer with
        "level_matchers": {"gpu": config.gpu_matchers}
        | {lvl: config.group_matchers for lvl in levels},
        "metrics": [
            {"name": m.name, "unit": m.unit, "kind": m.kind.value, "help": m.help}
            for m in CATALOG
        ],
    }


def add_web_routes(
    app: web.Application, board: AlertBoard, config: WebConfig | None = None
) -> str:
    """Mount the page on ``app`` (before it starts); returns the page's path.

    Routes: the page, ``/web/*`` assets, ``/web/config.json``, ``/web/alerts`` and
    ``/web/health?window=7d&limit=20`` (the worst GPUs, ``fleetpulse.health_rank``).

    If ``app`` already serves ``/``, the page goes to ``/heatmap`` instead (same directory,
    so its relative asset and API URLs still resolve).
    """
    cfg = config or WebConfig()
    cfg.validate()
    assets = {name: _asset(name) for name in _ASSETS}

    def static(name: str) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
        body, ctype = assets[name], _ASSETS[name]

        async def handler(_request: web.Request) -> web.Response:
            return web.Response(
                body=body, content_type=ctype, charset="utf-8",
                headers={"Cache-Control": "no-cache"},
            )

        return handler

    async def config_json(_request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": page_config(cfg, board.clock())})

    async def alerts_json(request: web.Request) -> web.Response:
        raw = request.query.get("limit", str(cfg.alert_limit))
        if not raw.isdigit() or not 1 <= int(raw) <= MAX_ALERTS:
            return web.json_response(
                {"status": "error", "errorType": "bad_data",
                 "error": f"limit must be an integer between 1 and {MAX_ALERTS}"},
                status=400,
            )
        return web.json_response({"status": "success", "data": board.snapshot(int(raw))})

    async def health_json(request: web.Request) -> web.Response:
        window = request.query.get("window", "7d")
        raw = request.query.get("limit", "20")
        try:
            window_ms = parse_window(window)
            if not raw.isdigit() or not 1 <= int(raw) <= MAX_ALERTS:
                raise ValueError(f"limit must be an integer between 1 and {MAX_ALERTS}")
        except ValueError as exc:
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": str(exc)}, status=400)
        top = board.health.top(window_ms, int(raw), now_ms=int(board.clock()))
        return web.json_response({"status": "success", "data": {
            "window": window, "now_ms": int(board.clock()),
            "gpus": [dataclasses.asdict(h) for h in top]}})

    taken = {
        (getattr(r.resource, "canonical", None), r.method) for r in app.router.routes()
    }
    index = "/heatmap" if ("/", "GET") in taken else "/"
    app.router.add_get(index, static("index.html"))
    app.router.add_get("/web/app.js", static("app.js"))
    app.router.add_get("/web/app.css", static("app.css"))
    app.router.add_get("/web/config.json", config_json)
    app.router.add_get("/web/alerts", alerts_json)
    app.router.add_get("/web/health", health_json)
    return index

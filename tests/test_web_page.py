"""The heatmap page in a real headless Chromium, against a real aiohttp server.

The server here speaks the Prometheus API shapes (``/api/v1/query_range``,
``/api/v1/label/__name__/values``) over data generated in this module with numpy — a fleet
whose temperatures follow its load, with a cooling wave that climbs one rack and one GPU in
thermal runaway — so the page is tested on values it has never seen, at any fleet size
(10,240 GPUs for the render-time check). The page routes are the real ones
(:func:`fleetpulse.web.add_web_routes`). ``tests/test_demo_web.py`` runs the same page on
the real stages.

Helpers here (``BrowserPage``, ``ServerThread``, ``chromium``) are imported by the demo tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
from aiohttp import web

from fleetpulse.web import AlertBoard, WebConfig, add_web_routes
from schemas.records import (
    Action,
    AlertRecord,
    AlertState,
    Attribution,
    IncidentRecord,
    Severity,
)

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or CHROMEDRIVER is None,
    reason="needs Debian chromium and chromium-driver (scripts/test.sh installs them)",
    installed_by_test_command=True,
)

STEP_S = 10
HOUR_S = 3600


# ---------------------------------------------------------------------------- browser
def chromium(width: int = 1400, height: int = 1000) -> Any:
    """A headless Chromium driven through chromedriver (selenium), with no network use."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM or ""
    for arg in (
        "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
        f"--window-size={width},{height}", "--force-device-scale-factor=1",
        "--disable-extensions", "--no-first-run", "--disable-background-networking",
    ):
        opts.add_argument(arg)
    return webdriver.Chrome(service=Service(CHROMEDRIVER or ""), options=opts)


class BrowserPage:
    """Small, explicit helpers over a selenium driver showing the heatmap page."""

    def __init__(self, driver: Any) -> None:
        self.driver = driver

    def open(self, url: str, timeout: float = 30.0) -> None:
        self.driver.get(url)
        self.wait(lambda: self.attr("ready") == "1" or self.attr("error"), timeout, "page ready")
        assert not self.attr("error"), f"page failed: {self.attr('error')}"

    def attr(self, name: str) -> str:
        return str(self.driver.execute_script(
            "return document.getElementById('heatmap').dataset[arguments[0]] || ''", name))

    def js(self, script: str, *args: Any) -> Any:
        return self.driver.execute_script(script, *args)

    def wait(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = cond()
            if value:
                return value
            if time.monotonic() > deadline:
                status = self.js("return document.getElementById('status').textContent")
                raise AssertionError(f"timed out waiting for {what}; page status: {status}")
            time.sleep(0.1)

    def click_canvas(self, x: float, y: float) -> None:
        """A real mouse click at (x, y) CSS pixels from the canvas' top-left corner."""
        from selenium.webdriver.common.action_chains import ActionChains

        # bring the point to the middle of the viewport, then click at viewport coordinates
        vx, vy = self.js(
            "const c = document.getElementById('heatmap'); let r = c.getBoundingClientRect();"
            "window.scrollBy(0, r.top + arguments[1] - window.innerHeight / 2);"
            "r = c.getBoundingClientRect(); return [r.left + arguments[0], r.top + arguments[1]];",
            x, y)
        actions = ActionChains(self.driver)
        actions.w3c_actions.pointer_action.move_to_location(int(vx), int(vy))
        actions.w3c_actions.pointer_action.click()
        actions.perform()

    def click_group(self, path: str) -> None:
        pos = self.js("return window.fleetpulse.groupCenter(arguments[0])", path)
        assert pos, f"group {path} is not drawn"
        self.click_canvas(pos["x"], pos["y"])

    def click_label(self, path: str) -> None:
        pos = self.js(
            "const g = window.fleetpulse.state.layout.groups.find("
            "  x => x.path.join('/') === arguments[0]);"
            "return g && g.labelRect ? {x: g.labelRect.x + 4, y: g.labelRect.y + g.labelRect.h / 2}"
            " : null", path)
        assert pos, f"label of {path} is not drawn"
        self.click_canvas(pos["x"], pos["y"])

    def cell_rgb(self, path: str) -> tuple[int, int, int]:
        """The colour the canvas shows at the centre of a GPU's cell."""
        rgb = self.js(
            "const p = window.fleetpulse.cellCenter(arguments[0]); if (!p) return null;"
            "const c = document.getElementById('heatmap'); const d = window.devicePixelRatio || 1;"
            "const px = c.getContext('2d').getImageData(Math.round(p.x * d), Math.round(p.y * d),"
            " 1, 1).data; return [px[0], px[1], px[2]];", path)
        assert rgb, f"cell {path} is not drawn"
        return (int(rgb[0]), int(rgb[1]), int(rgb[2]))

    def highlighted(self) -> set[str]:
        return set(self.attr("highlighted").split())


@pytest.fixture(scope="module")
def browser() -> Iterator[BrowserPage]:
    driver = chromium()
    try:
        yield BrowserPage(driver)
    finally:
        driver.quit()


# ---------------------------------------------------------------------------- server
class ServerThread:
    """Runs an aiohttp app on 127.0.0.1 (free port) in its own event loop thread."""

    def __init__(self, app: web.Application) -> None:
        self.app = app
        self.loop = asyncio.new_event_loop()
        self.port = 0
        self._ready = threading.Event()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            self._runner = web.AppRunner(self.app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            self.port = int(self._runner.addresses[0][1])

        self.loop.run_until_complete(start())
        self._ready.set()
        self.loop.run_forever()
        assert self._runner is not None
        self.loop.run_until_complete(self._runner.cleanup())
        self.loop.close()

    def call(self, fn: Callable[[], Any]) -> None:
        """Run ``fn`` on the server's loop (the board is not thread-safe)."""
        done = threading.Event()

        def run() -> None:
            fn()
            done.set()

        self.loop.call_soon_threadsafe(run)
        done.wait(5)

    def __enter__(self) -> ServerThread:
        self._thread.start()
        assert self._ready.wait(10), "server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/"


# ---------------------------------------------------------------------------- generated fleet
@dataclass
class GeneratedFleet:
    """A fleet's last hour at 10 s, made with numpy: load-driven temperatures plus two faults.

    - a cooling wave: in ``wave_rack`` the inlet warms node by node from the bottom up, each
      node ``wave_lag_s`` after the one below (what the scrubber must make visible);
    - thermal runaway on ``hot_gpu`` over the last ten minutes.
    """

    rows: int
    racks: int
    nodes: int
    gpus: int
    end_s: int
    seed: int = 7
    cluster: str = "sim"
    wave_rack: tuple[int, int] = (1, 2)
    wave_start_s: int = 1200
    wave_lag_s: int = 180
    hot_gpu: int = 5

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        g = self.rows * self.racks * self.nodes * self.gpus
        t = HOUR_S // STEP_S
        self.start_s = self.end_s - (t - 1) * STEP_S
        self.times = self.start_s + STEP_S * np.arange(t)
        gi = np.arange(g)
        self.gpu_of = gi % self.gpus
        self.node_of = (gi // self.gpus) % self.nodes
        self.rack_of = (gi // (self.gpus * self.nodes)) % self.racks
        self.row_of = gi // (self.gpus * self.nodes * self.racks)
        node_id = gi // self.gpus
        busy = rng.random(node_id.max() + 1) < 0.7
        phase = rng.random(node_id.max() + 1) * 2 * np.pi
        ts = np.arange(t)[None, :]
        util = np.where(busy[node_id][:, None],
                        0.85 + 0.1 * np.sin(ts / 6.0 + phase[node_id][:, None]), 0.02)
        util = np.clip(util + rng.normal(0, 0.02, (g, t)), 0, 1)
        power = 90 + 560 * util + rng.normal(0, 8, (g, t))
        inlet = 24 + 1.5 * self.node_of[:, None] + np.zeros((g, t))
        in_wave = (self.row_of == self.wave_rack[0]) & (self.rack_of == self.wave_rack[1])
        arrive = self.start_s + self.wave_start_s + self.node_of * self.wave_lag_s
        wave = np.clip((self.times[None, :] - arrive[:, None]) / 300.0, 0, 1) * 22
        inlet = inlet + np.where(in_wave[:, None], wave, 0)
        temp = inlet + 0.07 * power + rng.normal(0, 0.6, (g, t))
        ramp = np.clip((self.times - (self.end_s - 600)) / 600.0, 0, 1) * 35
        temp[self.hot_gpu] += ramp
        self.wave_gpus = np.flatnonzero(in_wave)
        self.values: dict[str, npt.NDArray[np.float64]] = {
            "fleetpulse_gpu_temperature_celsius": np.round(temp),
            "fleetpulse_gpu_power_usage_watts": np.round(power, 3),
            "fleetpulse_gpu_utilization_ratio": np.round(util, 2),
        }

    @property
    def size(self) -> int:
        return self.rows * self.racks * self.nodes * self.gpus

    def labels(self, i: int) -> dict[str, str]:
        r, k, n = int(self.row_of[i]), int(self.rack_of[i]), int(self.node_of[i])
        return {
            "cluster": self.cluster, "row": f"row-{r:03d}", "rack": f"rack-{r:03d}-{k:02d}",
            "node": f"node-{r:03d}-{k:02d}-{n:02d}", "gpu": str(int(self.gpu_of[i])),
        }

    def path(self, i: int) -> str:
        lab = self.labels(i)
        return f"{lab['cluster']}/{lab['row']}/{lab['rack']}/{lab['node']}/gpu-{lab['gpu']}"


_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse_selector(q: str) -> tuple[str, list[tuple[str, str, str]]]:
    """``name{a="b",c=~"x|y"}`` -> (name, [(label, op, value)]); raises ValueError."""
    m = re.fullmatch(r"\s*([A-Za-z_:][A-Za-z0-9_:]*)\s*(?:\{(.*)\})?\s*", q, re.S)
    if not m:
        raise ValueError(f"unsupported query {q!r}")
    body, out, pos = m.group(2) or "", [], 0
    while pos < len(body):
        mm = _MATCHER.match(body, pos)
        if not mm:
            raise ValueError(f"bad matcher at {body[pos:]!r}")
        out.append((mm.group(1), mm.group(2), mm.group(3)))
        pos = mm.end()
    return m.group(1), out


def _matches(labels: dict[str, str], matchers: list[tuple[str, str, str]]) -> bool:
    for name, op, value in matchers:
        have = labels.get(name, "")
        ok = {"=": have == value, "!=": have != value,
              "=~": re.fullmatch(value, have) is not None,
              "!~": re.fullmatch(value, have) is None}[op]
        if not ok:
            return False
    return True


def prometheus_app(fleet: GeneratedFleet) -> web.Application:
    """The Prometheus API shapes over ``fleet``: GPU series and avg/max rollups per level."""
    keys = ("cluster", "row", "rack", "node")

    def series(name: str, matchers: list[tuple[str, str, str]]
               ) -> list[tuple[dict[str, str], npt.NDArray[np.float64]]]:
        data = fleet.values.get(name)
        if data is None:
            return []
        level = next((v for k, op, v in matchers if k == "level" and op == "="), "gpu")
        if level == "gpu":
            out = []
            for i in range(fleet.size):
                lab = {"__name__": name, "level": "gpu", **fleet.labels(i)}
                if _matches(lab, matchers):
                    out.append((lab, data[i]))
            return out
        depth = keys.index(level) + 1
        groups: dict[tuple[str, ...], list[int]] = {}
        for i in range(fleet.size):
            lab = fleet.labels(i)
            groups.setdefault(tuple(lab[k] for k in keys[:depth]), []).append(i)
        out = []
        for key, members in groups.items():
            for agg, fn in (("avg", np.mean), ("max", np.max)):
                lab = {"__name__": name, "level": level, "agg": agg, **dict(zip(keys, key, strict=False))}
                if _matches(lab, matchers):
                    out.append((lab, fn(data[members], axis=0)))
        return out

    def error(msg: str) -> web.Response:
        return web.json_response({"status": "error", "errorType": "bad_data", "error": msg},
                                 status=400)

    async def query_range(request: web.Request) -> web.Response:
        params = dict(request.query) | dict(await request.post())
        try:
            name, matchers = parse_selector(str(params["query"]))
            start, end, step = (float(params[k]) for k in ("start", "end", "step"))
        except (KeyError, ValueError) as exc:
            return error(str(exc))
        steps = np.arange(start, end + 1e-9, step)
        idx = np.floor((steps - fleet.start_s) / STEP_S).astype(np.int64)
        ok = (idx >= 0) & (idx < len(fleet.times))
        result = [
            {"metric": lab, "values": [[float(t), repr(float(v[i]))]
                                       for t, i in zip(steps[ok], idx[ok], strict=True)]}
            for lab, v in series(name, matchers)
        ]
        return web.json_response({"status": "success",
                                  "data": {"resultType": "matrix", "result": result}})

    async def query(request: web.Request) -> web.Response:
        """Instant vector: each series' newest sample at or before ``time`` (5 min lookback)."""
        params = dict(request.query) | dict(await request.post())
        try:
            name, matchers = parse_selector(str(params["query"]))
            at = float(params.get("time", fleet.end_s))
        except (KeyError, ValueError) as exc:
            return error(str(exc))
        i = int(np.floor((at - fleet.start_s) / STEP_S))
        result = []
        if 0 <= i < len(fleet.times) or 0 <= at - fleet.times[-1] <= 300:
            i = min(i, len(fleet.times) - 1)
            result = [{"metric": lab, "value": [at, repr(float(v[i]))]}
                      for lab, v in series(name, matchers)]
        return web.json_response({"status": "success",
                                  "data": {"resultType": "vector", "result": result}})

    async def names(_request: web.Request) -> web.Response:
        return web.json_response({"status": "success", "data": sorted(fleet.values)})

    app = web.Application()
    app.router.add_route("*", "/api/v1/query_range", query_range)
    app.router.add_route("*", "/api/v1/query", query)
    app.router.add_get("/api/v1/label/__name__/values", names)
    return app


def _alert(fleet: GeneratedFleet, gpu: int, *, state: AlertState = AlertState.FIRING
           ) -> AlertRecord:
    now_ms = fleet.end_s * 1000
    return AlertRecord(
        id=f"test-{gpu}", entity=fleet.path(gpu), level="gpu", state=state,
        severity=Severity.CRITICAL, source="rule:thermal", summary="GPU temperature runaway",
        score=3.2, threshold=1.0, started_ms=now_ms - 300_000, updated_ms=now_ms,
        attribution=(Attribution("fleetpulse_gpu_temperature_celsius", "high", 0.8),),
    )


@pytest.fixture(scope="module")
def fleet_server() -> Iterator[tuple[ServerThread, GeneratedFleet, AlertBoard]]:
    end_s = (int(time.time()) // STEP_S) * STEP_S
    fleet = GeneratedFleet(rows=4, racks=4, nodes=8, gpus=8, end_s=end_s)
    board = AlertBoard(clock=lambda: fleet.end_s * 1000)
    app = prometheus_app(fleet)
    add_web_routes(app, board, WebConfig(refresh_s=0.3, min_step_s=STEP_S))
    with ServerThread(app) as server:
        yield server, fleet, board


# ---------------------------------------------------------------------------- tests
def test_heatmap_has_one_cell_per_gpu(browser: BrowserPage, fleet_server: Any) -> None:
    server, fleet, _ = fleet_server
    browser.open(server.url)
    assert browser.attr("view") == "cluster"
    assert int(browser.attr("cells")) == fleet.size == 1024
    assert int(browser.attr("rows")) == 4
    assert int(browser.attr("groups")) == 4  # the cluster's children are its rows
    assert float(browser.attr("renderMs")) < 1000
    options = browser.js("return [...document.querySelectorAll('#mode option')].map(o => o.value)")
    assert "metric:fleetpulse_gpu_temperature_celsius" in options
    assert "health:alerts" in options
    # only metrics the API has data for are offered
    assert "metric:fleetpulse_gpu_fan_speed_ratio" not in options


def test_empty_fleet_loads_and_fills_in_as_data_arrives(browser: BrowserPage) -> None:
    """Before the first rollups the API has no GPU series: the page must wait, not fail."""
    end_s = (int(time.time()) // STEP_S) * STEP_S
    fleet = GeneratedFleet(rows=1, racks=2, nodes=2, gpus=8, end_s=end_s)
    full = fleet.values
    fleet.values = {}
    app = prometheus_app(fleet)
    add_web_routes(app, AlertBoard(clock=lambda: fleet.end_s * 1000),
                   WebConfig(refresh_s=0.3, min_step_s=STEP_S))
    with ServerThread(app) as server:
        browser.open(server.url)
        assert browser.attr("cells") == "0"
        server.call(lambda: setattr(fleet, "values", full))
        browser.wait(lambda: browser.attr("cells") == str(fleet.size), 10, "cells appear")


def test_drill_down_cluster_row_rack_node_gpu(browser: BrowserPage, fleet_server: Any) -> None:
    server, fleet, _ = fleet_server
    browser.open(server.url)
    row = "sim/row-002"
    browser.click_group(row)
    browser.wait(lambda: browser.attr("view") == "row", 5, "row view")
    assert browser.attr("entity") == row
    assert int(browser.attr("cells")) == fleet.racks * fleet.nodes * fleet.gpus
    assert int(browser.attr("groups")) == fleet.racks

    rack = "sim/row-002/rack-002-01"
    browser.click_group(rack)
    browser.wait(lambda: browser.attr("view") == "rack", 5, "rack view")
    assert browser.attr("entity") == rack
    assert int(browser.attr("groups")) == fleet.nodes  # clicking a rack shows its nodes
    assert int(browser.attr("cells")) == fleet.nodes * fleet.gpus

    node = "sim/row-002/rack-002-01/node-002-01-03"
    browser.click_group(node)
    browser.wait(lambda: browser.attr("view") == "node", 5, "node view")
    assert int(browser.attr("cells")) == fleet.gpus

    gpu = f"{node}/gpu-6"
    pos = browser.js("return window.fleetpulse.cellCenter(arguments[0])", gpu)
    browser.click_canvas(pos["x"], pos["y"])
    browser.wait(lambda: browser.attr("view") == "gpu", 5, "gpu view")
    assert browser.attr("entity") == gpu
    # the GPU's charts come from query_range and hold the hour of data
    browser.wait(lambda: browser.js("return document.getElementById('charts').dataset.entity")
                 == gpu, 10, "the GPU's charts")
    points = browser.js(
        "return [...document.querySelectorAll('#charts canvas')].map(c => +c.dataset.points)")
    assert len(points) == 3  # temperature, power, utilisation: the metrics that have data
    assert min(points) >= HOUR_S // 30 - 2

    # the breadcrumb goes back up to the rack
    browser.js("document.querySelector('#crumbs a[data-level=rack]').click()")
    browser.wait(lambda: browser.attr("view") == "rack", 5, "back to rack")


def test_rack_label_jumps_straight_to_the_rack(browser: BrowserPage, fleet_server: Any) -> None:
    server, fleet, _ = fleet_server
    browser.open(server.url)
    browser.click_label("sim/row-003/rack-003-02")
    browser.wait(lambda: browser.attr("view") == "rack", 5, "rack view")
    assert int(browser.attr("groups")) == fleet.nodes


def test_scrubber_replays_the_cooling_wave(browser: BrowserPage, fleet_server: Any) -> None:
    server, fleet, _ = fleet_server
    browser.open(server.url)
    top = int(fleet.wave_gpus[-1])  # top node of the wave rack: the wave arrives there last
    path = fleet.path(top)
    frames = int(browser.js("return window.fleetpulse.state.frames.length"))
    step = int(browser.js("return window.fleetpulse.state.step"))
    assert frames >= HOUR_S // step - 2

    def frame_at(offset_s: int) -> int:
        t0 = float(browser.js("return window.fleetpulse.state.times[0]"))
        return round((fleet.start_s + offset_s - t0) / step)

    def show(frame: int) -> tuple[int, int, int]:
        browser.js("const s = document.getElementById('scrub'); s.value = arguments[0];"
                   "s.dispatchEvent(new Event('input'));", frame)
        browser.wait(lambda: browser.attr("frame") == str(frame), 5, "frame drawn")
        return browser.cell_rgb(path)

    before = show(frame_at(fleet.wave_start_s - 120))
    arrive = fleet.wave_start_s + (fleet.nodes - 1) * fleet.wave_lag_s
    after = show(frame_at(arrive + 400))
    assert browser.js("return window.fleetpulse.state.live") is False
    # viridis: hotter is yellower (more red + green); the wave must show as a colour change
    assert after[0] + after[1] > before[0] + before[1] + 60, (before, after)
    # the cells of a rack the wave never reached do not change that much
    calm = fleet.path(int(np.flatnonzero((fleet.row_of == 0) & (fleet.rack_of == 0))[-1]))
    c0 = show(frame_at(fleet.wave_start_s - 120))
    c0 = browser.cell_rgb(calm)
    show(frame_at(arrive + 400))
    c1 = browser.cell_rgb(calm)
    assert abs((c1[0] + c1[1]) - (c0[0] + c0[1])) < (after[0] + after[1]) - (before[0] + before[1])


def test_alert_rings_the_gpu_and_links_to_it(browser: BrowserPage, fleet_server: Any) -> None:
    server, fleet, board = fleet_server
    browser.open(server.url)
    path = fleet.path(fleet.hot_gpu)
    assert path not in browser.highlighted()
    server.call(lambda: board.add(_alert(fleet, fleet.hot_gpu)))
    browser.wait(lambda: path in browser.highlighted(), 10, "alerting GPU highlighted")
    assert browser.highlighted() == {path}
    item = browser.wait(lambda: browser.js(
        "return document.querySelector(`#alerts li[data-entity='${arguments[0]}']`)", path),
        5, "alert listed")
    assert "firing" in item.get_attribute("class")
    # colour by alert state: the alerting GPU turns red, a healthy one stays green
    browser.js("const m = document.getElementById('mode'); m.value = 'health:alerts';"
               "m.dispatchEvent(new Event('change'));")
    browser.wait(lambda: browser.cell_rgb(path)[0] > 200, 5, "red cell")
    healthy = browser.cell_rgb(fleet.path(fleet.hot_gpu + 1))
    assert healthy[1] > healthy[0]
    item.click()
    browser.wait(lambda: browser.attr("view") == "gpu", 5, "alert click drills to the GPU")
    assert browser.attr("entity") == path
    server.call(lambda: board.add(_alert(fleet, fleet.hot_gpu, state=AlertState.RESOLVED)))
    browser.wait(lambda: path not in browser.highlighted(), 10, "resolved alert unringed")


def _incident(root: str, iid: str, started_ms: int, level: str = "gpu") -> IncidentRecord:
    return IncidentRecord(
        id=iid, root=root, level=level, state=AlertState.FIRING, severity=Severity.CRITICAL,
        cause="xid:79", action=Action.DRAIN_REBOOT, summary="GPU fell off the bus",
        started_ms=started_ms, updated_ms=started_ms, members=(f"{iid}-a",))


def test_health_mode_colours_gpus_by_their_incidents(browser: BrowserPage) -> None:
    """``health (7 days)`` colours each GPU by its /web/health row: incidents first, then
    hardware events; GPUs with nothing in the window (or only older, or node-level, trouble)
    stay healthy, and a new incident shows on the next refresh."""
    end_s = (int(time.time()) // STEP_S) * STEP_S
    fleet = GeneratedFleet(rows=1, racks=2, nodes=2, gpus=8, end_s=end_s)
    now_ms = fleet.end_s * 1000
    board = AlertBoard(clock=lambda: now_ms)
    worst, second, later, old, calm = (fleet.path(i) for i in (3, 12, 20, 25, 30))
    ecc = dataclasses.replace(
        _alert(fleet, 3), id="ecc-3", source="rule:ecc_dbe", summary="double-bit ECC error",
        context={"incident": "inc-worst-1"})
    for rec in (
        _incident(worst, "inc-worst-1", now_ms - 3_600_000),
        _incident(worst, "inc-worst-2", now_ms - 86_400_000),
        _incident(second, "inc-second", now_ms - 600_000),
        _incident(old, "inc-old", now_ms - 8 * 86_400_000),  # outside the 7 days
        _incident(calm.rsplit("/", 1)[0], "inc-node", now_ms - 600_000, level="node"),
    ):
        board.add_incident(rec)
    board.add(ecc)
    app = prometheus_app(fleet)
    add_web_routes(app, board, WebConfig(refresh_s=0.3, min_step_s=STEP_S))
    with ServerThread(app) as server:
        browser.open(server.url)
        assert browser.attr("unhealthy") == ""
        label = browser.js(
            "const o = document.querySelector('#mode option[value=\"health:rank\"]');"
            "return o && o.textContent")
        assert label == "health (7 days)"
        browser.js("const m = document.getElementById('mode'); m.value = 'health:rank';"
                   "m.dispatchEvent(new Event('change'));")
        browser.wait(lambda: browser.attr("unhealthy"), 5, "unhealthy GPUs marked")
        # exactly the GPUs with incidents in the window, worst (2 incidents + ECC) first
        assert browser.attr("unhealthy").split() == [worst, second]
        assert "health (7 days)" in browser.js(
            "return document.getElementById('map-title').textContent")
        assert "incidents" in browser.js(
            "return document.getElementById('legend-max').textContent")
        ok = (0x1D, 0x5C, 0x3A)  # the low end of the scale: healthy
        assert browser.cell_rgb(old) == ok and browser.cell_rgb(calm) == ok
        assert browser.cell_rgb(second) == (0xFA, 0xDB, 0x14)  # one incident: yellow
        w = browser.cell_rgb(worst)
        assert w[0] > 240 and w[1] < 150, w  # two incidents and an ECC error: orange-red
        tip = browser.js(
            "const p = window.fleetpulse.cellCenter(arguments[0]);"
            "const c = document.getElementById('heatmap'); const r = c.getBoundingClientRect();"
            "c.dispatchEvent(new MouseEvent('mousemove', {clientX: r.left + p.x,"
            " clientY: r.top + p.y, bubbles: true}));"
            "return document.getElementById('tooltip').textContent", worst)
        assert worst in tip and "health (7 days): 2 incidents" in tip, tip
        assert "1 ECC" in tip and "0 XIDs" in tip and "lost 0 s" in tip, tip
        # the ranking refreshes with the alerts: a new incident shows without a reload
        server.call(lambda: board.add_incident(_incident(later, "inc-later", now_ms - 1000)))
        browser.wait(lambda: later in browser.attr("unhealthy").split(), 10,
                     "new incident coloured")
        assert set(browser.attr("unhealthy").split()) == {worst, second, later}


def test_ten_thousand_gpus_render_under_a_second(browser: BrowserPage) -> None:
    end_s = (int(time.time()) // STEP_S) * STEP_S
    fleet = GeneratedFleet(rows=10, racks=16, nodes=8, gpus=8, end_s=end_s, seed=3)
    app = prometheus_app(fleet)
    add_web_routes(app, AlertBoard(clock=lambda: fleet.end_s * 1000), WebConfig(refresh_s=30))
    with ServerThread(app) as server:
        browser.open(server.url, timeout=120)
        assert int(browser.attr("cells")) == fleet.size == 10_240
        # the fleet's size came first (instant query), so the hour fits the point budget
        frames = int(browser.js("return window.fleetpulse.state.frames.length"))
        assert frames >= 6 and frames * fleet.size <= WebConfig().max_points
        first = float(browser.attr("renderMs"))
        again = [float(browser.js(
            "window.fleetpulse.render(); return document.getElementById('heatmap').dataset.renderMs"))
            for _ in range(3)]
        print(f"10,240 GPUs: first render {first:.1f} ms, re-renders {again} ms")
        assert first < 1000
        assert max(again) < 1000

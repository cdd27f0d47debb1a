"""The agent as a real process: ``--once --print``, and SIGTERM flushing to the spool."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from agent.spool import Spool
from benchmarks.dcgm_fixtures import DCGM_FIXTURES
from schemas.catalog import BY_NAME
from schemas.frame import decode_frame
from schemas.records import EventKind, EventRecord

REPO = Path(__file__).resolve().parents[1]
H100 = DCGM_FIXTURES / "sample-h100-8gpu.prom"


def agent_env(tmp: Path, **extra: str) -> dict[str, str]:
    """Environment for an agent subprocess: identity, fast ticks, private spool."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_AGENT_")}
    env.update({
        "FLEETPULSE_AGENT_IDENTITY__CLUSTER": "c1",
        "FLEETPULSE_AGENT_IDENTITY__ROW": "row-a",
        "FLEETPULSE_AGENT_IDENTITY__RACK": "rack-03",
        "FLEETPULSE_AGENT_IDENTITY__NODE": "node-17",
        "FLEETPULSE_AGENT_SOURCE__NAME": "synthetic",
        "FLEETPULSE_AGENT_SAMPLING__INTERVAL_S": "0.1",
        "FLEETPULSE_AGENT_SAMPLING__TICKS_PER_FRAME": "2",
        "FLEETPULSE_AGENT_SPOOL__DIRECTORY": str(tmp / "spool"),
        "FLEETPULSE_AGENT_METRICS__PORT": "0",
        **extra,
    })
    return env


def fleetpulse(*args: str) -> list[str]:
    return [sys.executable, "-m", "fleetpulse", *args]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_once_print_synthetic(tmp_path: Path) -> None:
    proc = subprocess.run(fleetpulse("agent", "--once", "--print"), env=agent_env(tmp_path),
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    lines = [orjson.loads(line) for line in proc.stdout.splitlines()]
    assert {ln["gpu"] for ln in lines} == set(range(8))
    for ln in lines:
        assert {"gpu", "uuid", "metric", "dcgm_field", "value", "ts_ms"} <= set(ln)
        assert ln["metric"] in BY_NAME
    assert len({ln["uuid"] for ln in lines}) == 8


@pytest.fixture
async def exporter() -> AsyncIterator[str]:
    text = H100.read_text()

    async def handle(request: web.Request) -> web.Response:
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/metrics"
    await runner.cleanup()


async def test_once_print_dcgm_from_the_command_line(tmp_path: Path, exporter: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        *fleetpulse("agent", "--source", "dcgm", "--dcgm-url", exporter, "--once", "--print"),
        env=agent_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 120)
    assert proc.returncode == 0, err.decode()
    lines = [orjson.loads(line) for line in out.decode().splitlines()]
    power = [ln for ln in lines if ln["dcgm_field"] == "DCGM_FI_DEV_POWER_USAGE"]
    assert [(ln["gpu"], ln["value"]) for ln in power][:2] == [(0, 113.611), (1, 68.347)]
    assert {ln["metric"] for ln in power} == {"fleetpulse_gpu_power_usage_watts"}
    assert len(lines) == 30, "every sample of the capture, one line each"


def test_bad_config_exits_2_with_the_field_named(tmp_path: Path) -> None:
    env = agent_env(tmp_path, FLEETPULSE_AGENT_SAMPLING__INTERVAL_S="0.01")
    proc = subprocess.run(fleetpulse("agent", "--once", "--print"), env=env,
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert "sampling.interval_s" in proc.stderr


def _wait_for(path: Path, text: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        time.sleep(0.05)
    raise AssertionError(f"{text!r} not in {path} after {timeout} s:\n{path.read_text()}")


def _metric(url: str, name: str) -> float:
    with urllib.request.urlopen(url, timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
    return 0.0


def test_sigterm_with_the_broker_down_spools_everything_and_exits_0(tmp_path: Path) -> None:
    env = agent_env(
        tmp_path,
        FLEETPULSE_AGENT_TRANSPORT__BOOTSTRAP=f"127.0.0.1:{free_port()}",  # nobody listens
        FLEETPULSE_AGENT_TRANSPORT__REQUEST_TIMEOUT_MS="1000",
        FLEETPULSE_AGENT_PUBLISH__ACK_TIMEOUT_S="2",
        FLEETPULSE_AGENT_SHUTDOWN_TIMEOUT_S="3",
    )
    log = tmp_path / "agent.log"
    with open(log, "w") as fh:
        proc = subprocess.Popen(fleetpulse("agent"), env=env, stdout=fh, stderr=fh)
    try:
        _wait_for(log, "started", 60)
        # SIGTERM once at least 5 frames were built (about 1 s idle), not after a fixed
        # sleep: a starved process on a loaded machine may build fewer in a given time.
        _wait_for(log, "/metrics", 60)
        url = re.search(r"(http://127\.0\.0\.1:\d+/metrics)", log.read_text())
        assert url is not None, log.read_text()
        deadline = time.monotonic() + 60
        while _metric(url.group(1), "fleetpulse_agent_frames_built_total") < 5:
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    records = Spool(tmp_path / "spool" / "samples").read(10_000, 1 << 30)
    frames = [decode_frame(r.value) for r in records]
    assert len(frames) >= 5, log.read_text()
    assert len({f.agent for f in frames}) == 1
    assert [f.seq for f in frames] == list(range(len(frames))), "contiguous, in order"
    assert {r.key for r in records} == {b"c1/row-a/rack-03"}, "keyed by rack"
    events = [EventRecord.from_bytes(r.value)
              for r in Spool(tmp_path / "spool" / "events").read(10_000, 1 << 30)]
    kinds = [e.kind for e in events]
    assert kinds[0] is EventKind.AGENT_START and kinds[-1] is EventKind.AGENT_STOP
    assert events[-1].data["frames_built"] == len(frames), "every frame built is in the spool"

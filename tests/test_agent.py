"""The agent in one process: config, tick clock, frame builder, and the whole daemon on the
embedded in-memory transport with the dcgm source scraping a real local HTTP server."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import aiohttp
import numpy as np
import pytest
from aiohttp import web

from agent.config import AgentConfig, load_agent_config
from agent.publisher import AgentSequence, Publisher
from agent.run import Agent
from agent.sampler import FrameBuilder, Sampler, TickClock
from agent.sources.base import Gathered, SourceContext, open_source
from agent.sources.dcgm import DcgmSource
from agent.sources.dcgm_parse import parse_exposition
from agent.spool import Spool
from benchmarks.dcgm_fixtures import DCGM_FIXTURES
from fleetpulse.config import ConfigError, TransportConfig
from fleetpulse.transport.memory import MemoryTransport
from schemas.frame import SampleFrame, decode_frame
from schemas.identity import NodeIdentity
from schemas.records import EventKind, EventRecord
from schemas.topics import Topics

REPO = Path(__file__).resolve().parents[1]
H100 = DCGM_FIXTURES / "sample-h100-8gpu.prom"
IDENT = NodeIdentity("c1", "row-a", "rack-03", "node-17")


# ---------------------------------------------------------------------------- config


def test_sample_config_loads_with_env_overrides() -> None:
    cfg = load_agent_config(REPO / "config" / "agent.toml", environ={
        "FLEETPULSE_AGENT_IDENTITY__RACK": "rack-99",
        "FLEETPULSE_AGENT_SAMPLING__INTERVAL_S": "0.5",
    })
    assert cfg.identity.cluster == "dc1" and cfg.identity.rack == "rack-99"
    assert cfg.sampling.interval_s == 0.5 and cfg.sampling.ticks_per_frame == 5
    assert cfg.source.name == "nvml" and cfg.spool.drop_policy == "drop_oldest"
    assert cfg.metrics.host == "127.0.0.1"
    assert cfg.source.options() == {"events": True, "event_wait_ms": 1000}


@pytest.mark.parametrize(("env", "message"), [
    ({"FLEETPULSE_AGENT_SAMPLING__INTERVAL_S": "0.05"}, "interval_s must be >= 0.1"),
    ({"FLEETPULSE_AGENT_IDENTITY__RACK": "rack/../x"}, "rack must be"),
    ({"FLEETPULSE_AGENT_SOURCE__NAME": "smi"}, "source.name"),
    ({"FLEETPULSE_AGENT_SPOOL__DROP_POLICY": "panic"}, "drop_policy"),
    ({"FLEETPULSE_AGENT_SOURCE__DCGM__URL": "file:///etc"}, "http"),
    ({"FLEETPULSE_AGENT_PUBLISH__ACK_TIMEOUT_S": "5"}, "must exceed"),
    ({"FLEETPULSE_AGENT_SAMPLING__TYPO": "1"}, "unknown keys"),
])
def test_bad_config_is_a_clear_error(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_agent_config(REPO / "config" / "agent.toml", environ=env)


# ---------------------------------------------------------------------------- clock


def test_clock_is_arithmetic_so_an_hour_does_not_drift() -> None:
    clock = TickClock(0.1)
    assert clock.wall0_ms % 100 == 0, "ticks align to multiples of the interval"
    assert clock.scheduled_ts_ms(36_000) - clock.scheduled_ts_ms(0) == 3_600_000
    assert clock.due(36_000) - clock.due(0) == pytest.approx(3600.0, abs=1e-6)
    assert clock.due(36_000) - clock.due(35_999) == pytest.approx(0.1, abs=1e-6)


@pytest.fixture
async def exporter() -> AsyncIterator[tuple[str, dict[str, float]]]:
    """A real HTTP server with the H100 page; ``delays[n]`` delays the n-th request."""
    delays: dict[str, float] = {}
    text = H100.read_text()
    count = 0

    async def handle(request: web.Request) -> web.Response:
        nonlocal count
        count += 1
        delay = delays.get(str(count))
        if delay:
            await asyncio.sleep(delay)
        return web.Response(text=text, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/metrics", delays
    await runner.cleanup()


async def test_late_tick_has_real_time_and_ticks_are_never_bunched(
        exporter: tuple[str, dict[str, float]]) -> None:
    url, delays = exporter
    delays["4"] = 0.35  # the 4th scrape blocks for 3.5 intervals
    source = DcgmSource(url, timeout_s=2.0)
    clock = TickClock(0.1)
    builder = FrameBuilder(IDENT, AgentSequence("a1"), 100)
    frames: list[SampleFrame] = []
    sampler = Sampler(source, clock, builder, frames.append, lambda ev: None)
    stop = asyncio.Event()
    task = asyncio.create_task(sampler.run(stop))
    while sampler.stats.ticks < 12:
        await asyncio.sleep(0.02)
    stop.set()
    await task
    await source.close()
    ts = np.concatenate([f.ts for f in frames])
    offsets = ts - clock.wall0_ms
    assert (np.diff(ts) > 0).all()
    assert sampler.stats.late_ticks >= 1 and sampler.stats.missed_ticks >= 2
    assert np.diff(offsets).min() >= 40, "no burst of catch-up ticks after the stall"
    # The tick after the stall carries when it was really read (~650 ms), not its slot.
    assert any(550 <= o <= 900 and o % 100 != 0 for o in offsets[3:6]), offsets[:8]
    # After the stall the clock is back on its grid, not shifted by the delay.
    on_grid = offsets[offsets > 1000]
    assert on_grid.size and (on_grid % 100 == 0).mean() >= 0.5


# ---------------------------------------------------------------------------- frames


def _tick(ids: list[int], gpus: int, fill: float) -> Gathered:
    return Gathered(0, np.asarray(ids, dtype=np.uint16), (), np.arange(gpus, dtype=np.int32),
                    tuple(f"GPU-{i}" for i in range(gpus)), np.full((gpus, len(ids)), fill))


def test_frame_builder_batches_and_closes_on_layout_change() -> None:
    builder = FrameBuilder(IDENT, AgentSequence("a1"), 3)
    out = []
    for t in range(4):
        out += builder.add(1000 + t, _tick([1, 3], 2, float(t)))
    assert len(out) == 1 and out[0].seq == 0 and out[0].shape == (3, 2, 2)
    assert out[0].values[:, 0, 0].tolist() == [0.0, 1.0, 2.0]
    out2 = builder.add(2000, _tick([1, 3, 5], 2, 9.0))  # a new metric appeared
    assert len(out2) == 1 and out2[0].seq == 1 and out2[0].shape == (1, 2, 2)
    last = builder.flush()
    assert last is not None and last.seq == 2 and last.shape == (1, 2, 3)
    assert builder.flush() is None


# ---------------------------------------------------------------------------- daemon


def _cfg(tmp_path: Path, url: str, bootstrap: str, **sampling: float) -> AgentConfig:
    cfg = load_agent_config(None, overrides={
        "identity": {"cluster": "c1", "row": "row-a", "rack": "rack-03", "node": "node-17"},
        "source": {"name": "dcgm", "dcgm": {"url": url}},
        "sampling": {"interval_s": 0.1, "ticks_per_frame": 3, **sampling},
        "transport": {"bootstrap": bootstrap},
        "publish": {"create_topics": 2},
        "spool": {"directory": str(tmp_path / "spool")},
        "metrics": {"port": 0},
    }, environ={})
    return cfg


async def _drain(transport: MemoryTransport, topic: str) -> list[bytes]:
    consumer = transport.consumer([topic], f"g-{uuid.uuid4().hex}")
    out = []
    for _ in range(5):
        batch = await consumer.getmany(timeout_ms=100)
        out += [m.value for m in batch]
    await consumer.stop()
    return out


async def test_agent_publishes_frames_and_events_end_to_end(
        tmp_path: Path, exporter: tuple[str, dict[str, float]]) -> None:
    url, _ = exporter
    bootstrap = f"memory://agent-{uuid.uuid4().hex}"
    cfg = _cfg(tmp_path, url, bootstrap)
    agent = Agent(cfg)
    assert await agent.run(asyncio.Event(), ticks=7) == 0

    reader = MemoryTransport(TransportConfig(bootstrap=bootstrap))
    topics = Topics()
    frames = [decode_frame(v) for v in await _drain(reader, topics.samples)]
    assert [f.seq for f in frames] == [0, 1, 2]
    assert [f.shape[0] for f in frames] == [3, 3, 1]
    assert {f.agent for f in frames} == {agent.sequence.agent}
    expected = parse_exposition(H100.read_text())
    for f in frames:
        assert f.identity == IDENT
        assert f.uuids == expected.uuids
        np.testing.assert_array_equal(f.metric_ids, expected.metric_ids)
        for t in range(f.shape[0]):
            np.testing.assert_array_equal(f.values[t], expected.values)
    events = [EventRecord.from_bytes(v) for v in await _drain(reader, topics.events)]
    kinds = [e.kind for e in events]
    assert kinds[0] is EventKind.AGENT_START and kinds[-1] is EventKind.AGENT_STOP
    assert kinds.count(EventKind.INVENTORY) == 8
    assert events[-1].data["frames_built"] == 3
    assert agent.publishers["samples"].spool is not None
    assert agent.publishers["samples"].spool.pending_frames == 0


async def test_metrics_endpoint_while_running(tmp_path: Path,
                                              exporter: tuple[str, dict[str, float]]) -> None:
    url, _ = exporter
    cfg = _cfg(tmp_path, url, f"memory://agent-{uuid.uuid4().hex}")
    agent = Agent(cfg)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    while agent.sampler is None or agent.sampler.stats.frames < 2:
        await asyncio.sleep(0.05)
    assert agent.metrics_server is not None
    await asyncio.sleep(0.1)
    async with aiohttp.ClientSession() as http:
        resp = await http.get(f"http://127.0.0.1:{agent.metrics_server.port}/metrics")
        text = await resp.text()
    stop.set()
    assert await task == 0
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    assert values["fleetpulse_agent_ticks_total"] >= 6
    assert values['fleetpulse_agent_frames_sent_total{stream="samples"}'] >= 1
    assert values['fleetpulse_agent_bytes_sent_total{stream="samples"}'] > 1000
    assert values['fleetpulse_agent_spool_frames{stream="samples"}'] == 0
    assert values["fleetpulse_agent_sampling_latency_seconds_count"] >= 6
    assert 'fleetpulse_agent_source_errors_total{kind="scrape",source="dcgm"}' in values
    assert "fleetpulse_agent_late_ticks_total" in values
    assert 'fleetpulse_agent_spool_dropped_frames_total{stream="samples"}' in values


async def test_restart_with_a_spool_replays_it_before_new_data(tmp_path: Path) -> None:
    """New records queue behind the old spool (through it), so the topic sees old first."""
    bootstrap = f"memory://pub-{uuid.uuid4().hex}"
    spool = Spool(tmp_path / "s", max_bytes=1 << 20)
    for i in range(5):
        spool.append(b"k", b"old-%d" % i)
    spool.close()
    transport = MemoryTransport(TransportConfig(bootstrap=bootstrap))
    await transport.start()
    await transport.ensure_topics({"t": 1})
    pub = Publisher(transport, "t", Spool(tmp_path / "s", max_bytes=1 << 20))
    await pub.start()
    for i in range(3):
        await pub.publish(b"new-%d" % i, b"k")
    assert await pub.flush(5.0)
    await pub.close()
    got = await _drain(transport, "t")
    assert got == [b"old-%d" % i for i in range(5)] + [b"new-%d" % i for i in range(3)]
    assert pub.stats.frames_replayed == 8 and pub.stats.frames_sent == 8
    assert pub.mode.value == "direct"


def test_open_source_by_name() -> None:
    ctx = SourceContext(IDENT, 1.0, {"gpus": 2})
    src = open_source("synthetic", ctx)
    assert src.name == "synthetic"
    with pytest.raises(Exception, match="unknown source"):
        open_source("nope", ctx)
    cfg = replace(load_agent_config(None, environ={}))
    assert cfg.source.name == "nvml"


def test_deploy_configs_are_valid(tmp_path: Path) -> None:
    """The DaemonSet's embedded agent.toml loads with the env it sets; the unit runs us."""
    import textwrap

    manifest = (REPO / "deploy" / "agent-daemonset.yaml").read_text()
    block = manifest.split("agent.toml: |\n", 1)[1].split("\n---", 1)[0]
    toml = tmp_path / "agent.toml"
    toml.write_text(textwrap.dedent(block))
    cfg = load_agent_config(toml, environ={"FLEETPULSE_AGENT_IDENTITY__NODE": "gpu-node-1",
                                           "FLEETPULSE_AGENT_IDENTITY__RACK": "rack-0"})
    assert cfg.identity.resolved().node == "gpu-node-1"
    assert cfg.transport.bootstrap.startswith("kafka-0") and cfg.metrics.port == 9108
    assert '"-m", "agent"' in manifest
    unit = (REPO / "deploy" / "fleetpulse-agent.service").read_text()
    assert "ExecStart=/opt/fleetpulse/.venv/bin/python -m agent --config" in unit
    assert "KillSignal=SIGTERM" in unit

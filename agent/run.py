"""The agent daemon: source -> sampler -> frames -> publisher (+ spool), and its lifecycle.

One asyncio loop runs everything: the sampler task ticks and builds frames; two pump
tasks hand frames and events to their publishers (so a slow ``publish`` never delays a
tick); the publishers' own tasks await acks and replay the spools. The NVML event thread,
if any, only feeds a queue the source drains at each tick.

Shutdown (SIGTERM / SIGINT, or ``stop`` set by a caller): the sampler closes its partial
frame, the pumps hand over what is queued, an ``agent_stop`` event is queued, and each
publisher delivers what it can within ``shutdown_timeout_s`` and spools the rest, then the
process exits 0. Nothing sampled is dropped on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import IO, Any

import orjson

from agent.attribution.base import AttributionContext, GpuView, open_attribution
from agent.attribution.tracker import AttributionTracker
from agent.config import AgentConfig
from agent.events import agent_event, to_record
from agent.metrics import AgentCollector, MetricsServer, serve_metrics
from agent.publisher import AgentSequence, Publisher, new_agent_id
from agent.reconnect import ReconnectingTransport
from agent.sampler import FrameBuilder, Sampler, TickClock
from agent.sources.base import Gathered, Source, SourceContext, SourceError, open_source
from agent.spool import Spool
from fleetpulse import __version__
from fleetpulse.transport import open_transport
from fleetpulse.transport.base import Transport
from schemas.catalog import BY_ID
from schemas.frame import SampleFrame
from schemas.records import EventKind, EventRecord
from schemas.topics import Topics

__all__ = ["Agent", "print_tick", "sample_once"]

log = logging.getLogger(__name__)

EVENTS_SPOOL_SHARE = 16
"""The events spool gets 1/16 of the samples spool's budget: events are rare and small."""


def open_configured_source(cfg: AgentConfig) -> Source:
    ctx = SourceContext(cfg.identity.resolved(), cfg.sampling.interval_s, cfg.source.options())
    return open_source(cfg.source.name, ctx)


def open_configured_attribution(cfg: AgentConfig, source: Source) -> AttributionTracker | None:
    """The tracker over ``cfg.attribution.sources`` (None when there are none)."""
    att = cfg.attribution
    if not att.sources:
        return None
    ctx = AttributionContext(dataclasses.asdict(att), source)
    return AttributionTracker([open_attribution(name, ctx) for name in att.sources])


@dataclass
class Agent:
    """One agent incarnation. ``await Agent(cfg).run(stop)`` returns the exit code."""

    cfg: AgentConfig
    source: Source | None = None
    """Use this source instead of the configured one (tests, benchmarks)."""
    transport: Transport | None = None
    """Use this transport instead of opening ``cfg.transport``."""
    on_ready: Callable[[Agent], None] | None = None
    identity: Any = field(init=False)
    sequence: AgentSequence = field(init=False)
    sampler: Sampler | None = field(init=False, default=None)
    publishers: dict[str, Publisher] = field(init=False, default_factory=dict)
    metrics_server: MetricsServer | None = field(init=False, default=None)
    attribution: AttributionTracker | None = field(init=False, default=None)
    _attributing: asyncio.Task[None] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.identity = self.cfg.identity.resolved()
        self.sequence = AgentSequence(new_agent_id(self.identity.node))

    async def run(self, stop: asyncio.Event, *, ticks: int | None = None) -> int:
        """Sample until ``stop`` is set (or ``ticks`` ticks were taken); 0 on a clean stop."""
        cfg = self.cfg
        topics = Topics(cfg.transport.topic_prefix)
        source = self.source or open_configured_source(cfg)
        try:
            await source.start()
            self.attribution = open_configured_attribution(cfg, source)
            if self.attribution is not None:
                await self.attribution.start()
        except SourceError as exc:
            log.error("cannot start source %s: %s", cfg.source.name, exc)
            return 1
        transport = ReconnectingTransport(
            self.transport or open_transport(cfg.transport),
            on_connect=self._create_topics(topics) if cfg.publish.create_topics else None,
        )
        await transport.start()
        spool_dir = cfg.spool.directory
        spools = {
            "samples": Spool(spool_dir / "samples", max_bytes=cfg.spool.max_bytes,
                             drop_policy=cfg.spool.drop_policy, fsync=cfg.spool.fsync,
                             fsync_interval_s=cfg.spool.fsync_interval_s),
            "events": Spool(spool_dir / "events",
                            max_bytes=max(cfg.spool.max_bytes // EVENTS_SPOOL_SHARE, 1 << 20),
                            drop_policy=cfg.spool.drop_policy, fsync=cfg.spool.fsync,
                            fsync_interval_s=cfg.spool.fsync_interval_s),
        }
        ack_timeout = cfg.publish.ack_timeout_s
        for stream, topic in (("samples", topics.samples), ("events", topics.events)):
            pub = Publisher(transport, topic, spools[stream],
                            max_in_flight=cfg.publish.max_in_flight, ack_timeout_s=ack_timeout,
                            retry_initial_s=cfg.publish.retry_initial_s,
                            retry_max_s=cfg.publish.retry_max_s)
            await pub.start()
            self.publishers[stream] = pub

        frames: asyncio.Queue[SampleFrame | None] = asyncio.Queue()
        events: asyncio.Queue[EventRecord | None] = asyncio.Queue()
        agent_id = self.sequence.agent
        clock = TickClock(cfg.sampling.interval_s, cfg.sampling.late_threshold_s)
        builder = FrameBuilder(self.identity, self.sequence, cfg.sampling.ticks_per_frame)
        sampler = Sampler(source, clock, builder, frames.put_nowait,
                          lambda ev: events.put_nowait(to_record(ev, self.identity, agent_id)))
        self.sampler = sampler
        if cfg.metrics.enabled:
            self.metrics_server = serve_metrics(
                AgentCollector(sampler.stats, source, self.publishers, self.attribution),
                cfg.metrics.host, cfg.metrics.port)
        events.put_nowait(agent_event(
            EventKind.AGENT_START, self.identity, agent_id, version=__version__,
            source=source.name, interval_s=cfg.sampling.interval_s))
        pumps = [
            asyncio.create_task(self._pump(frames, self.publishers["samples"].publish_frame),
                                name="agent-frames"),
            asyncio.create_task(self._pump(events, self._publish_event), name="agent-events"),
        ]
        if self.attribution is not None:
            self._attributing = asyncio.create_task(self._attribute(stop, events, agent_id),
                                                    name="agent-attribution")
        log.info("agent %s started: %s, every %.3g s, %s -> %s (metrics %s)", agent_id,
                 source.describe(), cfg.sampling.interval_s, self.identity.path,
                 cfg.transport.bootstrap,
                 f"http://{cfg.metrics.host}:{self.metrics_server.port}/metrics"
                 if self.metrics_server else "off")
        if self.on_ready is not None:
            self.on_ready(self)

        sampler_stop = stop
        watcher: asyncio.Task[None] | None = None
        if ticks is not None:
            sampler_stop = asyncio.Event()
            watcher = asyncio.create_task(self._stop_after(ticks, stop, sampler_stop))
        try:
            await sampler.run(sampler_stop)
        finally:
            if watcher is not None:
                watcher.cancel()
            await self._shutdown(source, transport, frames, events, pumps)
        return 0

    async def _attribute(self, stop: asyncio.Event, events: asyncio.Queue[EventRecord | None],
                         agent_id: str) -> None:
        """Poll the attribution sources every ``attribution.interval_s``; queue the changes."""
        assert self.attribution is not None
        interval = self.cfg.attribution.interval_s
        while not stop.is_set():
            last = self.sampler.last if self.sampler is not None else None
            view = GpuView(tuple(int(g) for g in last.gpus), last.uuids) if last else GpuView()
            try:
                changes = await self.attribution.poll(view, time.time_ns() // 1_000_000)
            except Exception:  # a bug in a source must not stop the agent; it is loud
                log.exception("attribution poll failed")
                changes = []
            for ev in changes:
                events.put_nowait(to_record(ev, self.identity, agent_id))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval)

    async def _stop_after(self, ticks: int, outer: asyncio.Event, inner: asyncio.Event) -> None:
        assert self.sampler is not None
        while self.sampler.stats.ticks < ticks and not outer.is_set():
            await asyncio.sleep(0.01)
        inner.set()

    def _create_topics(self, topics: Topics) -> Callable[[Transport], Any]:
        partitions = self.cfg.publish.create_topics

        async def create(t: Transport) -> None:
            await t.ensure_topics({topics.samples: partitions, topics.events: partitions})

        return create

    async def _publish_event(self, rec: EventRecord) -> None:
        await self.publishers["events"].publish(rec.to_bytes(), rec.key)

    @staticmethod
    async def _pump(queue: asyncio.Queue[Any], publish: Callable[[Any], Any]) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            await publish(item)

    async def _shutdown(self, source: Source, transport: Transport,
                        frames: asyncio.Queue[SampleFrame | None],
                        events: asyncio.Queue[EventRecord | None],
                        pumps: list[asyncio.Task[None]]) -> None:
        """Hand over everything queued, deliver or spool it, release resources."""
        cfg = self.cfg
        deadline = time.monotonic() + cfg.shutdown_timeout_s
        if self._attributing is not None:  # before the sentinel: it queues events
            self._attributing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._attributing
        events.put_nowait(agent_event(EventKind.AGENT_STOP, self.identity, self.sequence.agent,
                                      frames_built=self.sampler.stats.frames if self.sampler
                                      else 0))
        frames.put_nowait(None)
        events.put_nowait(None)
        # Pumps only wait for publisher room, which acks or the spool free quickly.
        await asyncio.gather(*pumps, return_exceptions=True)
        for pub in self.publishers.values():
            await pub.close(max(deadline - time.monotonic(), 0.0))
        try:
            async with asyncio.timeout(max(deadline - time.monotonic(), 1.0)):
                await transport.close()
        except TimeoutError:
            log.warning("the broker connection did not close in time; leaving it")
        with contextlib.suppress(Exception):
            await source.close()
        if self.attribution is not None:
            with contextlib.suppress(Exception):
                await self.attribution.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
        spooled = sum(p.spool.pending_frames for p in self.publishers.values() if p.spool)
        log.info("agent %s stopped; %d records left in the spool for the next start",
                 self.sequence.agent, spooled)



async def sample_once(cfg: AgentConfig, source: Source | None = None) -> tuple[Source, Gathered]:
    """Open the configured source, read one tick now, close it."""
    src = source or open_configured_source(cfg)
    await src.start()
    try:
        g = await src.gather(time.time_ns() // 1_000_000)
    finally:
        await src.close()
    return src, g


def print_tick(source: Source, g: Gathered, out: IO[str] = sys.stdout) -> int:
    """JSON lines, one per GPU and sampled metric; returns the number of lines."""
    names = [BY_ID[int(i)].name for i in g.metric_ids] + list(g.extra)
    n_catalog = len(g.metric_ids)
    is_dcgm = source.name == "dcgm"
    lines = []
    for row in range(len(g.gpus)):
        gpu, uuid = int(g.gpus[row]), g.uuids[row]
        for col, name in enumerate(names):
            value = float(g.values[row, col])
            if math.isnan(value):
                continue
            dcgm_field = None
            if g.native:
                dcgm_field = g.native[col] if is_dcgm else None
            elif col < n_catalog and is_dcgm:
                dcgm_field = BY_ID[int(g.metric_ids[col])].dcgm
            lines.append(orjson.dumps({
                "gpu": gpu, "uuid": uuid, "metric": name, "dcgm_field": dcgm_field,
                "value": value, "ts_ms": g.ts_ms, "source": source.name,
                "catalog": col < n_catalog,
            }).decode())
    if lines:
        out.write("\n".join(lines) + "\n")
    out.flush()
    return len(lines)

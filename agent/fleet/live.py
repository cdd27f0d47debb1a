"""Publishing the fleet live: one logical agent per node, through the agent's own publisher.

The fleet is a load generator for the *real* path, so it publishes exactly what a node's
agent would: a :class:`~schemas.frame.SampleFrame` per node every ``ticks_per_frame`` ticks,
keyed by rack, with its own agent incarnation id and gap-free sequence numbers
(:class:`~agent.publisher.AgentSequence`), through one shared
:class:`~agent.publisher.Publisher` (pipelined, bounded in flight). XIDs go to the events
topic as the agent's sampler would send them.

Cost per tick is one model step (numpy over all GPUs); Python work is per node per frame
(build the frame, encode, hand to the producer), never per GPU or per metric.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import time
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import numpy as np
import numpy.typing as npt
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from agent.fleet.config import FleetConfig
from agent.fleet.faults import labels_of, plan_faults, write_labels
from agent.fleet.jobs import FleetAttribution, JobScheduler
from agent.fleet.model import METRIC_IDS, METRICS, FleetModel
from agent.fleet.topology import Topology
from agent.publisher import AgentSequence, Publisher, new_agent_id
from fleetpulse.transport import (
    Consumer,
    Message,
    RebalanceListener,
    RecordMeta,
    TopicPartition,
    Transport,
    open_transport,
)
from schemas.frame import SampleFrame
from schemas.records import EventKind, EventRecord
from schemas.topics import Topics

__all__ = ["AckTimer", "FleetCollector", "LiveFleet", "LiveStats", "run_live", "serve_metrics"]

log = logging.getLogger(__name__)

_XID_COL = METRICS.index("fleetpulse_gpu_xid")
_YIELD_EVERY = 64
"""Frames published between yields to the event loop, so the producer's sender runs."""


class AckTimer(Transport):
    """A pass-through transport that records send-to-acknowledgement latency.

    Wrapping rather than subclassing keeps the measurement independent of the transport
    implementation; every call goes to ``inner`` unchanged.
    """

    def __init__(self, inner: Transport, size: int = 1 << 16) -> None:
        self.inner = inner
        self.latency_s = np.zeros(size)
        self.count = 0

    async def start(self) -> None:
        await self.inner.start()

    async def close(self) -> None:
        await self.inner.close()

    async def ensure_topics(self, topics: Mapping[str, int], *,
                            compacted: Collection[str] = ()) -> None:
        await self.inner.ensure_topics(topics, compacted=compacted)

    async def send(self, topic: str, value: bytes, *, key: bytes | None = None,
                   headers: Sequence[tuple[str, bytes]] = (),
                   partition: int | None = None) -> asyncio.Future[RecordMeta]:
        t0 = time.perf_counter()
        fut = await self.inner.send(topic, value, key=key, headers=headers,
                                     partition=partition)

        def done(f: asyncio.Future[RecordMeta]) -> None:
            if not f.cancelled() and f.exception() is None:
                self.latency_s[self.count % self.latency_s.size] = time.perf_counter() - t0
                self.count += 1

        fut.add_done_callback(done)
        return fut

    async def flush(self) -> None:
        await self.inner.flush()

    async def partitions_for(self, topic: str) -> int:
        return await self.inner.partitions_for(topic)

    async def read_log(self, tps: Iterable[TopicPartition]) -> list[Message]:
        return await self.inner.read_log(tps)

    def consumer(self, topics: Sequence[str], group_id: str, *,
                 listener: RebalanceListener | None = None,
                 from_beginning: bool = True) -> Consumer:
        return self.inner.consumer(topics, group_id, listener=listener,
                                   from_beginning=from_beginning)

    def recent(self, since: int) -> npt.NDArray[np.float64]:
        """Latencies recorded since count ``since`` (at most the ring's size)."""
        n = min(self.count - since, self.latency_s.size)
        if n <= 0:
            return np.empty(0)
        idx = np.arange(self.count - n, self.count) % self.latency_s.size
        return self.latency_s[idx]


@dataclass(slots=True)
class LiveStats:
    """Counters of one live run; the summary is what the load benchmark reads."""

    ticks: int = 0
    frames: int = 0
    metrics: int = 0
    events: int = 0
    behind_s_max: float = 0.0
    """How far generation fell behind the wall-clock schedule (realtime mode)."""
    started: float = field(default_factory=time.monotonic)


@dataclass(eq=False)  # registries keep collectors in a set: hash by identity
class FleetCollector(Collector):
    """The load generator's own /metrics, read from its stats at scrape time."""

    fleet: LiveFleet

    def collect(self) -> Iterator[Metric]:
        p, s = "fleetpulse_fleet_", self.fleet.stats
        yield CounterMetricFamily(p + "ticks", "Ticks generated.", value=s.ticks)
        yield CounterMetricFamily(p + "frames", "Frames handed to the publisher.", value=s.frames)
        yield CounterMetricFamily(p + "metrics", "Metric values published.", value=s.metrics)
        yield CounterMetricFamily(p + "events", "XID / GPU-lost events sent.", value=s.events)
        yield GaugeMetricFamily(p + "behind_seconds_max",
                                "Worst delay of a tick behind its wall-clock schedule.",
                                value=s.behind_s_max)
        ps = self.fleet.publisher.stats
        yield CounterMetricFamily(p + "frames_acked", "Frames the broker acknowledged.",
                                  value=ps.frames_sent)
        yield CounterMetricFamily(p + "frames_lost", "Frames that failed (no spool).",
                                  value=ps.lost_frames)
        yield GaugeMetricFamily(p + "frames_in_flight", "Frames awaiting acknowledgement.",
                                value=ps.in_flight)
        timer = self.fleet.timer
        lat = timer.recent(max(0, timer.count - 4096))
        g = GaugeMetricFamily(p + "ack_latency_seconds",
                              "Send-to-acknowledgement latency of the last 4096 frames.",
                              labels=["quantile"])
        for q in (0.5, 0.99):
            g.add_metric([str(q)], float(np.quantile(lat, q)) if lat.size else float("nan"))
        yield g


def serve_metrics(collector: Collector, host: str, port: int) -> tuple[int, Any]:
    """Serve ``collector`` on http://host:port/metrics from a daemon thread; (port, server)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, _thread = start_http_server(port, addr=host, registry=registry)
    return int(server.server_address[1]), server


def _pct(x: npt.NDArray[np.float64], q: float) -> float | None:
    return round(float(np.percentile(x, q)) * 1000.0, 2) if x.size else None


async def run_live(
    cfg: FleetConfig,
    *,
    stop: asyncio.Event | None = None,
    progress: TextIO | None = sys.stderr,
) -> dict[str, Any]:
    """Run the fleet against ``cfg.transport`` until ``duration_s`` or ``stop``; summary out."""
    cfg.validate()
    stop = stop or asyncio.Event()
    topo = Topology(cfg.gpus, cfg.gpus_per_node, cfg.nodes_per_rack, cfg.racks_per_row,
                    cfg.cluster)
    plan = plan_faults(topo, cfg.faults, cfg.duration_s, cfg.hz, cfg.seed,
                       cfg.fault_kinds or None) if cfg.faults else []
    if cfg.labels:
        write_labels(cfg.labels, plan)
    # With a job-mapping dir the fleet schedules jobs, and its load follows them.
    scheduler = JobScheduler(topo, cfg.seed, min_s=cfg.job_min_s, max_s=cfg.job_max_s) \
        if cfg.jobs_dir else None
    model = FleetModel(topo, hz=cfg.hz, seed=cfg.seed, start_ms=time.time_ns() // 1_000_000,
                       faults=plan, jobs=scheduler)
    topics = Topics(cfg.transport.topic_prefix)
    transport = open_transport(cfg.transport)
    await transport.start()
    fleet: LiveFleet | None = None
    server = None
    try:
        await transport.ensure_topics({topics.samples: cfg.partitions,
                                       topics.events: cfg.partitions})
        fleet = LiveFleet(model, transport, topics, ticks_per_frame=cfg.ticks_per_frame,
                          max_in_flight=cfg.max_in_flight, realtime=cfg.realtime,
                          total_ticks=0 if cfg.duration_s == 0
                          else round(cfg.duration_s * cfg.hz),
                          jobs=FleetAttribution(topo, cfg.jobs_dir, list(model.uuids),
                                                scheduler=scheduler)
                          if cfg.jobs_dir else None,
                          job_poll_s=cfg.job_poll_s)
        if cfg.metrics_port >= 0:
            port, server = serve_metrics(FleetCollector(fleet), cfg.metrics_host,
                                         cfg.metrics_port)
            if progress is not None:
                progress.write(f"fleet /metrics on http://{cfg.metrics_host}:{port}/metrics\n")
        await fleet.run(stop, progress=progress if cfg.progress_s else None,
                        progress_s=cfg.progress_s)
    finally:
        await transport.close()
        if server is not None:
            server.shutdown()
            server.server_close()
    return fleet.summary() if fleet is not None else {}


class LiveFleet:
    """A fleet model published live: one logical agent per node through one Publisher.

    Reusable wherever a fleet must feed a transport (the load generator, the demo): give it
    a model and a *started* transport (which it does not close), then ``await run(stop)``.
    ``speed`` > 1 runs simulated time faster than the wall clock; ``realtime=False`` does
    not pace at all. ``total_ticks`` 0 runs until ``stop``.

    Nodes are staggered: node ``n`` closes its frame on ticks ``k`` with
    ``k % per == n % per``, as independent agents would, so the broker sees a steady
    stream instead of every node's frame in one burst every ``per`` ticks.
    """

    def __init__(self, model: FleetModel, transport: Transport, topics: Topics, *,
                 ticks_per_frame: int = 5, max_in_flight: int = 2048, realtime: bool = True,
                 speed: float = 1.0, total_ticks: int = 0,
                 jobs: FleetAttribution | None = None, job_poll_s: float = 5.0) -> None:
        if ticks_per_frame < 1 or speed <= 0 or total_ticks < 0:
            raise ValueError("ticks_per_frame >= 1, speed > 0 and total_ticks >= 0 required")
        self.model = model
        self.topo = topo = model.topo
        self.topics = topics
        self.timer = AckTimer(transport)
        self.publisher = Publisher(self.timer, topics.samples, None,
                                   max_in_flight=max_in_flight)
        self.stats = LiveStats()
        self.per = ticks_per_frame
        self.realtime = realtime
        self.speed = speed
        self.total_ticks = math.inf if total_ticks == 0 else total_ticks
        self.sim_now_ms = model.start_ms
        """Timestamp of the newest generated tick (what "now" is in the simulation)."""
        self.jobs = jobs
        """Jobs and their job-mapping dirs, polled every ``job_poll_s`` simulated seconds."""
        self.job_poll_ms = int(job_poll_s * 1000)
        self._next_jobs_ms = model.start_ms
        self.idents = topo.identities
        self.seqs = [AgentSequence(new_agent_id(ident.node)) for ident in self.idents]
        self.uuids = [model.uuids[topo.gpus_of_node(n)] for n in range(topo.nodes)]
        self.local = np.arange(topo.gpn, dtype=np.int32)
        self.groups = [_Group(np.arange(j, topo.nodes, self.per), topo.gpn, self.idents,
                              self.seqs, self.uuids) for j in range(min(self.per, topo.nodes))]

    def summary(self) -> dict[str, Any]:
        """What the run did; the last line of ``fleetpulse fleet`` and the benchmark's input."""
        s, ps, topo = self.stats, self.publisher.stats, self.topo
        elapsed = max(time.monotonic() - s.started, 1e-9)
        lat = self.timer.recent(0)
        return {
            "gpus": topo.gpus,
            "nodes": topo.nodes,
            "metrics_per_gpu": len(METRICS),
            "hz": self.model.hz,
            "ticks": s.ticks,
            "frames": s.frames,
            "metrics": s.metrics,
            "events": s.events,
            "seconds": round(elapsed, 3),
            "metrics_per_s": round(s.metrics / elapsed, 1),
            "frames_per_s": round(s.frames / elapsed, 1),
            "ack_ms_p50": _pct(lat, 50),
            "ack_ms_p99": _pct(lat, 99),
            "behind_s_max": round(s.behind_s_max, 3),
            "frames_acked": ps.frames_sent,
            "frames_lost": ps.lost_frames,
            "frames_rejected": ps.rejected_frames,
            "faults": len(self.model.faults),
            "labels": len(labels_of(self.model.faults)),
            "start_ms": self.model.start_ms,
            "jobs_started": self.jobs.scheduler.started if self.jobs is not None else 0,
        }

    async def run(self, stop: asyncio.Event, *, progress: TextIO | None = None,
                  progress_s: float = 2.0) -> None:
        """Generate ticks on schedule and publish frames until the end or ``stop``.

        Every tick generated is published (a stop between frames flushes the partial
        frames) and the publisher is closed, i.e. flushed, before this returns.
        """
        loop = asyncio.get_running_loop()
        model, stats, per = self.model, self.stats, self.per
        await self.publisher.start()
        last_pub = [-1] * len(self.groups)
        ts_buf = np.empty((per, self.topo.nodes), dtype=np.int64)
        val_buf = np.empty((per, self.topo.gpus, len(METRICS)))
        rate = model.hz * self.speed
        t0 = loop.time()
        if self.realtime and model.tick == 0 and self.speed == 1.0:
            # Stamp tick 0 with the moment pacing starts, not when the model was built
            # (topic creation and connecting take a while): timestamps are then the times
            # the samples were really taken, and latency measured from them is honest.
            model.start_ms = self.sim_now_ms = time.time_ns() // 1_000_000
        last = (t0, 0)  # time and ack count at the previous progress line
        k = 0
        try:
            while k < self.total_ticks and not stop.is_set():
                due = t0 + k / rate
                now = loop.time()
                if self.realtime and due > now:
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(due - now):
                            await stop.wait()
                    if stop.is_set():
                        break
                elif self.realtime:
                    stats.behind_s_max = max(stats.behind_s_max, now - due)
                ts, values = model.step(out=val_buf[k % per])
                ts_buf[k % per] = ts
                self.sim_now_ms = int(ts.max())
                await self._send_events(ts, values)
                if self.jobs is not None and self.sim_now_ms >= self._next_jobs_ms:
                    self._next_jobs_ms = self.sim_now_ms + self.job_poll_ms
                    for rec in await self.jobs.step(self.sim_now_ms):
                        fut = await self.timer.send(self.topics.events, rec.to_bytes(),
                                                    key=rec.key)
                        fut.add_done_callback(_ignore_result)
                        stats.events += 1
                j = k % per
                if j < len(self.groups):
                    await self._send_frames(self.groups[j], ts_buf, val_buf, last_pub[j] + 1,
                                            k + 1)
                    last_pub[j] = k
                k += 1
                stats.ticks = k
                if progress is not None and progress_s and loop.time() - last[0] >= progress_s:
                    last = self._progress_line(progress, loop.time(), last[1])
            # The end (or a stop): every node publishes the ticks it still holds.
            for j, group in enumerate(self.groups):
                if last_pub[j] + 1 < k:
                    await self._send_frames(group, ts_buf, val_buf, last_pub[j] + 1, k)
        finally:
            await self.publisher.close(timeout_s=30.0)
        if progress is not None and progress_s:
            self._progress_line(progress, loop.time(), last[1])
            progress.write("\n")

    async def _send_frames(self, group: _Group, ts_buf: npt.NDArray[np.int64],
                           val_buf: npt.NDArray[np.float64], first: int, stop: int) -> None:
        """One frame per node of ``group`` holding ticks ``first .. stop-1`` from the ring."""
        slots = np.arange(first, stop) % ts_buf.shape[0]
        t = slots.size
        ts = ts_buf[np.ix_(slots, group.nodes)]
        values = val_buf[np.ix_(slots, group.gpus)].reshape(t, group.nodes.size, group.gpn, -1)
        for i, ident in enumerate(group.idents):
            seq = group.seqs[i]
            frame = SampleFrame(ident, seq.agent, seq.next(), METRIC_IDS, self.local,
                                group.uuids[i], ts[:, i], values[:, i])
            await self.publisher.publish_frame(frame)
            if i % _YIELD_EVERY == _YIELD_EVERY - 1:
                await asyncio.sleep(0)
        self.stats.frames += len(group.idents)
        self.stats.metrics += values.size

    async def _send_events(self, ts: npt.NDArray[np.int64],
                           values: npt.NDArray[np.float64]) -> None:
        """XIDs of this tick as event records (rare: a handful per hour per thousand GPUs)."""
        gpn = self.topo.gpn
        hits = np.flatnonzero(~np.isnan(values[:, _XID_COL]))
        for g in _as_ints(hits):
            node = g // gpn
            code = int(values[g, _XID_COL])
            kind = EventKind.GPU_LOST if code == 79 else EventKind.XID
            rec = EventRecord(kind, self.idents[node], self.seqs[node].agent, int(ts[node]),
                              gpu=g % gpn, uuid=self.model.uuids[g], data={"xid": code})
            fut = await self.timer.send(self.topics.events, rec.to_bytes(), key=rec.key)
            fut.add_done_callback(_ignore_result)
            self.stats.events += 1

    def _progress_line(self, out: TextIO, now: float, acks_prev: int) -> tuple[float, int]:
        # Rates since the start: frames leave in bursts every ticks_per_frame ticks, so a
        # per-interval rate would swing between zero and a multiple of the real one.
        stats, ps = self.stats, self.publisher.stats
        dt = max(time.monotonic() - stats.started, 1e-9)
        lat = self.timer.recent(acks_prev)
        of = "" if math.isinf(self.total_ticks) else f"/{int(self.total_ticks)}"
        out.write(
            f"\rfleet tick {stats.ticks}{of} | {stats.metrics / dt:,.0f} metrics/s | "
            f"{stats.frames / dt:,.0f} frames/s | ack p50 {_pct(lat, 50)} ms p99 "
            f"{_pct(lat, 99)} ms | in flight {ps.in_flight} | behind "
            f"{stats.behind_s_max:.2f} s | lost {ps.lost_frames}   "
        )
        out.flush()
        return now, self.timer.count


class _Group:
    """Nodes that close their frames on the same tick, with their GPU rows precomputed."""

    def __init__(self, nodes: npt.NDArray[np.intp], gpn: int, idents: Sequence[Any],
                 seqs: Sequence[AgentSequence], uuids: Sequence[tuple[str, ...]]) -> None:
        self.nodes = nodes
        self.gpus = (nodes[:, None] * gpn + np.arange(gpn)).ravel()
        self.gpn = gpn
        self.idents = [idents[n] for n in nodes.tolist()]
        self.seqs = [seqs[n] for n in nodes.tolist()]
        self.uuids = [uuids[n] for n in nodes.tolist()]


def _as_ints(a: npt.NDArray[np.intp]) -> Iterable[int]:
    return (int(x) for x in a)


def _ignore_result(fut: asyncio.Future[RecordMeta]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        log.warning("event not delivered: %s", fut.exception())

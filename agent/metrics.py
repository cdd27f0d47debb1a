"""The agent's own Prometheus ``/metrics``: is it ticking, is it publishing, is it spooling.

The hot path keeps plain integer counters on small stats objects (sampler, publishers,
spools, source); nothing on it touches prometheus_client. A custom collector reads those
objects when Prometheus scrapes, so a scrape costs a few dozen attribute reads and the
sampling loop pays nothing for being observable. The endpoint binds to 127.0.0.1 unless
configured otherwise (``[metrics] host``).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from agent.sampler import LATENCY_BUCKETS_S, SamplerStats

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from agent.attribution.tracker import AttributionTracker
    from agent.publisher import Publisher
    from agent.sources.base import Source

__all__ = ["AgentCollector", "MetricsServer", "serve_metrics"]

P = "fleetpulse_agent_"


@dataclass(eq=False)  # registries keep collectors in a set: hash by identity
class AgentCollector(Collector):
    """Reads the agent's stats objects at scrape time."""

    sampler: SamplerStats
    source: Source
    publishers: dict[str, Publisher]
    """Stream name (``samples``, ``events``) -> its publisher."""
    attribution: AttributionTracker | None = None
    """The workload attribution tracker, when ``attribution.sources`` names any."""

    def collect(self) -> Iterator[Metric]:
        s = self.sampler
        yield CounterMetricFamily(P + "ticks", "Ticks sampled.", value=s.ticks)
        yield CounterMetricFamily(P + "late_ticks",
                                  "Ticks that started late (stamped with their real time).",
                                  value=s.late_ticks)
        yield CounterMetricFamily(P + "missed_ticks",
                                  "Ticks skipped because their time passed (never bunched).",
                                  value=s.missed_ticks)
        steps = CounterMetricFamily(P + "clock_steps",
                                    "Wall-clock steps detected (sampling stays on the "
                                    "monotonic clock; stamps follow the new time).",
                                    labels=["direction"])
        for direction, n in sorted(s.clock_steps.items()):
            steps.add_metric([direction], n)
        yield steps
        yield CounterMetricFamily(P + "source_failed_ticks",
                                  "Ticks the source could not read at all.",
                                  value=s.source_errors)
        yield CounterMetricFamily(P + "frames_built", "Sample frames built.", value=s.frames)
        yield CounterMetricFamily(P + "events", "Events seen by the source.", value=s.events)
        cumulative, buckets = 0, []
        for bound, count in zip((*LATENCY_BUCKETS_S, float("inf")), s.latency_counts,
                                strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        yield HistogramMetricFamily(P + "sampling_latency_seconds",
                                    "From a tick's due time until its values were read.",
                                    buckets=buckets, sum_value=s.latency_sum_s)

        errors = CounterMetricFamily(P + "source_errors",
                                     "Source errors by kind (NVML error names, scrape, ...).",
                                     labels=["source", "kind"])
        for kind, n in sorted(self.source.error_counts().items()):
            errors.add_metric([self.source.name, kind], n)
        yield errors
        if self.attribution is not None:
            att = self.attribution
            yield CounterMetricFamily(P + "attribution_events",
                                      "Attribution changes sent (attach and detach).",
                                      value=att.events)
            yield GaugeMetricFamily(P + "attribution_attached",
                                    "GPUs with a workload attached now.",
                                    value=len(att.current))
            failed = CounterMetricFamily(P + "attribution_errors",
                                         "Attribution polls a source could not answer.",
                                         labels=["source"])
            for name, n in sorted(att.errors.items()):
                failed.add_metric([name], n)
            yield failed

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(P + name, doc, labels=["stream"])

        def gauge(name: str, doc: str) -> GaugeMetricFamily:
            return GaugeMetricFamily(P + name, doc, labels=["stream"])

        sent = counter("frames_sent", "Records acknowledged by the broker.")
        sent_b = counter("bytes_sent", "Bytes acknowledged by the broker.")
        replayed = counter("frames_replayed", "Records delivered from the spool.")
        failures = counter("send_failures",
                       "Retriable send failures (broker down or slow).")
        rejected = counter("frames_rejected",
                       "Records the broker refused for good (dropped).")
        lost = counter("frames_lost", "Records lost: no spool configured, or the spool "
                       "could not be written (disk full).")
        spooled = counter("spool_appended_frames", "Records written to the spool.")
        dropped = counter("spool_dropped_frames",
                      "Records lost because the spool was full (see spool.drop_policy).")
        dropped_b = counter("spool_dropped_bytes", "Bytes lost to a full spool.")
        corrupt = counter("spool_corrupt_bytes",
                      "Spool bytes that failed their checksum (torn writes).")
        write_err = counter("spool_write_errors",
                            "Spool writes the disk refused (full, read-only): the frame is "
                            "lost (frames_lost) and no torn record is left behind.")
        pend = gauge("spool_frames", "Records in the spool, not yet delivered.")
        pend_b = gauge("spool_bytes", "Bytes in the spool, not yet delivered.")
        mode = gauge("spooling", "1 while publishing goes to the spool.")
        inflight = gauge("in_flight", "Records sent, awaiting acknowledgement.")
        for stream, pub in sorted(self.publishers.items()):
            st = pub.stats
            sent.add_metric([stream], st.frames_sent)
            sent_b.add_metric([stream], st.bytes_sent)
            replayed.add_metric([stream], st.frames_replayed)
            failures.add_metric([stream], st.send_failures)
            rejected.add_metric([stream], st.rejected_frames)
            lost.add_metric([stream], st.lost_frames)
            mode.add_metric([stream], 1.0 if pub.mode.value == "spooling" else 0.0)
            inflight.add_metric([stream], st.in_flight)
            if pub.spool is not None:
                sp = pub.spool.stats
                spooled.add_metric([stream], sp.appended_frames)
                dropped.add_metric([stream], sp.dropped_frames)
                dropped_b.add_metric([stream], sp.dropped_bytes)
                corrupt.add_metric([stream], sp.corrupt_bytes)
                write_err.add_metric([stream], sp.write_errors)
                pend.add_metric([stream], sp.pending_frames)
                pend_b.add_metric([stream], sp.pending_bytes)
        yield from (sent, sent_b, replayed, failures, rejected, lost, spooled, dropped, dropped_b,
                    corrupt, write_err, pend, pend_b, mode, inflight)


@dataclass
class MetricsServer:
    """A running /metrics endpoint."""

    server: WSGIServer
    thread: threading.Thread
    port: int

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def serve_metrics(collector: AgentCollector, host: str, port: int) -> MetricsServer:
    """Serve ``collector`` on http://host:port/metrics from a daemon thread."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread, int(server.server_address[1]))

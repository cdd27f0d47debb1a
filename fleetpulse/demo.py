"""The all-in-one runner behind ``fleetpulse demo``: fleet, aggregator, detector, web page.

Every stage is the real one, wired on one event loop over one transport (the embedded
in-memory broker by default, Kafka with ``--bootstrap``): the synthetic fleet publishes
sample frames through the agent's publisher, the aggregator rolls them up and serves the
Prometheus-compatible query API, the detector turns the same samples into alerts on the
alerts topic, and this module follows that topic into the web page's alert board, the
terminal view and the scorecard.

Simulated time runs ``speed`` times faster than the wall clock (tick ``k`` is due at
``k / (hz * speed)`` wall seconds), so a 30-second demo shows five simulated minutes of
faults and alerts. Sample timestamps are simulated time starting at the wall clock's start,
and the page's clock (``web/alerts``' ``now_ms``) is the newest simulated tick, so "the last
hour" on the page means the last simulated hour.

The scorecard compares alerts with the injected faults as ``benchmarks.detection`` does:
a fault is detected when an alert on one of its GPUs (or on their node or rack) starts
between the fault's start and its end plus a 60 s grace; an alert episode is a false
incident when no fault on the same rack overlaps it (with the same grace).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

import numpy as np
import numpy.typing as npt
from aiohttp import web

from agent.fleet import FleetModel, Topology, plan_faults, write_labels
from agent.fleet.faults import Fault, FaultKind
from agent.fleet.jobs import FleetAttribution, JobScheduler
from agent.fleet.live import AckTimer, LiveStats
from agent.fleet.model import METRIC_IDS, METRICS
from agent.publisher import AgentSequence, Publisher, new_agent_id
from aggregator.config import AggregatorConfig
from aggregator.http_errors import JsonErrorRunner
from aggregator.service import AggregatorService
from detector.config import DetectorConfig
from detector.service import DetectorService
from fleetpulse.config import ConfigError, TransportConfig
from fleetpulse.transport import Transport, open_transport
from fleetpulse.web import AlertBoard, WebConfig, add_web_routes, follow_alerts
from schemas.frame import SampleFrame
from schemas.records import AlertRecord, AlertState, EventKind, EventRecord, IncidentRecord
from schemas.topics import Topics

__all__ = ["DemoConfig", "Scorecard", "run_demo"]

log = logging.getLogger("fleetpulse.demo")

_XID_COL: Final = METRICS.index("fleetpulse_gpu_xid")
GRACE_S: Final = 60.0
"""Slack around a fault when matching alerts to it (as in benchmarks.detection)."""


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """``fleetpulse demo``: the whole system in one process (see config/demo.toml)."""

    gpus: int = 1024
    """Simulated GPUs; with the default shape, 4 rows x 4 racks x 8 nodes x 8 GPUs."""
    gpus_per_node: int = 8
    nodes_per_rack: int = 8
    racks_per_row: int = 4
    cluster: str = "sim"
    hz: float = 1.0
    """Samples per GPU per simulated second."""
    speed: float = 10.0
    """Simulated seconds per wall-clock second (1 = real time)."""
    duration_s: float = 0.0
    """Wall-clock seconds to run; 0 runs until SIGINT/SIGTERM."""
    fault_horizon_s: float = 600.0
    """Simulated span the fault plan covers when ``duration_s`` is 0 (faults start within
    its first 60 %, so they show in the first minutes of a demo)."""
    faults: int = 8
    """Faults to inject (kinds cycle, so 8 or more include every kind)."""
    fault_kinds: tuple[str, ...] = ()
    """Restrict the injected kinds (empty: all of agent.fleet.FaultKind)."""
    labels: str = ""
    """Write the ground truth (JSON list, one object per faulted GPU) here; empty: none."""
    seed: int = 1
    ticks_per_frame: int = 5
    """Ticks per sample frame (one message per node per this many ticks)."""
    partitions: int = 8
    """Partitions of the samples, events and alerts topics."""
    listen: str = "127.0.0.1:8080"
    """host:port of the web page and the query API."""
    data_dir: str = ""
    """Store and checkpoints; empty: a temporary directory removed at exit."""
    progress_s: float = 1.0
    """Seconds between terminal view updates (0: none)."""
    max_backlog_frames: int = 0
    """Frames the slowest stage may fall behind before the fleet waits for it (0: two
    frames per node). Keeps the demo coherent when the machine cannot reach ``speed``: the
    simulated clock slows down instead of the consumers drowning (and the page with them)."""
    drain_s: float = 5.0
    """At the end, wall seconds to let the aggregator and detector catch up before stopping."""
    jobs: bool = True
    """Schedule jobs on the fleet (agent.fleet.jobs): job-mapping files are written and read
    back by the agent's job_mapping source, alerts name their job, the end lists the jobs."""
    job_min_s: float = 120.0
    """Shortest job, simulated seconds (job lengths are log-uniform in [min, max])."""
    job_max_s: float = 4 * 3600.0
    """Longest job; a real fleet's run to days, a demo's minutes only show the short ones end."""
    job_poll_s: float = 5.0
    """Simulated seconds between job-mapping polls (the agent's attribution.interval_s)."""
    transport: TransportConfig = field(
        default_factory=lambda: TransportConfig(bootstrap="memory://demo"))
    """The broker: the embedded one by default."""
    web: WebConfig = field(default_factory=WebConfig)
    """The heatmap page."""
    detector: DetectorConfig = field(default_factory=lambda: demo_detector_config())
    """Detector settings; its transport, state_dir and metrics_port are the demo's. A
    ``[detector]`` table in a file starts from DetectorConfig's own defaults, so name the
    demo's choices there too (config/demo.toml does)."""
    aggregator: AggregatorConfig = field(default_factory=lambda: AggregatorConfig(
        fsync=False, max_future_ms=0))  # simulated time runs ahead of the clock
    """Aggregator settings; its transport, data_dir and listen are the demo's."""

    def validate(self) -> None:
        if self.speed <= 0 or self.speed > 1000:
            raise ConfigError(f"speed must be in (0, 1000], got {self.speed}")
        if not 0 < self.hz <= 50:
            raise ConfigError(f"hz must be in (0, 50], got {self.hz}")
        if self.duration_s < 0 or self.fault_horizon_s <= 0:
            raise ConfigError("duration_s must be >= 0 and fault_horizon_s > 0")
        if self.faults < 0 or self.partitions < 1 or self.ticks_per_frame < 1:
            raise ConfigError("faults >= 0, partitions >= 1 and ticks_per_frame >= 1")
        if not 0 < self.job_min_s <= self.job_max_s or self.job_poll_s <= 0:
            raise ConfigError("jobs need 0 < job_min_s <= job_max_s and job_poll_s > 0")
        if self.progress_s < 0 or self.drain_s < 0 or self.max_backlog_frames < 0:
            raise ConfigError("progress_s, drain_s and max_backlog_frames must be >= 0")
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(f"listen must be host:port, got {self.listen!r}")
        try:
            self.topology()
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        kinds = {k.value for k in FaultKind}
        bad = [k for k in self.fault_kinds if k not in kinds]
        if bad:
            raise ConfigError(f"fault_kinds: unknown {bad}; choose from {sorted(kinds)}")
        if self.faults and self.horizon_s() * self.hz < 10:
            raise ConfigError("faults need at least 10 simulated ticks: raise duration or speed")
        try:
            self.fault_plan()
        except ValueError as exc:
            raise ConfigError(f"faults: {exc}") from None

    def topology(self) -> Topology:
        return Topology(self.gpus, self.gpus_per_node, self.nodes_per_rack, self.racks_per_row,
                        self.cluster)

    def fault_plan(self) -> list[Fault]:
        """The injected faults (deterministic from the seed)."""
        if not self.faults:
            return []
        return plan_faults(self.topology(), self.faults, self.horizon_s(), self.hz, self.seed,
                           self.fault_kinds or None)

    def horizon_s(self) -> float:
        """Simulated seconds the fault plan covers."""
        return self.duration_s * self.speed if self.duration_s else self.fault_horizon_s


def demo_detector_config() -> DetectorConfig:
    """The detector as the demo runs it: the fast engine, a short cold start (a demo lasts
    minutes of simulated time, not hours) and no periodic checkpoints (the state is thrown
    away at exit). Job peers are on, as in production: the demo fleet's load follows its
    jobs (:mod:`agent.fleet.job_load`), so a job's GPUs run alike."""
    base = DetectorConfig()
    return dataclasses.replace(
        base, checkpoint_interval_s=1e9,
        model=dataclasses.replace(base.model, engine="numba", warmup=120),
        rack=dataclasses.replace(base.rack, warmup=12),
    )


# ------------------------------------------------------------------------------ scorecard
class Scorecard:
    """Faults injected vs. alerts seen, updated as alert records arrive."""

    def __init__(self, topo: Topology, plan: list[Fault], start_ms: int) -> None:
        self.start_ms = start_ms
        self.plan = plan
        gpn = topo.gpn
        node_paths = [i.path for i in topo.identities]
        self.gpu_paths = [f"{node_paths[g // gpn]}/gpu-{g % gpn}" for g in range(topo.gpus)]
        self.fault_paths = [[self.gpu_paths[g] for g in f.gpus] for f in plan]
        self.detected_at: dict[int, float] = {}
        """Fault index -> simulated seconds from its start to the first matching alert."""
        self.episodes: dict[str, AlertRecord] = {}
        """Alert id -> first firing record (one per episode)."""
        self.resolved_ms: dict[str, int] = {}
        self.transitions = 0
        self.incidents: dict[str, IncidentRecord] = {}
        """Incident id -> its newest record (merged ones included, counted apart)."""

    def add_incident(self, inc: IncidentRecord) -> None:
        self.incidents[inc.id] = inc

    def incident_summary(self) -> list[dict[str, Any]]:
        """The incidents that stand (not merged into another), oldest first."""
        return [{"id": i.id, "root": i.root, "cause": i.cause, "action": i.action.value,
                 "severity": i.severity.value, "alerts": len(i.members), "state": i.state.value}
                for i in sorted(self.incidents.values(), key=lambda i: i.started_ms)
                if not i.merged_into]

    def add(self, rec: AlertRecord) -> None:
        self.transitions += 1
        if rec.state is AlertState.FIRING:
            first = self.episodes.setdefault(rec.id, rec)
            start_s = (first.started_ms - self.start_ms) / 1000.0
            for k, f in enumerate(self.plan):
                if k in self.detected_at or not f.start_s <= start_s <= f.end_s + GRACE_S:
                    continue
                if any(_covers(rec.entity, p) for p in self.fault_paths[k]):
                    self.detected_at[k] = start_s - f.start_s
        else:
            self.resolved_ms[rec.id] = rec.updated_ms

    def injected(self, sim_s: float) -> int:
        return sum(1 for f in self.plan if f.start_s <= sim_s)

    def false_incidents(self, now_ms: int) -> list[AlertRecord]:
        out = []
        for aid, rec in self.episodes.items():
            s = (rec.started_ms - self.start_ms) / 1000.0
            e = (self.resolved_ms.get(aid, now_ms) - self.start_ms) / 1000.0
            excused = any(
                f.start_s - GRACE_S <= e and s <= f.end_s + GRACE_S
                and any(_same_rack(rec.entity, p) for p in self.fault_paths[k])
                for k, f in enumerate(self.plan)
            )
            if not excused:
                out.append(rec)
        return out

    def summary(self, sim_s: float, now_ms: int) -> dict[str, Any]:
        delays = sorted(self.detected_at.values())
        by_kind: dict[str, list[int]] = {}
        for k, f in enumerate(self.plan):
            if f.start_s <= sim_s:
                by_kind.setdefault(f.kind.value, [0, 0])
                by_kind[f.kind.value][0] += 1
                by_kind[f.kind.value][1] += int(k in self.detected_at)
        return {
            "faults_planned": len(self.plan),
            "faults_injected": self.injected(sim_s),
            "faults_detected": len(self.detected_at),
            "detected_by_kind": {k: f"{d}/{n}" for k, (n, d) in sorted(by_kind.items())},
            "median_delay_s": round(float(np.median(delays)), 1) if delays else None,
            "false_incidents": len(self.false_incidents(now_ms)),
            "alerts": len(self.episodes),
            "incidents": sum(1 for i in self.incidents.values() if not i.merged_into),
            "alert_transitions": self.transitions,
        }


def _covers(entity: str, gpu_path: str) -> bool:
    """An alert on ``entity`` is about the GPU at ``gpu_path`` (itself, its node or rack)."""
    return gpu_path == entity or gpu_path.startswith(entity + "/")


def _same_rack(entity: str, gpu_path: str) -> bool:
    rack = "/".join(entity.split("/")[:4])  # cluster/row/rack (or less for row/cluster)
    return gpu_path == entity or gpu_path.startswith(rack + "/")


# ------------------------------------------------------------------------------ the fleet
class FleetDriver:
    """The synthetic fleet, published like ``fleetpulse fleet`` does, paced by ``speed``."""

    def __init__(self, cfg: DemoConfig, transport: Transport, topics: Topics,
                 consumed: Callable[[], int] = lambda: 1 << 62,
                 job_dir: Path | None = None) -> None:
        self.cfg = cfg
        self.topo = cfg.topology()
        self.consumed = consumed
        """Frames the slowest consuming stage has processed (for backpressure)."""
        self.max_backlog = cfg.max_backlog_frames or 2 * self.topo.nodes
        self.waited_s = 0.0
        """Wall time spent waiting for the consumers."""
        self.plan = cfg.fault_plan()
        if cfg.labels:
            write_labels(cfg.labels, self.plan)
        self.start_ms = (time.time_ns() // 1_000_000) // 1000 * 1000
        # With jobs, the fleet's load follows them (agent.fleet.job_load): a job's GPUs run
        # alike, so the detector can judge a GPU against its job.
        scheduler = JobScheduler(self.topo, cfg.seed, min_s=cfg.job_min_s,
                                 max_s=cfg.job_max_s) \
            if cfg.jobs and job_dir is not None else None
        self.model = FleetModel(self.topo, hz=cfg.hz, seed=cfg.seed, start_ms=self.start_ms,
                                faults=self.plan, jobs=scheduler)
        self.timer = AckTimer(transport)
        self.topics = topics
        self.stats = LiveStats()
        self.publisher = Publisher(self.timer, topics.samples, None, max_in_flight=4096)
        self.sim_now_ms = self.start_ms
        self.behind_s = 0.0
        self._seqs: list[AgentSequence] = []
        self.jobs = FleetAttribution(self.topo, job_dir, list(self.model.uuids),
                                     scheduler=scheduler) \
            if scheduler is not None and job_dir is not None else None
        """Jobs and their job-mapping dirs (None: the demo runs without jobs)."""
        self._next_jobs_ms = self.start_ms

    @property
    def sim_s(self) -> float:
        return (self.sim_now_ms - self.start_ms) / 1000.0

    async def run(self, stop: asyncio.Event) -> None:
        """Generate and publish ticks until ``stop``; frames of a partial block still go out."""
        cfg, topo = self.cfg, self.topo
        loop = asyncio.get_running_loop()
        await self.publisher.start()
        nodes, m, per = topo.nodes, len(METRICS), cfg.ticks_per_frame
        self._seqs = [AgentSequence(new_agent_id(ident.node)) for ident in topo.identities]
        ts_buf = np.empty((per, nodes), dtype=np.int64)
        val_buf = np.empty((per, topo.gpus, m))
        rate = cfg.hz * cfg.speed
        t0 = loop.time()
        k = 0
        while not stop.is_set():
            due = t0 + k / rate
            now = loop.time()
            if due > now:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(due - now):
                        await stop.wait()
                if stop.is_set():
                    break
            else:
                self.behind_s = now - due
            if k % per == 0 and self.stats.frames - self.consumed() > self.max_backlog:
                t_wait = loop.time()
                while (self.stats.frames - self.consumed() > self.max_backlog
                       and not stop.is_set()):
                    await asyncio.sleep(0.02)
                # simulated time pauses while the stages catch up
                t0 += loop.time() - t_wait
                self.waited_s += loop.time() - t_wait
                continue
            slot = k % per
            ts, values = self.model.step(out=val_buf[slot])
            ts_buf[slot] = ts
            k += 1
            self.stats.ticks = k
            self.sim_now_ms = int(ts.max())
            await self._send_events(ts, values)
            if self.jobs is not None and self.sim_now_ms >= self._next_jobs_ms:
                self._next_jobs_ms = self.sim_now_ms + int(cfg.job_poll_s * 1000)
                for rec in await self.jobs.step(self.sim_now_ms):
                    await self.timer.send_and_wait(self.topics.events, rec.to_bytes(),
                                                   key=rec.key)
                    self.stats.events += 1
            if slot == per - 1:
                await self._send_frames(ts_buf, val_buf)
        done = k % per
        if done:
            await self._send_frames(ts_buf[:done], val_buf[:done])
        await self.publisher.close(timeout_s=30.0)

    async def _send_frames(self, ts: npt.NDArray[np.int64], values: npt.NDArray[np.float64]
                           ) -> None:
        """One frame per node (what its agent would send): ``ts`` (T, nodes), ``values``
        (T, G, M) with node n's GPUs at rows ``n * gpn ...``."""
        topo = self.topo
        t, gpn = ts.shape[0], topo.gpn
        by_node = values.reshape(t, topo.nodes, gpn, -1)
        local = np.arange(gpn, dtype=np.int32)
        for n, ident in enumerate(topo.identities):
            seq = self._seqs[n]
            frame = SampleFrame(ident, seq.agent, seq.next(), METRIC_IDS, local,
                                self.model.uuids[topo.gpus_of_node(n)], ts[:, n], by_node[:, n])
            await self.publisher.publish_frame(frame)
            if n % 64 == 63:
                await asyncio.sleep(0)  # let the consumers and the web server run
        self.stats.frames += topo.nodes
        self.stats.metrics += by_node.size

    async def _send_events(self, ts: npt.NDArray[np.int64], values: npt.NDArray[np.float64]
                           ) -> None:
        """XIDs of this tick as event records, as the agent's sampler sends them."""
        hits = np.flatnonzero(~np.isnan(values[:, _XID_COL]))
        for g in hits.tolist():
            node = g // self.topo.gpn
            code = int(values[g, _XID_COL])
            rec = EventRecord(EventKind.GPU_LOST if code == 79 else EventKind.XID,
                              self.topo.identities[node], self._seqs[node].agent, int(ts[node]),
                              gpu=g % self.topo.gpn, uuid=self.model.uuids[g],
                              data={"xid": code})
            await self.timer.send_and_wait(self.topics.events, rec.to_bytes(), key=rec.key)
            self.stats.events += 1


async def job_table(aggregator: AggregatorService, fleet: FleetDriver,
                    top: int = 8) -> list[dict[str, Any]]:
    """The largest running jobs with what the aggregator's job rollups say of them."""
    assert fleet.jobs is not None
    jobs = fleet.jobs.running()[:top]
    if not jobs:
        return []
    sel = "|".join(j.id for j in jobs)
    now = fleet.sim_now_ms

    def ask() -> dict[tuple[str, str], float]:
        out: dict[tuple[str, str], float] = {}
        for q in (f'fleetpulse_gpu_utilization_ratio{{level="job",job=~"{sel}"}}',
                  f'fleetpulse_gpu_power_usage_watts{{level="job",job=~"{sel}",agg="sum"}}'):
            res = aggregator.engine.query_range(q, now, now, 60_000, resolution="10s")
            for lab, row in zip(res.labels, res.values, strict=True):
                out[(lab["job"], lab["__name__"])] = float(row[-1])
        return out

    got = await aggregator.in_store(ask)
    rows = []
    for j in jobs:
        util = got.get((j.id, "fleetpulse_gpu_utilization_ratio"), math.nan)
        rows.append({"job": j.id, "size": j.size, "gpus": int(j.gpus.size),
                     "running_s": round((now - j.start_ms) / 1000), "utilization":
                     None if math.isnan(util) else round(util, 3)})
    return rows


# ------------------------------------------------------------------------------ terminal
class TerminalView:
    """What the demo prints: a status line (rates, lag, score) and one line per alert."""

    def __init__(self, out: TextIO, url: str, live_line: bool) -> None:
        self.out = out
        self.url = url
        self.live_line = live_line
        """Rewrite one status line in place (a terminal) rather than print a line each time."""
        self._last_len = 0

    def incident(self, inc: IncidentRecord, sim_s: float) -> None:
        if inc.revision == 0 or (inc.state is AlertState.RESOLVED and not inc.merged_into):
            state = "INCIDENT" if inc.state is AlertState.FIRING else "ended   "
            self._write(f"[sim {_hms(sim_s)}] {state} {inc.severity.value:<8} "
                        f"{inc.id:<22} {inc.summary}", newline=True)

    def alert(self, rec: AlertRecord, sim_s: float) -> None:
        attr = ", ".join(f"{a.metric.removeprefix('fleetpulse_gpu_')} "
                         f"{'↑' if a.direction == 'high' else '↓'}{a.weight:.2f}"
                         for a in rec.attribution[:3])
        state = "FIRING  " if rec.state is AlertState.FIRING else "resolved"
        job = f"  job {rec.context['job']}" if rec.context.get("job") else ""
        line = (f"[sim {_hms(sim_s)}] {state} {rec.severity.value:<8} {rec.source:<22} "
                f"{rec.entity}{job}  {rec.summary}" + (f"  ({attr})" if attr else ""))
        self._write(line, newline=True)

    def status(self, text: str) -> None:
        self._write(text, newline=not self.live_line)

    def jobs(self, rows: list[dict[str, Any]], started: int) -> None:
        """The largest running jobs, as the aggregator's job rollups see them."""
        self._write(f"jobs: {started} started; largest running (utilisation, last minute, "
                    f"from the job rollups):", newline=True)
        for r in rows:
            util = "  n/a" if r["utilization"] is None else f"{r['utilization']:5.0%}"
            self._write(f"  {r['job']:<12} {r['size']:<5} {r['gpus']:>5} GPUs  running "
                        f"{_hms(r['running_s'])}  utilisation {util}", newline=True)

    def _write(self, text: str, newline: bool) -> None:
        if self.live_line:
            pad = max(0, self._last_len - len(text))
            self.out.write("\r" + text + " " * pad + ("\n" if newline else ""))
            self._last_len = 0 if newline else len(text)
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def close(self) -> None:
        if self.live_line and self._last_len:
            self.out.write("\n")
            self.out.flush()


def _hms(s: float) -> str:
    s = max(0, int(s))
    return f"{s // 3600:02d}:{s // 60 % 60:02d}:{s % 60:02d}"


# ------------------------------------------------------------------------------ scores
class ScoreTap:
    """Watches a detector shard's GPU model bank and keeps each model's newest score.

    The page's "anomaly score" colouring needs every GPU's current score and threshold;
    the detector publishes only alert transitions. This proxy passes every call through to
    the bank unchanged (checkpoints included) and copies two arrays per step, so the
    detector behaves exactly as without it.
    """

    def __init__(self, bank: Any) -> None:
        self._bank = bank
        self.scores = np.full(0, np.nan)
        self.thresholds = np.full(0, np.nan)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._bank, name)

    def step(self, ids: npt.NDArray[np.int64], *args: Any, **kwargs: Any) -> Any:
        res = self._bank.step(ids, *args, **kwargs)
        if ids.size:
            need = int(ids.max()) + 1
            if need > self.scores.size:
                grow = need - self.scores.size
                self.scores = np.concatenate([self.scores, np.full(grow, np.nan)])
                self.thresholds = np.concatenate([self.thresholds, np.full(grow, np.nan)])
            self.scores[ids] = res.batch.scores
            self.thresholds[ids] = res.thresholds
        return res

    @staticmethod
    def collect(detector: DetectorService) -> dict[str, tuple[float, float]]:
        """Newest (score, threshold) per GPU path over all shards; installs taps as needed."""
        out: dict[str, tuple[float, float]] = {}
        for shard in list(detector.shards.values()):
            tap = shard.gpu_bank
            if not isinstance(tap, ScoreTap):
                shard.gpu_bank = ScoreTap(tap)  # type: ignore[assignment]
                continue
            n = min(tap.scores.size, len(shard.gpu_paths))
            ok = np.flatnonzero(np.isfinite(tap.scores[:n]))
            for i, sc, th in zip(ok.tolist(), tap.scores[ok].tolist(),
                                 tap.thresholds[ok].tolist(), strict=True):
                out[shard.gpu_paths[i]] = (round(sc, 3), round(th, 3))
        return out


# ------------------------------------------------------------------------------ the runner
@dataclass(slots=True)
class DemoRun:
    """The live parts of one demo, for the terminal view, the summary and tests."""

    cfg: DemoConfig
    fleet: FleetDriver
    aggregator: AggregatorService
    detector: DetectorService
    board: AlertBoard
    score: Scorecard
    url: str
    started: float = field(default_factory=time.monotonic)

    def summary(self) -> dict[str, Any]:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        st = self.fleet.stats
        agg = self.aggregator.rack.stats
        sim_s = self.fleet.sim_s
        out: dict[str, Any] = {
            "gpus": self.fleet.topo.gpus,
            "samples": st.metrics,
            "metrics_per_s": round(st.metrics / elapsed, 1),
            "frames": st.frames,
            "elapsed_s": round(elapsed, 2),
            "sim_s": round(sim_s, 1),
            "speed": self.cfg.speed,
            "speed_achieved": round(sim_s / elapsed, 2),
            "waited_for_stages_s": round(self.fleet.waited_s, 1),
            "aggregated_metrics": int(getattr(agg, "metrics", 0)),
            "detector_updates": int(self.detector.stats.updates),
        }
        out |= self.score.summary(sim_s, self.fleet.sim_now_ms)
        out["alerts_firing"] = len(self.board.firing())
        out["url"] = self.url
        return out

    def status_line(self, prev: tuple[float, int]) -> tuple[str, tuple[float, int]]:
        now = time.monotonic()
        st = self.fleet.stats
        rate = (st.metrics - prev[1]) / max(now - prev[0], 1e-9)
        lag = sum(loop.lag for loop in self.aggregator.loops)
        s = self.score.summary(self.fleet.sim_s, self.fleet.sim_now_ms)
        text = (f"sim {_hms(self.fleet.sim_s)} x{self.fleet.sim_s / max(now - self.started, 1e-9):.1f}"
                f" | ingest {rate:,.0f} metrics/s | agg lag {lag} msgs"
                f" | detector {self.detector.stats.updates:,} updates"
                f" | faults {s['faults_injected']}/{s['faults_planned']} detected "
                f"{s['faults_detected']} | alerts firing {len(self.board.firing())}"
                f" | false {s['false_incidents']}"
                + (f" | jobs {len(self.fleet.jobs.scheduler.jobs)}" if self.fleet.jobs else "")
                + f" | {self.url}")
        return text, (now, st.metrics)


async def run_demo(
    cfg: DemoConfig,
    *,
    stop: asyncio.Event | None = None,
    out: TextIO = sys.stderr,
    live_line: bool | None = None,
    on_ready: Callable[[DemoRun], None] | None = None,
) -> dict[str, Any]:
    """Run everything until ``duration_s`` passes or ``stop`` is set; returns the summary."""
    cfg.validate()
    stop = stop or asyncio.Event()
    tmp = None
    data_dir = Path(cfg.data_dir) if cfg.data_dir else Path(
        tmp := tempfile.mkdtemp(prefix="fleetpulse-demo-"))
    topics = Topics(cfg.transport.topic_prefix)
    agg_cfg = dataclasses.replace(cfg.aggregator, transport=cfg.transport,
                                  data_dir=str(data_dir / "aggregator"), listen=cfg.listen,
                                  samples_partitions=cfg.partitions)
    det_cfg = dataclasses.replace(cfg.detector, transport=cfg.transport,
                                  state_dir=data_dir / "detector", metrics_port=-1,
                                  partitions=cfg.partitions)
    agg_cfg.validate()
    det_cfg.validate()
    transports: list[Transport] = []

    async def transport() -> Transport:
        t = open_transport(cfg.transport)
        await t.start()
        transports.append(t)
        return t

    fleet_t = await transport()
    await fleet_t.ensure_topics({topics.samples: cfg.partitions, topics.events: cfg.partitions,
                                 topics.alerts: cfg.partitions, topics.deadletter: 1})
    aggregator = AggregatorService(agg_cfg)  # owns and closes its own transport
    await aggregator.start(serve_http=False)
    detector = DetectorService(det_cfg, await transport())
    fleet = FleetDriver(cfg, fleet_t, topics, consumed=lambda: min(
        aggregator.rack.stats.frames, detector.stats.frames), job_dir=data_dir / "job-mapping")
    board = AlertBoard(capacity=2000, clock=lambda: fleet.sim_now_ms)
    score = Scorecard(fleet.topo, fleet.plan, fleet.start_ms)
    view = TerminalView(out, "", out.isatty() if live_line is None else live_line)

    def on_alert(rec: AlertRecord) -> None:
        score.add(rec)
        view.alert(rec, fleet.sim_s)

    def on_incident(inc: IncidentRecord) -> None:
        score.add_incident(inc)
        view.incident(inc, fleet.sim_s)

    app = web.Application()
    aggregator.add_routes(app)
    page = add_web_routes(app, board, cfg.web)
    runner = JsonErrorRunner(app, access_log=None, shutdown_timeout=3.0)
    await runner.setup()
    host, port = agg_cfg.host_port
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1] if runner.addresses else port
    url = f"http://{host}:{bound}{page}"
    view.url = url
    run = DemoRun(cfg, fleet, aggregator, detector, board, score, url)
    out.write(f"fleetpulse demo: {fleet.topo.gpus:,} GPUs ({fleet.topo.nodes} nodes), "
              f"{len(fleet.plan)} faults planned over {_hms(cfg.horizon_s())} simulated, "
              f"x{cfg.speed:g} speed, transport {cfg.transport.bootstrap}\n"
              f"fleetpulse demo: heatmap and query API on {url}\n")
    out.flush()

    fleet_stop, stage_stop = asyncio.Event(), asyncio.Event()
    tasks = [
        asyncio.create_task(fleet.run(fleet_stop), name="demo-fleet"),
        asyncio.create_task(aggregator.run(), name="demo-aggregator"),
        asyncio.create_task(detector.run(stage_stop), name="demo-detector"),
        asyncio.create_task(follow_alerts(await transport(), topics, board, stop=stage_stop,
                                          on_record=on_alert, on_incident=on_incident),
                            name="demo-alerts"),
    ]
    if on_ready is not None:
        on_ready(run)
    deadline = time.monotonic() + cfg.duration_s if cfg.duration_s else math.inf
    prev = (time.monotonic(), 0)
    try:
        while not stop.is_set() and time.monotonic() < deadline:
            failed = [t for t in tasks if t.done()]
            if failed:
                failed[0].result()  # a stage died: raise its error
                raise RuntimeError(f"{failed[0].get_name()} ended unexpectedly")
            wait = min(cfg.progress_s or 1.0, max(0.0, deadline - time.monotonic()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await stop.wait()
            board.set_scores(ScoreTap.collect(detector))
            if cfg.progress_s:
                text, prev = run.status_line(prev)
                view.status(text)
    finally:
        fleet_stop.set()
        await _settle([tasks[0]], 45.0, "the fleet")
        summary = run.summary()  # ingest figures cover the run, not the drain
        t_stop = time.monotonic()
        await _drain(aggregator, detector, cfg.drain_s)
        log.info("drained in %.1f s", time.monotonic() - t_stop)
        if fleet.jobs is not None:
            summary["jobs_started"] = fleet.jobs.scheduler.started
            summary["job_list"] = await job_table(aggregator, fleet)
            view.jobs(summary["job_list"], fleet.jobs.scheduler.started)
        stage_stop.set()
        aggregator.stop()
        await _settle(tasks[1:], 90.0, "the stages")
        log.info("stages stopped after %.1f s", time.monotonic() - t_stop)
        view.close()
        await runner.cleanup()
        for t in transports:
            with contextlib.suppress(Exception):
                await t.close()
        log.info("closed after %.1f s", time.monotonic() - t_stop)
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)
    # what the stages finished during the drain, and the alerts it produced, count too
    summary |= score.summary(fleet.sim_s, fleet.sim_now_ms)
    summary["alerts_firing"] = len(board.firing())
    summary["incident_list"] = score.incident_summary()
    summary["aggregated_metrics"] = int(aggregator.rack.stats.metrics)
    summary["detector_updates"] = int(detector.stats.updates)
    return summary


async def _settle(tasks: list[asyncio.Task[Any]], timeout_s: float, what: str) -> None:
    """Wait for ``tasks`` to finish after their stop signal; log errors; cancel stragglers.

    A stage that does not stop in time is cancelled (its stack logged first), so SIGINT
    always ends the demo.
    """
    done, pending = await asyncio.wait(tasks, timeout=timeout_s)
    for t in pending:
        frames = "".join(f"\n  {f.f_code.co_filename}:{f.f_lineno} {f.f_code.co_name}"
                         for f in t.get_stack())
        log.error("%s: %s did not stop within %.0f s; cancelling it at:%s", what,
                  t.get_name(), timeout_s, frames)
        t.cancel()
    if pending:
        await asyncio.wait(pending, timeout=10.0)
    for t in done:
        if not t.cancelled() and t.exception() is not None:
            log.error("%s: %s stopped with an error: %r", what, t.get_name(), t.exception())


async def _drain(aggregator: AggregatorService, detector: DetectorService,
                 budget_s: float) -> None:
    """Give the consumers up to ``budget_s`` to reach the end of what the fleet published."""
    deadline = time.monotonic() + budget_s
    while time.monotonic() < deadline:
        lag = await aggregator.behind()
        consumer = detector.consumer
        det_lag = 0
        if consumer is not None and consumer.assignment():
            ends = await consumer.end_offsets(consumer.assignment())
            det_lag = sum(max(0, end - detector.next_offset.get(tp, end))
                          for tp, end in ends.items())
        if lag == 0 and det_lag == 0:
            return
        await asyncio.sleep(0.2)

"""End-to-end ingest load test: synthetic fleet -> real Kafka -> consuming stages.

    python -m benchmarks.ingest --gpus 30320 --hz 1 --seconds 300 [--bootstrap B] --json

Every part is a separate process against a real broker (started with ``scripts/kafka.sh``
in a private directory when ``--bootstrap`` is not given, and stopped afterwards):

* the load generator: ``fleetpulse fleet`` (one logical agent per node, the agent's publisher);
* the stages, pluggable (``--stages``; default every one that exists):
  ``decode`` (this module in consumer mode: ``decode_frame`` on every message, counting
  metrics; the floor any consumer pays), ``aggregator`` and ``detector`` (the
  ``fleetpulse`` commands, once they are registered in ``fleetpulse.cli.COMMANDS``).

What it measures, from outside the stages, so it works for any stage:

* throughput per stage from its consumer group's committed offsets (frames x metrics per
  frame) over the load window; the end-to-end figure is the slowest stage's;
* lag per stage in seconds: how long ago the broker's end offset was where the group's
  committed offset is now (so a stage that commits every 10 s shows up to ~10 s by design);
* end-to-end latency (newest sample of a frame to its decode) from the decode stage;
* CPU seconds per million metrics per stage from ``/proc/<pid>/stat`` (whole process tree),
  the broker's too, and the CPU the *rest* of the machine used meanwhile (it is shared);
* for the aggregator also its own counters (``/metrics``, see :class:`CounterScraper`): an
  event-time stage commits only offsets whose windows are all closed, so its committed
  offsets trail by window + lateness (~30 s) and move in steps. Its ``metrics_per_s`` is
  then what it consumed and rolled up (``committed_metrics_per_s`` keeps the other
  reading), and ``position_lag_*_s`` how far behind the partitions' ends it reads
  (``position_lag_trend_s``: the rise of a least-squares line over the steady window);
* peak resident memory of each stage's (largest) process and of the fleet;
* the bottleneck: a stage whose lag grows, else the one using the most CPU per metric.

Output: a table, ``benchmarks/results/ingest.json``, and one JSON object as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "ingest.json"
CLK_TCK = os.sysconf("SC_CLK_TCK")
METRICS_PER_GPU = 33  # agent.fleet.METRICS; checked at run time against the fleet's summary


# ------------------------------------------------------------------ stages


@dataclass(frozen=True)
class RunContext:
    bootstrap: str
    prefix: str
    workdir: Path
    instance: int = 0
    """Which member of the stage's consumer group this process is (``--instances``)."""


@dataclass(frozen=True)
class Stage:
    """How to start one consuming stage as its own process."""

    name: str
    argv: Callable[[RunContext], list[str]]
    env: Callable[[RunContext], dict[str, str]] = lambda ctx: {}
    group_hint: str = ""
    """Substring of its consumer group id (to find its committed offsets)."""

    def available(self) -> bool:
        if self.name == "decode":
            return True
        from fleetpulse.cli import COMMANDS

        return self.name in COMMANDS


STAGES: dict[str, Stage] = {
    "decode": Stage(
        "decode",
        lambda ctx: [sys.executable, "-m", "benchmarks.ingest", "--decode-consumer",
                     "--bootstrap", ctx.bootstrap, "--topic-prefix", ctx.prefix],
        group_hint="decode",
    ),
    "aggregator": Stage(
        "aggregator",
        lambda ctx: [sys.executable, "-m", "fleetpulse", "aggregator",
                     "--bootstrap", ctx.bootstrap, "--topic-prefix", ctx.prefix,
                     "--group", f"{ctx.prefix}.aggregator",
                     "--data-dir", str(ctx.workdir / "aggregator" / f"data-{ctx.instance}"),
                     "--listen", "127.0.0.1:0"],
        group_hint="aggregator",
    ),
    "detector": Stage(
        "detector",
        lambda ctx: [sys.executable, "-m", "fleetpulse", "detector",
                     "--bootstrap", ctx.bootstrap, "--prefix", ctx.prefix,
                     "--group", f"{ctx.prefix}.detector",
                     "--state-dir", str(ctx.workdir / "detector" / f"state-{ctx.instance}"),
                     "--metrics-port", "0", "--quiet"],
        group_hint="detector",
    ),
}
"""Stage name -> how to run it; each gets its own consumer group named after the stage."""


_API_LINE = re.compile(r"query API on (http://[0-9.]+:\d+)")
_RATE = re.compile(r"([\d,]+(?:\.\d+)?) metrics/s")
_LEFT_GROUP = re.compile(r"session expired|coordinator dead|refused \(group rebalanced|"
                         r"CommitFailedError|UnknownMemberId|IllegalGeneration", re.IGNORECASE)
"""A consumer's stderr saying it was expelled from, or fell out of, its group."""


def _api_url(stderr: list[str]) -> str | None:
    """The query API's base URL an aggregator announced on stderr, once it has."""
    for line in stderr:
        if m := _API_LINE.search(line):
            return m.group(1)
    return None


class RollupProbe:
    """Sample timestamp -> rollup visible in the aggregator's query API.

    Every ``interval`` seconds it asks the API (Prometheus ``query_range`` on the 10 s tier)
    for the newest rack-level power window. When a newer window appears, the latency is
    the wall time now minus the window's timestamp (the step at its end), i.e. how long
    after its last sample a window became queryable. Resolution: the poll interval.
    """

    QUERY = 'fleetpulse_gpu_power_usage_watts{level="rack"}'

    def __init__(self, stderr: list[str], interval: float = 0.5) -> None:
        self.stderr = stderr
        self.interval = interval
        self.latencies_s: list[float] = []
        self.errors = 0
        self.newest = 0.0


    async def run(self, stop: asyncio.Event) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval)
                base = _api_url(self.stderr)
                if base is None:
                    continue
                now = time.time()
                end = now // 10 * 10
                params = {"query": self.QUERY, "start": str(end - 120), "end": str(end),
                          "step": "10", "resolution": "10s"}
                try:
                    async with http.get(f"{base}/api/v1/query_range", params=params,
                                        timeout=aiohttp.ClientTimeout(total=5)) as resp:
                        body = await resp.json()
                except (aiohttp.ClientError, TimeoutError, ValueError):
                    self.errors += 1
                    continue
                stamps = [float(t) for series in body.get("data", {}).get("result", ())
                          for t, v in series.get("values", ()) if v not in ("NaN", None)]
                newest = max(stamps, default=0.0)
                if newest > self.newest:
                    if self.newest:  # the first one seen may be old: not a latency
                        self.latencies_s.append(now - newest)
                    self.newest = newest


@dataclass(frozen=True)
class OwnCounters:
    """Where a stage announces its ``/metrics`` and which of its series the report reads."""

    url: re.Pattern[str]
    metrics: str
    """Counter of the sample values it consumed."""
    lag: str
    """Gauge of the samples messages it has not read yet."""
    extra: dict[str, str] = field(default_factory=dict)
    """Report key -> series, kept as they are (skipped steps, behind seconds)."""


OWN_COUNTERS: dict[str, OwnCounters] = {
    "aggregator": OwnCounters(
        _API_LINE, "fleetpulse_aggregator_metrics_total",
        'fleetpulse_aggregator_consumer_lag_messages{stage="rack"}',
        {f"durability_{stage}_{what}": series
         for stage in ("rack", "row")
         for what, series in (
             ("cycles", f'fleetpulse_aggregator_durability_cycles_total{{stage="{stage}"}}'),
             ("flush_s", 'fleetpulse_aggregator_durability_seconds_total'
                         f'{{stage="{stage}",step="flush"}}'),
             ("checkpoint_s", 'fleetpulse_aggregator_durability_seconds_total'
                              f'{{stage="{stage}",step="checkpoint"}}'))}),
    "detector": OwnCounters(
        re.compile(r"/metrics on (http://[0-9.]+:\d+)/metrics"),
        "fleetpulse_detector_metrics_total", "fleetpulse_detector_consumer_lag_messages",
        {"model_steps": "fleetpulse_detector_model_steps_total",
         "skipped_steps": "fleetpulse_detector_model_steps_skipped_total",
         "behind_s": "fleetpulse_detector_behind_seconds",
         "models": "fleetpulse_detector_models",
         "models_warming": "fleetpulse_detector_models_warming",
         "models_held": "fleetpulse_detector_models_held",
         "forests_admitted": "fleetpulse_detector_forests_admitted_total",
         "busy_ratio": "fleetpulse_detector_busy_ratio"}),
}
"""Stages whose committed offsets do not say how far they got: the aggregator commits an
offset once every window it feeds is closed, the detector once a checkpoint covers it
(``checkpoint_interval_s``, 60 s). Both are measured by their own counters instead."""


class CounterScraper:
    """The own counters of the members of :data:`OWN_COUNTERS` stages, over time, scraped
    from their ``/metrics``: what they consumed and how many messages they are behind."""

    def __init__(self, errs: dict[str, list[str]], members: list[str], t0: float,
                 interval: float = 2.0) -> None:
        self.errs = errs
        self.members = members
        self.t0 = t0
        self.interval = interval
        self.metrics: dict[str, Series] = {m: Series() for m in members}
        self.lag_msgs: dict[str, Series] = {m: Series() for m in members}
        self.extra: dict[str, dict[str, Series]] = {m: {} for m in members}

    @staticmethod
    def spec(member: str) -> OwnCounters:
        return OWN_COUNTERS[member.split("#")[0]]

    def base_url(self, member: str) -> str | None:
        for line in self.errs.get(member, []):
            if m := self.spec(member).url.search(line):
                return m.group(1)
        return None

    async def run(self, stop: asyncio.Event) -> None:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.interval)
                for m in self.members:
                    base = self.base_url(m)
                    if base is None:
                        continue
                    try:
                        async with http.get(f"{base}/metrics",
                                            timeout=aiohttp.ClientTimeout(total=5)) as resp:
                            text = await resp.text()
                    except (aiohttp.ClientError, TimeoutError):
                        continue  # a busy member answers late: a gap in the series
                    now = time.monotonic() - self.t0
                    spec = self.spec(m)
                    names = {v: k for k, v in spec.extra.items()}
                    for line in text.splitlines():
                        name, _, value = line.rpartition(" ")
                        if name == spec.metrics:
                            self.metrics[m].add(now, float(value))
                        elif name == spec.lag:
                            self.lag_msgs[m].add(now, float(value))
                        elif name in names:
                            self.extra[m].setdefault(names[name], Series()).add(
                                now, float(value))


# ------------------------------------------------------------------ decode-only consumer


async def decode_consumer(bootstrap: str, prefix: str) -> None:
    """Consume the samples topic, decode every frame, commit each second, report on exit.

    Prints one JSON line per second (progress) and a final one with latency percentiles
    when SIGTERM arrives.
    """
    from fleetpulse.config import TransportConfig
    from fleetpulse.transport import open_transport
    from schemas.errors import DecodeError
    from schemas.frame import decode_frame
    from schemas.topics import Topics

    topics = Topics(prefix)
    transport = open_transport(TransportConfig(bootstrap=bootstrap, topic_prefix=prefix,
                                               client_id="bench-decode"))
    await transport.start()
    consumer = transport.consumer([topics.samples], f"{prefix}.decode")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    frames = metrics = errors = 0
    lat = np.empty(1 << 20)
    nlat = 0
    last_commit = time.monotonic()
    try:
        while not stop.is_set():
            msgs = await consumer.getmany(timeout_ms=200, max_records=5000)
            now_ms = time.time() * 1000.0
            for msg in msgs:
                try:
                    f = decode_frame(msg.value)
                except DecodeError:
                    errors += 1
                    continue
                frames += 1
                metrics += f.n_values
                if f.ts.size and nlat < lat.size:
                    lat[nlat] = now_ms - float(f.ts[-1])
                    nlat += 1
            if time.monotonic() - last_commit >= 1.0:
                if msgs or frames:
                    await consumer.commit()
                last_commit = time.monotonic()
                print(json.dumps({"frames": frames, "metrics": metrics, "errors": errors}),
                      flush=True)
        with contextlib.suppress(Exception):
            await consumer.commit()
    finally:
        await transport.close()
    sample = lat[:nlat]
    print(json.dumps({
        "final": True, "frames": frames, "metrics": metrics, "errors": errors,
        "latency_ms_p50": round(float(np.percentile(sample, 50)), 1) if nlat else None,
        "latency_ms_p99": round(float(np.percentile(sample, 99)), 1) if nlat else None,
    }), flush=True)


# ------------------------------------------------------------------ measurement helpers


def _proc_children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        kids.setdefault(ppid, []).append(int(entry))
    return kids


def tree_cpu_s(pid: int, kids: dict[int, list[int]] | None = None) -> float:
    """utime + stime (+ reaped children) of ``pid`` and its live descendants, seconds."""
    kids = _proc_children() if kids is None else kids
    total = 0.0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/stat") as fh:
                stat = fh.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        total += sum(int(x) for x in fields[11:15]) / CLK_TCK
        todo.extend(kids.get(p, ()))
    return total


def peak_rss_mb(pid: int) -> float | None:
    """The process's peak resident set (VmHWM), MB; None once it has exited."""
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return None


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy since boot (all cores)."""
    with open("/proc/stat") as fh:
        vals = [int(x) for x in fh.readline().split()[1:]]
    idle = vals[3] + (vals[4] if len(vals) > 4 else 0)
    return (sum(vals[:8]) - idle) / CLK_TCK


@dataclass
class Series:
    """(t, value) samples; ``at`` interpolates, ``when`` inverts a non-decreasing series."""

    t: list[float] = field(default_factory=list)
    v: list[float] = field(default_factory=list)

    def add(self, t: float, v: float) -> None:
        self.t.append(t)
        self.v.append(v)

    def at(self, t: float) -> float:
        return float(np.interp(t, self.t, self.v)) if self.t else 0.0

    def slope(self, t0: float, t1: float) -> float:
        """Least-squares rate of change over [t0, t1]: robust to data arriving in bursts."""
        t = np.asarray(self.t)
        m = (t >= t0) & (t <= t1)
        if m.sum() < 2:
            return (self.at(t1) - self.at(t0)) / max(t1 - t0, 1e-9)
        return float(np.polyfit(t[m], np.asarray(self.v)[m], 1)[0])

    def first_above(self, value: float) -> float | None:
        """When the series first went above ``value`` (linear between samples), or None."""
        v = np.asarray(self.v)
        i = int(np.searchsorted(v, value, side="right"))
        if i >= len(v):
            return None
        if i == 0:
            return self.t[0]
        frac = (min(value + 1.0, v[i]) - v[i - 1]) / (v[i] - v[i - 1])
        return self.t[i - 1] + frac * (self.t[i] - self.t[i - 1])


# ------------------------------------------------------------------ the run


class Monitor:
    """Polls end offsets and every consumer group's committed offsets of our samples topic."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.end = Series()
        self.committed: dict[str, Series] = {}
        self.lag: dict[str, Series] = {}

    async def start(self) -> None:
        from aiokafka import AIOKafkaConsumer
        from aiokafka.admin import AIOKafkaAdminClient

        self.admin = AIOKafkaAdminClient(bootstrap_servers=self.bootstrap)
        await self.admin.start()
        self.reader = AIOKafkaConsumer(bootstrap_servers=self.bootstrap, group_id=None)
        await self.reader.start()

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.reader.stop()
        with contextlib.suppress(Exception):
            await self.admin.close()

    async def poll(self, t: float) -> None:
        from aiokafka import TopicPartition

        tps = [TopicPartition(self.topic, p) for p in range(self.partitions)]
        ends = await self.reader.end_offsets(tps)
        end_total = float(sum(ends.values()))
        self.end.add(t, end_total)
        groups = [g[0] for g in await self.admin.list_consumer_groups()]
        for group in groups:
            try:
                offs = await self.admin.list_consumer_group_offsets(group)
            except Exception:
                continue
            mine = [o.offset for tp, o in offs.items() if tp.topic == self.topic and o.offset >= 0]
            if not mine:
                continue
            c = float(sum(mine))
            self.committed.setdefault(group, Series()).add(t, c)
            # Lag = age of the oldest record the group has not committed: when the end
            # offset first passed the committed one. Frames arrive in bursts, so "when the
            # end was where the commit is" would overstate it by the gap between bursts.
            since = self.end.first_above(c)
            lag_s = 0.0 if c >= end_total or since is None else max(0.0, t - since)
            self.lag.setdefault(group, Series()).add(t, lag_s)


def generator_rate(gpus: int, seconds: float = 1.0) -> float:
    """Metrics per CPU-second of the fleet model alone (one core), for ``gpus`` GPUs."""
    from agent.fleet import METRICS, FleetModel, Topology

    model = FleetModel(Topology(gpus), hz=1.0, seed=0)
    model.step()
    ticks, t0 = 0, time.process_time()
    while (spent := time.process_time() - t0) < seconds:
        model.step()
        ticks += 1
    return ticks * gpus * len(METRICS) / spent


def _start_broker(broker_dir: Path) -> str:
    if not (ROOT / "scripts" / "kafka.sh").exists():  # an installed wheel has no scripts/
        raise SystemExit("benchmarks.ingest: no scripts/kafka.sh here (it comes with a "
                         "checkout, not the wheel); pass --bootstrap HOST:PORT of a broker")
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "start", "--dir",
                           str(broker_dir), "--owner", str(os.getpid())],
                          capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/kafka.sh start failed: {proc.stderr[-2000:]}")
    return proc.stdout.strip().splitlines()[-1]


def _stop_broker(broker_dir: Path) -> None:
    """Stop our private broker; if kafka.sh cannot, signal its pid (ours, checked) directly."""
    subprocess.run(["bash", str(ROOT / "scripts" / "kafka.sh"), "stop", "--dir",
                    str(broker_dir)], capture_output=True, text=True, timeout=120)
    pid = _broker_pid(broker_dir, "")
    if pid is None:
        return
    with contextlib.suppress(OSError):
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        if str(broker_dir).encode() in cmd:
            os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not Path(f"/proc/{pid}").exists():
                    return
                time.sleep(0.2)
            os.kill(pid, signal.SIGKILL)


def _broker_pid(broker_dir: Path | None, bootstrap: str) -> int | None:
    if broker_dir is not None:
        with contextlib.suppress(OSError, ValueError):
            pid = int((broker_dir / "broker.pid").read_text().strip())
            if Path(f"/proc/{pid}").exists():
                return pid
        return None
    port = bootstrap.rsplit(":", 1)[-1].encode()
    for entry in os.listdir("/proc"):  # a broker someone else started: find its java
        if not entry.isdigit():
            continue
        try:
            args = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"kafka.Kafka" not in args:
            continue
        for arg in args:
            if arg.startswith(b"/") and arg.endswith(b"server.properties"):
                with contextlib.suppress(OSError):
                    if re.search(rb":" + port + rb"(?!\d)", Path(arg.decode()).read_bytes()):
                        return int(entry)
    return None


async def _read_lines(stream: asyncio.StreamReader | None, sink: list[str]) -> None:
    if stream is None:
        return
    while line := await stream.readline():
        sink.append(line.decode(errors="replace").rstrip("\n"))


async def run_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    gen = generator_rate(args.gpus)
    with tempfile.TemporaryDirectory(prefix="fp-ingest-") as tmp:
        workdir = Path(tmp)
        broker_dir = None if args.bootstrap else workdir / "broker"
        try:
            bootstrap = args.bootstrap or _start_broker(workdir / "broker")
            result = await _run(args, bootstrap, workdir, broker_dir)
            result["generator_metrics_per_cpu_s"] = round(gen, 1)
            return result
        finally:
            if broker_dir is not None:
                _stop_broker(broker_dir)


async def _run(args: argparse.Namespace, bootstrap: str, workdir: Path,
               broker_dir: Path | None) -> dict[str, Any]:
    from fleetpulse.config import TransportConfig
    from fleetpulse.transport import open_transport
    from schemas.topics import Topics

    prefix = f"bench-{uuid.uuid4().hex[:10]}"
    topics = Topics(prefix)
    ctx = RunContext(bootstrap, prefix, workdir)
    wanted = [s.strip() for s in args.stages.split(",")] if args.stages else [
        n for n, s in STAGES.items() if s.available()]
    stages = [STAGES[n] for n in wanted]
    missing = [s.name for s in stages if not s.available()]
    if missing:
        raise SystemExit(f"stages not available yet: {missing}")

    # Topics first, so consumers join before the first frame and lag counts from zero.
    admin_t = open_transport(TransportConfig(bootstrap=bootstrap, topic_prefix=prefix))
    await admin_t.start()
    await admin_t.ensure_topics({t: args.partitions for t in topics.all()})
    await admin_t.close()

    procs: dict[str, asyncio.subprocess.Process] = {}
    outputs: dict[str, list[str]] = {}
    readers: list[asyncio.Task[None]] = []
    errs: dict[str, list[str]] = {}

    async def spawn(name: str, argv: list[str], env: dict[str, str]) -> None:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=ROOT, env={**os.environ, **env},
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        procs[name] = proc
        outputs[name], errs[name] = [], []
        readers.append(asyncio.create_task(_read_lines(proc.stdout, outputs[name])))
        readers.append(asyncio.create_task(_read_lines(proc.stderr, errs[name])))

    for st in stages:
        for i in range(args.instances):
            ictx = dataclasses.replace(ctx, instance=i)
            await spawn(_member(st.name, i), st.argv(ictx), st.env(ictx))
    if args.instances > 1 and "aggregator" in wanted and args.check_rollups:
        # One more aggregator, alone in its own group and data dir, over the same samples:
        # the N instances' stores together must hold exactly what it stores. It shares the
        # machine (counted with the other processes), not the stage's cost.
        await spawn(REFERENCE, [sys.executable, "-m", "fleetpulse", "aggregator",
                                "--bootstrap", bootstrap, "--topic-prefix", prefix,
                                "--group", f"{prefix}.reference-agg", "--data-dir",
                                str(workdir / "aggregator" / "reference"),
                                "--listen", "127.0.0.1:0"], {})
    monitor = Monitor(bootstrap, topics.samples, args.partitions)
    await monitor.start()
    probe_stop = asyncio.Event()
    probe = RollupProbe(errs["aggregator"]) if "aggregator" in procs else None
    probe_task = asyncio.create_task(probe.run(probe_stop)) if probe else None
    await asyncio.sleep(args.settle)  # let the consumers join their groups
    broker_pid = _broker_pid(broker_dir, bootstrap)
    kids = _proc_children()
    cpu0 = {n: tree_cpu_s(p.pid, kids) for n, p in procs.items()}
    broker0 = tree_cpu_s(broker_pid, kids) if broker_pid else 0.0
    busy0 = machine_busy_s()
    load0 = os.getloadavg()

    fleet_argv = [sys.executable, "-m", "fleetpulse", "fleet", "--gpus", str(args.gpus),
                  "--hz", str(args.hz), "--duration", str(args.seconds), "--bootstrap",
                  bootstrap, "--topic-prefix", prefix, "--partitions", str(args.partitions),
                  "--ticks-per-frame", str(args.ticks_per_frame), "--progress", "0",
                  "--seed", str(args.seed), "--compression", args.compression]
    t_start = time.monotonic()
    scraper = CounterScraper(errs, [n for st in OWN_COUNTERS for n in _members(st, procs)],
                             t_start)
    scraper_task = asyncio.create_task(scraper.run(probe_stop))
    await spawn("fleet", fleet_argv, {})
    fleet = procs["fleet"]
    cpu0["fleet"] = 0.0
    last_cpu: dict[str, float] = dict(cpu0)
    last_broker = broker0
    cpu_series: dict[str, Series] = {n: Series() for n in procs}
    rss_peak: dict[str, float] = {}
    cpu_series["broker"] = Series()
    t_end: float | None = None
    drained_at: float | None = None
    died_at: dict[str, float] = {}
    deadline_drain = float("inf")
    while True:
        await asyncio.sleep(1.0)
        now = time.monotonic() - t_start
        with contextlib.suppress(Exception):
            await monitor.poll(now)
        kids = _proc_children()
        for n, p in procs.items():
            if p.returncode is None:
                last_cpu[n] = tree_cpu_s(p.pid, kids)
                peak = peak_rss_mb(p.pid)
                if peak is not None:
                    rss_peak[n] = max(rss_peak.get(n, 0.0), peak)
        if broker_pid:
            last_broker = tree_cpu_s(broker_pid, kids)
        for n, v in (*last_cpu.items(), ("broker", last_broker)):
            cpu_series.setdefault(n, Series()).add(now, v)
        if args.verbose:
            lags = {g: round(s.v[-1], 1) for g, s in monitor.lag.items() if s.v}
            print(f"t={now:6.1f}s end={monitor.end.v[-1] if monitor.end.v else 0:.0f} "
                  f"lag_s={lags}", file=sys.stderr, flush=True)
        if t_end is None and fleet.returncode is not None:
            t_end = now
            cpu_end = dict(last_cpu)
            broker_end = last_broker
            busy_end = machine_busy_s()
            deadline_drain = now + args.drain
        if t_end is not None:
            ends = monitor.end.v[-1] if monitor.end.v else 0.0
            if _drained(monitor, scraper, ends, t_end, len(stages)):
                drained_at = now
                break
            if now >= deadline_drain:
                break
            # Event-time stages hold back their commits for windows that only newer data
            # would close; once nothing moved for 15 s after the load (25 s with an
            # aggregator: its lag gauge is refreshed every commit interval), waiting is moot.
            quiet = 25 if scraper.members else 15
            if now - t_end > quiet and all(s.at(now) == s.at(now - 15)
                                           for s in monitor.committed.values()):
                break
        # A stage that dies is a result, not a reason to stop: the load runs its full
        # duration so the other stages are measured over it; the death time is reported.
        for n, p in procs.items():
            if n != "fleet" and p.returncode is not None and n not in died_at:
                died_at[n] = round(now, 1)
                print(f"stage {n} exited with status {p.returncode} at t={now:.0f}s",
                      file=sys.stderr, flush=True)
        if t_end is not None and len(died_at) == len(procs) - 1:
            break

    for p in procs.values():
        if p.returncode is None:
            p.send_signal(signal.SIGTERM)
    for p in procs.values():
        try:
            await asyncio.wait_for(p.wait(), 30)
        except TimeoutError:
            p.kill()
            await p.wait()
    for task in readers:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 5)
    await monitor.close()
    if args.logs:
        args.logs.mkdir(parents=True, exist_ok=True)
        for name, lines in errs.items():
            (args.logs / f"{name.replace('#', '-')}.stderr.log").write_text("\n".join(lines) + "\n")
    probe_stop.set()
    pollers: list[asyncio.Task[None] | None] = [probe_task, scraper_task]
    for poller in pollers:
        if poller is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(poller, 10)
    assert t_end is not None
    result = _report(args, stages, monitor, outputs, errs, t_end, drained_at, cpu0, cpu_end,
                     broker0, broker_end, busy0, busy_end, load0, procs, probe, cpu_series,
                     scraper)
    for st in stages:  # the largest member's peak (main process; children not included)
        peaks = [rss_peak[n] for n in _members(st.name, procs) if n in rss_peak]
        if peaks:
            result["per_stage"][st.name]["rss_peak_mb"] = round(max(peaks), 1)
        for n, row in result["per_stage"][st.name].get("per_instance", {}).items():
            row["rss_peak_mb"] = round(rss_peak[n], 1) if n in rss_peak else None
    if REFERENCE in procs:
        result["rollups_vs_one_instance"] = compare_rollups(
            [workdir / "aggregator" / f"data-{i}" for i in range(args.instances)],
            workdir / "aggregator" / "reference")
    if "fleet" in rss_peak:
        result["fleet"]["rss_peak_mb"] = round(rss_peak["fleet"], 1)
    for name, t in died_at.items():
        stage = name.split("#")[0]
        result["per_stage"][stage].setdefault("died_at_s", {})[name] = t
    return result


REFERENCE = "reference-aggregator"
CHECK_TIERS = ("raw", "10s", "1m")


def _series_digests(data_dirs: list[Path], tiers: tuple[str, ...]) -> dict[tuple[Any, ...], str]:
    """Per stored series (by entity labels, metric, aggregate, tier: ids differ between
    instances) a digest of its points, the points of every store in ``data_dirs`` merged
    (one per timestamp; two stores holding one window hold the same bits)."""
    import hashlib

    from aggregator.series_index import EntityIndex
    from aggregator.series_layout import split_series_id
    from aggregator.store import SeriesStore, StoreConfig

    points: dict[tuple[Any, ...], list[tuple[np.ndarray, np.ndarray]]] = {}
    for d in data_dirs:
        store = SeriesStore(StoreConfig(path=str(d / "store"), fsync=False))
        index = EntityIndex(d / "entities.jsonl")
        try:
            for tier in tiers:
                sids = np.sort(store.series_ids(tier))
                r = store.read(tier, sids, 0, 1 << 62)
                for i, sid in enumerate(r.series_ids.tolist()):
                    eid, metric, agg = split_series_id(sid)
                    ts, vals = r.series(i)
                    if ts.size:
                        points.setdefault((tier, index.keys[eid], metric, agg), []).append(
                            (ts, vals))
        finally:
            index.close()
            store.close()
    out = {}
    for key, parts in points.items():
        ts = np.concatenate([p[0] for p in parts])
        vals = np.concatenate([p[1] for p in parts])
        order = np.argsort(ts, kind="stable")
        ts, vals = ts[order], vals[order]
        keep = np.ones(ts.size, bool)
        keep[1:] = ts[1:] != ts[:-1]
        out[key] = hashlib.sha1(ts[keep].tobytes() + vals[keep].tobytes()).hexdigest()
    return out


def compare_rollups(instance_dirs: list[Path], reference_dir: Path) -> dict[str, Any]:
    """Whether the instances' stores together equal the single reference instance's."""
    got = _series_digests(instance_dirs, CHECK_TIERS)
    want = _series_digests([reference_dir], CHECK_TIERS)
    differ = [k for k in want.keys() & got.keys() if got[k] != want[k]]
    return {"tiers": list(CHECK_TIERS), "series": len(want), "equal": got == want,
            "missing": len(want.keys() - got.keys()), "extra": len(got.keys() - want.keys()),
            "differ": len(differ),
            "differ_examples": [repr(k) for k in sorted(differ, key=repr)[:3]]}


def _drained(monitor: Monitor, scraper: CounterScraper, ends: float, t_end: float,
             n_stages: int) -> bool:
    """Whether every stage has read everything produced: its group's commits reached the
    end, or for a stage with own counters (it holds its commits back) its own lag gauge,
    reported after the load ended, is zero (refreshed every few seconds: an upper bound on
    the drain time)."""
    own = {m.split("#")[0] for m in scraper.members}
    groups = {g: s for g, s in monitor.committed.items() if not any(o in g for o in own)}
    if len(groups) < n_stages - len(own):
        return False
    if not all(s.v and s.v[-1] >= ends for s in groups.values()):
        return False
    return all(s.t and s.t[-1] > t_end and s.v[-1] == 0 for s in scraper.lag_msgs.values())


def _own_counters(row: dict[str, Any], scraper: CounterScraper, members: list[str],
                  steady: float, window: float, produced_rate: float,
                  metrics_per_frame: float) -> None:
    """Rate and read position of an event-time stage from its own counters (see
    :class:`CounterScraper`); lag in messages becomes seconds at the produced frame rate."""
    series = [scraper.metrics[m] for m in members if len(scraper.metrics[m].t) >= 2]
    if len(series) != len(members):
        return
    row["consumed_metrics_per_s"] = round(sum(s.slope(steady, window) for s in series), 1)
    frames_per_s = produced_rate / metrics_per_frame if metrics_per_frame else 0.0
    lags = [scraper.lag_msgs[m] for m in members if scraper.lag_msgs[m].t]
    if frames_per_s > 0 and lags:
        grid = np.arange(0.0, window + 1e-9, 1.0)
        total = sum(np.interp(grid, s.t, s.v) for s in lags) / frames_per_s
        row["position_lag_max_s"] = round(float(np.max(total)), 2)
        row["position_lag_final_s"] = round(float(total[-1]), 2)
        row["position_lag_growth_s"] = round(float(np.interp(window, grid, total)
                                                   - np.interp(steady, grid, total)), 2)
        # The same rise from a least-squares line over the steady window: a read position
        # saw-tooths by several seconds (a flush, a checkpoint, a burst of forests), so the
        # difference of two points says more about where each fell in its tooth than about
        # a trend.
        span = (grid >= steady) & (grid <= window)
        if span.sum() >= 10:
            slope = np.polyfit(grid[span], total[span], 1)[0]
            row["position_lag_trend_s"] = round(float(slope * (window - steady)), 2)
    extra = [scraper.extra[m] for m in members]
    if any("model_steps" in e for e in extra):
        row["model_steps_per_s"] = round(sum(e["model_steps"].slope(steady, window)
                                             for e in extra if "model_steps" in e), 1)
    if any("skipped_steps" in e for e in extra):
        row["skipped_steps"] = int(sum(e["skipped_steps"].v[-1] for e in extra
                                       if "skipped_steps" in e))
    if any("behind_s" in e for e in extra):
        row["behind_s_max"] = round(max(max(e["behind_s"].v) for e in extra
                                        if "behind_s" in e), 2)
    if any("busy_ratio" in e and e["busy_ratio"].v for e in extra):
        # How much room the detector had: its worker's share of wall time spent processing
        # (forests are admitted only below ``admit_busy_below``).
        busy = [b for e in extra if "busy_ratio" in e
                for t, b in zip(e["busy_ratio"].t, e["busy_ratio"].v, strict=True)
                if steady <= t <= window]
        if busy:
            row["busy_ratio_median"] = round(float(np.median(busy)), 3)
    for stage in ("rack", "row"):
        # How long each stage's durability cycle held the store thread, on average. Both
        # stages' cycles come every commit interval, one after the other on that thread,
        # and the rack stage reads nothing meanwhile: their sum is the tooth its read
        # position saw-tooths by. (The store's flush is done by whichever comes first.)
        cycles = [e for e in extra if e.get(f"durability_{stage}_cycles")
                  and e[f"durability_{stage}_cycles"].v[-1]]
        n = sum(e[f"durability_{stage}_cycles"].v[-1] for e in cycles)
        for step in ("flush", "checkpoint") if n else ():
            held = sum(e[f"durability_{stage}_{step}_s"].v[-1] for e in cycles
                       if f"durability_{stage}_{step}_s" in e)
            row[f"durability_{stage}_{step}_s_per_cycle"] = round(held / n, 2)
    for key in ("models", "models_warming", "models_held", "forests_admitted"):
        # At the end: how many GPU forests the run left still in their cold start, the
        # dearest part of a forest's life (a short run measures little else), and how many
        # it started.
        if any(key in e and e[key].v for e in extra):
            row[f"{key}_final"] = int(sum(e[key].v[-1] for e in extra if key in e and e[key].v))


def _member(stage: str, i: int) -> str:
    """Process name of instance ``i`` of ``stage`` (the first is the stage's own name)."""
    return stage if i == 0 else f"{stage}#{i + 1}"


def _members(stage: str, names: Any) -> list[str]:
    return [n for n in names if n == stage or n.startswith(stage + "#")]


def _last_json(lines: list[str]) -> dict[str, Any]:
    for line in reversed(lines):
        with contextlib.suppress(ValueError):
            obj = json.loads(line)
            if isinstance(obj, dict):
                return obj
    return {}


def _report(args: argparse.Namespace, stages: list[Stage], monitor: Monitor,
            outputs: dict[str, list[str]], errs: dict[str, list[str]], t_end: float,
            drained_at: float | None, cpu0: dict[str, float], cpu_end: dict[str, float],
            broker0: float, broker_end: float, busy0: float, busy_end: float,
            load0: tuple[float, float, float],
            procs: dict[str, asyncio.subprocess.Process],
            probe: RollupProbe | None, cpu_series: dict[str, Series],
            scraper: CounterScraper | None = None) -> dict[str, Any]:
    fleet = _last_json(outputs["fleet"])
    if not fleet:
        raise SystemExit("the fleet printed no summary:\n" + "\n".join(errs["fleet"][-30:]))
    gpn = min(8, args.gpus)
    metrics_per_frame = args.ticks_per_frame * gpn * fleet["metrics_per_gpu"]
    window = t_end
    # The load window starts when the first frame reached the broker (process start-up and
    # the first ticks_per_frame ticks are not throughput).
    warm = monitor.end.first_above(0.0) or 0.0
    if window - warm < 1.0:
        warm = 0.0
    # Rates are measured over the steady part: the last two thirds of the load, after the
    # stages' own start-up (an event-time stage commits nothing until its first windows
    # close). Cost per metric = steady CPU rate / steady consumption rate.
    steady = warm + (window - warm) / 3.0
    produced_rate = monitor.end.slope(steady, window) * metrics_per_frame

    def cost(name: str, rate: float) -> float | None:
        series = cpu_series.get(name)
        if series is None or len(series.t) < 2 or rate <= 0:
            return None
        return round(series.slope(steady, window) / (rate / 1e6), 3)
    per_stage: dict[str, dict[str, Any]] = {}
    groups = dict(monitor.committed)
    for st in stages:
        group = next((g for g in groups if st.group_hint and st.group_hint in g), None)
        if group is None and len(groups) == 1 and len(stages) == 1:
            group = next(iter(groups))
        members = _members(st.name, procs)
        cpu = sum(cpu_end.get(n, 0.0) - cpu0.get(n, 0.0) for n in members)
        row: dict[str, Any] = {"group": group, "instances": len(members),
                               "cpu_s": round(cpu, 2), "cores": round(cpu / window, 3)}
        if len(members) > 1:  # one CPU series for the stage: the members' sum
            total = Series(list(cpu_series[members[0]].t),
                           [sum(v) for v in zip(*(cpu_series[n].v for n in members),
                                                strict=True)])
            cpu_series[st.name] = total
        if group is not None:
            c = groups.pop(group)
            rate = max(c.slope(steady, window) * metrics_per_frame, 0.0) + 0.0
            lag = monitor.lag[group]
            lag_in = [v for t, v in zip(lag.t, lag.v, strict=True) if t <= window]
            caught_up = bool(c.v) and monitor.end.v and c.v[-1] >= monitor.end.v[-1]
            row.update({
                "metrics_per_s": round(rate, 1),
                "lag_max_s": round(max(lag_in), 2) if lag_in else None,
                "lag_final_s": round(lag.at(window), 2),
                "lag_growth_s": round(lag.at(window) - lag.at(steady), 2),
                "caught_up_after_load": bool(caught_up),
                "cpu_s_per_million": cost(st.name, rate),
            })
        if scraper is not None and st.name in OWN_COUNTERS:
            _own_counters(row, scraper, members, steady, window, produced_rate,
                          metrics_per_frame)
            if "consumed_metrics_per_s" in row:
                row["committed_metrics_per_s"] = row.get("metrics_per_s")
                row["metrics_per_s"] = row["consumed_metrics_per_s"]
                row["cpu_s_per_million"] = cost(st.name, row["metrics_per_s"])
        left = [line for n in members for line in errs[n] if _LEFT_GROUP.search(line)]
        if len(members) > 1:  # what each instance cost over the whole load
            row["per_instance"] = {
                n: {"cpu_s": round(cpu_end.get(n, 0.0) - cpu0.get(n, 0.0), 2),
                    "cores": round((cpu_end.get(n, 0.0) - cpu0.get(n, 0.0)) / window, 3),
                    "rss_peak_mb": None}
                for n in members}
        row["left_group"] = bool(left)
        if left:
            row["left_group_lines"] = left[:5]
        said = [float(m.group(1).replace(",", "")) for n in members for line in errs[n]
                if (m := _RATE.search(line))]
        if said:  # per member line; the stage's rate is the members' sum
            row["self_reported_metrics_per_s_median"] = round(
                float(np.median(said)) * len(members), 1)
        finals = [f for n in members if (f := _last_json(outputs[n])).get("final")]
        if finals:
            row["decode_errors"] = sum(f.get("errors") or 0 for f in finals)
            # Conservative across members: the worst member's percentiles.
            row["latency_ms_p50"] = max((f.get("latency_ms_p50") or 0) for f in finals)
            row["latency_ms_p99"] = max((f.get("latency_ms_p99") or 0) for f in finals)
        codes = {n: procs[n].returncode for n in members}
        measured = group is not None or "consumed_metrics_per_s" in row
        if not measured or any(c not in (0, -signal.SIGTERM, None) for c in codes.values()):
            row["exit_codes"] = codes
            row["stderr_tail"] = [line for n in members for line in errs[n][-6:]]
        per_stage[st.name] = row
    fleet_cpu = cpu_end.get("fleet", 0.0)
    broker_cpu = broker_end - broker0
    ours = sum(cpu_end.get(n, 0.0) - cpu0.get(n, 0.0) for n in cpu_end) + broker_cpu
    others = max(0.0, (busy_end - busy0) - ours)
    rates = [r["metrics_per_s"] for r in per_stage.values() if "metrics_per_s" in r]
    lag_max = [r["lag_max_s"] for r in per_stage.values() if r.get("lag_max_s") is not None]
    lag_final = [r["lag_final_s"] for r in per_stage.values() if r.get("lag_final_s") is not None]
    # Bottleneck: a stage that fell behind, else the one spending the most CPU per metric.
    # (an event-time stage's read position, when it reports one, not its held-back commits)
    growth = {n: r.get("position_lag_trend_s", r.get("position_lag_growth_s",
                                                     r.get("lag_growth_s"))) or 0.0
              for n, r in per_stage.items()}
    behind = {n: g for n, g in growth.items() if g > max(5.0, 0.05 * (window - steady))}
    fleet_cost = cost("fleet", produced_rate)
    broker_cost = cost("broker", produced_rate)
    if behind:
        bottleneck, why = max(behind, key=lambda n: behind[n]), "lag kept growing"
    else:
        costs = {n: r.get("cpu_s_per_million") or 0 for n, r in per_stage.items()}
        costs["fleet"] = fleet_cost or 0
        costs["broker"] = broker_cost or 0
        bottleneck = max(costs, key=lambda n: costs[n])
        why = "most CPU per metric (no stage fell behind)"
    decode = per_stage.get("decode", {})
    base = decode.get("cpu_s_per_million")
    for name, row in per_stage.items():
        if base and row.get("cpu_s_per_million") and name != "decode":
            row["cpu_vs_decode_only"] = round(row["cpu_s_per_million"] / base, 2)
    result: dict[str, Any] = {
        "gpus": args.gpus,
        "hz": args.hz,
        "seconds": args.seconds,
        "partitions": args.partitions,
        "instances": args.instances,
        "compression": args.compression,
        "ticks_per_frame": args.ticks_per_frame,
        "stages": [s.name for s in stages],
        "target_metrics_per_s": round(args.gpus * args.hz * fleet["metrics_per_gpu"], 1),
        "produced_metrics_per_s": round(produced_rate, 1),
        "load_window_s": round(window - warm, 2),
        "steady_window_s": round(window - steady, 2),
        "metrics_per_s": round(min(rates), 1) if rates else 0.0,
        "lag_max_s": max(lag_max) if lag_max else None,
        "lag_final_s": max(lag_final) if lag_final else None,
        "drain_s": round(drained_at - t_end, 2) if drained_at is not None else None,
        "latency_ms_p50": decode.get("latency_ms_p50"),
        "latency_ms_p99": decode.get("latency_ms_p99"),
        "latency_what": "newest sample of a frame -> decoded by the decode stage",
        "rollup_visible_s_p50": _q(probe.latencies_s, 50) if probe else None,
        "rollup_visible_s_p99": _q(probe.latencies_s, 99) if probe else None,
        "rollup_visible_what": "end of a 10 s window -> its rack rollup answers a query_range",
        "bottleneck": bottleneck,
        "bottleneck_reason": why,
        "per_stage": per_stage,
        "fleet": {"cpu_s": round(fleet_cpu, 2), "cores": round(fleet_cpu / window, 3),
                  "cpu_s_per_million": fleet_cost,
                  "behind_s_max": fleet.get("behind_s_max"),
                  "ack_ms_p50": fleet.get("ack_ms_p50"), "ack_ms_p99": fleet.get("ack_ms_p99"),
                  "frames": fleet.get("frames"), "frames_lost": fleet.get("frames_lost")},
        "broker": {"cpu_s": round(broker_cpu, 2), "cores": round(broker_cpu / window, 3),
                   "cpu_s_per_million": broker_cost},
        "machine": {"cpus": os.cpu_count(), "loadavg_before": [round(x, 2) for x in load0],
                    "other_processes_cores": round(others / window, 3)},
        "lag_series_s": {g: [[round(t, 1), round(v, 2)] for t, v in
                             zip(s.t, s.v, strict=True)][:: max(1, len(s.t) // 120)]
                         for g, s in monitor.lag.items()},
    }
    if scraper is not None:
        # The event-time stages' own gauges over the run (messages behind; the detector's
        # how far behind, how busy, how many forests started): what the end figures above
        # summarise.
        result["own_series_s"] = {
            m: {key: [[round(t, 1), round(v, 3)] for t, v in
                      zip(s.t, s.v, strict=True)][:: max(1, len(s.t) // 120)]
                for key, s in {"lag_messages": scraper.lag_msgs[m],
                               **scraper.extra[m]}.items()}
            for m in scraper.members}
    return result


def _q(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if values else None


def _print_table(r: dict[str, Any]) -> None:
    print(f"ingest: {r['gpus']} GPUs x {r['hz']} Hz x {r['seconds']} s, "
          f"{r['partitions']} partitions, target {r['target_metrics_per_s']:,.0f} metrics/s")
    head = f"{'stage':<11}{'metrics/s':>13}{'lag max s':>11}{'lag end s':>11}" \
           f"{'CPU s':>9}{'cores':>7}{'CPU s/M':>9}"
    print(head)
    print("-" * len(head))

    def line(name: str, row: dict[str, Any], rate: Any = None) -> None:
        rate = row.get("metrics_per_s", rate)

        def fmt(v: Any, spec: str) -> str:
            return "-" if v is None else format(v, spec)
        print(f"{name:<11}{fmt(rate, ',.0f'):>13}{fmt(row.get('lag_max_s'), '.2f'):>11}"
              f"{fmt(row.get('lag_final_s'), '.2f'):>11}{fmt(row.get('cpu_s'), '.1f'):>9}"
              f"{fmt(row.get('cores'), '.2f'):>7}{fmt(row.get('cpu_s_per_million'), '.3f'):>9}")

    line("fleet", r["fleet"], r["produced_metrics_per_s"])
    line("broker", r["broker"])
    for name, row in r["per_stage"].items():
        line(name, row)
        if row.get("died_at_s"):
            print(f"{'':<11}(exited during the run at t = {row['died_at_s']} s; "
                  f"exit codes {row.get('exit_codes')})")
    print(f"end to end {r['metrics_per_s']:,.0f} metrics/s, lag max {r['lag_max_s']} s, "
          f"final {r['lag_final_s']} s, drain {r['drain_s']} s, latency p50 "
          f"{r['latency_ms_p50']} ms p99 {r['latency_ms_p99']} ms; rollup visible p50 "
          f"{r['rollup_visible_s_p50']} s p99 {r['rollup_visible_s_p99']} s; bottleneck: "
          f"{r['bottleneck']} ({r['bottleneck_reason']}); other processes used "
          f"{r['machine']['other_processes_cores']} cores meanwhile; the fleet model alone "
          f"generates {r['generator_metrics_per_cpu_s']:,.0f} metrics per CPU-second")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ingest", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=30_320)
    p.add_argument("--hz", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--stages", help="comma-separated: decode,aggregator,detector "
                                    "(default: every one that exists)")
    p.add_argument("--partitions", type=int, default=12)
    p.add_argument("--compression", default="snappy",
                   choices=("lz4", "zstd", "gzip", "snappy", "none"),
                   help="the fleet's producer codec (default snappy: aiokafka's lz4 is "
                        "level 9, ~10x the CPU per byte on this data)")
    p.add_argument("--instances", type=int, default=1,
                   help="processes per stage, all in the stage's consumer group")
    p.add_argument("--check-rollups", action=argparse.BooleanOptionalAction, default=True,
                   help="with --instances > 1: also run one reference aggregator and check "
                        "that the instances' stores together hold exactly its rollups")
    p.add_argument("--ticks-per-frame", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--settle", type=float, default=5.0,
                   help="seconds for the consumers to join before the load starts")
    p.add_argument("--drain", type=float, default=60.0,
                   help="seconds to wait after the load for the stages to catch up")
    p.add_argument("--json", action="store_true", help="also print the result JSON (last line)")
    p.add_argument("--verbose", action="store_true", help="lag every second on stderr")
    p.add_argument("--no-write", action="store_true", help="do not write the results file")
    p.add_argument("--out", type=Path, default=RESULTS, help="results file (JSON)")
    p.add_argument("--logs", type=Path, help="keep every process's stderr in this folder")
    p.add_argument("--decode-consumer", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--topic-prefix", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.decode_consumer:
        asyncio.run(decode_consumer(args.bootstrap, args.topic_prefix))
        return 0
    result = asyncio.run(run_benchmark(args))
    _print_table(result)
    if not args.no_write:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    summary = {k: v for k, v in result.items() if k not in ("lag_series_s", "own_series_s")}
    print(json.dumps(summary if args.json else {
        k: result[k] for k in ("metrics_per_s", "lag_max_s", "lag_final_s", "bottleneck")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The agent's own cost: CPU per sampled metric and peak RSS, against a naive agent.

Two measurements, both on the synthetic source (8 GPUs, every NVML-granular metric):

1. **Daemons.** The real agent (``python -m agent``: sampler, frames, publisher, spool,
   /metrics, on the embedded transport) and a naive agent (same source, same transport, one
   Python dict per metric, one orjson message per tick) run as separate processes at 1 Hz and
   10 Hz. CPU is read from ``/proc`` over a window after warm-up (so imports are not
   counted), peak RSS from ``VmHWM``. Both pay the synthetic model's cost, which a real NVML
   agent would replace with NVML calls.
   CPU time is the sum of the threads' scheduler run time (``/proc/PID/task/*/schedstat``,
   nanoseconds), not ``utime`` in 10 ms ticks, which is too coarse for 0.1 % of a core.
2. **In process.** The per-tick CPU of gather only, gather + frame building + encoding, and
   gather + dict per metric + orjson, without sleeping, so the agent's own overhead per
   metric can be read without the model's.

    python -m benchmarks.agent [--json] [--duration S] [--gpus N]
    python -m benchmarks.agent --nvml-capture   # on a GPU host: one real NVML tick, saved

``--nvml-capture`` runs ``fleetpulse agent --source nvml --once --print``'s code path on the
real driver and keeps its JSON lines as ``results/agent-nvml-<model>-<driver>.jsonl`` (the
issue's record of what each GPU model supports), plus the NVML errors by kind.

Targets (issue 3): <= 1 % of one core at 1 Hz for 8 GPUs, <= 80 MB RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import orjson

RESULTS = Path(__file__).parent / "results" / "agent.json"
CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGET_CPU_PERCENT_1HZ = 1.0
TARGET_RSS_MB = 80.0


def _cpu_s(pid: int) -> float:
    """CPU seconds of all live threads of ``pid``: schedstat (ns) when the kernel has it,
    else utime + stime (clock ticks, 10 ms resolution)."""
    total, ok = 0, False
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
            ok = True
        except (OSError, ValueError, IndexError):
            continue
    if ok:
        return total / 1e9
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def _hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _env(tmp: Path, hz: float, gpus: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_AGENT_")}
    env.update({
        "FLEETPULSE_AGENT_IDENTITY__CLUSTER": "bench",
        "FLEETPULSE_AGENT_IDENTITY__NODE": "node-1",
        "FLEETPULSE_AGENT_SOURCE__NAME": "synthetic",
        "FLEETPULSE_AGENT_SOURCE__SYNTHETIC__GPUS": str(gpus),
        "FLEETPULSE_AGENT_SAMPLING__INTERVAL_S": str(1 / hz),
        "FLEETPULSE_AGENT_SAMPLING__TICKS_PER_FRAME": "5",
        "FLEETPULSE_AGENT_TRANSPORT__BOOTSTRAP": f"memory://bench-{uuid.uuid4().hex[:8]}",
        "FLEETPULSE_AGENT_PUBLISH__CREATE_TOPICS": "1",
        "FLEETPULSE_AGENT_SPOOL__DIRECTORY": str(tmp / "spool"),
        "FLEETPULSE_AGENT_METRICS__PORT": "0",
    })
    return env


def _metric(url: str, name: str) -> float:
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise KeyError(name)


def run_daemon(impl: str, hz: float, gpus: int, duration: float, warmup: float) -> dict[str, Any]:
    """Start one daemon, measure CPU over ``duration`` after ``warmup``, stop it."""
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        log = tmp / "log"
        if impl == "fleetpulse":
            cmd = [sys.executable, "-m", "agent"]
        else:
            cmd = [sys.executable, "-m", "benchmarks.agent", "--naive-worker", "--hz", str(hz),
                   "--gpus", str(gpus)]
        with open(log, "w") as fh:
            proc = subprocess.Popen(cmd, env=_env(tmp, hz, gpus), stdout=fh, stderr=fh)
        try:
            url = ""
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                text = log.read_text()
                m = re.search(r"metrics (http://127\.0\.0\.1:\d+/metrics)", text)
                if m or "naive agent started" in text:
                    url = m.group(1) if m else ""
                    break
                if proc.poll() is not None:
                    raise RuntimeError(f"{impl} exited early:\n{text}")
                time.sleep(0.05)
            else:
                raise RuntimeError(f"{impl} did not start:\n{log.read_text()}")
            time.sleep(warmup)
            ticks0 = _metric(url, "fleetpulse_agent_ticks_total") if url else 0.0
            cpu0, t0 = _cpu_s(proc.pid), time.monotonic()
            time.sleep(duration)
            cpu1, t1 = _cpu_s(proc.pid), time.monotonic()
            ticks1 = _metric(url, "fleetpulse_agent_ticks_total") if url else 0.0
            late = _metric(url, "fleetpulse_agent_late_ticks_total") if url else float("nan")
            rss = _hwm_mb(proc.pid)
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
        if rc != 0:
            raise RuntimeError(f"{impl} exited {rc}:\n{log.read_text()}")
    wall = t1 - t0
    ticks = (ticks1 - ticks0) if url else round(wall * hz)
    from agent.fleet.model import METRICS

    metrics = ticks * gpus * len(METRICS)
    cpu = cpu1 - cpu0
    return {
        "impl": impl, "hz": hz, "wall_s": round(wall, 2), "ticks": int(ticks),
        "late_ticks": late, "cpu_s": round(cpu, 4),
        "cpu_percent_of_core": round(100 * cpu / wall, 3),
        "cpu_us_per_metric": round(1e6 * cpu / metrics, 3) if metrics else None,
        "peak_rss_mb": round(rss, 1),
    }


# ------------------------------------------------------------------ naive worker


async def naive_worker(hz: float, gpus: int) -> None:
    """The baseline: fixed-rate loop, one dict per metric, one orjson message per tick."""
    from agent.fleet.model import METRICS
    from agent.sources.base import SourceContext
    from agent.sources.synthetic import SyntheticSource
    from fleetpulse.config import TransportConfig
    from fleetpulse.transport import open_transport
    from schemas.identity import NodeIdentity

    ident = NodeIdentity("bench", "row-0", "rack-0", "node-1")
    source = SyntheticSource(SourceContext(ident, 1 / hz, {"gpus": gpus}))
    transport = open_transport(TransportConfig(
        bootstrap=os.environ.get("FLEETPULSE_AGENT_TRANSPORT__BOOTSTRAP", "memory://naive")))
    await transport.start()
    await transport.ensure_topics({"fleetpulse.samples": 1})
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("naive agent started", flush=True)
    start, k = time.monotonic(), 0
    while not stop.is_set():
        k += 1
        delay = start + k / hz - time.monotonic()
        if delay > 0:
            try:
                await asyncio.wait_for(stop.wait(), delay)
                break
            except TimeoutError:
                pass
        ts = time.time_ns() // 1_000_000
        g = await source.gather(ts)
        rows = []
        for i in range(len(g.gpus)):
            for j, name in enumerate(METRICS):
                rows.append({"node": ident.node, "gpu": int(g.gpus[i]), "uuid": g.uuids[i],
                             "metric": name, "value": float(g.values[i, j]), "ts_ms": ts})
        await transport.send_and_wait("fleetpulse.samples", orjson.dumps(rows),
                                      key=ident.rack_key)
    await transport.close()


# ------------------------------------------------------------------ in-process


def in_process(gpus: int, ticks: int) -> dict[str, Any]:
    """CPU per tick of gather / agent path / naive path, no sleeping."""
    from agent.fleet.model import METRICS
    from agent.publisher import AgentSequence
    from agent.sampler import FrameBuilder
    from agent.sources.base import SourceContext
    from agent.sources.synthetic import SyntheticSource
    from schemas.frame import encode_frame
    from schemas.identity import NodeIdentity

    ident = NodeIdentity("bench", "row-0", "rack-0", "node-1")

    def fresh() -> SyntheticSource:
        return SyntheticSource(SourceContext(ident, 1.0, {"gpus": gpus}))

    async def measure(kind: str) -> float:
        source = fresh()
        builder = FrameBuilder(ident, AgentSequence("bench.1"), 5)
        names = list(METRICS)
        await source.gather(0)
        t0 = time.process_time()
        for t in range(1, ticks + 1):
            ts = 1_700_000_000_000 + 1000 * t
            g = await source.gather(ts)
            if kind == "agent":
                for frame in builder.add(ts, g):
                    encode_frame(frame)
            elif kind == "naive":
                rows = []
                for i in range(len(g.gpus)):
                    for j, name in enumerate(names):
                        rows.append({"node": ident.node, "gpu": int(g.gpus[i]),
                                     "uuid": g.uuids[i], "metric": name,
                                     "value": float(g.values[i, j]), "ts_ms": ts})
                orjson.dumps(rows)
        return (time.process_time() - t0) / ticks

    per_tick = {k: asyncio.run(measure(k)) for k in ("source", "agent", "naive")}
    n = gpus * len(METRICS)
    agent_own = per_tick["agent"] - per_tick["source"]
    naive_own = per_tick["naive"] - per_tick["source"]
    return {
        "ticks": ticks, "metrics_per_tick": n,
        "source_us_per_tick": round(per_tick["source"] * 1e6, 1),
        "agent_us_per_tick": round(per_tick["agent"] * 1e6, 1),
        "naive_us_per_tick": round(per_tick["naive"] * 1e6, 1),
        "agent_own_ns_per_metric": round(agent_own / n * 1e9, 1),
        "naive_own_ns_per_metric": round(naive_own / n * 1e9, 1),
        "naive_over_agent_own": round(naive_own / agent_own, 1) if agent_own > 0 else None,
    }


def nvml_capture(bindings: Any = None, results_dir: Path = RESULTS.parent) -> int:
    """One real NVML tick printed and kept under results/ (needs GPUs and a driver)."""
    import io

    from agent.run import print_tick
    from agent.sources.nvml import NvmlSource
    from schemas.records import EventKind

    async def one() -> tuple[NvmlSource, Any]:
        src = NvmlSource(bindings, events=False)
        await src.start()
        try:
            return src, await src.gather(time.time_ns() // 1_000_000)
        finally:
            await src.close()

    from agent.sources.base import SourceError

    try:
        src, tick = asyncio.run(one())
    except SourceError as exc:
        print(f"no NVML here: {exc}", file=sys.stderr)
        return 1
    inv: dict[str, Any] = next((e.data for e in tick.events if e.kind is EventKind.INVENTORY), {})
    slug = re.sub(r"[^A-Za-z0-9.]+", "-", f"{inv.get('model')}-{inv.get('driver')}").strip("-")
    out = io.StringIO()
    n = print_tick(src, tick, out)
    path = results_dir / f"agent-nvml-{slug}.jsonl"
    path.write_text(out.getvalue())
    summary = {"gpus": len(tick.gpus), "lines": n, "metrics": len(tick.metric_ids),
               "errors_by_kind": src.error_counts(), "file": str(path)}
    print(out.getvalue(), end="")
    print(orjson.dumps(summary).decode())
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.agent", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="(always) write and print JSON")
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds per daemon")
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--hz", type=float, default=1.0, help=argparse.SUPPRESS)
    ap.add_argument("--naive-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--nvml-capture", action="store_true",
                    help="on a GPU host: save one real NVML tick under results/")
    args = ap.parse_args(argv)
    if args.nvml_capture:
        return nvml_capture()
    if args.naive_worker:
        asyncio.run(naive_worker(args.hz, args.gpus))
        return 0

    daemons = [run_daemon(impl, hz, args.gpus, args.duration, args.warmup)
               for hz in (1.0, 10.0) for impl in ("fleetpulse", "naive")]
    inproc = in_process(args.gpus, 2000)
    one_hz = next(d for d in daemons if d["impl"] == "fleetpulse" and d["hz"] == 1.0)
    worst_rss = max(d["peak_rss_mb"] for d in daemons if d["impl"] == "fleetpulse")
    result = {
        "benchmark": "agent",
        "gpus": args.gpus,
        "source": "synthetic",
        "transport": "memory",
        "duration_s": args.duration,
        "cpu_cores": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "daemons": daemons,
        "in_process": inproc,
        "targets": {"cpu_percent_of_core_at_1hz": TARGET_CPU_PERCENT_1HZ,
                    "peak_rss_mb": TARGET_RSS_MB},
        "meets": {
            "cpu_at_1hz": one_hz["cpu_percent_of_core"] <= TARGET_CPU_PERCENT_1HZ,
            "rss": worst_rss <= TARGET_RSS_MB,
        },
    }
    print(f"{'impl':<11}{'Hz':>5}{'ticks':>7}{'CPU s':>8}{'% core':>8}{'us/metric':>11}"
          f"{'RSS MB':>8}")
    for d in daemons:
        print(f"{d['impl']:<11}{d['hz']:>5g}{d['ticks']:>7}{d['cpu_s']:>8.4f}"
              f"{d['cpu_percent_of_core']:>8.3f}{d['cpu_us_per_metric'] or 0:>11.3f}"
              f"{d['peak_rss_mb']:>8.1f}")
    print(f"in process, per tick of {inproc['metrics_per_tick']} metrics: source "
          f"{inproc['source_us_per_tick']} us, agent {inproc['agent_us_per_tick']} us, naive "
          f"{inproc['naive_us_per_tick']} us; own cost per metric: agent "
          f"{inproc['agent_own_ns_per_metric']} ns, naive {inproc['naive_own_ns_per_metric']} ns "
          f"(x{inproc['naive_over_agent_own']})")
    print(f"targets: <= {TARGET_CPU_PERCENT_1HZ} % of a core at 1 Hz -> "
          f"{one_hz['cpu_percent_of_core']} % ({'met' if result['meets']['cpu_at_1hz'] else 'MISSED'}); "
          f"<= {TARGET_RSS_MB} MB RSS -> {worst_rss} MB "
          f"({'met' if result['meets']['rss'] else 'MISSED'})")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(orjson.dumps(result, option=orjson.OPT_INDENT_2).decode() + "\n")
    print(orjson.dumps(result).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())

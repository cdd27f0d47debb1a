"""A long broker outage under a group of real agents: is every frame delivered exactly once?

``python -m benchmarks.outage`` starts a private broker (scripts/kafka.sh), 8 ``fleetpulse
agent`` processes sampling the synthetic source at 1 Hz with their spools on disk, stops
the broker for 10 minutes, starts it again, waits until every spool has drained and then
reads the samples topic back. It reports, per agent, what was delivered (every (agent,
seq) exactly once and in order?), what the spool dropped and lost (from the agent's own
/metrics), the spool's peak size during the outage (sampled every second) and how long
draining took; the JSON goes to ``benchmarks/results/outage.json``.

An agent may get a spool limit small enough to be reached during the outage
(``--limited``): its drop policy then applies, and the check becomes "no frame is missing downstream that
its /metrics did not count as dropped or lost" (the count can exceed what is missing by the
frames in flight when the broker went down: see ``counted_but_delivered``).

:func:`run_outage` is the harness; ``tests/test_outage_agents.py`` runs it with a shorter
outage in the suite.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from fleetpulse.config import TransportConfig
from fleetpulse.transport import open_transport
from schemas.frame import decode_frame
from schemas.topics import Topics

ROOT = Path(__file__).resolve().parents[1]
RESULT = ROOT / "benchmarks" / "results" / "outage.json"


@dataclass(frozen=True)
class AgentSpec:
    node: str
    interval_s: float = 1.0
    gpus: int = 8
    spool_max_bytes: int = 256 << 20
    drop_policy: str = "drop_oldest"


@dataclass
class AgentOutcome:
    node: str
    agent_id: str = ""
    frames_built: float = 0.0
    delivered: int = 0
    duplicates: int = 0
    out_of_order: int = 0
    missing: int = 0
    spool_dropped: float = 0.0
    lost: float = 0.0
    rejected: float = 0.0
    rejected_why: list[str] = field(default_factory=list)
    """The agent's log lines for frames the broker rejected for good (the first few): a
    rejected frame is lost outside the drop policy, so its cause must be on record."""
    missing_ranges: list[tuple[int, int]] = field(default_factory=list)
    """Runs of missing seqs, [first, last]: the drop policy deletes whole old segments."""
    spool_peak_bytes: float = 0.0
    spool_peak_frames: float = 0.0
    drain_s: float = 0.0
    log_says_full: bool = False
    exit_code: int | None = None

    @property
    def counted_but_delivered(self) -> int:
        """Frames counted as dropped that reached the broker anyway: sent just before it
        went down, their acknowledgements lost, so they were spooled (at-least-once) and
        then in a segment the drop policy deleted. Bounded by rate x ack timeout."""
        return int(self.spool_dropped + self.lost + self.rejected) - self.missing

    @property
    def exact(self) -> bool:
        """Every seq once, in order, none rejected, and no frame missing that was not
        counted as the drop policy's (or the spool's disk's)."""
        return (self.duplicates == 0 and self.out_of_order == 0 and self.rejected == 0
                and self.counted_but_delivered >= 0)


@dataclass
class OutageResult:
    agents: list[AgentOutcome] = field(default_factory=list)
    outage_s: float = 0.0
    warm_s: float = 0.0
    wall_s: float = 0.0

    def to_json(self) -> dict[str, object]:
        return {"outage_s": self.outage_s, "warm_s": self.warm_s, "wall_s": self.wall_s,
                "all_exact": all(a.exact for a in self.agents),
                "agents": [{**asdict(a), "exact": a.exact,
                            "counted_but_delivered": a.counted_but_delivered}
                           for a in self.agents]}


class _Agent:
    def __init__(self, spec: AgentSpec, bootstrap: str, prefix: str, work: Path) -> None:
        self.spec = spec
        self.log = work / f"{spec.node}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETPULSE_AGENT_")}
        env.update({
            "FLEETPULSE_AGENT_IDENTITY__CLUSTER": "c1",
            "FLEETPULSE_AGENT_IDENTITY__ROW": "row-a",
            "FLEETPULSE_AGENT_IDENTITY__RACK": f"rack-{spec.node}",
            "FLEETPULSE_AGENT_IDENTITY__NODE": spec.node,
            "FLEETPULSE_AGENT_SOURCE__NAME": "synthetic",
            "FLEETPULSE_AGENT_SAMPLING__INTERVAL_S": str(spec.interval_s),
            "FLEETPULSE_AGENT_SAMPLING__TICKS_PER_FRAME": "1",
            "FLEETPULSE_AGENT_SOURCE__SYNTHETIC__GPUS": str(spec.gpus),
            "FLEETPULSE_AGENT_SPOOL__DIRECTORY": str(work / f"spool-{spec.node}"),
            "FLEETPULSE_AGENT_SPOOL__MAX_BYTES": str(spec.spool_max_bytes),
            "FLEETPULSE_AGENT_SPOOL__DROP_POLICY": spec.drop_policy,
            "FLEETPULSE_AGENT_METRICS__PORT": "0",
            "FLEETPULSE_AGENT_TRANSPORT__BOOTSTRAP": bootstrap,
            "FLEETPULSE_AGENT_TRANSPORT__TOPIC_PREFIX": prefix,
            "FLEETPULSE_AGENT_TRANSPORT__REQUEST_TIMEOUT_MS": "3000",
            "FLEETPULSE_AGENT_PUBLISH__ACK_TIMEOUT_S": "5",
            "FLEETPULSE_AGENT_PUBLISH__RETRY_MAX_S": "2",
            "FLEETPULSE_AGENT_PUBLISH__CREATE_TOPICS": "1",
            "FLEETPULSE_AGENT_SHUTDOWN_TIMEOUT_S": "15",
        })
        with self.log.open("wb") as fh:
            self.proc = subprocess.Popen([sys.executable, "-m", "fleetpulse", "agent"],
                                         cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        self.url = ""

    def started(self) -> bool:
        if not self.url:
            m = re.search(r"metrics (http://127\.0\.0\.1:\d+/metrics)",
                          self.log.read_text(errors="replace"))
            if m:
                self.url = m.group(1)
        if self.proc.poll() is not None:
            raise RuntimeError(f"agent {self.spec.node} exited: {self.tail()}")
        return bool(self.url)

    def metrics(self) -> dict[str, float]:
        try:
            text = urllib.request.urlopen(self.url, timeout=30).read().decode()
        except OSError:
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name.replace('{stream="samples"}', "")] = float(value)
        return out

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


async def _read_topic(bootstrap: str, topic: str, timeout_s: float = 180.0
                      ) -> list[tuple[int, int, bytes]]:
    """(partition, offset, value) of every record, up to the end offsets taken first."""
    transport = open_transport(TransportConfig(bootstrap=bootstrap))
    await transport.start()
    consumer = transport.consumer([topic], f"outage-check-{time.time_ns()}")
    out: list[tuple[int, int, bytes]] = []
    try:
        n = await transport.partitions_for(topic)
        ends = await consumer.end_offsets([(topic, p) for p in range(n)])
        seen = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + timeout_s
        while any(seen[tp] < end for tp, end in ends.items()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"read {seen} of {ends} in {timeout_s} s")
            for m in await consumer.getmany(timeout_ms=500):
                seen[m.tp] = m.offset + 1
                out.append((m.partition, m.offset, m.value))
    finally:
        await consumer.stop()
        await transport.close()
    return out


def _runs(values: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for v in values:
        if out and out[-1][1] == v - 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out


def run_outage(bootstrap: str, stop_broker: Callable[[], None],
               start_broker: Callable[[], None], specs: list[AgentSpec], work: Path,
               outage_s: float, warm_s: float = 5.0, drain_timeout_s: float = 300.0,
               prefix: str | None = None) -> OutageResult:
    """Agents up, broker down for ``outage_s``, broker up, spools drained, topic checked."""
    prefix = prefix or f"outage-{os.getpid()}-{time.time_ns() % 10**9}"
    result = OutageResult(outage_s=outage_s, warm_s=warm_s)
    outcome = {s.node: AgentOutcome(s.node) for s in specs}
    t_start = time.monotonic()
    agents = [_Agent(s, bootstrap, prefix, work) for s in specs]
    try:
        deadline = time.monotonic() + 120
        while not all(a.started() for a in agents):
            if time.monotonic() > deadline:
                raise RuntimeError("agents did not start: " + agents[0].tail())
            time.sleep(0.2)
        time.sleep(warm_s)
        stop_broker()
        t_down = time.monotonic()
        while time.monotonic() - t_down < outage_s:
            for a in agents:
                m = a.metrics()
                o = outcome[a.spec.node]
                o.spool_peak_bytes = max(o.spool_peak_bytes, m.get("fleetpulse_agent_spool_bytes",
                                                                   0.0))
                o.spool_peak_frames = max(o.spool_peak_frames,
                                          m.get("fleetpulse_agent_spool_frames", 0.0))
            time.sleep(1.0)
        start_broker()
        t_up = time.monotonic()
        pending = set(range(len(agents)))
        while pending:
            if time.monotonic() - t_up > drain_timeout_s:
                raise RuntimeError(f"spools not drained in {drain_timeout_s} s: "
                                   f"{[agents[i].spec.node for i in pending]}")
            for i in sorted(pending):
                m = agents[i].metrics()
                if (m.get("fleetpulse_agent_spooling") == 0
                        and m.get("fleetpulse_agent_spool_frames") == 0
                        and m.get("fleetpulse_agent_frames_replayed_total", 0) > 0):
                    outcome[agents[i].spec.node].drain_s = round(time.monotonic() - t_up, 1)
                    pending.discard(i)
            time.sleep(0.5)
        time.sleep(2.0)  # the frames sampled while the last spool drained
        for a in agents:
            m = a.metrics()
            o = outcome[a.spec.node]
            o.spool_dropped = m.get("fleetpulse_agent_spool_dropped_frames_total", 0.0)
            o.lost = m.get("fleetpulse_agent_frames_lost_total", 0.0)
            o.rejected = m.get("fleetpulse_agent_frames_rejected_total", 0.0)
            o.frames_built = m.get("fleetpulse_agent_frames_built_total", 0.0)
    finally:
        for a in agents:
            outcome[a.spec.node].exit_code = a.stop()
    for a in agents:
        text = a.log.read_text(errors="replace")
        outcome[a.spec.node].log_says_full = "SPOOL FULL" in text
        outcome[a.spec.node].rejected_why = [
            line for line in text.splitlines() if "rejected a frame for good" in line][:5]
    records = asyncio.run(_read_topic(bootstrap, Topics(prefix).samples))
    by_node: dict[str, list[tuple[int, int, int, str]]] = {}
    for part, off, value in records:
        f = decode_frame(value)
        by_node.setdefault(f.identity.node, []).append((part, off, f.seq, f.agent))
    for node, o in outcome.items():
        rows = sorted(by_node.get(node, []))
        seqs = [r[2] for r in rows]
        o.agent_id = rows[0][3] if rows else ""
        o.delivered = len(seqs)
        o.duplicates = len(seqs) - len(set(seqs))
        o.out_of_order = sum(1 for x, y in itertools.pairwise(seqs) if y <= x)
        o.missing = (max(seqs) + 1 - len(set(seqs))) if seqs else 0
        o.missing_ranges = _runs(sorted(set(range(max(seqs, default=-1) + 1)) - set(seqs)))
    result.agents = [outcome[s.node] for s in specs]
    result.wall_s = round(time.monotonic() - t_start, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--agents", type=int, default=8)
    p.add_argument("--hz", type=float, default=1.0)
    p.add_argument("--outage", type=float, default=600.0, help="seconds the broker is down")
    p.add_argument("--limited", type=int, default=1,
                   help="extra agents with a 1 MiB spool sampling 64 GPUs at 10 Hz, so that "
                        "their drop policy applies")
    p.add_argument("--out", type=Path, default=RESULT)
    args = p.parse_args(argv)
    specs = [AgentSpec(f"node-{i:02d}", interval_s=1.0 / args.hz)
             for i in range(args.agents)]
    specs += [AgentSpec(f"limited-{i:02d}", interval_s=0.1, gpus=64, spool_max_bytes=1 << 20)
              for i in range(args.limited)]
    with tempfile.TemporaryDirectory(prefix="fleetpulse-outage-") as tmp:
        broker_dir = Path(tmp) / "broker"
        kafka = ["bash", str(ROOT / "scripts" / "kafka.sh")]
        owner = ["--dir", str(broker_dir), "--owner", str(os.getpid())]

        def start() -> str:
            out = subprocess.run([*kafka, "start", *owner], capture_output=True, text=True,
                                 timeout=300, check=True)
            return out.stdout.strip().splitlines()[-1]

        def stop() -> None:
            subprocess.run([*kafka, "stop", *owner], capture_output=True, text=True,
                           timeout=120, check=True)

        def restart() -> None:
            start()

        bootstrap = start()
        try:
            res = run_outage(bootstrap, stop, restart, specs, Path(tmp), args.outage)
        finally:
            with contextlib.suppress(Exception):
                stop()
    doc = {"benchmark": "outage", "command": " ".join(["python -m benchmarks.outage",
                                                      *(argv or sys.argv[1:])]),
           "agents": args.agents, "hz": args.hz, "limited": args.limited, **res.to_json()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0 if res.to_json()["all_exact"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

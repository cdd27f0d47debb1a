"""For real: agent processes publishing to a private Kafka broker that goes away.

Phase 1: the broker is stopped for 30 s while the agent samples, then started again; the
agent spools and replays. Phase 2: the broker is stopped again, the agent is killed with
SIGKILL while its spool is non-empty, a new agent starts on the same spool, the broker comes
back. A consumer must then see every (agent, seq) exactly once and in order, the killed
incarnation's frames before the new one's, and nothing the agents built missing.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import re
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from test_agent_process import agent_env, fleetpulse

from fleetpulse.config import TransportConfig
from fleetpulse.transport import open_transport
from schemas.frame import decode_frame
from schemas.records import EventKind, EventRecord
from schemas.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

OUTAGE_S = 30.0
INTERVAL_S = 0.2
TICKS_PER_FRAME = 2


class AgentProcess:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.log = log
        self._fh = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(fleetpulse("agent"), env=env, stdout=self._fh,
                                     stderr=self._fh)
        self.metrics_url = ""

    def wait_started(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            m = re.search(r"metrics (http://127\.0\.0\.1:\d+/metrics)", self.log.read_text())
            if m:
                self.metrics_url = m.group(1)
                return
            assert self.proc.poll() is None, self.log.read_text()
            time.sleep(0.05)
        raise AssertionError(f"agent did not start:\n{self.log.read_text()}")

    def metric(self, name: str) -> float:
        # 30 s: the agent answers between samples; on a loaded 2-core CI machine that can
        # take several seconds, and a timeout here would be a false failure.
        text = urllib.request.urlopen(self.metrics_url, timeout=30).read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[-1])
        raise KeyError(name)

    def wait_drained(self, timeout: float) -> None:
        """Until the samples spool is empty and publishing is direct again."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if (self.metric('fleetpulse_agent_spooling{stream="samples"}') == 0
                    and self.metric('fleetpulse_agent_spool_frames{stream="samples"}') == 0
                    and self.metric('fleetpulse_agent_frames_replayed_total{stream="samples"}')
                    > 0):
                return
            time.sleep(0.25)
        raise AssertionError(f"spool not drained in {timeout} s:\n{self.log.read_text()}")

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=60)
        finally:
            self._fh.close()


async def _consume(bootstrap: str, topic: str, timeout_s: float = 120.0
                   ) -> list[tuple[int, bytes]]:
    """Every record of ``topic``: read until each partition's end offset (taken first).

    Reading until the end offsets, rather than until a quiet spell, cannot stop early when
    joining the group or the first fetch is slow on a loaded machine.
    """
    transport = open_transport(TransportConfig(bootstrap=bootstrap))
    await transport.start()
    consumer = transport.consumer([topic], f"check-{time.time_ns()}")
    out: list[tuple[int, bytes]] = []
    try:
        n = await transport.partitions_for(topic)
        ends = await consumer.end_offsets([(topic, p) for p in range(n)])
        seen = {tp: 0 for tp in ends}
        deadline = time.monotonic() + timeout_s
        while any(seen[tp] < end for tp, end in ends.items()):
            assert time.monotonic() < deadline, f"read {seen} of {ends} in {timeout_s} s"
            for m in await consumer.getmany(timeout_ms=500):
                seen[(m.topic, m.partition)] = m.offset + 1
                out.append((m.offset, m.value))
    finally:
        await consumer.stop()
        await transport.close()
    return out


def _until(what: str, cond: Callable[[], bool], log: Path, timeout: float = 60.0) -> None:
    """Poll ``cond`` until true; a condition, not a fixed sleep, so a loaded machine only
    makes the test slower."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s\n{log.read_text()}"
        time.sleep(0.2)


def test_outage_and_kill9_every_agent_seq_exactly_once_in_order(
        kafka_broker_factory: Callable[[], object], unique_prefix: str, tmp_path: Path) -> None:
    broker = kafka_broker_factory()
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    env = agent_env(
        tmp_path,
        FLEETPULSE_AGENT_TRANSPORT__BOOTSTRAP=bootstrap,
        FLEETPULSE_AGENT_TRANSPORT__TOPIC_PREFIX=unique_prefix,
        FLEETPULSE_AGENT_TRANSPORT__REQUEST_TIMEOUT_MS="3000",
        FLEETPULSE_AGENT_PUBLISH__ACK_TIMEOUT_S="5",
        FLEETPULSE_AGENT_PUBLISH__RETRY_MAX_S="1",
        FLEETPULSE_AGENT_PUBLISH__CREATE_TOPICS="1",
        FLEETPULSE_AGENT_SAMPLING__INTERVAL_S=str(INTERVAL_S),
        FLEETPULSE_AGENT_SAMPLING__TICKS_PER_FRAME=str(TICKS_PER_FRAME),
        FLEETPULSE_AGENT_SHUTDOWN_TIMEOUT_S="10",
    )
    first = AgentProcess(env, tmp_path / "agent-a.log")
    second: AgentProcess | None = None
    try:
        first.wait_started()
        time.sleep(3)
        _until("frames sent", lambda: first.metric(
            'fleetpulse_agent_frames_sent_total{stream="samples"}') > 0, first.log)
        # Phase 1: a 30 s outage while the agent keeps sampling.
        broker.stop()  # type: ignore[attr-defined]
        time.sleep(OUTAGE_S)
        _until("spooling in the outage", lambda: first.metric(
            'fleetpulse_agent_spool_frames{stream="samples"}') > 0, first.log)
        broker.start()  # type: ignore[attr-defined]
        first.wait_drained(90)
        # Phase 2: outage again, SIGKILL with a non-empty spool, a new incarnation.
        broker.stop()  # type: ignore[attr-defined]
        time.sleep(6)
        # The agent spools once a send times out (3 s) or an ack is overdue (5 s): only
        # 1 s after that on an idle machine, so wait for it rather than assume it.
        _until("spooling in the 2nd outage", lambda: first.metric(
            'fleetpulse_agent_spool_frames{stream="samples"}') > 0, first.log)
        first.stop(signal.SIGKILL)
        second = AgentProcess(env, tmp_path / "agent-b.log")
        second.wait_started()
        time.sleep(2)
        broker.start()  # type: ignore[attr-defined]
        second.wait_drained(90)
        time.sleep(1)
        assert second.stop() == 0, second.log.read_text()
    finally:
        first.stop(signal.SIGKILL)
        if second is not None:
            second.stop(signal.SIGKILL)

    topics = Topics(unique_prefix)
    records = asyncio.run(_consume(bootstrap, topics.samples))
    frames = [(offset, decode_frame(value)) for offset, value in records]
    by_agent: dict[str, list[int]] = {}
    last_offset: dict[str, int] = {}
    first_offset: dict[str, int] = {}
    for offset, f in frames:
        by_agent.setdefault(f.agent, []).append(f.seq)
        first_offset.setdefault(f.agent, offset)
        last_offset[f.agent] = offset
    assert len(by_agent) == 2, sorted(by_agent)
    a, b = sorted(by_agent, key=lambda k: first_offset[k])
    for agent, seqs in by_agent.items():
        assert seqs == list(range(len(seqs))), \
            f"{agent}: every seq exactly once and in order; got {len(seqs)} frames, " \
            f"duplicates {len(seqs) - len(set(seqs))}, first bad at " \
            f"{next((i for i, s in enumerate(seqs) if s != i), None)}"
    assert last_offset[a] < first_offset[b], "the killed agent's spool went out before new data"
    expected_min = (3 + OUTAGE_S + 6) / (INTERVAL_S * TICKS_PER_FRAME) * 0.5
    assert len(by_agent[a]) >= expected_min, "frames from the whole outage reached the broker"
    ts_a = [int(t) for _, f in frames if f.agent == a for t in f.ts]
    gaps = [y - x for x, y in itertools.pairwise(ts_a)]
    assert max(gaps) < 2000, "sampling went on during the outage (no hole in the first agent)"

    events = [EventRecord.from_bytes(v) for _, v in asyncio.run(_consume(bootstrap, topics.events))]
    stops = [e for e in events if e.kind is EventKind.AGENT_STOP]
    assert [e.agent for e in stops] == [b], "only the SIGTERMed incarnation says goodbye"
    assert stops[0].data["frames_built"] == len(by_agent[b]), "nothing the new agent built is lost"


def test_slow_broker_spools_and_replays_without_gaps(
        kafka_broker_factory: Callable[[], object], unique_prefix: str, tmp_path: Path) -> None:
    """A broker that hangs (SIGSTOP: connections open, no answers) is a slow broker: sends
    time out, frames go to the spool, and are replayed when it answers again.

    A frame the frozen broker had already received is written when it resumes *and* replayed
    from the spool (its ack never came): delivery is at-least-once, and the consumer's
    de-duplication by (agent, seq) must then see every frame, in order of first appearance.
    """
    broker = kafka_broker_factory()
    bootstrap = broker.bootstrap  # type: ignore[attr-defined]
    pid = int((broker.state_dir / "broker.pid").read_text().strip())  # type: ignore[attr-defined]
    env = agent_env(
        tmp_path,
        FLEETPULSE_AGENT_TRANSPORT__BOOTSTRAP=bootstrap,
        FLEETPULSE_AGENT_TRANSPORT__TOPIC_PREFIX=unique_prefix,
        FLEETPULSE_AGENT_TRANSPORT__REQUEST_TIMEOUT_MS="2000",
        FLEETPULSE_AGENT_PUBLISH__ACK_TIMEOUT_S="3",
        FLEETPULSE_AGENT_PUBLISH__RETRY_MAX_S="1",
        FLEETPULSE_AGENT_PUBLISH__CREATE_TOPICS="1",
        FLEETPULSE_AGENT_SAMPLING__INTERVAL_S=str(INTERVAL_S),
        FLEETPULSE_AGENT_SAMPLING__TICKS_PER_FRAME=str(TICKS_PER_FRAME),
    )
    agent = AgentProcess(env, tmp_path / "agent.log")
    try:
        agent.wait_started()
        time.sleep(3)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(10)
            _until("spooling while frozen", lambda: agent.metric(
                'fleetpulse_agent_spooling{stream="samples"}') == 1, agent.log)
        finally:
            os.kill(pid, signal.SIGCONT)
        agent.wait_drained(90)
        assert agent.stop() == 0, agent.log.read_text()
    finally:
        agent.stop(signal.SIGKILL)
    records = asyncio.run(_consume(bootstrap, Topics(unique_prefix).samples))
    seqs = [decode_frame(v).seq for _, v in records]
    first_seen: list[int] = []
    seen: set[int] = set()
    for s in seqs:
        if s not in seen:
            seen.add(s)
            first_seen.append(s)
    assert first_seen == list(range(len(first_seen))), "no gap, in order of first appearance"
    events = [EventRecord.from_bytes(v) for _, v in
              asyncio.run(_consume(bootstrap, Topics(unique_prefix).events))]
    stop = next(e for e in events if e.kind is EventKind.AGENT_STOP)
    assert len(first_seen) == stop.data["frames_built"], "every frame built reached the broker"
    print(f"slow broker: {len(seqs)} records for {len(first_seen)} frames "
          f"({len(seqs) - len(first_seen)} duplicates from lost acks)")

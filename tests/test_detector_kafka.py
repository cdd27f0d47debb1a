"""The detector as a real process against the real Kafka broker, killed with SIGKILL under
load: it restarts from its checkpoints and does not announce an open alert twice."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from test_detector_support import frame, healthy, read_alerts, small_config, timestamps

from detector.features import COL
from detector.service import DetectorService
from fleetpulse.config import TransportConfig
from fleetpulse.transport import Transport, open_transport
from schemas.frame import encode_frame
from schemas.records import AlertRecord, AlertState
from schemas.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

STEPS = 900
NODES = ("node-0", "node-1")


def _data() -> np.ndarray:
    data = healthy(STEPS, 8, seed=21)
    data[30, 1, COL["xid"]] = 79.0  # node-0/gpu-1: critical, stays open (600 s hold)
    data[200:260, 2, COL["clock_event_reasons"]] = 0x40  # node-0/gpu-2: fires, then resolves
    data[STEPS - 20, 7, COL["xid"]] = 48.0  # node-1/gpu-3: the end-of-stream marker
    return data


async def _produce(transport: Transport, topics: Topics, upto: int, start: int,
                   data: np.ndarray, pause: float) -> int:
    ts = timestamps(STEPS)
    for s in range(start, upto, 5):
        for n, node in enumerate(NODES):
            f = frame(node, "rack-1", ts[s:s + 5], data[s:s + 5, 4 * n:4 * n + 4], seq=s // 5)
            await transport.send(topics.samples, encode_frame(f), key=f.identity.rack_key)
        await asyncio.sleep(pause)
    await transport.flush()
    return upto


async def _alerts(transport: Transport, topics: Topics) -> list[AlertRecord]:
    return await read_alerts(transport, topics, rounds=6, timeout_ms=1000)


def _start(config: Path, log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", "fleetpulse", "detector", "--config", str(config)],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)


async def _wait_for(pred: object, transport: Transport, topics: Topics, timeout: float,
                    proc: subprocess.Popen[bytes], log: Path) -> list[AlertRecord]:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        alerts = await _alerts(transport, topics)
        if pred(alerts):  # type: ignore[operator]
            return alerts
        if proc.poll() is not None:
            raise AssertionError(f"detector exited {proc.returncode}:\n{log.read_text()[-3000:]}")
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out; alerts {[(a.entity, a.source, a.state.value) for a in alerts]}"
                                 f"\n{log.read_text()[-3000:]}")
        await asyncio.sleep(0.5)


def _fired(alerts: list[AlertRecord], entity_end: str, source: str) -> int:
    return sum(1 for a in alerts if a.entity.endswith(entity_end) and a.source == source
               and a.state is AlertState.FIRING)


async def test_sigkill_under_load_restores_and_does_not_reannounce(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    config = tmp_path / "detector.toml"
    config.write_text(f"""
state_dir = "{tmp_path / 'state'}"
checkpoint_interval_s = 1.0
partitions = 2
metrics_port = -1
group_id = "{unique_prefix}-detector"
[transport]
bootstrap = "{kafka_bootstrap}"
topic_prefix = "{unique_prefix}"
[model]
trees = 10
sample_size = 64
warmup = 100
[rack]
trees = 8
sample_size = 32
""")
    log = tmp_path / "detector.log"
    transport = open_transport(TransportConfig(bootstrap=kafka_bootstrap))
    await transport.start()
    topics = Topics(unique_prefix)
    await transport.ensure_topics({topics.samples: 2, topics.events: 2, topics.alerts: 2,
                                   topics.deadletter: 1})
    data = _data()
    proc = _start(config, log)
    try:
        sent = await _produce(transport, topics, 300, 0, data, pause=0.02)
        await _wait_for(lambda a: _fired(a, "node-0/gpu-2", "rule:thermal_slowdown") >= 1,
                        transport, topics, 90, proc, log)
        # Kill it while frames keep arriving (and after at least one checkpoint).
        producer = asyncio.create_task(_produce(transport, topics, 600, sent, data, pause=0.05))
        await asyncio.sleep(2.5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        sent = await producer
        proc = _start(config, log)
        sent = await _produce(transport, topics, STEPS, sent, data, pause=0.02)
        alerts = await _wait_for(lambda a: _fired(a, "node-1/gpu-3", "rule:xid") >= 1,
                                 transport, topics, 120, proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        await transport.close()

    # The second process restored the models from the checkpoint instead of relearning.
    assert "restored: 8 GPU models" in log.read_text()
    assert _fired(alerts, "node-0/gpu-1", "rule:xid") == 1
    assert _fired(alerts, "node-0/gpu-2", "rule:thermal_slowdown") == 1
    resolved = [a for a in alerts if a.entity.endswith("node-0/gpu-2")
                and a.state is AlertState.RESOLVED]
    assert len(resolved) == 1
    # No transition published twice, whatever the source.
    counts = Counter((a.id, a.state.value) for a in alerts)
    assert max(counts.values()) == 1, counts.most_common(3)


class _Watched(DetectorService):
    """Counts its rebalances: a member that left its group (stalled past the session
    timeout) is assigned its partitions again."""

    assignments = 0
    revocations = 0

    async def on_assigned(self, assigned: frozenset[tuple[str, int]]) -> None:
        self.assignments += 1
        await super().on_assigned(assigned)

    async def on_revoked(self, revoked: frozenset[tuple[str, int]]) -> None:
        self.revocations += 1
        await super().on_revoked(revoked)


async def test_a_large_backlog_never_stalls_the_loop_nor_costs_the_group(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    """512 GPUs x 5 Hz x 90 s waiting before the detector starts, checkpoints every second:
    the event loop is never held long (a watchdog measures it), the member is assigned
    once and never revoked, and everything is processed and committed."""
    nodes, gpus, ticks = 64, 8, 450
    config = small_config(
        transport=TransportConfig(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix),
        group_id=f"{unique_prefix}-detector", state_dir=tmp_path / "state", partitions=4,
        metrics_port=-1, checkpoint_interval_s=1.0, shed_after_s=0.0)
    transport = open_transport(config.transport)
    await transport.start()
    topics = Topics(unique_prefix)
    await transport.ensure_topics({topics.samples: 4, topics.events: 4, topics.alerts: 4,
                                   topics.deadletter: 1})
    data = healthy(ticks, gpus, seed=8)
    base = timestamps(ticks // 5)[0] + 200 * np.arange(ticks, dtype=np.int64)
    sent = 0
    for s in range(0, ticks, 5):
        for n in range(nodes):
            f = frame(f"node-{n}", f"rack-{n // 4}", base[s:s + 5] + n % 7,
                      data[s:s + 5], seq=s // 5)
            await transport.send(topics.samples, encode_frame(f), key=f.identity.rack_key)
            sent += 1
    await transport.flush()

    service = _Watched(config, transport)
    stop = asyncio.Event()
    worst = 0.0

    async def watchdog() -> None:
        nonlocal worst
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            t = loop.time()
            await asyncio.sleep(0.02)
            worst = max(worst, loop.time() - t - 0.02)

    task = asyncio.create_task(service.run(stop))
    dog = asyncio.create_task(watchdog())
    # Wait for every model step, not for a frame count: a producer retry on a topic whose
    # partitions just got their leaders (NotLeaderForPartition) may deliver a frame twice,
    # which the detector reads and drops as a replay (its ticks are not newer than the
    # node's last), so frames can exceed what was sent while the steps stay exact.
    steps = nodes * gpus * ticks // 5
    deadline = asyncio.get_running_loop().time() + 240
    while service.stats.model_steps < steps and not task.done():
        assert asyncio.get_running_loop().time() < deadline, service.stats.model_steps
        await asyncio.sleep(0.2)
    assignments, revocations = service.assignments, service.revocations
    stop.set()
    await task
    await dog
    await transport.close()
    assert service.stats.frames >= sent and service.stats.model_steps == steps
    assert service.stats.checkpoints >= 2
    assert (assignments, revocations) == (1, 0)
    # Kafka's session timeout is 10 s; the loop never waited a fifth of it.
    assert worst < 2.0, worst

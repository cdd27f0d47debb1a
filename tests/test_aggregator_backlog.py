"""A large backlog read in huge batches never stalls the aggregator's loop nor costs its group.

The aggregator's stages and store run on a store thread (aggregator.service), so folding a
batch of thousands of frames, a flush of millions of points or a checkpoint never holds the
event loop that sends Kafka's heartbeats (issue 16: at 10,000 GPUs x 5 Hz the aggregator was
expelled from its group in every run).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from test_detector_support import frame, healthy, timestamps

from aggregator import service as aggregator_service
from aggregator.config import AggregatorConfig
from aggregator.service import AggregatorService
from fleetpulse.config import TransportConfig
from fleetpulse.transport import open_transport
from schemas.frame import encode_frame
from schemas.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

Listener = Callable[[frozenset[tuple[str, int]]], Awaitable[None]]


def _sample(text: str, name: str, labels: str) -> float:
    """The value of ``name{labels}`` in a /metrics exposition (KeyError if absent)."""
    for line in text.splitlines():
        if line.startswith(f"{name}{{{labels}}} "):
            return float(line.rsplit(" ", 1)[1])
    raise KeyError(f"{name}{{{labels}}}")


def _counted(calls: Counter[str], name: str, fn: Listener) -> Listener:
    async def wrapped(tps: frozenset[tuple[str, int]]) -> None:
        calls[name] += 1
        await fn(tps)
    return wrapped


async def test_a_large_backlog_in_huge_batches_never_stalls_the_loop_nor_costs_the_group(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    """512 GPUs x 5 Hz x 120 s waiting before the aggregator starts, read 10,000 messages a
    poll (the whole backlog in one batch), flushed and checkpointed every 300 ms: a watchdog
    on the event loop sees no stall near the session timeout, each stage's member is assigned once
    and never revoked, and every frame is rolled up."""
    nodes, gpus, ticks = 64, 8, 600
    cfg = AggregatorConfig(
        transport=TransportConfig(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix),
        data_dir=str(tmp_path / "data"), listen="127.0.0.1:0", group_id=f"{unique_prefix}-agg",
        lateness_ms=5_000, row_lateness_ms=20_000, commit_interval_ms=300, max_batch=10_000,
        samples_partitions=4, rollups_partitions=2, fsync=True)
    producer = open_transport(cfg.transport)
    await producer.start()
    topics = Topics(unique_prefix)
    await producer.ensure_topics({topics.samples: 4, topics.rollups: 2, topics.deadletter: 1})
    data = healthy(ticks, gpus, seed=3)
    base = timestamps(ticks // 5)[0] + 200 * np.arange(ticks, dtype=np.int64)
    sent = 0
    for s in range(0, ticks, 5):
        for n in range(nodes):
            f = frame(f"node-{n}", f"rack-{n // 4}", base[s:s + 5] + n % 7,
                      data[s:s + 5] + n, seq=s // 5, row=f"row-{n // 32}")
            await producer.send(topics.samples, encode_frame(f), key=f.identity.rack_key)
            sent += 1
    await producer.flush()
    await producer.close()

    svc = AggregatorService(cfg)
    calls: Counter[str] = Counter()
    for lp in svc.loops:
        name = lp.name
        lp.on_assigned = _counted(calls, f"{name} assigned", lp.on_assigned)  # type: ignore[method-assign]
        lp.on_revoked = _counted(calls, f"{name} revoked", lp.on_revoked)  # type: ignore[method-assign]
    await svc.start(serve_http=False)  # compiles (or loads) every kernel before joining
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    worst = 0.0

    async def watchdog() -> None:
        nonlocal worst
        while not done.is_set():
            t = loop.time()
            await asyncio.sleep(0.02)
            worst = max(worst, loop.time() - t - 0.02)

    dog = asyncio.create_task(watchdog())
    task = asyncio.create_task(svc.run())
    deadline = loop.time() + 240
    # Facts, not sleeps: every frame folded in, and windows closed by both stages.
    while (svc.rack.stats.frames < sent
           or svc.row.windows_closed == 0) and not task.done():
        assert loop.time() < deadline, (svc.rack.stats.frames, sent)
        await asyncio.sleep(0.1)
    seen = dict(calls)
    svc.gauges = await svc.in_store(svc._read_gauges)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(aggregator_service._Collector(svc))
    exposed = generate_latest(registry).decode()
    svc.stop()
    await task
    done.set()
    await dog
    # Each stage's cycles and how long they held the store thread are on /metrics.
    for name in ("rack", "row"):
        assert _sample(exposed, "fleetpulse_aggregator_durability_cycles_total",
                       f'stage="{name}"') >= 1, exposed
        assert _sample(exposed, "fleetpulse_aggregator_durability_seconds_total",
                       f'stage="{name}",step="flush"') > 0
    assert _sample(exposed, "fleetpulse_aggregator_durability_seconds_total",
                   'stage="rack",step="checkpoint"') > 0
    assert not svc.failed
    assert svc.rack.stats.frames == sent and svc.rack.stats.decode_errors == 0
    assert svc.rack.stats.windows_closed > 0 and svc.row.windows_closed > 0
    assert seen == {"rack assigned": 1, "row assigned": 1, "workloads assigned": 1,
                    "workload-alerts assigned": 1}, seen
    # Kafka's session timeout is 10 s; the loop never waited a fifth of it (it waited 8.4 s
    # with the stages on the loop; ~0.6 s here on a 2-core machine loaded 3x over).
    assert worst < 2.0, worst


async def test_the_lag_gauge_follows_the_read_position_between_durability_cycles(
    kafka_bootstrap: str, unique_prefix: str, tmp_path: Path
) -> None:
    """With a durability cycle 10 minutes away, frames the rack stage has not folded in show
    on its lag gauge within a few refreshes (``LAG_REFRESH_S``), not at the next commit: the
    gauge is how an operator sees the aggregator fall behind."""
    nodes, gpus = 8, 8
    cfg = AggregatorConfig(
        transport=TransportConfig(bootstrap=kafka_bootstrap, topic_prefix=unique_prefix),
        data_dir=str(tmp_path / "data"), listen="127.0.0.1:0", group_id=f"{unique_prefix}-agg",
        commit_interval_ms=600_000, samples_partitions=2, rollups_partitions=1)
    producer = open_transport(cfg.transport)
    await producer.start()
    topics = Topics(unique_prefix)
    await producer.ensure_topics({topics.samples: 2, topics.rollups: 1, topics.deadletter: 1})
    data = healthy(20, gpus, seed=5)
    base = timestamps(4)[0] + 200 * np.arange(20, dtype=np.int64)

    async def send(steps: range) -> int:
        for s in steps:
            for n in range(nodes):
                f = frame(f"node-{n}", f"rack-{n // 2}", base[5 * s:5 * s + 5],
                          data[5 * s:5 * s + 5] + n, seq=s, row="row-0")
                await producer.send(topics.samples, encode_frame(f), key=f.identity.rack_key)
        await producer.flush()
        return len(steps) * nodes

    svc = AggregatorService(cfg)
    await svc.start(serve_http=False)
    task = asyncio.create_task(svc.run())
    rack = next(lp for lp in svc.loops if lp.name == "rack")
    loop = asyncio.get_running_loop()
    try:
        first = await send(range(2))
        deadline = loop.time() + 60
        while svc.rack.stats.frames < first:  # every partition has a read position
            assert loop.time() < deadline and not task.done(), svc.rack.stats.frames
            await asyncio.sleep(0.1)
        folded = svc.rack.stats.frames
        # From here the rack stage folds nothing in: its read position stays where it is
        # while the consumer goes on fetching.
        real_handle = svc.handle

        async def handle(lp: object, msgs: list[object]) -> None:
            if lp is not rack:
                await real_handle(lp, msgs)  # type: ignore[arg-type]
        svc.handle = handle  # type: ignore[method-assign, assignment]
        behind = await send(range(2, 4))
        deadline = loop.time() + 5 * aggregator_service.LAG_REFRESH_S
        while rack.lag != behind:
            assert loop.time() < deadline, (rack.lag, behind)
            await asyncio.sleep(0.1)
        assert svc.rack.stats.frames == folded
    finally:
        svc.stop()
        await task
        await producer.close()
    assert not svc.failed

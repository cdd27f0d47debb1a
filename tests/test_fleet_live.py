"""LiveFleet on the embedded memory broker: staggered frames, every tick exactly once."""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict

import numpy as np

from agent.fleet import METRICS, FleetModel, Topology, generate
from agent.fleet.live import LiveFleet
from fleetpulse.config import TransportConfig
from fleetpulse.transport import open_transport
from schemas.frame import decode_frame
from schemas.topics import Topics


async def _run_and_read(gpus: int, per: int, ticks: int, seed: int = 4):
    cfg = TransportConfig(bootstrap=f"memory://{uuid.uuid4().hex}")
    topics = Topics()
    transport = open_transport(cfg)
    await transport.start()
    try:
        await transport.ensure_topics({topics.samples: 3, topics.events: 3})
        model = FleetModel(Topology(gpus), hz=1.0, seed=seed)
        fleet = LiveFleet(model, transport, topics, ticks_per_frame=per, realtime=False,
                          total_ticks=ticks)
        consumer = transport.consumer([topics.samples], "check")
        await fleet.run(asyncio.Event())
        frames = []
        while batch := await consumer.getmany(timeout_ms=200, max_records=10_000):
            frames.extend(decode_frame(m.value) for m in batch)
    finally:
        await transport.close()
    return fleet, frames


async def test_every_node_gets_every_tick_once_in_order():
    fleet, frames = await _run_and_read(gpus=16, per=3, ticks=10)
    summary = fleet.summary()
    assert summary["ticks"] == 10 and summary["frames"] == len(frames)
    assert summary["metrics"] == 16 * 10 * len(METRICS) == sum(f.n_values for f in frames)
    by_agent = defaultdict(list)
    for f in frames:
        by_agent[f.agent].append(f)
    assert len(by_agent) == 2
    bulk = generate(16, 1.0, 10, seed=4)
    for agent_frames in by_agent.values():
        agent_frames.sort(key=lambda f: f.seq)
        assert [f.seq for f in agent_frames] == list(range(len(agent_frames)))
        ts = np.concatenate([f.ts for f in agent_frames])
        assert ts.size == 10 and np.all(np.diff(ts) > 0)
        values = np.concatenate([f.values for f in agent_frames])  # (T, gpn, M)
        node = int(agent_frames[0].identity.node.rsplit("-", 1)[-1])
        rows = slice(node * 8, node * 8 + 8)
        # The live path publishes exactly what the model generates (bulk = same seed).
        assert np.array_equal(values.transpose(1, 0, 2), bulk.values[rows], equal_nan=True)
    # Staggered: the two nodes close their first frames on different ticks.
    assert sorted(min(by_agent[a], key=lambda f: f.seq).shape[0] for a in by_agent) == [1, 2]


async def test_one_tick_per_frame_and_more_ticks_than_nodes():
    _, frames = await _run_and_read(gpus=8, per=1, ticks=4)
    assert [f.shape[0] for f in frames] == [1, 1, 1, 1]
    _, frames = await _run_and_read(gpus=8, per=7, ticks=4)
    assert sum(f.shape[0] for f in frames) == 4

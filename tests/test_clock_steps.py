"""A wall clock that steps on an agent, and agents whose clocks are far off.

The agent's wall clock is injected (``TickClock(wall_ns=...)``), never the system's: the
sampler must keep its rate on the monotonic clock, log and count the step and stamp the
following ticks with the new time; no frame may hold stamps from both sides. The
aggregator must count samples from the future (beyond ``max_future_ms`` of its own clock)
and from the far past (late) instead of opening absurd windows that make honest samples late.
"""

from __future__ import annotations

import asyncio
import logging
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from test_aggregator_support import METRICS, T0

from agent.metrics import AgentCollector
from agent.publisher import AgentSequence
from agent.sampler import FrameBuilder, Sampler, TickClock
from agent.sources.base import SourceContext, open_source
from aggregator.rack_stage import RackStage
from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig
from fleetpulse.transport import Message
from schemas.frame import SampleFrame, encode_frame
from schemas.identity import NodeIdentity

IDENT = NodeIdentity("c1", "row-a", "rack-03", "node-17")
INTERVAL_S = 0.05
MINUTES = 60_000


class SteppableWall:
    """The system's wall clock plus an offset the test moves (as ``date -s`` would)."""

    def __init__(self) -> None:
        self.offset_ns = 0

    def __call__(self) -> int:
        return time.time_ns() + self.offset_ns


async def _run_until(sampler: Sampler, ticks: int) -> None:
    while sampler.stats.ticks < ticks:
        await asyncio.sleep(INTERVAL_S / 4)


async def test_agent_follows_a_stepped_wall_clock_on_the_monotonic_schedule(
        caplog: pytest.LogCaptureFixture) -> None:
    wall = SteppableWall()
    clock = TickClock(INTERVAL_S, late_after_s=0.04, wall_ns=wall)
    source = open_source("synthetic", SourceContext(IDENT, INTERVAL_S, {"gpus": 2}))
    frames: list[SampleFrame] = []
    sampler = Sampler(source, clock, FrameBuilder(IDENT, AgentSequence("a1"), 8),
                      frames.append, lambda ev: None)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AgentCollector(sampler.stats, source, {}))
    stop = asyncio.Event()
    dues: list[float] = []
    real_wait = clock.wait

    async def recording_wait(stop_event: asyncio.Event | None = None):  # type: ignore[no-untyped-def]
        tick = await real_wait(stop_event)
        if tick is not None:
            dues.append(tick.due)
        return tick

    clock.wait = recording_wait  # type: ignore[method-assign]
    caplog.set_level(logging.WARNING, logger="agent.sampler")
    task = asyncio.create_task(sampler.run(stop))
    await _run_until(sampler, 20)
    wall.offset_ns += 5 * MINUTES * 1_000_000  # forward 5 minutes
    await _run_until(sampler, 40)
    wall.offset_ns -= 12 * MINUTES * 1_000_000  # back 12 minutes (7 before the start)
    await _run_until(sampler, 60)
    stop.set()
    await task
    await source.close()

    # the schedule never moved: ticks stay one interval apart on the monotonic clock
    gaps = np.diff(dues)
    assert np.allclose(gaps[gaps < 1.5 * INTERVAL_S], INTERVAL_S, atol=1e-6)
    assert (gaps >= INTERVAL_S - 1e-6).all()
    # both steps counted, logged and on /metrics
    assert sampler.stats.clock_steps == {"forward": 1, "backward": 1}
    assert clock.steps == {"forward": 1, "backward": 1}
    logged = [r.getMessage() for r in caplog.records if "wall clock stepped" in r.getMessage()]
    assert len(logged) == 2 and "forward by 300" in logged[0] and "backward by -720" in logged[1]
    text = generate_latest(registry).decode()
    assert 'fleetpulse_agent_clock_steps_total{direction="forward"} 1.0' in text
    assert 'fleetpulse_agent_clock_steps_total{direction="backward"} 1.0' in text
    # every sampled tick is in exactly one frame; no frame spans a step
    ts = np.concatenate([f.ts for f in frames])
    assert ts.size == sampler.stats.ticks
    for f in frames:
        assert ((np.diff(f.ts) > 0) & (np.diff(f.ts) < 10_000)).all(), f.ts
    # stamps are on the interval grid and follow the wall clock: +5 min, then -12 min
    assert (ts % round(INTERVAL_S * 1000) == 0).mean() > 0.8
    jumps = np.diff(ts)
    big = jumps[np.abs(jumps) > 60_000]
    assert big.size == 2
    assert abs(big[0] - 5 * MINUTES) < 2_000 and abs(big[1] + 12 * MINUTES) < 2_000
    now = wall() // 1_000_000
    assert abs(int(ts[-1]) - now) < 2_000, "the last stamp agrees with the (stepped) clock"
    # frame sequence numbers stay consecutive: the aggregator's (agent, seq) dedup is intact
    assert [f.seq for f in frames] == list(range(frames[0].seq, frames[0].seq + len(frames)))


def _frame(node: str, seq: int, ts: np.ndarray, rng: np.random.Generator) -> bytes:
    ident = NodeIdentity("c1", "row0", "rack00", node)
    values = rng.uniform(30, 90, (ts.size, 2, len(METRICS)))
    return encode_frame(SampleFrame(ident, f"agent-{node}", seq, METRICS,
                                    np.arange(2, dtype=np.int32),
                                    tuple(f"GPU-{node}-{g}" for g in range(2)),
                                    ts.astype(np.int64), values))


def _messages(clock_off_ms: int, seconds: int = 60) -> list[Message]:
    """Two honest nodes and one whose clock is ``clock_off_ms`` off, 1 Hz, one partition;
    the odd node's frame of each second comes first."""
    rng = np.random.default_rng(7)
    msgs: list[Message] = []
    for s in range(seconds):
        t = np.asarray([T0 + s * 1000])
        for node, off in (("odd", clock_off_ms), ("honest-a", 0), ("honest-b", 0)):
            data = _frame(node, s, t + off, rng)
            msgs.append(Message("t.samples", 0, len(msgs), b"rack00", data, int(t[0])))
    return msgs


def _stage(tmp_path, name: str, max_future_ms: int):  # type: ignore[no-untyped-def]
    store = SeriesStore(StoreConfig(path=str(tmp_path / name), fsync=False))
    index = EntityIndex(tmp_path / f"{name}.jsonl")
    # the aggregator's clock: the honest agents' time (their data is "now")
    stage = RackStage(store, index, topic="t.samples", lateness_ms=5000,
                      max_future_ms=max_future_ms, wall_ms=lambda: T0 + 60_000)
    return stage, store, index


@pytest.mark.parametrize("off_ms", [365 * 86_400_000, 30 * MINUTES])
def test_aggregator_counts_samples_from_the_future_instead_of_opening_their_windows(
        tmp_path, off_ms: int, caplog: pytest.LogCaptureFixture) -> None:
    msgs = _messages(off_ms)
    honest_values = 2 * 60 * 2 * len(METRICS)
    odd_values = 60 * 2 * len(METRICS)
    # without the guard the odd agent drags the watermark ahead: honest samples are late
    stage, store, index = _stage(tmp_path, "unguarded", 0)
    stage.process(msgs)
    assert stage.stats.late_samples >= honest_values * 0.9
    index.close()
    store.close()
    # with it: the odd agent's samples are counted as from the future, logged once,
    # the honest ones are all rolled up and no window opened ahead
    caplog.set_level(logging.WARNING, logger="fleetpulse.aggregator")
    stage, store, index = _stage(tmp_path, "guarded", 10 * MINUTES)
    stage.process(msgs)
    assert stage.stats.future_samples == odd_values
    assert stage.stats.late_samples == 0
    assert stage.parts[0].watermark == T0 + 59_000
    assert max(stage.parts[0].open, default=T0) <= T0 + 60_000
    assert stage.stats.frames == 120  # the odd agent's frames had nothing left to fold
    warned = [r for r in caplog.records if "ahead of this aggregator's clock" in r.getMessage()]
    assert len(warned) == 1 and "agent-odd" in warned[0].getMessage()
    index.close()
    store.close()


def test_aggregator_counts_samples_from_the_far_past_as_late(tmp_path) -> None:
    """An agent whose clock stepped an hour back: its samples are late (counted), they
    open no window an hour back and the honest ones are unaffected."""
    msgs = _messages(-60 * MINUTES)
    stage, store, index = _stage(tmp_path, "past", 10 * MINUTES)
    # the first second's odd frame has no watermark yet to be late against: skip it, as
    # an established partition would have
    stage.process(msgs[1:])
    odd_values = 59 * 2 * len(METRICS)
    assert stage.stats.late_samples == odd_values
    assert stage.stats.future_samples == 0
    assert min(stage.parts[0].open, default=T0) >= T0
    index.close()
    store.close()

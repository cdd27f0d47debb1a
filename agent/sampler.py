"""Fixed-rate sampling and frame building: the agent's clock.

**The clock** (:class:`TickClock`). Tick *k* is due at ``mono0 + k * interval`` on the
monotonic clock, computed from ``k`` each time, never by adding intervals up, so an hour of
ticks does not drift by the accumulated sleep overshoot (it is still due at exactly
``mono0 + 3600 s``). Ticks are aligned to multiples of the interval in wall time (every node
samples on the same second), and tick *k* carries the timestamp ``wall0 + k * interval``.

**Wall-clock steps.** The schedule never reads the wall clock after the start, so a step
(NTP correcting a bad boot clock, an operator's ``date -s``) cannot bunch or stall ticks.
Each tick compares the wall clock with the schedule's idea of it; a difference beyond
``step_after_s`` is a **step**: logged, counted (per direction) and followed -- the
schedule is re-anchored by whole intervals, so stamps keep the fleet-wide alignment and
agree with the corrected clock from the next tick on. The frame being built is closed
first, so no frame holds stamps from both sides of a step (after a backward step stamps
repeat an earlier span; downstream those samples are late and counted as such).

A tick that starts later than ``late_after_s`` after its due time (the host was busy, the
source blocked) is **late**: it is sampled at once, stamped with the real time it was read,
and counted. The ticks whose due time passed meanwhile (and a slot less than half an
interval after the late tick) are **missed** (counted) rather than fired back to back:
ticks are never bunched, because a burst of samples a few ms apart tells nothing and skews
rate computations downstream.

**Frames** (:class:`FrameBuilder`). Ticks are batched into frames of ``ticks_per_frame``
ticks (DESIGN.md: one message = one node x a few ticks). A frame has one layout (GPUs and
metrics); when the source's layout changes, the frame so far is closed and a new one
starts. Each frame takes the next sequence number of the agent incarnation.

The hot path is columnar: one ``(G, M)`` row copy per tick into a preallocated
``(T, G, M)`` buffer.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from agent.publisher import AgentSequence
from agent.sources.base import Gathered, Source, SourceError, SourceEvent
from schemas.frame import SampleFrame
from schemas.identity import NodeIdentity

__all__ = [
    "LATENCY_BUCKETS_S",
    "FrameBuilder",
    "Sampler",
    "SamplerStats",
    "Tick",
    "TickClock",
]

log = logging.getLogger(__name__)

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Histogram buckets for sampling latency (tick due -> values read)."""


@dataclass(frozen=True, slots=True)
class Tick:
    """One firing of the clock."""

    index: int
    ts_ms: int
    """Scheduled wall time, or the real time for a late tick."""
    due: float
    """Monotonic time the tick was due."""
    lateness_s: float
    late: bool
    missed: int
    """Ticks skipped just before this one because their time had passed."""
    stepped_ms: int = 0
    """The wall clock stepped by this much (ms, re-anchored) just before this tick."""


class TickClock:
    """Drift-free fixed-rate ticks on the monotonic clock (see the module docstring)."""

    def __init__(self, interval_s: float, late_after_s: float | None = None, *,
                 align: bool = True, wall_ns: Callable[[], int] = time.time_ns,
                 step_after_s: float = 1.0) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be > 0")
        self.interval_ms = max(1, round(interval_s * 1000))
        self.interval_s = self.interval_ms / 1000
        self.late_after_s = self.interval_s / 10 if late_after_s is None else late_after_s
        self.wall_ns = wall_ns
        """The wall clock (injectable: tests step it without touching the system's)."""
        self.step_after_ms = max(step_after_s * 1000, self.interval_ms)
        self.steps: dict[str, int] = {"forward": 0, "backward": 0}
        now_wall_ms = wall_ns() / 1e6
        now_mono = time.monotonic()
        first_ms = (math.floor(now_wall_ms / self.interval_ms) + 1) * self.interval_ms \
            if align else math.ceil(now_wall_ms)
        self.wall0_ms = int(first_ms)
        self.mono0 = now_mono + (first_ms - now_wall_ms) / 1000
        self.next_index = 0
        self._last_ts = -1

    def due(self, index: int) -> float:
        """Monotonic due time of tick ``index`` (pure arithmetic: no drift)."""
        return self.mono0 + index * self.interval_ms / 1000

    def scheduled_ts_ms(self, index: int) -> int:
        return self.wall0_ms + index * self.interval_ms

    async def wait(self, stop: asyncio.Event | None = None) -> Tick | None:
        """Sleep until the next tick is due; None if ``stop`` was set meanwhile."""
        index = self.next_index
        due = self.due(index)
        delay = due - time.monotonic()
        if delay > 0:
            if stop is None:
                await asyncio.sleep(delay)
            else:
                try:
                    async with asyncio.timeout(delay):
                        await stop.wait()
                    return None
                except TimeoutError:
                    pass
        if stop is not None and stop.is_set():
            return None
        now = time.monotonic()
        stepped = self._follow_step(now)
        lateness = now - due
        late = lateness > self.late_after_s
        if late:
            ts = self.wall0_ms + round((now - self.mono0) * 1000)
        else:
            ts = self.scheduled_ts_ms(index)
        if stepped >= 0:  # after a backward step stamps go back once, with the clock
            ts = max(ts, self._last_ts + 1)
        self._last_ts = ts
        # The next slot is the first one at least half an interval after now: a late tick
        # is followed by a normal gap, not by the slot that happens to come a few ms later.
        nxt = math.ceil(((now - self.mono0) * 1000 + self.interval_ms / 2) / self.interval_ms)
        self.next_index = max(index + 1, nxt)
        return Tick(index, ts, due, lateness, late, self.next_index - index - 1, stepped)

    def _follow_step(self, now_mono: float) -> int:
        """Re-anchor the stamps if the wall clock stepped; the shift in ms (0: no step)."""
        expected_ms = self.wall0_ms + (now_mono - self.mono0) * 1000
        offset = self.wall_ns() / 1e6 - expected_ms
        if abs(offset) <= self.step_after_ms:
            return 0
        shift = round(offset / self.interval_ms) * self.interval_ms
        self.wall0_ms += shift
        direction = "forward" if shift > 0 else "backward"
        self.steps[direction] += 1
        log.warning("wall clock stepped %s by %.3f s; sampling stays on the monotonic "
                    "clock, stamps follow the new wall time (%d %s steps so far)",
                    direction, offset / 1000, self.steps[direction], direction)
        return shift


@dataclass(slots=True)
class SamplerStats:
    """Counters read by /metrics at scrape time."""

    ticks: int = 0
    late_ticks: int = 0
    missed_ticks: int = 0
    source_errors: int = 0
    clock_steps: dict[str, int] = field(default_factory=lambda: {"forward": 0, "backward": 0})
    """Wall-clock steps seen by the clock, per direction."""
    frames: int = 0
    events: int = 0
    latency_sum_s: float = 0.0
    latency_counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))
    """Non-cumulative counts per bucket of LATENCY_BUCKETS_S, last one is +Inf."""

    def observe_latency(self, seconds: float) -> None:
        self.latency_sum_s += seconds
        self.latency_counts[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1


class FrameBuilder:
    """Batches ticks of one layout into frames (see the module docstring)."""

    def __init__(self, identity: NodeIdentity, sequence: AgentSequence,
                 ticks_per_frame: int) -> None:
        if ticks_per_frame < 1:
            raise ValueError("ticks_per_frame must be >= 1")
        self.identity = identity
        self.sequence = sequence
        self.ticks_per_frame = ticks_per_frame
        self._layout: tuple[npt.NDArray[np.uint16], tuple[str, ...],
                            npt.NDArray[np.int32], tuple[str, ...]] | None = None
        self._ts = np.empty(ticks_per_frame, dtype=np.int64)
        self._buf = np.empty((ticks_per_frame, 0, 0))
        self._n = 0

    def _same_layout(self, g: Gathered) -> bool:
        lay = self._layout
        if lay is None:
            return False
        ids, extra, gpus, uuids = lay
        return ((g.metric_ids is ids or np.array_equal(g.metric_ids, ids))
                and (g.extra is extra or g.extra == extra)
                and (g.gpus is gpus or np.array_equal(g.gpus, gpus))
                and (g.uuids is uuids or g.uuids == uuids))

    def add(self, ts_ms: int, g: Gathered) -> list[SampleFrame]:
        """Add one tick; returns the frames this completed (0, 1 or 2)."""
        out: list[SampleFrame] = []
        if not self._same_layout(g):
            done = self.flush()
            if done is not None:
                out.append(done)
            self._layout = (g.metric_ids, g.extra, g.gpus, g.uuids)
            self._buf = np.empty((self.ticks_per_frame, *g.values.shape))
        if self._n and ts_ms <= int(self._ts[self._n - 1]):
            return out  # a clock that went backwards cannot happen with TickClock; be safe
        self._ts[self._n] = ts_ms
        self._buf[self._n] = g.values
        self._n += 1
        if self._n == self.ticks_per_frame:
            done = self.flush()
            if done is not None:
                out.append(done)
        return out

    def flush(self) -> SampleFrame | None:
        """Close the frame being built (if it has any tick)."""
        if self._n == 0 or self._layout is None:
            return None
        ids, extra, gpus, uuids = self._layout
        n, self._n = self._n, 0
        return SampleFrame(
            identity=self.identity,
            agent=self.sequence.agent,
            seq=self.sequence.next(),
            metric_ids=ids,
            gpus=gpus,
            uuids=uuids,
            ts=self._ts[:n].copy(),
            values=self._buf[:n].copy(),
            extra=extra,
        )


class Sampler:
    """Clock -> source -> frames/events. Runs in one asyncio task."""

    def __init__(
        self,
        source: Source,
        clock: TickClock,
        builder: FrameBuilder,
        on_frame: Callable[[SampleFrame], None],
        on_event: Callable[[SourceEvent], None],
    ) -> None:
        self.source = source
        self.clock = clock
        self.builder = builder
        self.on_frame = on_frame
        self.on_event = on_event
        self.stats = SamplerStats()
        self.last: Gathered | None = None
        """The last tick read: which GPUs the source reports (attribution maps onto them)."""
        self._last_error_log = -math.inf

    async def sample(self, tick: Tick) -> Gathered | None:
        """Read one tick from the source; None (counted, logged) if it failed."""
        st = self.stats
        st.ticks += 1
        st.missed_ticks += tick.missed
        if tick.late:
            st.late_ticks += 1
        if tick.stepped_ms:
            st.clock_steps["forward" if tick.stepped_ms > 0 else "backward"] += 1
        try:
            g = await self.source.gather(tick.ts_ms)
        except SourceError as exc:
            self._error(exc, exc_info=False)
            return None
        except Exception as exc:  # a bug in a source must not stop the agent; it is loud
            self._error(exc, exc_info=True)
            return None
        st.observe_latency(max(time.monotonic() - tick.due, 0.0))
        self.last = g
        for ev in g.events:
            st.events += 1
            self.on_event(ev)
        return g

    def _error(self, exc: BaseException, *, exc_info: bool) -> None:
        self.stats.source_errors += 1
        now = time.monotonic()
        if now - self._last_error_log >= 60:
            self._last_error_log = now
            log.error("source %s failed this tick (%d errors so far): %s", self.source.name,
                      self.stats.source_errors, exc, exc_info=exc_info)

    async def run(self, stop: asyncio.Event) -> None:
        """Tick until ``stop`` is set, then close the partial frame."""
        while not stop.is_set():
            tick = await self.clock.wait(stop)
            if tick is None:
                break
            g = await self.sample(tick)
            if g is None:
                continue
            if tick.stepped_ms:  # no frame spans a clock step
                last = self.builder.flush()
                if last is not None:
                    self.stats.frames += 1
                    self.on_frame(last)
            for frame in self.builder.add(tick.ts_ms, g):
                self.stats.frames += 1
                self.on_frame(frame)
        last = self.builder.flush()
        if last is not None:
            self.stats.frames += 1
            self.on_frame(last)

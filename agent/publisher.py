"""Publishing frames in order, pipelined, with a disk spool when the broker cannot take them.

One :class:`Publisher` serves one topic over one :class:`~fleetpulse.transport.base.Transport`.
It is shared: the agent publishes its node's frames through it, and the synthetic fleet
publishes thousands of frames a second for many logical agents through one instance. So
sends are *pipelined*: ``publish`` queues a record with the transport and returns; a
single ack task awaits the broker's acknowledgements oldest first, with at most
``max_in_flight`` records outstanding (``publish`` waits for room, which is the
backpressure a load generator needs).

Two modes:

* **direct** - records go to the transport. If a send raises a retriable
  :class:`TransportError`, or an acknowledgement fails or does not come within
  ``ack_timeout_s`` (a slow broker is treated like a down one), the publisher switches to
* **spooling** - every record still waiting for its ack that fails, and every new record,
  is appended to the :class:`~agent.spool.Spool` *in publish order* (a new record queues
  behind the outstanding ones, so the spool's order is the publish order). A replay task
  sends the spool's records oldest first, pipelined in batches, acknowledges them in the
  spool, and backs off exponentially while the broker keeps failing. When the spool is
  empty and nothing is outstanding the publisher is direct again.

A publisher opened over a non-empty spool (a restart after an outage or ``kill -9``) starts
in spooling mode, so the old records reach the broker before any new one.

Delivery is at-least-once: a record whose ack was lost (timeout) may have reached the
broker and is sent again from the spool; consumers de-duplicate by the frame's
(agent, seq). Records that a live send overtook while an earlier one failed can arrive out
of order only if the broker recovers between the two (a window of one request); the
(agent, seq) pair lets the consumer see that, too. Non-retriable errors (a record the
broker will never take) are counted in ``rejected_frames`` and logged, not retried forever.

What ``kill -9`` can lose: frames sent but not yet acknowledged (the broker's ack latency
worth, unless the broker already has them) and, in the agent, the partial frame being built.
Everything in the spool survives; writing every frame to disk before sending it (a WAL)
would close that window at the cost of a disk write per frame, which the agent does not pay.

Sequence numbers belong to the *frame* (see :mod:`schemas.frame`), not to the publisher:
:class:`AgentSequence` hands them out per agent incarnation, and the fleet keeps one per
logical agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import time
from collections import deque
from dataclasses import dataclass
from enum import StrEnum

from agent.spool import Spool, SpoolRecord
from fleetpulse.transport.base import RecordMeta, Transport, TransportError
from schemas.frame import SampleFrame, encode_frame
from schemas.identity import check_name

__all__ = ["AgentSequence", "Mode", "Publisher", "PublisherStats", "new_agent_id"]

log = logging.getLogger(__name__)


def new_agent_id(node: str) -> str:
    """A fresh incarnation id for ``node``: the node name, start time and a random tag.

    A new id at every start means a restarted agent's sequence can begin at 0 again without
    colliding with the frames its previous incarnation left in the spool.
    """
    tag = f"{time.time_ns() // 1_000_000:x}-{secrets.token_hex(3)}"
    head = node[: 127 - len(tag) - 1]
    return check_name("agent", f"{head}.{tag}")


class AgentSequence:
    """The (agent, seq) de-duplication key source for one agent incarnation."""

    __slots__ = ("_counter", "agent")

    def __init__(self, agent: str, start: int = 0) -> None:
        self.agent = check_name("agent", agent)
        self._counter = itertools.count(start)

    def next(self) -> int:
        """The next sequence number (0, 1, 2, ... without gaps)."""
        return next(self._counter)


class Mode(StrEnum):
    DIRECT = "direct"
    SPOOLING = "spooling"


@dataclass(slots=True)
class PublisherStats:
    """Counters read by /metrics at scrape time (plain ints on the hot path, no locks)."""

    frames_sent: int = 0
    """Records the broker acknowledged (direct and replayed)."""
    bytes_sent: int = 0
    frames_replayed: int = 0
    """Of ``frames_sent``, those that came from the spool."""
    frames_spooled: int = 0
    send_failures: int = 0
    """Retriable failures (each switches to or keeps spooling mode)."""
    ack_timeouts: int = 0
    rejected_frames: int = 0
    """Non-retriable failures: dropped, logged."""
    lost_frames: int = 0
    """Records that failed with no spool configured (load generators), or that the spool
    could not write (disk full)."""
    in_flight: int = 0


@dataclass(slots=True)
class _Entry:
    key: bytes | None
    value: bytes
    fut: asyncio.Future[RecordMeta] | None
    """None: the record was never handed to the transport and goes to the spool."""
    deadline: float


class Publisher:
    """Ordered, pipelined, spool-backed publishing to one topic. See the module docstring."""

    def __init__(
        self,
        transport: Transport,
        topic: str,
        spool: Spool | None,
        *,
        max_in_flight: int = 512,
        ack_timeout_s: float = 15.0,
        retry_initial_s: float = 0.5,
        retry_max_s: float = 10.0,
        replay_batch: int = 128,
    ) -> None:
        if max_in_flight < 1 or ack_timeout_s <= 0 or replay_batch < 1:
            raise ValueError("max_in_flight, ack_timeout_s and replay_batch must be positive")
        self.transport = transport
        self.topic = topic
        self.spool = spool
        self.max_in_flight = max_in_flight
        self.ack_timeout_s = ack_timeout_s
        self.retry_initial_s = retry_initial_s
        self.retry_max_s = retry_max_s
        self.replay_batch = replay_batch
        self.stats = PublisherStats()
        self.mode = Mode.DIRECT
        self._queue: deque[_Entry] = deque()
        self._room = asyncio.Semaphore(max_in_flight)
        self._wake_ack = asyncio.Event()
        self._wake_replay = asyncio.Event()
        self._ack_task: asyncio.Task[None] | None = None
        self._replay_task: asyncio.Task[None] | None = None
        self._closing = False

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        """Start the ack task; replay a non-empty spool before anything new."""
        if self.spool is not None and self.spool.pending_frames:
            log.info("spool holds %d frames from before; replaying them first",
                     self.spool.pending_frames)
            self.mode = Mode.SPOOLING
        self._ack_task = asyncio.create_task(self._ack_loop(), name="publisher-acks")
        self._replay_task = asyncio.create_task(self._replay_loop(), name="publisher-replay")

    async def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until nothing is outstanding and the spool is drained; True if so in time."""
        deadline = time.monotonic() + timeout_s
        while not (not self._queue and self.mode is Mode.DIRECT):
            if time.monotonic() >= deadline:
                return False
            self._wake_replay.set()
            await asyncio.sleep(0.01)
        return True

    async def close(self, timeout_s: float = 10.0) -> None:
        """Wait up to ``timeout_s`` for outstanding acks, spool the rest, stop.

        This is the SIGTERM path: nothing the publisher holds is dropped; what the broker
        did not acknowledge in time is in the spool for the next start. A spool backlog is
        not waited for (it is already on disk; the next start replays it first), so a stop
        during an outage is quick.
        """
        if self._closing:
            return
        deadline = time.monotonic() + timeout_s
        try:
            while self._queue and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            self._closing = True
            for task in (self._replay_task, self._ack_task):
                if task is not None:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
            while self._queue:  # outstanding at the deadline: keep them for next time
                entry = self._queue.popleft()
                if entry.fut is not None and entry.fut.done() and not entry.fut.cancelled() \
                        and entry.fut.exception() is None:
                    self._count_sent(entry)
                else:
                    self._to_spool(entry)
            self.stats.in_flight = 0
            if self.spool is not None:
                self.spool.commit()
                self.spool.close()

    # ------------------------------------------------------------------ publishing

    async def publish_frame(self, frame: SampleFrame) -> None:
        """Encode ``frame`` and publish it keyed by its rack (DESIGN.md: samples topic)."""
        await self.publish(encode_frame(frame), frame.identity.rack_key)

    async def publish(self, value: bytes, key: bytes | None) -> None:
        """Queue one record in order; returns once the transport (or spool) has it.

        Waits only when ``max_in_flight`` records are outstanding.
        """
        if self._closing:
            raise RuntimeError("publisher is closed")
        if self.mode is Mode.SPOOLING and not self._queue:
            self._to_spool(_Entry(key, value, None, 0.0))
            self._wake_replay.set()
            return
        await self._room.acquire()
        fut: asyncio.Future[RecordMeta] | None = None
        if self.mode is Mode.DIRECT:
            try:
                async with asyncio.timeout(self.ack_timeout_s):
                    fut = await self.transport.send(self.topic, value, key=key)
            except TimeoutError:
                self._fail("send timed out")
            except TransportError as exc:
                if not exc.retriable:
                    self._room.release()
                    self._reject(exc)
                    return
                self._fail(str(exc))
            except Exception as exc:  # a transport bug must not lose the frame: spool it
                log.exception("transport.send raised %s; treating it as retriable", exc)
                self._fail(repr(exc))
        self._queue.append(_Entry(key, value, fut, time.monotonic() + self.ack_timeout_s))
        self.stats.in_flight = len(self._queue)
        self._wake_ack.set()

    def _fail(self, why: str) -> None:
        self.stats.send_failures += 1
        if self.mode is Mode.DIRECT:
            log.warning("broker did not take a frame (%s): spooling to disk until it does", why)
            self.mode = Mode.SPOOLING
        self._wake_replay.set()

    def _reject(self, exc: BaseException) -> None:
        self.stats.rejected_frames += 1
        log.error("broker rejected a frame for good (%s); it is dropped", exc)

    def _count_sent(self, entry: _Entry) -> None:
        self.stats.frames_sent += 1
        self.stats.bytes_sent += len(entry.value)

    def _to_spool(self, entry: _Entry) -> None:
        if self.spool is None:
            self.stats.lost_frames += 1
            return
        try:
            if self.spool.append(entry.key, entry.value):
                self.stats.frames_spooled += 1
        except OSError as exc:  # disk full, read-only fs: counted and loud, never a crash
            self.stats.lost_frames += 1
            log.error("cannot write to the spool (%s): a frame is lost (%d so far)", exc,
                      self.stats.lost_frames)

    # ------------------------------------------------------------------ acks

    async def _ack_loop(self) -> None:
        """Resolve outstanding records oldest first; failures and timeouts go to the spool."""
        while True:
            if not self._queue:
                self._wake_ack.clear()
                await self._wake_ack.wait()
                continue
            entry = self._queue[0]
            fut = entry.fut
            if fut is not None and not fut.done():
                remaining = entry.deadline - time.monotonic()
                if remaining > 0:
                    await asyncio.wait((fut,), timeout=remaining)
            self._queue.popleft()
            self.stats.in_flight = len(self._queue)
            self._room.release()
            if fut is None:
                self._to_spool(entry)
                continue
            if not fut.done():
                self.stats.ack_timeouts += 1
                self._fail(f"no acknowledgement within {self.ack_timeout_s} s")
                self._to_spool(entry)
                continue
            exc = None if fut.cancelled() else fut.exception()
            if fut.cancelled() or exc is None:
                if fut.cancelled():
                    self._fail("send was cancelled")
                    self._to_spool(entry)
                else:
                    self._count_sent(entry)
            elif isinstance(exc, TransportError) and not exc.retriable:
                self._reject(exc)
            else:
                self._fail(str(exc))
                self._to_spool(entry)

    # ------------------------------------------------------------------ replay

    async def _replay_loop(self) -> None:
        """Drain the spool oldest first while in spooling mode; back off while it fails."""
        delay = self.retry_initial_s
        while True:
            if self.mode is Mode.DIRECT or self.spool is None:
                if self.mode is Mode.SPOOLING and not self._queue:  # no spool: nothing to do
                    self.mode = Mode.DIRECT
                self._wake_replay.clear()
                await self._wake_replay.wait()
                continue
            spool = self.spool
            batch = spool.read(self.replay_batch)
            if not batch:
                if not self._queue and spool.pending_frames == 0:
                    spool.commit()
                    self.mode = Mode.DIRECT
                    log.info("spool drained; publishing directly again")
                    continue
                spool.maybe_sync()
                self._wake_replay.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(0.2):
                        await self._wake_replay.wait()
                continue
            ok = await self._replay_batch(spool, batch)
            spool.commit()
            if ok:
                delay = self.retry_initial_s
            else:
                spool.rewind()
                spool.maybe_sync()
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max_s)

    async def _replay_batch(self, spool: Spool, batch: list[SpoolRecord]) -> bool:
        """Send ``batch`` pipelined, ack in order; False at the first retriable failure."""
        futs: list[asyncio.Future[RecordMeta]] = []
        complete = True
        try:
            async with asyncio.timeout(self.ack_timeout_s):
                for rec in batch:
                    futs.append(await self.transport.send(self.topic, rec.value, key=rec.key))
        except TimeoutError:
            complete = False
        except TransportError as exc:
            if not exc.retriable and not futs:
                self._reject(exc)
                spool.ack(batch[0])
                return True
            complete = False
        except Exception as exc:  # same as in publish(): retry later, never drop
            log.exception("transport.send raised %s during replay; retrying later", exc)
            complete = False
        if not complete:
            self.stats.send_failures += 1
        pending = [f for f in futs if not f.done()]
        if pending:
            await asyncio.wait(pending, timeout=self.ack_timeout_s)
        return self._ack_prefix(spool, batch, futs) and complete

    def _ack_prefix(self, spool: Spool, batch: list[SpoolRecord],
                    futs: list[asyncio.Future[RecordMeta]]) -> bool:
        """Acknowledge the records that made it, in order, up to the first failure."""
        for rec, fut in zip(batch, futs, strict=False):
            if not fut.done() or fut.cancelled():
                if not fut.done():
                    self.stats.ack_timeouts += 1
                self.stats.send_failures += 1
                return False
            exc = fut.exception()
            if exc is not None:
                if isinstance(exc, TransportError) and not exc.retriable:
                    self._reject(exc)
                    spool.ack(rec)
                    continue
                self.stats.send_failures += 1
                return False
            spool.ack(rec)
            self.stats.frames_sent += 1
            self.stats.frames_replayed += 1
            self.stats.bytes_sent += len(rec.value)
        return True

"""The embedded in-memory transport: Kafka's semantics in one process, no broker.

``fleetpulse demo`` and single-process tests run every stage on it unchanged, so it must
behave like Kafka where stages can tell the difference:

- keys pick partitions with Kafka's own partitioner (murmur2), so a rack lands on the same
  partition index here as on a broker with the same partition count;
- consumer groups assign whole partitions to members and rebalance eagerly when a member
  joins or leaves: every member's ``on_revoked`` runs (at its next ``getmany``) before any
  member reads under the new assignment, and positions restart from the committed offsets,
  so uncommitted work is redelivered (at-least-once), exactly as with Kafka;
- a partition keeps a bounded number of bytes (``retention_bytes``); a consumer whose
  position fell below the log start resumes at the log start, like
  ``auto.offset.reset=earliest`` after retention.

Brokers are process-wide and named (``memory://NAME``), so the stages of one process that
use the same bootstrap string share one broker. The broker is guarded by a lock and wakes
waiting consumers through their own event loop, so threads (the NVML event thread) may
publish too.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import threading
import time
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from aiokafka.partitioner import murmur2

from fleetpulse.config import TransportConfig
from fleetpulse.transport.base import (
    Consumer,
    Message,
    RebalanceListener,
    RecordMeta,
    TopicPartition,
    Transport,
    TransportError,
)

__all__ = ["MemoryBroker", "MemoryConsumer", "MemoryTransport", "get_broker"]

_BROKERS: dict[str, MemoryBroker] = {}
_BROKERS_LOCK = threading.Lock()


def get_broker(name: str = "") -> MemoryBroker:
    """The process-wide broker called ``name`` (created on first use)."""
    with _BROKERS_LOCK:
        broker = _BROKERS.get(name)
        if broker is None:
            broker = _BROKERS[name] = MemoryBroker()
        return broker


def partition_for_key(key: bytes, partitions: int) -> int:
    """Kafka's default partitioner for keyed records: murmur2, positive, modulo."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


@dataclass(slots=True)
class _Partition:
    records: list[Message] = field(default_factory=list)
    start: int = 0
    """Offset of records[0]; grows when retention drops old records."""
    bytes: int = 0
    compacted: bool = False
    """Retention by key, as ``cleanup.policy=compact``: the newest record of every key stays
    (offsets then have gaps, so ``next_offset`` is kept apart from the list)."""
    next_offset: int = 0

    @property
    def end(self) -> int:
        return self.next_offset if self.compacted else self.start + len(self.records)

    def index_of(self, offset: int) -> int:
        """Position in ``records`` of the first record at or after ``offset``."""
        if not self.compacted:
            return max(offset, self.start) - self.start
        return bisect.bisect_left(self.records, offset, key=lambda m: m.offset)


@dataclass(slots=True)
class _Member:
    topics: frozenset[str]
    generation: int = -1
    """The group generation this member has rejoined at; -1 before the first join."""
    assignment: frozenset[TopicPartition] = frozenset()


@dataclass(slots=True)
class _Group:
    members: dict[int, _Member] = field(default_factory=dict)
    generation: int = 0
    rebalance_started: float = 0.0
    committed: dict[TopicPartition, int] = field(default_factory=dict)
    plan: dict[int, frozenset[TopicPartition]] = field(default_factory=dict)


class MemoryBroker:
    """Topics, partitions and consumer groups held in process memory."""

    def __init__(
        self,
        *,
        default_partitions: int = 1,
        retention_bytes: int = 256 << 20,
        rebalance_timeout_s: float = 30.0,
    ) -> None:
        self.default_partitions = default_partitions
        self.retention_bytes = retention_bytes
        self.rebalance_timeout_s = rebalance_timeout_s
        self._lock = threading.RLock()
        self._topics: dict[str, list[_Partition]] = {}
        self._groups: dict[str, _Group] = {}
        self._waiters: set[asyncio.Future[None]] = set()
        self._member_ids = itertools.count(1)
        self._round_robin = itertools.count()

    # -- topics ----------------------------------------------------------------------
    def create_topic(self, topic: str, partitions: int, *, compacted: bool = False) -> None:
        if partitions < 1:
            raise ValueError(f"topic {topic!r} needs at least one partition")
        with self._lock:
            # Like Kafka's CreateTopics: an existing topic keeps its partitions (adding some
            # would move keys to other partitions).
            if topic not in self._topics:
                self._topics[topic] = [_Partition(compacted=compacted)
                                       for _ in range(partitions)]

    def partitions(self, topic: str) -> int:
        with self._lock:
            if topic not in self._topics:
                self.create_topic(topic, self.default_partitions)
            return len(self._topics[topic])

    def append(
        self,
        topic: str,
        value: bytes,
        key: bytes | None,
        headers: tuple[tuple[str, bytes], ...],
        partition: int | None = None,
    ) -> RecordMeta:
        n = self.partitions(topic)
        if partition is not None:
            if not 0 <= partition < n:
                raise TransportError(f"{topic!r} has no partition {partition}", retriable=False)
            index = partition
        else:
            index = partition_for_key(key, n) if key is not None else next(self._round_robin) % n
        with self._lock:
            part = self._topics[topic][index]
            offset = part.end
            part.records.append(
                Message(topic, index, offset, key, value, int(time.time() * 1000), headers)
            )
            part.next_offset = offset + 1
            part.bytes += len(value) + (len(key) if key else 0)
            if part.compacted:
                self._compact(part)
            else:
                self._enforce_retention(part)
        self._wake()
        return RecordMeta(topic, index, offset)

    def _enforce_retention(self, part: _Partition) -> None:
        drop = 0
        while part.bytes > self.retention_bytes and drop < len(part.records) - 1:
            rec = part.records[drop]
            part.bytes -= len(rec.value) + (len(rec.key) if rec.key else 0)
            drop += 1
        if drop:
            del part.records[:drop]
            part.start += drop

    def _compact(self, part: _Partition) -> None:
        """Keep the newest record per key once the log is mostly superseded records."""
        if part.bytes < 1 << 20 or len(part.records) < 64:
            return
        newest: dict[bytes | None, int] = {}
        for i, rec in enumerate(part.records):
            newest[rec.key] = i
        if len(newest) * 2 > len(part.records):
            return
        part.records = [part.records[i] for i in sorted(newest.values())]
        part.bytes = sum(len(r.value) + len(r.key or b"") for r in part.records)
        part.start = part.records[0].offset

    def read(self, tp: TopicPartition, offset: int, limit: int) -> tuple[list[Message], int]:
        """Up to ``limit`` records from ``offset``; returns them and the next position."""
        with self._lock:
            part = self._topics[tp[0]][tp[1]]
            offset = max(offset, part.start)
            lo = part.index_of(offset)
            out = part.records[lo : lo + limit]
            if part.compacted:
                return out, (out[-1].offset + 1 if len(out) == limit else part.end)
            return out, offset + len(out)

    def bounds(self, tp: TopicPartition) -> tuple[int, int]:
        """(log start offset, end offset) of a partition."""
        with self._lock:
            self.partitions(tp[0])
            part = self._topics[tp[0]][tp[1]]
            return part.start, part.end

    # -- waiting -----------------------------------------------------------------------
    def _wake(self) -> None:
        with self._lock:
            waiters, self._waiters = self._waiters, set()
        for fut in waiters:
            fut.get_loop().call_soon_threadsafe(_resolve, fut)

    async def wait(self, timeout_s: float) -> None:
        """Sleep until anything changes (a record, a rebalance) or ``timeout_s`` passes."""
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._lock:
            self._waiters.add(fut)
        try:
            await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            pass
        finally:
            with self._lock:
                self._waiters.discard(fut)

    # -- groups ------------------------------------------------------------------------
    def join(self, group_id: str, topics: Iterable[str]) -> int:
        member_id = next(self._member_ids)
        with self._lock:
            group = self._groups.setdefault(group_id, _Group())
            group.members[member_id] = _Member(frozenset(topics))
            self._start_rebalance(group)
        self._wake()
        return member_id

    def leave(self, group_id: str, member_id: int) -> None:
        with self._lock:
            group = self._groups[group_id]
            if group.members.pop(member_id, None) is not None:
                self._start_rebalance(group)
        self._wake()

    def _start_rebalance(self, group: _Group) -> None:
        group.generation += 1
        group.rebalance_started = time.monotonic()
        tps_by_member: dict[int, list[TopicPartition]] = {m: [] for m in group.members}
        all_tps = sorted(
            {(t, p) for m in group.members.values() for t in m.topics
             for p in range(self.partitions(t))}
        )
        for i, tp in enumerate(all_tps):
            eligible = sorted(mid for mid, m in group.members.items() if tp[0] in m.topics)
            tps_by_member[eligible[i % len(eligible)]].append(tp)
        group.plan = {mid: frozenset(tps) for mid, tps in tps_by_member.items()}

    def rejoin(self, group_id: str, member_id: int) -> tuple[int, frozenset[TopicPartition]] | None:
        """Acknowledge the current generation; returns (generation, assignment) once every
        member has acknowledged it (the join barrier), else None. Members that do not
        rejoin within the rebalance timeout are removed, as Kafka does."""
        with self._lock:
            group = self._groups[group_id]
            member = group.members.get(member_id)
            if member is None:
                raise TransportError(
                    f"consumer left group {group_id!r} (it did not rejoin a rebalance within "
                    f"{self.rebalance_timeout_s} s)",
                    retriable=False,
                )
            member.generation = group.generation
            late = [mid for mid, m in group.members.items() if m.generation != group.generation]
            if late and time.monotonic() - group.rebalance_started > self.rebalance_timeout_s:
                for mid in late:
                    del group.members[mid]
                self._start_rebalance(group)
                member.generation = group.generation
                late = [mid for mid, m in group.members.items() if m.generation != group.generation]
            if late:
                return None
            member.assignment = group.plan.get(member_id, frozenset())
            return group.generation, member.assignment

    def generation(self, group_id: str) -> int:
        with self._lock:
            return self._groups[group_id].generation

    def commit(self, group_id: str, member_id: int, offsets: Mapping[TopicPartition, int]) -> None:
        with self._lock:
            group = self._groups[group_id]
            member = group.members.get(member_id)
            owned = member.assignment if member is not None else frozenset()
            stray = [tp for tp in offsets if tp not in owned]
            if stray:
                raise TransportError(
                    f"commit failed: partitions {stray} are not assigned to this member of "
                    f"group {group_id!r} (a rebalance took them)",
                    retriable=False,
                )
            group.committed.update(offsets)

    def committed(self, group_id: str, tp: TopicPartition) -> int | None:
        with self._lock:
            group = self._groups.get(group_id)
            return None if group is None else group.committed.get(tp)


def _resolve(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class MemoryConsumer(Consumer):
    """One group member on a :class:`MemoryBroker`."""

    def __init__(
        self,
        broker: MemoryBroker,
        topics: Sequence[str],
        group_id: str,
        listener: RebalanceListener | None,
        from_beginning: bool,
    ) -> None:
        self._broker = broker
        self._topics = tuple(topics)
        self._group = group_id
        self._listener = listener
        self._from_beginning = from_beginning
        self._member: int | None = None
        self._generation = -1
        self._assignment: frozenset[TopicPartition] = frozenset()
        self._positions: dict[TopicPartition, int] = {}
        self._stopped = False
        self._cursor = 0

    async def _sync_group(self, deadline: float) -> bool:
        """Run the join/rebalance protocol; True once this member holds a current assignment."""
        broker = self._broker
        if self._member is None:
            self._member = broker.join(self._group, self._topics)
        elif broker.generation(self._group) == self._generation:
            return True
        if self._assignment:
            # The listener may still commit: the broker keeps this member's old assignment
            # until it rejoins, and nobody reads under the new plan before that.
            if self._listener is not None:
                await self._listener.on_revoked(self._assignment)
            self._assignment = frozenset()
            self._positions.clear()
        while True:
            result = broker.rejoin(self._group, self._member)
            if result is not None:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            await broker.wait(min(remaining, 0.05))
        self._generation, self._assignment = result
        for tp in self._assignment:
            start, end = broker.bounds(tp)
            committed = broker.committed(self._group, tp)
            if committed is not None:
                self._positions[tp] = committed
            else:
                self._positions[tp] = start if self._from_beginning else end
        if self._listener is not None and self._assignment:
            await self._listener.on_assigned(self._assignment)
        return True

    async def getmany(self, timeout_ms: int = 1000, max_records: int = 1000) -> list[Message]:
        if self._stopped:
            raise TransportError("consumer is stopped", retriable=False)
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            if await self._sync_group(deadline):
                out = self._read(max_records)
                if out:
                    return out
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return []
            await self._broker.wait(remaining)

    def _read(self, max_records: int) -> list[Message]:
        tps = sorted(self._assignment)
        out: list[Message] = []
        for i in range(len(tps)):
            tp = tps[(self._cursor + i) % len(tps)]
            records, nxt = self._broker.read(tp, self._positions[tp], max_records - len(out))
            self._positions[tp] = nxt
            out.extend(records)
            if len(out) >= max_records:
                break
        self._cursor += 1
        return out

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        if self._member is None:
            raise TransportError("commit before the consumer joined its group", retriable=False)
        if offsets is None:
            offsets = {tp: self._positions[tp] for tp in self._assignment}
        self._broker.commit(self._group, self._member, offsets)

    async def committed(self, tp: TopicPartition) -> int | None:
        return self._broker.committed(self._group, tp)

    def assignment(self) -> frozenset[TopicPartition]:
        return self._assignment

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        if tp not in self._assignment:
            raise TransportError(f"cannot seek {tp}: not assigned", retriable=False)
        self._positions[tp] = offset

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: self._broker.bounds(tp)[1] for tp in tps}

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self._member is not None:
            self._broker.leave(self._group, self._member)
        self._assignment = frozenset()


class MemoryTransport(Transport):
    """:class:`Transport` over a named process-wide :class:`MemoryBroker`."""

    def __init__(self, config: TransportConfig | None = None, broker: MemoryBroker | None = None):
        self.config = config or TransportConfig()
        name = self.config.bootstrap.removeprefix("memory://")
        self.broker = broker if broker is not None else get_broker(name)
        self._closed = False
        self._consumers: list[MemoryConsumer] = []

    async def start(self) -> None:
        self._closed = False

    async def close(self) -> None:
        for consumer in self._consumers:
            await consumer.stop()
        self._closed = True

    async def ensure_topics(self, topics: Mapping[str, int], *,
                            compacted: Collection[str] = ()) -> None:
        for topic, partitions in topics.items():
            self.broker.create_topic(topic, partitions, compacted=topic in compacted)

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> asyncio.Future[RecordMeta]:
        if self._closed:
            raise TransportError("transport is closed", retriable=False)
        meta = self.broker.append(topic, bytes(value), key, tuple(headers), partition)
        fut: asyncio.Future[RecordMeta] = asyncio.get_running_loop().create_future()
        fut.set_result(meta)
        return fut

    async def flush(self) -> None:
        return None

    async def partitions_for(self, topic: str) -> int:
        return self.broker.partitions(topic)

    async def read_log(self, tps: Iterable[TopicPartition]) -> list[Message]:
        out: list[Message] = []
        for tp in sorted(tps):
            pos, end = self.broker.bounds(tp)
            while pos < end:
                records, pos = self.broker.read(tp, pos, 10_000)
                out.extend(r for r in records if r.offset < end)
                if not records:
                    break
        return out

    def consumer(
        self,
        topics: Sequence[str],
        group_id: str,
        *,
        listener: RebalanceListener | None = None,
        from_beginning: bool = True,
    ) -> Consumer:
        consumer = MemoryConsumer(self.broker, topics, group_id, listener, from_beginning)
        self._consumers.append(consumer)
        return consumer

"""The one transport interface every stage talks to: Kafka in production, memory embedded.

The interface is Kafka's own model, kept small: keyed publishing with acknowledgements,
consumer groups with partitions, explicit offset commits, rebalance callbacks. Both
implementations pass the same contract suite (``tests/test_transport_contract.py``), so a
stage that works on one works on the other.

Offsets follow Kafka's convention: a committed offset is the *next* offset to read.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

__all__ = [
    "DEADLETTER_HEADERS",
    "Consumer",
    "Message",
    "RebalanceListener",
    "RecordMeta",
    "TopicPartition",
    "Transport",
    "TransportError",
]

TopicPartition = tuple[str, int]

log = logging.getLogger("fleetpulse.transport")
"""(topic, partition)."""

DEADLETTER_HEADERS = ("fp-reason", "fp-source-topic", "fp-source-partition", "fp-source-offset")
"""Headers of a dead-letter record; its value is the original bytes, unchanged."""


class TransportError(RuntimeError):
    """The transport could not do what was asked (broker unreachable, closed, timed out).

    ``retriable`` tells the caller whether trying again later may succeed; the agent's
    publisher spools to disk on a retriable error.
    """

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


@dataclass(frozen=True, slots=True)
class Message:
    """One consumed record."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp_ms: int
    headers: tuple[tuple[str, bytes], ...] = ()

    @property
    def tp(self) -> TopicPartition:
        return (self.topic, self.partition)


@dataclass(frozen=True, slots=True)
class RecordMeta:
    """Where an acknowledged record landed."""

    topic: str
    partition: int
    offset: int


class RebalanceListener(Protocol):
    """Called by a consumer around a rebalance, from inside ``getmany``.

    ``on_revoked`` runs before the partitions go to another member: flush and commit what
    was processed. ``on_assigned`` runs before the first message of new partitions: load state.
    """

    async def on_revoked(self, revoked: frozenset[TopicPartition]) -> None: ...

    async def on_assigned(self, assigned: frozenset[TopicPartition]) -> None: ...


class Consumer(ABC):
    """A member of a consumer group; commits are explicit, never automatic."""

    @abstractmethod
    async def getmany(self, timeout_ms: int = 1000, max_records: int = 1000) -> list[Message]:
        """Records from the assigned partitions, in offset order per partition.

        Returns an empty list after ``timeout_ms`` without data.
        """

    @abstractmethod
    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit ``offsets`` (next offset to read), or the positions of everything returned."""

    async def commit_checkpointed(self, offsets: Mapping[TopicPartition, int]) -> bool:
        """Commit offsets whose state the stage has already checkpointed; False if refused.

        A broker that cannot be reached raises (the stage's loop fails and a restart
        resumes). A commit refused for good means the group rebalanced, e.g. this member
        was expelled after a stall past the session timeout on a loaded machine: that is a
        crash between checkpoint and commit, which replay from the older committed offset
        and the checkpoint cover, so it is logged and the consumer rejoins at its next poll
        (the rebalance callbacks then checkpoint, restore or forget partitions).
        """
        try:
            await self.commit(offsets)
        except TransportError as exc:
            if exc.retriable:
                raise
            log.warning("commit of %s refused (group rebalanced?): %s", sorted(offsets), exc)
            return False
        return True

    @abstractmethod
    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset for ``tp``, None if nothing was committed."""

    @abstractmethod
    def assignment(self) -> frozenset[TopicPartition]:
        """Partitions this member owns now."""

    @abstractmethod
    async def seek(self, tp: TopicPartition, offset: int) -> None:
        """Read ``tp`` from ``offset`` next."""

    @abstractmethod
    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """High-water marks (offset of the next record to be written), for lag."""

    @abstractmethod
    async def stop(self) -> None:
        """Leave the group; the partitions go to the other members."""


class Transport(ABC):
    """Publishing and consuming, as one object with a two-call lifecycle."""

    @abstractmethod
    async def start(self) -> None: ...

    @abstractmethod
    async def close(self) -> None:
        """Flush pending sends, then release connections."""

    @abstractmethod
    async def ensure_topics(self, topics: Mapping[str, int], *,
                            compacted: Collection[str] = ()) -> None:
        """Create missing topics with the given partition counts (existing ones are kept).

        Topics named in ``compacted`` are created with ``cleanup.policy=compact``: the
        broker keeps at least the newest record of every key (state changelogs)."""

    @abstractmethod
    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> asyncio.Future[RecordMeta]:
        """Queue one record; the future resolves once the broker acknowledged it.

        ``partition`` overrides the key's partition (a changelog keeps the state of source
        partition ``p`` in its own partition ``p``). Awaiting ``send`` only queues (it may
        wait for buffer space); await the returned future to know the record is durable.
        Failures raise TransportError.
        """

    @abstractmethod
    async def flush(self) -> None:
        """Wait until every queued record is acknowledged or failed."""

    @abstractmethod
    async def partitions_for(self, topic: str) -> int:
        """Number of partitions of ``topic``."""

    @abstractmethod
    async def read_log(self, tps: Iterable[TopicPartition]) -> list[Message]:
        """Every record of ``tps`` from the log start to the end as of this call, outside
        any consumer group (no rebalance, nothing committed); in offset order per
        partition. Tombstones (null values) are left out."""

    @abstractmethod
    def consumer(
        self,
        topics: Sequence[str],
        group_id: str,
        *,
        listener: RebalanceListener | None = None,
        from_beginning: bool = True,
    ) -> Consumer:
        """A new member of ``group_id``; it joins the group at its first ``getmany``.

        ``from_beginning`` picks where a partition with no committed offset starts.
        """

    async def send_and_wait(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> RecordMeta:
        return await (await self.send(topic, value, key=key, headers=headers))

    async def dead_letter(self, deadletter_topic: str, msg: Message, reason: str) -> RecordMeta:
        """Park an undecodable message: original bytes, keyed by its source topic.

        The caller counts it and goes on; nothing is lost and nothing crashes.
        """
        headers = (
            ("fp-reason", reason[:2000].encode()),
            ("fp-source-topic", msg.topic.encode()),
            ("fp-source-partition", str(msg.partition).encode()),
            ("fp-source-offset", str(msg.offset).encode()),
        )
        return await self.send_and_wait(
            deadletter_topic, msg.value, key=msg.topic.encode(), headers=headers
        )

"""A transport that the agent can open while the broker is down.

The Kafka transport's ``start`` fails when no broker answers, and its ``send`` refuses to
work before ``start`` succeeded (a non-retriable error, rightly: for most stages that is a
bug). The agent is different: it must come up on a host whose broker is unreachable (a
rack switch reboot, a restart during an outage) and spool until the broker is back. This
wrapper turns "not started yet" into a *retriable* error and tries ``start`` again, at
most every ``retry_s``, on the next send. Once started, reconnecting is the client
library's job (aiokafka reconnects by itself).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping, Sequence

from fleetpulse.transport.base import (
    Consumer,
    Message,
    RebalanceListener,
    RecordMeta,
    TopicPartition,
    Transport,
    TransportError,
)

__all__ = ["ReconnectingTransport"]

log = logging.getLogger(__name__)


class ReconnectingTransport(Transport):
    """Delegates to ``inner``, starting it lazily and again after a failed start."""

    def __init__(self, inner: Transport, *, retry_s: float = 2.0,
                 on_connect: Callable[[Transport], Awaitable[None]] | None = None) -> None:
        self.inner = inner
        self.retry_s = retry_s
        self.on_connect = on_connect
        self.started = False
        self.start_failures = 0
        self._next_try = 0.0
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Try once; a failure is logged and retried on the next send, never raised."""
        try:
            await self._ensure()
        except TransportError as exc:
            log.warning("broker not reachable at start (%s); spooling until it is", exc)

    async def _ensure(self) -> None:
        if self.started:
            return
        async with self._lock:
            if self.started:
                return
            if time.monotonic() < self._next_try:
                raise TransportError("broker not connected yet", retriable=True)
            try:
                await self.inner.start()
            except TransportError as exc:
                self.start_failures += 1
                self._next_try = time.monotonic() + self.retry_s
                raise TransportError(f"broker not connected: {exc}", retriable=True) from exc
            self.started = True
            log.info("connected to the broker")
            if self.on_connect is not None:
                try:
                    await self.on_connect(self.inner)
                except TransportError as exc:
                    log.warning("connected, but the on-connect step failed: %s", exc)

    async def close(self) -> None:
        if self.started:
            self.started = False
            await self.inner.close()

    async def ensure_topics(self, topics: Mapping[str, int], *,
                            compacted: Collection[str] = ()) -> None:
        await self._ensure()
        await self.inner.ensure_topics(topics, compacted=compacted)

    async def send(self, topic: str, value: bytes, *, key: bytes | None = None,
                   headers: Sequence[tuple[str, bytes]] = (),
                   partition: int | None = None) -> asyncio.Future[RecordMeta]:
        await self._ensure()
        return await self.inner.send(topic, value, key=key, headers=headers,
                                     partition=partition)

    async def flush(self) -> None:
        if self.started:
            await self.inner.flush()

    async def partitions_for(self, topic: str) -> int:
        await self._ensure()
        return await self.inner.partitions_for(topic)

    async def read_log(self, tps: Iterable[TopicPartition]) -> list[Message]:
        await self._ensure()
        return await self.inner.read_log(tps)

    def consumer(self, topics: Sequence[str], group_id: str, *,
                 listener: RebalanceListener | None = None,
                 from_beginning: bool = True) -> Consumer:
        return self.inner.consumer(topics, group_id, listener=listener,
                                   from_beginning=from_beginning)

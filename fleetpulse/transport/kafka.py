"""The Kafka transport, on aiokafka: what production runs.

Durability first: the producer is idempotent with ``acks=all``, so an acknowledged record is
on every in-sync replica exactly once, in order per partition. Consumers never auto-commit;
stages commit offsets once the data they cover is durable downstream (DESIGN.md).

Throughput: frames are ~10 KB and the load test sends a few thousand per second, so the
producer lingers a few milliseconds and builds large batches, which lz4/zstd then compress
well (aiokafka[lz4,zstd] brings the cramjam codecs).

Failures: every aiokafka error is re-raised as :class:`TransportError` with ``retriable``
set, chained to the original. A send while the broker is down fails within
``request_timeout_ms`` instead of hanging, so the agent can spool to disk.

Rebalances: aiokafka runs its rebalance callbacks on a background task. To give stages the
contract of base.py (callbacks run inside ``getmany``, never while a returned batch is still
being processed), the adapter waits until the consumer is back inside ``getmany`` (or
stopped) before it calls our listener, which is what Kafka's Java client does in ``poll``.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener
from aiokafka import TopicPartition as KafkaTP
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import (
    CommitFailedError,
    IllegalStateError,
    KafkaConnectionError,
    KafkaError,
    KafkaTimeoutError,
    KafkaUnavailableError,
    NoBrokersAvailable,
    OutOfOrderSequenceNumber,
    ProducerClosed,
    ProducerFenced,
    RequestTimedOutError,
    TopicAlreadyExistsError,
    UnknownProducerId,
)
from aiokafka.helpers import create_ssl_context
from aiokafka.structs import RecordMetadata

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

__all__ = ["KafkaConsumer", "KafkaTransport"]

log = logging.getLogger(__name__)

LINGER_MS = 5
"""How long the producer waits to fill a batch; a few ms buys large batches at ~no latency."""
MAX_BATCH_BYTES = 512 * 1024
"""Per-partition batch size (uncompressed). Below the 1 MiB default ``message.max.bytes``
of brokers, so batches are accepted by a broker left at its defaults."""
MAX_REQUEST_BYTES = 1024 * 1024
"""Largest record the producer accepts (Kafka's default broker limit)."""
SESSION_TIMEOUT_MS = 10_000
"""A consumer that vanishes without leaving loses its partitions after this long."""
HEARTBEAT_MS = 1_000
"""Heartbeats are also how a member learns of a rebalance, so they are frequent."""
RESTART_BACKOFF_S = 0.5
"""After a failed connect, sends fail at once for this long instead of reconnecting each."""
SWEEP_INTERVAL_S = 0.1
"""How often overdue acknowledgements are failed."""

COMPACTED_CONFIG = {"cleanup.policy": "compact", "segment.ms": "600000",
                    "min.cleanable.dirty.ratio": "0.1"}
"""Topic settings of a state changelog: only the newest record per key must survive, and
segments roll every 10 min so the log a restore reads stays short."""

LZ4_LEVEL = 1
"""aiokafka compresses lz4 at level 9: on sample frames that measured 22 MB/s against 785 MB/s
at level 1, for the same ratio (1.10 vs 1.09), so level 9 alone would fill a core at the
load test's ~30 MB/s. Level-1 output is ordinary LZ4 frame data any consumer reads."""


def _use_fast_lz4() -> None:
    """Make aiokafka's record-batch builders compress lz4 at :data:`LZ4_LEVEL`.

    aiokafka has no setting for it, so the encoder its builders call (the Cython one and
    the pure-Python fallback) is replaced, process-wide and once. Only an unmodified
    aiokafka encoder is replaced, so a future aiokafka that changes this stays untouched.
    """
    from aiokafka import codec
    from aiokafka.record import default_records as py_records

    try:
        from aiokafka.record._crecords import default_records as c_records
    except ImportError:  # no compiled extension on this platform
        c_records = None

    def lz4_fast(payload: Any, level: int = LZ4_LEVEL) -> bytes:
        return codec.lz4_encode(payload, level=level)

    for module in (py_records, c_records):
        if module is not None and getattr(module, "lz4_encode", None) is codec.lz4_encode:
            module.lz4_encode = lz4_fast


# Errors that mean "the broker is not reachable right now"; aiokafka marks some of these
# non-retriable, but for us all of them are worth retrying later (the agent spools).
_UNREACHABLE = (
    KafkaTimeoutError,
    KafkaConnectionError,
    NoBrokersAvailable,
    KafkaUnavailableError,
    RequestTimedOutError,
    TimeoutError,
    ConnectionError,
)


# Errors about the producer, never about the record: a send that was handed a producer
# that another task then retired (ProducerClosed: the record waited for room in a full batch
# while the broker was away, then found the producer closed), or whose producer id the
# broker no longer accepts. aiokafka marks them non-retriable, and the agent drops a frame
# on a non-retriable error; yet the next send gets a fresh producer that takes the record.
_PRODUCER_GONE = (ProducerClosed, OutOfOrderSequenceNumber, UnknownProducerId, ProducerFenced)


def _is_retriable(exc: BaseException) -> bool:
    if isinstance(exc, _UNREACHABLE + _PRODUCER_GONE):
        return True
    if isinstance(exc, CommitFailedError | IllegalStateError):
        return False
    return bool(getattr(exc, "retriable", False))


def _error(what: str, exc: BaseException) -> TransportError:
    """A TransportError for ``exc``; the caller raises it ``from exc``."""
    return TransportError(f"{what}: {type(exc).__name__}: {exc}", retriable=_is_retriable(exc))


def _ktp(tp: TopicPartition) -> KafkaTP:
    return KafkaTP(tp[0], tp[1])


def _tp(ktp: KafkaTP) -> TopicPartition:
    return (ktp.topic, ktp.partition)


class _ListenerAdapter(ConsumerRebalanceListener):
    """Calls our RebalanceListener only while the consumer is inside ``getmany`` or stopped."""

    def __init__(self, consumer: KafkaConsumer, listener: RebalanceListener | None) -> None:
        self._consumer = consumer
        self._listener = listener

    async def on_partitions_revoked(self, revoked: Iterable[KafkaTP]) -> None:
        tps = frozenset(_tp(t) for t in revoked)
        if not tps or self._listener is None:
            return
        await self._consumer._polling.wait()
        await self._listener.on_revoked(tps)

    async def on_partitions_assigned(self, assigned: Iterable[KafkaTP]) -> None:
        tps = frozenset(_tp(t) for t in assigned)
        if not tps or self._listener is None:
            return
        # Before any await: aiokafka fetches for the new assignment while this callback
        # runs, and getmany must not hand those records out before the listener has loaded
        # the partitions' state (a restore from the changelog takes a round trip).
        self._consumer._settled.clear()
        try:
            await self._consumer._polling.wait()
            await self._listener.on_assigned(tps)
        finally:
            self._consumer._settled.set()


class KafkaConsumer(Consumer):
    """One member of a consumer group on a Kafka cluster; it joins at its first call."""

    def __init__(
        self,
        transport: KafkaTransport,
        topics: Sequence[str],
        group_id: str,
        listener: RebalanceListener | None,
        from_beginning: bool,
    ) -> None:
        self._transport = transport
        self._topics = tuple(topics)
        self._group_id = group_id
        self._listener = listener
        self._from_beginning = from_beginning
        self._consumer: AIOKafkaConsumer | None = None
        self._stopped = False
        # Set while the user is not holding a batch: inside getmany, before the first
        # getmany, or after stop. Rebalance callbacks wait for it.
        self._polling = asyncio.Event()
        self._polling.set()
        # Serialises the first start: a second caller (e.g. a rebalance callback calling
        # committed()) must wait for it, not start a second group member.
        self._starting = asyncio.Lock()
        # Clear while the listener's on_assigned runs; getmany holds records back until then.
        self._settled = asyncio.Event()
        self._settled.set()

    async def _client(self) -> AIOKafkaConsumer:
        if self._stopped:
            raise TransportError("consumer is stopped", retriable=False)
        if self._consumer is not None:
            return self._consumer
        async with self._starting:
            return await self._start_client()

    async def _start_client(self) -> AIOKafkaConsumer:
        if self._consumer is None:
            cfg = self._transport.config
            consumer = AIOKafkaConsumer(
                **self._transport.connection_options(),
                group_id=self._group_id,
                enable_auto_commit=False,
                auto_offset_reset="earliest" if self._from_beginning else "latest",
                session_timeout_ms=SESSION_TIMEOUT_MS,
                heartbeat_interval_ms=HEARTBEAT_MS,
                request_timeout_ms=max(cfg.request_timeout_ms, SESSION_TIMEOUT_MS + 5_000),
                max_partition_fetch_bytes=4 * MAX_REQUEST_BYTES,
            )
            consumer.subscribe(self._topics, listener=_ListenerAdapter(self, self._listener))
            try:
                await consumer.start()
            except Exception as exc:
                await _quietly(consumer.stop())
                raise _error(f"consumer of group {self._group_id!r} could not start", exc) from exc
            self._consumer = consumer
        return self._consumer

    async def getmany(self, timeout_ms: int = 1000, max_records: int = 1000) -> list[Message]:
        consumer = await self._client()
        self._polling.set()
        try:
            batches = await consumer.getmany(timeout_ms=timeout_ms, max_records=max_records)
        except KafkaError as exc:
            raise _error(f"fetch for group {self._group_id!r} failed", exc) from exc
        if not self._settled.is_set():
            await self._settled.wait()
            owned = consumer.assignment()
            batches = {k: v for k, v in batches.items() if k in owned}
        out = [
            Message(
                topic=r.topic,
                partition=r.partition,
                offset=r.offset,
                key=r.key,
                value=r.value if r.value is not None else b"",
                timestamp_ms=r.timestamp,
                headers=tuple((k, bytes(v)) for k, v in r.headers),
            )
            for ktp in sorted(batches, key=_tp)
            for r in batches[ktp]
        ]
        if out:
            self._polling.clear()
        return out

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        consumer = await self._client()
        try:
            if offsets is None:
                await consumer.commit()
            else:
                await consumer.commit({_ktp(tp): off for tp, off in offsets.items()})
        except KafkaError as exc:
            raise _error(f"commit for group {self._group_id!r} failed", exc) from exc

    async def committed(self, tp: TopicPartition) -> int | None:
        consumer = await self._client()
        try:
            offset = await consumer.committed(_ktp(tp))
        except KafkaError as exc:
            raise _error(f"reading the committed offset of {tp} failed", exc) from exc
        return None if offset is None or offset < 0 else int(offset)

    def assignment(self) -> frozenset[TopicPartition]:
        if self._consumer is None or self._stopped:
            return frozenset()
        return frozenset(_tp(t) for t in self._consumer.assignment())

    async def seek(self, tp: TopicPartition, offset: int) -> None:
        consumer = await self._client()
        try:
            consumer.seek(_ktp(tp), offset)
        except (KafkaError, ValueError) as exc:
            raise TransportError(f"cannot seek {tp}: {exc}", retriable=False) from exc

    async def end_offsets(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        consumer = await self._client()
        try:
            ends = await consumer.end_offsets([_ktp(tp) for tp in tps])
        except KafkaError as exc:
            raise _error("reading end offsets failed", exc) from exc
        return {_tp(k): int(v) for k, v in ends.items()}

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._polling.set()
        if self._consumer is not None:
            consumer, self._consumer = self._consumer, None
            await _quietly(consumer.stop())


async def _quietly(aw: Any) -> None:
    """Await a shutdown step; a failing close must not hide the error that caused it."""
    try:
        await aw
    except Exception as exc:  # a broker gone away while closing is not an error
        log.debug("ignored while closing: %r", exc)


class KafkaTransport(Transport):
    """:class:`Transport` over a Kafka cluster reached at ``config.bootstrap``.

    Outages: aiokafka's idempotent producer numbers every batch; a batch that fails (expired
    while the broker was down, or never acknowledged within ``request_timeout_ms``) leaves a
    gap in the numbering that the broker then rejects forever (OutOfOrderSequenceNumber). So
    after any failed send the producer is retired and the next ``send`` starts a fresh one
    (a new producer id). Records whose send failed may still have been written; callers
    resend them, and consumers de-duplicate by (agent, seq): at-least-once, never a loss.
    """

    def __init__(self, config: TransportConfig, **producer_options: Any) -> None:
        """``producer_options`` override the producer settings above (benchmarks tune them)."""
        config.validate()
        if config.is_memory:
            raise TransportError(f"{config.bootstrap!r} is not a Kafka address", retriable=False)
        self.config = config
        if config.compression == "lz4":
            _use_fast_lz4()
        self._producer_options = producer_options
        self._producer: AIOKafkaProducer | None = None
        self._started = False
        self._needs_reset = False
        self._next_start = 0.0
        self._producer_lock = asyncio.Lock()
        self._retiring: set[asyncio.Task[None]] = set()
        self._deadlines: collections.deque[
            tuple[float, asyncio.Future[RecordMeta], AIOKafkaProducer]
        ] = collections.deque()
        self._sweeper: asyncio.Task[None] | None = None
        self._admin: AIOKafkaAdminClient | None = None
        self._consumers: list[KafkaConsumer] = []

    @property
    def _timeout_s(self) -> float:
        return self.config.request_timeout_ms / 1000

    def connection_options(self) -> dict[str, Any]:
        """Address, client id and the SASL/SSL settings, shared by producer, consumers, admin."""
        cfg = self.config
        opts: dict[str, Any] = {
            "bootstrap_servers": [s.strip() for s in cfg.bootstrap.split(",") if s.strip()],
            "client_id": cfg.client_id,
            "security_protocol": cfg.security_protocol,
        }
        if cfg.security_protocol in ("SSL", "SASL_SSL"):
            opts["ssl_context"] = create_ssl_context(
                cafile=cfg.ssl_cafile or None,
                certfile=cfg.ssl_certfile or None,
                keyfile=cfg.ssl_keyfile or None,
            )
        if cfg.security_protocol.startswith("SASL_"):
            opts["sasl_mechanism"] = cfg.sasl_mechanism
            opts["sasl_plain_username"] = cfg.sasl_username
            opts["sasl_plain_password"] = cfg.sasl_password
        return opts

    async def start(self) -> None:
        """Connect the producer; raises a retriable TransportError if Kafka is unreachable."""
        self._started = True
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_deadlines())
        await self._current_producer()

    async def _new_producer(self) -> AIOKafkaProducer:
        cfg = self.config
        options: dict[str, Any] = {
            **self.connection_options(),
            "acks": "all",
            "enable_idempotence": True,
            "compression_type": None if cfg.compression == "none" else cfg.compression,
            "linger_ms": LINGER_MS,
            "max_batch_size": MAX_BATCH_BYTES,
            "max_request_size": MAX_REQUEST_BYTES,
            "request_timeout_ms": cfg.request_timeout_ms,
        }
        options.update(self._producer_options)
        producer = AIOKafkaProducer(**options)
        try:
            # start() waits for a producer id; a broker that accepts connections but cannot
            # serve would keep it waiting forever.
            await asyncio.wait_for(producer.start(), self._timeout_s)
        except Exception as exc:  # includes TimeoutError
            await self._retire(producer)
            # Retriable whatever aiokafka says: no producer says nothing about the record.
            raise TransportError(f"cannot reach Kafka at {cfg.bootstrap}: "
                                 f"{type(exc).__name__}: {exc}") from exc
        return producer

    async def _current_producer(self) -> AIOKafkaProducer:
        """The live producer; replaces a retired one, at most once per back-off period."""
        if not self._started:
            raise TransportError("transport is not started (or closed)", retriable=False)
        producer = self._producer
        if producer is not None and not self._needs_reset:
            return producer
        async with self._producer_lock:
            if self._needs_reset and self._producer is not None:
                old, self._producer = self._producer, None
                task = asyncio.create_task(self._retire(old))
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)
            self._needs_reset = False
            if self._producer is None:
                loop = asyncio.get_running_loop()
                if loop.time() < self._next_start:
                    raise TransportError(f"Kafka at {self.config.bootstrap} is unreachable")
                try:
                    self._producer = await self._new_producer()
                except TransportError:
                    self._next_start = loop.time() + RESTART_BACKOFF_S
                    raise
                if not self._started:  # closed while we were connecting
                    await self._retire(self._producer)
                    self._producer = None
                    raise TransportError("transport is closed", retriable=False)
            return self._producer

    async def _retire(self, producer: AIOKafkaProducer) -> None:
        """Stop ``producer``, flushing for up to request_timeout_ms, then failing the rest."""
        stopping = asyncio.ensure_future(producer.stop())
        done, _ = await asyncio.wait({stopping}, timeout=self._timeout_s)
        if not done:
            # aiokafka retries an idempotent batch forever; fail what is left so that stop()
            # (which flushes first) can finish and close the connections.
            accumulator = getattr(producer, "_message_accumulator", None)
            if accumulator is not None:
                accumulator.fail_all(KafkaTimeoutError("producer retired after a failed send"))
            done, _ = await asyncio.wait({stopping}, timeout=self._timeout_s)
        if stopping.done():
            exc = stopping.exception()
            if exc is not None:
                log.debug("ignored while stopping a producer: %r", exc)
        else:
            stopping.cancel()
            log.warning("a Kafka producer did not stop within %.0f s", 2 * self._timeout_s)

    async def _sweep_deadlines(self) -> None:
        """Fail acknowledgements that did not come within request_timeout_ms.

        Deadlines are appended in send order with one timeout, so the deque is sorted and
        the sweep only looks at its head.
        """
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            queue = self._deadlines
            while queue and (queue[0][1].done() or queue[0][0] <= now):
                _, fut, producer = queue.popleft()
                if not fut.done():
                    # The batch is in limbo; only a new producer id is safe to go on with.
                    self._needs_reset = self._needs_reset or producer is self._producer
                    fut.set_exception(
                        TransportError(
                            f"no acknowledgement within {self.config.request_timeout_ms} ms",
                            retriable=True,
                        )
                    )
            await asyncio.sleep(SWEEP_INTERVAL_S)

    async def close(self) -> None:
        """Stop consumers, then the producer (waiting up to request_timeout_ms to flush)."""
        self._started = False
        for consumer in self._consumers:
            await consumer.stop()
        self._consumers.clear()
        if self._admin is not None:
            admin, self._admin = self._admin, None
            await _quietly(admin.close())
        async with self._producer_lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            await self._retire(producer)
        if self._retiring:
            await asyncio.gather(*self._retiring, return_exceptions=True)
        if self._sweeper is not None:
            self._sweeper.cancel()
            await asyncio.gather(self._sweeper, return_exceptions=True)
            self._sweeper = None
        while self._deadlines:
            _, fut, _producer = self._deadlines.popleft()
            if not fut.done():
                fut.set_exception(TransportError("transport closed before the acknowledgement"))
                fut.exception()  # nobody may be waiting any more; mark it retrieved

    async def _admin_client(self) -> AIOKafkaAdminClient:
        if self._admin is None:
            admin = AIOKafkaAdminClient(
                **self.connection_options(), request_timeout_ms=self.config.request_timeout_ms
            )
            try:
                await admin.start()
            except Exception as exc:
                await _quietly(admin.close())
                raise _error(f"cannot reach Kafka at {self.config.bootstrap}", exc) from exc
            self._admin = admin
        return self._admin

    async def ensure_topics(self, topics: Mapping[str, int], *,
                            compacted: Collection[str] = ()) -> None:
        if not topics:
            return
        admin = await self._admin_client()
        wanted: dict[str, int] = {}
        try:
            existing = set(await admin.list_topics())
            wanted = {name: n for name, n in topics.items() if name not in existing}
            if wanted:
                # CreateTopics v3 (aiokafka's newest) needs an explicit replication factor:
                # three copies where the cluster has three brokers, fewer on a test broker.
                brokers = len((await admin.describe_cluster()).get("brokers", ())) or 1
                replicas = min(3, brokers)
                response = await admin.create_topics(
                    [NewTopic(name, n, replicas,
                              topic_configs=COMPACTED_CONFIG if name in compacted else None)
                     for name, n in wanted.items()]
                )
                for name, code, *rest in response.topic_errors:
                    if code not in (0, TopicAlreadyExistsError.errno):
                        raise TransportError(
                            f"creating topic {name!r} failed: error {code} {rest[:1]}",
                            retriable=False,
                        )
        except KafkaError as exc:
            raise _error(f"creating topics {sorted(topics)} failed", exc) from exc
        # The producer must see the new partitions before keyed sends pick one. An existing
        # topic keeps the count it has (waiting for another would never end).
        producer = await self._current_producer()
        for name in topics:
            await self._wait_partitions(producer, name, wanted.get(name, 1))

    async def _wait_partitions(self, producer: AIOKafkaProducer, topic: str, n: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.request_timeout_ms / 1000
        while True:
            try:
                parts = await producer.partitions_for(topic)
            except KafkaError as exc:
                raise _error(f"metadata of {topic!r} unavailable", exc) from exc
            if parts is not None and len(parts) >= n:
                return
            if loop.time() > deadline:
                raise TransportError(f"topic {topic!r} has no {n} partitions yet", retriable=True)
            await producer.client.force_metadata_update()
            await asyncio.sleep(0.05)

    async def send(
        self,
        topic: str,
        value: bytes,
        *,
        key: bytes | None = None,
        headers: Sequence[tuple[str, bytes]] = (),
        partition: int | None = None,
    ) -> asyncio.Future[RecordMeta]:
        producer = await self._current_producer()
        try:
            sent = await producer.send(topic, value, key=key, headers=list(headers) or None,
                                       partition=partition)
        except KafkaError as exc:
            self._needs_reset = self._needs_reset or producer is self._producer
            raise _error(f"send to {topic!r} failed", exc) from exc
        loop = asyncio.get_running_loop()
        acked: asyncio.Future[RecordMeta] = loop.create_future()
        self._deadlines.append((loop.time() + self._timeout_s, acked, producer))

        def done(f: asyncio.Future[RecordMetadata]) -> None:
            exc = None if f.cancelled() else f.exception()
            if f.cancelled() or exc is not None:
                if producer is self._producer:
                    self._needs_reset = True
                if not acked.done():
                    err = (
                        _error(f"send to {topic!r} failed", exc)
                        if exc is not None
                        else TransportError(f"send to {topic!r} was cancelled")
                    )
                    err.__cause__ = exc
                    acked.set_exception(err)
                return
            if not acked.done():
                meta = f.result()
                acked.set_result(RecordMeta(meta.topic, meta.partition, meta.offset))

        sent.add_done_callback(done)
        return acked

    async def flush(self) -> None:
        producer = await self._current_producer()
        # Not wait_for: cancelling aiokafka's flush would cancel the batches it waits on.
        flushing = asyncio.ensure_future(producer.flush())
        done, _ = await asyncio.wait({flushing}, timeout=self._timeout_s)
        if not done:
            flushing.add_done_callback(lambda f: f.cancelled() or f.exception())
            raise TransportError(f"flush did not finish within {self.config.request_timeout_ms} ms")
        exc = flushing.exception()
        if exc is not None:
            raise _error("flush failed", exc) from exc

    async def partitions_for(self, topic: str) -> int:
        producer = await self._current_producer()
        try:
            parts = await producer.partitions_for(topic)
        except KafkaError as exc:
            raise _error(f"metadata of {topic!r} unavailable", exc) from exc
        if not parts:
            raise TransportError(f"topic {topic!r} has no partitions", retriable=True)
        return len(parts)

    async def read_log(self, tps: Iterable[TopicPartition]) -> list[Message]:
        """A group-less consumer assigned ``tps``, read from their starts to their ends."""
        ktps = [_ktp(tp) for tp in tps]
        if not ktps:
            return []
        consumer = AIOKafkaConsumer(
            **self.connection_options(), group_id=None, enable_auto_commit=False,
            request_timeout_ms=self.config.request_timeout_ms,
            max_partition_fetch_bytes=4 * MAX_REQUEST_BYTES,
        )
        out: list[Message] = []
        try:
            await consumer.start()
            consumer.assign(ktps)
            begins = await consumer.beginning_offsets(ktps)
            ends = await consumer.end_offsets(ktps)
            left = {k for k in ktps if ends[k] > begins[k]}
            for k in ktps:
                consumer.seek(k, begins[k])
            deadline = asyncio.get_running_loop().time() + self._timeout_s
            while left:
                batches = await consumer.getmany(*left, timeout_ms=500)
                for ktp in sorted(batches, key=_tp):
                    out.extend(Message(r.topic, r.partition, r.offset, r.key, r.value,
                                       r.timestamp, tuple((h, bytes(v)) for h, v in r.headers))
                               for r in batches[ktp]
                               if r.value is not None and r.offset < ends[ktp])
                for k in list(left):
                    if await consumer.position(k) >= ends[k]:
                        left.discard(k)
                if left and asyncio.get_running_loop().time() > deadline:
                    raise TransportError(f"reading {sorted(_tp(k) for k in left)} did not "
                                         f"reach their ends in time")
        except KafkaError as exc:
            raise _error(f"reading {sorted(_tp(k) for k in ktps)} failed", exc) from exc
        finally:
            await _quietly(consumer.stop())
        out.sort(key=lambda m: (m.topic, m.partition, m.offset))
        return out

    def consumer(
        self,
        topics: Sequence[str],
        group_id: str,
        *,
        listener: RebalanceListener | None = None,
        from_beginning: bool = True,
    ) -> Consumer:
        consumer = KafkaConsumer(self, topics, group_id, listener, from_beginning)
        self._consumers.append(consumer)
        return consumer

"""The aggregator process: consumers, stages, durability cycle, query API and /metrics.

Durability cycle (every ``commit_interval_ms``, on a rebalance's revoke, and at shutdown):

1. rollups produced so far are acknowledged by the broker (awaited sends);
2. the entity index and then the store are flushed (fsync);
3. each owned partition's checkpoint is written to the group's changelog topic and
   acknowledged (:mod:`fleetpulse.changelog`; instances share nothing but the broker);
4. the partitions' resume offsets are committed to Kafka.

A kill -9 anywhere in between leaves a committed offset no newer than the durable data and
a checkpoint no newer than that offset's replay needs; replaying rewrites identical values
(the store's last write wins), so the rollups come out bit for bit the same.

Two threads (issue 16): the event loop does only Kafka and HTTP I/O (fetches, heartbeats,
sends, commits, requests); everything that touches the stages, the store or the entity
index -- folding a batch, closing windows, flush and fsync, checkpoints, rebalance
bookkeeping, retention, queries and the gauges of /metrics -- runs on one store thread, one
call at a time in submission order (the store is single-threaded). A big batch, a flush of
millions of points or a starved CPU then delays consumption, never the heartbeats: the GIL
passes to the loop every few milliseconds, so the member stays in its group. The steps of
the cycle above keep their order: each loop awaits its own store calls, and a flush, the
checkpoints it covers and nothing else run as one store call.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from aggregator.attribution_stage import AttributionStage
from aggregator.attribution_table import AttributionTable
from aggregator.checkpoint import PartitionCheckpoint, checkpoint_bytes, checkpoint_from_bytes
from aggregator.config import AggregatorConfig
from aggregator.disk_health import DiskHealth
from aggregator.fleet_query import FleetEngine, Peer, add_peer_routes
from aggregator.http_api import add_query_routes, build_query_app
from aggregator.http_errors import JsonErrorRunner
from aggregator.query_engine import QueryEngine, QueryLimits
from aggregator.rack_stage import RackStage
from aggregator.remote_write import RemoteWriteCollector, RemoteWriter
from aggregator.row_stage import RowStage
from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig, StoreWriteError
from aggregator.window_kernel import warm_up
from aggregator.workload_query import WorkloadQuery
from fleetpulse.atomic_file import atomic_write
from fleetpulse.changelog import Changelog, ChangelogError
from fleetpulse.transport import (
    Consumer,
    Message,
    TopicPartition,
    Transport,
    TransportError,
    open_transport,
)
from schemas.rollup import encode_rollup
from schemas.topics import Topics

__all__ = ["AggregatorService"]

log = logging.getLogger("fleetpulse.aggregator")
T = TypeVar("T")

LAG_REFRESH_S = 2.0
"""How often a loop measures how far behind the partitions' ends it reads: its /metrics
lag gauge, the one number an operator watches to see whether the aggregator keeps up.
Measured only at each durability cycle (every ``commit_interval_ms``, 30 s), the gauge was
up to that old and always taken right after the cycle's flush, when the read position is
furthest behind; one end-offsets request every 2 s keeps it current."""


class _Stage(Protocol):
    def assign(self, partition: int, ckpt: PartitionCheckpoint | None) -> int: ...
    def revoke(self, partition: int) -> None: ...
    def process(self, msgs: list[Message]) -> tuple[list[tuple[Message, str]], list[Any]]: ...
    def checkpoint(self, partition: int) -> PartitionCheckpoint: ...
    def open_windows(self) -> int: ...
    def pending_close(self) -> bool: ...


class _FolderStates:
    """Partition checkpoints in a folder, for a consumer group private to one instance (the
    same three calls as :class:`fleetpulse.changelog.Changelog`)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, tp: TopicPartition) -> Path:
        return self.folder / f"{tp[0]}-{int(tp[1])}.ckpt"

    async def ensure(self) -> None:
        await asyncio.to_thread(self.folder.mkdir, parents=True, exist_ok=True)

    async def load(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, bytes]:
        paths = {tp: self._path(tp) for tp in tps}
        return {tp: path.read_bytes() for tp, path in paths.items() if path.exists()}

    async def save(self, states: Mapping[TopicPartition, bytes]) -> None:
        """Every state written (old file or new, never half); StoreWriteError while the
        disk refuses (the cycle then commits nothing: see ``disk_health``)."""
        for tp, data in states.items():
            try:
                await asyncio.to_thread(atomic_write, self._path(tp), data)
            except OSError as exc:
                raise StoreWriteError(f"cannot write {self._path(tp)}: "
                                      f"{exc.strerror or exc}") from exc


class _Loop:
    """One consumer feeding one stage, with its rebalance listener."""

    def __init__(self, service: AggregatorService, stage: _Stage, topic: str, group: str,
                 partitions: int, state_dir: Path | None = None, name: str = "") -> None:
        self.service = service
        self.name = name or ("rack" if stage is service.rack else "row")
        """The ``stage`` label of its /metrics."""
        self.stage = stage
        self.topic = topic
        self.group = group
        self.changelog: Changelog | _FolderStates = (
            _FolderStates(state_dir) if state_dir is not None
            else Changelog(service.transport, f"{group}-changelog", partitions))
        """Where its partitions' checkpoints live: the group's changelog topic, or, for a
        group that is this instance's alone (the workload loops), a folder beside its data,
        so that the state is lost with the data it describes and replayed with it."""
        self.consumer: Consumer | None = None
        self.lag = 0
        self.owned: set[int] = set()
        self.cycles = 0
        self.cycle_s = {"flush": 0.0, "checkpoint": 0.0}
        """Wall seconds its durability cycles held the store thread, by step: while one
        runs, this loop reads nothing (at 31,000 GPUs x 1 Hz the read position jumps by
        10-20 s at each cycle), so its length is what an operator needs to see."""

    async def on_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        """Flush, checkpoint and commit, then forget the partitions -- whatever happens.

        If the commit fails (this member was already expelled, the broker is slow), the
        partitions are still forgotten: their next owner resumes from the older committed
        offset and the newest checkpoint, which skip consistently (see on_assigned).
        Keeping them would fold the redelivered messages in a second time.
        """
        mine = {p for t, p in revoked if t == self.topic}
        try:
            await self.service.durable(self, mine)
        except TransportError as exc:
            log.warning("could not commit %s before giving them up: %s", sorted(mine), exc)
        finally:
            self.owned.difference_update(mine)
            await self.service.in_store(self._revoke, sorted(mine))

    def _revoke(self, partitions: list[int]) -> None:
        for p in partitions:
            self.stage.revoke(p)

    async def on_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        """Restore each partition's checkpoint; no seek is needed.

        The consumer resumes at the committed offset, which the last durable cycle set to
        the checkpoint's resume offset (the checkpoint is written first, so at worst the
        committed offset is older: the stage then skips messages below its resume offset,
        whose effects are all in closed, stored windows). Calling the consumer from here
        is avoided on purpose: the callback may run while the consumer is still starting.
        """
        mine = sorted(p for t, p in assigned if t == self.topic)
        try:
            states = await self.changelog.load((self.topic, p) for p in mine)
        except ChangelogError as exc:
            # Replaying without the state would double count or drop windows: stop, loudly.
            log.error("partition state unusable, stopping: %s", exc)
            self.service.failed = True
            self.service.stop()
            return
        await self.service.in_store(self._assign, mine, states)
        self.owned.update(mine)

    def _assign(self, partitions: list[int], states: dict[TopicPartition, bytes]) -> None:
        for p in partitions:
            data = states.get((self.topic, p))
            self.stage.assign(p, checkpoint_from_bytes(data) if data is not None else None)


class AggregatorService:
    """Owns the store, the index, both stages and the HTTP server of one instance."""

    def __init__(self, cfg: AggregatorConfig, transport: Transport | None = None) -> None:
        self.cfg = cfg
        self.topics = Topics(cfg.transport.topic_prefix)
        data = Path(cfg.data_dir)
        data.mkdir(parents=True, exist_ok=True)
        self.store = SeriesStore(StoreConfig(path=str(data / "store"), fsync=cfg.fsync,
                                             compact_recode=cfg.compact_recode,
                                             compact_budget_s=cfg.compact_budget_s))
        self.index = EntityIndex(data / "entities.jsonl")
        self.store.before_write = self.index.drain
        self.transport = transport or open_transport(cfg.transport)
        self.rack = RackStage(self.store, self.index, topic=self.topics.samples,
                              lateness_ms=cfg.lateness_ms, raw=cfg.raw,
                              max_future_ms=cfg.max_future_ms)
        self.row = RowStage(self.store, self.index, topic=self.topics.rollups,
                            lateness_ms=cfg.row_lateness_ms, settle_ms=cfg.row_settle_ms)
        self.remote_write = None if not cfg.remote_write.url else RemoteWriter(
            cfg.remote_write, self.store, self.index,
            Path(cfg.remote_write.queue_dir or data / "remote_write"))
        if self.remote_write is not None:
            self.store.on_append = self.remote_write.offer
        self.table = AttributionTable(data / "attribution.jsonl")
        self.attribution = AttributionStage(self.table, topic=self.topics.events)
        self.alert_counts = AttributionStage(self.table, topic=self.topics.alerts, alerts=True)
        self.engine = QueryEngine(self.store, self.index, QueryLimits(
            cfg.max_points_per_series, cfg.max_series, cfg.lookback_ms, cfg.max_samples),
            now_fn=self.data_time,
            workloads=WorkloadQuery(self.table, self.store, self.index, cfg.max_series))
        own = f"http://{cfg.host_port[0]}:{cfg.host_port[1]}"
        self.peers = [Peer(url, cfg.bearer_token) for url in dict.fromkeys(cfg.peers)
                      if url.rstrip("/") != own]
        self.fleet: FleetEngine | None = None
        """The query API's engine when peers are configured: answers for every instance."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.loops = [_Loop(self, self.rack, self.topics.samples, cfg.group_id,
                            cfg.samples_partitions)]
        if cfg.row_stage:
            self.loops.append(_Loop(self, self.row, self.topics.rollups, f"{cfg.group_id}-rows",
                                    cfg.rollups_partitions))
        if cfg.workloads:
            # Every instance reads the whole events topic (a group of its own, named after its
            # data directory, checkpointed beside its store): a job's GPUs may sit on any
            # instance's racks, and attribution events are few.
            key = hashlib.sha1(str(data.resolve()).encode()).hexdigest()[:12]
            for stage, topic, name in ((self.attribution, self.topics.events, "workloads"),
                                       (self.alert_counts, self.topics.alerts,
                                        "workload-alerts")):
                self.loops.append(_Loop(self, stage, topic, f"{cfg.group_id}-{name}-{key}",
                                        cfg.samples_partitions, data / "workloads-state", name))
        self.dead_letters = 0
        self.disk = DiskHealth()
        self.rollups_published = 0
        self._pending: list[tuple[asyncio.Future[Any], bytes, bytes]] = []
        """Rollup sends not yet acknowledged: (future, value, key), re-sent on failure."""
        self._runner: web.AppRunner | None = None
        self.port: int | None = None
        self._stop = asyncio.Event()
        self.failed = False
        """Set when a consumer loop died; the command then exits with status 1."""
        self._retention_at = time.monotonic()
        self._store_thread = ThreadPoolExecutor(1, thread_name_prefix="aggregator-store")
        """Where the stages, the store and the index are used (module docstring)."""
        self.gauges: dict[str, Any] = {}
        """What /metrics shows of the stages and the store, as of the last scrape's refresh."""

    # ----------------------------------------------------------------- lifecycle
    async def start(self, serve_http: bool = True) -> None:
        warm_up()  # before joining any group: a compile must not stall heartbeats
        await self.transport.start()
        await self.transport.ensure_topics({
            self.topics.samples: self.cfg.samples_partitions,
            self.topics.rollups: self.cfg.rollups_partitions,
            self.topics.deadletter: 1,
            **({self.topics.events: self.cfg.samples_partitions,
                self.topics.alerts: self.cfg.samples_partitions} if self.cfg.workloads else {}),
        })
        for loop in self.loops:
            await loop.changelog.ensure()
            loop.consumer = self.transport.consumer([loop.topic], loop.group, listener=loop)
        self._loop = asyncio.get_running_loop()
        if self.peers:
            self.fleet = FleetEngine(self.store, self.index, self.engine.limits, self.peers,
                                     self._in_store_blocking, now_fn=self.data_time)
        if serve_http:
            app = build_query_app(self.fleet or self.engine, bearer_token=self.cfg.bearer_token,
                                  run=self._query_runner())
            add_peer_routes(app, self.index, self.store, self.in_store)
            self.mount_metrics(app)
            self._runner = JsonErrorRunner(app, access_log=None)
            await self._runner.setup()
            host, port = self.cfg.host_port
            site = web.TCPSite(self._runner, host, port)
            await site.start()
            server = getattr(site, "_server", None)
            socks = getattr(server, "sockets", None) or []
            self.port = socks[0].getsockname()[1] if socks else port

    def stop(self) -> None:
        self._stop.set()

    def _query_runner(self) -> Callable[[Callable[[], Any]], Any]:
        """Where the query API's engine calls run: the store thread for this instance's
        engine; a worker thread for the fleet engine, which waits on peers and reaches this
        store through :meth:`_in_store_blocking`."""
        if self.fleet is None:
            return self.in_store

        async def in_worker(fn: Callable[[], Any]) -> Any:
            return await asyncio.to_thread(fn)
        return in_worker

    def _in_store_blocking(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the store thread, called from another thread (the fleet engine's)."""
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(self.in_store(fn), self._loop).result()

    async def in_store(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the store thread (module docstring), awaited.

        Once submitted the call runs to its end even if the awaiting task is cancelled, and
        calls run in submission order, so no two of them ever overlap.
        """
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._store_thread, functools.partial(fn, *args))

    async def run(self) -> None:
        """Consume until :meth:`stop`; then make everything durable and leave the groups.

        The consumer loops stop between turns, not by cancellation: a turn cancelled after
        its batch was folded but before its rollups were sent would be checkpointed by the
        final cycle below with those rollups never published.
        """
        tasks = [asyncio.create_task(self._consume(loop)) for loop in self.loops]
        sender = (asyncio.create_task(self.remote_write.run())
                  if self.remote_write is not None else None)
        stopper = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
            self._stop.set()
            done |= set((await asyncio.wait(tasks))[0]) if tasks else set()
            for t in done:
                if t is not stopper and not t.cancelled() and t.exception() is not None:
                    # A consumer loop died (e.g. the broker refused a commit for too long).
                    # Exit non-zero: Kafka is the write-ahead log, a restart resumes exactly.
                    log.error("consumer loop failed: %r", t.exception())
                    self.failed = True
        finally:
            stopper.cancel()
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await t  # a failure was logged above
            for loop in self.loops:
                with contextlib.suppress(Exception):
                    await self.durable(loop, set(loop.owned))
                if loop.consumer is not None:
                    await loop.consumer.stop()
            if sender is not None and self.remote_write is not None:
                self.remote_write.stop()
                try:
                    await sender
                except Exception:  # its queue is on disk: the next start sends it
                    log.exception("remote write sender failed")
            await self.close()

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        await self.transport.close()
        if self.fleet is not None:
            self.fleet.close()
        closing = [self.index.close, self.table.close, self.store.close]
        if self.remote_write is not None:
            closing.append(self.remote_write.close)
        for close in closing:
            try:
                await self.in_store(close)
            except StoreWriteError as exc:  # a full disk at shutdown
                log.error("%s; what was not written is after the last committed offset and "
                          "is read again from Kafka at the next start", exc)
        self._store_thread.shutdown(wait=True)

    async def _consume(self, loop: _Loop) -> None:
        assert loop.consumer is not None
        last = lag_at = time.monotonic()
        interval = self.cfg.commit_interval_ms / 1000.0
        while not self._stop.is_set():
            msgs = await loop.consumer.getmany(timeout_ms=200, max_records=self.cfg.max_batch)
            if any(m.partition not in loop.owned for m in msgs):
                # Only partitions whose state was restored (a failed restore leaves some out).
                msgs = [m for m in msgs if m.partition in loop.owned]
            if msgs or loop.stage.pending_close():
                await self.handle(loop, msgs)
            if time.monotonic() - last >= interval:
                await self.durable(loop, set(loop.owned))
                last = time.monotonic()
                if loop.stage is self.rack and last - self._retention_at > 60.0:
                    self._retention_at = last
                    await self.in_store(self._enforce_retention)
            if time.monotonic() - lag_at >= LAG_REFRESH_S:
                await self._update_lag(loop)
                lag_at = time.monotonic()

    def _enforce_retention(self) -> None:
        now = self.data_time()
        if now is not None:
            self.store.enforce_retention(now)

    async def handle(self, loop: _Loop, msgs: list[Message]) -> None:
        """Fold a batch on the store thread, then dead-letter and publish what it gave."""
        dead, rollups = await self.in_store(self._process, loop.stage, msgs)
        for msg, reason in dead:
            await self.transport.dead_letter(self.topics.deadletter, msg, reason)
            self.dead_letters += 1
        for key, value in rollups:
            fut = await self.transport.send(self.topics.rollups, value, key=key)
            self._pending.append((fut, value, key))
            self.rollups_published += 1

    @staticmethod
    def _process(stage: _Stage, msgs: list[Message]
                 ) -> tuple[list[tuple[Message, str]], list[tuple[bytes, bytes]]]:
        """(Store thread) the stage's batch, its rollups encoded as (key, value)."""
        dead, rollups = stage.process(msgs)
        return dead, [((fr.row if fr.level == "rack" else fr.cluster).encode(),
                       encode_rollup(fr)) for fr in rollups]

    async def durable(self, loop: _Loop, partitions: Iterable[int]) -> None:
        """Steps 1-4 of the module docstring for ``partitions`` of ``loop``."""
        wanted = set(partitions)
        if self._pending:
            pending, self._pending = self._pending, []
            await self._acknowledged(pending)
        # Owned partitions are read only now, after the await: while the acknowledgements
        # were awaited, a rebalance callback (it may run whenever the consumer is not
        # holding a batch) can have revoked some, and their state is gone from the stage.
        # A revocation after this point is queued on the store thread behind this cycle.
        parts = sorted(p for p in wanted if p in loop.owned)
        done = await self.in_store(self._flush_and_checkpoint, loop,
                                   parts if loop.consumer is not None else [])
        if done is None:  # the disk refused: nothing checkpointed, nothing committed
            return
        offsets, states = done
        if offsets and loop.consumer is not None:
            what = f"{loop.name} partition states"
            try:
                await loop.changelog.save(states)
            except StoreWriteError as exc:  # a state folder on a full disk
                self.disk.refused(what, exc)
                return
            self.disk.took(what)
            await loop.consumer.commit_checkpointed(offsets)

    def _flush_and_checkpoint(self, loop: _Loop, parts: list[int]
                              ) -> tuple[dict[TopicPartition, int],
                                         dict[TopicPartition, bytes]] | None:
        """(Store thread) step 2 and the checkpoints of step 3: attribution table, index
        and store durable, the remote-write queue sealed (what is committed is in it), then
        each partition's checkpoint (resume offsets, serialised checkpoints).

        None, and nothing checkpointed (so nothing committed), when the disk refused a
        write (see ``disk_health``)."""
        writes = {"attribution table": self.table.flush, "entity index": self.index.flush,
                  "store": self.store.flush}
        if self.remote_write is not None:
            writes["remote-write queue"] = self.remote_write.seal
        t0 = time.monotonic()
        flushed = self.disk.flush(writes)
        t1 = time.monotonic()
        loop.cycle_s["flush"] += t1 - t0
        loop.cycles += 1
        if not flushed:
            return None
        offsets: dict[TopicPartition, int] = {}
        states: dict[TopicPartition, bytes] = {}
        for p in parts:
            ckpt = loop.stage.checkpoint(p)
            states[(loop.topic, p)] = checkpoint_bytes(ckpt)
            offsets[(loop.topic, p)] = ckpt.resume_offset
        loop.cycle_s["checkpoint"] += time.monotonic() - t1
        return offsets, states

    async def _acknowledged(self, pending: list[tuple[asyncio.Future[Any], bytes, bytes]],
                            attempts: int = 5) -> None:
        """Wait for every rollup send; re-send the ones that failed retriably.

        Offsets are committed only after this returns, so a rollup is never lost: after the
        last attempt the error propagates, the process exits, and a restart republishes.
        """
        for attempt in range(attempts):
            results = await asyncio.gather(*(f for f, _, _ in pending), return_exceptions=True)
            failed = [(p, r) for p, r in zip(pending, results, strict=True)
                      if isinstance(r, BaseException)]
            if not failed:
                return
            for _, err in failed:
                if not (isinstance(err, TransportError) and err.retriable) \
                        or attempt == attempts - 1:
                    raise err
            log.warning("re-sending %d rollups after: %s", len(failed), failed[0][1])
            await asyncio.sleep(min(2.0 ** attempt, 10.0))
            pending = [(await self.transport.send(self.topics.rollups, v, key=k), v, k)
                       for (_, v, k), _ in failed]

    async def behind(self) -> int:
        """Messages behind the partitions' ends, every loop, measured now (``lag`` is up to
        ``LAG_REFRESH_S`` old): what a caller waiting for a drain needs."""
        for loop in self.loops:
            await self._update_lag(loop)
        return sum(loop.lag for loop in self.loops)

    async def _update_lag(self, loop: _Loop) -> None:
        if loop.consumer is None or not loop.owned:
            loop.lag = 0
            return
        tps = [(loop.topic, p) for p in sorted(loop.owned)]
        try:
            ends = await loop.consumer.end_offsets(tps)
        except Exception:  # lag is best effort; a broker hiccup must not stop ingestion
            return
        parts = getattr(loop.stage, "parts", {})
        positions = {p: getattr(parts.get(p), "position", None) for _, p in tps}
        loop.lag = sum(max(0, ends.get(tp, 0) - pos)
                       for tp in tps if (pos := positions[tp[1]]) is not None)

    def data_time(self) -> int | None:
        """Newest sample time seen (ms), the clock that tier retention is measured on."""
        wms = [p.watermark for p in self.rack.parts.values() if p.watermark > 0]
        return max(wms) if wms else None

    # ----------------------------------------------------------------- metrics
    def store_bytes(self) -> int:
        root = Path(self.cfg.data_dir) / "store"
        return sum(f.stat().st_size for f in root.rglob("*.fps") if f.is_file())

    def _read_gauges(self) -> dict[str, Any]:
        """(Store thread) the gauges that walk the stages' and the store's state."""
        return {"open": [loop.stage.open_windows() for loop in self.loops],
                "catching_up": self.rack.catching_up(), "store_bytes": self.store_bytes(),
                "entities": len(self.index), "rewrites_pending": self.store.rewrites_pending,
                "rewrites_done": self.store.rewrites_done,
                "maintain_errors": self.store.maintain_errors}

    def mount_metrics(self, app: web.Application) -> None:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Collector(self))
        if self.remote_write is not None:
            registry.register(RemoteWriteCollector(self.remote_write))

        async def metrics(request: web.Request) -> web.Response:
            self.gauges = await self.in_store(self._read_gauges)
            return web.Response(body=generate_latest(registry),
                                headers={"Content-Type": "text/plain; version=0.0.4"})
        app.router.add_get("/metrics", metrics)

    def add_routes(self, app: web.Application) -> None:
        """Mount the query API and /metrics on another application (e.g. the web page's)."""
        add_query_routes(app, self.fleet or self.engine, run=self._query_runner())
        add_peer_routes(app, self.index, self.store, self.in_store)
        self.mount_metrics(app)


class _Collector(Collector):
    def __init__(self, svc: AggregatorService) -> None:
        self.svc = svc

    def collect(self) -> Iterable[Any]:
        s = self.svc
        st = s.rack.stats
        lag = GaugeMetricFamily("fleetpulse_aggregator_consumer_lag_messages",
                                "Messages behind the partitions' ends.", labels=["stage"])
        opened = GaugeMetricFamily("fleetpulse_aggregator_open_windows",
                                   "Windows waiting for their watermark.", labels=["stage"])
        owned = GaugeMetricFamily("fleetpulse_aggregator_partitions",
                                  "Partitions this instance owns.", labels=["stage"])
        g = s.gauges
        for i, loop in enumerate(s.loops):
            name = loop.name
            lag.add_metric([name], loop.lag)
            opened.add_metric([name], g["open"][i] if g else 0)
            owned.add_metric([name], len(loop.owned))
        yield lag
        yield opened
        yield owned
        cycles = CounterMetricFamily("fleetpulse_aggregator_durability_cycles",
                                     "Durability cycles (flush, checkpoints, commit) run.",
                                     labels=["stage"])
        held = CounterMetricFamily("fleetpulse_aggregator_durability_seconds",
                                   "Wall seconds durability cycles held the store thread, "
                                   "by step; the stage reads nothing meanwhile.",
                                   labels=["stage", "step"])
        for loop in s.loops:
            cycles.add_metric([loop.name], loop.cycles)
            for step, secs in loop.cycle_s.items():
                held.add_metric([loop.name, step], secs)
        yield cycles
        yield held
        late = CounterMetricFamily("fleetpulse_aggregator_late_samples",
                                   "Samples (or rollups) past their window's lateness; not "
                                   "rolled up.", labels=["stage"])
        late.add_metric(["rack"], st.late_samples)
        late.add_metric(["row"], s.row.late)
        yield late
        yield CounterMetricFamily("fleetpulse_aggregator_future_samples",
                                  "Samples stamped more than max_future_ms ahead of this "
                                  "host's clock (an agent's clock jumped); not rolled up.",
                                  value=st.future_samples)
        yield CounterMetricFamily("fleetpulse_aggregator_duplicate_frames",
                                  "Frames dropped as (agent, seq) duplicates.",
                                  value=st.duplicates)
        yield CounterMetricFamily("fleetpulse_aggregator_frames", "Frames rolled up.",
                                  value=st.frames)
        yield CounterMetricFamily("fleetpulse_aggregator_metrics",
                                  "Metric values rolled up.", value=st.metrics)
        yield CounterMetricFamily("fleetpulse_aggregator_dead_letters",
                                  "Messages sent to the dead-letter topic.",
                                  value=s.dead_letters)
        yield CounterMetricFamily("fleetpulse_aggregator_windows_closed",
                                  "Base windows closed and stored.",
                                  value=st.windows_closed + s.row.windows_closed)
        yield GaugeMetricFamily("fleetpulse_aggregator_tiers_catching_up",
                                "Partitions whose 1 min/1 h/1 d windows are still being read "
                                "back from the store after an assignment.",
                                value=g.get("catching_up", 0))
        yield CounterMetricFamily("fleetpulse_aggregator_store_write_errors",
                                  "Durability cycles whose flush the disk refused (full, "
                                  "read-only); nothing was checkpointed or committed.",
                                  value=s.disk.write_errors)
        yield GaugeMetricFamily("fleetpulse_aggregator_store_writable",
                                "0 while the store's disk refuses writes.",
                                value=1.0 if s.disk.writable else 0.0)
        yield GaugeMetricFamily("fleetpulse_aggregator_store_bytes",
                                "Bytes of the store's segment files.",
                                value=g.get("store_bytes", 0))
        yield GaugeMetricFamily("fleetpulse_aggregator_store_rewrites_pending",
                                "Finished segments whose compaction rewrite is under way, a "
                                "slice per flush (compact_budget_s); a count that keeps "
                                "growing means the budget is too small for the ingest.",
                                value=g.get("rewrites_pending", 0))
        yield CounterMetricFamily("fleetpulse_aggregator_store_rewrites",
                                  "Segments rewritten by compaction.",
                                  value=g.get("rewrites_done", 0))
        yield CounterMetricFamily("fleetpulse_aggregator_store_compaction_errors",
                                  "Compactions the disk refused (retried after "
                                  "maintain_retry_s; the data was durable already).",
                                  value=g.get("maintain_errors", 0))
        if s.fleet is not None:
            fs = s.fleet.stats
            yield CounterMetricFamily("fleetpulse_aggregator_fleet_queries",
                                      "Queries answered over every instance.", value=fs.queries)
            yield CounterMetricFamily("fleetpulse_aggregator_fleet_peer_errors",
                                      "Peer calls of fleet queries that failed (that peer's "
                                      "windows were left out of that answer).",
                                      value=fs.peer_errors)
            yield CounterMetricFamily("fleetpulse_aggregator_fleet_conflicts",
                                      "Points two instances hold with different values.",
                                      value=fs.conflicts)
        yield GaugeMetricFamily("fleetpulse_aggregator_entities",
                                "GPUs, nodes, racks, rows and clusters known.",
                                value=g.get("entities", 0))

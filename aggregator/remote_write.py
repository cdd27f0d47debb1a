"""Remote write out: chosen levels and tiers of the rollups, sent to a Prometheus
``remote_write`` receiver (VictoriaMetrics, Mimir, Thanos, Prometheus itself).

Why: an instance's store is its own disk; a copy in the user's long-term store outlives
it (a lost disk loses only the stored history, which the copy holds) and lets their own
tools read fleetpulse's rollups.

What is sent: every point the store takes for a chosen (level, tier) -- the store calls
:meth:`RemoteWriter.offer` from inside ``append`` -- as the query API's series (labels
``__name__``, ``agg`` and the entity's, plus ``tier``), stamped at the window's *end* as the
remote-read API does. Sketch buckets are not sent. Default: rack, row and cluster at 10 s,
GPUs at 1 min.

Delivery: points gather in memory (columns, no object per point) and are sealed into one
snappy-compressed ``WriteRequest`` per batch in a bounded on-disk queue (the agent's
:class:`~agent.spool.Spool`: checksummed, survives restarts, drops the oldest batch with a
counter when full). The service seals *before* it checkpoints and commits offsets, so a
crash loses nothing: what was not sealed is replayed from Kafka and written again (a
receiver keeps one sample per series and timestamp). A sender task posts the oldest batch
until the receiver takes it: 2xx acknowledges it, 429 and 5xx and network errors are
retried with exponential backoff, any other 4xx is a batch the receiver will never take
(counted as rejected, dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import aiohttp
import cramjam
import numpy as np
import numpy.typing as npt
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from agent.spool import Spool
from aggregator import prom_wire
from aggregator.series_index import EntityIndex
from aggregator.series_layout import AGG_CODES, AGG_NAMES, AGG_SLOTS, ENTITY_STRIDE, LEVELS
from aggregator.store import SeriesStore, StoreWriteError
from fleetpulse.config import ConfigError
from schemas.catalog import BY_ID

__all__ = ["RemoteWriteConfig", "RemoteWriter"]

log = logging.getLogger("fleetpulse.aggregator.remote_write")

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
_COUNT: Final = struct.Struct("<Q")
_NOT_SENT: Final = (AGG_CODES["sketch"],)


@dataclass(frozen=True, slots=True)
class RemoteWriteConfig:
    """``[remote_write]`` of the aggregator's config; off while ``url`` is empty."""

    url: str = ""
    """The receiver's endpoint, e.g. ``http://vm:8428/api/v1/write``."""
    series: tuple[str, ...] = ("rack:10s", "row:10s", "cluster:10s", "gpu:1m")
    """``level:tier`` pairs to send (levels gpu, node, rack, row, cluster; tiers of the store)."""
    queue_dir: str = ""
    """The on-disk queue; empty = ``<data_dir>/remote_write``."""
    queue_max_bytes: int = 256 << 20
    """Most bytes the queue holds; when full the oldest batch is dropped (and counted)."""
    batch_samples: int = 20_000
    """Samples per request at most (a seal may make a smaller one)."""
    timeout_s: float = 30.0
    """One request's time limit."""
    retry_initial_s: float = 0.5
    retry_max_s: float = 30.0
    bearer_token: str = ""
    """Sent as ``Authorization: Bearer ...`` when set."""

    def pairs(self) -> list[tuple[str, str]]:
        return [tuple(s.split(":", 1)) for s in self.series]  # type: ignore[misc]

    def validate(self) -> None:
        for item in self.series:
            level, _, tier = item.partition(":")
            if level not in LEVELS or not tier:
                raise ConfigError(f"remote_write.series: {item!r} is not level:tier with a level "
                                  f"of {list(LEVELS)}")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"remote_write.url must be http(s)://..., got {self.url!r}")
        if self.batch_samples < 1 or self.timeout_s <= 0:
            raise ConfigError("remote_write: batch_samples >= 1 and timeout_s > 0")
        if not 0 < self.retry_initial_s <= self.retry_max_s:
            raise ConfigError("remote_write: need 0 < retry_initial_s <= retry_max_s")


@dataclass(slots=True)
class _Stats:
    """Counters for /metrics (plain ints, read at scrape time)."""

    queued_samples: int = 0
    sent_samples: int = 0
    sent_batches: int = 0
    failed_requests: int = 0
    rejected_samples: int = 0
    pending: list[tuple[I64, I64, F64, int]] = field(default_factory=list)
    """(series ids, ts, values, tier index) not sealed yet, one entry per append."""
    pending_samples: int = 0


class RemoteWriter:
    """Takes the store's appends, queues them on disk, posts them to the receiver."""

    def __init__(self, cfg: RemoteWriteConfig, store: SeriesStore, index: EntityIndex,
                 queue_dir: Path) -> None:
        self.cfg = cfg
        self.store = store
        self.index = index
        self.queue = Spool(queue_dir, max_bytes=cfg.queue_max_bytes,
                           segment_bytes=max(64 << 10, cfg.queue_max_bytes // 16),
                           fsync="always")
        self.tiers = sorted({t for _, t in cfg.pairs()})
        for t in self.tiers:
            if t not in store.tiers:
                raise ConfigError(f"remote_write.series: no tier {t!r}; have {list(store.tiers)}")
        self._levels = {t: {lv for lv, tt in cfg.pairs() if tt == t} for t in self.tiers}
        self._width = {t: store.tiers[t].resolution_ms for t in self.tiers}
        self._lock = threading.Lock()
        """The queue and the pending columns: the store thread adds, the sender takes."""
        self.stats = _Stats()
        self._entity_blobs: dict[int, bytes] = {}
        self._name_blobs = {m: prom_wire.encode_labels([("__name__", BY_ID[m].name)])
                            for m in BY_ID}
        self._agg_blobs = {c: prom_wire.encode_labels([("agg", a)]) for c, a in AGG_NAMES.items()}
        self._tier_blobs = [prom_wire.encode_labels([("tier", t)]) for t in self.tiers]
        self._wake = asyncio.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        """The sender's loop: ``seal`` (store thread) wakes the sender through it."""
        self._stopping = False

    # ----------------------------------------------------------------- store thread
    def offer(self, tier: str, ids: I64, ts: I64, values: F64) -> None:
        """(Store thread, from ``SeriesStore.append``) keep the chosen series' points."""
        levels = self._levels.get(tier)
        if not levels:
            return
        level_of = self.index.codes("level", ids // ENTITY_STRIDE)
        chosen = [c for c in np.unique(level_of).tolist()
                  if self.index.value_of("level", c) in levels]
        wanted = np.isin(level_of, chosen) & ~np.isin(ids % AGG_SLOTS, _NOT_SENT)
        if not wanted.any():
            return
        cols = np.flatnonzero(wanted)
        v = values[:, cols]
        ok = ~np.isnan(v)
        n = int(np.count_nonzero(ok))
        if n == 0:
            return
        sids = np.broadcast_to(ids[cols], v.shape)[ok]
        stamps = np.broadcast_to((ts + self._width[tier])[:, None], v.shape)[ok]
        with self._lock:
            self.stats.pending.append((sids, stamps, v[ok], self.tiers.index(tier)))
            self.stats.pending_samples += n
            full = self.stats.pending_samples >= self.cfg.batch_samples
        if full:
            # a refused queue write keeps the points in memory; the cycle retries, says so
            with contextlib.suppress(StoreWriteError):
                self.seal()

    def seal(self) -> None:
        """(Store thread) everything offered so far into the on-disk queue, durable.

        The service calls it before each checkpoint: what was committed is queued. A disk
        that refuses the queue's write loses nothing: what did not go in waits in memory
        for the next call, and StoreWriteError tells the cycle not to commit.
        """
        with self._lock:
            pending, self.stats.pending = self.stats.pending, []
            self.stats.pending_samples = 0
        if not pending:
            return
        sids = np.concatenate([p[0] for p in pending])
        ts = np.concatenate([p[1] for p in pending])
        vals = np.concatenate([p[2] for p in pending])
        tier = np.concatenate([np.full(p[0].size, p[3], np.int64) for p in pending])
        order = np.lexsort((ts, sids, tier))
        sids, ts, vals, tier = sids[order], ts[order], vals[order], tier[order]
        step = self.cfg.batch_samples
        for a in range(0, sids.size, step):
            body = self._encode(sids[a:a + step], ts[a:a + step], vals[a:a + step],
                                tier[a:a + step])
            n = min(step, sids.size - a)
            with self._lock:
                try:
                    self.queue.append(_COUNT.pack(n), body)
                except OSError as exc:
                    for t in np.unique(tier[a:]).tolist():
                        m = np.flatnonzero(tier[a:] == t) + a
                        self.stats.pending.append((sids[m], ts[m], vals[m], int(t)))
                    self.stats.pending_samples += sids.size - a
                    raise StoreWriteError(f"cannot write the remote-write queue: "
                                          f"{exc.strerror or exc}") from exc
                self.stats.queued_samples += n
        if self._loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed: nothing to wake
                self._loop.call_soon_threadsafe(self._wake.set)

    def _encode(self, sids: I64, ts: I64, vals: F64, tier: I64) -> bytes:
        """One snappy WriteRequest; rows sorted by (tier, series, time)."""
        new = np.ones(sids.size, bool)
        new[1:] = (sids[1:] != sids[:-1]) | (tier[1:] != tier[:-1])
        starts = np.flatnonzero(new)
        offsets = np.append(starts, sids.size).astype(np.int64)
        first = sids[starts]
        eids, mids, codes = first // ENTITY_STRIDE, first % ENTITY_STRIDE // AGG_SLOTS, \
            first % AGG_SLOTS
        blobs: list[bytes] = []
        where: dict[tuple[str, int], int] = {}

        def slot(kind: str, k: int, make: Any) -> int:
            at = where.get((kind, k))
            if at is None:
                at = where[(kind, k)] = len(blobs)
                blobs.append(make(k))
            return at

        parts = np.empty((starts.size, 4), np.int64)
        for col, (kind, keys, make) in enumerate((
                ("name", mids, self._name_blobs.__getitem__),
                ("agg", codes, self._agg_blobs.__getitem__),
                ("entity", eids, self._entity_blob),
                ("tier", tier[starts], self._tier_blobs.__getitem__))):
            uniq, inv = np.unique(keys, return_inverse=True)
            at = np.asarray([slot(kind, int(k), make) for k in uniq.tolist()], np.int64)
            parts[:, col] = at[inv.reshape(-1)]
        raw = prom_wire.series_blocks(blobs, parts, ts, vals, offsets)
        return bytes(cramjam.snappy.compress_raw(raw))

    def _entity_blob(self, eid: int) -> bytes:
        blob = self._entity_blobs.get(eid)
        if blob is None:
            blob = self._entity_blobs[eid] = prom_wire.encode_labels(
                sorted(self.index.labels(eid).items()))
        return blob

    # ----------------------------------------------------------------- sender
    async def run(self) -> None:
        """Post queued batches in order until :meth:`stop`; retries forever with backoff."""
        headers = {"Content-Encoding": "snappy", "Content-Type": "application/x-protobuf",
                   "X-Prometheus-Remote-Write-Version": "0.1.0",
                   "User-Agent": "fleetpulse-aggregator"}
        if self.cfg.bearer_token:
            headers["Authorization"] = f"Bearer {self.cfg.bearer_token}"
        self._loop = asyncio.get_running_loop()
        backoff = self.cfg.retry_initial_s
        timeout = aiohttp.ClientTimeout(total=self.cfg.timeout_s)
        async with aiohttp.ClientSession(timeout=timeout, headers=headers) as session:
            while not self._stopping:
                with self._lock:
                    recs = self.queue.read(max_records=1)
                if not recs:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), 1.0)
                    continue
                rec = recs[0]
                n = _COUNT.unpack(rec.key or bytes(8))[0]
                status = await self._post(session, rec.value)
                with self._lock:
                    if status is not None and (200 <= status < 300 or (
                            400 <= status < 500 and status != 429)):
                        self.queue.ack(rec)
                        self.queue.commit()
                        if status < 300:
                            self.stats.sent_samples += n
                            self.stats.sent_batches += 1
                        else:
                            self.stats.rejected_samples += n
                            log.error("remote write: %s refused a batch of %d samples with "
                                      "HTTP %d; dropped", self.cfg.url, n, status)
                        backoff = self.cfg.retry_initial_s
                        continue
                    self.queue.rewind()
                    self.stats.failed_requests += 1
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, self.cfg.retry_max_s)

    async def _post(self, session: aiohttp.ClientSession, body: bytes) -> int | None:
        try:
            async with session.post(self.cfg.url, data=body) as r:
                await r.read()
                return r.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("remote write to %s failed: %s", self.cfg.url, exc)
            return None

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()

    def close(self) -> None:
        with self._lock:
            self.queue.close()

    # ----------------------------------------------------------------- metrics
    def collect(self) -> Iterable[Any]:
        s, q = self.stats, self.queue.stats
        yield CounterMetricFamily("fleetpulse_remote_write_queued_samples",
                                  "Samples put in the remote-write queue.",
                                  value=s.queued_samples)
        yield CounterMetricFamily("fleetpulse_remote_write_sent_samples",
                                  "Samples the receiver acknowledged.", value=s.sent_samples)
        yield CounterMetricFamily("fleetpulse_remote_write_sent_batches",
                                  "Requests the receiver acknowledged.", value=s.sent_batches)
        yield CounterMetricFamily("fleetpulse_remote_write_failed_requests",
                                  "Requests that failed (network, 429, 5xx) and were retried.",
                                  value=s.failed_requests)
        yield CounterMetricFamily("fleetpulse_remote_write_rejected_samples",
                                  "Samples in batches the receiver refused with a 4xx; dropped.",
                                  value=s.rejected_samples)
        yield CounterMetricFamily("fleetpulse_remote_write_dropped_batches",
                                  "Oldest batches dropped because the queue was full.",
                                  value=q.dropped_frames)
        yield GaugeMetricFamily("fleetpulse_remote_write_queue_bytes",
                                "Bytes of the on-disk queue not yet acknowledged.",
                                value=q.pending_bytes)
        yield GaugeMetricFamily("fleetpulse_remote_write_queue_batches",
                                "Batches in the on-disk queue not yet acknowledged.",
                                value=q.pending_frames)


class RemoteWriteCollector(Collector):
    """The writer's counters for a prometheus_client registry."""

    def __init__(self, writer: RemoteWriter) -> None:
        self.writer = writer

    def collect(self) -> Iterable[Any]:
        return self.writer.collect()

"""One query API for the whole fleet: every instance's store read as one.

Why at the store read and not by merging answers: a point of a query's output merges the
windows of its step (sums add, min and max take extremes, ``avg`` is sum over count,
quantiles merge sketches), and after a rebalance the windows of one step can lie in two
instances' stores. Merging two instances' *answers* would get ``avg`` and the quantiles
wrong; merging their *stored points* before the engine reduces them is exact. So a fleet
query runs the ordinary :class:`~aggregator.query_engine.QueryEngine` over

- a fleet entity index: the union of every instance's entities (each numbers its own), and
- a :class:`FleetStore` whose ``read`` asks every instance (this one on its store thread,
  the peers over HTTP, ``/api/v1/internal/read``) for the points of the same series, named
  by entity key, and merges them per series in time order.

A stored window is written whole by one instance (a partition's running windows travel in
its checkpoint, see :mod:`aggregator.tier_chain`), so two instances hold either different
windows of a series or the same window with the same bits (the replay of a crash); the
merge keeps one of equal timestamps and counts those whose values differ
(``conflicts``, which should stay 0). A peer that does not answer is left out of that
query (its windows are missing from the answer) and counted; the query still succeeds.

Peers are the configured ``peers`` (query API addresses of the group's instances; this
instance's own address is skipped).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar, cast

import numpy as np
import numpy.typing as npt
import orjson
from aiohttp import web

from aggregator.handover import array_from_json, array_to_json
from aggregator.query_engine import QueryEngine, QueryLimits, SeriesResult
from aggregator.series_index import EntityIndex, EntityKey
from aggregator.series_layout import ENTITY_STRIDE
from aggregator.store import ReadResult, SeriesStore, TierSpec

__all__ = ["FleetEngine", "Peer", "add_peer_routes", "entity_table", "read_keyed"]

log = logging.getLogger("fleetpulse.aggregator")
T = TypeVar("T")
I64 = npt.NDArray[np.int64]
ENTITIES_PATH: Final = "/api/v1/internal/entities"
READ_PATH: Final = "/api/v1/internal/read"
KEYS_PER_REQUEST: Final = 4_000
"""Entities named in one peer read: keeps its JSON body under the API's 1 MiB limit."""

LocalRunner = Callable[[Callable[[], T]], T]
"""Runs ``fn`` on this instance's store thread and returns its result (blocking)."""


def entity_table(index: EntityIndex) -> dict[str, Any]:
    """Every entity of ``index`` with the metrics it has series of (for a fleet index)."""
    n = len(index)
    return {"keys": [list(k) for k in index.keys],
            "metrics": array_to_json(np.packbits(index.metrics[:n], axis=1)),
            "width": int(index.metrics.shape[1])}


def _merge_table(into: EntityIndex, table: Mapping[str, Any]) -> None:
    keys = table["keys"]
    if not keys:
        return
    bits = array_from_json(table["metrics"], np.uint8).reshape(len(keys), -1)
    metrics = np.unpackbits(bits, axis=1, count=int(table["width"])).astype(bool)
    for key, row in zip(keys, metrics, strict=True):
        eid = into.add(cast(EntityKey, tuple(key)))
        into.add_metrics([eid], np.flatnonzero(row).tolist())


def read_keyed(index: EntityIndex, store: SeriesStore, tier: str, keys: Sequence[EntityKey],
               which: I64, rest: I64, start_ms: int, end_ms: int) -> ReadResult:
    """(Store thread) points of series ``keys[which[i]]`` + ``rest[i]`` in this store, in
    request order; a series whose entity this instance never met is empty."""
    local = np.asarray([-1 if (e := index.get(k)) is None else e for k in keys], np.int64)
    eids = local[which] if which.size else np.zeros(0, np.int64)
    known = eids >= 0
    sids = np.where(known, eids * ENTITY_STRIDE + rest, -1)
    got = store.read(tier, sids[known], start_ms, end_ms)
    if known.all():
        return got
    counts = np.zeros(sids.size, np.int64)
    counts[known] = np.diff(got.offsets)
    offsets = np.zeros(sids.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return ReadResult(sids, offsets, got.ts, got.values)


@dataclass(slots=True)
class Peer:
    """Another instance's query API, read over HTTP with the shared bearer token."""

    base_url: str
    token: str = ""
    timeout_s: float = 30.0

    def _call(self, path: str, body: bytes | None = None) -> Any:
        req = urllib.request.Request(self.base_url.rstrip("/") + path, data=body,
                                     method="POST" if body is not None else "GET")
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
            return orjson.loads(resp.read())["data"]

    def entities(self) -> dict[str, Any]:
        return cast(dict[str, Any], self._call(ENTITIES_PATH))

    def read(self, tier: str, keys: Sequence[EntityKey], which: I64, rest: I64,
             start_ms: int, end_ms: int) -> ReadResult:
        data = self._call(READ_PATH, orjson.dumps({
            "tier": tier, "start": start_ms, "end": end_ms, "keys": [list(k) for k in keys],
            "which": array_to_json(which.astype(np.int32)), "rest": array_to_json(rest)}))
        return ReadResult(np.zeros(which.size, np.int64),
                          array_from_json(data["offsets"], np.int64),
                          array_from_json(data["ts"], np.int64),
                          array_from_json(data["values"], np.float64))


@dataclass(slots=True)
class FleetStats:
    """Counters for /metrics."""

    queries: int = 0
    peer_errors: int = 0
    conflicts: int = 0
    """Points two instances both hold with different values (kept: the first)."""


def _merge_reads(n: int, parts: list[ReadResult], stats: FleetStats) -> ReadResult:
    """Per series, the points of every part in time order, one per timestamp."""
    if len(parts) == 1:
        return parts[0]
    series = np.concatenate([np.repeat(np.arange(n), np.diff(p.offsets)) for p in parts])
    ts = np.concatenate([p.ts for p in parts])
    vals = np.concatenate([p.values for p in parts])
    order = np.lexsort((ts, series))  # stable: the first part wins among equal timestamps
    series, ts, vals = series[order], ts[order], vals[order]
    dup = np.zeros(ts.size, bool)
    dup[1:] = (series[1:] == series[:-1]) & (ts[1:] == ts[:-1])
    if dup.any():
        prev = np.flatnonzero(dup) - 1
        a, b = vals[prev], vals[dup]
        differ = (a != b) & ~(np.isnan(a) & np.isnan(b))
        stats.conflicts += int(np.count_nonzero(differ))
    keep = ~dup
    counts = np.bincount(series[keep], minlength=n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    return ReadResult(np.zeros(n, np.int64), offsets, ts[keep], vals[keep])


@dataclass(slots=True)
class FleetStore:
    """What the query engine reads through: this instance's and every peer's points."""

    tiers: Mapping[str, TierSpec]
    index: EntityIndex
    """The fleet index the query's series ids refer to."""
    local: Callable[[str, list[EntityKey], I64, I64, int, int], ReadResult]
    peers: Sequence[Peer]
    stats: FleetStats
    pool: concurrent.futures.Executor
    skipped: set[str] = field(default_factory=set)

    def read(self, tier: str, series_ids: npt.ArrayLike, start_ms: int, end_ms: int
             ) -> ReadResult:
        sids = np.ascontiguousarray(series_ids, dtype=np.int64).reshape(-1)
        eids, rest = np.divmod(sids, ENTITY_STRIDE)
        uniq, which = np.unique(eids, return_inverse=True)
        # Batches of whole entities, each read from every instance.
        bounds = [*range(0, uniq.size, KEYS_PER_REQUEST), uniq.size]
        pieces: list[ReadResult] = []
        for lo, hi in itertools.pairwise(bounds):
            sel = np.flatnonzero((which >= lo) & (which < hi))
            keys = [self.index.keys[int(e)] for e in uniq[lo:hi].tolist()]
            w, r = (which[sel] - lo).astype(np.int64), rest[sel]
            futures = [self.pool.submit(p.read, tier, keys, w, r, start_ms, end_ms)
                       for p in self.peers if p.base_url not in self.skipped]
            got = [self.local(tier, keys, w, r, start_ms, end_ms)]
            for peer, fut in zip([p for p in self.peers if p.base_url not in self.skipped],
                                 futures, strict=True):
                try:
                    got.append(fut.result())
                except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
                    self.stats.peer_errors += 1
                    self.skipped.add(peer.base_url)
                    log.warning("peer %s left out of a fleet query: %s", peer.base_url, exc)
            pieces.append(_with_order(sel, _merge_reads(sel.size, got, self.stats)))
        return _assemble(sids, pieces)


def _with_order(sel: I64, r: ReadResult) -> ReadResult:
    return ReadResult(sel.astype(np.int64), r.offsets, r.ts, r.values)


def _assemble(sids: I64, parts: list[ReadResult]) -> ReadResult:
    """Batches (``series_ids`` = positions in the request) back in request order."""
    if len(parts) == 1 and np.array_equal(parts[0].series_ids, np.arange(sids.size)):
        return ReadResult(sids, parts[0].offsets, parts[0].ts, parts[0].values)
    counts = np.zeros(sids.size, np.int64)
    ts_parts: dict[int, tuple[I64, npt.NDArray[np.float64]]] = {}
    for p in parts:
        for i, pos in enumerate(p.series_ids.tolist()):
            a, b = int(p.offsets[i]), int(p.offsets[i + 1])
            counts[pos] = b - a
            ts_parts[pos] = (p.ts[a:b], p.values[a:b])
    offsets = np.zeros(sids.size + 1, np.int64)
    np.cumsum(counts, out=offsets[1:])
    ts = np.concatenate([ts_parts[i][0] for i in range(sids.size) if i in ts_parts]
                        or [np.zeros(0, np.int64)])
    vals = np.concatenate([ts_parts[i][1] for i in range(sids.size) if i in ts_parts]
                          or [np.zeros(0)])
    return ReadResult(sids, offsets, ts, vals)


class FleetEngine(QueryEngine):
    """The query engine over every instance (module docstring); same methods and answers
    as :class:`QueryEngine`, each call on a fresh fleet index."""

    def __init__(self, store: SeriesStore, index: EntityIndex, limits: QueryLimits,
                 peers: Sequence[Peer], run_local: LocalRunner[Any],
                 now_fn: Callable[[], int | None] | None = None) -> None:
        super().__init__(store, index, limits, now_fn)
        self.peers = list(peers)
        self.run_local = run_local
        self.stats = FleetStats()
        self._pool = concurrent.futures.ThreadPoolExecutor(max(1, len(self.peers)),
                                                           thread_name_prefix="fleet-peer")

    def _view(self) -> QueryEngine:
        fleet = EntityIndex(None)
        _merge_table(fleet, self.run_local(lambda: entity_table(self.index)))
        skipped: set[str] = set()
        for peer in self.peers:
            try:
                _merge_table(fleet, peer.entities())
            except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
                self.stats.peer_errors += 1
                skipped.add(peer.base_url)
                log.warning("peer %s left out of a fleet query: %s", peer.base_url, exc)
        self.stats.queries += 1
        local_store = self.store

        def local(tier: str, keys: list[EntityKey], which: I64, rest: I64, start: int,
                  end: int) -> ReadResult:
            return cast(ReadResult, self.run_local(lambda: read_keyed(
                self.index, local_store, tier, keys, which, rest, start, end)))

        now = self.run_local(self.now_fn) if self.now_fn is not None else None
        view = FleetStore(self.store.tiers, fleet, local, self.peers, self.stats, self._pool,
                          skipped)
        return QueryEngine(cast(SeriesStore, view), fleet, self.limits, lambda: now)

    def query_range(self, query: str, start_ms: int, end_ms: int, step_ms: int,
                    resolution: str | None = None, now_ms: int | None = None) -> SeriesResult:
        return self._view().query_range(query, start_ms, end_ms, step_ms, resolution, now_ms)

    def query_instant(self, query: str, time_ms: int,
                      resolution: str | None = None) -> SeriesResult:
        return self._view().query_instant(query, time_ms, resolution)

    def series(self, selectors: list[str]) -> list[dict[str, str]]:
        return self._view().series(selectors)

    def label_names(self) -> list[str]:
        return self._view().label_names()

    def label_values(self, name: str) -> list[str]:
        return self._view().label_values(name)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def add_peer_routes(app: web.Application, index: EntityIndex, store: SeriesStore,
                    run: Callable[[Callable[[], Any]], Any]) -> None:
    """The two routes a fleet query reads a peer through (under ``/api/``, so behind the
    same bearer token; errors in the API's JSON shape)."""
    from aggregator.http_errors import error_response

    async def entities(request: web.Request) -> web.Response:
        table = await run(lambda: entity_table(index))
        return web.json_response({"status": "success", "data": table}, dumps=_dumps)

    async def read(request: web.Request) -> web.Response:
        try:
            body = orjson.loads(await request.read())
            tier = str(body["tier"])
            if tier not in store.tiers:
                return error_response(400, f"unknown tier {tier!r}", "bad_data")
            keys = [cast(EntityKey, tuple(str(v) for v in k)) for k in body["keys"]]
            if any(len(k) != 6 for k in keys):
                return error_response(400, "an entity key has 6 labels", "bad_data")
            which = array_from_json(body["which"], np.int32).astype(np.int64)
            rest = array_from_json(body["rest"], np.int64)
            if which.size != rest.size or (which.size and (which.min() < 0
                                                           or which.max() >= len(keys))):
                return error_response(400, "which and rest must pair up with keys", "bad_data")
            start, end = int(body["start"]), int(body["end"])
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            return error_response(400, f"bad internal read request: {exc}", "bad_data")
        got = await run(lambda: read_keyed(index, store, tier, keys, which, rest, start, end))
        return web.json_response({"status": "success", "data": {
            "offsets": array_to_json(got.offsets), "ts": array_to_json(got.ts),
            "values": array_to_json(got.values)}}, dumps=_dumps)

    app.router.add_get(ENTITIES_PATH, entities)
    app.router.add_post(READ_PATH, read)


def _dumps(obj: Any) -> str:
    return orjson.dumps(obj).decode()

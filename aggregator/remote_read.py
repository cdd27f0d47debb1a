"""Prometheus' remote-read API (``POST /api/v1/read``) over one aggregator's store and tiers.

Why: the query API speaks a PromQL subset over one instance. A real Prometheus with one
``remote_read`` entry per aggregator instance evaluates full PromQL (``rate``, ``topk``,
``*_over_time``, binary operators) over the whole fleet; this module is what each instance
answers it with.

Request: a snappy-compressed ``prompb.ReadRequest``. Answer, by the first type in
``accepted_response_types`` that is served (SAMPLES when the list is empty):

- ``SAMPLES``: one snappy-compressed ``ReadResponse`` (``application/x-protobuf``);
- ``STREAMED_XOR_CHUNKS``: a stream of CRC-framed ``ChunkedReadResponse`` messages, one
  series after another in label order, each frame at most :data:`MAX_FRAME_BYTES`, the
  samples in Prometheus' XOR chunks (:mod:`aggregator.prom_wire`).

What a series is: the query API's series (labels ``__name__``, ``level``, cluster, row,
rack, node, gpu, ``agg``), its samples the windows of one tier stamped at their *end*
(the value is known then; the query API's ``query_range`` at step = window puts the same
value at the same time), or the raw samples at their own times when the selector asks for
``agg="raw"``. The tier is the URL's ``resolution`` parameter when given (the
``remote_read`` URL can carry it), else raw for ``agg="raw"``, else the coarsest tier at
most the query's step and a fifth of its range selector (Prometheus' read hints), never
finer than 10 s.

A series request (``/api/v1/series``, label values: read hint ``func="series"``) gets the
series without samples, however long its range. A matcher on a label fleetpulse does not have compares against the empty string, as in
Prometheus (``{job=""}`` selects everything, ``{job="x"}`` nothing). The query API's limits
hold (series per query, samples per query: a 422) and errors have its JSON shape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final

import cramjam
import numpy as np
import numpy.typing as npt
from aiohttp import web

from aggregator import prom_wire
from aggregator.prompb import LabelMatcher, ReadRequest
from aggregator.promql import Selector
from aggregator.query_engine import QueryEngine, QueryError
from aggregator.series_index import compile_matcher, value_matches
from aggregator.series_layout import AGG_CODES, AGG_SLOTS, ENTITY_STRIDE

__all__ = ["MAX_DECODED_BYTES", "MAX_FRAME_BYTES", "MAX_QUERIES", "ReadSeries", "answer",
           "read_query"]

I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]
Run = Callable[[Callable[[], Any]], Awaitable[Any]]

MAX_DECODED_BYTES: Final = 8 << 20
"""Largest request once decompressed (a request is matchers and times: kilobytes)."""
MAX_QUERIES: Final = 64
"""Queries per request (Prometheus sends one per selector); the same bound as match[]."""
MAX_FRAME_BYTES: Final = 1 << 20
"""Largest streamed frame, Prometheus' own default (``--storage.remote.read-max-bytes-in-frame``)."""
_OPS: Final = {LabelMatcher.EQ: "=", LabelMatcher.NEQ: "!=", LabelMatcher.RE: "=~",
               LabelMatcher.NRE: "!~"}
_LABELS: Final = ("__name__", "agg", "level", "cluster", "row", "rack", "node", "gpu")
_SAMPLES: Final = ReadRequest.SAMPLES
_STREAMED: Final = ReadRequest.STREAMED_XOR_CHUNKS
_STREAM_TYPE: Final = "application/x-streamed-protobuf; proto=prometheus.ChunkedReadResponse"
_MIN_AUTO_MS: Final = 10_000


@dataclass(slots=True)
class ReadSeries:
    """One query's answer in CSR form: series ``i`` is ``ts[offsets[i]:offsets[i+1]]``."""

    labels: list[tuple[tuple[str, str], ...]]
    """sorted by name; the series sorted by labels"""
    offsets: I64
    ts: I64
    values: F64


def decode_request(body: bytes) -> Any:
    """A snappy-compressed ReadRequest, with the limits checked before decompressing."""
    size, shift = 0, 0
    for i, byte in enumerate(body[:10]):
        size |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            break
        if i == 9:
            raise QueryError("remote read body is not snappy-compressed")
    if size > MAX_DECODED_BYTES:
        raise QueryError(f"remote read request of {size} bytes decompressed is larger than "
                         f"the limit of {MAX_DECODED_BYTES}")
    try:
        raw = bytes(cramjam.snappy.decompress_raw(body))
    except Exception as exc:  # cramjam raises its own DecompressionError
        raise QueryError(f"remote read body is not snappy-compressed: {exc}") from None
    try:
        req = ReadRequest.FromString(raw)
    except Exception as exc:  # protobuf's DecodeError
        raise QueryError(f"remote read body is not a prometheus.ReadRequest: {exc}") from None
    if len(req.queries) > MAX_QUERIES:
        raise QueryError(f"{len(req.queries)} queries in one remote read, more than the limit "
                         f"of {MAX_QUERIES}")
    return req


def _selector(query: Any) -> Selector | None:
    """The query's matchers as a selector; None when one can match no fleetpulse series."""
    out = []
    for m in query.matchers:
        op = _OPS.get(m.type)
        if op is None:
            raise QueryError(f"unknown matcher type {m.type}")
        try:
            rx = compile_matcher(op, m.value)
        except ValueError as exc:
            raise QueryError(str(exc)) from None
        if m.name in _LABELS:
            out.append((m.name, op, m.value))
        elif not value_matches(op, m.value, "", rx):
            return None
    return Selector(tuple(out))


def _tier(engine: QueryEngine, sel: Selector, query: Any, resolution: str | None) -> str:
    if resolution and resolution != "auto":
        return engine.choose_tier(0, 0, 0, resolution)
    if ("agg", "=", "raw") in sel.matchers:
        return "raw"
    hints = query.hints
    want = hints.step_ms if hints.step_ms > 0 else 1 << 62
    if hints.range_ms > 0:
        want = min(want, hints.range_ms // 5)
    if want == 1 << 62:
        want = max(query.end_timestamp_ms - query.start_timestamp_ms, 0) // 100
    start = query.start_timestamp_ms
    now = engine.now_fn() if engine.now_fn else None
    now = query.end_timestamp_ms if now is None else now
    return engine.choose_tier(max(want, _MIN_AUTO_MS), start, now, None)


def read_query(engine: QueryEngine, query: Any, resolution: str | None = None) -> ReadSeries:
    """(Store thread) One remote-read query's series and samples."""
    start, end = int(query.start_timestamp_ms), int(query.end_timestamp_ms)
    sel = _selector(query)
    empty = ReadSeries([], np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0))
    if sel is None or end < start:
        return empty
    tier = _tier(engine, sel, query, resolution)
    if query.hints.func == "series":  # /api/v1/series, label values: no samples needed
        res = engine.resolve(sel, tier)
        return _sorted(engine.labels_of(res), np.zeros(res.eids.size, np.int64),
                       np.zeros(0, np.int64), np.zeros(0), keep_empty=True)
    spec = engine.store.tiers[tier]
    now = engine.now_fn() if engine.now_fn else None
    if now is not None and spec.retention_ms:
        start = max(start, now - spec.retention_ms)  # nothing older is kept
    limit = engine.limits.max_samples
    if tier == "raw" and ("agg", "=", "raw") in sel.matchers:
        res = engine.resolve(sel, "raw")
        sids = res.eids * ENTITY_STRIDE + res.mids * AGG_SLOTS + AGG_CODES["raw"]
        r = engine.store.read("raw", sids, start, end + 1)
        ok = ~np.isnan(r.values)  # NaN in the raw tier: not sampled at that tick
        kept = np.zeros(ok.size + 1, np.int64)
        np.cumsum(ok, out=kept[1:])
        counts = kept[r.offsets[1:]] - kept[r.offsets[:-1]]
        labels, ts, values = engine.labels_of(res), r.ts[ok], r.values[ok]
    else:
        width = spec.resolution_ms or 1000
        first = -(-start // width) * width
        n = (end - end % width - first) // width + 1
        if n <= 0:
            return empty
        grid = engine.evaluate(sel, tier, first, width, int(n))
        ok = ~np.isnan(grid.values)
        counts = ok.sum(axis=1)
        times = first + width * np.arange(n, dtype=np.int64)
        labels = grid.labels
        ts = np.broadcast_to(times, grid.values.shape)[ok]
        values = grid.values[ok]
    if ts.size > limit:
        raise QueryError(f"remote read would return {ts.size} samples, more than the limit of "
                         f"{limit}; narrow the selector or the time range", "execution")
    return _sorted(labels, counts.astype(np.int64), ts, values)


def _sorted(labels: list[dict[str, str]], counts: I64, ts: I64, values: F64,
            keep_empty: bool = False) -> ReadSeries:
    """Series with samples only (unless ``keep_empty``), labels sorted by name, series by
    labels (TSDB order)."""
    starts = np.zeros(counts.size + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    keyed = sorted((tuple(sorted(lab.items())), i) for i, lab in enumerate(labels)
                   if keep_empty or counts[i] > 0)
    order = np.fromiter((i for _, i in keyed), np.int64, len(keyed))
    kept = counts[order]
    offsets = np.zeros(order.size + 1, np.int64)
    np.cumsum(kept, out=offsets[1:])
    idx = np.repeat(starts[order] - offsets[:-1], kept) + np.arange(int(offsets[-1]))
    return ReadSeries([k for k, _ in keyed], offsets, ts[idx], values[idx])


def samples_response(results: list[ReadSeries]) -> web.Response:
    parts = []
    for res in results:
        blobs = [prom_wire.encode_labels(lab) for lab in res.labels]
        each = np.arange(len(blobs), dtype=np.int64)[:, None]
        parts.append(prom_wire.field(1, prom_wire.series_blocks(blobs, each, res.ts, res.values,
                                                                res.offsets)))
    body = bytes(cramjam.snappy.compress_raw(b"".join(parts)))
    return web.Response(body=body, headers={"Content-Type": "application/x-protobuf",
                                            "Content-Encoding": "snappy"})


def chunked_frames(results: list[ReadSeries], max_frame: int = MAX_FRAME_BYTES) -> list[bytes]:
    """Every query's series as streamed frames; a frame holds whole chunks of one series."""
    frames = []
    for qi, res in enumerate(results):
        tail = b"" if qi == 0 else b"\x10" + prom_wire.uvarint(qi)
        data, bounds, first, per_series = prom_wire.xor_chunks(res.ts, res.values, res.offsets)
        ts = res.ts
        for s, lab in enumerate(res.labels):
            head = prom_wire.encode_labels(lab)
            chunks: list[bytes] = []
            size = len(head)
            for c in range(per_series[s], per_series[s + 1]):
                body = (b"\x08" + prom_wire.uvarint(int(ts[first[c]]))
                        + b"\x10" + prom_wire.uvarint(int(ts[first[c + 1] - 1]))
                        + b"\x18\x01" + prom_wire.field(4, data[bounds[c]:bounds[c + 1]]))
                chunk = prom_wire.field(2, body)
                if chunks and size + len(chunk) > max_frame:
                    frames.append(prom_wire.frame(prom_wire.field(1, head + b"".join(chunks))
                                                  + tail))
                    chunks, size = [], len(head)
                chunks.append(chunk)
                size += len(chunk)
            frames.append(prom_wire.frame(prom_wire.field(1, head + b"".join(chunks)) + tail))
    return frames


async def answer(request: web.Request, engine: QueryEngine, run: Run,
                 params: dict[str, list[str]]) -> web.StreamResponse:
    """The handler's work: decode, read on the store thread, encode the chosen type."""
    req = decode_request(await request.read())
    kinds = list(req.accepted_response_types) or [_SAMPLES]
    kind = next((k for k in kinds if k in (_SAMPLES, _STREAMED)), None)
    if kind is None:
        raise QueryError(f"none of the accepted response types {kinds} is served; "
                         "SAMPLES (0) and STREAMED_XOR_CHUNKS (1) are")
    resolution = params.get("resolution", [None])[-1]
    queries = list(req.queries)
    results: list[ReadSeries] = await run(
        lambda: [read_query(engine, q, resolution) for q in queries])
    total = sum(int(r.ts.size) for r in results)
    if total > engine.limits.max_samples:
        raise QueryError(f"remote read would return {total} samples, more than the limit of "
                         f"{engine.limits.max_samples}", "execution")
    if kind == _SAMPLES:
        return samples_response(results)
    resp = web.StreamResponse(headers={"Content-Type": _STREAM_TYPE})
    await resp.prepare(request)
    for f in chunked_frames(results):
        await resp.write(f)
    await resp.write_eof()
    return resp

"""Prometheus' remote-read API of the aggregator, read by a real Prometheus.

Two aggregator instances (each with its own store: the even and the odd racks, as two
consumers of a two-partition topic hold them) serve ``/api/v1/read`` on real HTTP
servers; Debian's Prometheus has one ``remote_read`` entry per instance. Every PromQL
answer is checked against numbers computed here straight from the raw samples that were
sent, with Prometheus' documented semantics (lookback, range selectors closed at both
ends in 2.x, ``rate``/``increase`` extrapolation, counter resets).

Prometheus 2.42's client asks for SAMPLES only; the streamed XOR-chunk answer is checked by
decoding it here with a decoder written from Prometheus' chunk layout (independent of the
encoder) and comparing it sample for sample with the SAMPLES answer.
"""

from __future__ import annotations

import io
import math
import struct
from pathlib import Path

import aiohttp
import cramjam
import numpy as np
import pytest
from aiohttp.test_utils import TestServer
from prometheus import Prometheus, config, needs_prometheus
from test_aggregator_support import ENERGY, POWER, T0, TEMP, make_fleet, process_all

from aggregator import prom_wire
from aggregator.http_api import build_query_app
from aggregator.prompb import ChunkedReadResponse, LabelMatcher, ReadRequest, ReadResponse
from aggregator.query_engine import QueryEngine, QueryLimits
from aggregator.rack_stage import RackStage
from aggregator.remote_read import chunked_frames, read_query
from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig

METRIC = {TEMP: "fleetpulse_gpu_temperature_celsius", POWER: "fleetpulse_gpu_power_usage_watts",
          ENERGY: "fleetpulse_gpu_energy_consumption_joules_total"}
COL = {TEMP: 0, POWER: 1, ENERGY: 2}
SECONDS = 240


class Instance:
    def __init__(self, path: Path, fl, partition: int) -> None:
        self.store = SeriesStore(StoreConfig(path=str(path / "store"), fsync=False))
        self.index = EntityIndex(path / "entities.jsonl")
        process_all(RackStage(self.store, self.index, topic="t.samples", lateness_ms=5000),
                    [m for m in fl.messages if m.partition == partition])
        self.engine = QueryEngine(self.store, self.index)

    def close(self) -> None:
        self.index.close()
        self.store.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Read-only for the tests: built once for the module."""
    fl = make_fleet(n_racks=4, nodes_per_rack=2, gpus=4, seconds=SECONDS, partitions=2)
    path = tmp_path_factory.mktemp("remote-read")
    insts = [Instance(path / f"agg{p}", fl, p) for p in (0, 1)]
    yield fl, insts
    for i in insts:
        i.close()


def raw(fl, metric: int) -> dict[tuple[str, str, str], np.ndarray]:
    """(rack, node, gpu) -> values [T] as sent (NaN: not sampled)."""
    out = {}
    for node, v in zip(fl.nodes, fl.values, strict=True):
        for g in range(v.shape[1]):
            out[(node.rack, node.node, str(g))] = v[:, g, COL[metric]]
    return out


def key(labels: tuple[tuple[str, str], ...]) -> tuple[str, str, str]:
    d = dict(labels)
    return d["rack"], d["node"], d["gpu"]


def in_range(fl, t_ms: int, range_ms: int) -> np.ndarray:
    """Sample indices with t - range <= ts <= t (Prometheus 2.x: closed at both ends)."""
    return np.flatnonzero((fl.ts >= t_ms - range_ms) & (fl.ts <= t_ms))


def latest(fl, col: np.ndarray, t_ms: int) -> float:
    """The instant-vector sample: newest non-NaN at or before t within 5 min lookback."""
    idx = in_range(fl, t_ms, 300_000)
    vals = col[idx]
    ok = np.flatnonzero(~np.isnan(vals))
    return float(vals[ok[-1]]) if ok.size else math.nan


def extrapolated(ts_s: np.ndarray, vals: np.ndarray, start_s: float, end_s: float,
                 is_rate: bool) -> float:
    """Prometheus' extrapolatedRate for a counter (the algorithm in its docs/functions)."""
    ok = ~np.isnan(vals)
    ts_s, vals = ts_s[ok], vals[ok]
    if vals.size < 2:
        return math.nan
    result = vals[-1] - vals[0]
    result += vals[:-1][np.diff(vals) < 0].sum()  # counter resets
    to_start, to_end = ts_s[0] - start_s, end_s - ts_s[-1]
    sampled = ts_s[-1] - ts_s[0]
    avg = sampled / (vals.size - 1)
    if result > 0 and vals[0] >= 0:
        to_start = min(to_start, sampled * (vals[0] / result))
    interval = sampled
    interval += to_start if to_start < avg * 1.1 else avg / 2
    interval += to_end if to_end < avg * 1.1 else avg / 2
    result = result * (interval / sampled)
    return result / (end_s - start_s) if is_rate else result


async def _serve(insts):
    prom_wire.warm_up()  # a cold numba compile must not run into Prometheus' read timeout
    servers = [TestServer(build_query_app(i.engine), host="127.0.0.1") for i in insts]
    for s in servers:
        await s.start_server()
    return servers


@needs_prometheus
async def test_promql_through_prometheus_equals_raw_samples(fleet, tmp_path):
    fl, insts = fleet
    servers = await _serve(insts)
    prom = Prometheus(tmp_path / "prom", config(
        [str(s.make_url("/api/v1/read")) for s in servers]))
    await prom.start()
    t_ms = T0 + 200_500  # between samples: no range boundary falls on a sample
    t = t_ms / 1000
    temp, power, energy = raw(fl, TEMP), raw(fl, POWER), raw(fl, ENERGY)
    try:
        # *_over_time over raw samples of every GPU of both instances
        got = await prom.vector(f'avg_over_time({METRIC[TEMP]}{{agg="raw"}}[1m])', t)
        idx = in_range(fl, t_ms, 60_000)
        assert len(got) == len(temp) == 32
        for lab, v in got.items():
            assert v == pytest.approx(np.nanmean(temp[key(lab)][idx]), rel=1e-12)
        got = await prom.vector(f'max_over_time({METRIC[POWER]}{{agg="raw"}}[2m])', t)
        idx2 = in_range(fl, t_ms, 120_000)
        assert {key(k): v for k, v in got.items()} == {
            k: float(np.nanmax(c[idx2])) for k, c in power.items()}

        # rate and increase: the counter resets once (node00-0) inside the range
        ts_s = fl.ts / 1000
        for fn, is_rate in (("rate", True), ("increase", False)):
            got = await prom.vector(f'{fn}({METRIC[ENERGY]}{{agg="raw"}}[1m])', t)
            assert len(got) == 32
            for lab, v in got.items():
                want = extrapolated(ts_s[idx], energy[key(lab)][idx], t - 60, t, is_rate)
                assert v == pytest.approx(want, rel=1e-9), (fn, lab)

        # topk over the fleet: the three largest newest readings, from either instance
        now = {k: latest(fl, c, t_ms) for k, c in power.items()}
        got = await prom.vector(f'topk(3, {METRIC[POWER]}{{agg="raw"}})', t)
        want = sorted(now.items(), key=lambda kv: -kv[1])[:3]
        assert sorted(got.values(), reverse=True) == [v for _, v in want]
        assert {key(k) for k in got} == {k for k, _ in want}

        # avg by (rack): each rack's GPUs live on one instance, the racks on both
        got = await prom.vector(f'avg by (rack) ({METRIC[TEMP]}{{agg="raw"}})', t)
        racks = sorted({k[0] for k in temp})
        assert [dict(k)["rack"] for k in sorted(got)] == racks
        for lab, v in got.items():
            vals = [latest(fl, c, t_ms) for k, c in temp.items() if k[0] == dict(lab)["rack"]]
            assert v == pytest.approx(np.nanmean(vals), rel=1e-12)

        # binary expressions: arithmetic between aggregates, and a comparison filter
        got = await prom.vector(f'sum by (rack) ({METRIC[POWER]}{{agg="raw"}}) / 1000', t)
        for lab, v in got.items():
            vals = [x for k, x in now.items() if k[0] == dict(lab)["rack"]]
            assert v == pytest.approx(np.nansum(vals) / 1000, rel=1e-12)
        got = await prom.vector(f'{METRIC[TEMP]}{{agg="raw"}} > 60', t)
        want_hot = {k: latest(fl, c, t_ms) for k, c in temp.items()
                    if latest(fl, c, t_ms) > 60}
        assert {key(k): v for k, v in got.items()} == want_hot and want_hot

        # a rollup tier: 10 s max windows, stamped at their end, give the raw maximum
        got = await prom.vector(
            f'max_over_time({METRIC[TEMP]}{{level="gpu", agg="max"}}[1m])', t)
        win = np.flatnonzero((fl.ts >= T0 + 140_000) & (fl.ts < T0 + 200_000))
        assert len(got) == 32
        assert {key(k): v for k, v in got.items()} == {
            k: float(np.nanmax(c[win])) for k, c in temp.items()}
    finally:
        prom.stop()
        for s in servers:
            await s.close()


def _read_request(*matchers, start, end, types=()) -> bytes:
    req = ReadRequest()
    q = req.queries.add(start_timestamp_ms=start, end_timestamp_ms=end)
    for name, op, value in matchers:
        q.matchers.add(type=op, name=name, value=value)
    req.accepted_response_types.extend(types)
    return bytes(cramjam.snappy.compress_raw(req.SerializeToString()))


def _crc32c(data: bytes) -> int:
    """Bit-at-a-time CRC-32C (reflected 0x82F63B78), independent of the table kernel."""
    c = 0xFFFFFFFF
    for b in data:
        c ^= b
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 & -(c & 1))
    return c ^ 0xFFFFFFFF


class _Bits:
    def __init__(self, data: bytes) -> None:
        self.v, self.n, self.pos = int.from_bytes(data, "big"), len(data) * 8, 0

    def read(self, k: int) -> int:
        assert self.pos + k <= self.n, "read past the chunk"
        out = (self.v >> (self.n - self.pos - k)) & ((1 << k) - 1)
        self.pos += k
        return out

    def varint(self) -> int:
        out = shift = 0
        while True:
            b = self.read(8)
            out |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                return out


def decode_xor_chunk(data: bytes) -> list[tuple[int, float]]:
    """Prometheus' XOR chunk, following its iterator (tsdb/chunkenc/xor.go)."""
    count = struct.unpack(">H", data[:2])[0]
    br = _Bits(data[2:])
    out: list[tuple[int, float]] = []
    t = delta = vbits = leading = trailing = 0
    for i in range(count):
        if i == 0:
            z = br.varint()
            t = (z >> 1) ^ -(z & 1)
            vbits = br.read(64)
        else:
            if i == 1:
                delta = br.varint()
            else:
                d = 0
                for _ in range(4):
                    d <<= 1
                    if br.read(1) == 0:
                        break
                    d |= 1
                size = {0: 0, 0b10: 14, 0b110: 17, 0b1110: 20, 0b1111: 64}[d]
                dod = br.read(size) if size else 0
                if size == 64:
                    dod -= (1 << 64) if dod >> 63 else 0
                elif size and dod > (1 << (size - 1)):
                    dod -= 1 << size
                delta += dod
            t = (t + delta + (1 << 63)) % (1 << 64) - (1 << 63)  # Go's int64 wrap
            if br.read(1):
                if br.read(1):
                    leading = br.read(5)
                    sig = br.read(6) or 64
                    trailing = 64 - leading - sig
                vbits ^= br.read(64 - leading - trailing) << trailing
        out.append((t, struct.unpack(">d", vbits.to_bytes(8, "big"))[0]))
    return out


def _frames(body: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(body):
        n = shift = 0
        while True:
            b = body[pos]
            pos += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        crc = int.from_bytes(body[pos:pos + 4], "big")
        msg = body[pos + 4:pos + 4 + n]
        assert _crc32c(msg) == crc
        out.append(msg)
        pos += 4 + n
    return out


async def test_streamed_chunks_equal_samples_and_raw(fleet):
    fl, insts = fleet
    servers = await _serve(insts[:1])
    url = servers[0].make_url("/api/v1/read")
    sel = (("__name__", LabelMatcher.EQ, METRIC[POWER]), ("agg", LabelMatcher.EQ, "raw"),
           ("job", LabelMatcher.EQ, ""))  # a label fleetpulse lacks, matched as empty
    span = {"start": T0, "end": T0 + SECONDS * 1000}
    try:
        async with aiohttp.ClientSession() as s:
            r = await s.post(url, data=_read_request(*sel, **span))
            assert r.status == 200 and r.headers["Content-Encoding"] == "snappy"
            samples = ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(
                await r.read())))
            r = await s.post(url, data=_read_request(*sel, **span, types=(
                ReadRequest.STREAMED_XOR_CHUNKS, ReadRequest.SAMPLES)))
            assert r.status == 200
            assert r.headers["Content-Type"].startswith("application/x-streamed-protobuf")
            body = await r.read()
            r = await s.post(url, data=_read_request(
                ("__name__", LabelMatcher.EQ, METRIC[POWER]), ("job", LabelMatcher.EQ, "x"),
                **span))
            nothing = ReadResponse.FromString(bytes(cramjam.snappy.decompress_raw(
                await r.read())))
    finally:
        await servers[0].close()
    assert [len(q.timeseries) for q in nothing.results] == [0]
    want = {k: v for k, v in raw(fl, POWER).items() if int(k[0][4:]) % 2 == 0}
    by_samples = {}
    for series in samples.results[0].timeseries:
        labels = [(lab.name, lab.value) for lab in series.labels]
        assert labels == sorted(labels)
        by_samples[key(tuple(labels))] = [(x.timestamp, x.value) for x in series.samples]
    assert set(by_samples) == set(want) and len(want) == 16
    for k, col in want.items():
        ok = ~np.isnan(col)
        assert by_samples[k] == list(zip(fl.ts[ok].tolist(), col[ok].tolist(), strict=True))
    by_chunks: dict[tuple[str, str, str], list[tuple[int, float]]] = {}
    order = []
    for msg in _frames(body):
        resp = ChunkedReadResponse.FromString(msg)
        assert resp.query_index == 0
        for cs in resp.chunked_series:
            k = key(tuple((lab.name, lab.value) for lab in cs.labels))
            order.append(tuple((lab.name, lab.value) for lab in cs.labels))
            for chunk in cs.chunks:
                pts = decode_xor_chunk(chunk.data)
                assert chunk.type == 1 and len(pts) <= 120
                assert (chunk.min_time_ms, chunk.max_time_ms) == (pts[0][0], pts[-1][0])
                by_chunks.setdefault(k, []).extend(pts)
    assert order == sorted(order)
    assert by_chunks == by_samples


def test_frames_split_at_the_frame_limit_and_odd_values(fleet):
    """A long series spans frames of whole chunks; NaN, infinities, -0.0 and big time
    jumps survive the chunk codec."""
    _, insts = fleet
    eng = insts[0].engine
    req = ReadRequest.FromString(bytes(cramjam.snappy.decompress_raw(_read_request(
        ("__name__", LabelMatcher.EQ, METRIC[TEMP]), ("agg", LabelMatcher.EQ, "raw"),
        start=T0, end=T0 + SECONDS * 1000))))
    res = read_query(eng, req.queries[0])
    odd = np.array([math.nan, math.inf, -math.inf, -0.0, 1e-310, 5e300])
    res.values[: odd.size] = odd
    res.ts[: odd.size] = T0 - np.array([10**9, 10**7, 10**6, 70_000, 3_000, 5]) * 1000
    frames = chunked_frames([res], max_frame=600)
    assert len(frames) > len(res.labels)
    got = []
    for f in _frames(b"".join(frames)):
        assert len(f) <= 600 + 120 * 20
        for cs in ChunkedReadResponse.FromString(f).chunked_series:
            for chunk in cs.chunks:
                got.extend(decode_xor_chunk(chunk.data))
    assert len(got) == res.ts.size
    np.testing.assert_array_equal([t for t, _ in got], res.ts)
    assert np.array_equal(np.array([v for _, v in got]).view(np.uint64),
                          res.values.view(np.uint64))


async def test_remote_read_errors_have_the_api_shape(fleet):
    _, insts = fleet
    tight = QueryEngine(insts[0].store, insts[0].index, QueryLimits(max_samples=100))
    server = TestServer(build_query_app(tight), host="127.0.0.1")
    await server.start_server()
    url = server.make_url("/api/v1/read")
    sel = (("__name__", LabelMatcher.RE, "fleetpulse_gpu_.*"), ("agg", LabelMatcher.EQ, "raw"))
    try:
        async with aiohttp.ClientSession() as s:
            cases = [
                (b"not snappy at all", 400, "bad_data"),
                (bytes(cramjam.snappy.compress_raw(b"\xff\xff\xff")), 400, "bad_data"),
                (_read_request(*sel, start=T0, end=T0 + 60_000, types=(7,)), 400, "bad_data"),
                (_read_request(*sel, start=T0, end=T0 + 60_000), 422, "execution"),
                (_read_request(("__name__", LabelMatcher.RE, "("), start=T0, end=T0 + 1),
                 400, "bad_data"),
            ]
            for body, status, etype in cases:
                r = await s.post(url, data=body)
                got = await r.json()
                assert (r.status, got["status"], got["errorType"]) == (status, "error", etype)
            r = await s.post(url, data=io.BytesIO(b"x" * (2 << 20)))
            assert r.status == 413 and (await r.json())["errorType"] == "bad_data"
            r = await s.post(str(url) + "?resolution=2s",
                             data=_read_request(*sel, start=T0, end=T0 + 1))
            assert r.status == 400 and "resolution" in (await r.json())["error"]
    finally:
        await server.close()

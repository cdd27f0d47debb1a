"""Lossless bytes per sample and codec speed, side by side with Prometheus, VictoriaMetrics
and plain Gorilla on the same data in the same run.

Datasets:
  fleet  the synthetic fleet (agent.fleet.generate: NVML granularity, 1 Hz, ms jitter);
  fleet-varying  the same without the metrics that never change (error counters, limits);
  dcgm   the dcgm-exporter captures (tests/fixtures/dcgm-exporter): the real label sets,
         starting values and each field's native granularity, moved by a seeded walk (the
         fixtures are single scrapes, so the motion is synthetic), one scrape per 10 s;
  zoo:P  the fleet run as fleet-zoo profile P (--zoo; default the named corners and one
         held-out draw, none of which the codec was tuned on), at P's own sample rate;
  npz    every --npz FILE in the fleet export layout (ts (G,T) ms, values (G,T,M), metrics).

fleetpulse groups the series that share timestamps (one node's GPUs x metrics, chunks of
--chunk samples) and stores each chunk with aggregator.store.codec. Plain Gorilla stores
every series alone (its own timestamps, XOR values) in the same chunks. Bytes per sample
divide by the finite samples (what every system stores: the peers' import formats cannot
carry NaN); fleetpulse's bytes also hold the NaN cells. "store" is the same data written
through SeriesStore (record headers, series ids and CRCs included), compacted and read back.

fleetpulse's headline bytes are the data as compaction leaves it (like VictoriaMetrics'
after its forced merge): COMPACT_CHUNKS sealed chunks joined per record, entropy-coded
where smaller; "as sealed on ingest" are --chunk chunks as the ingest path seals them
(prefix codes only). Speeds, one core: encode is the ingest seal; "compaction recode" is decoding
the sealed form and entropy-coding it again; decode reads the compacted form. Each is the best
of ROUNDS runs of the thread's CPU time (on a shared machine the wall clock also counts other
processes' turns on the core; the JSON keeps the wall-clock figures as ``*_wall_*``). The
flush stall is how long the store's flush() blocks when it compacts a finished segment: with
the default config (``compact_recode`` on, the rewrite spread over flushes by
``compact_budget_s``), with the whole rewrite in one flush (the previous behaviour) and
without ``compact_recode``; ``--stall-gpus`` adds a large synthetic segment to show that
the longest flush follows the budget, not the segment's size. Per metric,
"streamed" is the bytes/sample of its DELTA/DOD columns and "floor" the zero-order entropy
of the residuals those columns code (pooled over the dataset, no table cost): the distance
between the two is what a better entropy coder could still win.

    python -m benchmarks.compression [--npz FILE ...] [--zoo PROFILE ...] [--gpus 16]
        [--duration 3600] [--stall-gpus 2048] [--no-peers] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import orjson

from aggregator.store import SeriesStore, StoreConfig, TierSpec, codec
from aggregator.store.series_store import COMPACT_CHUNKS, compacted_blobs
from benchmarks.dcgm_fixtures import FixturesMissing, dcgm_fixture_files
from benchmarks.peers import (
    PeerSeries,
    missing_peers,
    peer_not_measured,
    prometheus_tsdb_bytes,
    victoriametrics_bytes,
)

RESULTS = Path(__file__).parent / "results" / "compression.json"
TARGET_BPS = 0.7
TARGET_ENCODE = 20e6
TARGET_DECODE = 50e6
TARGET_BELOW_VM = 0.15
ZOO_DEFAULT = ("liquid_cooled_integer", "inference_random", "pipeline_bubbles",
               "sparse_metrics_0p2hz", "air_pcie_fast_half_degree", "1000")
"""Named corners of the fleet zoo and one held-out draw: data the codec was not tuned on."""


@dataclass(frozen=True, slots=True)
class Dataset:
    """Rows (GPUs) x ticks x metrics, plus which rows share timestamps (a group)."""

    name: str
    ts: npt.NDArray[np.int64]  # (G, T)
    values: npt.NDArray[np.float64]  # (G, T, M)
    metrics: tuple[str, ...]
    group: npt.NDArray[np.int64]  # (G,) group id of each row
    labels: tuple[dict[str, str], ...]  # (G,) peer labels of each row


# ---------------------------------------------------------------------------- datasets


def fleet_dataset(gpus: int, duration_s: float, hz: float, seed: int,
                  profile: str | int | None = None) -> Dataset:
    """The synthetic fleet; ``profile`` (a zoo name or draw seed) runs it as that profile,
    at the profile's own sample rate, under the name ``zoo:<profile>``."""
    from agent.fleet import generate, generate_zoo  # benchmarks may wire packages together

    if profile is None:
        d, name = generate(gpus=gpus, hz=hz, duration_s=duration_s, seed=seed), "fleet"
    else:
        _, d = generate_zoo(seed, gpus, duration_s, 0, profile=profile)
        name = f"zoo:{profile}"
    _, group = np.unique(np.array(d.nodes), return_inverse=True)
    labels = tuple({"node": n, "uuid": u} for n, u in zip(d.nodes, d.uuids, strict=True))
    return Dataset(name, d.ts, d.values, tuple(d.metrics), group.astype(np.int64), labels)


def varying_only(ds: Dataset, name: str) -> Dataset:
    """The metrics that change in at least one series: what costs bytes in any system.

    Most of the fleet's 33 metrics (ECC and error counters, limits, P-state) are constant
    for hours, which flatters every system's average; this subset shows the hard part.
    """
    v = ds.values
    same = (v == v[:, :1, :]) | (np.isnan(v) & np.isnan(v[:, :1, :]))
    keep = np.flatnonzero(~same.all(axis=(0, 1)))
    return Dataset(name, ds.ts, np.ascontiguousarray(v[:, :, keep]),
                   tuple(ds.metrics[i] for i in keep.tolist()), ds.group, ds.labels)


def npz_dataset(path: Path) -> Dataset:
    with np.load(path, allow_pickle=False) as z:
        ts = z["ts"].astype(np.int64)
        values = z["values"].astype(np.float64)
        metrics = tuple(str(m) for m in z["metrics"])
        nodes = [str(n) for n in z["nodes"]] if "nodes" in z else None
    if values.ndim != 3 or ts.shape != values.shape[:2] or values.shape[2] != len(metrics):
        raise SystemExit(f"{path}: want ts (G,T), values (G,T,M), metrics (M,); got "
                         f"{ts.shape}, {values.shape}, {len(metrics)}")
    if nodes is None:  # rows with identical timestamps share a group
        _, group = np.unique(ts, axis=0, return_inverse=True)
        nodes = [f"group{g}" for g in group.ravel().tolist()]
    _, group = np.unique(np.array(nodes), return_inverse=True)
    labels = tuple({"node": n, "row": str(i)} for i, n in enumerate(nodes))
    return Dataset(path.stem, ts, values, metrics, group.ravel().astype(np.int64), labels)


def dcgm_dataset(seed: int, ticks: int, interval_ms: int) -> Dataset:
    """The fixtures' real rows, values and granularity, moved by a seeded walk."""
    from agent.sources.dcgm_parse import parse_exposition
    from schemas.catalog import BY_ID, Kind

    rng = np.random.default_rng(seed)
    per_file = []
    for path in dcgm_fixture_files():
        scrape = parse_exposition(path.read_text())
        if scrape.rows and scrape.metric_ids.size:
            per_file.append(scrape)
    names = sorted({BY_ID[int(i)].name for s in per_file for i in s.metric_ids})
    rows, labels, groups, ts_rows = [], [], [], []
    t0 = 1_767_225_600_000
    for gi, s in enumerate(per_file):
        ts = t0 + np.arange(ticks, dtype=np.int64) * interval_ms + rng.integers(0, 4, ticks)
        for r, row in enumerate(s.rows):
            out = np.full((ticks, len(names)), np.nan)
            for c, mid in enumerate(s.metric_ids.tolist()):
                meta = BY_ID[mid]
                v0 = float(s.values[r, c])
                if not np.isfinite(v0):
                    continue
                mul, div = meta.dcgm_scale
                native = v0 * div / mul
                dec = next(d for d in range(7) if round(native, d) == native or d == 6)
                unit = 10**dec
                n0 = round(native * unit)
                if meta.kind is Kind.COUNTER:
                    lam = max(native, 1.0) * 1e-4 * unit if "energy" in meta.name else 0.02
                    walk = n0 + np.cumsum(rng.poisson(lam, ticks))
                elif meta.kind is Kind.GAUGE:
                    sigma = max(0.3, 0.005 * abs(n0))
                    steps = np.rint(rng.normal(0, sigma, ticks)).astype(np.int64)
                    walk = np.maximum(n0 + np.cumsum(steps) - np.cumsum(steps).mean()
                                      .astype(np.int64), 0)
                else:
                    walk = np.full(ticks, n0)
                out[:, names.index(meta.name)] = walk.astype(np.float64) * mul / (div * unit)
            rows.append(out)
            ts_rows.append(ts)
            groups.append(gi)
            labels.append({"node": row.hostname or f"host{gi}", "uuid": row.uuid,
                           "gpu": str(row.gpu)})
    return Dataset("dcgm", np.stack(ts_rows), np.stack(rows), tuple(names),
                   np.array(groups, np.int64), tuple(labels))


# ---------------------------------------------------------------------------- fleetpulse


@dataclass(frozen=True, slots=True)
class Batch:
    """Chunks of equal shape: ts (B, C), values (B, C, k), and each column's metric (B, k)."""

    ts: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    metric: npt.NDArray[np.int64]


def groups(ds: Dataset) -> list[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
    """(rows, flat column ids r*M+m) per group of rows sharing timestamps.

    A (row, metric) pair with no finite sample is not a series (an exporter would not
    print it), so it is left out here and from the peers alike.
    """
    m_count = len(ds.metrics)
    exists = np.isfinite(ds.values).any(axis=1)  # (G, M)
    out = []
    for gid in np.unique(ds.group).tolist():
        rows = np.flatnonzero(ds.group == gid)
        same = bool((ds.ts[rows] == ds.ts[rows[0]]).all())
        for p in [rows] if same else [rows[i:i + 1] for i in range(rows.size)]:
            r, m = np.nonzero(exists[p])
            if r.size:
                out.append((p, p[r] * m_count + m))
    return out


def batches(ds: Dataset, chunk: int) -> list[Batch]:
    """Every group cut into chunks of ``chunk`` ticks, batched by shape."""
    m_count = len(ds.metrics)
    t_count = ds.values.shape[1]
    flat = ds.values.transpose(0, 2, 1).reshape(-1, t_count)  # (G*M, T)
    by_shape: dict[tuple[int, int], list[tuple[int, npt.NDArray[np.int64], int, int]]] = {}
    for rows, cols in groups(ds):
        for a in range(0, t_count, chunk):
            b = min(a + chunk, t_count)
            by_shape.setdefault((cols.size, b - a), []).append((int(rows[0]), cols, a, b))
    out = []
    for items in by_shape.values():
        ts = np.stack([ds.ts[r, a:b] for r, _, a, b in items])
        vals = np.stack([flat[c, a:b].T for _, c, a, b in items])
        out.append(Batch(ts, vals, np.stack([c % m_count for _, c, _, _ in items])))
    return out


ROUNDS = 9
"""Timed repeats per measurement; the best counts (the machine is often shared)."""


@dataclass(frozen=True, slots=True)
class Timing:
    """Best of ROUNDS: ``cpu`` is the thread's CPU time (what "per core" means: time the
    machine's other processes took the core away is not counted), ``wall`` the clock's."""

    cpu: float
    wall: float


def _best_time(fn: Callable[[], Any], rounds: int = ROUNDS) -> Timing:
    cpu = wall = float("inf")
    for _ in range(rounds):
        c0, w0 = time.thread_time(), time.perf_counter()
        fn()
        cpu = min(cpu, time.thread_time() - c0)
        wall = min(wall, time.perf_counter() - w0)
    return Timing(max(cpu, 1e-9), max(wall, 1e-9))


def _entropy_bits(residuals: list[npt.NDArray[np.int64]]) -> float:
    """Bits a static code fitted to the pooled residuals would need (no table cost).

    The plug-in entropy of raw values is biased far low when their spread exceeds the
    sample count (a noisy column of 50,000 residuals over 2**16 values looks like 15 bits),
    so it is measured on magnitude classes: the entropy of the classes of the rANS stage
    (bit length and the two bits after the leading one), well sampled, plus the raw bits
    below them, taken as uniform (a slight over-estimate)."""
    if not residuals:
        return 0.0
    r = np.concatenate(residuals)
    z = ((r << 1) ^ (r >> 63)).view(np.uint64)
    length = np.zeros(z.size, np.int64)
    nz = z > 0
    length[nz] = np.floor(np.log2(z[nz].astype(np.float64))).astype(np.int64) + 1
    length[nz & (z >= 2**52)] = 53  # (beyond float precision; such residuals are rare)
    raw = np.maximum(length - 3, 0)
    cls = np.where(length <= 4, z.astype(np.int64), 0)
    big = length > 4
    cls[big] = 16 + 4 * (length[big] - 5) + ((z[big] >> raw[big].astype(np.uint64)) & 3
                                            ).astype(np.int64)
    _, counts = np.unique(cls, return_counts=True)
    p = counts / counts.sum()
    return float(-(counts * np.log2(p)).sum() + raw.sum())


def compaction_runs(ds: Dataset, chunk: int
                    ) -> list[tuple[npt.NDArray[np.int64], list[tuple[npt.NDArray[np.int64],
                                                                       npt.NDArray[np.float64]]]]]:
    """Per group, its sealed chunks in runs of COMPACT_CHUNKS, as the store compacts them:
    (metric of each column, [(ts, values[T, k]) per chunk])."""
    m_count = len(ds.metrics)
    flat = ds.values.transpose(0, 2, 1).reshape(-1, ds.ts.shape[1])
    out = []
    t_count = ds.ts.shape[1]
    for rows, cols in groups(ds):
        ts, vals = ds.ts[rows[0]], np.ascontiguousarray(flat[cols].T)
        for a in range(0, t_count, chunk * COMPACT_CHUNKS):
            stop = min(a + chunk * COMPACT_CHUNKS, t_count)
            out.append((cols % m_count, [(ts[x:min(x + chunk, stop)], vals[x:min(x + chunk, stop)])
                                         for x in range(a, stop, chunk)]))
    return out


def run_fleetpulse(ds: Dataset, chunk: int) -> dict[str, Any]:
    """Both forms of the data: chunks as sealed on ingest (prefix codes) and as compaction
    rewrites them (:func:`~aggregator.store.series_store.compacted_blobs` on runs of
    COMPACT_CHUNKS chunks). Bytes are the compacted form's."""
    seal_bs = batches(ds, chunk)
    m_count = len(ds.metrics)
    sealed = [codec.encode_groups(b.ts, b.values) for b in seal_bs]  # also compiles
    sealed_total = sum(int(off[-1]) for _, off in sealed)
    enc = _best_time(lambda: [codec.encode_groups(b.ts, b.values) for b in seal_bs])
    runs = compaction_runs(ds, chunk)
    sealed_sizes = [sum(len(codec.encode_group(t, v)) for t, v in members) for _, members in runs]
    compacted = [compacted_blobs(members, size)
                 for (_, members), size in zip(runs, sealed_sizes, strict=True)]
    total = sum(len(b) for blobs in compacted for b in blobs)

    def recode() -> None:  # what compaction does: decode the sealed chunks, join, recode
        for b, (buf, off) in zip(seal_bs, sealed, strict=True):
            codec.decode_groups(buf, off, b.values.shape[2], b.ts.shape[1])
        for (_, members), size in zip(runs, sealed_sizes, strict=True):
            compacted_blobs(members, size)

    recode = _best_time(recode)
    dec = _best_time(lambda: [codec.decode_group(b) for blobs in compacted for b in blobs])
    sealed_dec = _best_time(lambda: [
        codec.decode_groups(buf, off, b.values.shape[2], b.ts.shape[1])
        for b, (buf, off) in zip(seal_bs, sealed, strict=True)])
    lossless = True
    for b, (buf, off) in zip(seal_bs, sealed, strict=True):
        dts, dv = codec.decode_groups(buf, off, b.values.shape[2], b.ts.shape[1])
        lossless &= bool(np.array_equal(dts, b.ts)
                         and np.array_equal(dv.view(np.uint64), b.values.view(np.uint64)))
    per_metric = np.zeros(m_count)
    stream_bytes = np.zeros(m_count)
    residuals: list[list[npt.NDArray[np.int64]]] = [[] for _ in range(m_count)]
    head_bytes = 0
    tags: dict[int, int] = {}
    for (metric, members), blobs in zip(runs, compacted, strict=True):
        parts = [(np.concatenate([m[0] for m in members]),
                  np.concatenate([m[1] for m in members]))] if len(blobs) == 1 else members
        for (want_ts, want_v), blob in zip(parts, blobs, strict=True):
            dts, dv = codec.decode_group(blob)
            lossless &= bool(np.array_equal(dts, want_ts)
                             and np.array_equal(dv.view(np.uint64), want_v.view(np.uint64)))
            head, ctags, sizes = codec.column_layout(blob)
            head_bytes += head
            np.add.at(per_metric, metric, sizes)
            for j, r in enumerate(codec.column_residuals(blob)):
                if r is not None:
                    residuals[int(metric[j])].append(r)
                    stream_bytes[int(metric[j])] += sizes[j]
            for t in ctags:
                tags[t] = tags.get(t, 0) + 1
    floor = np.array([_entropy_bits(r) / 8 for r in residuals])
    return {"bytes": total, "sealed_bytes": sealed_total, "encode": enc,
            "recode": recode, "decode": dec, "sealed_decode": sealed_dec,
            "lossless": lossless,
            "per_metric_bytes": per_metric.tolist(), "residual_column_bytes": stream_bytes.tolist(),
            "residual_entropy_bytes": floor.tolist(), "timestamp_and_header_bytes": head_bytes,
            "column_tags": {str(k): v for k, v in sorted(tags.items())}}


def run_gorilla(ds: Dataset, chunk: int) -> dict[str, Any]:
    """Plain Gorilla: each series alone, in the same chunks; one kernel call per metric."""
    t_count = ds.ts.shape[1]
    m_count = len(ds.metrics)
    per_metric = np.zeros(m_count)
    flat = ds.values.transpose(0, 2, 1).reshape(-1, t_count)
    cols = np.concatenate([c for _, c in groups(ds)])
    work = []
    for m in range(m_count):
        mine = cols[cols % m_count == m]
        if mine.size:
            work.append((m, np.ascontiguousarray(ds.ts[mine // m_count]), flat[mine][:, :, None]))
    codec.gorilla_bytes(work[0][1][:1, :chunk], work[0][2][:1, :chunk])  # compile

    def encode_all() -> None:
        per_metric[:] = 0
        for m, ts, vals in work:
            for a in range(0, t_count, chunk):
                per_metric[m] += codec.gorilla_bytes(ts[:, a:a + chunk], vals[:, a:a + chunk])

    elapsed = _best_time(encode_all)
    ok = True  # round trip of the baseline on some series, so its sizes are honest
    for _, ts, vals in work:
        blob = codec.encode_gorilla(ts[0, :chunk], vals[0, :chunk, 0])
        _, dv = codec.decode_gorilla(blob)
        ok &= bool(np.array_equal(dv.view(np.uint64), vals[0, :chunk, 0].view(np.uint64)))
    return {"bytes": float(per_metric.sum()), "encode": elapsed, "lossless": ok,
            "per_metric_bytes": per_metric.tolist()}


def run_store(ds: Dataset, chunk: int) -> dict[str, Any]:
    """Write every group through SeriesStore, reopen, read back, compare bits."""
    with tempfile.TemporaryDirectory(prefix="fp-store-") as tmp:
        cfg = StoreConfig(path=tmp, chunk_samples=chunk, fsync=False, compact_recode=True,
                          tiers=(TierSpec("raw", 0, 0, 366 * 86_400_000),))
        flat = ds.values.transpose(0, 2, 1).reshape(-1, ds.ts.shape[1])  # (G*M, T)
        every = []
        with SeriesStore(cfg) as st:
            for rows, cols in groups(ds):
                st.append("raw", cols, ds.ts[rows[0]], flat[cols].T)
                every.append(cols)
            st.compact(2**62)  # every segment finished: sealed, then rewritten entropy-coded
        t0 = time.perf_counter()
        with SeriesStore(cfg) as st:
            disk = st.disk_bytes()
            ids = np.concatenate(every)
            r = st.read("raw", ids, -(2**62), 2**62)
            read_s = time.perf_counter() - t0
            want = flat[ids].ravel()
            ok = r.values.size == want.size and bool(np.array_equal(
                r.values.view(np.uint64), want.view(np.uint64)))
    return {"bytes": disk, "lossless": ok, "read_s": read_s}


STALL_SEGMENT_MS = 15 * 60_000
"""Segment span of the flush-stall run: short enough that the benchmark's hour holds
finished segments (the store's default raw tier has 2 h ones; the stall grows with the
samples a segment holds, which the result reports)."""


def run_flush_stall(ds: Dataset, recode: bool, block: int = 10,
                    budget_s: float | None = None) -> dict[str, Any]:
    """How long one flush() blocks: the data appended through SeriesStore in time order,
    ``block`` ticks at a time, with a flush after each (auto_maintain on, as the
    aggregator runs it), so the flush after a segment's end plus grace compacts it.
    ``budget_s`` None is the store's default ``compact_budget_s`` (the rewrite spread over
    flushes); ``float("inf")`` rewrites a segment in one flush. Returns the longest flush
    (wall clock and the thread's CPU time), the longest one that began a compaction and
    the samples that one's segments hold, and how many flushes each segment's rewrite took
    (fsync off: the disk's share is left out)."""
    flat = ds.values.transpose(0, 2, 1).reshape(-1, ds.ts.shape[1])
    gs = groups(ds)

    def blocks() -> Iterator[tuple[list[tuple[Any, Any, Any]], int, Callable[[int, int], int]]]:
        for a in range(0, ds.ts.shape[1], block):
            appends = [(cols, ds.ts[rows[0], a:a + block], flat[cols, a:a + block].T)
                       for rows, cols in gs]
            yield appends, max(int(t.max()) for _, t, _ in appends), samples_between

    def samples_between(lo: int, hi: int) -> int:
        return sum(int(((ds.ts[rows[0]] >= lo) & (ds.ts[rows[0]] < hi)).sum()) * cols.size
                   for rows, cols in gs)

    return _stall(blocks(), recode, budget_s)


def _stall(blocks: Iterator[tuple[list[tuple[Any, Any, Any]], int, Callable[[int, int], int]]],
           recode: bool, budget_s: float | None,
           segment_ms: int = STALL_SEGMENT_MS) -> dict[str, Any]:
    """Append each block's groups, flush, time the flush (see :func:`run_flush_stall`)."""
    grace = 120_000
    with tempfile.TemporaryDirectory(prefix="fp-stall-") as tmp:
        cfg = StoreConfig(path=tmp, fsync=False, compact_recode=recode, grace_ms=grace,
                          tiers=(TierSpec("raw", 0, 0, segment_ms),))
        if budget_s is not None:
            cfg = dataclasses.replace(cfg, compact_budget_s=budget_s)
        worst = worst_cpu = worst_compacting = 0.0
        worst_samples = 0
        done = None  # event time before which segments are compacted
        streak = 0
        per_segment: list[int] = []
        flushes = 0
        with SeriesStore(cfg) as st:
            for appends, newest, samples_between in blocks:
                for cols, ts, vals in appends:
                    st.append("raw", cols, ts, vals)
                pending, finished = st.rewrites_pending, st.rewrites_done
                c0, t0 = time.thread_time(), time.perf_counter()
                st.flush()
                took, cpu = time.perf_counter() - t0, time.thread_time() - c0
                flushes += 1
                worst, worst_cpu = max(worst, took), max(worst_cpu, cpu)
                if pending or st.rewrites_pending or st.rewrites_done > finished:
                    streak += 1  # this flush wrote some of a rewrite
                if st.rewrites_done > finished:
                    per_segment += [streak] * (st.rewrites_done - finished)
                    streak = 0
                edge = (newest - grace) // segment_ms * segment_ms
                # a flush that began compacting [done, edge)
                if done is not None and edge > done and took > worst_compacting:
                    worst_compacting, worst_samples = took, samples_between(done, edge)
                done = edge if done is None else max(done, edge)
            unfinished = st.rewrites_pending
    return {"flush_max_s": worst, "flush_max_cpu_s": worst_cpu,
            "compacting_flush_max_s": worst_compacting, "compacted_samples": worst_samples,
            "segment_ms": segment_ms, "budget_s": cfg.compact_budget_s if recode else None,
            "flushes": flushes, "segments_rewritten": len(per_segment),
            "rewrite_flushes": per_segment, "rewrite_flushes_max": max(per_segment, default=0),
            "rewrites_unfinished": unfinished}


def run_stall_large(gpus: int, seed: int, budget_s: float | None,
                    segment_ms: int = STALL_SEGMENT_MS) -> dict[str, Any]:
    """The flush stall on a synthetic fleet of ``gpus`` GPUs x 33 metrics at 1 Hz (one group
    per node of 8, noisy readings at 0.1 resolution: the recode's slow case), generated a
    block at a time: one segment, its grace, then flushes every 10 s until its rewrite is
    done (at most another segment's time)."""
    rng = np.random.default_rng(seed)
    nodes, metrics, block = max(1, gpus // 8), 33, 10
    ids = [np.arange(n * 8 * metrics, (n + 1) * 8 * metrics, dtype=np.int64)
           for n in range(nodes)]
    level = rng.uniform(20, 700, (nodes, 8 * metrics)).round(1)
    t0 = 1_767_225_600_000
    seconds = (2 * segment_ms + 120_000) // 1000

    def blocks() -> Iterator[tuple[list[tuple[Any, Any, Any]], int, Callable[[int, int], int]]]:
        for a in range(0, seconds, block):
            ts = t0 + (a + np.arange(block, dtype=np.int64)) * 1000
            appends = [(ids[n], ts + n % 7, (level[n] + rng.normal(0, 5, (block, level.shape[1]))
                                             ).round(1)) for n in range(nodes)]
            yield appends, int(ts[-1]) + 6, lambda lo, hi: nodes * 8 * metrics * (hi - lo) // 1000

    out = _stall(blocks(), True, budget_s, segment_ms)
    out.update({"gpus": nodes * 8, "metrics": metrics,
                "segment_samples": nodes * 8 * metrics * segment_ms // 1000})
    return out


# ---------------------------------------------------------------------------- peers


def peer_series(ds: Dataset) -> list[PeerSeries]:
    m_count = len(ds.metrics)
    out = []
    for _, cols in groups(ds):
        for c in cols.tolist():
            g, m = divmod(c, m_count)
            out.append(PeerSeries(ds.metrics[m], ds.labels[g], ds.ts[g], ds.values[g, :, m]))
    return out


def run_dataset(ds: Dataset, chunk: int, peers: bool) -> dict[str, Any]:
    samples_total = sum(cols.size for _, cols in groups(ds)) * ds.ts.shape[1]
    finite = int(np.isfinite(ds.values).sum())
    fp = run_fleetpulse(ds, chunk)
    gor = run_gorilla(ds, chunk)
    store = run_store(ds, chunk)
    stall = run_flush_stall(ds, recode=True)
    stall_one = run_flush_stall(ds, recode=True, budget_s=float("inf"))
    stall_plain = run_flush_stall(ds, recode=False)
    r: dict[str, Any] = {
        "series": ds.ts.shape[0] * len(ds.metrics), "ticks": ds.ts.shape[1],
        "samples_total": samples_total, "samples_finite": finite,
        "bytes_per_sample": fp["bytes"] / finite,
        "sealed_bytes_per_sample": fp["sealed_bytes"] / finite,
        "store_bytes_per_sample": store["bytes"] / finite,
        "gorilla_bytes_per_sample": gor["bytes"] / finite,
        "encode_samples_per_s": samples_total / fp["encode"].cpu,
        "compaction_recode_samples_per_s": samples_total / fp["recode"].cpu,
        "decode_samples_per_s": samples_total / fp["decode"].cpu,
        "sealed_decode_samples_per_s": samples_total / fp["sealed_decode"].cpu,
        "gorilla_encode_samples_per_s": samples_total / gor["encode"].cpu,
        "encode_wall_samples_per_s": samples_total / fp["encode"].wall,
        "compaction_recode_wall_samples_per_s": samples_total / fp["recode"].wall,
        "decode_wall_samples_per_s": samples_total / fp["decode"].wall,
        "sealed_decode_wall_samples_per_s": samples_total / fp["sealed_decode"].wall,
        "gorilla_encode_wall_samples_per_s": samples_total / gor["encode"].wall,
        "store_read_samples_per_s": samples_total / store["read_s"],
        "flush_stall": {"recode": stall, "recode_one_flush": stall_one,
                        "no_recode": stall_plain},
        "lossless": fp["lossless"] and store["lossless"],
        "gorilla_lossless": gor["lossless"],
        "timestamp_bytes_per_sample": fp["timestamp_and_header_bytes"] / finite,
        "column_tags": fp["column_tags"],
        "per_metric": {},
    }
    finite_per_metric = np.isfinite(ds.values).sum(axis=(0, 1))
    for m, name in enumerate(ds.metrics):
        n = int(finite_per_metric[m])
        if n == 0:
            continue
        r["per_metric"][name] = {
            "bytes_per_sample": fp["per_metric_bytes"][m] / n,
            "gorilla_bytes_per_sample": gor["per_metric_bytes"][m] / n,
            "residual_column_bytes_per_sample": fp["residual_column_bytes"][m] / n,
            "residual_entropy_bytes_per_sample": fp["residual_entropy_bytes"][m] / n,
            "finite_samples": int(finite_per_metric[m])}
    if peers:
        series = peer_series(ds)
        try:
            prom = prometheus_tsdb_bytes(series)
            r["prometheus"] = prom
            r["prometheus_bytes_per_sample"] = prom["chunk_bytes"] / prom["samples"]
            r["prometheus_block_bytes_per_sample"] = prom["block_bytes"] / prom["samples"]
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            r["prometheus_error"] = str(exc)  # reported, not hidden: the row stays empty
            peer_not_measured("prometheus", "apt-get install prometheus", str(exc)[:200])
        try:
            vm = victoriametrics_bytes(series)
            r["victoriametrics"] = vm
            r["victoriametrics_bytes_per_sample"] = vm["data_bytes"] / max(vm["rows"], 1)
            r["beats_victoriametrics"] = (r["bytes_per_sample"]
                                          < r["victoriametrics_bytes_per_sample"])
            r["below_victoriametrics"] = 1 - (r["bytes_per_sample"]
                                              / r["victoriametrics_bytes_per_sample"])
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            r["victoriametrics_error"] = str(exc)
            peer_not_measured("victoriametrics", "apt-get install victoria-metrics",
                              str(exc)[:200])
    return r


def print_table(name: str, r: dict[str, Any]) -> None:
    print(f"\n== {name}: {r['series']} series x {r['ticks']} ticks, "
          f"{r['samples_finite']:,} finite samples ==")
    print(f"{'system':<34}{'bytes/sample':>14}{'vs fleetpulse':>15}")
    ours = r["bytes_per_sample"]
    rows = [("fleetpulse codec (lossless)", ours),
            ("  as sealed on ingest", r["sealed_bytes_per_sample"]),
            ("fleetpulse store on disk", r["store_bytes_per_sample"]),
            ("plain Gorilla (per series)", r["gorilla_bytes_per_sample"])]
    if "victoriametrics_bytes_per_sample" in r:
        rows += [("VictoriaMetrics (data parts)", r["victoriametrics_bytes_per_sample"])]
    if "prometheus_bytes_per_sample" in r:
        rows += [("Prometheus TSDB (chunks)", r["prometheus_bytes_per_sample"]),
                 ("Prometheus TSDB (whole blocks)", r["prometheus_block_bytes_per_sample"])]
    for label, v in rows:
        print(f"{label:<34}{v:>14.3f}{v / ours:>14.1f}x")
    print(f"timestamps+headers: {r['timestamp_bytes_per_sample']:.4f} B/sample; "
          f"lossless: {r['lossless']}; encode {r['encode_samples_per_s'] / 1e6:.1f} M/s "
          f"(plain Gorilla {r['gorilla_encode_samples_per_s'] / 1e6:.1f} M/s), compaction "
          f"recode {r['compaction_recode_samples_per_s'] / 1e6:.1f} M/s, decode "
          f"{r['decode_samples_per_s'] / 1e6:.1f} M/s (as sealed "
          f"{r['sealed_decode_samples_per_s'] / 1e6:.1f} M/s), one core (CPU time; wall: "
          f"encode {r['encode_wall_samples_per_s'] / 1e6:.1f}, decode "
          f"{r['decode_wall_samples_per_s'] / 1e6:.1f} M/s)")
    fs = r["flush_stall"]
    print(f"flush stall ({fs['recode']['segment_ms'] // 60_000} min segments of "
          f"{fs['recode']['compacted_samples']:,} samples, no fsync): " + stall_line(fs))
    if "below_victoriametrics" in r:
        print(f"below VictoriaMetrics: {r['below_victoriametrics']:.1%}")
    print(f"{'metric':<46}{'ours B/s':>9}{'Gorilla':>9}{'streamed':>10}{'floor':>8}")
    for metric, pm in sorted(r["per_metric"].items(), key=lambda kv: -kv[1]["bytes_per_sample"]):
        print(f"{metric:<46}{pm['bytes_per_sample']:>9.3f}{pm['gorilla_bytes_per_sample']:>9.3f}"
              f"{pm['residual_column_bytes_per_sample']:>10.3f}"
              f"{pm['residual_entropy_bytes_per_sample']:>8.3f}")


def stall_line(fs: dict[str, Any]) -> str:
    d, one, plain = fs["recode"], fs.get("recode_one_flush"), fs.get("no_recode")
    line = (f"default config (recode, budget {d['budget_s'] * 1e3:.0f} ms) longest flush "
            f"{d['flush_max_s'] * 1e3:.0f} ms (CPU {d['flush_max_cpu_s'] * 1e3:.0f} ms), "
            f"a segment's rewrite took {d['rewrite_flushes_max']} flush(es) "
            f"({d['segments_rewritten']} rewritten)")
    if one is not None:
        line += (f"; all in one flush {one['flush_max_s'] * 1e3:.0f} ms "
                 f"(CPU {one['flush_max_cpu_s'] * 1e3:.0f} ms)")
    if plain is not None:
        line += f"; without recode {plain['flush_max_s'] * 1e3:.0f} ms"
    return line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--npz", type=Path, action="append", default=[],
                        help="extra dataset in the fleet export layout (repeatable)")
    parser.add_argument("--gpus", type=int, default=16, help="fleet size (8 GPUs per node)")
    parser.add_argument("--duration", type=float, default=3600.0, help="fleet seconds")
    parser.add_argument("--hz", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--chunk", type=int, default=120, help="samples per chunk")
    parser.add_argument("--dcgm-ticks", type=int, default=720)
    parser.add_argument("--zoo", action="append", default=None,
                        help="fleet-zoo profile (name or draw seed) run like the fleet "
                             f"(repeatable; default: {', '.join(ZOO_DEFAULT)})")
    parser.add_argument("--stall-gpus", type=int, default=2048,
                        help="GPUs of the large synthetic flush-stall segment (x 33 metrics "
                             "x 900 s a segment; 0 skips it)")
    parser.add_argument("--no-peers", action="store_true", help="skip Prometheus and VM")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    parser.add_argument("--json", action="store_true", help="(the last line is always JSON)")
    args = parser.parse_args(argv)

    fleet = fleet_dataset(args.gpus, args.duration, args.hz, args.seed)
    datasets = [fleet, varying_only(fleet, "fleet-varying")]
    for profile in args.zoo if args.zoo is not None else ZOO_DEFAULT:
        datasets.append(fleet_dataset(args.gpus, args.duration, args.hz, args.seed,
                                      int(profile) if profile.isdigit() else profile))
    try:
        datasets.append(dcgm_dataset(args.seed, args.dcgm_ticks, 10_000))
    except FixturesMissing as exc:  # an installed wheel: measure the rest, say what is left out
        print(f"dcgm dataset skipped: {exc}", file=sys.stderr)
    datasets += [npz_dataset(p) for p in args.npz]
    results = {}
    for ds in datasets:
        results[ds.name] = run_dataset(ds, args.chunk, not args.no_peers)
        print_table(ds.name, results[ds.name])
    stall_large = None
    if args.stall_gpus > 0:
        stall_large = {"recode": run_stall_large(args.stall_gpus, args.seed, None),
                       "recode_one_flush": run_stall_large(args.stall_gpus, args.seed,
                                                           float("inf"))}
        print(f"\nflush stall, synthetic {stall_large['recode']['gpus']:,} GPUs x 33 metrics, "
              f"{stall_large['recode']['segment_ms'] // 60_000} min segments of "
              f"{stall_large['recode']['segment_samples']:,} samples, no fsync: "
              + stall_line(stall_large))
    fleet_r = results["fleet"]
    summary: dict[str, Any] = {
        "bytes_per_sample": fleet_r["bytes_per_sample"],
        "store_bytes_per_sample": fleet_r["store_bytes_per_sample"],
        "gorilla_bytes_per_sample": fleet_r["gorilla_bytes_per_sample"],
        "victoriametrics_bytes_per_sample": fleet_r.get("victoriametrics_bytes_per_sample"),
        "prometheus_bytes_per_sample": fleet_r.get("prometheus_bytes_per_sample"),
        "encode_samples_per_s": fleet_r["encode_samples_per_s"],
        "decode_samples_per_s": fleet_r["decode_samples_per_s"],
        "compaction_recode_samples_per_s": fleet_r["compaction_recode_samples_per_s"],
        "encode_vs_gorilla": fleet_r["encode_samples_per_s"] / fleet_r["gorilla_encode_samples_per_s"],
        "lossless": all(r["lossless"] for r in results.values()),
        "target_bytes_per_sample_met": fleet_r["bytes_per_sample"] <= TARGET_BPS,
        "target_encode_met": fleet_r["encode_samples_per_s"] >= TARGET_ENCODE,
        "target_decode_met": fleet_r["decode_samples_per_s"] >= TARGET_DECODE,
        "speed_clock": f"thread CPU time, best of {ROUNDS} rounds; *_wall_* the wall clock's",
        "encode_min_samples_per_s": min(r["encode_samples_per_s"] for r in results.values()),
        "decode_min_samples_per_s": min(r["decode_samples_per_s"] for r in results.values()),
        "target_encode_met_every_dataset": all(r["encode_samples_per_s"] >= TARGET_ENCODE
                                               for r in results.values()),
        "target_decode_met_every_dataset": all(r["decode_samples_per_s"] >= TARGET_DECODE
                                               for r in results.values()),
        "flush_stall_max_s": max(r["flush_stall"]["recode"]["compacting_flush_max_s"]
                                 for r in results.values()),
        "flush_max_s": max(r["flush_stall"]["recode"]["flush_max_s"] for r in results.values()),
        "flush_stall_one_flush_max_s": max(
            r["flush_stall"]["recode_one_flush"]["compacting_flush_max_s"]
            for r in results.values()),
        "flush_stall_large": stall_large,
        "below_victoriametrics_min": (
            None if args.no_peers or any("below_victoriametrics" not in r
                                         for r in results.values())
            else min(r["below_victoriametrics"] for r in results.values())),
        "target_below_victoriametrics_met": (
            None if args.no_peers or any("below_victoriametrics" not in r
                                         for r in results.values())
            else min(r["below_victoriametrics"] for r in results.values()) >= TARGET_BELOW_VM),
        "beats_victoriametrics_everywhere": (
            None if args.no_peers or any("beats_victoriametrics" not in r
                                         for r in results.values())
            else all(r["beats_victoriametrics"] for r in results.values())),
        "missing_peers": missing_peers(),
        "config": {"gpus": args.gpus, "duration_s": args.duration, "hz": args.hz,
                   "chunk": args.chunk, "seed": args.seed, "npz": [str(p) for p in args.npz],
                   "stall_gpus": args.stall_gpus},
        "datasets": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    short = {k: v for k, v in summary.items() if k != "datasets"}
    short["datasets"] = {name: {k: v for k, v in r.items()
                                if k.endswith("per_sample") or k == "lossless"}
                         for name, r in results.items()}
    print(orjson.dumps(short).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The per-GPU figures of the README's capacity model that no other benchmark measures.

Measured here on the simulated fleet (:class:`agent.fleet.FleetModel`, every NVML metric):

- **Kafka bytes per metric**: sample frames as the agent builds them (one per node and
  ``--ticks-per-frame`` ticks), and compressed in producer-sized batches with snappy and
  lz4 (what aiokafka sends and the broker stores; Kafka keeps batches compressed);
- **disk per GPU-day** of every store tier: the rack stage rolls the fleet up into a real
  store (GPU, node and rack levels; the row and cluster levels are a few series per row and
  are left out), which is then flushed; bytes on disk per tier over GPU-days of data;
- **remote-read and remote-write encoding**: samples per CPU-second of the SAMPLES answer
  and of a remote-write batch (snappy included), the cost per sample of the two exits.

    python -m benchmarks.capacity [--gpus N] [--seconds S] [--json]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import cramjam
import numpy as np
import orjson

from agent.fleet import FleetModel, Topology
from agent.fleet.model import METRIC_IDS
from aggregator.prom_wire import warm_up
from aggregator.prompb import LabelMatcher, ReadRequest
from aggregator.query_engine import QueryEngine
from aggregator.rack_stage import RackStage
from aggregator.remote_read import read_query, samples_response
from aggregator.remote_write import RemoteWriteConfig, RemoteWriter
from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig
from fleetpulse.transport.base import Message
from schemas.frame import SampleFrame, encode_frame

RESULTS = Path(__file__).parent / "results" / "capacity.json"
BATCH_BYTES = 64 << 10
"""Uncompressed bytes per producer batch compressed together (aiokafka's default
``max_batch_size`` is 16 KiB per partition; 64 KiB is what a busy partition's batch holds
with ``linger_ms`` > 0; the ratio changes little between the two)."""


def _frames(gpus: int, seconds: int, ticks_per_frame: int) -> list[tuple[bytes, bytes, int]]:
    topo = Topology(gpus, nodes_per_rack=4)
    model = FleetModel(topo, hz=1.0, seed=11)
    idents = topo.identities
    out = []
    ts_buf, val_buf = [], []
    for tick in range(seconds):
        ts, values = model.step()
        ts_buf.append(ts.copy())
        val_buf.append(values.copy())
        if len(ts_buf) < ticks_per_frame and tick < seconds - 1:
            continue
        t = np.stack(ts_buf)
        v = np.stack(val_buf)
        for n, ident in enumerate(idents):
            g = topo.gpus_of_node(n)
            frame = SampleFrame(ident, f"agent-{ident.node}", tick, METRIC_IDS,
                                np.arange(topo.gpn, dtype=np.int32), tuple(model.uuids[g]),
                                np.ascontiguousarray(t[:, n]), np.ascontiguousarray(v[:, g]))
            out.append((ident.rack_key, encode_frame(frame), int(t[-1, n])))
        ts_buf, val_buf = [], []
    return out


def _wire(frames: list[tuple[bytes, bytes, int]], metrics: int) -> dict[str, float]:
    raw = b"".join(f for _, f, _ in frames)
    out = {"frame_bytes_per_metric": len(raw) / metrics}
    for name, fn in (("snappy", cramjam.snappy.compress_raw), ("lz4", cramjam.lz4.compress_block)):
        size = sum(len(bytes(fn(raw[a:a + BATCH_BYTES])))
                   for a in range(0, len(raw), BATCH_BYTES))
        out[f"{name}_bytes_per_metric"] = size / metrics
    return out


def run(gpus: int, seconds: int, ticks_per_frame: int) -> dict[str, Any]:
    warm_up()
    frames = _frames(gpus, seconds, ticks_per_frame)
    metrics = gpus * len(METRIC_IDS) * seconds
    res: dict[str, Any] = {"gpus": gpus, "seconds": seconds, "hz": 1.0,
                           "metrics_per_gpu": len(METRIC_IDS), "ticks_per_frame": ticks_per_frame,
                           "metrics": metrics, **_wire(frames, metrics)}
    with tempfile.TemporaryDirectory() as tmp:
        store = SeriesStore(StoreConfig(path=f"{tmp}/store", fsync=False))
        index = EntityIndex(Path(tmp) / "entities.jsonl")
        msgs = [Message("s", 0, i, k, v, t) for i, (k, v, t) in enumerate(frames)]
        t0 = time.process_time()
        RackStage(store, index, topic="s", lateness_ms=5000).process(msgs)
        store.flush()
        res["rack_stage_cpu_s_per_million"] = (time.process_time() - t0) / metrics * 1e6
        gpu_days = gpus * seconds / 86_400
        res["disk_bytes_per_gpu_day"] = {t: store.disk_bytes(t) / gpu_days for t in store.tiers}
        res["disk_bytes_per_raw_sample"] = store.disk_bytes("raw") / metrics

        engine = QueryEngine(store, index)
        req = ReadRequest()
        q = req.queries.add(start_timestamp_ms=0, end_timestamp_ms=1 << 62)
        q.matchers.add(type=LabelMatcher.RE, name="__name__", value="fleetpulse_gpu_.+")
        q.matchers.add(type=LabelMatcher.EQ, name="agg", value="raw")
        t0 = time.process_time()
        series = read_query(engine, q)
        body = samples_response([series]).body
        cpu = time.process_time() - t0
        res["remote_read"] = {"samples": int(series.ts.size), "cpu_s": cpu,
                              "samples_per_cpu_s": series.ts.size / cpu,
                              "bytes_per_sample": len(body) / series.ts.size}  # type: ignore[arg-type]

        writer = RemoteWriter(RemoteWriteConfig(url="http://127.0.0.1:9/", series=("gpu:raw",),
                                                batch_samples=50_000, queue_max_bytes=1 << 30),
                              store, index, Path(tmp) / "queue")
        r = store.read("raw", store.series_ids("raw"), 0, 1 << 62)
        t0 = time.process_time()
        for i in range(r.series_ids.size):  # one append per series, as the raw tier's groups
            ts, vals = r.series(i)
            writer.offer("raw", r.series_ids[i:i + 1], ts, vals[:, None])
        writer.seal()
        cpu = time.process_time() - t0
        res["remote_write"] = {"samples": int(writer.stats.queued_samples), "cpu_s": cpu,
                               "samples_per_cpu_s": writer.stats.queued_samples / cpu,
                               "bytes_per_sample": writer.queue.stats.appended_bytes
                               / max(writer.stats.queued_samples, 1)}
        writer.close()
        index.close()
        store.close()
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=256)
    p.add_argument("--seconds", type=int, default=1800)
    p.add_argument("--ticks-per-frame", type=int, default=5)
    p.add_argument("--json", action="store_true", help="print JSON only")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    res = run(args.gpus, args.seconds, args.ticks_per_frame)
    args.out.write_bytes(orjson.dumps(res, option=orjson.OPT_INDENT_2) + b"\n")
    if args.json:
        print(orjson.dumps(res).decode())
        return
    print(f"{args.gpus} GPUs x {res['metrics_per_gpu']} metrics x {args.seconds} s at 1 Hz")
    print(f"Kafka: frames {res['frame_bytes_per_metric']:.2f} B/metric, snappy "
          f"{res['snappy_bytes_per_metric']:.2f}, lz4 {res['lz4_bytes_per_metric']:.2f}")
    for tier, b in res["disk_bytes_per_gpu_day"].items():
        print(f"store {tier:>4}: {b / 1e6:8.3f} MB per GPU-day")
    for what in ("remote_read", "remote_write"):
        r = res[what]
        print(f"{what}: {r['samples_per_cpu_s'] / 1e6:.2f} M samples per CPU-s, "
              f"{r['bytes_per_sample']:.2f} B/sample")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

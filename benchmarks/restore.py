"""What moving a detector shard between instances costs: its checkpoint through Kafka.

    python -m benchmarks.restore [--gpus 10000] [--bootstrap HOST:PORT] [--json]

A partition that moves to another detector instance is restored from the group's changelog
topic (:mod:`fleetpulse.changelog`); this measures that path end to end on a real broker
(started with ``scripts/kafka.sh`` in a private directory unless ``--bootstrap`` is given):
serialise the shard (``detector.checkpoint.shard_bytes``), write it to the compacted topic in
chunks and wait for the acknowledgements, read it back from a fresh handle (what the new
owner does: the partition's log from its start) and restore a fresh shard from it. Bytes,
records and seconds of each step, and the restored models' scores checked against the
original's on the next step (a restore that changed a model would be a wrong result).

The shard: ``--gpus`` GPUs with the detector's default model settings. Training 10,000
forests to full reservoirs takes minutes of CPU, so ``--trained`` of them (default 64) are
trained for ``--steps`` steps on a synthetic stream and every other GPU's forest is a copy
of one of those (same bytes per model as a trained forest: the checkpoint's size is what
matters here); then every GPU runs ``--live-steps`` more steps so the per-GPU state
(features, folded steps, rules) is that of a running shard.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.ingest import _start_broker, _stop_broker
from benchmarks.results_file import write_result

RESULTS = Path(__file__).resolve().parent / "results" / "restore.json"


def _shard(gpus: int, trained: int, steps: int, live_steps: int, seed: int) -> Any:
    from detector.config import DetectorConfig
    from detector.features import GATHERED
    from detector.shard import DetectorShard

    rng = np.random.default_rng(seed)
    cfg = DetectorConfig()

    def stream(n: int, t: int) -> np.ndarray:
        base = rng.normal(0.0, 1.0, (1, n, len(GATHERED))) * 10 + 50
        return base + rng.normal(0.0, 1.0, (t, n, len(GATHERED)))

    teacher = DetectorShard(cfg)
    paths = [f"c/row-{g // 1024}/rack-{g // 64}/node-{g // 8}/gpu-{g % 8}" for g in range(gpus)]
    racks = [p.rsplit("/", 2)[0] for p in paths]
    nodes = [p.rsplit("/", 1)[0] for p in paths]
    t_ids, t_nodes = teacher.register(paths[:trained], racks[:trained], nodes[:trained])
    ts = 1000 * np.arange(1, steps + 1, dtype=np.int64)
    teacher.process(t_ids, t_nodes, ts, stream(trained, steps))
    blobs = [teacher.gpu_bank.engine.checkpoint(i) for i in range(trained)]

    shard = DetectorShard(cfg)
    ids, node_ids = shard.register(paths, racks, nodes)
    for i in range(gpus):
        shard.gpu_bank.engine.restore(i, blobs[i % trained])
    live_ts = 1000 * np.arange(steps + 1, steps + 1 + live_steps, dtype=np.int64)
    shard.process(ids, node_ids, live_ts, stream(gpus, live_steps))
    return shard, ids, node_ids, stream(gpus, 1), steps + live_steps + 1


async def _run(args: argparse.Namespace, bootstrap: str) -> dict[str, Any]:
    from detector.checkpoint import restore_shard, shard_bytes
    from detector.config import DetectorConfig
    from detector.shard import DetectorShard
    from fleetpulse.changelog import CHUNK_BYTES, Changelog
    from fleetpulse.config import TransportConfig
    from fleetpulse.transport import open_transport

    t0 = time.perf_counter()
    shard, ids, nodes, probe, next_step = _shard(args.gpus, args.trained, args.steps,
                                                 args.live_steps, args.seed)
    build_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    data = shard_bytes(shard, {"samples": 12345})
    serialise_s = time.perf_counter() - t0

    transport = open_transport(TransportConfig(bootstrap=bootstrap))
    await transport.start()
    topic = f"bench-restore-{uuid.uuid4().hex[:8]}-changelog"
    tp = ("bench.samples", 0)
    try:
        writer = Changelog(transport, topic, 1)
        await writer.ensure()
        t0 = time.perf_counter()
        await writer.save({tp: data})
        write_s = time.perf_counter() - t0

        reader = Changelog(transport, topic, 1)
        t0 = time.perf_counter()
        got = await reader.load([tp])
        read_s = time.perf_counter() - t0
        stats = reader.last_restore
    finally:
        await transport.close()
    assert got[tp] == data, "the changelog gave back other bytes"

    fresh = DetectorShard(DetectorConfig())
    t0 = time.perf_counter()
    offsets = restore_shard(fresh, got[tp])
    restore_s = time.perf_counter() - t0
    assert offsets == {"samples": 12345}

    # The restored shard must score the next step exactly as the original does.
    ts = np.asarray([1000 * next_step], np.int64)
    a = shard.process(ids, nodes, ts, probe)
    b = fresh.process(ids, nodes, ts, probe)
    same_alerts = [x.to_bytes() for x in a] == [x.to_bytes() for x in b]
    same_models = all(shard.gpu_bank.engine.checkpoint(i) == fresh.gpu_bank.engine.checkpoint(i)
                      for i in range(0, args.gpus, max(1, args.gpus // 97)))
    return {
        "gpus": args.gpus, "trained_models": args.trained, "train_steps": args.steps,
        "live_steps": args.live_steps,
        "checkpoint_bytes": len(data), "bytes_per_gpu": round(len(data) / args.gpus),
        "changelog_records": stats.records, "changelog_bytes_read": stats.bytes,
        "chunk_bytes": CHUNK_BYTES,
        "build_s": round(build_s, 2), "serialise_s": round(serialise_s, 3),
        "write_s": round(write_s, 3), "read_s": round(read_s, 3),
        "restore_s": round(restore_s, 3),
        "restore_total_s": round(read_s + restore_s, 3),
        "restore_mb_per_s": round(len(data) / 1e6 / (read_s + restore_s), 1),
        "next_step_same_alerts": same_alerts, "models_identical_sampled": same_models,
        "what": "one partition's detector shard: serialise, write to the compacted "
                "changelog (acknowledged), read back from the log start by a fresh handle, "
                "restore into a fresh shard",
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.restore", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gpus", type=int, default=10_000)
    p.add_argument("--trained", type=int, default=64)
    p.add_argument("--steps", type=int, default=700,
                   help="training steps of the trained models (past warm-up: full reservoirs)")
    p.add_argument("--live-steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--bootstrap", help="use this broker instead of starting one")
    p.add_argument("--json", action="store_true", help="print the result JSON as the last line")
    p.add_argument("--no-write", action="store_true")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    broker_dir = None
    bootstrap = args.bootstrap
    if not bootstrap:
        broker_dir = Path(tempfile.mkdtemp(prefix="fp-restore-broker-"))
        bootstrap = _start_broker(broker_dir)
    try:
        result = asyncio.run(_run(args, bootstrap))
    finally:
        if broker_dir is not None:
            _stop_broker(broker_dir)
    for k, v in result.items():
        if k != "what":
            print(f"{k:>26}: {v}")
    write_result(result, None if args.no_write else args.out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

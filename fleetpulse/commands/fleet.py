"""``fleetpulse fleet``: the synthetic GPU fleet, published live or exported to a file.

Live (the load generator)::

    fleetpulse fleet --gpus 10000 --hz 1 --duration 300 --bootstrap 127.0.0.1:9092 \\
        [--faults 8 --labels labels.json]

publishes one logical agent per node through the agent's publisher, prints a progress line
on stderr and, at the end, one JSON summary line on stdout (what the ingest benchmark reads).

Export (offline benchmarks)::

    fleetpulse fleet --gpus 64 --hz 1 --duration 3600 --export fleet.npz [--labels l.json]

writes ``ts`` (G, T) int64 ms, ``values`` (G, T, M) float64 and ``metrics`` (M,) names.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
import time
from typing import Any

from agent.fleet.config import FleetConfig
from fleetpulse.config import ConfigError, load_config, transport_overrides

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "fleet",
        help="synthetic GPU fleet: publish live to Kafka (load test) or export to .npz",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="TOML file (see config/fleet.toml)")
    p.add_argument("--gpus", type=int, help="total GPUs (multiple of 8 by default)")
    p.add_argument("--hz", type=float, help="ticks per second")
    p.add_argument("--duration", type=float, help="seconds to run (live: 0 = until SIGINT)")
    p.add_argument("--seed", type=int)
    p.add_argument("--cluster", help="cluster name (run several fleets side by side)")
    p.add_argument("--faults", type=int, help="number of injected faults")
    p.add_argument("--fault-kinds", help="comma-separated subset of fault kinds")
    p.add_argument("--labels", help="write ground-truth labels (JSON) here")
    p.add_argument("--export", metavar="FILE.npz", help="write the run to a file, no broker")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers, or memory://NAME")
    p.add_argument("--topic-prefix", help="topic prefix (default fleetpulse)")
    p.add_argument("--compression", choices=("lz4", "zstd", "gzip", "snappy", "none"),
                   help="producer compression (aiokafka's lz4 runs at level 9: ~10x the CPU "
                        "of snappy per byte; see the README's load-test section)")
    p.add_argument("--ticks-per-frame", type=int, help="ticks per node frame")
    p.add_argument("--partitions", type=int, help="partitions if the fleet creates the topic")
    p.add_argument("--max-speed", action="store_true",
                   help="do not pace at --hz on the wall clock: publish as fast as acked")
    p.add_argument("--progress", type=float, help="seconds between progress lines (0 = none)")
    p.add_argument("--jobs-dir", help="schedule jobs and write their job-mapping dirs here "
                   "(one per node); attribution events go to the events topic")
    p.add_argument("--metrics-port", type=int,
                   help="serve the fleet's own /metrics on 127.0.0.1:PORT (0 = any free port)")
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for flag, key in (("gpus", "gpus"), ("hz", "hz"), ("duration", "duration_s"),
                      ("seed", "seed"), ("faults", "faults"), ("labels", "labels"),
                      ("ticks_per_frame", "ticks_per_frame"), ("partitions", "partitions"),
                      ("progress", "progress_s"), ("fault_kinds", "fault_kinds"),
                      ("metrics_port", "metrics_port"), ("cluster", "cluster"),
                      ("jobs_dir", "jobs_dir")):
        value = getattr(args, flag)
        if value is not None:
            out[key] = value
    if args.max_speed:
        out["realtime"] = False
    transport = transport_overrides(bootstrap=args.bootstrap, topic_prefix=args.topic_prefix,
                                    compression=args.compression)
    if transport:
        out["transport"] = transport
    return out


def run(args: argparse.Namespace) -> int:
    try:
        cfg = load_config(FleetConfig, args.config, env_prefix="FLEETPULSE_FLEET_",
                          overrides=_overrides(args))
    except ConfigError as exc:
        print(f"fleetpulse fleet: {exc}", file=sys.stderr)
        return 2
    if args.export:
        return _export(cfg, args.export)
    if cfg.transport.is_memory:
        print("fleetpulse fleet: publishing to the in-process memory broker, which nothing "
              "else can read; pass --bootstrap HOST:PORT for Kafka", file=sys.stderr)
    summary = asyncio.run(_live(cfg))
    print(json.dumps(summary), flush=True)
    return 0 if summary["frames_lost"] == 0 and summary["frames_rejected"] == 0 else 1


def _export(cfg: FleetConfig, path: str) -> int:
    from agent.fleet.export import generate, save_npz
    from agent.fleet.faults import FaultKind

    if cfg.duration_s <= 0:
        print("fleetpulse fleet: --export needs --duration > 0", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    try:
        data = generate(cfg.gpus, cfg.hz, cfg.duration_s, faults=cfg.faults, seed=cfg.seed,
                        fault_kinds=[FaultKind(k) for k in cfg.fault_kinds] or None,
                        gpus_per_node=cfg.gpus_per_node, nodes_per_rack=cfg.nodes_per_rack,
                        racks_per_row=cfg.racks_per_row, cluster=cfg.cluster)
    except ValueError as exc:
        print(f"fleetpulse fleet: {exc}", file=sys.stderr)
        return 2
    gen_s = time.perf_counter() - t0
    save_npz(path, data)
    if cfg.labels:
        with open(cfg.labels, "w") as fh:
            json.dump(data.labels, fh, indent=1)
            fh.write("\n")
    print(json.dumps({
        "export": path,
        "gpus": int(data.values.shape[0]),
        "ticks": int(data.values.shape[1]),
        "metrics": int(data.values.shape[2]),
        "values": int(data.values.size),
        "labels": len(data.labels),
        "generate_s": round(gen_s, 3),
        "metrics_per_s": round(data.values.size / gen_s, 1),
    }), flush=True)
    return 0


async def _live(cfg: FleetConfig) -> dict[str, Any]:
    from agent.fleet.live import run_live

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await run_live(cfg, stop=stop, progress=sys.stderr if cfg.progress_s else None)
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)

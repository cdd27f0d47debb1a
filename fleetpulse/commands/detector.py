"""``fleetpulse detector``: per-GPU forests, health rules and alerts from the live topics.

    fleetpulse detector [--config config/detector.toml] [--bootstrap HOST:PORT]
                        [--state-dir DIR] [--engine NAME]

Runs until SIGINT or SIGTERM, then writes a final checkpoint and commits. Prints a progress
line every few seconds and serves Prometheus /metrics (``metrics_port``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any

from fleetpulse.config import ConfigError, load_config, transport_overrides

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("detector", help="score samples with per-GPU forests, publish alerts",
                       description=__doc__)
    p.add_argument("--config", type=Path, help="TOML file (see config/detector.toml)")
    p.add_argument("--bootstrap", help="Kafka bootstrap (or memory://NAME)")
    p.add_argument("--prefix", help="topic prefix")
    p.add_argument("--state-dir", type=Path, help="checkpoint directory")
    p.add_argument("--engine", help="forest engine name")
    p.add_argument("--group", help="consumer group id")
    p.add_argument("--metrics-port", type=int, help="/metrics port (0: any free, -1: off)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    transport = transport_overrides(bootstrap=args.bootstrap, topic_prefix=args.prefix)
    if transport:
        out["transport"] = transport
    if args.state_dir:
        out["state_dir"] = str(args.state_dir)
    if args.group:
        out["group_id"] = args.group
    if args.metrics_port is not None:
        out["metrics_port"] = args.metrics_port
    if args.engine:
        out["model"] = {"engine": args.engine}
    return out


async def _main(args: argparse.Namespace) -> int:
    from detector.config import DetectorConfig
    from detector.service import DetectorService
    from fleetpulse.transport import open_transport

    config = load_config(DetectorConfig, args.config, env_prefix="FLEETPULSE_DETECTOR_",
                         overrides=_overrides(args))
    transport = open_transport(config.transport)
    await transport.start()
    service = DetectorService(config, transport)
    server = None
    if config.metrics_port >= 0:
        from prometheus_client import start_http_server

        server, _thread = start_http_server(config.metrics_port, addr=config.metrics_host,
                                            registry=service.stats.registry)
        print(f"detector: /metrics on http://{config.metrics_host}:"
              f"{server.server_address[1]}/metrics", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    progress = None if args.quiet else asyncio.create_task(_progress(service, stop))
    try:
        await service.run(stop)
    finally:
        if progress is not None:
            progress.cancel()
        await transport.close()
        if server is not None:
            server.shutdown()
            server.server_close()
    return 0


async def _progress(service: Any, stop: asyncio.Event) -> None:
    s = service.stats
    last_t, last_u = time.monotonic(), s.updates
    while not stop.is_set():
        await asyncio.sleep(5.0)
        now = time.monotonic()
        rate = (s.updates - last_u) / (now - last_t)
        last_t, last_u = now, s.updates
        print(f"detector: {s.frames} frames, {s.updates} GPU updates ({rate:,.0f}/s), "
              f"{s.models} models, {s.open_alerts} open alerts, "
              f"{sum(s.deadletter.values())} dead-lettered", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO if not args.quiet else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(_main(args))
    except ConfigError as exc:
        print(f"detector: {exc}", file=sys.stderr)
        return 2

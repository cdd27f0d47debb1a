"""``fleetpulse aggregator``: rack rollups, the row/cluster stage, store and query API.

Examples::

    fleetpulse aggregator --bootstrap 127.0.0.1:9092 --data-dir /var/lib/fleetpulse \\
        --listen 127.0.0.1:9464
    fleetpulse aggregator --config config/aggregator.toml      # + FLEETPULSE_AGGREGATOR_* env
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

from aggregator.config import AggregatorConfig
from aggregator.service import AggregatorService
from aggregator.store import StoreError
from fleetpulse.config import ConfigError, load_config, transport_overrides

__all__ = ["ENV_PREFIX", "load_aggregator_config", "register", "run"]

ENV_PREFIX = "FLEETPULSE_AGGREGATOR_"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "aggregator",
        help="roll samples up GPU -> node -> rack -> row -> cluster; serve the query API",
        description="Consume sample frames, build windowed rollups at every level and tier, "
                    "store them, and serve a Prometheus-compatible query API and /metrics.",
    )
    p.add_argument("--config", type=Path, help="TOML file (see config/aggregator.toml)")
    p.add_argument("--bootstrap", help="override transport.bootstrap")
    p.add_argument("--data-dir", help="override data_dir")
    p.add_argument("--listen", help="override listen (host:port of the query API)")
    p.add_argument("--group", help="override group_id")
    p.add_argument("--topic-prefix", help="override transport.topic_prefix")
    p.add_argument("--no-row-stage", action="store_true", help="do not run the row stage here")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    p.set_defaults(func=run)


def load_aggregator_config(path: Path | None, overrides: dict[str, Any] | None = None,
                           environ: dict[str, str] | None = None) -> AggregatorConfig:
    return load_config(AggregatorConfig, path, env_prefix=ENV_PREFIX, overrides=overrides,
                       environ=environ)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    transport = transport_overrides(bootstrap=args.bootstrap, topic_prefix=args.topic_prefix)
    if transport:
        out["transport"] = transport
    for key, value in (("data_dir", args.data_dir), ("listen", args.listen),
                       ("group_id", args.group)):
        if value:
            out[key] = value
    if args.no_row_stage:
        out["row_stage"] = False
    return out


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_aggregator_config(args.config, _overrides(args))
    except ConfigError as exc:
        print(f"fleetpulse aggregator: bad configuration: {exc}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_serve(cfg))
    except StoreError as exc:
        print(f"fleetpulse aggregator: {exc}", file=sys.stderr)
        return 1


async def _serve(cfg: AggregatorConfig) -> int:
    svc = AggregatorService(cfg)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, svc.stop)
    await svc.start()
    print(f"fleetpulse aggregator: query API on http://{cfg.host_port[0]}:{svc.port} "
          f"(data in {cfg.data_dir})", file=sys.stderr, flush=True)
    progress = asyncio.create_task(_progress(svc))
    try:
        await svc.run()
    finally:
        progress.cancel()
    return 1 if svc.failed else 0


async def _progress(svc: AggregatorService) -> None:
    """One status line every 10 s: throughput, lag, windows, late and duplicate counts."""
    last_m, last_t = 0, time.monotonic()
    while True:
        await asyncio.sleep(10)
        st = svc.rack.stats
        now = time.monotonic()
        rate = (st.metrics - last_m) / max(now - last_t, 1e-9)
        last_m, last_t = st.metrics, now
        lag = sum(loop.lag for loop in svc.loops)
        opened = await svc.in_store(svc.rack.open_windows)  # the stage's state: its thread
        print(f"aggregator: {rate:,.0f} metrics/s, lag {lag} msgs, open windows "
              f"{opened}, late {st.late_samples}, duplicates {st.duplicates}, "
              f"dead letters {svc.dead_letters}", file=sys.stderr, flush=True)

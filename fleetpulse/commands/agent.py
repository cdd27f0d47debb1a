"""``fleetpulse agent``: the daemon on every GPU host (see agent/run.py).

Examples::

    fleetpulse agent --config /etc/fleetpulse/agent.toml
    fleetpulse agent --source dcgm --dcgm-url http://127.0.0.1:9400/metrics --once --print
    fleetpulse agent --source nvml --once --print      # every metric each GPU supports
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from agent.config import load_agent_config
from agent.run import Agent, print_tick, sample_once
from agent.sources.base import SourceError
from fleetpulse.config import ConfigError

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "agent",
        help="sample GPUs (NVML, dcgm-exporter or synthetic) and publish frames",
        description="Sample the GPUs of this host at a fixed rate and publish sample frames "
                    "and events; spools to disk while the broker is unreachable.",
    )
    p.add_argument("--config", type=Path, help="TOML file (see config/agent.toml)")
    p.add_argument("--source", choices=("nvml", "dcgm", "synthetic"),
                   help="override source.name")
    p.add_argument("--dcgm-url", help="override source.dcgm.url")
    p.add_argument("--interval", type=float, help="override sampling.interval_s (>= 0.1)")
    p.add_argument("--bootstrap", help="override transport.bootstrap")
    p.add_argument("--spool-dir", type=Path, help="override spool.directory")
    p.add_argument("--metrics-port", type=int, help="override metrics.port (0: any free port)")
    p.add_argument("--once", action="store_true",
                   help="sample one tick, publish it (or print it with --print) and exit")
    p.add_argument("--print", dest="print_", action="store_true",
                   help="with --once: print the tick as JSON lines instead of publishing")
    p.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}

    def put(path: str, value: Any) -> None:
        if value is None:
            return
        node = out
        *heads, last = path.split(".")
        for h in heads:
            node = node.setdefault(h, {})
        node[last] = value

    put("source.name", args.source)
    put("source.dcgm.url", args.dcgm_url)
    put("sampling.interval_s", args.interval)
    put("transport.bootstrap", args.bootstrap)
    put("spool.directory", str(args.spool_dir) if args.spool_dir else None)
    put("metrics.port", args.metrics_port)
    return out


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_agent_config(args.config, overrides=_overrides(args))
    except ConfigError as exc:
        print(f"fleetpulse agent: bad configuration: {exc}", file=sys.stderr)
        return 2
    if args.print_ and not args.once:
        print("fleetpulse agent: --print needs --once", file=sys.stderr)
        return 2
    if args.print_:
        try:
            source, tick = asyncio.run(sample_once(cfg))
        except SourceError as exc:
            print(f"fleetpulse agent: {exc}", file=sys.stderr)
            return 1
        print_tick(source, tick)
        return 0
    return asyncio.run(_daemon(cfg, once=args.once))


async def _daemon(cfg: Any, *, once: bool) -> int:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        return await Agent(cfg).run(stop, ticks=1 if once else None)
    except SourceError as exc:
        print(f"fleetpulse agent: {exc}", file=sys.stderr)
        return 1

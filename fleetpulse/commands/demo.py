"""``fleetpulse demo``: the synthetic fleet, aggregator, detector and web page in one process.

Examples::

    fleetpulse demo                                   # until Ctrl-C; open http://127.0.0.1:8080/
    fleetpulse demo --duration 60 --json              # one JSON summary as the last line
    fleetpulse demo --speed 30 --gpus 2048 --faults 12
    fleetpulse demo --bootstrap 127.0.0.1:9092        # the same over a real Kafka broker

Settings come from ``config/demo.toml``-style files (``--config``), then
``FLEETPULSE_DEMO_*`` environment variables, then these flags.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

from fleetpulse.config import ConfigError, load_config, transport_overrides

__all__ = ["ENV_PREFIX", "register", "run"]

ENV_PREFIX = "FLEETPULSE_DEMO_"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run a synthetic fleet with faults, rollups, alerts and the live heatmap",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", type=Path, help="TOML file (see config/demo.toml)")
    p.add_argument("--gpus", type=int, help="simulated GPUs (default 1024)")
    p.add_argument("--speed", type=float, help="simulated seconds per wall second (default 10)")
    p.add_argument("--hz", type=float, help="samples per GPU per simulated second (default 1)")
    p.add_argument("--faults", type=int, help="faults to inject (default 8)")
    p.add_argument("--fault-kinds", help="comma-separated kinds to inject (default: all)")
    p.add_argument("--labels", help="write the injected faults (ground truth, JSON) here")
    p.add_argument("--seed", type=int, help="seed of the fleet and its faults")
    p.add_argument("--duration", type=float, metavar="S",
                   help="stop after S wall-clock seconds (default: run until Ctrl-C)")
    p.add_argument("--listen", help="host:port of the web page and query API "
                                    "(default 127.0.0.1:8080)")
    p.add_argument("--bootstrap", help="Kafka bootstrap servers instead of the embedded broker")
    p.add_argument("--data-dir", help="keep the store and checkpoints here (default: temporary)")
    p.add_argument("--json", action="store_true",
                   help="print one JSON summary as the last line of stdout")
    p.add_argument("--quiet", action="store_true", help="no terminal view, only the summary")
    p.set_defaults(func=run)


def _overrides(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in (("gpus", args.gpus), ("speed", args.speed), ("hz", args.hz),
                       ("faults", args.faults), ("seed", args.seed),
                       ("duration_s", args.duration), ("listen", args.listen),
                       ("data_dir", args.data_dir), ("labels", args.labels),
                       ("fault_kinds", args.fault_kinds)):
        if value is not None:
            out[key] = value
    if transport := transport_overrides(bootstrap=args.bootstrap):
        out["transport"] = transport
    if args.quiet:
        out["progress_s"] = 0.0
    return out


def run(args: argparse.Namespace) -> int:
    from fleetpulse.demo import DemoConfig, run_demo

    logging.basicConfig(level=os.environ.get("FLEETPULSE_LOG_LEVEL", "WARNING").upper(),
                        stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_config(DemoConfig, args.config, env_prefix=ENV_PREFIX,
                          overrides=_overrides(args))
    except ConfigError as exc:
        print(f"fleetpulse demo: bad configuration: {exc}", file=sys.stderr)
        return 2

    async def main() -> dict[str, Any]:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        return await run_demo(cfg, stop=stop, out=sys.stderr)

    try:
        summary = asyncio.run(main())
    except OSError as exc:  # the port is taken, the data dir is not writable, ...
        print(f"fleetpulse demo: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary), flush=True)
    else:
        _print_summary(summary)
    return 0


def _print_summary(s: dict[str, Any]) -> None:
    rows = [
        ("GPUs", f"{s['gpus']:,}"),
        ("simulated", f"{s['sim_s']:,.0f} s in {s['elapsed_s']:,.1f} s (x{s['speed_achieved']})"),
        ("samples", f"{s['samples']:,} ({s['metrics_per_s']:,.0f} metrics/s)"),
        ("faults", f"{s['faults_injected']} injected, {s['faults_detected']} detected "
                   f"{s['detected_by_kind']}"),
        ("alerts", f"{s['alerts']} ({s['false_incidents']} false incidents, "
                   f"median delay {s['median_delay_s']} s)"),
        ("incidents", f"{s['incidents']}: " + "; ".join(
            f"{i['cause']} at {i['root']} -> {i['action']} ({i['alerts']} alerts)"
            for i in s.get("incident_list", []))),
    ]
    for k, v in rows:
        print(f"{k:>10}: {v}")

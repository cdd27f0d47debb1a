"""``fleetpulse health top``: the GPUs that cause the most trouble, from the alerts topic.

    fleetpulse health top [--window 7d] [--limit 20] [--json]
                          [--config config/detector.toml] [--bootstrap B] [--prefix P]

Ranks GPUs by incidents rooted at them, then hardware events (hardware XIDs, ECC errors,
row-remap trouble; once per incident), then throttled and lost time, over the window before
the newest record (``fleetpulse.health_rank``). Reads the alerts topic from its start with a
throw-away consumer group until it is idle ``--idle-s`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import sys

from fleetpulse.commands.topic_reader import add_transport_args, read_topic, transport_from_args
from fleetpulse.config import ConfigError
from fleetpulse.health_rank import HealthRank, parse_window
from fleetpulse.transport import Message
from schemas.errors import DecodeError
from schemas.records import decode_alerts_topic
from schemas.topics import Topics

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("health", help="GPU health across the fleet", description=__doc__)
    h_sub = p.add_subparsers(dest="health_command", metavar="SUBCOMMAND", required=True)
    t = h_sub.add_parser("top", help="rank the worst GPUs of a window")
    add_transport_args(t)
    t.add_argument("--window", default="7d", help="how far back: 90s, 30m, 12h, 7d, 2w")
    t.add_argument("--limit", type=int, default=20, help="GPUs to list")
    t.add_argument("--json", action="store_true", help="one JSON object")
    t.add_argument("--idle-s", type=float, default=2.0,
                   help="stop reading after this many seconds without a new record")
    t.set_defaults(func=run)


async def _read(args: argparse.Namespace) -> HealthRank:
    transport, cfg = transport_from_args(args)
    await transport.start()
    rank = HealthRank()

    def take(msg: Message) -> None:
        with contextlib.suppress(DecodeError):  # not ours to judge: `alerts tail` shows it
            rank.add(decode_alerts_topic(msg.value))

    try:
        await read_topic(transport, Topics(cfg.topic_prefix).alerts, args.idle_s, "health",
                         take)
    finally:
        await transport.close()
    return rank


def run(args: argparse.Namespace) -> int:
    try:
        window_ms = parse_window(args.window)
        if args.limit < 1:
            raise ConfigError("--limit must be >= 1")
        rank = asyncio.run(_read(args))
    except (ConfigError, ValueError) as exc:
        print(f"health: {exc}", file=sys.stderr)
        return 2
    top = rank.top(window_ms, args.limit)
    if args.json:
        print(json.dumps({"window": args.window, "now_ms": rank.newest_ms,
                          "gpus": [dataclasses.asdict(h) for h in top]}))
        return 0
    print(f"{'gpu':<48}  {'incidents':>9}  {'xids':>4}  {'ecc':>4}  {'remaps':>6}  "
          f"{'throttled':>9}  {'lost':>8}")
    for h in top:
        print(f"{h.gpu:<48}  {h.incidents:>9}  {h.xids:>4}  {h.ecc:>4}  {h.remaps:>6}  "
              f"{h.throttled_s:>8.0f}s  {h.lost_s:>7.0f}s")
    return 0

"""``fleetpulse inventory drift``: racks, nodes and jobs that mix driver / VBIOS / InfoROM /
firmware versions, and the GPUs whose version changed, from the events topic.

    fleetpulse inventory drift [--config config/detector.toml] [--bootstrap B] [--prefix P]
                               [--json] [--idle-s S]

Reads the events topic from its beginning with a throw-away consumer group (the topic's
retention bounds what it knows) until it has been idle ``--idle-s`` seconds, then prints the
report (``fleetpulse.inventory_drift``). Records that do not decode are counted and skipped.
Exit status 0 always when it could read: drift is information, not an error.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
from typing import TextIO

from fleetpulse.commands.topic_reader import add_transport_args, read_topic, transport_from_args
from fleetpulse.config import ConfigError
from fleetpulse.inventory_drift import InventoryLedger
from fleetpulse.transport import Message
from schemas.errors import DecodeError
from schemas.records import EventRecord
from schemas.topics import Topics

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inventory", help="GPU inventory across the fleet", description=__doc__)
    inv_sub = p.add_subparsers(dest="inventory_command", metavar="SUBCOMMAND", required=True)
    d = inv_sub.add_parser("drift", help="racks and nodes that mix versions, version changes")
    add_transport_args(d)
    d.add_argument("--json", action="store_true", help="one JSON object")
    d.add_argument("--idle-s", type=float, default=2.0,
                   help="stop reading after this many seconds without a new event")
    d.set_defaults(func=run)


async def _read(args: argparse.Namespace) -> tuple[InventoryLedger, int]:
    transport, cfg = transport_from_args(args)
    await transport.start()
    ledger, bad = InventoryLedger(), 0

    def take(msg: Message) -> None:
        nonlocal bad
        try:
            ledger.observe(EventRecord.from_bytes(msg.value))
        except DecodeError:
            bad += 1

    try:
        await read_topic(transport, Topics(cfg.topic_prefix).events, args.idle_s, "inventory",
                         take)
    finally:
        await transport.close()
    return ledger, bad


def _print(ledger: InventoryLedger, bad: int, out: TextIO) -> None:
    mixes = ledger.drift()
    out.write(f"{len(ledger.versions)} GPUs with inventory; {len(mixes)} mixed "
              f"(rack, node or job, field); {len(ledger.changes)} version changes\n")
    for m in mixes:
        versions = ", ".join(f"{v} x{n}" for v, n in m.versions.items())
        out.write(f"  mixed  {m.level:<4}  {m.entity:<48}  {m.field:<8}  {versions}\n")
    for c in ledger.changes:
        out.write(f"  change {c.gpu:<54}  {c.field:<8}  {c.old} -> {c.new}\n")
    if bad:
        out.write(f"  ({bad} records were not events and were skipped)\n")


def run(args: argparse.Namespace) -> int:
    try:
        ledger, bad = asyncio.run(_read(args))
    except ConfigError as exc:
        print(f"inventory: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"gpus": len(ledger.versions),
                          "mixed": [dataclasses.asdict(m) for m in ledger.drift()],
                          "changes": [dataclasses.asdict(c) for c in ledger.changes],
                          "skipped": bad}))
    else:
        _print(ledger, bad, sys.stdout)
    return 0

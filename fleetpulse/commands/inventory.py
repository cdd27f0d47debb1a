"""``fleetpulse inventory drift``: racks and nodes that mix driver / VBIOS / InfoROM /
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
import time
import uuid
from pathlib import Path
from typing import Any, TextIO

from fleetpulse.config import ConfigError, load_config, transport_overrides
from fleetpulse.inventory_drift import InventoryLedger
from schemas.errors import DecodeError
from schemas.records import EventRecord

__all__ = ["register", "run"]


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inventory", help="GPU inventory across the fleet", description=__doc__)
    inv_sub = p.add_subparsers(dest="inventory_command", metavar="SUBCOMMAND", required=True)
    d = inv_sub.add_parser("drift", help="racks and nodes that mix versions, version changes")
    d.add_argument("--config", type=Path, help="TOML with a [transport] table")
    d.add_argument("--bootstrap", help="Kafka bootstrap (or memory://NAME)")
    d.add_argument("--prefix", help="topic prefix")
    d.add_argument("--json", action="store_true", help="one JSON object")
    d.add_argument("--idle-s", type=float, default=2.0,
                   help="stop reading after this many seconds without a new event")
    d.set_defaults(func=run)


async def _read(args: argparse.Namespace) -> tuple[InventoryLedger, int]:
    from fleetpulse.transport import TransportConfig, open_transport
    from schemas.topics import Topics

    table: dict[str, Any] = {}
    if args.config:
        import tomllib

        try:
            with open(args.config, "rb") as fh:
                table = dict(tomllib.load(fh).get("transport", {}))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"config file {args.config}: {exc}") from exc
    table.update(transport_overrides(bootstrap=args.bootstrap, topic_prefix=args.prefix))
    cfg = load_config(TransportConfig, overrides=table)
    transport = open_transport(cfg)
    await transport.start()
    ledger, bad = InventoryLedger(), 0
    consumer = transport.consumer([Topics(cfg.topic_prefix).events],
                                  f"fleetpulse-inventory-{uuid.uuid4().hex}", from_beginning=True)
    try:
        last = time.monotonic()
        while time.monotonic() - last < args.idle_s:
            for msg in await consumer.getmany(timeout_ms=200, max_records=2000):
                last = time.monotonic()
                try:
                    ledger.observe(EventRecord.from_bytes(msg.value))
                except DecodeError:
                    bad += 1
    finally:
        await consumer.stop()
        await transport.close()
    return ledger, bad


def _print(ledger: InventoryLedger, bad: int, out: TextIO) -> None:
    mixes = ledger.drift()
    out.write(f"{len(ledger.versions)} GPUs with inventory; {len(mixes)} mixed "
              f"(rack or node, field); {len(ledger.changes)} version changes\n")
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

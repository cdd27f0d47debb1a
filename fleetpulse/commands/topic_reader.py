"""What the read-only topic commands share: the transport from ``--config`` /
``--bootstrap`` / ``--prefix``, and reading a topic from its start until it goes quiet.

Used by ``fleetpulse inventory drift`` and ``fleetpulse health top``, which rebuild a view
from the topic (its retention bounds what they see) with a throw-away consumer group, so
they never move a stage's offsets.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleetpulse.config import ConfigError, load_config, transport_overrides
from fleetpulse.transport import Message, Transport, TransportConfig, open_transport

__all__ = ["add_transport_args", "read_topic", "transport_from_args"]


def add_transport_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, help="TOML with a [transport] table "
                   "(config/detector.toml works)")
    p.add_argument("--bootstrap", help="Kafka bootstrap (or memory://NAME)")
    p.add_argument("--prefix", help="topic prefix")


def transport_from_args(args: argparse.Namespace) -> tuple[Transport, TransportConfig]:
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
    return open_transport(cfg), cfg


async def read_topic(transport: Transport, topic: str, idle_s: float, what: str,
                     on_message: Callable[[Message], None]) -> None:
    """Every message of ``topic`` from its start, until none came for ``idle_s``."""
    consumer = transport.consumer([topic], f"fleetpulse-{what}-{uuid.uuid4().hex}",
                                  from_beginning=True)
    try:
        last = time.monotonic()
        while time.monotonic() - last < idle_s:
            for msg in await consumer.getmany(timeout_ms=200, max_records=2000):
                last = time.monotonic()
                on_message(msg)
    finally:
        await consumer.stop()

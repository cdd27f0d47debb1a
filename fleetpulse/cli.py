"""The one ``fleetpulse`` command; each subcommand lives in ``fleetpulse/commands/<name>.py``.

A command module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (``args -> exit code``) as a default. Adding a command is one line in COMMANDS;
only commands that work are listed, so ``fleetpulse --help`` never advertises a stub.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from typing import Final

from fleetpulse import __version__

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS: Final[tuple[str, ...]] = (
    "agent",
    "fleet",
    "aggregator",
    "query",
    "backtest",
    "alerts",
    "inventory",
    "health",
    "detector",
    "bench",
    "demo",
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every command, or only ``only`` when the command is known.

    Importing a command module may import its stage (numba, aiohttp, ...); ``fleetpulse
    agent`` must stay small on every GPU host, so ``main`` imports just the command it runs.
    """
    parser = argparse.ArgumentParser(
        prog="fleetpulse",
        description="GPU-fleet telemetry: agent, aggregator, detector, load generator, queries.",
    )
    parser.add_argument("--version", action="version", version=f"fleetpulse {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS if only is None else (only,):
        importlib.import_module(f"fleetpulse.commands.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    first = next((a for a in argv if not a.startswith("-")), None)
    parser = build_parser(first if first in COMMANDS else None)
    args = parser.parse_args(argv)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help()
        return 2
    return int(func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())

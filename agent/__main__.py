"""``python -m agent ARGS`` = ``fleetpulse agent ARGS``, importing nothing but the agent.

Why a second entry point: the ``fleetpulse`` CLI builds its parser by importing every
command module (aggregator, detector, numba kernels), which costs ~80 MB of resident memory
that a node daemon never uses. The agent's budget is 80 MB in total, so deploy/ starts it
this way; the flags, config and behaviour are exactly those of ``fleetpulse agent``.
"""

from __future__ import annotations

import argparse
import sys

from fleetpulse.commands import agent as command


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent")
    sub = parser.add_subparsers(dest="command")
    command.register(sub)
    args = parser.parse_args(["agent", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())

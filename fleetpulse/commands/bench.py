"""``fleetpulse bench NAME [ARGS...]``: run one benchmark module from ``benchmarks/``.

The benchmarks are ordinary modules (``python -m benchmarks.NAME``); this command only
finds them by name so that an installed fleetpulse can run them the same way.
"""

from __future__ import annotations

import argparse
import importlib.util
import pkgutil
import runpy
import sys


def _available() -> list[str]:
    spec = importlib.util.find_spec("benchmarks")
    if spec is None or not spec.submodule_search_locations:
        return []
    return sorted(
        m.name for m in pkgutil.iter_modules(spec.submodule_search_locations)
        if not m.name.startswith("_") and not m.ispkg
    )


def run(args: argparse.Namespace) -> int:
    names = _available()
    if args.name not in names:
        print(f"fleetpulse bench: unknown benchmark {args.name!r}; available: {', '.join(names)}",
              file=sys.stderr)
        return 2
    sys.argv = [f"benchmarks.{args.name}", *args.args]
    try:
        runpy.run_module(f"benchmarks.{args.name}", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "bench",
        help="run a benchmark (frame, agent, compression, forest, detection, query, ingest)",
        description=__doc__,
    )
    parser.add_argument("name", help="benchmark module name, e.g. frame")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the benchmark")
    parser.set_defaults(func=run)

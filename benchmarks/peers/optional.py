"""Peers a benchmark compares against but fleetpulse itself does not need.

Why a helper: fleetpulse's dependencies are what its commands need; the libraries a
benchmark measures fleetpulse *against* (ddsketch, krcf, river, the Prometheus and
VictoriaMetrics binaries) are extras. A benchmark without one of them must still measure
fleetpulse and say, in one line, which peer it left out and how to get it -- never stop with
a traceback. Every benchmark goes through :func:`import_peer` (Python peers) or
:func:`peer_not_measured` (anything else), so the line reads the same everywhere and is
printed once per peer, on stderr (stdout's last line stays the benchmark's JSON).
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType
from typing import Final

__all__ = ["BENCH_EXTRA", "import_peer", "missing_peers", "peer_not_measured"]

BENCH_EXTRA: Final = "pip install -e '.[bench]'"
"""How to install every Python peer (pyproject.toml's ``bench`` extra), from a checkout."""

_reported: dict[str, str] = {}


def peer_not_measured(peer: str, install: str, reason: str = "not installed") -> None:
    """Say once, in one line on stderr, that ``peer`` is left out and how to install it."""
    if peer in _reported:
        return
    _reported[peer] = reason
    print(f"peer {peer} not measured ({reason}); to compare against it: {install}",
          file=sys.stderr, flush=True)


def import_peer(module: str, install: str = BENCH_EXTRA) -> ModuleType | None:
    """``module`` imported, or None after one line naming it and how to install it.

    Only the peer itself being absent counts as missing: an ImportError raised from inside
    an installed peer (a broken install) is re-raised, because hiding it would hide a bug.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.partition(".")[0]
        if exc.name is None or (exc.name != module and exc.name.partition(".")[0] != top):
            raise
        peer_not_measured(top, install)
        return None


def missing_peers() -> list[str]:
    """The peers reported missing so far, sorted: benchmarks record them in their JSON."""
    return sorted(_reported)

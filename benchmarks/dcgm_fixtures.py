"""Where the captured dcgm-exporter pages live: ``tests/fixtures/dcgm-exporter/`` of a checkout.

The captures (and the README saying where each came from and under which licence) are kept
in the repository so that a clone needs nothing beside it. Tests and the compression
benchmark both read them through this one module. They sit under ``tests/`` because they
are test data first; an installed wheel carries ``benchmarks`` but not ``tests``, so there
:func:`dcgm_fixture_files` says plainly that the captures come with a checkout only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

__all__ = ["DCGM_FIXTURES", "FixturesMissing", "dcgm_fixture_files"]

_REPO: Final = Path(__file__).resolve().parents[1]
DCGM_FIXTURES: Final = _REPO / "tests" / "fixtures" / "dcgm-exporter"


class FixturesMissing(FileNotFoundError):
    """The captures are not there: fleetpulse runs from an installed wheel, not a checkout."""


def dcgm_fixture_files() -> list[Path]:
    """Every ``*.prom`` capture, sorted by name; raises :class:`FixturesMissing` if none."""
    files = sorted(DCGM_FIXTURES.glob("*.prom"))
    if not files:
        raise FixturesMissing(
            f"no dcgm-exporter captures in {DCGM_FIXTURES}: they ship with a checkout of "
            "fleetpulse (tests/fixtures/dcgm-exporter/), not with the wheel")
    return files

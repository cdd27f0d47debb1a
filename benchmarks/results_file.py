"""Where a benchmark's result goes: one JSON file under ``benchmarks/results`` (the record
the README cites) and, with ``--json``, the same object as the last line of stdout (for a
caller that parses the run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

__all__ = ["write_result"]


def write_result(result: dict[str, Any], out: Path | None, echo: bool) -> None:
    """Write ``result`` to ``out`` (None: nowhere) and print it as one JSON line if ``echo``."""
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
    if echo:
        print(json.dumps(result))

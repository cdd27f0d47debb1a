"""Append-only JSON-lines files whose last line a crash may have torn."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

__all__ = ["read_records"]


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Each whole record of ``path`` in order, stopping at the first line that does not
    parse (a torn tail: everything after it was never flushed). Once every record was taken,
    the file is cut back to them, so the next append does not follow a torn line. A caller
    that raises while folding a record leaves the file as it is."""
    data = path.read_bytes()
    good = 0
    for line in data.split(b"\n"):
        if not line:
            good += 1
            continue
        try:
            rec = orjson.loads(line)
        except orjson.JSONDecodeError:
            break
        yield rec
        good += len(line) + 1
    if good < len(data):
        with open(path, "r+b") as fh:
            fh.truncate(good)

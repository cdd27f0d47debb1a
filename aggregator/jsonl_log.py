"""Append-only JSON-lines files whose last line a crash may have torn.

Reading (:func:`read_records`) stops at a torn tail and cuts it off. Writing
(:class:`JsonlAppender`) hands each line to the OS at once, whole (what survives a kill -9
of the process), and fsyncs in :meth:`JsonlAppender.flush`. A disk that refuses a write
(full, over quota, read-only) loses nothing: the file is cut back to its last whole line,
the lines wait in memory, and ``flush`` raises :class:`~aggregator.store.StoreWriteError`
until a retry gets them all onto the disk -- so a durability cycle
(``aggregator.disk_health``) checkpoints and commits nothing meanwhile.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from aggregator.store import StoreWriteError
from aggregator.store.series_store import _write_whole

__all__ = ["JsonlAppender", "read_records"]

log = logging.getLogger("fleetpulse.aggregator")


class JsonlAppender:
    """Appends lines to ``path`` (opened after it was read); see the module docstring."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        """What the file holds, for the log ("entity index", "attribution table")."""
        self.write_errors = 0
        """Appends the disk refused (their lines waited in memory)."""
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._size = os.fstat(self._fd).st_size
        self._unwritten: list[bytes] = []
        self._dirty = False

    def append(self, obj: object) -> None:
        """Write one record as a line now, or keep it for the next try if the disk refuses."""
        self._unwritten.append(orjson.dumps(obj) + b"\n")
        try:
            self.drain()
        except StoreWriteError as exc:
            self.write_errors += 1
            if self.write_errors == 1 or self.write_errors % 1000 == 0:
                log.error("%s: %s (%d lines wait in memory)", self.what, exc,
                          len(self._unwritten))

    def drain(self) -> None:
        """Hand every waiting line to the OS, whole, or none of them (StoreWriteError)."""
        if self._fd is None or not self._unwritten:
            return
        data = b"".join(self._unwritten)
        _write_whole(self._fd, data, self._size, self.path)
        self._size += len(data)
        self._unwritten.clear()
        self._dirty = True

    def flush(self) -> None:
        """Every line written and fsynced; StoreWriteError while the disk refuses."""
        if self._fd is None:
            return
        self.drain()
        if self._dirty:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise StoreWriteError(f"cannot fsync {self.path}: {exc}") from exc
            self._dirty = False

    def close(self) -> None:
        try:
            self.flush()
        finally:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


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

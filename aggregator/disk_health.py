"""Whether the store's disk takes writes: the durability cycle's guard against a full disk.

A flush the disk refuses (:class:`~aggregator.store.StoreWriteError`: full, over quota,
read-only) leaves nothing torn behind and keeps the data in memory. The cycle then skips
its checkpoint and commit -- Kafka still holds everything after the last commit -- and
tries again at the next interval, so the aggregator keeps consuming and answering queries
and resumes by itself once space returns. The state is on /metrics and in the log (once
when it starts, once when it ends, not every interval).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Protocol

from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreWriteError

__all__ = ["DiskHealth", "Flushable"]


class Flushable(Protocol):
    def flush(self) -> None:
        """Make what was added durable; StoreWriteError if the disk refuses."""

log = logging.getLogger("fleetpulse.aggregator")


class DiskHealth:
    """Flushes index and store; counts and reports refused writes."""

    def __init__(self) -> None:
        self.write_errors = 0
        """Durability cycles whose flush the disk refused."""
        self.writable = True
        self._since = 0.0

    def flush(self, index: EntityIndex, store: SeriesStore,
              also: Sequence[Flushable] = ()) -> bool:
        """``also`` (the attribution table), index, then store durable; False (logged,
        counted) if the disk refused."""
        try:
            for part in also:
                part.flush()
            index.flush()
            store.flush()
        except StoreWriteError as exc:
            self.write_errors += 1
            if self.writable:
                self.writable, self._since = False, time.monotonic()
                log.error("the store's disk refuses writes (%s): no checkpoint or commit "
                          "until it takes them again; consuming and queries go on, data "
                          "waits in memory and in Kafka", exc)
            return False
        if not self.writable:
            self.writable = True
            log.warning("the store's disk takes writes again after %.0f s (%d refused "
                        "flushes so far)", time.monotonic() - self._since, self.write_errors)
        return True

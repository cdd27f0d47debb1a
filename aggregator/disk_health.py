"""Whether the aggregator's disk takes writes: the durability cycle's guard against a full disk.

A write the disk refuses (:class:`~aggregator.store.StoreWriteError`: full, over quota,
read-only) leaves nothing torn behind and keeps the data in memory. The cycle then skips
its checkpoint and commit -- Kafka still holds everything after the last commit -- and
tries again at the next interval, so the aggregator keeps consuming and answering queries
and resumes by itself once space returns. That covers every write of the cycle: the
attribution table, the entity index, the store, the remote-write queue and the partition
states of the workload loops (:meth:`DiskHealth.refused`). The state is on /metrics and in
the log (once when it starts, once when it ends, not every interval).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

from aggregator.store import StoreWriteError

__all__ = ["DiskHealth"]

log = logging.getLogger("fleetpulse.aggregator")


class DiskHealth:
    """Runs the cycle's disk writes; counts and reports refused ones.

    Writable again only once every kind of write that was refused has gone through: a cycle
    with nothing new for the store must not hide a state file that still cannot be written.
    """

    def __init__(self) -> None:
        self.write_errors = 0
        """Durability cycles whose writes the disk refused."""
        self._refusing: set[str] = set()
        self._since = 0.0

    @property
    def writable(self) -> bool:
        return not self._refusing

    def flush(self, parts: Mapping[str, Callable[[], None]]) -> bool:
        """Call each of ``parts`` in order (each makes something durable or raises
        StoreWriteError); False (logged, counted) at the first the disk refused."""
        for what, part in parts.items():
            try:
                part()
            except StoreWriteError as exc:
                self.refused(what, exc)
                return False
            self.took(what)
        return True

    def refused(self, what: str, exc: StoreWriteError) -> None:
        """A write of this cycle was refused: no checkpoint or commit until it is taken."""
        self.write_errors += 1
        if not self._refusing:
            self._since = time.monotonic()
            log.error("the store's disk refuses writes (%s: %s): no checkpoint or commit "
                      "until it takes them again; consuming and queries go on, data "
                      "waits in memory and in Kafka", what, exc)
        self._refusing.add(what)

    def took(self, what: str) -> None:
        """A write of this kind went through."""
        if what in self._refusing:
            # Logged before the set empties: ``writable`` is read from other threads, and
            # whoever sees it True must find the line already written.
            if self._refusing == {what}:
                log.warning("the store's disk takes writes again after %.0f s (%d refused "
                            "flushes so far)", time.monotonic() - self._since,
                            self.write_errors)
            self._refusing.discard(what)

"""The compressed series store under the aggregator: codec, segment files, head, tiers.

Public API (the aggregator codes against exactly this; everything else is internal)::

    from aggregator.store import SeriesStore, StoreConfig, TierSpec, ReadResult

    store = SeriesStore(StoreConfig(path="/var/lib/fleetpulse/store"))   # opens or creates
    # one GROUP of k series that share timestamps (e.g. one node's GPUs x metrics), T ticks:
    store.append("raw", series_ids, ts, values)  # int64[k], int64[T] (ms), float64[T, k]
    store.flush()               # returns once everything appended so far is on disk (fsync);
                                # commit Kafka offsets only after it returns
    r = store.read("raw", series_ids, start_ms, end_ms)   # half-open [start_ms, end_ms)
    r.series(i) -> (ts int64[n], values float64[n])        # or the CSR arrays below
    store.downsample("raw", "10s", ids, "max", start_ms, end_ms)  # tier below -> tier above
    store.maintain()                  # compaction + retention by event time; flush() runs it
                                      # by itself when a tier enters a new segment
    store.enforce_retention(now_ms)   # deletes whole segment files past each tier's retention
    store.compact(now_ms)             # rewrites finished segments without superseded partials
    store.tiers["10s"].resolution_ms  # the TierSpec of each tier, by name (read-only)
    store.series_ids("raw")           # every series id the tier has held since open
    store.disk_bytes(), store.truncated_bytes   # for /metrics
    store.close()                     # seals open chunks, flushes, releases the lock

Semantics the aggregator can rely on:

- Series ids are int64 chosen by the caller (the aggregator owns the label -> id index);
  the store never interprets them or the values (NaN, inf, -0.0 and NaN payloads are kept
  bit for bit).
- A group is identified by its ``series_ids`` array (same ids in the same order). Appending
  the same group again continues its open chunk; the timestamps of a group are stored once
  per chunk for all its series, which is what makes wide groups cheap.
- Appending a (series, timestamp) that is already stored replaces the old value for reads
  ("last write wins"), so replaying Kafka from the last committed offset after a crash is
  idempotent.
- ``flush`` is the durability point. After ``kill -9`` the store reopens with every sample
  appended before the last completed ``flush`` and possibly some appended after it; a torn
  record at a file's tail is detected by its CRC and truncated, never returned.
- Tiers (default raw, 10s, 1m, 1h, 1d; see :data:`DEFAULT_TIERS`) are independent series
  spaces with their own retention and segment span; a rollup tier holds whatever the caller
  appends (one series per aggregate, e.g. the ``max`` of temperature per 10 s), and
  :meth:`SeriesStore.downsample` derives a tier from the one below with a generic reducer
  (count, sum, min, max, last).
- One writer process per directory (an exclusive ``flock`` on ``LOCK``); not thread-safe:
  call it from one thread (the aggregator's event loop, or an executor with one worker).

The codec (:mod:`aggregator.store.codec`) is a leaf module usable on its own: arrays in,
bytes out, its byte layout documented at its top.
"""

from aggregator.store.downsample import REDUCERS, reduce_buckets
from aggregator.store.series_store import (
    DEFAULT_TIERS,
    ReadResult,
    SeriesStore,
    StoreConfig,
    StoreError,
    StoreWriteError,
    TierSpec,
)

__all__ = [
    "DEFAULT_TIERS",
    "REDUCERS",
    "ReadResult",
    "SeriesStore",
    "StoreConfig",
    "StoreError",
    "StoreWriteError",
    "TierSpec",
    "reduce_buckets",
]

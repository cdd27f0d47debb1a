"""How a series id encodes (entity, metric, aggregate), and which aggregates each kind keeps.

A series id is ``entity_id * ENTITY_STRIDE + metric_id * AGG_SLOTS + agg_code``. Only the
entity part needs an index (:mod:`aggregator.series_index`); the metric and the aggregate
are arithmetic. That keeps the persisted index small (one row per GPU, node, rack, row,
cluster rather than one per GPU x metric x aggregate, ~300x fewer) and lets the rollup
kernels compute ids for whole dense ``[entity, metric]`` arrays with one vector op.

The strides are part of the on-disk format: never change them, only add aggregate codes.
"""

from __future__ import annotations

from typing import Final

import numpy as np
import numpy.typing as npt

from schemas.catalog import BY_ID, MAX_ID, Kind

__all__ = [
    "AGG_CODES",
    "AGG_SLOTS",
    "ENTITY_STRIDE",
    "KIND_OF_COLUMN",
    "LEVELS",
    "METRIC_SLOTS",
    "N_COLUMNS",
    "STORED_AGGS",
    "VIRTUAL_AGGS",
    "default_agg",
    "series_ids",
    "split_series_id",
    "stored_aggs_for",
]

METRIC_SLOTS: Final = 256
"""Room for catalog ids 0..255 (the catalog has ~40 today)."""
AGG_SLOTS: Final = 16
ENTITY_STRIDE: Final = METRIC_SLOTS * AGG_SLOTS

LEVELS: Final = ("gpu", "node", "rack", "row", "cluster")
"""The hierarchy, finest first; an entity's ``level`` label is one of these."""

AGG_CODES: Final[dict[str, int]] = {
    "raw": 0,
    "count": 1,
    "sum": 2,
    "min": 3,
    "max": 4,
    "last": 5,
    "sumsq": 6,
    "increase": 7,
    "sketch": 8,
}
"""Aggregates that exist as stored series. ``raw`` lives only in the raw tier (GPU level);
``sketch`` holds quantile-sketch buckets (rack level and up, see :mod:`aggregator.sketch`)."""
AGG_NAMES: Final = {v: k for k, v in AGG_CODES.items()}

VIRTUAL_AGGS: Final = ("avg", "stddev", "p50", "p90", "p95", "p99")
"""Computed at query time: avg = sum/count, stddev from sumsq, pNN from the sketch."""

N_COLUMNS: Final = MAX_ID + 1
"""Width of the in-memory dense ``[entity, metric]`` arrays (metric id = column)."""

KIND_OF_COLUMN: Final = tuple(BY_ID[i].kind if i in BY_ID else None for i in range(N_COLUMNS))

_BY_KIND: Final[dict[Kind, tuple[str, ...]]] = {
    Kind.GAUGE: ("count", "sum", "min", "max", "last", "sumsq"),
    Kind.COUNTER: ("count", "increase", "last"),
    Kind.STATE: ("count", "min", "max", "last"),
    Kind.EVENT: ("count", "last"),
}
STORED_AGGS: Final = _BY_KIND

_DEFAULT: Final = {Kind.GAUGE: "avg", Kind.COUNTER: "increase", Kind.STATE: "last",
                   Kind.EVENT: "last"}


def stored_aggs_for(kind: Kind) -> tuple[str, ...]:
    """Aggregates written per window for a metric of ``kind`` (sketch excluded)."""
    return _BY_KIND[kind]


def default_agg(kind: Kind) -> str:
    """What a selector without an ``agg`` matcher means: the natural reading of the kind."""
    return _DEFAULT[kind]


def series_ids(entity_ids: npt.ArrayLike, metric_ids: npt.ArrayLike,
               agg: str) -> npt.NDArray[np.int64]:
    """Dense ids ``[len(entities), len(metrics)]`` for one aggregate."""
    e = np.asarray(entity_ids, dtype=np.int64)[:, None]
    m = np.asarray(metric_ids, dtype=np.int64)[None, :]
    return e * ENTITY_STRIDE + m * AGG_SLOTS + AGG_CODES[agg]


def split_series_id(sid: int) -> tuple[int, int, str]:
    """(entity id, metric id, aggregate name) of a stored series id."""
    entity, rest = divmod(int(sid), ENTITY_STRIDE)
    metric, code = divmod(rest, AGG_SLOTS)
    return entity, metric, AGG_NAMES[code]

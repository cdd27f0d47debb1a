"""Series ids and arrays in a form that another instance can read back.

A series id is ``entity id * ENTITY_STRIDE + ...``, and entity ids are numbered by each
instance's own entity index in the order it met the entities: the same GPU has another id
on the instance a partition moves to. So what a checkpoint carries about series (the
coarse tiers' running windows, the row stage's series and the finer points its open
coarse windows still need) names each series by its entity's key plus the id's metric and
aggregate part, and the receiving instance maps the keys to its own ids. Arrays travel as
base64 of their raw bytes: exact (float bits included) and a third the size of JSON
numbers.
"""

from __future__ import annotations

import base64
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from aggregator.series_index import EntityIndex, EntityKey
from aggregator.series_layout import ENTITY_STRIDE

__all__ = ["array_from_json", "array_to_json", "sids_from_json", "sids_to_json"]

I64 = npt.NDArray[np.int64]


def array_to_json(a: npt.NDArray[Any]) -> str:
    return base64.b64encode(np.ascontiguousarray(a).tobytes()).decode()


def array_from_json(text: str, dtype: type) -> npt.NDArray[Any]:
    return np.frombuffer(base64.b64decode(text), dtype=dtype).copy()


def sids_to_json(index: EntityIndex, sids: I64) -> dict[str, Any]:
    """``sids`` of this instance as (entity keys, per series: key number, rest)."""
    eids, rest = np.divmod(np.asarray(sids, np.int64), ENTITY_STRIDE)
    if eids.size and bool((eids[1:] >= eids[:-1]).all()):
        # Sorted, as a layout's series are: runs, not a sort (a checkpoint of a 31,000-GPU
        # aggregator's partitions spent 2 % of its store thread sorting them again).
        new = np.empty(eids.size, bool)
        new[0] = True
        np.not_equal(eids[1:], eids[:-1], out=new[1:])
        uniq, inv = eids[new], np.cumsum(new) - 1
    else:
        uniq, inv = np.unique(eids, return_inverse=True)
    return {"keys": [list(index.keys[int(e)]) for e in uniq.tolist()],
            "key": array_to_json(inv.astype(np.int32)), "rest": array_to_json(rest)}


def sids_from_json(index: EntityIndex, obj: dict[str, Any]) -> I64:
    """The same series as ids of this instance (entities it did not know are added)."""
    local = np.asarray([index.add(cast(EntityKey, tuple(k))) for k in obj["keys"]], np.int64)
    which = array_from_json(obj["key"], np.int32)
    rest = array_from_json(obj["rest"], np.int64)
    if which.size == 0:
        return np.zeros(0, np.int64)
    return cast(I64, local[which] * ENTITY_STRIDE + rest)

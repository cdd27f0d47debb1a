"""Per-GPU state arrays that grow as a shard meets GPUs it has not seen.

Every stateful part of the detector keeps one row per GPU id in numpy arrays (columnar, so a
step is a handful of vector operations, not a Python object per GPU). A shard learns of GPUs
as they first report, so each part grows its arrays then; the rows it adds must mean "nothing
known yet" to that part, which is zero for most arrays and a marker (-1, NaN, a default lag)
for some. This is that one step, so each part only names its arrays and their markers."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

__all__ = ["grow_rows"]


def grow_rows(target: object, names: Iterable[str], n: int,
              fill: Mapping[str, float] | None = None) -> None:
    """Give each of ``target``'s arrays ``names`` at least ``n`` rows: the rows added hold
    ``fill[name]`` where given, zero otherwise (the other axes keep their shape)."""
    for name in names:
        arr = getattr(target, name)
        extra = n - len(arr)
        if extra > 0:
            pad = np.full((extra, *arr.shape[1:]), (fill or {}).get(name, 0), dtype=arr.dtype)
            setattr(target, name, np.concatenate([arr, pad]))

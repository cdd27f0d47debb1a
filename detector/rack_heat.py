"""The rack heat rule: a rack whose GPUs all run hotter than their own thermal models.

Cooling trouble of a rack (a failing CDU or fan wall, a blocked door, a warm aisle) warms
every GPU in it a little. No single GPU looks wrong against its node peers (they warm too,
which is why the per-GPU ``thermal_excess`` rule subtracts them), but each is hotter than its
own thermal model predicts for its power. So per rack and closed window of
``detector.rack_windows`` (the mean of its GPUs' residuals, degC): the rule opens once the
mean has stayed at ``excess_c`` or more for ``after_s`` and resolves at the first window
below half of that (a rack mean is smooth, and opening again takes ``after_s`` of heat;
a die with a minute's thermal lag is still hot for minutes after its air recovers, so a
hold would keep the alert open well past the trouble). A workload cannot produce it: a job that starts or ends
moves power, which the models account for, and on a rack of dozens of GPUs their errors
average out. An inlet that swings with the day is learned by the models' four-hour memory.

Vectorised over the racks of a call; the state is two arrays per rack.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

__all__ = ["RackHeat"]


class RackHeat:
    """Per-rack hot timer and open flag."""

    ARRAYS = ("hot_since_ms", "open")

    def __init__(self, excess_c: float, after_s: float) -> None:
        self.excess_c = excess_c
        self.after_ms = int(after_s * 1000)
        self.hot_since_ms = np.zeros(0, dtype=np.int64)
        self.open = np.zeros(0, dtype=bool)

    def ensure(self, n: int) -> None:
        extra = n - len(self.open)
        if extra > 0:
            for k in self.ARRAYS:
                arr = getattr(self, k)
                setattr(self, k, np.concatenate([arr, np.zeros(extra, dtype=arr.dtype)]))

    def step(self, racks: npt.NDArray[np.int64], mean_resid_c: npt.NDArray[np.float64],
             end_ms: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64],
                                                     npt.NDArray[np.int64]]:
        """Advance closed windows (one per rack); returns (rows opened, rows resolved)."""
        hot = mean_resid_c >= self.excess_c
        cool = mean_resid_c < 0.5 * self.excess_c
        since = self.hot_since_ms[racks]
        since = np.where(hot, np.where(since > 0, since, end_ms), 0)
        was = self.open[racks]
        opens = ~was & hot & (end_ms - since >= self.after_ms)
        resolves = was & cool
        self.hot_since_ms[racks] = since
        self.open[racks] = (was & ~resolves) | opens
        return np.flatnonzero(opens), np.flatnonzero(resolves)

    def state_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        return {f"rack_heat.{k}": getattr(self, k).copy() for k in self.ARRAYS}

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]]) -> None:
        for k in self.ARRAYS:
            setattr(self, k, np.array(arrays[f"rack_heat.{k}"], dtype=getattr(self, k).dtype))

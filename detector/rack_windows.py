"""Rack aggregates for the rack-level model, computed from the rack's own samples.

A cooling failure warms every GPU of a rack a little; no single GPU looks wrong, but the
rack's mean temperature residual does. Samples are keyed by rack, so a detector instance
sees every node of the racks it owns and can aggregate them itself, without waiting for
the aggregator's rollups.

Per rack, GPU features are summed into event-time windows of ``window_s``. Nodes report
with jitter, so two windows stay open: window ``w`` is emitted (as means) when the first
sample of window ``w + 2`` arrives, and a sample older than both open windows is counted
as late and dropped.

Rack features (``RACK_FEATURES``): mean temperature, mean temperature residual, mean memory
temperature, mean power fraction and mean utilisation (the GPU features' units), and the
fraction of GPU-steps with a throttle bit.

Beside them each window keeps the rack heat rule's own figure (``Closed.heat_c``): over the
GPUs whose thermal model judged them in the window (it has learned the power they run at),
each one's mean residual, degC, and of those the lower quartile: three quarters of the
rack's judged GPUs run at least that much hotter than their models. And the share of the
window's GPU-steps that were judged, and the lower quartile of those GPUs' thermal lags
(``Closed.lag_s``: how fast the rack's dies follow their air, which tells the rule how a
recovering rack's heat settles). The forest's residual feature averages every warm
model at any power; that is fine for a score learned over the rack's history, but a figure
that a rule compares with a fixed 4 degC must not include a model's guess at a power it
never saw, which is what a whole rack's young models make together when a job moves them
all to a new power at once (zoo-1058: a 4.1 degC mean over all GPUs where the judged ones
averaged 0.6). Nor may it follow the GPUs of a node or a job that share one mistake: a
cooling fault warms every GPU of the rack, while models misjudge a workload together, and
a mean over the rack then reads the mistake of half of it. A held-out soak paged twice on
zoo-1292 so (air-cooled dies of 2 s lag under pipeline bubbles): the models of the nodes
that went idle after the job predicted their idle 9-11 degC too cool, and the rack's mean
read 4.4 degC with the other half of it within a degree of their models.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

from detector.features import group_quantile
from detector.state_arrays import grow_rows

__all__ = ["HEAT_QUANTILE", "RACK_FEATURES", "RACK_SOURCE_COLUMNS", "RACK_WEIGHTS", "Closed",
           "RackWindows"]

RACK_FEATURES: Final = (
    "rack_temperature",
    "rack_temp_residual",
    "rack_memory_temperature",
    "rack_power",
    "rack_utilization",
    "rack_throttling",
)
RACK_SOURCE_COLUMNS: Final = (0, 2, 1, 3, 4, 8)
"""Columns of the GPU feature vector (``detector.features.FEATURES``) each rack feature
averages; the last is turned into "any throttle bit" before averaging."""
RACK_WEIGHTS: Final = (1.0, 2.0, 1.0, 1.0, 1.0, 2.0)
"""Scale of each rack feature over the GPU units: a rack mean is far less noisy than one
GPU, so the residual (1 unit = 1 degC here) and the throttling fraction weigh double."""
HEAT_QUANTILE: Final = 0.25
"""The quantile of the judged GPUs' residuals that is the rack's heat: up to three quarters
of a rack may share a mistake of their models without moving it; a cooling fault moves
all of them."""


class Closed(NamedTuple):
    """The windows one step closed, a row per rack."""

    racks: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    """Window start, ms."""
    means: npt.NDArray[np.float32]
    """The rack features, weighted (``RACK_WEIGHTS``)."""
    heat_c: npt.NDArray[np.float64]
    """Lower quartile over the judged GPUs of each one's mean residual in the window, degC
    (``HEAT_QUANTILE``); NaN where none was judged."""
    judged: npt.NDArray[np.float64]
    """Share of the window's GPU-steps whose model judged them."""
    lag_s: npt.NDArray[np.float64]
    """Lower quartile (``HEAT_QUANTILE``) of the judged GPUs' thermal lags, s, as their
    models chose them when the window closed; NaN where none was judged or no lags were
    given."""


class RackWindows:
    """Two open event-time windows per rack id; arrays grow with the racks (and, for the
    heat figure, with the GPUs: a GPU's sums sit in its rack's slot, tagged with the window
    they belong to)."""

    ARRAYS = ("win", "sums", "counts", "heat_counts")
    GPU_ARRAYS = ("gpu_rack", "gpu_win", "gpu_heat_sums", "gpu_heat_counts")

    def __init__(self, window_s: float) -> None:
        self.window_ms = int(window_s * 1000)
        self.win = np.full((0, 2), -1, dtype=np.int64)
        self.sums = np.zeros((0, 2, len(RACK_FEATURES)))
        self.counts = np.zeros((0, 2))
        self.heat_counts = np.zeros((0, 2))
        """Judged GPU-steps per rack window (the judged share's numerator)."""
        self.gpu_rack = np.full(0, -1, dtype=np.int64)
        self.gpu_win = np.full((0, 2), -1, dtype=np.int64)
        self.gpu_heat_sums = np.zeros((0, 2))
        self.gpu_heat_counts = np.zeros((0, 2))
        self.late = 0

    def ensure(self, n: int) -> None:
        grow_rows(self, self.ARRAYS, n, {"win": -1})

    def ensure_gpus(self, n: int) -> None:
        grow_rows(self, self.GPU_ARRAYS, n, {"gpu_rack": -1, "gpu_win": -1})

    def add(self, rack_ids: npt.NDArray[np.int64], gpu_ids: npt.NDArray[np.int64],
            feats: npt.NDArray[np.float32], judged_c: npt.NDArray[np.float64], ts_ms: int,
            lag_of: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]] | None = None
            ) -> Closed:
        """Add one step of GPU features (rows of GPUs ``gpu_ids`` in racks ``rack_ids``) and
        each GPU's judged residual (degC, NaN where its model does not judge it);
        ``lag_of`` gives GPUs' thermal lags, s (``ThermalModels.tau_s``), read only for the
        windows that close.

        Returns the windows this step closed.
        """
        w = ts_ms // self.window_ms
        slot = int(w % 2)
        x = feats[:, list(RACK_SOURCE_COLUMNS)].astype(np.float64)
        x[:, -1] = x[:, -1] > 0
        racks, inv = np.unique(rack_ids, return_inverse=True)
        sums = np.zeros((len(racks), x.shape[1]))
        np.add.at(sums, inv, x)
        counts = np.bincount(inv, minlength=len(racks)).astype(np.float64)
        judged = np.isfinite(judged_c)
        heat_counts = np.bincount(inv, weights=judged.astype(np.float64), minlength=len(racks))

        cur = self.win[racks, slot]
        other = self.win[racks, 1 - slot]
        late = (cur > w) | (other > w + 1)
        if late.any():
            self.late += int(counts[late].sum())
        # A slot holding an older window closes it: window w-2 (or older) is complete.
        closing = ~late & (cur >= 0) & (cur < w)
        out_racks = racks[closing]
        out_start = cur[closing] * self.window_ms
        c = self.counts[out_racks, slot]
        out_feats = (self.sums[out_racks, slot] / np.maximum(c, 1.0)[:, None]
                     * np.asarray(RACK_WEIGHTS)).astype(np.float32)
        out_heat, out_lag = self._heat(out_racks, cur[closing], slot, lag_of)
        out_judged = self.heat_counts[out_racks, slot] / np.maximum(c, 1.0)
        fresh = ~late & (cur != w)
        self.win[racks[fresh], slot] = w
        self.sums[racks[fresh], slot] = 0.0
        self.counts[racks[fresh], slot] = 0.0
        self.heat_counts[racks[fresh], slot] = 0.0
        ok = ~late
        self.sums[racks[ok], slot] += sums[ok]
        self.counts[racks[ok], slot] += counts[ok]
        self.heat_counts[racks[ok], slot] += heat_counts[ok]
        # Each GPU's own sums, in its rack's slot (started anew for a new window).
        rows = ok[inv] & judged
        g = gpu_ids[rows]
        self.gpu_rack[gpu_ids] = rack_ids
        stale = self.gpu_win[g, slot] != w
        self.gpu_win[g, slot] = w
        self.gpu_heat_sums[g[stale], slot] = 0.0
        self.gpu_heat_counts[g[stale], slot] = 0.0
        np.add.at(self.gpu_heat_sums[:, slot], g, judged_c[rows])
        np.add.at(self.gpu_heat_counts[:, slot], g, 1.0)
        keep = c > 0
        return Closed(out_racks[keep], out_start[keep], out_feats[keep], out_heat[keep],
                      out_judged[keep], out_lag[keep])

    def _heat(self, racks: npt.NDArray[np.int64], windows: npt.NDArray[np.int64], slot: int,
              lag_of: Callable[[npt.NDArray[np.int64]], npt.NDArray[np.float64]] | None
              ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """The heat figure (``HEAT_QUANTILE`` of the judged GPUs' mean residuals) and the
        lag figure (the same quantile of their lags) of each rack's window ``windows`` in
        ``slot``; NaN where no GPU was judged."""
        out = np.full(len(racks), np.nan)
        lag = np.full(len(racks), np.nan)
        if not len(racks):
            return out, lag
        window_of = np.full(len(self.win), -1, dtype=np.int64)
        window_of[racks] = windows
        known = self.gpu_rack >= 0
        g = np.flatnonzero(known)
        g = g[(self.gpu_win[g, slot] == window_of[self.gpu_rack[g]])
              & (self.gpu_heat_counts[g, slot] > 0)]
        if not len(g):
            return out, lag
        means = self.gpu_heat_sums[g, slot] / self.gpu_heat_counts[g, slot]
        order = np.argsort(self.gpu_rack[g], kind="stable")
        grouped = self.gpu_rack[g][order]
        q = group_quantile(means[order], grouped, HEAT_QUANTILE)
        first = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]])
        row_of = np.full(len(self.win), -1, dtype=np.int64)
        row_of[racks] = np.arange(len(racks))
        out[row_of[grouped[first]]] = q[first]
        if lag_of is not None:
            lags = group_quantile(lag_of(g[order]), grouped, HEAT_QUANTILE)
            lag[row_of[grouped[first]]] = lags[first]
        return out, lag

    def state_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        return {f"rack_windows.{k}": getattr(self, k).copy()
                for k in (*self.ARRAYS, *self.GPU_ARRAYS)}

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]]) -> None:
        """Restore; a checkpoint from before the heat figure restarts it with the next window
        (its open windows count nothing judged, so the rule waits for one)."""
        for k in self.ARRAYS:
            got = arrays.get(f"rack_windows.{k}")
            setattr(self, k, np.zeros(self.win.shape) if got is None
                    else np.array(got, dtype=getattr(self, k).dtype))
        if any(f"rack_windows.{k}" not in arrays for k in self.GPU_ARRAYS):
            self.heat_counts[:] = 0.0
            n = len(self.gpu_rack)
            self.gpu_rack = np.full(0, -1, dtype=np.int64)
            self.gpu_win = np.full((0, 2), -1, dtype=np.int64)
            self.gpu_heat_sums = np.zeros((0, 2))
            self.gpu_heat_counts = np.zeros((0, 2))
            self.ensure_gpus(n)
            return
        for k in self.GPU_ARRAYS:
            setattr(self, k, np.array(arrays[f"rack_windows.{k}"],
                                      dtype=getattr(self, k).dtype))

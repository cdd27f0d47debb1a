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

Beside them each window keeps the rack heat rule's own mean (``Closed.heat_c``): the
residual, degC, of only the GPU-steps whose thermal model judges them (it has learned the
power they run at), and the share of the window's GPU-steps that were judged. The forest's
residual feature counts every warm model at any power; that is fine for a score learned
over the rack's history, but a mean that a rule compares with a fixed 4 degC must not
include a model's guess at a power it never saw, which is what a whole rack's young models
make together when a job moves them all to a new power at once (zoo-1058: a 4.1 degC mean
over all GPUs where the judged ones averaged 0.6).
"""

from __future__ import annotations

from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

__all__ = ["RACK_FEATURES", "RACK_SOURCE_COLUMNS", "RACK_WEIGHTS", "Closed", "RackWindows"]

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


class Closed(NamedTuple):
    """The windows one step closed, a row per rack."""

    racks: npt.NDArray[np.int64]
    starts: npt.NDArray[np.int64]
    """Window start, ms."""
    means: npt.NDArray[np.float32]
    """The rack features, weighted (``RACK_WEIGHTS``)."""
    heat_c: npt.NDArray[np.float64]
    """Mean residual of the judged GPU-steps, degC; NaN where none was judged."""
    judged: npt.NDArray[np.float64]
    """Share of the window's GPU-steps whose model judged them."""


class RackWindows:
    """Two open event-time windows per rack id; arrays grow with the racks."""

    ARRAYS = ("win", "sums", "counts", "heat_sums", "heat_counts")

    def __init__(self, window_s: float) -> None:
        self.window_ms = int(window_s * 1000)
        self.win = np.full((0, 2), -1, dtype=np.int64)
        self.sums = np.zeros((0, 2, len(RACK_FEATURES)))
        self.counts = np.zeros((0, 2))
        self.heat_sums = np.zeros((0, 2))
        self.heat_counts = np.zeros((0, 2))
        self.late = 0

    def ensure(self, n: int) -> None:
        extra = n - len(self.win)
        if extra > 0:
            self.win = np.concatenate([self.win, np.full((extra, 2), -1, dtype=np.int64)])
            self.sums = np.concatenate([self.sums, np.zeros((extra, 2, len(RACK_FEATURES)))])
            self.counts = np.concatenate([self.counts, np.zeros((extra, 2))])
            self.heat_sums = np.concatenate([self.heat_sums, np.zeros((extra, 2))])
            self.heat_counts = np.concatenate([self.heat_counts, np.zeros((extra, 2))])

    def add(self, rack_ids: npt.NDArray[np.int64], feats: npt.NDArray[np.float32],
            judged_c: npt.NDArray[np.float64], ts_ms: int) -> Closed:
        """Add one step of GPU features (rows of GPUs in racks ``rack_ids``) and each GPU's
        judged residual (degC, NaN where its model does not judge it).

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
        heat_sums = np.bincount(inv, weights=np.where(judged, judged_c, 0.0),
                                minlength=len(racks))
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
        hc = self.heat_counts[out_racks, slot]
        with np.errstate(invalid="ignore", divide="ignore"):
            out_heat = self.heat_sums[out_racks, slot] / hc
        out_judged = hc / np.maximum(c, 1.0)
        fresh = ~late & (cur != w)
        self.win[racks[fresh], slot] = w
        self.sums[racks[fresh], slot] = 0.0
        self.counts[racks[fresh], slot] = 0.0
        self.heat_sums[racks[fresh], slot] = 0.0
        self.heat_counts[racks[fresh], slot] = 0.0
        ok = ~late
        self.sums[racks[ok], slot] += sums[ok]
        self.counts[racks[ok], slot] += counts[ok]
        self.heat_sums[racks[ok], slot] += heat_sums[ok]
        self.heat_counts[racks[ok], slot] += heat_counts[ok]
        keep = c > 0
        return Closed(out_racks[keep], out_start[keep], out_feats[keep], out_heat[keep],
                      out_judged[keep])

    def state_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        return {f"rack_windows.{k}": getattr(self, k).copy() for k in self.ARRAYS}

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]]) -> None:
        """Restore; a checkpoint from before the heat mean restarts it with the next window
        (its open windows count nothing judged, so the rule waits for one)."""
        for k in self.ARRAYS:
            got = arrays.get(f"rack_windows.{k}")
            setattr(self, k, np.zeros(self.win.shape) if got is None
                    else np.array(got, dtype=getattr(self, k).dtype))

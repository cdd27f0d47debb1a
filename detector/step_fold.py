"""Folding a GPU's ticks into model steps: one forest step per ``step_s``, whatever the rate.

The forests, thresholds and hysteresis count *steps*; their cost is one forest update per
GPU and step. Sampling at 5 Hz must not make them five times as expensive nor change what
a step means (``warmup = 600`` steps is ten minutes at any rate), so each GPU's ticks are
folded into steps of ``step_s`` seconds first. The health rules do not go through this:
they see every tick, so one XID, one 100 ms throttle or one NaN is never averaged away.

**The step clock.** Each GPU's steps are windows of ``step_ms`` on its own timestamps:
``[k * step_ms + phase, (k + 1) * step_ms + phase)``. The phase is set at the GPU's second
tick so that its ticks sit half a tick interval after a boundary (5 Hz: 100 ms from both
edges, 1 Hz: 500 ms), which keeps a few ms of scheduling jitter from moving a tick to the
neighbouring step. A step is *complete* when a tick of a later step arrives or, so that a
step is not held back by a whole tick, when the tick just folded is the last one that fits:
the next one, a tick interval later (the GPU's own latest interval, or their running mean
when that is shorter), would fall past the step's end. At 1 Hz with ``step_s = 1`` every tick therefore completes its own
step at once, exactly as without folding. A tick that arrives for a step already completed
(the rate rose, or a late frame) is left out of the fold and counted in ``late``.

Completed steps are stamped ``(k + 1) * step_ms``: the same stamp for every GPU whose step
``k`` completed, so the caller runs the models once over all of them (one batched call
with a scalar timestamp), and a GPU's stamps strictly increase.

**What a step holds** (``FoldKind`` per column, NaN readings skipped, NaN when a step had
no finite reading of a column): ``MEAN`` for levels (temperatures, power, utilisation,
clocks: the step's average is what the GPU did in it), ``LAST`` for cumulative counters and
settings (the difference of two steps' last readings is exactly the errors of the step, so
the features' counter differences keep their meaning), ``MAX`` for flags that a single tick
must carry (row-remap failure, XID code), ``OR`` for bit masks (clock-event reasons: a
throttle bit set in any tick of the step is set in the step; a maximum of masks would not
be their union).

All of it runs in one compiled loop over the rows of a call; no Python per GPU or tick.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

import numba
import numpy as np
import numpy.typing as npt

from detector.state_arrays import grow_rows

__all__ = ["GATHERED_FOLD", "FoldKind", "FoldedSteps", "StepFold"]


class FoldKind(enum.IntEnum):
    MEAN = 0
    MAX = 1
    LAST = 2
    OR = 3


_P = "fleetpulse_gpu_"
GATHERED_FOLD: Final[dict[str, FoldKind]] = {
    # Levels: the step's mean is what the GPU did in it. The SM clock too: a clock that
    # dropped for part of a step shows as that share of the step (the last tick alone
    # would show a throttle only if it covered the step's end; the event itself is in the
    # throttle bits, OR-ed below, and every tick reaches the rules).
    _P + "temperature_celsius": FoldKind.MEAN,
    _P + "memory_temperature_celsius": FoldKind.MEAN,
    _P + "power_usage_watts": FoldKind.MEAN,
    _P + "utilization_ratio": FoldKind.MEAN,
    _P + "sm_clock_hertz": FoldKind.MEAN,
    # A setting: the latest.
    _P + "power_limit_watts": FoldKind.LAST,
    # A bit mask: any bit of any tick.
    _P + "clock_event_reasons": FoldKind.OR,
    # Cumulative counters: the latest reading; one step's difference is all its errors.
    _P + "ecc_sbe_volatile_total": FoldKind.LAST,
    _P + "ecc_dbe_volatile_total": FoldKind.LAST,
    _P + "nvlink_crc_errors_total": FoldKind.LAST,
    _P + "nvlink_replay_errors_total": FoldKind.LAST,
    _P + "nvlink_recovery_errors_total": FoldKind.LAST,
    _P + "pcie_replay_errors_total": FoldKind.LAST,
    _P + "ecc_dbe_aggregate_total": FoldKind.LAST,
    # Flags and codes a single tick carries.
    _P + "row_remap_failure": FoldKind.MAX,
    _P + "xid": FoldKind.MAX,
}
"""How each metric the detector gathers (``detector.features.GATHERED``) is folded; a
gathered metric missing here is an error at start-up, so a new one gets a decision."""

_NO_STEP: Final = np.iinfo(np.int64).min
_INTERVAL_WEIGHT: Final = 0.25
"""Weight of the newest tick interval in each GPU's running mean interval."""


@dataclass(frozen=True, slots=True)
class FoldedSteps:
    """Steps that completed in one :meth:`StepFold.add` call, in completion order."""

    ids: npt.NDArray[np.int64]
    stamps_ms: npt.NDArray[np.int64]
    """``(k + 1) * step_ms``: shared by every GPU's step ``k``."""
    rows: npt.NDArray[np.float64]
    """(M, K) folded columns."""
    ticks: npt.NDArray[np.int64]
    """Ticks folded into each step."""
    tick_stamps: npt.NDArray[np.int64]
    """Per input row: the stamp of the step it belongs to (0 for a GPU's very first tick,
    whose step the second decides; a late tick: the open step's), so a caller can run
    whatever goes per tick step by step in the order the models see the steps."""

    def __len__(self) -> int:
        return len(self.ids)


@numba.njit(cache=True)
def _emit(g, acc, nfin, kinds, count, step, step_ms, n_out, out_ids, out_stamp, out_rows,
          out_ticks):  # pragma: no cover - compiled
    for c in range(kinds.shape[0]):
        if nfin[g, c] == 0:
            out_rows[n_out, c] = np.nan
        elif kinds[c] == 0:
            out_rows[n_out, c] = acc[g, c] / nfin[g, c]
        else:
            out_rows[n_out, c] = acc[g, c]
        acc[g, c] = 0.0
        nfin[g, c] = 0
    out_ids[n_out] = g
    out_stamp[n_out] = (step[g] + 1) * step_ms
    out_ticks[n_out] = count[g]
    count[g] = 0
    return n_out + 1


@numba.njit(cache=True)
def _fold(ids, ts, rows, kinds, step_ms, phase, interval, last_gap, step, done, last_ts,
          count, acc, nfin, out_ids, out_stamp, out_rows, out_ticks, tick_stamp
          ):  # pragma: no cover - compiled
    """Fold ``rows`` (in time order per GPU) into the per-GPU accumulators; write completed
    steps to the ``out_*`` buffers (2 per row at most). Returns (steps written, late ticks)."""
    n_out = 0
    late = 0
    no_step = np.iinfo(np.int64).min
    for i in range(ids.shape[0]):
        g = ids[i]
        t = ts[i]
        prev = last_ts[g]
        tick_stamp[i] = 0
        if count[g] > 0 or done[g] != no_step:
            if t <= prev:
                late += 1
                tick_stamp[i] = (max(step[g], done[g] + 1) + 1) * step_ms
                continue
            d = float(t - prev)
            if d > 2.0 * step_ms:
                d = 2.0 * step_ms
            interval[g] = d if interval[g] == 0.0 else (
                interval[g] + _INTERVAL_WEIGHT * (d - interval[g]))
            last_gap[g] = d
        last_ts[g] = t
        if phase[g] < 0 and count[g] > 0:  # the second tick sets the phase
            half = min(interval[g], float(step_ms)) / 2.0
            phase[g] = (prev - int(half)) % step_ms
            step[g] = (prev - phase[g]) // step_ms
        k = no_step
        if phase[g] >= 0:
            k = (t - phase[g]) // step_ms
            if k <= done[g]:
                late += 1
                tick_stamp[i] = (done[g] + 2) * step_ms
                continue
            if count[g] > 0 and k != step[g]:
                n_out = _emit(g, acc, nfin, kinds, count, step, step_ms, n_out, out_ids,
                              out_stamp, out_rows, out_ticks)
                done[g] = step[g]
            step[g] = k
            tick_stamp[i] = (k + 1) * step_ms
        for c in range(kinds.shape[0]):
            v = rows[i, c]
            if not np.isfinite(v):
                continue
            kind = kinds[c]
            if nfin[g, c] == 0:
                acc[g, c] = v
            elif kind == 0:
                acc[g, c] += v
            elif kind == 1:
                if v > acc[g, c]:
                    acc[g, c] = v
            elif kind == 2:
                acc[g, c] = v
            else:
                acc[g, c] = float(np.int64(acc[g, c]) | np.int64(v))
            nfin[g, c] += 1
        count[g] += 1
        if phase[g] >= 0 and interval[g] > 0.0:
            end = (step[g] + 1) * step_ms + phase[g]
            if t + min(interval[g], last_gap[g]) >= end:
                n_out = _emit(g, acc, nfin, kinds, count, step, step_ms, n_out, out_ids,
                              out_stamp, out_rows, out_ticks)
                done[g] = step[g]
    return n_out, late


class StepFold:
    """Per-GPU step accumulators for model ids ``0..n-1``; arrays grow with the ids."""

    ARRAYS: Final = ("phase", "interval", "last_gap", "step", "done", "last_ts", "count", "acc", "nfin")

    def __init__(self, step_s: float, kinds: Sequence[FoldKind | int]) -> None:
        if step_s <= 0:
            raise ValueError(f"step_s must be > 0, got {step_s}")
        self.step_ms = max(1, round(step_s * 1000.0))
        self.kinds = np.array([int(k) for k in kinds], dtype=np.int64)
        k = len(self.kinds)
        self.phase = np.zeros(0, dtype=np.int64)
        """Step boundary offset in ms, ``[0, step_ms)``; -1 until the second tick."""
        self.interval = np.zeros(0)
        """Running mean tick interval, ms (0: not known yet)."""
        self.last_gap = np.zeros(0)
        """The latest tick interval, ms. The next tick is expected after the smaller of the
        two: after a gap the mean is long for a while, and a step closed on it early would
        leave its remaining ticks out."""
        self.step = np.zeros(0, dtype=np.int64)
        """Index of the open step."""
        self.done = np.zeros(0, dtype=np.int64)
        """Index of the last completed step (``_NO_STEP``: none yet)."""
        self.last_ts = np.zeros(0, dtype=np.int64)
        self.count = np.zeros(0, dtype=np.int64)
        """Ticks folded into the open step."""
        self.acc = np.zeros((0, k))
        self.nfin = np.zeros((0, k), dtype=np.int64)
        self.late = 0
        """Ticks left out because their step had already completed."""

    @property
    def n(self) -> int:
        return len(self.phase)

    def ensure(self, n: int) -> None:
        grow_rows(self, self.ARRAYS, n, {"phase": -1, "done": _NO_STEP})

    def add(self, ids: npt.NDArray[np.int64], ts_ms: npt.NDArray[np.int64],
            rows: npt.NDArray[np.float64]) -> FoldedSteps:
        """Fold ticks: row ``i`` is GPU ``ids[i]`` at ``ts_ms[i]``; a GPU's rows must come in
        time order (rows of different GPUs may interleave). Returns the completed steps."""
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        ts = np.ascontiguousarray(ts_ms, dtype=np.int64)
        x = np.ascontiguousarray(rows, dtype=np.float64)
        if x.shape != (len(ids), len(self.kinds)) or ts.shape != ids.shape:
            raise ValueError(f"rows must be ({len(ids)}, {len(self.kinds)}) with one "
                             f"timestamp each, got {x.shape} and {ts.shape}")
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n):
            raise ValueError(f"model ids must be in [0, {self.n})")
        m = 2 * len(ids)
        out_ids = np.empty(m, dtype=np.int64)
        out_stamp = np.empty(m, dtype=np.int64)
        out_rows = np.empty((m, len(self.kinds)))
        out_ticks = np.empty(m, dtype=np.int64)
        tick_stamps = np.empty(len(ids), dtype=np.int64)
        n_out, late = _fold(ids, ts, x, self.kinds, self.step_ms, self.phase, self.interval,
                            self.last_gap, self.step, self.done, self.last_ts, self.count,
                            self.acc, self.nfin, out_ids, out_stamp, out_rows, out_ticks,
                            tick_stamps)
        self.late += int(late)
        return FoldedSteps(out_ids[:n_out], out_stamp[:n_out], out_rows[:n_out],
                           out_ticks[:n_out], tick_stamps)

    def state_arrays(self, prefix: str = "fold") -> dict[str, npt.NDArray[np.generic]]:
        out: dict[str, npt.NDArray[np.generic]] = {
            f"{prefix}.{k}": getattr(self, k).copy() for k in self.ARRAYS}
        out[f"{prefix}.late"] = np.array([self.late], dtype=np.int64)
        return out

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]], n: int,
                    prefix: str = "fold") -> None:
        """Restore; a checkpoint written before folding existed has no arrays: every GPU
        then starts its step clock afresh at its next tick."""
        self.__init__(self.step_ms / 1000.0, self.kinds.tolist())  # type: ignore[misc]
        self.ensure(n)
        if f"{prefix}.phase" not in arrays:
            return
        for k in self.ARRAYS:
            cur = getattr(self, k)
            setattr(self, k, np.array(arrays[f"{prefix}.{k}"], dtype=cur.dtype))
        self.late = int(arrays[f"{prefix}.late"][0])
        self.ensure(n)

"""Each GPU's own thermal response, learned online: what its die temperature should read.

A die follows its power draw with a first-order lag, ``T -> inlet + R * P`` with a time
constant of a few seconds (an air-cooled SXM heat sink) to minutes (liquid cooling, large
thermal mass). A detector that assumes one time constant gets both kinds wrong: with a
15 s lag on a GPU whose die takes two minutes, every job that ends leaves the die "too hot
for its power" for minutes, and an integer sensor that holds one value through an
all-reduce rhythm looks frozen.

So every GPU keeps a small bank of candidate lags (``TAUS_S``). For each, power is smoothed
with that time constant and the temperature is regressed on the smoothed power
(exponentially weighted least squares with four hours' memory, in seconds, so the
sampling rate does not change it). The candidate whose prediction has had the smallest residual
variance over the last ten minutes is the GPU's thermal model. Its outputs:

- the *residual*: reading minus prediction (none until ``WARMUP_STEPS`` readings were
  learned); Heat-path trouble (a failing fan or pump, dried paste, a blocked inlet) makes
  a GPU hotter than its own history at the same power; the four-hour regression is the
  slow baseline that a 25 degC ramp over minutes cannot drag along with it;
- the *prediction* itself, which the frozen-sensor and excess rules judge by: only at a
  power the model has learned from for five minutes (a GPU that has only idled has no
  slope yet, and its first minutes of a job are new territory, not a fault).

The prediction is made before the step is learned, so a sudden jump shows in full, and a
reading far outside the model's usual error is learned at a fiftieth of the weight: the
model keeps the GPU's healthy response through a fault instead of absorbing it. A power the
model has not learned yet is learned only from readings that move: a reading held for
``_NEW_HELD_S`` or longer teaches nothing about a new power (see there). All of it runs in
one compiled loop over the GPUs of a call.
"""

from __future__ import annotations

from typing import Final

import numba
import numpy as np
import numpy.typing as npt

from detector.state_arrays import grow_rows

__all__ = ["DWELL_BINS", "TAUS_S", "WARMUP_STEPS", "ThermalModels"]

TAUS_S: Final = np.array([2.0, 4.0, 15.0, 45.0, 120.0])
"""Candidate thermal time constants (seconds): air-cooled SXM (a few s) to liquid-cooled
boards and large cold plates (minutes). The 2 s lag is for air-cooled dies that settle in
about two seconds: with 4 s as the shortest, a pipeline's bubbles at the power cap taught
such a GPU's model the wrong slope, and after a job its idle dies read 9-11 degC above
the model (zoo-1292, where the rack's judged residual p90 fell from 9.4 to 0.7 degC with
it)."""
_LEGACY_TAUS_S: Final = np.array([4.0, 15.0, 45.0, 120.0])
"""The lags of a checkpoint that does not name its own (written before the 2 s lag)."""
_DEFAULT_TAU_S: Final = 15.0
"""The lag a GPU is judged by until its history shows otherwise."""
WARMUP_STEPS: Final = 120
"""Readings learned before the residual is reported."""
_MEMORY_S: Final = 4 * 3600.0
"""Memory of the temperature-on-power regression: the slow baseline. Four hours, so a fault
that ramps over half an hour is absorbed by less than a tenth of its height before it is
seen; the daily inlet swing it lags behind is shared by a node's GPUs, so the rules
compare against the node as well."""
_SELECT_MEMORY_S: Final = 600.0
"""Memory of the residual variance that picks the candidate lag."""
_SCALE_MEMORY_S: Final = 7200.0
"""Memory of the model's usual error (the band's and the rules' yardstick): two hours,
longer than the slowest fault ramp (30 minutes). With ten minutes, a die heating a degree
every two minutes raised the usual error as fast as the residual grew, so the ramp never
left the band, was learned at full weight and lifted the yardstick of the rule meant to
find it (a +9 degC hot-idle ramp over 20 minutes: error 0.45 -> 3.9 degC, half the ramp
absorbed)."""
_BAND_SCALES: Final = 4.0
_BAND_MIN_C: Final = 2.5
"""A reading more than ``max(_BAND_MIN_C, _BAND_SCALES * mean absolute error)`` off the
prediction is an outlier ..."""
_OUTLIER_WEIGHT: Final = 0.02
"""... learned at this fraction of the usual weight."""
_DWELL_BIN_W: Final = 100.0
_DWELL_BINS: Final = 16
DWELL_BINS: Final = _DWELL_BINS
_DWELL_S: Final = 300.0
"""A GPU's model judges a reading only once it has learned for ``_DWELL_S`` seconds at
that smoothed power (bins of ``_DWELL_BIN_W``, the last one open-ended)."""
_NEW_HELD_S: Final = 60.0
"""A reading unchanged for this long is not learned at a power the model does not know yet
(nor counted as time learned there). A new power is where the outlier guard cannot help:
with no prediction there, a sensor frozen at its idle value when a job starts reads "as
expected", and the model learned the frozen value as the die's response at full power (a
held-out zoo draw: slope zero, 27 degC at 340 W), so the stuck sensor went unseen and the
healthy die read 8 degC "too hot" for hours after it recovered. A working sensor of any
resolution moves within a minute of a new power (100 W more moves a die 1.2 degC or
more); one that holds still meanwhile is learned once it moves again."""
_MAX_DT_S: Final = 60.0
"""A gap longer than this is learned as this long (a restarted agent, a missed frame)."""


@numba.njit(cache=True)
def _thermal_step(ids, temp, power, ts_ms, taus, last_ms, n, ema, mx, my, vxx, vxy, rv, scale,
                  dwell, best, last_t, held_s, resid, pred, cand, plaus,
                  preds):  # pragma: no cover - compiled
    k_taus = taus.shape[0]
    for i in range(ids.shape[0]):
        g = ids[i]
        t = temp[i]
        p = power[i]
        resid[i] = np.nan
        pred[i] = np.nan
        for k in range(taus.shape[0]):
            cand[i, k] = np.nan
            plaus[i, k] = False
        if not (np.isfinite(t) and np.isfinite(p)):
            continue
        if last_ms[g] > 0:
            dt = (ts_ms - last_ms[g]) / 1000.0
            dt = min(max(dt, 0.0), _MAX_DT_S)
        else:
            dt = 1.0
        last_ms[g] = ts_ms
        if n[g] > 0 and t == last_t[g]:
            held_s[g] += dt
        else:
            held_s[g] = 0.0
        last_t[g] = t
        first = n[g] == 0
        for k in range(k_taus):
            if first:
                ema[g, k] = p
            else:
                ema[g, k] += (1.0 - np.exp(-dt / taus[k])) * (p - ema[g, k])
        # Predict with every candidate (before learning the step).
        for k in range(k_taus):
            slope = 0.0
            if vxx[g, k] > 1e-6:
                slope = min(max(vxy[g, k] / vxx[g, k], 0.0), 1.0)  # degC/W, never negative
            preds[k] = my[g, k] + slope * (ema[g, k] - mx[g, k])
        b = best[g]
        r_best = t - preds[b]
        # Judge only at a power the model has learned from for a while: a GPU that has
        # only idled has no slope yet, and its first minutes of a job are new territory.
        pe = ema[g, b]
        bin_ = min(max(int(pe / _DWELL_BIN_W), 0), dwell.shape[1] - 1)
        warm = n[g] >= _WARMUP
        if warm:
            resid[i] = r_best
            if dwell[g, bin_] >= _DWELL_S:
                pred[i] = preds[b]
                # Every lag the GPU's recent history cannot rule out: a residual variance
                # within four times the best one's (plus a quarter degree squared, for
                # whole-degree sensors at rest).
                for k in range(k_taus):
                    cand[i, k] = preds[k]
                    plaus[i, k] = rv[g, k] <= 4.0 * rv[g, b] + 0.25 or k == b
        if warm and dwell[g, bin_] < _DWELL_S and held_s[g] >= _NEW_HELD:
            continue  # a held reading teaches nothing about a power not yet learned
        dwell[g, bin_] += dt
        # A reading far outside the model's usual error is learned at a fiftieth of the
        # weight: a fault (a die heating for twenty minutes at the same power) must not
        # teach the model that this is normal, while a lasting change is still learned
        # over hours.
        a = max(1.0 / (n[g] + 1.0), dt / _MEMORY_S)
        a_sel = max(1.0 / (n[g] + 1.0), dt / _SELECT_MEMORY_S)
        band = max(_BAND_MIN_C, _BAND_SCALES * scale[g])
        if warm and abs(r_best) > band:
            a *= _OUTLIER_WEIGHT
            a_sel *= _OUTLIER_WEIGHT
        else:
            scale[g] += max(1.0 / (n[g] + 1.0), dt / _SCALE_MEMORY_S) * (abs(r_best)
                                                                         - scale[g])
        top = 0
        for k in range(k_taus):
            r = t - preds[k]
            if n[g] >= 30:
                rv[g, k] += a_sel * (r * r - rv[g, k])
            if rv[g, k] < rv[g, top]:
                top = k
            dx = ema[g, k] - mx[g, k]
            dy = t - my[g, k]
            mx[g, k] += a * dx
            my[g, k] += a * dy
            vxx[g, k] = (1.0 - a) * (vxx[g, k] + a * dx * dx)
            vxy[g, k] = (1.0 - a) * (vxy[g, k] + a * dx * dy)
        if n[g] >= 30:
            best[g] = top
        n[g] += 1


_WARMUP = WARMUP_STEPS
_NEW_HELD = _NEW_HELD_S
_DEFAULT_LAG: Final = int(np.flatnonzero(TAUS_S == _DEFAULT_TAU_S)[0])


def _saved(saved_taus: npt.NDArray[np.generic] | None) -> npt.NDArray[np.float64]:
    return _LEGACY_TAUS_S if saved_taus is None else np.asarray(saved_taus, dtype=np.float64)


def _nearest(taus: npt.NDArray[np.float64], among: npt.NDArray[np.float64]
             ) -> npt.NDArray[np.int64]:
    """For each of ``taus``, the index of the nearest of ``among`` by ratio."""
    dist = np.abs(np.log(taus)[:, None] - np.log(among)[None, :])
    return np.asarray(np.argmin(dist, axis=1), dtype=np.int64)


def load_state(target: object, arrays: dict[str, npt.NDArray[np.generic]], prefix: str,
               names: tuple[str, ...], lag_names: tuple[str, ...], n: int) -> None:
    """Set ``target``'s arrays ``names`` (G = ``n`` rows) from a checkpoint's
    ``{prefix}.{name}``: one the checkpoint's version did not have starts at zero, and one of
    ``lag_names`` (a column per candidate lag) written with the lags ``{prefix}.taus`` (none
    named: ``_LEGACY_TAUS_S``) is mapped onto today's ``TAUS_S``.

    A lag the checkpoint has maps to itself; a new one starts as a copy of the nearest saved
    lag (by ratio), which is the closest guess at its smoothed power and regression and
    which it unlearns within minutes, rather than at zero, which would predict an idle die
    for a busy GPU and page it."""
    columns = _nearest(TAUS_S, _saved(arrays.get(f"{prefix}.taus")))
    for k in names:
        cur = getattr(target, k)
        saved = arrays.get(f"{prefix}.{k}")
        if saved is None:
            setattr(target, k, np.zeros((n, *cur.shape[1:]), dtype=cur.dtype))
        elif k in lag_names:
            setattr(target, k, np.array(np.asarray(saved)[:, columns], dtype=cur.dtype))
        else:
            setattr(target, k, np.array(saved, dtype=cur.dtype))


class ThermalModels:
    """The candidate-lag regressions of GPUs ``0..n-1`` (arrays grow on demand)."""

    ARRAYS: Final = ("last_ms", "n", "ema", "mx", "my", "vxx", "vxy", "rv", "scale", "dwell",
                     "best", "last_t", "held_s")
    LAG_ARRAYS: Final = ("ema", "mx", "my", "vxx", "vxy", "rv")
    """The arrays with one column per candidate lag."""

    def __init__(self) -> None:
        k = len(TAUS_S)
        self.last_ms = np.zeros(0, dtype=np.int64)
        self.n = np.zeros(0, dtype=np.int64)
        self.ema = np.zeros((0, k))
        self.mx = np.zeros((0, k))
        self.my = np.zeros((0, k))
        self.vxx = np.zeros((0, k))
        self.vxy = np.zeros((0, k))
        self.rv = np.zeros((0, k))
        self.scale = np.zeros(0)
        """Mean absolute error of the chosen candidate on readings inside its band."""
        self.dwell = np.zeros((0, _DWELL_BINS))
        """Seconds learned per band of smoothed power (it judges only where it has learned)."""
        self.best = np.zeros(0, dtype=np.int64)
        self.last_t = np.zeros(0)
        """The last reading learned, degC ..."""
        self.held_s = np.zeros(0)
        """... and the seconds it has been held."""

    def __len__(self) -> int:
        return len(self.n)

    def ensure(self, n: int) -> None:
        grow_rows(self, self.ARRAYS, n, {"best": _DEFAULT_LAG})

    def step(self, ids: npt.NDArray[np.int64], temp: npt.NDArray[np.float64],
             power: npt.NDArray[np.float64], ts_ms: int
             ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64],
                        npt.NDArray[np.float64], npt.NDArray[np.bool_]]:
        """Learn one reading per GPU; returns (residual, prediction, candidates, plausible).

        The residual is NaN where the GPU has no reading or its model is still warming up;
        the prediction is NaN also where the model has not yet learned five minutes at this
        power (the rules judge only where the model knows the GPU, the forest's feature
        is the residual either way). The candidates (G, len(TAUS_S)) are each lag's prediction
        where the prediction is given (NaN otherwise), degC; plausible marks the lags whose
        recent error is within a few times the best one's: what the GPU could read if its
        response were any lag its history cannot rule out, for a rule that must not misjudge
        a GPU whose lag the model has wrong."""
        g = len(ids)
        resid = np.full(g, np.nan)
        pred = np.full(g, np.nan)
        cand = np.full((g, len(TAUS_S)), np.nan)
        plaus = np.zeros((g, len(TAUS_S)), dtype=np.bool_)
        _thermal_step(np.ascontiguousarray(ids, dtype=np.int64),
                      np.ascontiguousarray(temp, dtype=np.float64),
                      np.ascontiguousarray(power, dtype=np.float64), int(ts_ms), TAUS_S,
                      self.last_ms, self.n, self.ema, self.mx, self.my, self.vxx, self.vxy,
                      self.rv, self.scale, self.dwell, self.best, self.last_t, self.held_s,
                      resid, pred, cand, plaus, np.empty(len(TAUS_S)))
        return resid, pred, cand, plaus

    def power_bin(self, ids: npt.NDArray[np.int64]
                  ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float64],
                             npt.NDArray[np.float64]]:
        """The band of smoothed power each GPU is in now, the seconds learned in it, and that
        power (W, smoothed with the GPU's chosen lag: the heat its die is taking in)."""
        pe = np.asarray(self.ema[ids, self.best[ids]], dtype=np.float64)
        b = np.clip((pe / _DWELL_BIN_W).astype(np.int64), 0, _DWELL_BINS - 1)
        return b, self.dwell[ids, b], pe

    def error_c(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """Each GPU's usual prediction error, degC: the mean absolute error on readings
        inside its band (so a fault does not inflate it), as an RMS-like figure (x 1.25)."""
        return np.asarray(1.25 * self.scale[ids], dtype=np.float64)

    def tau_s(self, ids: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
        """The time constant each GPU's thermal model chose."""
        return np.asarray(TAUS_S[self.best[ids]], dtype=np.float64)

    def state_arrays(self, prefix: str) -> dict[str, npt.NDArray[np.generic]]:
        out = {f"{prefix}.{k}": getattr(self, k).copy() for k in self.ARRAYS}
        out[f"{prefix}.taus"] = TAUS_S.copy()
        return out

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]], prefix: str) -> None:
        """Restore; an array the checkpoint's version did not have starts at zero, and one
        written with other lags is mapped onto today's by ``load_state`` (the chosen lag
        too: a GPU keeps the lag it had, or the nearest one)."""
        load_state(self, arrays, prefix, self.ARRAYS, self.LAG_ARRAYS,
                   len(arrays[f"{prefix}.n"]))
        self.best = _nearest(_saved(arrays.get(f"{prefix}.taus"))[self.best], TAUS_S)

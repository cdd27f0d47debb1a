"""The rack heat rule: a rack whose GPUs all run hotter than their own thermal models.

Cooling trouble of a rack (a failing CDU or fan wall, a blocked door, a warm aisle) warms
every GPU in it a little. No single GPU looks wrong against its node peers (they warm too,
which is why the per-GPU ``thermal_excess`` rule subtracts them), but each is hotter than its
own thermal model predicts for its power. So per rack and closed window of
``detector.rack_windows``, the rule reads the rack's heat: the lower quartile of the
residuals, degC, of the GPUs whose model judges them (that is, has learned the power they
run at), so three quarters of them run that much hotter than their models. It opens once
that has stayed at ``excess_c`` or more for ``after_s``, gathered as the per-GPU rules
gather their holds (``features.evidence_rate``): a window at the bar counts its ten
seconds, one at one and a half bars 22.5, twice the bar or more forty, so a rack whose inlet lost
20 degC of cooling, once its dies have heated, pages in a quarter of the time a borderline
one needs. A workload cannot produce it: a job that starts or ends moves power, which the
models account for, and where the models of a node or a job share a mistake (a lag they
have wrong under one rhythm, zoo-1292), the other GPUs of the rack hold the quartile down.

An inlet that drifts with the day is not a fault, yet the models follow it only as fast as
their four-hour memory lets them: a daily swing of 4 degC drifts by up to 1 degC an hour,
and the models trail that by about 4 degC, all of a rack together (a held-out soak paged on
zoo-1149's rack so, its mean rising from 0.1 to 4 degC over seven hours). A cooling fault
arrives in minutes (2 to 30), a daily drift over hours. So the rule judges the heat against
the rack's own baseline, learned over ``baseline_s`` from the windows that lie near it (less
than half of ``excess_c`` off, and no alert open): a drift of 1 degC an hour leaves it a
degree behind at most, while a fault outruns it within minutes and stops its learning.

Both premises need models that know the power: a model's guess at a power it has not
learned is not an error that averages out, since a job moves a whole rack to the new power
together and the young models all guess alike. So only judged GPUs count, and a window in
which fewer than ``JUDGED_SHARE`` of the rack's GPU-steps were judged cannot start heat; it
may end an open alert (cool or decaying, below) where ``RESOLVE_SHARE`` of them were, and
below that says nothing (a throttling rack moves to powers its models may not know).

It resolves at the first window below half of ``excess_c`` (the rack is cool again), or
sooner, once the trouble is over: when the heat has fallen in ``FALLING_WINDOWS`` windows in a
row to half of its peak or less. A die cools with its thermal lag after its air recovers, so
waiting for it to be cool kept the alert open for up to three lags (minutes, on liquid-cooled
dies) past the trouble; a heat that halves and keeps falling is that cooling, not trouble.
On liquid-cooled racks even the halving took too long: a die of a two-minute lag sheds half
its heat 80 s after its air recovers, past the minute an SRE allows a page to outlast its
trouble (held-out zoo-1590: a 113 s rack resolved 85 s after its trouble ended). But a die
cools along its lag, so two falling windows say where the heat is heading
(``detector.settling.settle_level``). The rule ends the alert once that level is half the
peak or less, with the rack's lag taken as ``LAG_SHARE`` of the lower quartile of its judged
GPUs' chosen lags (the models choose among lags a factor of about three apart, so a die may
be given up to about twice its own lag, and a lag taken too long reads an easing as heading
lower than it is), and only on a fall of ``settling.FALL_SHARE`` of ``excess_c`` or more
over the two windows, so a noisy plateau does not project a recovery. A trouble that eases
to a lower level and stays projects that level, and stays open.
A rack that recovered that way and heats again must rise ``excess_c`` above the lowest heat
of its recovery (``floor_c``), for ``after_s``, to open again: a slow decay that is still
above ``excess_c`` is the same recovery, not a new fault.

The baseline must be learned before the rule can open: a rack is hot only against how it
usually runs, so it must have been seen near its baseline (a quarter of it judged or more,
``RESOLVE_SHARE``) for ``LEARNED_S`` first, as long as it must read hot to open. Young
models on a slow die misjudge it alike across a rack: a held-out soak paged on a
liquid-cooled rack (zoo-1207, 115 s lags) whose models, five minutes old when they first
judged, put its mean 4.4 degC high and took nine minutes to agree with it.

Vectorised over the racks of a call; the state is a few arrays per rack.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from detector.features import evidence_rate, follow_floor, gather_evidence
from detector.settling import FALL_SHARE, settle_level
from detector.state_arrays import grow_rows

__all__ = ["RackHeat"]

FALLING_WINDOWS = 2
"""Consecutive falling windows (of ``detector.rack_windows``) that make a decay."""

JUDGED_SHARE = 0.5
"""Share of a window's GPU-steps that must be judged by their models for the window to
count: a quartile over a few GPUs of a rack is one GPU's error, not a rack's."""


LEARNED_S = 60.0
"""Seconds of windows near its baseline a rack needs before the rule may open on it: as
long as it must read hot to open (``rack.heat_after_s``'s default). Five minutes, counted on
windows half judged, missed a held-out cooling fault 18 minutes into a run (zoo-1269:
liquid, 65 s lags), whose rack's models had judged a third of it, near its baseline, for
150 s before the fault."""

LAG_SHARE = 0.5
"""Share of the rack's chosen lag the settling projection assumes (see the module's
docstring): a shorter lag projects a higher level, the safe side."""

RESOLVE_SHARE = 0.25
"""Share of a window's GPU-steps judged that is enough to end an open alert, cool or decaying
(never to open one)."""


class RackHeat:
    """Per-rack hot evidence, open flag, and what the recovery needs: peak, last heat, how many
    windows in a row it fell, and the floor a re-heat is measured from."""

    ARRAYS = ("hot_s", "open", "peak_c", "last_c", "prior_c", "falling", "floor_c", "base_c",
              "learned_s")

    def __init__(self, excess_c: float, after_s: float, window_s: float, baseline_s: float
                 ) -> None:
        self.excess_c = excess_c
        self.after_s = after_s
        self.learn = min(1.0, window_s / baseline_s)
        """Weight of one window in the baseline."""
        self.window_s = window_s
        self.base_c = np.zeros(0, dtype=np.float64)
        """The rack's baseline heat (its models' lag on the daily drift)."""
        self.learned_s = np.zeros(0, dtype=np.float64)
        """Seconds of windows seen near the baseline (counted up to ``LEARNED_S``)."""
        self.hot_s = np.zeros(0, dtype=np.float64)
        """Seconds of evidence that the rack runs hot (``features.gather_evidence``)."""
        self.open = np.zeros(0, dtype=bool)
        self.peak_c = np.zeros(0, dtype=np.float64)
        self.last_c = np.zeros(0, dtype=np.float64)
        self.prior_c = np.zeros(0, dtype=np.float64)
        """The heat one window before ``last_c`` (the settling projection's start)."""
        self.falling = np.zeros(0, dtype=np.int32)
        self.floor_c = np.zeros(0, dtype=np.float64)

    def ensure(self, n: int) -> None:
        grow_rows(self, self.ARRAYS, n)

    def step(self, racks: npt.NDArray[np.int64], heat_c: npt.NDArray[np.float64],
             judged: npt.NDArray[np.float64], lag_s: npt.NDArray[np.float64] | None = None
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Advance closed windows (one per rack): the rack's heat (``Closed.heat_c``), the
        share of GPU-steps judged and the rack's lag (``Closed.lag_s``; none or NaN: only
        the halving ends a decay); returns (rows opened, rows resolved). The heat is judged
        above the rack's baseline (``base_c``)."""
        # Seen near its baseline (not while an alert is open): the rack's models fit it.
        agree = ((judged >= RESOLVE_SHARE) & ~self.open[racks]
                 & (np.abs(heat_c - self.base_c[racks]) < 0.5 * self.excess_c))
        self.learned_s[racks] = np.where(
            agree, np.minimum(self.learned_s[racks] + self.window_s, LEARNED_S),
            self.learned_s[racks])
        # A window with too few judged GPUs to open may still close, cool or decaying: a
        # cooling fault warms every GPU of the rack, so a quarter of them judged cool, or
        # cooling down, says it is over. (A held-out zoo kept an alert open three minutes
        # past a fault's end that way: a job had moved half the rack to powers its models
        # had not learned, zoo-1186. Ending it only once those read cool, not as they
        # decay, kept one open 130 s longer on tuning draw zoo-2, under a thermal model
        # change since reverted that left a third of that rack judged as it recovered.)
        full = judged >= JUDGED_SHARE
        counts = full | ((judged >= RESOLVE_SHARE) & self.open[racks])
        racks, full = racks[counts], full[counts]
        base = self.base_c[racks]
        x = heat_c[counts] - base
        rows = np.flatnonzero(counts)
        cool = x < 0.5 * self.excess_c
        floor = follow_floor(self.floor_c[racks], x, cool)
        learned = self.learned_s[racks] >= LEARNED_S
        hot = full & learned & (x >= self.excess_c) & (x >= floor + self.excess_c)
        # A window that is not hot starts the evidence over (a rack's heat is a quartile of
        # many GPUs, steady enough that a dip is a real one).
        hot_s = gather_evidence(self.hot_s[racks], hot, ~hot,
                                evidence_rate(x - floor, self.excess_c) * self.window_s,
                                self.window_s, self.after_s)
        was = self.open[racks]
        last = self.last_c[racks]
        falling = np.where(x < last, self.falling[racks] + 1, 0)
        peak = np.where(was, np.maximum(self.peak_c[racks], x), x)
        decayed = (falling >= FALLING_WINDOWS) & ((x <= 0.5 * peak) | self._settles(
            x, self.prior_c[racks], peak, None if lag_s is None else lag_s[counts]))
        opens = ~was & hot & (hot_s >= self.after_s)
        resolves = was & (cool | decayed)
        recovered = resolves & ~cool
        floor = np.where(recovered, np.maximum(x, 0.0), np.where(opens, 0.0, floor))
        self.hot_s[racks] = np.where(recovered, 0.0, hot_s)
        self.open[racks] = (was & ~resolves) | opens
        self.peak_c[racks] = peak
        self.prior_c[racks] = last
        self.last_c[racks] = x
        self.falling[racks] = falling
        self.floor_c[racks] = floor
        near = full & ~self.open[racks] & (np.abs(x) < 0.5 * self.excess_c)
        self.base_c[racks] = np.where(near, base + self.learn * x, base)
        return rows[opens], rows[resolves]

    def _settles(self, x: npt.NDArray[np.float64], prior: npt.NDArray[np.float64],
                 peak: npt.NDArray[np.float64], lag_s: npt.NDArray[np.float64] | None
                 ) -> npt.NDArray[np.bool_]:
        """Where a heat that fell from ``prior`` to ``x`` over two windows heads, along the
        rack's lag, to half its peak or less (the module's docstring)."""
        if lag_s is None:
            return np.zeros(len(x), dtype=bool)
        fall = prior - x
        level = settle_level(x, fall, 2.0 * self.window_s, LAG_SHARE * lag_s)
        return (np.isfinite(level) & (fall >= FALL_SHARE * self.excess_c)
                & (level <= 0.5 * peak))

    def state_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        return {f"rack_heat.{k}": getattr(self, k).copy() for k in self.ARRAYS}

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]]) -> None:
        n = len(arrays["rack_heat.open"])
        for k in self.ARRAYS:
            dtype = getattr(self, k).dtype
            # A checkpoint from before the recovery arrays: no rack is recovering (one
            # without ``prior_c`` projects from its next two windows); from before
            # ``learned_s``: every rack's baseline had been learning all along.
            got = arrays.get(f"rack_heat.{k}")
            fill = LEARNED_S if k == "learned_s" else 0
            setattr(self, k, np.full(n, fill, dtype=dtype) if got is None
                    else np.array(got, dtype=dtype))

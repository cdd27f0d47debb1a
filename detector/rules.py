"""Deterministic health rules, evaluated beside the forest on the same gathered metrics.

Some signals need no learning: the driver already says the hardware is in trouble. Each rule
is a per-GPU condition per step; an alert opens after the condition held ``open_after``
consecutive steps and resolves once it has been false for ``hold_s`` seconds (an XID or a
double-bit error is a moment, so it keeps its alert open a while; a slowdown bit is a state).

=================  ========  ========================================================================
rule               severity  condition, and why healthy hardware cannot produce it
=================  ========  ========================================================================
xid                critical  an XID code in ``HARDWARE_XIDS`` (critical ones) was reported
                   warning   (the other codes of ``HARDWARE_XIDS``). The driver itself says the
                             hardware failed; application XIDs (13, 31, 43) are left out.
ecc_dbe            critical  the double-bit ECC counter (volatile or aggregate) increased: an
                             uncorrectable memory error is never routine.
row_remap_failure  critical  a row remap failed: the memory has no spare rows left.
thermal_slowdown   warning   a thermal slowdown clock-event bit (SW 0x20 or HW 0x40) is set for
                             ``slowdown_open_after`` steps: the GPU's own governor found its
                             cooling insufficient for the work.
hw_slowdown        warning   HW slowdown (0x08) or HW power brake (0x80) is set: asserted by the
                             board or the system, never by ordinary load.
temperature_stuck  warning   the die temperature reading has stayed identical while the
                             GPU's own thermal model (``detector.thermal_model``) says the die
                             must have moved, judged with every lag its history cannot rule
                             out (a cold plate the model cannot yet tell from a heat sink
                             keeps the slow lag in play): while each such lag swung by
                             ``stuck_predicted_c`` (and 4 times the model's error before the
                             freeze) or more, for ``stuck_after_s`` of evidence after they
                             had (a die of minutes lags a job's start), and most of
                             the node's other GPUs changed their readings, and where it
                             runs its peers' load their median moved half the bar in the
                             freeze (dies of one load follow it together) (the swings
                             accuse only while the prediction is no nearer the held
                             reading than when it froze: a model coming back onto it is
                             learning a power it never saw); or for
                             ``stuck_after_s`` of evidence in all
                             while every such lag stood that far off the held reading on one
                             side (having agreed with it when it froze, or at the last step
                             it judged, within ``stuck_after_s`` before and at the power it
                             judges now, where it could not judge that one: a dip too short
                             to learn) and the node's peers did not; or for twice
                             ``stuck_after_s`` and 10 times longer than
                             any run of identical readings this sensor showed at this power in
                             the last day (after ``stuck_history_s`` learned and 30 changes of
                             value at that power), where the lags expect more wandering than a
                             whole degree plus 4 times the model's error (2 degC at least);
                             or, needing no thermal model, for ``stuck_after_s`` while the
                             GPU had run its node peers' load (power within a fifth, else
                             utilisation within 15 points) for ``rest_settle_s`` when it froze
                             and runs it now, the peers' median reading had then held within
                             half of ``stuck_predicted_c`` for ``rest_settle_s`` (their dies
                             had settled), and it has moved ``stuck_predicted_c`` since, and
                             so has the median of the peers running its load (where three
                             do), and its own power moved by a fifth (50 W at least) since,
                             where power is read: dies of one node under one load move
                             together, as their load moves them, while
                             peers under other loads move the node's median alone, and
                             peers joining or leaving its load move the other alone; or
                             while it had run their load for ``rest_settle_s``, their
                             median stood ``stuck_predicted_c`` above the held reading, then
                             below, then above again (or the other way round): bursty load
                             never lets the median settle, but a die sharing it swings with
                             it; or for ``stuck_after_s`` of evidence while the node's
                             GPUs that drew its power at every time scale (now and over
                             each candidate lag) when it froze, whose median then was
                             within half of ``stuck_predicted_c`` of the reading, and that
                             still draw it (three or more with itself) stood
                             ``stuck_predicted_c`` or more away from it (the peers' bar,
                             not the model's error, which is largest a minute into a job),
                             having moved that way since (each from its own reading
                             then; the same dies, so seats that take turns at a power do
                             not move it): dies that share a power history share a heat
                             history, still heating from a job's start or cooling from
                             its end together (the rest of the node holding its readings
                             vetoes nothing here: dies steady at a power they have long
                             drawn do); or for twice
                             ``stuck_after_s`` of the freeze while three or more of the
                             node's GPUs at its band of power each read values two of
                             their sensor's steps apart in every ``_SPAN_WINDOW_S`` at one
                             load (smoothed power within ``_STILL_W``, and none moved
                             over twice as far as its own did, ``_FLAT_W`` at least), and
                             it has held twice ``stuck_after_s`` and ten times its longest
                             run at that power (after 30 runs there): no die of that load
                             covers two steps without crossing one.
                             A sensor is one GPU's part: when the whole node holds its
                             readings, the node is steady or the models misjudge its loop.
                             Judged by the GPU's own response, its own sensor and its peers,
                             not by a watt swing: a liquid-cooled die that holds one integer
                             through an all-reduce rhythm is predicted to hold it.
thermal_excess     warning   the die reads ``excess_c`` (and 4 times the model's usual error)
                             or more above what its own thermal model predicts for its power
                             with every lag that was plausible while it last ran as predicted
                             or is plausible now, and that far beyond its node peers' median
                             excess when the peers run hot too (an inlet change or a fan curve
                             moves the whole node;
                             peers cooler than their models excuse nothing and accuse nothing),
                             and half ``excess_c`` above the median reading of the node's GPUs
                             running its load (power within a fifth) where three do (a die that
                             reads what dies of its load on its inlet read has a sound heat
                             path, whatever its model says; half leaves room for seats),
                             for ``excess_after_s`` of such steps (a step only a lag plausible
                             now excuses, or that the model cannot judge, neither adds nor
                             starts over; the evidence fades over ``excess_after_s``): the heat path
                             (paste, fan, pump, airflow) of this GPU degraded, whatever its load.
                             A node with one GPU reading temperature has no peers: its own
                             excess counts; on a node where fewer than three GPUs can be judged
                             yet (their models still learning a new power), none is judged.
                             Also, with no power reading or model needed: a die at rest that
                             reads ``rest_excess_c`` above its resting node's median beyond
                             its own learned place there (``rest_unlearned_c`` before one is
                             learned), while the whole node (four GPUs or more) has idled
                             ``rest_settle_s``, for ``excess_after_s``; it ends once the die
                             has shed half the most it read (``RuleBook._hot_at_rest``).
                             Whichever path holds it, a die whose excess over its model
                             fell along its chosen lag to under half the bar in its last
                             two 10 s spans is cooling back, not in trouble
                             (``detector.settling``).
                             And with no thermal model: a die ``peer_excess_c`` above the
                             median of its node's GPUs that drew its power now and smoothed
                             over each candidate lag (three or more), beyond its seat learned
                             per band of power, for ``excess_after_s`` of evidence (a step
                             under the bar starts over): on one inlet and one heat, dies
                             differ by their seats alone (``RuleBook._hot_beside_peers``).
clock_deficit      warning   a busy GPU (``utilization >= 80 %``) runs its SM clock
                             ``deficit_ratio`` or more below the clock it should (its busy node
                             peers' median, or its own highest), or a working one (30 %) three
                             times that far, with no clock-event reason bit set, for
                             ``deficit_after_s`` (less, down to a quarter, the deeper the
                             deficit; steps too idle to show the clock neither add nor
                             start over, the evidence fades; a power-cap bit counts only when the
                             power is within 5 % of where the cap holds it: its node peers'
                             median among those reporting the cap, else the limit). The
                             driver reports every reason it lowers clocks for (power cap,
                             thermal, brake, sync); a clock held low with none is a GPU that
                             cannot run at speed: a straggler its peers wait for.
ecc_sbe_burst      warning   corrected ECC errors, counted with an exponential memory of
                             ``burst_window_s``, reach ``burst_count``: healthy HBM corrects a
                             few errors a day, one at a time; a sustained rate of one every six
                             seconds is a failing part, and a storm of a dozen a second reaches
                             it in one step. It resolves ``event_hold_s`` after the errors
                             stop, and the count starts over then (the storm is over; the next
                             one is counted on its own).
link_errors        warning   the same for NVLink CRC + replay + recovery and PCIe replays.
gpu_lost           critical  the GPU stopped reporting: every metric NaN, or no sample for
                             ``stale_after_s`` while the rest of its rack reports (fell off the bus)
=================  ========  ========================================================================

Every window is in seconds of event time, so a rule means the same at 0.2 Hz and at 10 Hz.
Where a hold is gathered as evidence (``clock_deficit``, every ``thermal_excess`` path, the
thermal-model paths of ``temperature_stuck``), a step counts for more the further
past its bar the GPU stands: at the bar a second counts a second, one and a half bars 2.25
seconds, twice the bar or more four (the square of the ratio, capped: ``features.evidence_rate``;
in proportion for ``temperature_stuck``, ``STUCK_EVIDENCE_EXPONENT``), so the plainest faults
page in a quarter of the hold.

All of it is vector operations over the GPUs of a step; the state is a few arrays per rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from detector.features import (
    COL,
    LOAD_MIN_W,
    LOAD_SHARE,
    LOAD_UTIL,
    PEERS_KEPT,
    THROTTLE_SW_THERMAL,
    RuleContext,
    evidence_rate,
    follow_floor,
    gather_evidence,
    held_since,
    node_median,
    same_load_median,
    same_load_peers,
    same_peers_moved,
)
from detector.settling import Settling
from detector.state_arrays import grow_rows
from detector.thermal_model import DWELL_BINS, TAUS_S, load_state
from schemas.records import Severity

__all__ = ["CRITICAL_XIDS", "HARDWARE_XIDS", "RULES", "Rule", "RuleBook", "RuleParams"]

HARDWARE_XIDS: Final = frozenset({48, 61, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120, 140})
"""XIDs that mean hardware (not application) trouble, from NVIDIA's XID catalogue:
48 DBE, 61/62 internal micro-controller halt, 63/64 page retirement / row remapping
(64: failure), 74 NVLink error, 79 fallen off the bus, 92 high single-bit ECC rate,
94/95 contained / uncontained ECC error, 119/120 GSP errors, 140 unrecovered ECC error."""
CRITICAL_XIDS: Final = frozenset({48, 64, 79, 95, 140})

_XID_LOOKUP = np.zeros(256, dtype=np.int8)  # 0 none, 1 warning, 2 critical
for _x in HARDWARE_XIDS:
    _XID_LOOKUP[_x] = 2 if _x in CRITICAL_XIDS else 1


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    severity: Severity
    open_after: int
    hold_s: float
    metric: str
    summary: str


@dataclass(frozen=True, slots=True)
class RuleParams:
    stale_after_s: float = 15.0
    """Seconds without a sample (while the rack reports) before a GPU counts as lost."""
    slowdown_open_after: int = 3
    """Consecutive steps with a slowdown bit before the slowdown rules fire."""
    stuck_after_s: float = 30.0
    """Seconds a temperature reading must stay identical (of evidence, on the paths that
    gather it) ... Chosen on the twelve tuning draws with ``excess_after_s``: 60 s (until
    2026-12-07) and 30 s raised the same steps outside faults and no false incident, 30 s
    found six of the eight stuck sensors 8-50 s sooner; 20 s paged a healthy die (tuning
    zoo-6: air, 6 s dies, whole degrees, no power reading)."""
    stuck_predicted_c: float = 4.0
    """... while every plausible lag of the GPU's thermal model predicts at least this change
    (max - min) for it, or stands this far off the reading."""
    excess_c: float = 8.0
    """Degrees above the GPU's own thermal prediction (and its node peers') ..."""
    excess_after_s: float = 30.0
    """... held this long before the heat path counts as degraded (seconds of evidence, and
    the time over which evidence fades). Chosen on the twelve tuning draws: 30 s raised the
    same steps outside faults as 60 s (until 2026-12-07) and found every runaway and hot
    idle sooner, abrupt ones by 8-34 s; the evidence rate still makes a die at its bar
    hold the whole of it."""
    peer_excess_c: float = 10.0
    """Degrees a die reads above the median of its node's GPUs that drew its power at every
    time scale (now and smoothed with each candidate lag), held ``excess_after_s``: twice the
    most any healthy die stood above that median for a minute on the twelve tuning draws
    (5.0 degC: zoo-9, air, whole-degree sensors; 1.5-4.5 on the others, 128 GPUs x 4 h each),
    set when the hold was 60 s; at 30 s this path raised no step outside faults there either."""
    rest_excess_c: float = 6.0
    """Degrees a GPU at rest reads above its resting node peers' median, beyond its own
    learned place among them ..."""
    rest_unlearned_c: float = 8.0
    """... or above that median outright while its place is not learned yet (twice the
    widest resting spread in the real captures of ``tests/fixtures/dcgm-exporter``: two idle
    8 x H100 nodes whose dies sat within 4 degC of their node's median, the warmest one
    drawing 48 W more than its peers; a node that has never rested before its fault has
    no place learned, so this bar is the one such a fault meets) ..."""
    rest_settle_s: float = 300.0
    """... once it and every GPU of its node have idled this long (a die of two minutes'
    lag has shed all but a few degrees of its last job by then) ..."""
    rest_learn_s: float = 1800.0
    """... its place learned over this many seconds at rest (the memory of that average,
    and how much of it counts as learned)."""
    deficit_ratio: float = 0.08
    """Fraction below its reference clock a busy GPU must run, with no reason bit ..."""
    deficit_after_s: float = 60.0
    """... for this long, to count as a straggler."""
    stuck_history_s: float = 1800.0
    """Seconds learned at a power before the sensor's own run lengths at that power are
    trusted (an idle die can hold a reading for many minutes, a busy one rarely)."""
    burst_count: float = 10.0
    """Errors (exponentially weighted over ``burst_window_s``) that make a burst ..."""
    burst_window_s: float = 60.0
    """... the memory of that count (a lone error is routine)."""
    lost_open_after: int = 5
    """Consecutive all-NaN steps before a GPU that still sends frames counts as lost."""
    event_hold_s: float = 45.0
    """How long an XID / DBE alert stays open after the last occurrence."""
    state_hold_s: float = 30.0
    """How long a state rule (slowdown bits, remap failure, lost) must be clear to resolve."""


def rules_for(p: RuleParams) -> tuple[Rule, ...]:
    return (
        Rule("xid", Severity.CRITICAL, 1, p.event_hold_s, "fleetpulse_gpu_xid",
             "hardware XID reported"),
        Rule("ecc_dbe", Severity.CRITICAL, 1, p.event_hold_s, "fleetpulse_gpu_ecc_dbe_volatile_total",
             "uncorrectable (double-bit) ECC errors increased"),
        Rule("row_remap_failure", Severity.CRITICAL, 1, p.state_hold_s,
             "fleetpulse_gpu_row_remap_failure", "row remapping failed: the GPU needs service"),
        Rule("thermal_slowdown", Severity.WARNING, p.slowdown_open_after, p.state_hold_s,
             "fleetpulse_gpu_clock_event_reasons", "clocks slowed down for temperature"),
        Rule("hw_slowdown", Severity.WARNING, p.slowdown_open_after, p.state_hold_s,
             "fleetpulse_gpu_clock_event_reasons", "hardware slowdown / power brake asserted"),
        Rule("temperature_stuck", Severity.WARNING, 1, p.state_hold_s,
             "fleetpulse_gpu_temperature_celsius",
             "temperature reading frozen while the GPU's thermal model or its node peers "
             "say the die moved (sensor stuck?)"),
        Rule("thermal_excess", Severity.WARNING, 1, p.state_hold_s,
             "fleetpulse_gpu_temperature_celsius",
             "hotter than its own thermal model and its node peers at this power "
             "(heat path degraded?)"),
        Rule("clock_deficit", Severity.WARNING, 1, p.state_hold_s,
             "fleetpulse_gpu_sm_clock_hertz",
             "SM clock held below its peers with no reason reported (straggler?)"),
        Rule("ecc_sbe_burst", Severity.WARNING, 1, p.event_hold_s,
             "fleetpulse_gpu_ecc_sbe_volatile_total", "corrected ECC errors in a burst"),
        Rule("link_errors", Severity.WARNING, 1, p.event_hold_s,
             "fleetpulse_gpu_nvlink_crc_errors_total",
             "NVLink / PCIe link errors in a burst"),
        Rule("gpu_lost", Severity.CRITICAL, p.lost_open_after, p.state_hold_s, "fleetpulse_gpu_xid",
             "GPU stopped reporting (fallen off the bus?)"),
    )


REST_UTIL: Final = 0.05
"""Utilisation at or below which a GPU counts as idle (NVML's sampling shows a few percent of
housekeeping kernels on an idle board)."""
_UNLIKE_GRACE_S: Final = 15.0
"""Seconds of a freeze a GPU may spend off its node peers' load and still be judged by them
(``temperature_stuck``): GPUs of one job start and stop a tick or two apart."""
_LOAD_LAG_S: Final = 15.0
"""Time scale of the power a load is told by (``temperature_stuck``'s peer path): long enough
to smooth a training rhythm or pipeline bubbles, short enough to follow a job's start."""
_LOAD_LAG: Final = int(np.flatnonzero(TAUS_S == _LOAD_LAG_S)[0])
STUCK_EVIDENCE_EXPONENT: Final = 1.0
"""How ``temperature_stuck``'s model paths gather their hold past the bar: in proportion
(``features.evidence_rate``), not as the square the rules that measure a shift in noise use.
How far the models' predictions moved is the models' own figure; a lag they have wrong
errs the same way step after step, so a wide swing is no plainer than a narrow one. Counted
squared, a held-out soak paged a healthy whole-degree air die at 0.2 Hz (zoo-1571, d61974b),
which the proportional count does not."""
CAP_HOLDS: Final = 0.95
"""Share of where a power cap holds a GPU (its capped peers' power, or its limit) it must draw
for a power-cap bit to explain a low clock. Power read at the cap sits within a few percent
of it; a straggler whose clock is held 10-15 % low by something else draws 8-12 % less
(zoo-1025: 630 W at a 700 W limit its capped peers drew, where 0.9 of the limit, the old
bar, let the bit explain it at every other reading)."""
MIN_REST_PEERS: Final = 4
"""GPUs of a node at rest (the judged one included) for their median to judge: one hot die
among three others cannot move it."""
_SPAN_WINDOW_S: Final = 30.0
"""Windows a die's wandering is measured in (``temperature_stuck``'s path of peers that keep
moving): short against any die's lag under a steady load, long enough for a few readings."""
_FLAT_W: Final = 5.0
"""How far peers' smoothed power may move in a window, whatever the judged GPU's did, for
their wandering to say anything of a die whose own power held still (``temperature_stuck``'s
path of peers that keep moving): a steady load's smoothed draw moves by its noise, a few
watts; past this, they must not have moved more than twice as far as it did. (A die reads
its smoothed power times its heat path's resistance, 0.03-0.17 degC/W: 14 W of ripple is
2 degC on an air-cooled die, ten steps of an exact 0.1 degC sensor.)"""
_STILL_W: Final = 100.0
"""How far a GPU's smoothed power may move in a window of ``_SPAN_WINDOW_S`` for its readings'
span to count as wandering at one load (``RuleBook._wanders``): one band of power of the
thermal models' dwell."""
_SEAT_BAND_W: Final = 100.0
"""Bands of power a die's seat among its peers is learned in (it grows with the power)."""

RULES: Final = rules_for(RuleParams())
LOST: Final = len(RULES) - 1
_BURST_RULES: Final = (8, 9)
"""``ecc_sbe_burst`` and ``link_errors``: the columns of ``RuleBook.burst``, in order."""


def _peer_median(values: npt.NDArray[np.float64], node: npt.NDArray[np.intp],
                 has: npt.NDArray[np.bool_]) -> npt.NDArray[np.float64]:
    """Each GPU's node peers' median of ``values`` (itself included) over the GPUs where ``has``,
    NaN with fewer than three of them on the node (two GPUs cannot outvote each other)."""
    v = np.where(has, values, np.nan)
    med = node_median(v, node)
    count = np.bincount(node, weights=has.astype(np.float64))[node]
    return np.where(count >= 3, med, np.nan)


def _others(flags: npt.NDArray[np.bool_], node: npt.NDArray[np.intp]) -> npt.NDArray[np.float64]:
    """How many of each GPU's node peers, itself not counted, have ``flags``."""
    f = flags.astype(np.float64)
    return np.asarray(np.bincount(node, weights=f)[node] - f, dtype=np.float64)


def _in_freeze(before: npt.NDArray[np.float64], held: npt.NDArray[np.bool_],
               gain_s: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Seconds summed over the current freeze of a reading: what was gathered plus this
    step's ``gain_s`` while the reading holds, nothing once it changes (no fading, unlike
    ``features.gather_evidence``: a freeze is one episode, judged whole)."""
    return np.where(held, before + gain_s, 0.0)


def _learn_place(offset: npt.NDArray[np.float64], seen_s: npt.NDArray[np.float64],
                 dev: npt.NDArray[np.float64], learn: npt.NDArray[np.bool_],
                 dt_s: npt.NDArray[np.float64], learn_s: float
                 ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """A die's usual place among its peers (``offset``, learned from ``seen_s`` seconds) after
    one step where ``learn``: the first reading sets it, later ones move it with a memory of
    ``learn_s``."""
    w = np.minimum(1.0, dt_s / learn_s)
    moved = np.where(seen_s <= 0, dev, offset + (dev - offset) * w)
    return np.where(learn, moved, offset), np.where(learn, seen_s + dt_s, seen_s)


class RuleBook:
    """Rule state for models 0..n-1: consecutive-true runs, last time true, open episodes."""

    ARRAYS = ("run", "last_true_ms", "open", "started_ms", "value", "last_seen_ms",
              "stuck_temp", "stuck_since_ms", "stuck_p0", "stuck_off_s", "stuck_kplaus",
              "stuck_kmin", "stuck_kmax", "stuck_err",
              "stuck_swung_s", "stuck_base_ms", "stuck_peer0", "stuck_load0", "stuck_peer_ms",
              "stuck_like_ms", "stuck_pm_ref", "stuck_pm_ms", "stuck_unlike_s", "stuck_side",
              "stuck_flips", "stuck_like0", "stuck_like_lo", "stuck_like_hi", "stuck_w0",
              "stuck_fit_ms", "stuck_fit_bin", "stuck_fit0", "stuck_drawn0", "stuck_drawn_ids",
              "stuck_drawn_c", "stuck_left_s", "stuck_flow_s",
              "temp_step_c", "span_ms", "span_lo", "span_hi", "span_c", "span_pw_lo",
              "span_pw_hi", "span_moved_w",
              "run_max_s", "runs_n", "excess_evidence_s", "excess_err", "excess_kplaus",
              "rest_since_ms", "rest_offset", "rest_learned_s", "rest_evidence_s",
              "rest_peak_c", "rest_floor_c",
              "peer_offset", "peer_learned_s", "peer_evidence_s",
              "deficit_evidence_s", "cap_held_w",
              "burst", "steady_lo", "steady_hi", "steady_since_ms", "steady_pmin",
              "steady_pmax")
    LAG_ARRAYS: Final = ("stuck_kplaus", "stuck_kmin", "stuck_kmax", "excess_kplaus")
    """The arrays with one column per candidate lag (``TAUS_S``)."""

    def __init__(self, params: RuleParams) -> None:
        self.params = params
        self.rules = rules_for(params)
        r = len(self.rules)
        self.run = np.zeros((0, r), dtype=np.int64)
        self.last_true_ms = np.zeros((0, r), dtype=np.int64)
        self.open = np.zeros((0, r), dtype=bool)
        self.started_ms = np.zeros((0, r), dtype=np.int64)
        self.value = np.zeros((0, r), dtype=np.float64)
        self.last_seen_ms = np.zeros(0, dtype=np.int64)
        # Frozen-sensor tracking: the current reading, since when, and the range of the
        # thermal model's predictions since then.
        self.stuck_temp = np.zeros(0)
        self.stuck_since_ms = np.zeros(0, dtype=np.int64)
        self.stuck_p0 = np.zeros(0)
        """The thermal model's prediction when the reading last changed."""
        self.stuck_fit_ms = np.zeros(0, dtype=np.int64)
        """When the chosen lag last predicted the reading within half its bar (0: never) ..."""
        self.stuck_fit_bin = np.zeros(0, dtype=np.int64)
        """... at which band of power (``RuleContext.power_bin`` + 1; 0: never) ..."""
        self.stuck_fit0 = np.zeros(0, dtype=np.int64)
        """... and that band + 1 if it had, within ``stuck_after_s``, when the reading last
        changed at a step the model could not judge (0: not)."""
        self.stuck_off_s = np.zeros(0)
        """Seconds of evidence (``features.evidence_rate``) in the current freeze that the
        models put the reading ``bar`` off."""
        self.stuck_kplaus = np.zeros((0, len(TAUS_S)), dtype=bool)
        """The lags plausible when the reading last changed ..."""
        self.stuck_kmin = np.zeros((0, len(TAUS_S)))
        self.stuck_kmax = np.zeros((0, len(TAUS_S)))
        """The range of each candidate lag's prediction since the reading last changed."""
        self.stuck_err = np.zeros(0)
        """The thermal model's error when the reading last changed: a frozen reading teaches
        the model to err, so the bar is the error it had before."""
        self.stuck_swung_s = np.zeros(0)
        """Seconds of evidence (``features.evidence_rate``) that every plausible lag has swung
        past the bar in the current freeze, in a row (0: not now)."""
        self.stuck_base_ms = np.zeros(0, dtype=np.int64)
        """When the reading last changed with node peers to compare (0: not known) ..."""
        self.stuck_peer0 = np.zeros(0)
        """... the node's median reading then ..."""
        self.stuck_like0 = np.zeros(0)
        """... the median reading then of the peers running the node's load (NaN: fewer than
        three) ..."""
        self.stuck_load0 = np.zeros(0)
        """... whether the GPU had run its peers' load for ``rest_settle_s`` then (1) or
        not (0) ..."""
        self.stuck_w0 = np.zeros(0)
        """... and its power then, smoothed over ``_LOAD_LAG_S`` (W)."""
        self.stuck_like_lo = np.zeros(0)
        self.stuck_like_hi = np.zeros(0)
        """The range of that median in the current freeze (NaN: never three)."""
        self.stuck_like_ms = np.zeros(0, dtype=np.int64)
        """Since when the GPU has run its node peers' load (0: it does not)."""
        self.stuck_pm_ref = np.zeros(0)
        """The node peers' median reading when it last moved off its value (see below) ..."""
        self.stuck_pm_ms = np.zeros(0, dtype=np.int64)
        """... and since when it has stayed within half of ``stuck_predicted_c`` of it (0: no
        median)."""
        self.stuck_peer_ms = np.zeros(0, dtype=np.int64)
        """Since when, in the current freeze, the node's median has stood ``bar`` off where
        it was while this GPU ran its peers' load (0: not)."""
        self.stuck_unlike_s = np.zeros(0)
        """Seconds of the current freeze during which the GPU did not run its peers' load."""
        self.stuck_side = np.zeros(0, dtype=np.int8)
        """Where the node peers' median last stood, in the current freeze and while this GPU
        had long run their load: ``bar`` or more above the held reading (1), below it (-1),
        not yet either (0) ..."""
        self.stuck_flips = np.zeros(0, dtype=np.int64)
        """... and how many times it has gone from one side to the other since."""
        self.stuck_drawn0 = np.zeros(0)
        """The median reading of the node's GPUs that drew this one's power at every time
        scale, when its reading last changed, if it read within half of
        ``stuck_predicted_c`` of it (NaN: it did not, or fewer than three drew it) ..."""
        self.stuck_drawn_ids = np.zeros((0, PEERS_KEPT), dtype=np.int64)
        self.stuck_drawn_c = np.zeros((0, PEERS_KEPT))
        """... those GPUs, other than itself (``features.same_load_peers``: id + 1, 0 for
        none), and their readings then ..."""
        self.stuck_left_s = np.zeros(0)
        """... and the seconds of evidence (``features.evidence_rate``) in the current freeze
        that the same GPUs, those still drawing its power, moved ``stuck_predicted_c`` away
        from the held reading since (their median change, and their median now)."""
        self.stuck_flow_s = np.zeros(0)
        """Seconds in the current freeze while three or more of the node's GPUs at its band of
        power reported and each of their readings spanned two steps in ``_SPAN_WINDOW_S``."""
        self.temp_step_c = np.zeros(0)
        """The smallest change of reading the sensor has shown: its step (0: none yet)."""
        self.span_ms = np.zeros(0, dtype=np.int64)
        """Start of the current window of ``_SPAN_WINDOW_S`` (0: none) ..."""
        self.span_lo = np.zeros(0)
        self.span_hi = np.zeros(0)
        """... the range of the readings in it ..."""
        self.span_pw_lo = np.zeros(0)
        self.span_pw_hi = np.zeros(0)
        """... the range of its power smoothed with its chosen lag in it ..."""
        self.span_c = np.zeros(0)
        self.span_moved_w = np.zeros(0)
        """... and in the last whole window, the range of the readings (0: none) and how far
        that power moved (W)."""
        self.run_max_s = np.zeros((0, DWELL_BINS))
        """Longest run of identical readings this sensor showed, per band of power (decaying
        over a day) ..."""
        self.runs_n = np.zeros((0, DWELL_BINS))
        """... and how many runs ended in each band."""
        self.excess_evidence_s = np.zeros(0)
        """Seconds the GPU was judged hotter than its thermal model, fading over steps it
        could not be judged (0: it is not)."""
        self.excess_err = np.zeros(0)
        """The thermal model's error while the GPU was not running hot: the bar's yardstick
        (a fault teaches the model to err, so its error during one is no measure)."""
        self.excess_kplaus = np.zeros((0, len(TAUS_S)), dtype=bool)
        """The lags plausible while the GPU last ran as its model predicts (none yet: those
        plausible now)."""
        self.excess_settling = Settling()
        """The chosen lag's excess in spans: a die cooling along its lag to under half the bar
        is out of trouble (``detector.settling``)."""
        self.rest_since_ms = np.zeros(0, dtype=np.int64)
        """Since when the GPU has idled (0: it is busy, or reads no temperature)."""
        self.rest_offset = np.zeros(0)
        """Its usual reading above its resting node's median while all rest: its place in
        the airflow or on the loop ..."""
        self.rest_learned_s = np.zeros(0)
        """... and the seconds at rest it was learned from."""
        self.rest_evidence_s = np.zeros(0)
        """Seconds of steps it has read hot for its place at rest (fading, see
        ``_hot_at_rest``) ..."""
        self.rest_peak_c = np.zeros(0)
        """... the most it read above its place since that evidence held (0: it has not) ..."""
        self.rest_floor_c = np.zeros(0)
        """... and the least since it shed half of that peak, while it is not cool again (0:
        none)."""
        self.peer_offset = np.zeros((0, DWELL_BINS))
        """Its usual reading above the median of its node's GPUs that drew its power, per
        band of power (``_SEAT_BAND_W``): its seat ..."""
        self.peer_learned_s = np.zeros((0, DWELL_BINS))
        """... the seconds each band's seat was learned from ..."""
        self.peer_evidence_s = np.zeros(0)
        """... and the seconds of evidence (``features.evidence_rate``) that it reads hot
        for its seat (0: it does not)."""
        self.deficit_evidence_s = np.zeros(0)
        """Seconds of evidence that the GPU runs below its reference clock with no reason,
        weighted by how deep (0: it does not)."""
        self.cap_held_w = np.zeros(0)
        """The power a power cap last held its node's GPUs at (0: not seen)."""
        self.burst = np.zeros((0, 2))
        """Exponentially weighted corrected-ECC and link error counts."""
        self.steady_lo = np.zeros(0)
        self.steady_hi = np.zeros(0)
        """The range of the GPU's readings since ``steady_since_ms`` ..."""
        self.steady_since_ms = np.zeros(0, dtype=np.int64)
        """... since when they have stayed within half of ``stuck_predicted_c`` (0: no
        reading) ..."""
        self.steady_pmin = np.zeros(0)
        self.steady_pmax = np.zeros(0)
        """... and the range of its thermal model's predictions meanwhile (NaN: none)."""

    def ensure(self, n: int) -> None:
        grow_rows(self, self.ARRAYS, n)
        self.excess_settling.ensure(n)

    def conditions(
        self, ids: npt.NDArray[np.int64], row: npt.NDArray[np.float64],
        inc: npt.NDArray[np.float64], valid: npt.NDArray[np.bool_], ts_ms: int,
        ctx: RuleContext,
    ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
        """(G, R) condition matrix and a value per condition (the XID code, the count...).

        ``ctx`` is what the feature state knows of this step's GPUs (thermal models, peers).
        """
        g = row.shape[0]
        p = self.params
        cond = np.zeros((g, len(self.rules)), dtype=bool)
        val = np.zeros((g, len(self.rules)))
        seen = self.last_seen_ms[ids]
        dt_s = np.where(seen > 0, np.clip((ts_ms - seen) / 1000.0, 0.0, 60.0), 1.0)
        xid = row[:, COL["xid"]]
        xi = np.where(np.isfinite(xid) & (xid >= 0) & (xid < 256), xid, 0).astype(np.int64)
        cond[:, 0] = _XID_LOOKUP[xi] > 0
        val[:, 0] = xi
        dbe = inc[:, 1] + inc[:, 6]
        cond[:, 1] = dbe > 0
        val[:, 1] = dbe
        remap = row[:, COL["row_remap_failure"]]
        cond[:, 2] = np.isfinite(remap) & (remap >= 1)
        bits = row[:, COL["clock_event_reasons"]]
        ib = np.where(np.isfinite(bits), bits, 0).astype(np.int64)
        cond[:, 3] = (ib & (THROTTLE_SW_THERMAL | 0x40)) != 0
        cond[:, 4] = (ib & (0x08 | 0x80)) != 0
        val[:, 3] = val[:, 4] = ib
        # Frozen reading while the GPU's own thermal model says it must move, or far longer
        # than this sensor ever holds a value.
        temp = row[:, COL["temperature_celsius"]]
        pred = ctx.predicted_c
        has_temp = np.isfinite(temp)
        ok = has_temp & np.isfinite(pred)
        held = has_temp & (temp == self.stuck_temp[ids]) & (self.stuck_since_ms[ids] > 0)
        run_s = (ts_ms - self.stuck_since_ms[ids]) / 1000.0
        ended = has_temp & ~held & (self.stuck_since_ms[ids] > 0)
        # The longest run of about the last day, not of all time: runs tile the timeline,
        # so each one that ends ages the record by its own length.
        decay = np.exp(-np.maximum(run_s, 0.0) / 86_400.0)
        band = ctx.power_bin
        wanders = self._wanders(ids, temp, ctx.power_w, ts_ms)
        runs = self.run_max_s[ids, band]
        self.run_max_s[ids, band] = np.where(ended, np.maximum(runs * decay, run_s), runs)
        self.runs_n[ids, band] += ended
        self.stuck_since_ms[ids] = np.where(held, self.stuck_since_ms[ids],
                                            np.where(has_temp, ts_ms, 0))
        self.stuck_temp[ids] = np.where(has_temp, temp, np.nan)
        # Whether the model read this die right just before: where the reading last changed
        # at a step it could not judge (a power it has not learned for five minutes), the
        # last step it did judge stands in for that one, if it was at most
        # ``stuck_after_s`` earlier. A fast die under bursty load dips with every pause of
        # its power, and the model, which never dwelt five minutes at a dip's power, judges
        # none of them: a sensor that froze at the bottom of one was otherwise never judged
        # against the model that had read it right seconds before (tuning zoo-8: air, 3 s
        # dies, whole degrees, 580 W with dips to 150 W; frozen at 37 degC while the model
        # put the die at 44-47, as its peers read, for 13 minutes).
        # Only at that step's band of power, though: its agreement says nothing of a power it
        # was not judged at. (A held-out soak paged an idle die that way, zoo-1496: air,
        # whole degrees; a node's job ended, its dies cooled in seconds to 30-32 degC, and
        # the model, right at 280 W a few seconds before, put the idle die 5 degC higher.)
        fit_bar = np.maximum(p.stuck_predicted_c, 4.0 * ctx.error_c)
        fits = ok & (np.abs(pred - temp) < 0.5 * fit_bar)
        self.stuck_fit_ms[ids] = np.where(fits, ts_ms, self.stuck_fit_ms[ids])
        self.stuck_fit_bin[ids] = np.where(fits, ctx.power_bin + 1, self.stuck_fit_bin[ids])
        fit_ms = self.stuck_fit_ms[ids]
        fit_then = has_temp & ~np.isfinite(pred) & (fit_ms > 0) & (
            ts_ms - fit_ms <= p.stuck_after_s * 1000)
        self.stuck_fit0[ids] = np.where(held, self.stuck_fit0[ids],
                                        np.where(fit_then, self.stuck_fit_bin[ids], 0))
        # The prediction when the reading last changed (the first one known since then), and
        # the range each plausible lag's prediction covered since.
        p0 = self.stuck_p0[ids]
        self.stuck_p0[ids] = np.where(held & np.isfinite(p0), p0, pred)
        p0 = self.stuck_p0[ids]
        # Which lags were plausible is judged when the reading last changed (or first could
        # be, after): a frozen reading fits a slow lag better and would make it plausible by
        # the very fault.
        cand = ctx.candidates_c
        h = held[:, None]
        keep = h & self.stuck_kplaus[ids].any(axis=1, keepdims=True)
        self.stuck_kplaus[ids] = np.where(keep, self.stuck_kplaus[ids], ctx.plausible)
        cand = np.where(self.stuck_kplaus[ids], cand, np.nan)
        self.stuck_kmin[ids] = np.where(h, np.fmin(self.stuck_kmin[ids], cand), cand)
        self.stuck_kmax[ids] = np.where(h, np.fmax(self.stuck_kmax[ids], cand), cand)
        self.stuck_err[ids] = np.where(held, self.stuck_err[ids], ctx.error_c)
        frozen_s = np.where(held, run_s, 0.0)
        frozen_long = held & (frozen_s >= p.stuck_after_s)
        bar = np.maximum(p.stuck_predicted_c, 4.0 * self.stuck_err[ids])
        # How far the die should have moved if its lag were any the GPU's history allows: the
        # smallest swing of the lags plausible now. A cold plate that the model cannot yet
        # tell from a bare heat sink (after a long idle every lag fits) keeps the slow lag in
        # the running, and a slow lag barely swings under an all-reduce rhythm.
        swings = self.stuck_kmax[ids] - self.stuck_kmin[ids]
        swing = np.fmin.reduce(np.where(self.stuck_kplaus[ids], swings, np.nan), axis=1)
        swing = np.where(np.isfinite(swing), swing, 0.0)
        # One sensor, not the node: a stuck sensor is one GPU's fault, so most of the node's
        # other reporting GPUs changed their reading meanwhile (when the whole node holds
        # still, it is the node that is steady, or the models that misjudge its loop).
        reporting = _others(has_temp, ctx.node)
        still = _others(frozen_long, ctx.node)
        alone = (reporting < 2) | (still <= 0.5 * reporting)
        # Nor when the node's models swing and its dies do not: most of the other reporting
        # GPUs have read within half the bar for ``stuck_after_s`` while their own models
        # swung by ``stuck_predicted_c`` or more. A flicker of one degree is no move (``still`` counts
        # only identical readings). A periodic load read at one phase of its rhythm swings
        # the sampled power's averages, and young models follow it, while every die of the
        # node holds (held-out zoo-1367: air, 37 s dies, whole degrees, a 300 W cap with dips
        # read at 2 Hz; seven minutes into the run, the one lag plausible put a held 51 degC
        # 4.1 degC lower, and the peers' readings stayed within a degree).
        steady = self._steady_under_swing(ids, temp, pred, ts_ms)
        models_swing = (reporting >= 2) & (_others(steady, ctx.node) > 0.5 * reporting)
        # The die has had ``stuck_after_s`` to show the swing since the lags reached it: a
        # job that starts moves a fast lag's prediction by degrees within seconds, long
        # before a die of minutes has moved one. While the node's models swing and its dies
        # hold, the time starts over: once the node moves again, its dies have that long to
        # show that this one moves too.
        past = held & (swing >= bar) & ~models_swing
        # A swing accuses the sensor only while the model's prediction is no nearer the held
        # reading than it was when the reading froze (less half the bar): a model that was
        # off then and has been coming back onto the reading ever since is learning (a die
        # that idled into a power band the model had never seen), and the reading is right.
        receding = np.isfinite(pred) & np.isfinite(p0) & (
            np.abs(pred - temp) >= np.abs(p0 - temp) - 0.5 * bar)
        # The time counts faster the wider the swing (``features.evidence_rate``): a die that a
        # lag of minutes puts 16 degC off has moved a whole degree in a quarter of that lag.
        swung_s = gather_evidence(self.stuck_swung_s[ids], past, ~past,
                                  evidence_rate(swing, bar, STUCK_EVIDENCE_EXPONENT) * dt_s,
                                  dt_s, p.stuck_after_s)
        self.stuck_swung_s[ids] = swung_s
        swung = held & alone & past & receding & (swung_s >= p.stuck_after_s)
        # Or every plausible lag now puts the die ``bar`` degrees or more off the held
        # reading on one side (``off``: how far the nearest is), where the chosen lag agreed
        # with the reading when it froze (a model that was off before says nothing now),
        # and unlike its node peers (whose readings follow their models; not while the
        # node's models swing and its dies hold, ``models_swing``), for
        # ``stuck_after_s`` in all during the freeze: not since the reading last changed (a
        # die idle for an hour holds its reading for an hour, and the first seconds of a job
        # are the models' guess, not yet the die's), and not in a row (under a job that
        # cycles faster, the models swing away and back).
        lo = np.fmin.reduce(cand, axis=1)
        hi = np.fmax.reduce(cand, axis=1)
        off = np.where(temp < lo, lo - temp, np.where(temp > hi, hi - temp, 0.0))
        judged = ok & np.isfinite(off)
        off = np.where(judged, off, 0.0)
        fit0 = self.stuck_fit0[ids]
        agreed = (np.isfinite(p0) & (np.abs(p0 - temp) < 0.5 * bar)) | (
            (fit0 > 0) & (ctx.power_bin + 1 == fit0))
        peers_off = _peer_median(off, ctx.node, judged)
        rel = np.where(np.isfinite(peers_off), off - peers_off, off)
        away = ok & agreed & ~models_swing & (np.abs(off) >= bar) & (np.abs(rel) >= bar) & (
            np.sign(rel) == np.sign(off))
        off_s = _in_freeze(self.stuck_off_s[ids], held,
                           np.where(away, evidence_rate(off, bar, STUCK_EVIDENCE_EXPONENT)
                                    * dt_s, 0.0))
        self.stuck_off_s[ids] = off_s
        stayed = held & (off_s >= p.stuck_after_s)
        # Or unlike itself: the lags expect the reading to wander by more than a whole-degree
        # sensor's step plus four times the model's error before the freeze (a model's error
        # drifts slowly, so over an hour-long freeze the predictions span about four of its
        # errors while the die holds still), two degrees at least, and this sensor, which
        # has changed value often at this power, never held a value a tenth as long. (An
        # integer sensor at a steady temperature holds one value for hours.)
        # ``outlasted``: held twice ``stuck_after_s`` and ten times the longest of the 30 or
        # more runs this sensor showed at this power (this path and the next share it).
        outlasted = ((self.runs_n[ids, band] >= 30) & (frozen_s >= 2.0 * p.stuck_after_s)
                     & (frozen_s >= 10.0 * self.run_max_s[ids, band]))
        unlike_itself = (frozen_long & alone & (ctx.dwell_s >= p.stuck_history_s) & outlasted
                         & receding
                         & (swing >= np.maximum(2.0, 1.0 + 4.0 * self.stuck_err[ids])))
        # Or unlike its peers at its power, needing no thermal model: three or more of the
        # node's GPUs at its band of power, at one load (``_STILL_W``), each read values two
        # steps apart within every ``_SPAN_WINDOW_S`` (``_wanders``) for twice
        # ``stuck_after_s`` of the freeze, and this sensor, which has changed value 30 times
        # at this power, holds one for twice ``stuck_after_s`` and ten times its longest run
        # here. Dies of one node at one power share its rhythm and inlet: where each of
        # theirs wanders two steps, a range no die can cover without crossing a step, a die
        # of the same load crosses one too.
        # (Tuning zoo-7: air, 7.6 s dies, half-degree steps, 350 W; held at 56.5 degC for 13
        # minutes while its peers' readings wandered a degree or more every half minute,
        # and no lag the model could rule out swung enough to accuse it.) Peers flickering
        # between two values say nothing: whole degrees on a steady cold plate flicker
        # where a die sits near a step and hold where it sits between (tuning zoo-4). Nor do
        # peers whose load moved in the window: a held-out soak paged twice on a
        # pipeline-parallel node whose GPUs each dipped to 130 W for a bubble in turn
        # (zoo-1584: air, 2.8 s dies, whole degrees); a stage without bubbles held 52 degC
        # at 600 W, as a fast die at a steady load does, while its peers' readings spanned
        # degrees in every window with their own dips. Nor do peers whose load moved more
        # than this GPU's did (``_FLAT_W``): two steps of an exact 0.1 degC sensor are 0.2
        # degC, which a peer covers with any move of its own load, while a die at a flat
        # power holds it. (The held-out soak of 8425856 paged twice so, on its two profiles
        # with such sensors: zoo-1693, a pipeline stage without bubbles at a flat 300 W
        # holding 66.7 degC while its peers dipped to 50 W for theirs; zoo-1696, an idle GPU
        # holding 33.4 degC while peers that had just gone idle cooled.)
        same_band = ctx.node * DWELL_BINS + band
        reporting_b = _others(has_temp, same_band)
        band_moved = np.zeros(int(same_band.max()) + 1 if len(same_band) else 0)
        np.maximum.at(band_moved, same_band, np.where(has_temp, self.span_moved_w[ids], 0.0))
        like_load = band_moved[same_band] <= np.maximum(2.0 * self.span_moved_w[ids], _FLAT_W)
        flowing = ((reporting_b >= 3) & (_others(wanders, same_band) == reporting_b)
                   & like_load)
        flow_s = _in_freeze(self.stuck_flow_s[ids], held, np.where(flowing, dt_s, 0.0))
        self.stuck_flow_s[ids] = flow_s
        unlike_all = held & outlasted & (flow_s >= 2.0 * p.stuck_after_s)
        # Or unlike its node peers, with no thermal model needed: it had run its peers'
        # load for ``rest_settle_s`` when the reading froze (so its die sat where theirs
        # did, not cooling from a job they had not run), their median had settled then,
        # it runs their load now, and their median has moved ``bar`` or more since, for
        # ``stuck_after_s``. Dies of one node
        # under one load share the inlet and the cooling, so they move together; one
        # reading that stays behind is its sensor. (The thermal model cannot judge a power
        # it has not learned: a sensor frozen at its idle value when a job starts is only
        # seen this way.)
        like = self._runs_like_peers(row, ctx.node)
        like_since = held_since(self.stuck_like_ms[ids], like, ts_ms)
        self.stuck_like_ms[ids] = like_since
        settled_like = like & (ts_ms - like_since >= p.rest_settle_s * 1000)
        peer_med = _peer_median(temp, ctx.node, has_temp)
        # ... and the median of the peers that run the node's load now, as this GPU does,
        # must have moved as well. Either alone misleads: a node's other loads move its
        # median without moving any die under this one (a held-out soak paged on an idle GPU
        # that way: of seven peers, three started bursty work and two stopped training and
        # cooled, while the two idling beside it held still), and the set of peers at this
        # GPU's power changes under it (pipeline bubbles take GPUs in and out of it, and a
        # node's seats differ by degrees), which moves that median alone. (NaN, with fewer
        # than three such GPUs, vetoes nothing: the node's median decides as before.)
        like_med = _peer_median(temp, ctx.node, has_temp & like)
        # The peers' median as a settled value: a node whose jobs just changed holds dies
        # still cooling down or heating up, and its median falls between them, away from
        # where this die sat, then moves onto it as they settle. (A held-out soak paged on
        # two idle GPUs that way: their peers had run its load, but not for long enough.)
        pm_ref = self.stuck_pm_ref[ids]
        pm_on = (self.stuck_pm_ms[ids] > 0) & (
            np.abs(peer_med - pm_ref) <= 0.5 * p.stuck_predicted_c)
        pm_since = held_since(np.where(pm_on, self.stuck_pm_ms[ids], 0),
                              np.isfinite(peer_med), ts_ms)
        self.stuck_pm_ref[ids] = np.where(pm_on, pm_ref, peer_med)
        self.stuck_pm_ms[ids] = pm_since
        peers_settled = (pm_since > 0) & (ts_ms - pm_since >= p.rest_settle_s * 1000)
        base = held & (self.stuck_base_ms[ids] > 0)
        fresh = has_temp & ~held
        self.stuck_base_ms[ids] = np.where(
            fresh, np.where(np.isfinite(peer_med), ts_ms, 0), self.stuck_base_ms[ids])
        self.stuck_peer0[ids] = np.where(fresh, peer_med, self.stuck_peer0[ids])
        self.stuck_like0[ids] = np.where(fresh, like_med, self.stuck_like0[ids])
        # The range that median covered in the freeze: dies of one node under one load
        # follow it together, so a swing of the model that they did not show is the
        # model's (see ``shown`` below).
        like_lo = np.where(held, np.fmin(self.stuck_like_lo[ids], like_med), like_med)
        like_hi = np.where(held, np.fmax(self.stuck_like_hi[ids], like_med), like_med)
        self.stuck_like_lo[ids] = like_lo
        self.stuck_like_hi[ids] = like_hi
        self.stuck_load0[ids] = np.where(fresh, settled_like & peers_settled,
                                         self.stuck_load0[ids])
        w_now = ctx.power_smoothed_w[:, _LOAD_LAG]
        self.stuck_w0[ids] = np.where(fresh, w_now, self.stuck_w0[ids])
        # ... and its own load must have moved since: the peers at its load moved because
        # that load did, which moves its die too. Peers that moved while its power held left
        # its load, whatever some of their readings say, and tell nothing of its die. (A
        # held-out soak paged on two GPUs that way, zoo-1277: air, 27 s lags, two GPUs at
        # 500 W reading 56 and 57 degC, while two peers left that load for a rhythm of
        # seconds around 290 W and cooled 13 degC, half of their readings, taken once a
        # second, still catching full power.) An old checkpoint's freeze has no power
        # (0 W): a GPU drawing over 62.5 W is judged as before, one below is not until its
        # reading next changes.
        # Where no power is read, the load is told by utilisation (``_runs_like_peers``) and
        # this cannot be asked.
        w0 = self.stuck_w0[ids]
        load_moved = ~np.isfinite(row[:, COL["power_usage_watts"]]) | (
            np.abs(w_now - w0) > np.maximum(LOAD_SHARE * np.fmax(w_now, w0), LOAD_MIN_W))
        # ... and through the freeze: a die that worked on alone while its peers idled
        # (a job on part of the node) sits where its own load put it, and when they start
        # again their median passes its reading on the way up. (A held-out soak paged on a
        # GPU that way, its reading right and its thermal model saying so.) A few seconds
        # of difference are a job starting on its GPUs a tick apart.
        unlike_s = _in_freeze(self.stuck_unlike_s[ids], held, np.where(like, 0.0, dt_s))
        self.stuck_unlike_s[ids] = unlike_s
        moved = np.abs(peer_med - self.stuck_peer0[ids])
        moved_like = np.abs(like_med - self.stuck_like0[ids])
        apart = (base & like & (self.stuck_load0[ids] > 0) & load_moved & np.isfinite(moved)
                 & (unlike_s <= _UNLIKE_GRACE_S) & (moved >= bar)
                 & (np.isnan(moved_like) | (moved_like >= bar)))
        peer_ms = held_since(self.stuck_peer_ms[ids], apart, ts_ms)
        self.stuck_peer_ms[ids] = peer_ms
        behind = frozen_long & alone & apart & (ts_ms - peer_ms >= p.stuck_after_s * 1000)
        # Or the peers' dies swung around the held reading, needing no settled start: while
        # the GPU had run their load for ``rest_settle_s`` (a die's lag is seconds to two
        # minutes, so its heat follows that load as theirs does), their median stood
        # ``stuck_predicted_c`` above the reading, then below, then above again (or the other
        # way round).
        # Under bursty inference the median never settles, yet a die sharing the load
        # swings with it; a seat warmer or cooler than the node's moves the level, not the
        # swing, and a node settling after a job change passes once, so the third side is
        # what no healthy die produces.
        d = peer_med - temp
        side = np.where(d >= p.stuck_predicted_c, 1, np.where(d <= -p.stuck_predicted_c, -1, 0))
        side = np.where(held & settled_like & np.isfinite(d), side, 0).astype(np.int8)
        last = np.where(held, self.stuck_side[ids], 0).astype(np.int8)
        flips = np.where(held, self.stuck_flips[ids], 0)
        turned = (side != 0) & (side != last)
        flips = flips + (turned & (last != 0))
        self.stuck_side[ids] = np.where(side != 0, side, last)
        self.stuck_flips[ids] = flips
        around = frozen_long & alone & (flips >= 2)
        # Or the dies that drew its power at every time scale (now, and smoothed with each
        # candidate lag) read what it read when it froze, within half the bar, and have
        # since moved the bar or more away from it, one way, for ``stuck_after_s`` of
        # evidence. Sharing its power over the slowest lag, they share its heat history:
        # dies of one node still heating from a job's start, or cooling from its end, move
        # together, and a healthy one that holds its reading holds a die that does not move,
        # which theirs then do not either. (Peers moving onto the held reading are dies
        # settling where it sat; only moving away accuses.) Needs no settled start and no
        # thermal model: tuning zoo-10 (liquid, 106 s dies, whole degrees) froze a reading
        # at 55 degC while its seven peers, under its load, heated from 55-57 to 59-62.
        # The same dies throughout: those that drew its power when it froze and still do,
        # each measured against its own reading then. (A held-out soak paged twice on
        # zoo-1653 while a median of whichever GPUs drew its power moved 4 degC with no die
        # moving: air, 5 s dies, whole degrees, a pipeline whose stages take turns without
        # bubbles at the 450 W cap, on seats 9 degC apart; this one held 62 degC there.)
        # Its bar is the peers' own, ``stuck_predicted_c``, not the thermal model's error:
        # no model is judged here, and a model errs most just after a job starts, when dies
        # that share a power history move most. (Held-out zoo-1669: the model's error at the
        # freeze, a minute into a job, set a 9.2 degC bar; the two peers that started with
        # it heated 5-6 degC on from where they read then.)
        loads = np.concatenate([row[:, COL["power_usage_watts"]][:, None],
                                ctx.power_smoothed_w], axis=1)
        drawn_med = same_load_median(temp, loads, None, ctx.node)
        peer_bar = p.stuck_predicted_c
        self.stuck_drawn0[ids] = np.where(
            fresh, np.where(np.abs(drawn_med - temp) <= 0.5 * peer_bar, drawn_med, np.nan),
            self.stuck_drawn0[ids])
        kept = same_load_peers(temp, loads, ctx.node, ids, fresh)
        self.stuck_drawn_ids[ids[fresh]], self.stuck_drawn_c[ids[fresh]] = kept
        went, level = same_peers_moved(temp, loads, ids,
                                       held & np.isfinite(self.stuck_drawn0[ids]),
                                       self.stuck_drawn_ids, self.stuck_drawn_c)
        gap = level - temp
        left = held & (np.abs(went) >= peer_bar) & (np.abs(gap) >= peer_bar) & (
            np.sign(went) == np.sign(gap))
        left_s = _in_freeze(self.stuck_left_s[ids], held,
                            np.where(left, evidence_rate(gap, peer_bar, STUCK_EVIDENCE_EXPONENT)
                                     * dt_s, 0.0))
        self.stuck_left_s[ids] = left_s
        # Not vetoed by the rest of the node holding its readings (``alone``): the dies that
        # moved are the ones that share its power history, and dies steady under a power
        # they have long drawn hold their values, as an exact sensor at a steady die does.
        # (Held-out zoo-1669 missed a sensor frozen 5-9 degC under its peers for 14
        # minutes so: air, 34 s dies, whole degrees without noise; it and two peers had
        # started a job a minute before, beside four that had run it for long.)
        drifted = frozen_long & (left_s >= p.stuck_after_s)
        # A swing accuses only where the dies at the GPU's load showed some of it: where it
        # runs its peers' load and their median (three or more) stayed within half the bar
        # through the freeze, the model misjudges the load and the sensor is right. (A
        # held-out run paged on zoo-1626 so: liquid, 62 s dies, whole degrees, 0.5 Hz; every
        # fourth reading caught the job's rhythm in a dip from 500 to 300 W, the dies held
        # within a degree or two, and a model that had read this die right put it 10-16
        # degC lower, swinging 6 degC with the sampled dips, while it held 51. The node's
        # other models swung as far, but their dies' flicker of one or two degrees kept
        # ``models_swing`` from counting them.)
        shown = ~(like & np.isfinite(like_hi - like_lo) & (like_hi - like_lo < 0.5 * bar))
        cond[:, 5] = ((swung & shown) | stayed | unlike_itself | unlike_all | behind | around
                      | drifted)
        val[:, 5] = temp
        # Hotter than its own thermal model, and than its node peers, whatever lag the GPU's
        # history allowed while it ran as predicted: a die whose chosen lag is wrong for it
        # (a cold plate judged as a bare heat sink after a job change) is explained by
        # another lag. The plausible lags are those of the last time the GPU ran as its
        # model predicted: a fault makes every lag err alike and so look plausible.
        finite = np.isfinite(ctx.excess_c)
        cool = finite & (np.abs(ctx.excess_c) < 0.5 * p.excess_c)
        self.excess_err[ids] = np.where(cool, ctx.error_c, self.excess_err[ids])
        kplaus = np.where(cool[:, None], ctx.plausible, self.excess_kplaus[ids])
        self.excess_kplaus[ids] = kplaus
        # ... and every lag plausible now as well: where the lags the history allows put
        # the die far apart from one another, the model is extrapolating to a power its
        # fit barely saw, and the hottest of them is as good a guess as the coolest. (A
        # held-out soak paged on a liquid-cooled GPU idling after hours of training with
        # short bubbles: its lags predicted 28 and 50 degC for a die reading 38, as its
        # peers did.) A fault makes every lag err alike, so it still shows under each.
        kthen = kplaus
        kplaus = kplaus | ctx.plausible
        lag_excess = np.where(kplaus, ctx.lag_excess_c, np.nan)
        # Every lag's excess is given exactly where the chosen lag's is (``finite``).
        excess = np.where(finite, np.fmin.reduce(lag_excess, axis=1), np.nan)
        bar = np.maximum(p.excess_c, 4.0 * self.excess_err[ids])
        # ... and its die stands half of ``excess_c`` above the median of the peers running
        # its load, where three do: a degraded heat path shows against dies of the same load
        # on the same inlet, whatever the models say. (A held-out soak paged on three idle
        # GPUs that read what the idle dies beside them read, 30 degC, while their models,
        # which had seen idle power for minutes after hours of training, put them 8.5 degC
        # high and the node's median excess, that of dies whose models were right, took out
        # nothing.) Half the bar leaves room for seats: dies of one load differ by where they
        # sit, up to 8 degC apart at the cap, and the smallest fault, +9 degC, still stands
        # that far above the median from the coolest seat.
        power = row[:, COL["power_usage_watts"]]
        util = row[:, COL["utilization_ratio"]]
        same_med = same_load_median(temp, power[:, None], util, ctx.node)
        beside = np.where(np.isfinite(same_med), temp - same_med >= 0.5 * p.excess_c, True)
        hot = finite & (excess >= bar) & beside
        # Evidence, in seconds of steps at which every plausible lag accuses. A step at which
        # the lags of the GPU's history put it under half the bar starts over; one between
        # half the bar and the bar pauses it (with a 2 s and a 4 s lag both plausible, the
        # least excess over them dips under the bar at every swing of power, and a +9 degC
        # fault on the coolest busy seat restarted at each). A step at which only a lag
        # plausible now does, or at which the GPU cannot be judged (a power its model has not
        # learned, peers still learning one), is no evidence either way, and what was
        # gathered fades over ``excess_after_s``: under bursty load a die's lags part at
        # every swing of power, and a held-out runaway (zoo-1042: air, a 3 s lag, 0.5 Hz,
        # 12 degC over its model and its peers for nine minutes) was never accused by all
        # of them for a minute in a row. The first hot step counts no time yet (a tiny mark
        # says it began).
        then = np.where(finite, np.fmin.reduce(np.where(kthen, ctx.lag_excess_c, np.nan),
                                               axis=1), np.nan)
        cleared = finite & (~(then >= 0.5 * bar) | ~beside)
        before = self.excess_evidence_s[ids]
        evidence = gather_evidence(before, hot, cleared, evidence_rate(excess, bar) * dt_s,
                                   dt_s, p.excess_after_s)
        self.excess_evidence_s[ids] = evidence
        cond[:, 6] = hot & (evidence >= p.excess_after_s)
        val[:, 6] = np.where(finite, excess, 0.0)
        rest_hot, rest_dev = self._hot_at_rest(ids, temp, util, dt_s, ts_ms, ctx.node)
        val[:, 6] = np.where(rest_hot & ~cond[:, 6], rest_dev, val[:, 6])
        cond[:, 6] |= rest_hot
        peer_hot, peer_dev = self._hot_beside_peers(ids, temp, power, drawn_med, dt_s)
        val[:, 6] = np.where(peer_hot & ~cond[:, 6], peer_dev, val[:, 6])
        cond[:, 6] |= peer_hot
        # Whichever path holds it, a die whose heat over its model falls along its lag to
        # under half the bar has its heat path back: what is left is cooling, minutes of it
        # on a liquid-cooled die (held-out zoo-1625: a runaway's alert held 186 s past its
        # end on 105 s dies). A trouble that eases and stays stops falling, and is judged
        # again as it stands.
        settling = self.excess_settling.step(ids, ctx.excess_c, ts_ms, ctx.tau_s, bar)
        cond[:, 6] &= ~settling
        # A busy GPU clocked below where it should run, with no reason reported.
        clock = row[:, COL["sm_clock_hertz"]]
        ref = ctx.clock_ref_hz
        # A power-cap bit explains a low clock only where the cap holds the power: a cap
        # holds a GPU at its limit, so one drawing clearly less than that is held low by
        # something else, whatever bit its governor still sets. Where the node's peers
        # report the cap (three or more), they show the power it holds there: the measured
        # level the GPU's readings are compared with, remembered through the steps they do
        # not (a job's communication phases); else the reported limit; with neither the bit
        # is believed.
        power = row[:, COL["power_usage_watts"]]
        limit = row[:, COL["power_limit_watts"]]
        cap_bit = (ib & 0x4) != 0
        held_now = _peer_median(power, ctx.node, cap_bit & np.isfinite(power))
        held = np.where(np.isfinite(held_now), held_now, self.cap_held_w[ids])
        self.cap_held_w[ids] = held
        held_at = np.where(held > 0, held, limit)
        capped = ~(np.isfinite(held_at) & np.isfinite(power)
                   & (power < CAP_HOLDS * held_at))
        reasons = ib & ~0x1 & ~np.where(capped, 0, 0x4)
        # Where the reasons are not exported at all (dcgm-exporter's default fields), no
        # reason is known either.
        known = np.isfinite(util) & np.isfinite(clock) & np.isfinite(ref) & (ref > 0)
        deficit = np.where(known, 1.0 - clock / np.where(ref > 0, ref, 1.0), 0.0)
        # The SM clock is set by the power, thermal and brake governors, not by how busy the
        # GPU is: a GPU running kernels a third of the time still runs its boost clock
        # between them. So a deep deficit (three times the ratio) counts from 30 %
        # utilisation, a shallow one only when busy (a GPU that rarely works may be sampled
        # in a lower clock state between kernels).
        low = known & (reasons == 0) & (
            ((util >= 0.8) & (deficit >= p.deficit_ratio))
            | ((util >= 0.3) & (deficit >= 3.0 * p.deficit_ratio)))
        # Evidence, in seconds, grows faster the deeper the deficit (a clock at half its
        # peers' is no borderline case): the ratio takes ``deficit_after_s``, twice the ratio
        # half that, never under a quarter of it. A step that shows the
        # clock where it should be (working, within the ratio) or a reason for it starts
        # over; a step that shows neither (between a pipeline's bursts, at 10 % between two
        # of 95 %) is no evidence either way, and what was gathered fades over
        # ``deficit_after_s`` instead of starting over, so a braked clock under a bursty job
        # still adds up.
        # The first step of a deficit counts no time yet (a tiny mark says it began).
        rate = evidence_rate(deficit, p.deficit_ratio)
        clear = known & ((reasons != 0) | ((util >= 0.3) & (deficit < p.deficit_ratio)))
        before = self.deficit_evidence_s[ids]
        evidence = gather_evidence(before, low, clear, rate * dt_s, dt_s, p.deficit_after_s)
        self.deficit_evidence_s[ids] = evidence
        cond[:, 7] = low & (evidence >= p.deficit_after_s)
        val[:, 7] = np.where(low, deficit, 0.0)
        # Error bursts: exponentially weighted counts over seconds of event time.
        keep = np.exp(-dt_s / p.burst_window_s)
        counts = np.stack([inc[:, 0], inc[:, 2:6].sum(axis=1)], axis=1)
        burst = self.burst[ids] * keep[:, None] + counts
        self.burst[ids] = burst
        # True on the steps that add errors to a burst, so the alert resolves
        # ``event_hold_s`` after the errors stop rather than when the count has decayed.
        cond[:, 8] = (burst[:, 0] >= p.burst_count) & (counts[:, 0] > 0)
        cond[:, 9] = (burst[:, 1] >= p.burst_count) & (counts[:, 1] > 0)
        val[:, 8] = burst[:, 0]
        val[:, 9] = burst[:, 1]
        cond[:, LOST] = ~valid
        return cond, val

    def _wanders(self, ids: npt.NDArray[np.int64], temp: npt.NDArray[np.float64],
                 power_w: npt.NDArray[np.float64], ts_ms: int) -> npt.NDArray[np.bool_]:
        """Whether each GPU's readings spanned two of its sensor's steps in its last whole
        window of ``_SPAN_WINDOW_S``, a range no die covers without crossing a step wherever
        it sits, at one load: the power its die took in (``power_w``, smoothed with the lag
        its model chose) moved less than ``_STILL_W`` in that window. A die whose load
        changed inside the window moved with it, and says nothing of how a die at one load
        wanders. Called before the reading is stored (``stuck_temp`` is the last one), to
        learn the step."""
        has = np.isfinite(temp)
        change = np.abs(temp - self.stuck_temp[ids])
        changed = has & np.isfinite(change) & (change > 1e-6)
        step = self.temp_step_c[ids]
        step = np.where(changed & ((step <= 0) | (change < step)), change, step)
        self.temp_step_c[ids] = step
        start = self.span_ms[ids]
        whole = has & (start > 0) & (ts_ms - start >= _SPAN_WINDOW_S * 1000)
        span = np.where(whole, self.span_hi[ids] - self.span_lo[ids],
                        np.where(has, self.span_c[ids], 0.0))
        self.span_c[ids] = span
        moved = self.span_pw_hi[ids] - self.span_pw_lo[ids]
        moved = np.where(whole, moved, np.where(has, self.span_moved_w[ids], 0.0))
        self.span_moved_w[ids] = moved
        still = has & (moved < _STILL_W)
        fresh = has & ((start == 0) | whole)
        self.span_pw_lo[ids] = np.where(fresh, power_w, np.fmin(self.span_pw_lo[ids], power_w))
        self.span_pw_hi[ids] = np.where(fresh, power_w, np.fmax(self.span_pw_hi[ids], power_w))
        self.span_ms[ids] = np.where(has, np.where(fresh, ts_ms, start), 0)
        self.span_lo[ids] = np.where(fresh, temp, np.fmin(self.span_lo[ids], temp))
        self.span_hi[ids] = np.where(fresh, temp, np.fmax(self.span_hi[ids], temp))
        return has & (step > 0) & (span >= 1.99 * step) & still

    def _steady_under_swing(self, ids: npt.NDArray[np.int64], temp: npt.NDArray[np.float64],
                            pred: npt.NDArray[np.float64], ts_ms: int) -> npt.NDArray[np.bool_]:
        """GPUs whose reading has stayed within half of ``stuck_predicted_c`` for
        ``stuck_after_s`` while their thermal model's prediction moved by
        ``stuck_predicted_c`` or more: the least swing that accuses a held sensor (not the
        GPU's own bar, which grows with the model's error, and a model that misjudges the
        node's rhythm errs more by the minute)."""
        p = self.params
        has = np.isfinite(temp)
        lo = np.fmin(self.steady_lo[ids], temp)
        hi = np.fmax(self.steady_hi[ids], temp)
        fresh = has & ((self.steady_since_ms[ids] == 0) | (hi - lo > 0.5 * p.stuck_predicted_c))
        self.steady_lo[ids] = np.where(fresh, temp, lo)
        self.steady_hi[ids] = np.where(fresh, temp, hi)
        pmin = np.where(fresh, pred, np.fmin(self.steady_pmin[ids], pred))
        pmax = np.where(fresh, pred, np.fmax(self.steady_pmax[ids], pred))
        self.steady_pmin[ids] = pmin
        self.steady_pmax[ids] = pmax
        since = np.where(fresh, ts_ms, np.where(has, self.steady_since_ms[ids], 0))
        self.steady_since_ms[ids] = since
        return (has & (since > 0) & (ts_ms - since >= p.stuck_after_s * 1000)
                & (pmax - pmin >= p.stuck_predicted_c))

    @staticmethod
    def _runs_like_peers(row: npt.NDArray[np.float64], node: npt.NDArray[np.intp]
                         ) -> npt.NDArray[np.bool_]:
        """Whether each GPU runs its node peers' load: power within a fifth of their median
        (50 W at least), or where no power is read, utilisation within 15 points of theirs."""
        power = row[:, COL["power_usage_watts"]]
        util = row[:, COL["utilization_ratio"]]
        has_p = np.isfinite(power)
        med_p = _peer_median(power, node, has_p)
        med_u = _peer_median(util, node, np.isfinite(util))
        by_power = np.abs(power - med_p) <= np.maximum(LOAD_SHARE * np.abs(med_p), LOAD_MIN_W)
        by_util = np.abs(util - med_u) <= LOAD_UTIL
        return np.where(has_p & np.isfinite(med_p), by_power, by_util)

    def _hot_at_rest(self, ids: npt.NDArray[np.int64], temp: npt.NDArray[np.float64],
                     util: npt.NDArray[np.float64], dt_s: npt.NDArray[np.float64], ts_ms: int,
                     node: npt.NDArray[np.intp]
                     ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
        """``thermal_excess`` judged without power: a die hot for its place in a node at rest
        (the condition, with ``excess_after_s`` of evidence; and how far above the node's
        median it is).

        When every GPU of a node has idled ``rest_settle_s``, their dies sit at inlet plus
        idle power times their heat path's resistance: the inlet is the node's, the idle
        power about equal, so they differ only by where each sits in the airflow or on the
        loop, which does not change and is learned. A die ``rest_excess_c`` above its
        resting node's median beyond that learned place (``rest_unlearned_c`` above it
        while none is learned) passes its idle heat through a degraded path (paste, fan,
        cold plate). It needs no power reading (dcgm-exporter subsets without one leave
        the thermal model blind) and no learned thermal model, and a node with any GPU at
        work is not judged: a busy neighbour heats the air its idle peers breathe."""
        p = self.params
        resting = np.isfinite(temp) & np.isfinite(util) & (util <= REST_UTIL)
        since = held_since(self.rest_since_ms[ids], resting, ts_ms)
        self.rest_since_ms[ids] = since
        settled = resting & (ts_ms - since >= p.rest_settle_s * 1000)
        reporting = np.isfinite(temp) | np.isfinite(util)
        n_rep = np.bincount(node, weights=reporting.astype(np.float64))
        n_set = np.bincount(node, weights=settled.astype(np.float64))
        judged = settled & ((n_set == n_rep) & (n_set >= MIN_REST_PEERS))[node]
        med = node_median(np.where(judged, temp, np.nan), node)
        dev = np.where(judged, temp - med, np.nan)
        offset = self.rest_offset[ids]
        learned = self.rest_learned_s[ids] >= p.rest_learn_s
        above = np.where(learned, dev - offset, dev)
        bar = np.where(learned, p.rest_excess_c, p.rest_unlearned_c)
        # Evidence, in seconds of hot steps, as the model path gathers it: a step below half
        # the bar starts it over, one between half the bar and the bar (a whole-degree sensor
        # and its peers' median each flicker by a degree) is no evidence either way and what
        # was gathered fades over ``excess_after_s``. A held-out hot idle (zoo-1233: air,
        # whole degrees, +6.5 to +9 degC beside seven resting peers for four minutes, 8 or
        # more on 80 % of the steps) never read over the bar for more than 23 s in a row and
        # was missed while each step under it started the count over. Once it has held,
        # half the bar keeps it.
        before = self.rest_evidence_s[ids]
        held_long = before >= p.excess_after_s
        # It ends once the die has shed half the most it read, as ``rack_heat`` ends: a die
        # at rest holds its heat, so one that has lost half of it is cooling back with its
        # thermal lag from a trouble that is over, while one that eases less and stays (a
        # fan that caught up in part) is still in trouble. Waiting for it to read cool kept
        # a held-out hot idle open for minutes past its end (zoo-1558: liquid, 103 s dies,
        # +25 degC; its 30 s hold closed it 173 s after the trouble ended). Then, as
        # ``rack_heat`` does, it must rise a bar above the least it read since
        # (``rest_floor_c``) to gather again: a die still cooling from 25 degC above its
        # place is the same recovery, not a new fault, until it reads cool.
        floor = follow_floor(self.rest_floor_c[ids], above, above < 0.5 * bar, judged)
        hot = judged & (above >= np.where(held_long, 0.5 * bar, bar)) & (above >= floor + bar)
        cleared = judged & (above < 0.5 * bar)
        evidence = gather_evidence(before, hot, cleared, evidence_rate(above, bar) * dt_s,
                                   dt_s, p.excess_after_s)
        held = evidence >= p.excess_after_s
        peak = np.where(held, np.fmax(self.rest_peak_c[ids], above), 0.0)
        cooled = held & judged & (above <= 0.5 * peak)
        self.rest_evidence_s[ids] = np.where(cooled, 0.0, evidence)
        self.rest_peak_c[ids] = np.where(cooled, 0.0, peak)
        # ... and a trouble that has risen over it and held is judged as any other.
        self.rest_floor_c[ids] = np.where(cooled, np.maximum(above, 0.0),
                                          np.where(held, 0.0, floor))
        # Learn the place from readings that look like one: near what was learned, or
        # (before anything is) within the learned bar of the median, so a hot die is not
        # taken for a warm seat.
        near = np.abs(above) < np.where(learned, 0.5 * p.rest_excess_c, p.rest_excess_c)
        self.rest_offset[ids], self.rest_learned_s[ids] = _learn_place(
            offset, self.rest_learned_s[ids], dev, judged & ~hot & near, dt_s, p.rest_learn_s)
        return hot & held & ~cooled, np.where(judged, dev, 0.0)

    def _hot_beside_peers(self, ids: npt.NDArray[np.int64], temp: npt.NDArray[np.float64],
                          power: npt.NDArray[np.float64], drawn_med: npt.NDArray[np.float64],
                          dt_s: npt.NDArray[np.float64]
                          ) -> tuple[npt.NDArray[np.bool_], npt.NDArray[np.float64]]:
        """``thermal_excess`` judged without a thermal model: a die hot for its seat among
        the node's GPUs that drew its power (the condition, gathered for ``excess_after_s``
        of evidence; how far above their median it reads).

        Dies of one node share its inlet. Those that drew the same power at every time
        scale a die may follow (now, and smoothed with each candidate lag, so a die still
        hot from a job its peers did not run is not compared with them) took in the same
        heat, and differ by their seats alone: where each sits in the airflow or on the
        loop, a difference that grows with the power and is learned per band of it. A die
        ``peer_excess_c`` above their median beyond its learned seat (above the median
        outright while none is learned) passes its heat through a degraded path. The
        thermal model judges only a power it has learned for minutes, and a node whose load
        keeps moving may never give it one: a held-out zoo missed a die 25 degC above its
        seven peers at their power for eight minutes (zoo-1054: liquid, 1 degC sensors)."""
        p = self.params
        dev = temp - drawn_med
        judged = np.isfinite(dev)
        band = np.clip(np.nan_to_num(power / _SEAT_BAND_W).astype(np.int64), 0, DWELL_BINS - 1)
        offset = self.peer_offset[ids, band]
        seen = self.peer_learned_s[ids, band]
        learned = seen >= p.rest_learn_s
        above = np.where(learned, dev - offset, dev)
        hot = judged & (above >= p.peer_excess_c)
        # Learn the seat from readings that look like one (as ``_hot_at_rest`` does).
        near = np.abs(above) < np.where(learned, 0.5, 1.0) * p.peer_excess_c
        self.peer_offset[ids, band], self.peer_learned_s[ids, band] = _learn_place(
            offset, seen, dev, judged & ~hot & near, dt_s, p.rest_learn_s)
        # Gathered as the model's paths gather theirs (``features.evidence_rate``): a die at
        # the bar waits the whole ``excess_after_s``, one 22 degC above its seven peers a
        # quarter of it. Held-out zoo-1706 (air, 12 s dies, whole degrees, a runaway of
        # +25 degC on a node whose power swung 180-300 W in turns): the model's path never
        # judged a settled power, and a flat minute here paged 68 s after the die heated.
        # A step that is not hot starts over, as before.
        evidence = gather_evidence(self.peer_evidence_s[ids], hot, ~hot,
                                   evidence_rate(above, p.peer_excess_c) * dt_s, dt_s,
                                   p.excess_after_s)
        self.peer_evidence_s[ids] = evidence
        return hot & (evidence >= p.excess_after_s), np.where(judged, dev, 0.0)

    def step(
        self, ids: npt.NDArray[np.int64], cond: npt.NDArray[np.bool_],
        val: npt.NDArray[np.float64], valid: npt.NDArray[np.bool_], ts_ms: int,
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Advance the rules of GPUs ``ids``; returns (opened, resolved) as (row, rule)."""
        self.last_seen_ms[ids] = np.where(valid, ts_ms, self.last_seen_ms[ids])
        opened, resolved = self._advance(ids, cond, val, ts_ms)
        # A burst whose alert has ended (no error for ``event_hold_s``) is over: its count
        # starts again from nothing, so a routine error a minute later is not a new burst.
        # A storm of a few hundred errors otherwise still weighs dozens then, and one PCIe
        # replay re-paged a link that had stopped erring (zoo-1369).
        for row, k in resolved:
            if k in _BURST_RULES:
                self.burst[ids[row], k - _BURST_RULES[0]] = 0.0
        return opened, resolved

    def check_stale(self, ids: npt.NDArray[np.int64], now_ms: int
                    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """Mark GPUs ``ids`` (of racks that still report) lost when silent too long."""
        silent = (self.last_seen_ms[ids] > 0) & (
            now_ms - self.last_seen_ms[ids] > self.params.stale_after_s * 1000
        )
        # Only the lost rule advances here; others keep their state.
        cond = np.zeros((len(ids), len(self.rules)), dtype=bool)
        cond[:, LOST] = silent
        mask = np.zeros(len(self.rules), dtype=bool)
        mask[LOST] = True
        sel = silent | self.open[ids, LOST]
        if not sel.any():
            return [], []
        rows = np.flatnonzero(sel)
        opened, resolved = self._advance(ids[rows], cond[rows], np.zeros_like(cond[rows], float),
                                         now_ms, only=mask, clear_ok=False)
        return ([(int(rows[r]), k) for r, k in opened], [(int(rows[r]), k) for r, k in resolved])

    def _advance(
        self, ids: npt.NDArray[np.int64], cond: npt.NDArray[np.bool_],
        val: npt.NDArray[np.float64], ts_ms: int,
        only: npt.NDArray[np.bool_] | None = None, clear_ok: bool = True,
    ) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        run = np.where(cond, self.run[ids] + 1, 0)
        last_true = np.where(cond, ts_ms, self.last_true_ms[ids])
        was_open = self.open[ids]
        open_after = np.array([r.open_after for r in self.rules])
        hold_ms = np.array([int(r.hold_s * 1000) for r in self.rules])
        opens = ~was_open & (run >= open_after)
        resolves = was_open & ~cond & (ts_ms - last_true >= hold_ms) & clear_ok
        if only is not None:
            opens &= only
            resolves &= only
            keep = ~only
            run = np.where(keep, self.run[ids], run)
            last_true = np.where(keep, self.last_true_ms[ids], last_true)
        self.run[ids] = run
        self.last_true_ms[ids] = last_true
        self.open[ids] = (was_open & ~resolves) | opens
        self.started_ms[ids] = np.where(opens, ts_ms, self.started_ms[ids])
        self.value[ids] = np.where(cond, val, self.value[ids])
        o = np.argwhere(opens)
        r = np.argwhere(resolves)
        return ([(int(a), int(b)) for a, b in o], [(int(a), int(b)) for a, b in r])

    def state_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        out = {f"rules.{k}": getattr(self, k).copy() for k in self.ARRAYS}
        out["rules.taus"] = TAUS_S.copy()
        out.update(self.excess_settling.state_arrays("rules.excess_settling"))
        return out

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]]) -> None:
        """Restore; an array the checkpoint's version did not have starts at zero, and one
        written with other lags is mapped onto today's (``load_state``)."""
        load_state(self, arrays, "rules", self.ARRAYS, self.LAG_ARRAYS,
                   len(arrays["rules.run"]))
        self.excess_settling.load_arrays(arrays, "rules.excess_settling",
                                         len(arrays["rules.run"]))
        if "rules.stuck_drawn0" not in arrays:
            # Not known for a freeze under way (zero would read as a median of 0 degC).
            self.stuck_drawn0[:] = np.nan
        if "rules.span_moved_w" not in arrays:
            # Written before the move was kept, only whether it stayed under _STILL_W.
            still = arrays.get("rules.span_still", np.zeros(len(self.span_moved_w), dtype=bool))
            self.span_moved_w[:] = np.where(np.asarray(still, dtype=bool), 0.0, _STILL_W)
        if "rules.stuck_like_lo" not in arrays:
            self.stuck_like_lo[:] = np.nan
            self.stuck_like_hi[:] = np.nan

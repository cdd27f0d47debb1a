"""A temperature sensor frozen beside node peers whose readings wander: found without the thermal
model (a steady load gives its lags nothing to swing), and a healthy die that settles between two
steps beside peers that flicker across one is not taken for it."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from test_detector_support import healthy, timestamps
from test_rules_rest import PER_NODE, _shard

from detector.config import RulesConfig
from detector.features import COL

STEPS = 900
FREEZE = 400  # GPU 2's reading holds from here on (or its die settles between steps)


def _steady_node(step_c: float, noise_c: float, die_c: npt.NDArray[np.float64],
                 seed: int = 0) -> npt.NDArray[np.float64]:
    """Two nodes of 8 GPUs at 1 Hz: node 0 at a steady 400 W, node 1 idle; node 0's dies at
    ``die_c`` (steps, 8), read with Gaussian ``noise_c`` and rounded to ``step_c``."""
    rng = np.random.default_rng(seed)
    g = 2 * PER_NODE
    x = healthy(STEPS, g, seed)
    busy = np.zeros((STEPS, g), dtype=bool)
    busy[:, :PER_NODE] = True
    power = np.where(busy, 400.0, 70.0) + rng.normal(0, 4, (STEPS, g))
    x[:, :, COL["utilization_ratio"]] = np.where(busy, 0.95, 0.02)
    x[:, :, COL["power_usage_watts"]] = power
    x[:, :, COL["power_limit_watts"]] = 700.0
    x[:, :, COL["sm_clock_hertz"]] = np.where(busy, 1.98e9, 0.345e9)
    x[:, :, COL["clock_event_reasons"]] = np.where(busy, 0, 1)
    die = np.concatenate([die_c, np.full((STEPS, PER_NODE), 33.0)], axis=1)
    read = np.round((die + rng.normal(0, noise_c, die.shape)) / step_c) * step_c
    x[:, :, COL["temperature_celsius"]] = read
    x[:, :, COL["memory_temperature_celsius"]] = np.round(die + 5)
    return x


def _stuck(data: npt.NDArray[np.float64]) -> list[tuple[str, int]]:
    shard, ids, nodes = _shard(nodes=2)
    got = shard.process(ids, nodes, timestamps(STEPS), data)
    t0 = timestamps(1)[0]
    return [(a.entity.rsplit("/", 1)[-1], (a.started_ms - t0) // 1000)
            for a in got if a.source == "rule:temperature_stuck"]


def _bubbling_node(full_w: float, dip_w: float, dips: npt.NDArray[np.bool_], inlet_c: float,
                   c_per_w: float, lag_s: float, step_c: float) -> npt.NDArray[np.float64]:
    """``_steady_node`` with node 0 running a pipeline: each GPU at ``full_w`` but at
    ``dip_w`` where ``dips`` (steps, 8) says, its die at ``inlet_c`` plus ``c_per_w`` times
    its power followed with ``lag_s``, read exactly to ``step_c``."""
    x = _steady_node(step_c, 0.0, np.full((STEPS, PER_NODE), 60.0))
    power = np.where(dips, dip_w, full_w)
    die = np.empty_like(power)
    die[0] = inlet_c + c_per_w * power[0]
    keep = np.exp(-1.0 / lag_s)
    for s in range(1, STEPS):
        die[s] = die[s - 1] * keep + (inlet_c + c_per_w * power[s]) * (1.0 - keep)
    x[:, :PER_NODE, COL["power_usage_watts"]] = power
    x[:, :PER_NODE, COL["utilization_ratio"]] = np.where(power > 0.7 * full_w, 0.95, 0.2)
    x[:, :PER_NODE, COL["temperature_celsius"]] = np.round(die / step_c) * step_c
    x[:, :PER_NODE, COL["memory_temperature_celsius"]] = np.round(die + 5)
    return x


def test_a_sensor_frozen_among_peers_whose_readings_wander_is_found() -> None:
    """Half-degree sensors with 0.45 degC of noise at a steady 400 W (tuning zoo-7's kind):
    each peer's readings span a degree or more every half minute, so GPU 2's reading held for
    minutes is its sensor, though no lag of its model swings."""
    die = np.full((STEPS, PER_NODE), 60.0) + np.arange(PER_NODE) * 0.3
    data = _steady_node(0.5, 0.45, die)
    temp = COL["temperature_celsius"]
    data[FREEZE:, 2, temp] = data[FREEZE, 2, temp]
    got = _stuck(data)
    assert {gpu for gpu, _ in got} == {"gpu-2"}, got
    # Twice stuck_after_s of the freeze with its peers wandering, and ten times its longest
    # run of a few seconds.
    hold = RulesConfig().stuck_after_s
    assert FREEZE + 2 * hold <= got[0][1] <= FREEZE + 2 * hold + 80, got


def test_a_die_settling_between_steps_beside_flickering_peers_is_not_frozen() -> None:
    """Whole-degree sensors with 0.2 degC of noise (tuning zoo-4's kind): node 0's dies sit on a
    step boundary, so each reading flickers between two values, and GPU 2's die, flickering
    with them until ``FREEZE``, settles half a degree lower, between two steps, and reads one
    value from then on. Its peers' readings change every few seconds but never span two
    steps: dies that close to one step show nothing of how far theirs move."""
    die = np.full((STEPS, PER_NODE), 60.5)
    die[FREEZE:, 2] = 60.0
    got = _stuck(_steady_node(1.0, 0.2, die))
    assert got == [], got


def test_a_steady_stage_beside_peers_whose_readings_follow_their_bubbles_is_not_frozen() -> None:
    """Whole-degree sensors with no noise on fast dies (2.8 s; held-out zoo-1584's kind), a
    pipeline node at 600 W whose GPUs each dip to 130 W for 6 s in turn: every peer's reading
    spans degrees in each half minute, with its own dips. GPU 2's stage runs without bubbles
    from ``FREEZE`` on and its die, at one steady load, reads one value: healthy. Its peers'
    readings moved with their load, so they say nothing of how a die at one load wanders."""
    t = np.arange(STEPS)[:, None]
    dips = (t + 3 * np.arange(PER_NODE)) % 24 < 6
    dips[FREEZE:, 2] = False
    x = _bubbling_node(600.0, 130.0, dips, 30.0, 0.037, 2.8, 1.0)
    assert np.ptp(x[FREEZE + 5:, 2, COL["temperature_celsius"]]) == 0
    assert _stuck(x) == []


def test_a_flat_stage_read_by_an_exact_sensor_beside_bubbling_peers_is_not_frozen() -> None:
    """Exact 0.1 degC sensors without noise on 17 s dies (the held-out soak's zoo-1693 kind):
    a node at a 300 W cap whose GPUs dip to 50 W for a second of every four in turn; their
    lag-smoothed power ripples by about 14 W, well within one load (``_STILL_W``), and their
    dies by 2 degC, twenty steps. GPU 2's stage runs without bubbles from ``FREEZE`` on, at
    a flat 300 W, and its die reads one value: healthy. Its peers' readings moved with
    their own load, which its did not."""
    t = np.arange(STEPS)[:, None]
    dips = (t + np.arange(PER_NODE)) % 4 == 0
    dips[FREEZE:, 2] = False
    x = _bubbling_node(300.0, 50.0, dips, 22.0, 0.15, 17.0, 0.1)
    assert np.ptp(x[FREEZE + 120:, 2, COL["temperature_celsius"]]) == 0
    assert _stuck(x) == []


def test_a_checkpoint_from_before_the_move_was_kept_keeps_which_windows_were_still() -> None:
    """A checkpoint that kept only whether each GPU's last window was still (``span_still``,
    before its move in watts) restores still windows as still and the others as not, so the
    window under way judges as it would have."""
    from detector.rules import _STILL_W, RuleBook, RuleParams

    book = RuleBook(RuleParams())
    book.ensure(3)
    arrays = {k: v for k, v in book.state_arrays().items() if k != "rules.span_moved_w"}
    arrays["rules.span_still"] = np.array([True, False, True])
    again = RuleBook(RuleParams())
    again.load_arrays(arrays)
    assert list(again.span_moved_w < _STILL_W) == [True, False, True]
    # Older still, with neither: no window counts as still.
    del arrays["rules.span_still"]
    again.load_arrays(arrays)
    assert not (again.span_moved_w < _STILL_W).any()

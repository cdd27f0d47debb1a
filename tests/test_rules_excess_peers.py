"""``thermal_excess`` with no thermal model: a die far above the GPUs of its node that drew its
power, now and over every time scale its die may follow, has a degraded heat path.

The fixture (``fixtures/zoo/zoo1054_node_runaway_unlearned_power.npz``) is the node of a
runaway the held-out zoo missed: ``benchmarks.detection --zoo --zoo-splits heldout
--zoo-heldout-from 53 --zoo-count 5`` at fa9655c, draw zoo-1054 (liquid cooling, a 43 s lag,
whole-degree sensors, a 400 W limit, 2 Hz), node ``node-000-03-02`` (GPUs 112-119), seconds
800-2,000 at 2 Hz: die temperature in degrees, power in watts, utilisation in percent. The
node runs bursty inference, then trains from about 1,470 s; GPU 0's heat path degrades at
1,468 s (+25 degC on its die, no ramp) and its die settles about 25 degC above its seven
peers at their power until the fault ends at 1,938.5 s. The load moved through new powers
all along, so no thermal model had learned the power it was judged at, and the
model's path never judged it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
from test_detector_support import T0_MS, load_recorded, replay_node

from detector.config import RulesConfig
from detector.features import COL

FIXTURE = Path(__file__).parent / "fixtures" / "zoo" / "zoo1054_node_runaway_unlearned_power.npz"
START_S = 800
FAULT_S = 1468


def _pages(rows: npt.NDArray[np.float64], rules: RulesConfig | None = None
           ) -> list[tuple[str, int, float]]:
    """(rule, GPU, seconds on the recording's clock) of each page."""
    return [(a.source, int(a.entity.rsplit("-", 1)[-1]), START_S + (a.started_ms - T0_MS) / 1000)
            for a in replay_node(rows, 500, rules)
            if a.source.startswith("rule:") and a.state.value == "firing"]


def test_a_die_far_above_its_peers_at_their_power_is_paged_without_a_model() -> None:
    rows = load_recorded(FIXTURE, 400.0)
    pages = _pages(rows)
    assert [(rule, gpu) for rule, gpu, _ in pages] == [("rule:thermal_excess", 0)], pages
    assert FAULT_S < pages[0][2] <= FAULT_S + 120
    # The die stood far above its peers, at their power.
    k = (1700 - START_S) * 2
    temp, power = rows[k, :, COL["temperature_celsius"]], rows[k, :, COL["power_usage_watts"]]
    assert temp[0] - np.median(temp[1:]) >= 20.0
    assert abs(power[0] - np.median(power[1:])) <= 0.2 * np.median(power[1:])


def test_the_farther_above_its_peers_the_sooner_it_is_paged() -> None:
    """The path gathers its hold (``excess_after_s``) as evidence, faster the farther past
    its bar the die stands (``features.evidence_rate``): this die passed the 10 degC bar at
    1,487.5 s and stood 17 degC above its peers half a minute later, so it pages well inside
    the hold a die at the bar waits, and no sooner than the rate's cap allows (with a flat
    minute, before 4fe4cc1, it paged 62 s after)."""
    hold = RulesConfig().excess_after_s
    rows = load_recorded(FIXTURE, 400.0)
    temp = rows[:, :, COL["temperature_celsius"]]
    dev = temp[:, 0] - np.median(temp[:, 1:], axis=1)
    passed = START_S + np.flatnonzero(
        (dev >= RulesConfig().peer_excess_c) & (np.arange(len(dev)) >= (FAULT_S - START_S) * 2)
    )[0] / 2
    page = _pages(rows)[0][2]
    assert passed + hold / 4 <= page <= passed + 0.75 * hold, (passed, page)


def test_the_thermal_models_alone_miss_it() -> None:
    # What the rule did before it compared dies with no model: nothing.
    rows = load_recorded(FIXTURE, 400.0)
    assert _pages(rows, RulesConfig(peer_excess_c=float("inf"))) == []

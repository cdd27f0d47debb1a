"""A fast die under bursty load whose sensor froze at the bottom of one of its power dips.

The thermal model judges only powers it has learned for five minutes, and a dip of a few
seconds never is one: at the step the reading froze the model had nothing to say, so the
rule had nothing to compare the held reading with (tuning zoo-8: air, 3 s dies, whole
degrees, 580 W with dips to 150 W; frozen at 37 degC while the model put the die at 44-47,
as its peers read, for 13 minutes, and never paged). The model had read the die right
seconds before the dip, which is what the rule asks of it now.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from test_detector_support import healthy, timestamps
from test_rules_rest import _shard

from detector.config import RulesConfig
from detector.features import COL

STEPS = 1500
FREEZE = 900  # GPU 2's reading holds from the bottom of a dip here


def _node_data(seed: int = 0) -> npt.NDArray[np.float64]:
    """Two nodes of 8 GPUs at 1 Hz, busy at 580 W with dips to 150 W of 3-5 s at random
    times (one every 25 s on average, each GPU its own), 3 s dies, whole degrees."""
    rng = np.random.default_rng(seed)
    g = 16
    x = healthy(STEPS, g, seed)  # its error counters; load and heat are set below
    dip = np.zeros((STEPS, g), dtype=bool)
    for j in range(g):
        for s in np.flatnonzero(rng.random(STEPS) < 1 / 25):
            dip[s:s + int(rng.integers(3, 6)), j] = True
    dip[FREEZE - 4:FREEZE + 1, 2] = True  # the dip GPU 2's sensor freezes in
    dip[FREEZE + 1:FREEZE + 8, 2] = False
    power = np.where(dip, 150.0, 580.0) + rng.normal(0, 4, (STEPS, g))
    x[:, :, COL["utilization_ratio"]] = np.where(dip, 0.3, 0.95)
    x[:, :, COL["power_usage_watts"]] = power
    x[:, :, COL["power_limit_watts"]] = 700.0
    temp = np.empty((STEPS, g))
    t = 20 + 0.05 * power[0]
    for s in range(STEPS):
        t = t + (20 + 0.05 * power[s] - t) * (1 - np.exp(-1 / 3))
        temp[s] = t
    x[:, :, COL["temperature_celsius"]] = np.round(temp + rng.normal(0, 0.3, temp.shape))
    x[:, :, COL["memory_temperature_celsius"]] = np.round(temp + 5)
    x[:, :, COL["sm_clock_hertz"]] = 1.98e9
    x[:, :, COL["clock_event_reasons"]] = 0.0
    return x


def _stuck(data: npt.NDArray[np.float64]) -> list[tuple[str, int]]:
    shard, ids, nodes = _shard(nodes=2)
    got = shard.process(ids, nodes, timestamps(STEPS), data)
    t0 = timestamps(1)[0]
    return [(a.entity.rsplit("/", 2)[-2] + "/" + a.entity.rsplit("/", 1)[-1],
             (a.started_ms - t0) // 1000)
            for a in got if a.source == "rule:temperature_stuck" and a.state.value == "firing"]


def test_a_sensor_frozen_in_a_dip_is_judged_by_the_model_that_read_it_right_before() -> None:
    data = _node_data()
    temp = COL["temperature_celsius"]
    held = data[FREEZE, 2, temp]
    assert held <= 32, held  # the bottom of the dip: about 10 degC under the busy die
    data[FREEZE:, 2, temp] = held
    stuck = _stuck(data)
    assert {e for e, _ in stuck} == {"node-0/gpu-2"}, stuck
    # The hold's evidence gathered at up to four times the rate, on the steps the model
    # can judge (not the dips).
    hold = RulesConfig().stuck_after_s
    assert FREEZE + hold / 4 <= stuck[0][1] <= FREEZE + 2 * hold, stuck


def test_the_same_dips_on_healthy_sensors_are_not_stuck() -> None:
    assert _stuck(_node_data(seed=1)) == []

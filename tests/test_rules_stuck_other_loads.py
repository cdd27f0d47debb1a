"""``temperature_stuck``'s node-peer path pages only where the node's median and the median of
the peers running the GPU's load have both moved: a node's other loads move the median of
all its dies without moving any die under this one, and the set of peers at the GPU's power
changes under it.

The first fixture (``fixtures/zoo/zoo1088_node_peers_change_loads.npz``) is one node of the
held-out soak that paged on it: ``benchmarks.detection_soak --split heldout --draws-from 72
--pages-only --parts 26 --gpus 256 --hours 12`` at 955a554, part 16, draw zoo-1088 (liquid
cooling, a 119 s lag, noiseless tenth-degree sensors, no power limit exported, 1 Hz), GPUs
40-47, seconds 7,800-8,900: die temperature in tenths of a degree, power in milliwatts,
utilisation in percent. GPU 3 idles throughout, reading a right 34.5 degC from 8,414 s. At
about 8,490 s three of its peers start bursty inference and the two that trained stop and
cool from 56 degC; the two idling beside it hold still. The old path paged GPU 3 at 8,601 s.

The second (``fixtures/zoo/zoo1060_node_pipeline_at_cap.npz``) is one node of the held-out
zoo run that measured the first fix alone (median of the peers at the GPU's load only):
``benchmarks.detection --zoo --zoo-splits heldout --zoo-heldout-from 59`` at 1aba66d, draw
zoo-1060 (liquid cooling, a 31 s lag, tenth-degree sensors, a 600 W limit, 0.5 Hz), GPUs
120-127, seconds 400-2,200. Pipeline stages at the cap sit at 53-61 degC by seat; a
rotating bubble takes one or two of them to 100 W every few tens of seconds, and GPU 6
starts work at about 1,880 s. GPU 7 reads a right 60.8 degC at the cap throughout. The
median of the GPUs at its power jumped 4.4 degC as GPU 6 joined them and a cool stage left
them in a bubble; that fix paged GPU 7 at 1,988 s, and the node's median moved 2.4 degC.

The third (``fixtures/zoo/zoo1277_node_rhythm_sampled_at_one_phase.npz``) is one node of the
held-out soak that paged on it: ``benchmarks.detection_soak --split heldout --draws-from 271
--pages-only --parts 26 --gpus 256 --hours 12`` at c163dcd, part 6, draw zoo-1277 (air, a
27 s lag, whole-degree sensors with little noise, a 500 W limit, 10 Hz run at 1 Hz), GPUs
216-223, seconds 36,000-39,900 in whole degrees, tenths of a watt and percent. GPUs 1 and 5
run at 490-500 W from 39,260 s on and read a right 56 and 57 degC throughout. At about
39,690 s GPUs 2 and 6 leave that load for a rhythm of seconds around 290 W and cool from 55
to 42 degC; read once a second, half their readings still catch full power, so at those
seconds they count among the peers at the held GPUs' power. The old path paged GPUs 1 and 5
at 39,789 s: the median of the peers at their power had fallen 13 degC, while their own
power had not moved.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
from test_detector_support import T0_MS, load_recorded, replay_node

from detector.features import COL

ZOO = Path(__file__).parent / "fixtures" / "zoo"
START_S = 7800
IDLE_GPU = 3


def _pages(rows: npt.NDArray[np.float64], step_ms: int) -> list[tuple[str, str, int]]:
    """The rules' alerts over one node's recorded rows: (source, GPU, seconds in)."""
    return [(a.source, a.entity.rsplit("/", 1)[-1], (a.started_ms - T0_MS) // 1000)
            for a in replay_node(rows, step_ms) if a.source.startswith("rule:")]


def test_an_idle_gpu_whose_peers_change_loads_is_not_stuck() -> None:
    rows = load_recorded(ZOO / "zoo1088_node_peers_change_loads.npz", np.nan)
    pages = _pages(rows, 1000)
    assert pages == [], pages
    # What the old path saw: the reading held while the median of all seven peers rose by
    # 4 degC or more, and the GPU stayed at the idle power of the peers idling with it.
    temp = rows[:, :, COL["temperature_celsius"]]
    held = temp[8414 - START_S:8865 - START_S, IDLE_GPU]
    assert np.all(held == 34.5)
    peers = np.delete(temp, IDLE_GPU, axis=1)
    rise = np.median(peers[8600 - START_S]) - np.median(peers[8400 - START_S])
    assert rise >= 4.0, rise
    power = rows[8400 - START_S:8900 - START_S, :, COL["power_usage_watts"]]
    assert np.all(power[:, IDLE_GPU] < 100.0)
    assert np.abs(np.median(power[:, [6, 7]]) - np.median(power[:, IDLE_GPU])) < 20.0


def test_a_gpu_at_the_cap_among_pipeline_stages_is_not_stuck() -> None:
    rows = load_recorded(ZOO / "zoo1060_node_pipeline_at_cap.npz", 600.0)
    pages = _pages(rows, 2000)
    assert pages == [], pages
    # What the first fix saw: GPU 7 held 60.8 degC at the cap, and the median of the GPUs
    # near its power rose 4 degC or more while the node's median rose less.
    temp = rows[:, :, COL["temperature_celsius"]]
    power = rows[:, :, COL["power_usage_watts"]]
    held = temp[(1872 - 400) // 2:(2106 - 400) // 2, 7]
    assert np.all(held == 60.8)

    def at_cap_median(k: int) -> float:
        return float(np.median(temp[k][power[k] > 480.0]))

    before, after = (1872 - 400) // 2, (1992 - 400) // 2
    assert at_cap_median(after) - at_cap_median(before) >= 4.0
    assert np.median(temp[after]) - np.median(temp[before]) < 4.0


def test_peers_that_cool_under_another_load_say_nothing_of_a_gpu_whose_load_held() -> None:
    rows = load_recorded(ZOO / "zoo1277_node_rhythm_sampled_at_one_phase.npz", 500.0)
    pages = _pages(rows, 1000)
    assert pages == [], pages
    # What the old path saw: GPUs 1 and 5 held their readings at an unchanged power while
    # GPUs 2 and 6, half of whose readings still showed that power, cooled 13 degC.
    start = 36000
    temp = rows[:, :, COL["temperature_celsius"]]
    power = rows[:, :, COL["power_usage_watts"]]
    before, after = slice(39300 - start, 39680 - start), slice(39700 - start, 39900 - start)
    assert np.all(temp[39300 - start:, 1] == 56.0) and np.all(temp[39300 - start:, 5] == 57.0)
    assert np.all(temp[before][:, [2, 6]].mean(axis=0) >= 54.0)
    assert np.all(temp[39800 - start:, [2, 6]].mean(axis=0) <= 43.0)
    held = power[:, [1, 5]]
    assert np.all(np.abs(held[after].mean(axis=0) / held[before].mean(axis=0) - 1.0) < 0.05)
    left = power[:, [2, 6]]
    assert np.all(left[after].mean(axis=0) < 300.0)
    assert np.all((left[after] >= 450.0).mean(axis=0) >= 0.4)

"""``temperature_stuck``'s node-peer path compares a held reading with the peers that run the
GPU's load, not with every peer: a node's other loads move the median of all its dies
without moving any die under this one.

The fixture (``fixtures/zoo/zoo1088_node_peers_change_loads.npz``) is one node of the
held-out soak that paged on it: ``benchmarks.detection_soak --split heldout --draws-from 72
--pages-only --parts 26 --gpus 256 --hours 12`` at 955a554, part 16, draw zoo-1088 (liquid
cooling, a 119 s lag, noiseless tenth-degree sensors, no power limit exported, 1 Hz), GPUs
40-47, seconds 7,800-8,900: die temperature in tenths of a degree, power in milliwatts,
utilisation in percent. GPU 3 idles throughout, reading a right 34.5 degC from 8,414 s. At
about 8,490 s three of its peers start bursty inference and the two that trained stop and
cool from 56 degC; the two idling beside it hold still. The old path paged GPU 3 at 8,601 s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import numpy.typing as npt
from test_detector_support import T0_MS, recorded_rows, rules_shard

from detector.features import COL

FIXTURE = Path(__file__).parent / "fixtures" / "zoo" / "zoo1088_node_peers_change_loads.npz"
START_S = 7800
IDLE_GPU = 3


def _rows() -> npt.NDArray[np.float64]:
    f = np.load(FIXTURE)
    return recorded_rows(f["temp_deci_c"] / 10.0, f["power_mw"] / 1000.0,
                         f["util_pct"] / 100.0, np.nan)


def test_an_idle_gpu_whose_peers_change_loads_is_not_stuck() -> None:
    rows = _rows()
    steps, gpus = rows.shape[:2]
    shard, ids, nodes = rules_shard([f"c/row-0/rack-0/node-0/gpu-{g}" for g in range(gpus)])
    ts = T0_MS + 1000 * np.arange(steps, dtype=np.int64)
    alerts = []
    for s in range(0, steps, 300):
        alerts += shard.process(ids, nodes, ts[s:s + 300], rows[s:s + 300])
    pages = [(a.source, a.entity.rsplit("/", 1)[-1], START_S + (a.started_ms - T0_MS) // 1000)
             for a in alerts if a.source.startswith("rule:")]
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

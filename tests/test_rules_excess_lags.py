"""``thermal_excess`` where a GPU's thermal model extrapolates: its candidate lags put the die
far apart from one another at a power their fits barely saw, and none of them may accuse.

The fixture (``fixtures/zoo/zoo1040_node_idle_after_bubbles.npz``) is one node of the
held-out soak fleet that paged falsely: ``benchmarks.detection_soak --split heldout
--draws-from 30 --pages-only --gpus 256 --hours 12``, part 10 (draw zoo-1040: liquid
cooling, a 92 s lag, whole-degree sensors without noise), GPUs 136-143, the first 24,000
seconds at 1 Hz: die temperature in half degrees, power in tenths of a watt, utilisation
in percent. The node trains for hours with pipeline bubbles (one GPU at a time drops to
~80 W for minutes), then idles at ~44 W from about 23,100 s: a power none of its lags had
settled at. GPU 3's fastest lag then predicted 50 degC, its slowest 28, for a die reading
38 as its peers did; only the slowest had been plausible while it last ran as predicted,
and the rule paged for 43 minutes.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_detector_support import T0_MS, load_recorded, rules_shard, timestamps

from detector.features import COL

FIXTURE = Path(__file__).parent / "fixtures" / "zoo" / "zoo1040_node_idle_after_bubbles.npz"


def test_lags_that_disagree_at_an_unsettled_power_accuse_nothing() -> None:
    rows = load_recorded(FIXTURE, 400.0)
    steps, gpus = rows.shape[:2]
    # The rules are under test: no forests, no rack model.
    shard, ids, nodes = rules_shard([f"c/row-0/rack-0/node-0/gpu-{g}" for g in range(gpus)])
    ts = timestamps(steps)
    alerts = []
    for s in range(0, steps, 3600):
        alerts += shard.process(ids, nodes, ts[s:s + 3600], rows[s:s + 3600])
    pages = [(a.source, a.entity.rsplit("/", 1)[-1], (a.started_ms - T0_MS) // 1000)
             for a in alerts if a.source.startswith("rule:")]
    assert pages == [], pages
    # The node did idle at the end, with every GPU's thermal model judging (not blind).
    assert (rows[-600:, :, COL["utilization_ratio"]] == 0).all()
    assert np.isfinite(shard.features.last_resid).all()

"""The rack heat rule where a rack's thermal models are young and a job moves the whole rack
to a power they have not learned: their guesses are alike, not errors that average out, and
the rule must not take them for a rack running hot.

The fixture (``fixtures/zoo/zoo1058_rack_young_models_new_power.npz``) is the rack of the
held-out soak fleet that paged falsely: ``benchmarks.detection_soak --split heldout
--draws-from 48 --pages-only --gpus 256 --hours 12``, part 10 (draw zoo-1058: air cooling, a
39 s lag, half-degree sensors, a 400 W limit, sampled at 1 Hz), GPUs 0-31 (four nodes of
rack-000-00), the first 900 seconds: die temperature in half degrees, power in milliwatts,
utilisation in percent. At about 560 s the rack drops from training to ~70 W; the models,
eight minutes old, had not learned that power, and their residuals averaged 4.1 degC over
the rack for more than a minute while the GPUs they judged averaged 0.6. The rule paged at
670 s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from test_detector_support import T0_MS, load_recorded, rules_shard, timestamps

from detector.rack_windows import Closed

FIXTURE = Path(__file__).parent / "fixtures" / "zoo" / "zoo1058_rack_young_models_new_power.npz"
RACK = "c/row-0/rack-0"


def test_young_models_at_a_power_they_never_saw_do_not_make_a_rack_hot() -> None:
    rows = load_recorded(FIXTURE, 400.0)
    steps, gpus = rows.shape[:2]
    # The rules are under test: no GPU forests (the rack forest runs, on the same windows).
    shard, ids, nodes = rules_shard([f"{RACK}/node-{g // 8}/gpu-{g}" for g in range(gpus)],
                                    rack=True)
    closed: list[Closed] = []
    add = shard.rack_windows.add

    def recording_add(*args):  # type: ignore[no-untyped-def]
        got = add(*args)
        closed.append(got)
        return got

    shard.rack_windows.add = recording_add  # type: ignore[method-assign]
    ts = timestamps(steps)
    alerts = []
    for s in range(0, steps, 60):
        alerts += shard.process(ids, nodes, ts[s:s + 60], rows[s:s + 60])
    pages = [(a.source, (a.started_ms - T0_MS) // 1000) for a in alerts
             if a.source.startswith("rule:")]
    assert pages == [], pages
    # What paged before: every warm model's residual averaged over 4 degC for over a minute.
    windows = [c for c in closed if len(c.racks)]
    every = np.array([c.means[0, 1] for c in windows])  # the forest's rack residual, degC
    assert (every >= 4.0).sum() >= 7
    # The rule was not blind: it judged most windows after the models' first five minutes.
    judged = np.array([c.judged[0] for c in windows])
    assert (judged[40:] >= 0.5).mean() > 0.7

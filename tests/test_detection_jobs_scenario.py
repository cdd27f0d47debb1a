"""The job-peer benchmark's scenario (``benchmarks.detection_jobs``): pipeline-parallel jobs
make a job's healthy ranks unequal, the rest of the scenario does not depend on their share,
and false incidents that start on a stage are counted apart."""

from __future__ import annotations

import numpy as np

from benchmarks.detection_jobs import STAGE_IMBALANCE, make_scenario, score


def test_pipeline_stages_are_unequal_and_leave_the_rest_unchanged() -> None:
    piped = make_scenario(7, nodes=16, hours=1.0, stragglers=2, pipeline=1.0)
    flat = make_scenario(7, nodes=16, hours=1.0, stragglers=2, pipeline=0.0)
    assert piped.in_pipeline is not None and flat.in_pipeline is not None
    assert piped.in_pipeline.any() and not flat.in_pipeline.any()
    # same jobs, attachments and stragglers: only the stage factors differ
    assert [(ms, g, a.workload) for ms, g, a in piped.events] == \
        [(ms, g, a.workload) for ms, g, a in flat.events]
    assert piped.stragglers == flat.stragglers
    # a healthy stage computes down to 1 - the largest imbalance of its job's profile
    ratio = piped.util / np.where(flat.util > 0.3, flat.util, np.nan)
    low = np.nanpercentile(ratio[piped.in_pipeline], 1)
    assert 1 - STAGE_IMBALANCE[1] - 0.1 <= low < 0.85


def test_false_incidents_on_a_stage_are_counted_apart() -> None:
    sc = make_scenario(7, nodes=16, hours=1.0, stragglers=1, pipeline=1.0)
    assert sc.in_pipeline is not None
    gid, start, end, _ = sc.stragglers[0]
    on_stage = np.argwhere(sc.in_pipeline)
    t, g = on_stage[on_stage[:, 1] != gid][0]
    free = np.argwhere(~sc.in_pipeline & (sc.util == 0))[0]
    got = score(sc, [(int(g), float(t), float(t) + 60),        # on a stage, false
                     (int(free[1]), float(free[0]), float(free[0]) + 5),  # off, false
                     (gid, start + 30, end)])                   # the straggler, found
    assert (got.found, got.false, got.false_pipeline) == (1, 2, 1)

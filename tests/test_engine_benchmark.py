"""The forest benchmarks: statistics and synthetic stream (no engine runs), and the cost by
model age on a tiny run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks import forest_phases
from benchmarks.forest import auc, ranks, spearman, synthetic_stream


def test_ranks_average_ties() -> None:
    np.testing.assert_array_equal(ranks(np.array([3.0, 1.0, 3.0, 2.0])), [2.5, 0.0, 2.5, 1.0])


def test_spearman_is_rank_based() -> None:
    x = np.random.default_rng(0).normal(size=200)
    assert spearman(x, np.exp(3 * x)) > 0.999999
    assert spearman(x, -x) < -0.999999
    assert abs(spearman(x, np.random.default_rng(1).normal(size=200))) < 0.2


def test_auc_extremes_and_ties() -> None:
    labels = np.array([False, False, True, True])
    assert auc(np.array([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert auc(np.array([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    assert auc(np.ones(4), labels) == 0.5


def test_synthetic_stream_labels_match_its_events() -> None:
    stream = synthetic_stream(models=3, steps=1500, warm=300, seed=2)
    assert stream.points.shape == (1500, 3, 8) and stream.points.dtype == np.float32
    assert not stream.labels[:300].any()
    marked = np.zeros_like(stream.labels)
    for model, first, end, kind in stream.events:
        assert kind in {"spike", "level_shift", "drift"} and 300 <= first < end
        marked[first:end, model] = True
    np.testing.assert_array_equal(marked, stream.labels)
    assert {kind for *_, kind in stream.events} == {"spike", "level_shift", "drift"}


def test_forest_phases_reports_every_age_span_for_both_walks(tmp_path: Path) -> None:
    out = tmp_path / "phases.json"
    assert forest_phases.main(["--models", "3", "--steps", "120", "--out", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["ages"] == ["0-64", "64-120"]
    assert set(got["us_per_step"]) == {"every_tree", "screen_2"}
    assert all(len(v) == 2 and min(v) > 0 for v in got["us_per_step"].values())

"""Adaptive thresholds and hysteresis (episodes)."""

from __future__ import annotations

import numpy as np

from detector.episodes import EpisodeParams, Episodes
from detector.thresholds import AdaptiveThresholds, ThresholdParams


def _scores(n: int, seed: int = 0) -> np.ndarray:
    return 1.0 + np.random.default_rng(seed).gamma(2.0, 0.05, n)


def test_nothing_is_anomalous_during_cold_start() -> None:
    th = AdaptiveThresholds(ThresholdParams(warmup=50, floor=1.2, z=4))
    th.ensure(1)
    warm = [1.0] * 50
    warm[10] = 9.0  # a spike inside the cold start is not judged
    flags = [th.update(np.array([0]), np.array([s]))[1][0] for s in warm]
    assert not any(flags)
    _, flag = th.update(np.array([0]), np.array([9.0]))
    assert flag[0]


def test_threshold_follows_each_models_own_scores() -> None:
    th = AdaptiveThresholds(ThresholdParams(warmup=100, floor=0.1, z=4, horizon=500))
    th.ensure(2)
    for s in range(600):
        th.update(np.array([0, 1]), np.array([_scores(1, s)[0], 3 * _scores(1, s + 7)[0]]))
    t0, t1 = th.threshold(np.array([0, 1]))
    assert 1.1 < t0 < 1.8 and 3.3 < t1 < 5.5
    # A score that is ordinary for model 1 is anomalous for model 0.
    _, flags = th.update(np.array([0, 1]), np.array([3.2, 3.2]))
    assert flags.tolist() == [True, False]


def test_a_long_anomaly_does_not_teach_the_threshold_to_accept_it() -> None:
    th = AdaptiveThresholds(ThresholdParams(warmup=100, floor=0.1, z=5, horizon=300))
    th.ensure(1)
    for s in _scores(400):
        th.update(np.array([0]), np.array([s]))
    before = th.threshold(np.array([0]))[0]
    flags = [th.update(np.array([0]), np.array([4.0]))[1][0] for _ in range(100)]
    assert all(flags[:50])
    assert th.threshold(np.array([0]))[0] < 2 * before


def test_zero_scores_are_the_engines_cold_start_and_are_ignored() -> None:
    th = AdaptiveThresholds(ThresholdParams(warmup=5))
    th.ensure(1)
    for _ in range(10):
        th.update(np.array([0]), np.array([0.0]))
    assert th.count[0] == 0


def _run(pattern: list[int], cooldown_s: float = 30) -> tuple[list[int], list[int]]:
    ep = Episodes(EpisodeParams(open_after=3, open_window=10, resolve_after=5,
                                cooldown_s=cooldown_s))
    ep.ensure(1)
    opened, resolved = [], []
    for t, a in enumerate(pattern):
        o, r = ep.step(np.array([0]), np.array([bool(a)]), np.array([2.0]), 1000 * t)
        opened += [t] * len(o)
        resolved += [t] * len(r)
    return opened, resolved


def test_scattered_single_steps_never_open() -> None:
    assert _run([1, 0, 0, 0, 0, 0, 0, 0] * 10) == ([], [])
    assert _run(([1, 1] + [0] * 18) * 5) == ([], [])


def test_three_in_a_row_open_and_one_gap_does_not_restart_the_count() -> None:
    assert _run([0, 1, 1, 1, 0])[0] == [3]
    assert _run([0, 1, 1, 0, 1, 1, 0])[0] == [5]  # 1,1,0,1 is not enough, 1,1,0,1,1 is


def test_resolves_after_quiet_then_cools_down() -> None:
    pattern = [1, 1, 1] + [0] * 5 + [1, 1, 1] + [0] * 10 + [1] * 30
    opened, resolved = _run(pattern)
    # Opens at t=2, resolves after 5 quiet steps (t=7); the run at t=8..10 falls in the
    # 30 s cooldown; the long run from t=21 opens once the cooldown is over (t=37).
    assert opened == [2, 37]
    assert resolved == [7]


def test_a_reset_forgets_the_count() -> None:
    ep = Episodes(EpisodeParams(open_after=3, open_window=10, resolve_after=5, cooldown_s=0))
    ep.ensure(1)
    ids = np.array([0])
    flags = [True, True, True]
    resets = [False, False, True]
    opened = [len(ep.step(ids, np.array([f]), np.array([2.0]), 1000 * t,
                          np.array([r]))[0]) for t, (f, r) in enumerate(zip(flags, resets,
                                                                              strict=True))]
    assert opened == [0, 0, 0]
    assert ep.level[0] == 0.0

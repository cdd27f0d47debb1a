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


def test_episode_opens_after_k_and_resolves_after_quiet_then_cools_down() -> None:
    ep = Episodes(EpisodeParams(open_after=3, resolve_after=5, cooldown_s=30))
    ep.ensure(1)
    ids = np.array([0])
    pattern = [1, 1, 0, 1, 1, 1, 1, 0, 0, 0, 0, 0, 1, 1, 1] + [0] * 10 + [1] * 30
    opened, resolved = [], []
    for t, a in enumerate(pattern):
        o, r = ep.step(ids, np.array([bool(a)]), np.array([2.0]), 1000 * t)
        opened += [t] * len(o)
        resolved += [t] * len(r)
    # Two anomalous steps then a gap: no alert. Opens at the 3rd consecutive (t=5),
    # resolves after 5 quiet steps (t=11), the burst at t=12..14 falls in the cooldown,
    # and the run from t=25 opens once the 30 s cooldown from t=11 is over (t=41).
    assert opened == [5, 41]
    assert resolved == [11]

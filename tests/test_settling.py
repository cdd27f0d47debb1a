"""``detector.settling``: a die cooling along its lag is seen heading under the bar within two
spans of its trouble's end; a plateau, noisy or whole-degree, never is; an easing that stays
is judged as it stands once its fall ends."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from detector.settling import SPAN_S, Settling, settle_level

BAR_C = 8.0


def _die(tau_s: float, levels: list[tuple[float, float]], seconds: float = 1200.0,
         noise_c: float = 0.0, whole: bool = False, seed: int = 0) -> npt.NDArray[np.float64]:
    """A die's heat over its model at 1 Hz: it follows a target that steps to each
    (time s, degC) of ``levels``, with lag ``tau_s``."""
    t = np.arange(seconds)
    target = np.zeros_like(t)
    for at, c in levels:
        target[t >= at] = c
    x = np.zeros_like(t)
    for i in range(1, len(t)):
        x[i] = x[i - 1] + (target[i] - x[i - 1]) * (1.0 - np.exp(-1.0 / tau_s))
    x = x + np.random.default_rng(seed).normal(0.0, noise_c, len(t))
    return np.round(x) if whole else x


def _settled(x: npt.NDArray[np.float64], tau_s: float) -> npt.NDArray[np.bool_]:
    s = Settling()
    s.ensure(1)
    ids = np.zeros(1, dtype=np.int64)
    return np.array([s.step(ids, x[i:i + 1], int((i + 1) * 1000), np.array([tau_s]),
                            np.array([BAR_C]))[0] for i in range(len(x))])


def test_the_level_of_an_exponential_fall_is_where_it_settles() -> None:
    tau, span = 105.0, 20.0
    x0, level = 40.0, 3.0
    x1 = level + (x0 - level) * np.exp(-span / tau)
    got = settle_level(np.array([x1]), np.array([x0 - x1]), span, np.array([tau]))
    assert abs(got[0] - level) < 1e-9


def test_a_runaway_that_ends_on_a_liquid_die_is_seen_settling_within_spans() -> None:
    # +40 degC from 100 s to 700 s on 105 s dies, whole-degree readings with noise; the
    # model chose 120 s. Cooling under half the bar takes 2.3 lags (240 s).
    x = _die(105.0, [(100.0, 40.0), (700.0, 0.0)], noise_c=0.5, whole=True)
    settled = _settled(x, 120.0)
    assert not settled[:700].any()
    first = int(np.flatnonzero(settled)[0])
    assert 700 < first <= 700 + 3 * SPAN_S + 1, first
    # ... and stays so while it cools (the rule's 30 s of clear steps need it).
    assert settled[first:first + 60].all()


def test_plateaus_and_an_easing_that_stays_are_not_settling() -> None:
    for seed in range(4):
        x = _die(105.0, [(100.0, 12.0)], noise_c=1.0, whole=True, seed=seed)
        assert not _settled(x, 120.0)[300:].any(), seed
    # Easing from +40 to +20 on 45 s dies the model gave 120 s: read along the longer lag the
    # fall heads lower than it goes, but once the die stands at +20 it is judged as it stands.
    x = _die(45.0, [(100.0, 40.0), (600.0, 20.0)])
    settled = _settled(x, 120.0)
    assert not settled[:600].any() and not settled[660:].any()
    # With its own lag, the easing projects +20 and never reads as settling.
    assert not _settled(x, 45.0).any()

"""Folding ticks into model steps: one step per ``step_s`` whatever the rate, each column
folded as its kind says, the same steps however the ticks are split into calls."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detector.step_fold import FoldKind, StepFold

KINDS = (FoldKind.MEAN, FoldKind.MAX, FoldKind.LAST, FoldKind.OR)
T0 = 1_767_225_600_000


def _ticks(gpus: int, n: int, hz: float, seed: int = 0, offsets: npt.NDArray[np.int64] | None
           = None) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
    """Tick-major rows of ``gpus`` GPUs: (ids, ts, rows), with 0-9 ms jitter per tick."""
    rng = np.random.default_rng(seed)
    off = np.zeros(gpus, dtype=np.int64) if offsets is None else offsets
    ids = np.tile(np.arange(gpus, dtype=np.int64), n)
    nominal = T0 + np.round(np.arange(n) * 1000.0 / hz).astype(np.int64)
    ts = (nominal[:, None] + off[None, :] + rng.integers(0, 10, (n, gpus))).reshape(-1)
    rows = rng.normal(0, 1, (n * gpus, len(KINDS)))
    rows[:, 3] = rng.integers(0, 256, n * gpus)
    return ids, ts, rows


def _fold(ids: npt.NDArray[np.int64], ts: npt.NDArray[np.int64], rows: npt.NDArray[np.float64],
          cuts: list[int], step_s: float = 1.0) -> tuple[npt.NDArray[np.int64], ...]:
    fold = StepFold(step_s, KINDS)
    fold.ensure(int(ids.max()) + 1)
    parts = [fold.add(ids[a:b], ts[a:b], rows[a:b])
             for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True)]
    return (np.concatenate([p.ids for p in parts]), np.concatenate([p.stamps_ms for p in parts]),
            np.concatenate([p.rows for p in parts]), np.concatenate([p.ticks for p in parts]))


def test_at_1hz_every_tick_is_its_own_step_and_passes_unchanged() -> None:
    ids, ts, rows = _ticks(3, 50, 1.0)
    out_ids, stamps, out_rows, ticks = _fold(ids, ts, rows, [])
    assert len(out_ids) == len(ids) and (ticks == 1).all()
    for g in range(3):
        mine = out_ids == g
        np.testing.assert_array_equal(out_rows[mine], rows[ids == g])
        assert (np.diff(stamps[mine]) == 1000).all()


def test_at_5hz_five_ticks_per_step_folded_by_kind() -> None:
    fold = StepFold(1.0, KINDS)
    fold.ensure(1)
    ts = T0 + 200 * np.arange(16, dtype=np.int64) + np.array([0, 3, 9, 1, 0, 7, 2, 5, 8, 0, 4,
                                                               6, 1, 3, 9, 2])
    rows = np.zeros((16, 4))
    rows[:, 0] = np.arange(16)
    rows[:, 1] = [0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 0]  # one tick carries a flag
    rows[:, 2] = np.arange(16) * 10.0  # a counter
    rows[:, 3] = [0, 0, 0, 0, 0, 0, 0x40, 0, 0x08, 0, 0, 0, 0, 0, 0, 0]
    rows[7, 0] = np.nan  # a NaN reading is skipped, not averaged in
    out = fold.add(np.zeros(16, dtype=np.int64), ts, rows)
    # The phase puts the first tick half an interval after a boundary: 5 ticks per step,
    # each step complete at its fifth tick (the sixteenth waits for the next four).
    assert out.ticks.tolist() == [5, 5, 5] and fold.count[0] == 1
    np.testing.assert_allclose(out.rows[0], [2.0, 0, 40, 0])
    np.testing.assert_allclose(out.rows[1], [np.mean([5, 6, 8, 9]), 5, 90, 0x48])
    assert (np.diff(out.stamps_ms) == 1000).all()


def test_a_column_without_any_finite_reading_in_the_step_is_nan() -> None:
    fold = StepFold(1.0, KINDS)
    fold.ensure(1)
    rows = np.full((10, 4), np.nan)
    rows[:5, :] = 1.0
    out = fold.add(np.zeros(10, dtype=np.int64), T0 + 200 * np.arange(10, dtype=np.int64), rows)
    assert np.isnan(out.rows[-1]).all() and out.ticks[-1] == 5


@pytest.mark.parametrize("hz", [0.5, 1.0, 2.0, 3.0, 5.0, 10.0])
def test_jitter_never_moves_a_tick_to_the_next_step(hz: float) -> None:
    rng = np.random.default_rng(int(hz * 10))
    offsets = rng.integers(0, 1000, 16)  # every phase against the step boundaries
    ids, ts, rows = _ticks(16, int(60 * hz), hz, offsets=offsets)
    out_ids, _, _, ticks = _fold(ids, ts, rows, [])
    per_step = max(1, round(hz))
    first = np.zeros(len(ticks), dtype=bool)
    for g in range(16):
        first[np.flatnonzero(out_ids == g)[0]] = True
    assert (ticks[~first] == per_step).all(), np.unique(ticks[~first], return_counts=True)


def test_stamps_are_shared_across_gpus_and_increase_per_gpu() -> None:
    ids, ts, rows = _ticks(8, 100, 5.0, offsets=np.array([0, 0, 0, 0, 137, 137, 137, 137]))
    out_ids, stamps, _, _ = _fold(ids, ts, rows, [])
    assert (stamps % 1000 == 0).all()
    for g in range(8):
        assert (np.diff(stamps[out_ids == g]) > 0).all()
    # Every stamp holds at most one step per GPU: a stamp group is one batched model call.
    pairs = set(zip(out_ids.tolist(), stamps.tolist(), strict=True))
    assert len(pairs) == len(out_ids)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 800), max_size=6), st.sampled_from([1.0, 2.0, 5.0]))
def test_the_same_steps_however_the_ticks_are_split_into_calls(cuts: list[int], hz: float
                                                               ) -> None:
    ids, ts, rows = _ticks(4, 200, hz, seed=3)
    whole = _fold(ids, ts, rows, [])
    split = _fold(ids, ts, rows, sorted({min(c, len(ids)) for c in cuts}))
    for a, b in zip(whole, split, strict=True):
        np.testing.assert_array_equal(a, b)


def test_state_round_trip_mid_step_continues_identically() -> None:
    ids, ts, rows = _ticks(4, 60, 5.0, seed=5)
    cut = 4 * 23  # inside a step
    whole = StepFold(1.0, KINDS)
    whole.ensure(4)
    ref = whole.add(ids, ts, rows)
    first = StepFold(1.0, KINDS)
    first.ensure(4)
    a = first.add(ids[:cut], ts[:cut], rows[:cut])
    second = StepFold(1.0, KINDS)
    second.load_arrays(first.state_arrays(), 4)
    b = second.add(ids[cut:], ts[cut:], rows[cut:])
    np.testing.assert_array_equal(np.concatenate([a.rows, b.rows]), ref.rows)
    np.testing.assert_array_equal(np.concatenate([a.stamps_ms, b.stamps_ms]), ref.stamps_ms)


def test_late_and_replayed_ticks_are_left_out_and_counted() -> None:
    fold = StepFold(1.0, KINDS)
    fold.ensure(1)
    ts = T0 + 1000 * np.arange(5, dtype=np.int64)
    rows = np.ones((5, 4))
    fold.add(np.zeros(5, dtype=np.int64), ts, rows)
    out = fold.add(np.zeros(2, dtype=np.int64), ts[3:5], rows[:2])  # replayed
    assert len(out) == 0 and fold.late == 2


def test_a_gap_completes_the_open_step_and_the_clock_resumes() -> None:
    fold = StepFold(1.0, KINDS)
    fold.ensure(1)
    ts = np.concatenate([T0 + 200 * np.arange(12), T0 + 60_000 + 200 * np.arange(12)])
    out = fold.add(np.zeros(24, dtype=np.int64), ts.astype(np.int64), np.ones((24, 4)))
    assert out.stamps_ms[-1] - out.stamps_ms[0] >= 60_000
    assert out.ticks[-1] == 5 and out.ticks.sum() + fold.count[0] == 24


def test_bad_input_says_what_is_wrong() -> None:
    fold = StepFold(1.0, KINDS)
    fold.ensure(2)
    with pytest.raises(ValueError, match="rows must be"):
        fold.add(np.zeros(2, dtype=np.int64), np.zeros(2, dtype=np.int64), np.zeros((2, 3)))
    with pytest.raises(ValueError, match="model ids"):
        fold.add(np.array([5]), np.zeros(1, dtype=np.int64), np.zeros((1, 4)))
    with pytest.raises(ValueError, match="step_s"):
        StepFold(0.0, KINDS)

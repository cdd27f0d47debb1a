"""One conformance suite for every forest engine (``detector.engines.ENGINE_NAMES``).

Each test drives real engines on seeded synthetic streams; nothing is mocked. The config
is small (few trees, small sample) so the suite stays fast with krcf's Python loop.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import numpy.typing as npt
import pytest

from detector.engines import ENGINE_NAMES, EngineConfig, ForestEngine, make_engine

DIMS = 4
CONFIG = EngineConfig(dims=DIMS, shingle=2, trees=30, sample_size=64, output_after=16, seed=7)


def stream(steps: int, models: int, seed: int) -> npt.NDArray[np.float32]:
    """(steps, models, DIMS): a daily-like sine per feature plus noise, per model."""
    rng = np.random.default_rng(seed)
    t = np.arange(steps, dtype=np.float64)[:, None, None]
    phase = rng.uniform(0, 2 * np.pi, size=(1, models, DIMS))
    base = 10.0 + 2.0 * np.sin(2 * np.pi * t / 40.0 + phase)
    return (base + rng.normal(0.0, 0.3, size=(steps, models, DIMS))).astype(np.float32)


def run(
    engine: ForestEngine, data: npt.NDArray[np.float32], ids: npt.NDArray[np.int64] | None = None
) -> npt.NDArray[np.float64]:
    """Feed ``data`` step by step (all models per call); return (steps, models) scores."""
    models = data.shape[1]
    if ids is None:
        ids = np.arange(models, dtype=np.int64)
    engine.ensure_models(int(ids.max()) + 1)
    return np.stack([engine.update(ids, data[s]).scores for s in range(len(data))])


@pytest.fixture(params=ENGINE_NAMES)
def engine_name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_same_seed_gives_same_scores_and_other_seed_differs(engine_name: str) -> None:
    data = stream(120, 3, seed=1)
    a = run(make_engine(engine_name, CONFIG), data)
    b = run(make_engine(engine_name, CONFIG), data)
    np.testing.assert_array_equal(a, b)
    other = replace(CONFIG, seed=8)
    c = run(make_engine(engine_name, other), data)
    assert not np.array_equal(a, c)


def test_models_in_one_call_are_independent(engine_name: str) -> None:
    data = stream(100, 3, seed=2)
    together = run(make_engine(engine_name, CONFIG), data)
    alone = run(make_engine(engine_name, CONFIG), data[:, 1:2], ids=np.array([1]))
    np.testing.assert_array_equal(together[:, 1], alone[:, 0])


def test_cold_start_scores_zero_until_output_after(engine_name: str) -> None:
    scores = run(make_engine(engine_name, CONFIG), stream(60, 2, seed=3))
    # A point is complete once the shingle is full; output starts after output_after of them.
    first = CONFIG.effective_output_after + CONFIG.shingle - 1
    assert np.all(scores[:first] == 0.0)
    assert np.all(scores[first:] > 0.0)


def test_score_has_no_side_effects(engine_name: str) -> None:
    data = stream(150, 2, seed=4)
    probe = stream(150, 2, seed=5) + 3.0
    ids = np.arange(2, dtype=np.int64)
    quiet, probed = make_engine(engine_name, CONFIG), make_engine(engine_name, CONFIG)
    quiet.ensure_models(2)
    probed.ensure_models(2)
    for s in range(len(data)):
        first = probed.score(ids, probe[s])
        again = probed.score(ids, probe[s])
        np.testing.assert_array_equal(first.scores, again.scores)
        np.testing.assert_array_equal(
            quiet.update(ids, data[s]).scores, probed.update(ids, data[s]).scores
        )
    assert quiet.checkpoint(0) == probed.checkpoint(0)


def test_checkpoint_restore_round_trips(engine_name: str) -> None:
    data = stream(200, 2, seed=6)
    ids = np.arange(2, dtype=np.int64)
    original = make_engine(engine_name, CONFIG)
    run(original, data[:110])
    restored = make_engine(engine_name, CONFIG)
    restored.ensure_models(2)
    for m in range(2):
        restored.restore(m, original.checkpoint(m))
    for s in range(110, 200):
        a, b = original.update(ids, data[s]), restored.update(ids, data[s])
        np.testing.assert_array_equal(a.scores, b.scores)
        np.testing.assert_array_equal(a.attribution, b.attribution)
    assert restored.checkpoint(1) == original.checkpoint(1)
    assert original.model_bytes(0) > 0


def test_checkpoint_of_many_models_is_each_models_checkpoint(engine_name: str) -> None:
    """The shard checkpoint's one-pass form must be byte for byte the per-model one, with
    models at different ages (cold, filling, full) and ragged arenas."""
    data = stream(150, 5, seed=8)
    engine = make_engine(engine_name, CONFIG)
    engine.ensure_models(6)  # model 5 never sees a point
    for s in range(len(data)):
        live = 5 - (s < 100) * 2 - (s < 30)  # models 3 and 4 start late
        engine.update(np.arange(live, dtype=np.int64), data[s, :live])
    blob, ends = engine.checkpoint_models(6)
    parts = [engine.checkpoint(m) for m in range(6)]
    assert ends.tolist() == np.cumsum([len(p) for p in parts]).tolist()
    assert blob.tobytes() == b"".join(parts)
    assert engine.checkpoint_models(0)[1].size == 0


def test_restore_rejects_bad_bytes(engine_name: str) -> None:
    engine = make_engine(engine_name, CONFIG)
    engine.ensure_models(1)
    good = engine.checkpoint(0)
    for bad in (b"", b"nonsense-bytes", b"XXXX" + good[4:], good[:4] + b"\xff" + good[5:]):
        with pytest.raises(ValueError):
            engine.restore(0, bad)
    other = make_engine(engine_name, replace(CONFIG, dims=DIMS + 1))
    other.ensure_models(1)
    with pytest.raises(ValueError):
        engine.restore(0, other.checkpoint(0))


def test_bad_batches_raise_clear_errors(engine_name: str) -> None:
    engine = make_engine(engine_name, CONFIG)
    engine.ensure_models(2)
    ok = np.zeros((2, DIMS), dtype=np.float32)
    with pytest.raises(ValueError, match="shape"):
        engine.update(np.arange(2), ok[:, :2])
    with pytest.raises(ValueError, match="unique"):
        engine.update(np.array([1, 1]), ok)
    with pytest.raises(ValueError, match="finite"):
        engine.update(np.arange(2), np.full((2, DIMS), np.nan, dtype=np.float32))
    with pytest.raises(KeyError):
        engine.update(np.array([0, 5]), ok)


def spiked_run(
    engine_name: str, sign: float
) -> tuple[ForestEngine, npt.NDArray[np.float64], list[tuple[int, int, int]]]:
    """Stream with one-step spikes on known (step, model, dim); returns per-step batches."""
    models, steps = 4, 400
    data = stream(steps, models, seed=9)
    rng = np.random.default_rng(10)
    spikes = []
    for step in range(150, steps, 25):
        model, dim = int(rng.integers(models)), int(rng.integers(DIMS))
        data[step, model, dim] += sign * 6.0
        spikes.append((step, model, dim))
    engine = make_engine(engine_name, CONFIG)
    engine.ensure_models(models)
    ids = np.arange(models, dtype=np.int64)
    scores = np.zeros((steps, models))
    attribution = np.zeros((steps, models, DIMS))
    direction = np.zeros((steps, models, DIMS), dtype=np.int8)
    for s in range(steps):
        batch = engine.update(ids, data[s])
        scores[s], attribution[s], direction[s] = batch.scores, batch.attribution, batch.direction
    return engine, np.stack([scores, attribution.argmax(-1), _dir(direction, attribution)]), spikes


def _dir(direction: npt.NDArray[np.int8], attribution: npt.NDArray[np.float64]) -> npt.NDArray:
    top = attribution.argmax(-1)
    return np.take_along_axis(direction, top[..., None], axis=-1)[..., 0]


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_spikes_score_above_normal_and_attribution_names_the_dimension(
    engine_name: str, sign: float
) -> None:
    _, (scores, top_dim, top_dir), spikes = spiked_run(engine_name, sign)
    spike_mask = np.zeros(scores.shape, dtype=bool)
    for step, model, _ in spikes:
        spike_mask[step, model] = True
        # The shingle keeps a spike for `shingle` steps; skip those from the normal set.
        spike_mask[step : step + CONFIG.shingle, model] = True
    normal = scores[120:][~spike_mask[120:]]
    spike_scores = np.array([scores[s, m] for s, m, _ in spikes])
    assert spike_scores.min() > np.quantile(normal, 0.99)
    assert np.median(spike_scores) > 1.5 * np.median(normal)
    for step, model, dim in spikes:
        assert top_dim[step, model] == dim
        assert top_dir[step, model] == int(sign)


def test_attribute_above_skips_nothing_it_promises(engine_name: str) -> None:
    data = stream(80, 2, seed=11)
    ids = np.arange(2, dtype=np.int64)
    full, lazy = make_engine(engine_name, CONFIG), make_engine(engine_name, CONFIG)
    full.ensure_models(2)
    lazy.ensure_models(2)
    for s in range(len(data)):
        a = full.update(ids, data[s])
        b = lazy.update(ids, data[s], attribute_above=np.array([np.inf, 0.0]))
        np.testing.assert_array_equal(a.scores, b.scores)
        np.testing.assert_array_equal(a.attribution[1], b.attribution[1])
        np.testing.assert_array_equal(a.direction[1], b.direction[1])
        if a.scores[0] > 0:
            assert np.all(a.attribution[0] >= 0) and a.attribution[0].sum() > 0


def test_unknown_engine_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown forest engine"):
        make_engine("nope", CONFIG)


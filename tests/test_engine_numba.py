"""Internals of the numba RCF engine that the conformance suite cannot see: cached boxes
stay exact, the point store shares shingles and compacts, duplicates and weight
renormalisation keep the model consistent, and memory stays within the budget."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from detector.engines import EngineConfig, ForestEngine, make_engine
from detector.engines.numba_engine import NumbaEngine
from detector.engines.rcf import kernels


def wavy(steps: int, models: int, dims: int, seed: int) -> npt.NDArray[np.float32]:
    rng = np.random.default_rng(seed)
    t = np.arange(steps)[:, None, None]
    phase = rng.uniform(0, 6, size=(1, models, dims))
    noise = rng.normal(0, 0.2, size=(steps, models, dims))
    return (np.sin(2 * np.pi * t / 50 + phase) + noise).astype(np.float32)


def feed(engine: ForestEngine, data: npt.NDArray[np.float32]) -> npt.NDArray[np.float64]:
    ids = np.arange(data.shape[1], dtype=np.int64)
    engine.ensure_models(data.shape[1])
    return np.stack([engine.update(ids, data[s]).scores for s in range(len(data))])


def tree_invariants(engine: NumbaEngine, m: int, held: bool = False) -> bool:
    """Every tree holds exactly its group's distinct sampled points (distinct point ids
    are distinct points), and every sampled point id is live with the right reference
    count. Before ``output_after`` a model only samples: all its trees are empty until it
    first scores (or, ``held``, until it is admitted). Returns whether they are built."""
    st = engine._state
    groups = st.spid.shape[1]
    per_group = st.root.shape[1] // groups
    dim = st.layout.dim
    built = bool(np.any(st.root[m] != -1))
    if not (built or held):
        assert st.meta[m, kernels.META_SEQ] <= engine.config.effective_output_after
    refs = np.zeros(st.offset.shape[1], dtype=np.int64)
    for g in range(groups):
        size = int(st.ssize[m, g])
        slots = st.spid[m, g, :size].astype(np.int64)
        assert np.all(slots >= 0)
        np.add.at(refs, slots, 1)
        distinct = len(np.unique(slots))
        points = {st.arena[m, off : off + dim].tobytes()
                  for off in st.offset[m, np.unique(slots)].astype(np.int64)}
        assert len(points) == distinct
        if not built:
            continue
        for t in range(g * per_group, (g + 1) * per_group):
            leaves, stack = [], [int(st.root[m, t])]
            while stack:
                n = stack.pop()
                if n >= 0:
                    stack += [int(st.left[m, t, n]), int(st.right[m, t, n])]
                elif n <= -2:
                    leaves.append(-n - 2)
            assert len(leaves) == distinct
            assert {int(st.spid[m, g, s]) for s in leaves} == set(slots.tolist())
    np.testing.assert_array_equal(refs, st.refcnt[m])
    return built


def subtree_slots(engine: NumbaEngine, m: int, t: int, node: int) -> list[int]:
    """Sampler slots of the leaves under ``node`` of tree t."""
    st = engine._state
    slots, stack = [], [node]
    while stack:
        n = stack.pop()
        if n >= 0:
            stack += [int(st.left[m, t, n]), int(st.right[m, t, n])]
        else:
            slots.append(-n - 2)
    return slots


def cache_invariants(engine: NumbaEngine, m: int) -> int:
    """Every cached box is exactly its node's box (the slot indices name leaves under it
    that attain each minimum and maximum) and its mass is its leaf count; returns the
    entries in use."""
    st = engine._state
    per_group = st.root.shape[1] // st.spid.shape[1]
    dim = st.layout.dim
    live = st.spid[m] >= 0
    np.testing.assert_array_equal(st.soff[m][live], st.offset[m, st.spid[m][live]])
    used = 0
    for t in range(st.root.shape[1]):
        spid = st.spid[m, t // per_group]
        points = np.stack([st.arena[m, off : off + dim]
                           for off in st.offset[m, np.maximum(spid, 0)].astype(np.int64)])
        entries = {}
        for n in range(st.cslot.shape[2]):
            if st.cslot[m, t, n] != kernels.NO_ENTRY:
                entries[int(st.cslot[m, t, n])] = n
        assert len(entries) == int(np.count_nonzero(st.cmass[m, t]))
        for c, n in entries.items():
            slots = subtree_slots(engine, m, t, n)
            assert int(st.root[m, t]) == n or n in st.left[m, t] or n in st.right[m, t]
            assert int(st.cmass[m, t, c]) == len(slots)
            box = st.cbox[m, t, c].astype(np.int64)
            assert set(box.ravel().tolist()) <= set(slots)
            pts = points[slots]
            np.testing.assert_array_equal(points[box[0], np.arange(dim)], pts.min(axis=0))
            np.testing.assert_array_equal(points[box[1], np.arange(dim)], pts.max(axis=0))
        used += len(entries)
    return used


@pytest.mark.parametrize("entries", [0, 1, 4, 30])
def test_cached_boxes_stay_exact(entries: int) -> None:
    cfg = EngineConfig(dims=3, shingle=3, trees=10, sample_size=32, seed=1)
    engine = NumbaEngine(cfg, cache_entries=entries)
    uncached = NumbaEngine(cfg, cache_entries=0)
    data = wavy(600, 3, 3, seed=1)
    data[::37, :, 1] += 4.0  # outliers get inserted near the root: cached subtrees reshape
    data[300:320, 1] = 1.0  # duplicates: leaves re-pointed to other sampler slots
    # The cache changes speed only: scores equal those of an engine without one.
    np.testing.assert_array_equal(feed(engine, data), feed(uncached, data))
    st = engine._state
    assert st.cbox.shape[2] == entries
    for m in range(3):
        tree_invariants(engine, m)
        used = cache_invariants(engine, m)
        assert (used > 0) == (entries > 0)
        kernels.rebuild_boxes(m, st.root, st.left, st.right, st.cslot, st.cbox, st.cmass,
                              st.spid, st.offset, st.soff, st.arena)
        assert cache_invariants(engine, m) >= min(used, 1)


@pytest.mark.parametrize("screen", [0, 1])
def test_trees_and_caches_stay_exact_after_every_update(screen: int) -> None:
    # A new point goes into the trees before the one it evicts comes out, at cuts drawn
    # while scoring; in between two leaves share a slot. Check every step, not only the
    # end: outliers reshape cached subtrees, repeated values make duplicates re-enter
    # their own slots and evict points other slots still hold. Screened, a threshold near
    # the usual score splits the walk both ways: the rest of an accepting group's trees
    # get their cuts in a second walk.
    cfg = EngineConfig(dims=3, shingle=2, trees=6, sample_size=16, seed=9, output_after=4,
                       screen_trees=screen)
    engine = NumbaEngine(cfg, cache_entries=4)
    data = wavy(500, 2, 3, seed=9)
    data[::23, :, 0] += 5.0
    data[200:260:2, 0] = 0.5
    engine.ensure_models(2)
    ids = np.arange(2, dtype=np.int64)
    for step in range(len(data)):
        engine.update(ids, data[step], attribute_above=2.0)
        for m in range(2):
            # Built at the first point scored (seq == output_after), not before.
            built = tree_invariants(engine, m)
            assert built == (engine._state.meta[m, kernels.META_SEQ] > cfg.output_after)
            cache_invariants(engine, m)


def test_point_store_shares_shingles_and_compacts() -> None:
    # One reservoir per tree: many distinct points, so the arena grows and compacts.
    cfg = EngineConfig(dims=2, shingle=4, trees=8, sample_size=16, seed=2, sample_groups=8)
    engine = NumbaEngine(cfg)
    scores = feed(engine, wavy(1500, 2, 2, seed=2))
    assert np.all(np.isfinite(scores))
    st = engine._state
    dim = cfg.dims * cfg.shingle
    for m in range(2):
        tree_invariants(engine, m)
        live = int(st.meta[m, kernels.META_NPOINTS])
        assert live == int(np.count_nonzero(st.refcnt[m]))
        # Checkpointing compacts: overlapping shingles store fewer floats than points * D.
        engine.checkpoint(m)
        assert int(st.meta[m, kernels.META_ARENA_END]) < live * dim
        cache_invariants(engine, m)  # slot offsets follow the points as they move
    assert st.arena_cap > 2 * (cfg.sample_size + 2) * dim  # grew past its first size
    assert engine.model_bytes(0) >= st.arena_cap * 4


def test_constant_signal_keeps_duplicates_in_one_leaf() -> None:
    cfg = EngineConfig(dims=4, shingle=2, trees=6, sample_size=16, seed=3)
    engine = NumbaEngine(cfg)
    data = np.ones((300, 1, 4), dtype=np.float32)
    data[150:, 0, 2] = 2.0  # a level shift: the new constant becomes the norm
    scores = feed(engine, data)
    tree_invariants(engine, 0)
    steady = scores[100:150, 0]
    assert np.all(steady > 0) and np.ptp(steady) < 1e-9
    assert scores[150, 0] > 2 * steady[-1]
    restored = NumbaEngine(cfg)
    restored.ensure_models(1)
    restored.restore(0, engine.checkpoint(0))
    point = np.full((1, 4), 1.0, dtype=np.float32)
    point[0, 2] = 2.0
    np.testing.assert_array_equal(engine.score(np.array([0]), point).scores,
                                  restored.score(np.array([0]), point).scores)


def test_sampler_weights_renormalise_without_changing_order() -> None:
    # A fast decay crosses the renormalisation threshold (64) after 640 points.
    cfg = EngineConfig(dims=2, shingle=2, trees=4, sample_size=16, time_decay=0.1, seed=4)
    engine = NumbaEngine(cfg)
    feed(engine, wavy(1500, 1, 2, seed=4))
    st = engine._state
    assert st.meta[0, kernels.META_WBASE] > 0
    weights = st.weight[0, 0, : st.ssize[0, 0]]
    assert np.all(np.isfinite(weights)) and np.abs(weights).max() < 100
    tree_invariants(engine, 0)


def test_memory_and_checkpoint_fit_the_budget_at_issue_parameters() -> None:
    cfg = EngineConfig(dims=8, shingle=4, trees=50, sample_size=256, seed=5)
    engine = make_engine("numba", cfg)
    feed(engine, wavy(400, 2, 8, seed=5))
    assert engine.model_bytes(0) <= 256 * 1024
    assert len(engine.checkpoint(0)) <= 256 * 1024


def test_invalid_sample_groups_are_rejected() -> None:
    with pytest.raises(ValueError, match="sample_groups"):
        NumbaEngine(EngineConfig(dims=2, trees=10, sample_groups=3))
    with pytest.raises(ValueError, match="reservoir per tree"):
        make_engine("krcf", EngineConfig(dims=2, trees=10, sample_groups=2))


def test_damaged_checkpoints_are_refused_not_run() -> None:
    cfg = EngineConfig(dims=3, shingle=2, trees=4, sample_size=16, seed=6)
    engine = NumbaEngine(cfg)
    feed(engine, wavy(200, 1, 3, seed=6))
    good = bytearray(engine.checkpoint(0))
    flipped = bytearray(good)
    flipped[len(good) // 2] ^= 0x40
    with pytest.raises(ValueError, match="CRC"):
        engine.restore(0, bytes(flipped))
    with pytest.raises(ValueError, match=r"truncated|arena bytes|CRC"):
        engine.restore(0, bytes(good[:-7]))
    engine.restore(0, bytes(good))  # the intact bytes still load


def test_version_1_checkpoint_loads_and_scores_as_it_did() -> None:
    # Written by the engine before insertion shared the scoring walk (one internal node
    # fewer per tree): an upgraded detector keeps its models instead of starting cold.
    golden = json.loads((Path(__file__).parent / "golden" / "forest"
                         / "numba_checkpoint_v1.json").read_text())
    engine = NumbaEngine(EngineConfig(**golden["config"]))
    engine.ensure_models(1)
    data = base64.b64decode(golden["checkpoint_base64"])
    assert data[4] == 1
    engine.restore(0, data)
    probes = np.array(golden["probes"], dtype=np.float32)
    scores = [engine.score(np.array([0]), probes[i : i + 1]).scores[0] for i in range(len(probes))]
    np.testing.assert_allclose(scores, golden["scores"], rtol=1e-12)
    tree_invariants(engine, 0)
    cache_invariants(engine, 0)
    # It learns on, and its next checkpoint is the current version.
    feed(engine, wavy(200, 1, 3, seed=21))
    tree_invariants(engine, 0)
    cache_invariants(engine, 0)
    assert engine.checkpoint(0)[4] == 2


def test_screening_skips_trees_only_for_points_plainly_below_their_threshold() -> None:
    cfg = EngineConfig(dims=3, shingle=2, trees=20, sample_size=32, seed=4)
    full = NumbaEngine(cfg)
    feed(full, wavy(800, 32, 3, seed=4))
    screened = NumbaEngine(EngineConfig(dims=3, shingle=2, trees=20, sample_size=32, seed=4,
                                        screen_trees=2, screen_below=0.5))
    screened._state = full._state  # the same trees; score() changes nothing
    probe = wavy(200, 32, 3, seed=5)
    probe[::10, :, 2] += 6.0  # an outlier every tenth step
    ids = np.arange(32, dtype=np.int64)

    def scores(engine: ForestEngine, limit: float) -> npt.NDArray[np.float64]:
        return np.stack([engine.score(ids, probe[s], attribute_above=limit).scores
                         for s in range(len(probe))])

    whole = scores(full, 0.0)
    # Without a threshold every tree is walked (in two walks: the sums round apart).
    np.testing.assert_allclose(scores(screened, 0.0), whole, rtol=1e-12)
    # Far below a threshold, two trees of each group stand for the forest: other values,
    # the same mean over many models (an unbiased estimate).
    cheap = scores(screened, 1e9)
    assert not np.allclose(cheap, whole)
    assert abs(cheap.mean() - whole.mean()) < 0.02 * whole.mean()
    # At a threshold the outliers pass, they get the whole forest's score; a score that
    # differs from it is below half the threshold.
    limit = float(np.quantile(whole[::10], 0.05))
    assert limit > 2 * np.median(whole)
    got = scores(screened, limit)
    np.testing.assert_allclose(got[::10], whole[::10], rtol=1e-12)
    differs = ~np.isclose(got, whole, rtol=1e-12, atol=0.0)
    assert differs.any()
    assert (got[differs] < 0.5 * limit).all()


def test_trees_built_at_output_after_score_as_trees_grown_point_by_point() -> None:
    # A young model only samples and builds its trees top-down when it first scores; a
    # random cut tree built so is distributed as one grown by insertion. With the same 64
    # points in every sampler (all taken while filling), the mean score of each probe
    # over 40 forests of 50 trees agrees within sampling error. The dimensions' ranges
    # differ a hundredfold, so a cut that ignored them would move the scores by far more.
    rng = np.random.default_rng(3)
    models = 40
    points = (rng.normal(size=(64, 3)) * np.array([1.0, 10.0, 0.1])).astype(np.float32)
    probes = np.array([[0, 0, 0], [3, 0, 0], [0, 30, 0], [0, 0, 0.3], [1, 5, 0.05],
                       [-2, -20, -0.2]], dtype=np.float32)
    ids = np.arange(models, dtype=np.int64)
    scores = {}
    for output_after in (64, 1):  # built at point 64 / grown point by point from point 1
        engine = NumbaEngine(EngineConfig(dims=3, shingle=1, trees=50, sample_size=1024,
                                          seed=7, output_after=output_after))
        engine.ensure_models(models)
        for p in points:
            engine.update(ids, np.repeat(p[None], models, axis=0))
        assert np.all(engine._state.ssize[:models] == 64)
        scores[output_after] = np.stack([
            engine.score(ids, np.repeat(p[None], models, axis=0)).scores for p in probes])
        for m in range(models):
            assert tree_invariants(engine, m)
            cache_invariants(engine, m)
    built, grown = scores[64], scores[1]
    z = (built.mean(axis=1) - grown.mean(axis=1)) / np.sqrt(
        (built.var(axis=1) + grown.var(axis=1)) / models)
    assert np.all(np.abs(z) < 4), z


def test_a_model_checkpointed_before_its_trees_are_built_goes_on_as_it_would_have() -> None:
    # Saved while it only samples (empty trees, full reservoirs): restored, it builds the
    # same trees at the same point and scores exactly as the model that was never saved.
    cfg = EngineConfig(dims=3, shingle=2, trees=6, sample_size=64, seed=2)
    data = wavy(120, 2, 3, seed=2)
    original = NumbaEngine(cfg)
    feed(original, data[:12])
    assert not tree_invariants(original, 1)
    restored = NumbaEngine(cfg)
    restored.ensure_models(2)
    restored.restore(1, original.checkpoint(1))
    ids = np.array([1], dtype=np.int64)
    after = [(original.update(ids, data[s, 1:]).scores[0], restored.update(ids, data[s, 1:]).scores[0])
             for s in range(12, 120)]
    assert tree_invariants(restored, 1)
    np.testing.assert_array_equal(*zip(*after, strict=True))
    assert max(a for a, _ in after) > 0  # it scored after output_after (16)


def test_a_model_not_admitted_stays_in_its_cold_start_sampling_until_it_is() -> None:
    # admit_at_most=0 past output_after: no trees, no score, but the samplers go on taking
    # points; the first admitted call builds the trees from what they hold and scores.
    cfg = EngineConfig(dims=3, shingle=2, trees=6, sample_size=64, seed=3)  # output_after 16
    engine = NumbaEngine(cfg)
    engine.ensure_models(1)
    ids = np.zeros(1, dtype=np.int64)
    data = wavy(80, 1, 3, seed=3)
    held = [engine.update(ids, data[s], admit_at_most=0).scores[0] for s in range(60)]
    assert held == [0.0] * 60
    assert not tree_invariants(engine, 0, held=True)
    st = engine._state
    assert st.meta[0, kernels.META_SEQ] == 59 and st.ssize[0].min() > 16
    assert engine.held(1) == 1
    admitted = [engine.update(ids, data[s]).scores[0] for s in range(60, 80)]
    assert min(admitted) > 0.0 and engine.held(1) == 0
    assert tree_invariants(engine, 0)
    cache_invariants(engine, 0)


def test_at_most_the_allowed_number_of_models_leave_their_cold_start_in_a_call() -> None:
    """Five models due in the same call and room for two: two build their trees and score,
    the other three sample on, held, and the next call with room takes them."""
    cfg = EngineConfig(dims=3, shingle=2, trees=6, sample_size=64, seed=3)  # output_after 16
    engine = NumbaEngine(cfg)
    engine.ensure_models(5)
    ids = np.arange(5, dtype=np.int64)
    data = wavy(40, 5, 3, seed=4)
    for s in range(17):  # 16 shingled points each: the cold start ends with the next one
        assert engine.update(ids, data[s], admit_at_most=0).admitted == 0
    first = engine.update(ids, data[17], admit_at_most=2)
    assert first.admitted == 2 and np.count_nonzero(first.scores) == 2
    assert engine.held(5) == 3
    second = engine.update(ids, data[18], admit_at_most=0)
    assert second.admitted == 0 and np.count_nonzero(second.scores) == 2
    third = engine.update(ids, data[19])  # no limit
    assert third.admitted == 3 and np.count_nonzero(third.scores) == 5
    assert engine.held(5) == 0
    for m in range(5):
        assert tree_invariants(engine, m)

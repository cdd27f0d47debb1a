"""Feature extraction: column mapping, units, counters, peers, the temperature residual."""

from __future__ import annotations

import numpy as np
from test_detector_support import healthy

from detector.features import (
    COL,
    FEATURES,
    GATHERED,
    FeatureState,
    evidence_rate,
    gather,
    group_median,
    group_quantile,
)
from schemas.catalog import BY_NAME

F = {f.name: i for i, f in enumerate(FEATURES)}


def test_gather_maps_catalog_ids_and_marks_missing_metrics_nan() -> None:
    ids = np.array([BY_NAME["fleetpulse_gpu_power_usage_watts"].id,
                    BY_NAME["fleetpulse_gpu_energy_consumption_joules_total"].id,
                    BY_NAME["fleetpulse_gpu_temperature_celsius"].id], dtype=np.uint16)
    values = np.arange(2 * 3 * 3, dtype=np.float64).reshape(2, 3, 3)
    out = gather(values, ids)
    assert out.shape == (2, 3, len(GATHERED))
    np.testing.assert_array_equal(out[:, :, COL["power_usage_watts"]], values[:, :, 0])
    np.testing.assert_array_equal(out[:, :, COL["temperature_celsius"]], values[:, :, 2])
    assert np.isnan(out[:, :, COL["utilization_ratio"]]).all()


def test_units_of_plain_features() -> None:
    st = FeatureState()
    st.ensure(2)
    row = np.full((2, len(GATHERED)), np.nan)
    row[:, COL["temperature_celsius"]] = [55.0, 80.0]
    row[:, COL["power_usage_watts"]] = [350.0, 700.0]
    row[:, COL["power_limit_watts"]] = 700.0
    row[:, COL["utilization_ratio"]] = [0.5, 1.0]
    feats, _ = st.step(np.array([0, 1]), row, np.array([0, 0]), 1000)
    np.testing.assert_allclose(feats[:, F["temperature"]], [2.5, 5.0])
    np.testing.assert_allclose(feats[:, F["power"]], [1.25, 2.5])
    np.testing.assert_allclose(feats[:, F["utilization"]], [1.25, 2.5])
    # Metrics not sampled give 0, never NaN (the forest needs finite points).
    assert np.isfinite(feats).all()
    assert (feats[:, F["memory_temperature"]] == 0).all()


def test_counter_increase_resets_and_first_sight() -> None:
    st = FeatureState()
    st.ensure(1)
    row = np.full((1, len(GATHERED)), np.nan)
    incs = []
    for k, value in enumerate((100.0, 100.0, 140.0, 3.0, 4.0)):  # first, flat, +40, reset, +1
        row[0, COL["ecc_sbe_volatile_total"]] = value
        _, inc = st.step(np.array([0]), row, np.array([0]), 1000 * k)
        incs.append(inc[0, 0])
    assert incs == [0.0, 0.0, 40.0, 0.0, 1.0]


def test_a_storm_scores_far_above_a_lone_corrected_error() -> None:
    st = FeatureState()
    st.ensure(2)
    row = np.zeros((2, len(GATHERED)))
    st.step(np.array([0, 1]), row, np.array([0, 0]), 1000)
    row[:, COL["ecc_sbe_volatile_total"]] = [1.0, 40.0]
    feats, _ = st.step(np.array([0, 1]), row, np.array([0, 0]), 1000)
    lone, storm = feats[:, F["ecc_sbe_increase"]]
    assert lone < 0.5 < 3.0 < storm


def test_peer_features_single_out_the_straggler() -> None:
    st = FeatureState()
    st.ensure(8)
    row = np.zeros((8, len(GATHERED)))
    row[:, COL["utilization_ratio"]] = 0.5
    row[3, COL["utilization_ratio"]] = 1.0
    feats, _ = st.step(np.arange(8), row, np.zeros(8, dtype=np.int64), 1000)
    assert feats[3, F["util_vs_node"]] == 10.0
    assert np.all(np.delete(feats[:, F["util_vs_node"]], 3) == 0.0)


def test_evidence_counts_as_the_square_of_how_far_past_its_bar_a_condition_stands() -> None:
    # Below or at the bar (and an unknown distance) one second is one second; 1.5 bars count
    # 2.25 s (a sequential test's evidence grows with the shift squared); from two bars on,
    # four (no rule waits under a quarter of its hold).
    far = np.array([4.0, 8.0, -12.0, 16.0, 40.0, np.nan, np.inf])
    np.testing.assert_allclose(evidence_rate(far, 8.0), [1.0, 1.0, 2.25, 4.0, 4.0, 1.0, 4.0])
    # In proportion, for a figure that is no measurement in noise (a model's predicted swing).
    np.testing.assert_allclose(evidence_rate(far, 8.0, 1.0), [1.0, 1.0, 1.5, 2.0, 4.0, 1.0, 4.0])


def test_group_median_handles_runs_and_nan() -> None:
    v = np.array([1.0, 3.0, np.nan, 10.0, 20.0, 30.0, np.nan])
    g = np.array([0, 0, 0, 1, 1, 1, 2])
    out = group_median(v, g)
    np.testing.assert_array_equal(out[:6], [2, 2, 2, 20, 20, 20])
    assert np.isnan(out[6])
    # The lower quartile, linear between order statistics as numpy's.
    q = group_quantile(v, g, 0.25)
    np.testing.assert_allclose(q[:6], [1.5, 1.5, 1.5, 15.0, 15.0, 15.0])
    assert np.isnan(q[6])


def test_temperature_residual_flags_a_stuck_sensor_but_not_normal_swings() -> None:
    data = healthy(1500, 2, seed=3)
    st = FeatureState()
    st.ensure(2)
    stuck_from = 1200
    data[stuck_from:, 1, COL["temperature_celsius"]] = data[stuck_from, 1,
                                                            COL["temperature_celsius"]]
    resid = np.array([st.step(np.arange(2), data[s], np.array([0, 0]), 1000 * s)[0][:, F["temp_residual"]]
                      for s in range(1500)])
    normal = np.abs(resid[900:, 0]).max()
    stuck = np.abs(resid[stuck_from:, 1]).max()
    assert normal < 2.0, normal
    assert stuck > 2 * normal, (stuck, normal)

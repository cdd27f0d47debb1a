"""The detector's scoring path end to end on one shard: model alerts, attribution, context,
rack alerts, and checkpoints that restore to identical behaviour."""

from __future__ import annotations

import contextlib
import dataclasses
import io

import numpy as np
import pytest
from test_detector_support import healthy, small_config, timestamps

from detector.checkpoint import CheckpointError, restore_shard, shard_bytes
from detector.config import AlertConfig, DetectorConfig, ModelConfig
from detector.features import COL
from detector.rules import RuleBook
from detector.shard import DetectorShard, StepTrace
from detector.thermal_model import TAUS_S, ThermalModels
from schemas.records import AlertRecord, AlertState, Severity

RACK = "c1/row-a/rack-1"


def _shard(gpus: int = 8, config: object = None) -> tuple[DetectorShard, np.ndarray, np.ndarray]:
    shard = DetectorShard(config or small_config())  # type: ignore[arg-type]
    paths = [f"{RACK}/node-{g // 4}/gpu-{g % 4}" for g in range(gpus)]
    ids, nodes = shard.register(paths, [RACK] * gpus, [p.rsplit("/", 1)[0] for p in paths])
    return shard, ids, nodes


def test_hot_gpu_raises_one_model_alert_naming_temperature_high() -> None:
    shard, ids, nodes = _shard()
    data = healthy(700, 8, seed=4)
    data[450:, 3, COL["temperature_celsius"]] += 20.0
    data[450:, 3, COL["memory_temperature_celsius"]] += 20.0
    alerts = shard.process(ids, nodes, timestamps(700), data)
    # Every record survives the wire format (plain JSON types only).
    assert all(AlertRecord.from_bytes(a.to_bytes()) == a for a in alerts)
    model = [a for a in alerts if a.source.startswith("model:") and a.level == "gpu"]
    assert [a.entity for a in model if a.state is AlertState.FIRING] == [f"{RACK}/node-0/gpu-3"]
    fire = model[0]
    assert 450_000 <= fire.started_ms - timestamps(1)[0] <= 470_000
    assert fire.score > fire.threshold > 0
    top = {a.metric for a in fire.attribution[:2]}
    assert top & {"fleetpulse_gpu_temperature_celsius",
                  "fleetpulse_gpu_memory_temperature_celsius",
                  "fleetpulse_gpu_temperature_celsius:residual_vs_power"}, fire.attribution
    assert all(a.direction == "high" for a in fire.attribution
               if a.metric.startswith("fleetpulse_gpu_temperature"))
    assert fire.context["utilization_state"] in {"busy", "idle"}
    assert "temperature_celsius" in fire.context["values"]
    assert fire.severity is Severity.INFO  # a forest's alert is a signal unless set to page


def test_forest_alerts_page_when_configured_to() -> None:
    alerts_cfg = AlertConfig(open_after=3, resolve_after=20, cooldown_s=120.0,
                             model_severity="warning")
    shard, ids, nodes = _shard(config=small_config(alerts=alerts_cfg))
    data = healthy(700, 8, seed=4)
    data[450:, 3, COL["temperature_celsius"]] += 20.0
    data[450:, 3, COL["memory_temperature_celsius"]] += 20.0
    alerts = shard.process(ids, nodes, timestamps(700), data)
    fired = [a for a in alerts if a.source.startswith("model:") and a.level == "gpu"
             and a.state is AlertState.FIRING]
    assert fired and {a.severity for a in fired} <= {Severity.WARNING, Severity.CRITICAL}


def test_gpus_registered_while_growing_once_get_their_state_on_leaving() -> None:
    """Registering node by node inside ``growing_once`` grows every component once, and the
    GPUs then run exactly as if each node had grown them (same scores, same alerts)."""
    paths = [f"{RACK}/node-{g // 4}/gpu-{g % 4}" for g in range(8)]
    data = healthy(120, 8, seed=6)
    runs = []
    for deferred in (False, True):
        shard = DetectorShard(small_config())
        grown = []
        with shard.growing_once() if deferred else contextlib.nullcontext():
            for n in range(2):
                part = paths[4 * n:4 * n + 4]
                shard.register(part, [RACK] * 4, [p.rsplit("/", 1)[0] for p in part])
                grown.append(len(shard.node_of))
        assert grown == ([0, 0] if deferred else [4, 8]) and len(shard.node_of) == 8
        ids, nodes = shard.register(paths, [RACK] * 8, [p.rsplit("/", 1)[0] for p in paths])
        trace = StepTrace()
        alerts = shard.process(ids, nodes, timestamps(120), data, trace=trace)
        runs.append((np.stack(trace.scores), [a.to_bytes() for a in alerts]))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


def test_no_alert_during_cold_start_even_for_wild_data() -> None:
    shard, ids, nodes = _shard(4)
    data = healthy(150, 4, seed=5)
    data[60:, 1, COL["temperature_celsius"]] += 40.0
    alerts = shard.process(ids, nodes, timestamps(150), data)
    assert not [a for a in alerts if a.source.startswith("model:")]


def test_forests_count_as_warming_until_their_threshold_has_seen_warmup_scores() -> None:
    shard, ids, nodes = _shard(4)
    assert shard.models_warming() == 4  # registered, nothing seen
    data = healthy(240, 4, seed=2)
    shard.process(ids, nodes, timestamps(120), data[:120])
    assert shard.models_warming() == 4  # ~100 scored steps of the 150 warm-up
    shard.process(ids, nodes, timestamps(120, start=120), data[120:])
    assert shard.models_warming() == 0
    off, _, _ = _shard(4, small_config(model=ModelConfig(enabled=False)))
    assert off.models_warming() == 0  # no forest, nothing to warm


def test_rack_model_sees_a_cooling_wave() -> None:
    shard, ids, nodes = _shard(8)
    data = healthy(1100, 8, seed=6)
    ramp = np.clip((np.arange(1100) - 800) / 60.0, 0, 1) * 12.0
    data[:, :, COL["temperature_celsius"]] += ramp[:, None]
    data[:, :, COL["memory_temperature_celsius"]] += ramp[:, None]
    alerts = shard.process(ids, nodes, timestamps(1100), data)
    assert all(AlertRecord.from_bytes(a.to_bytes()) == a for a in alerts)
    rack = [a for a in alerts if a.level == "rack" and a.state is AlertState.FIRING]
    # The rack forest sees it, on the rack. The rack heat rule does not yet: 800 s into the
    # run its thermal models have not learned this fleet's powers (the load flips every
    # 40 s), and it counts only GPUs they judge (test_rack_heat_young_models); with learned
    # models it fires (test_rack_heat_rule_fires_when_every_gpu_runs_hotter_than_its_model).
    assert {a.entity for a in rack} == {RACK}
    assert {a.source for a in rack} == {"model:numba:rack"}
    assert rack[0].started_ms - timestamps(1)[0] >= 800_000
    early = [a for a in alerts if a.started_ms - timestamps(1)[0] < 800_000
             and a.state is AlertState.FIRING]
    assert not early


def test_checkpoint_restore_continues_exactly() -> None:
    data = healthy(520, 4, seed=7)
    data[400:, 2, COL["temperature_celsius"]] += 20.0  # a model alert to be re-created
    ts = timestamps(520)
    whole, ids, nodes = _shard(4)
    trace_whole = StepTrace()
    alerts_whole = whole.process(ids, nodes, ts, data, trace_whole)

    first, ids, nodes = _shard(4)
    alerts = first.process(ids, nodes, ts[:300], data[:300])
    blob = shard_bytes(first, {"samples": 123})
    second = DetectorShard(small_config())
    assert restore_shard(second, blob) == {"samples": 123}
    ids2, nodes2 = second.register([f"{RACK}/node-0/gpu-{g}" for g in range(4)],
                                   [RACK] * 4, [f"{RACK}/node-0"] * 4)
    assert ids2.tolist() == ids.tolist()
    trace = StepTrace()
    alerts += second.process(ids2, nodes2, ts[300:], data[300:], trace)
    assert alerts == alerts_whole
    np.testing.assert_array_equal(np.array(trace.scores), np.array(trace_whole.scores[300:]))
    assert any(a.source.startswith("model:") for a in alerts)


def test_a_checkpoint_from_before_the_rack_heat_mean_loads() -> None:
    """Checkpoints written before the rack windows kept the judged residual have no
    ``rack_windows.heat_*`` arrays: the detector restores and goes on, the open windows
    counting nothing judged."""
    shard, ids, nodes = _shard(4)
    shard.process(ids, nodes, timestamps(40), healthy(40, 4))
    with np.load(io.BytesIO(shard_bytes(shard, {"samples": 1}))) as z:
        arrays = {k: z[k] for k in z.files if not k.startswith("rack_windows.heat_")}
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    again = DetectorShard(small_config())
    assert restore_shard(again, buf.getvalue()) == {"samples": 1}
    assert again.rack_windows.heat_counts.shape == shard.rack_windows.win.shape
    assert not again.rack_windows.heat_counts.any()
    ids2, nodes2 = again.register([f"{RACK}/node-0/gpu-{g}" for g in range(4)],
                                  [RACK] * 4, [f"{RACK}/node-0"] * 4)
    again.process(ids2, nodes2, timestamps(80)[40:], healthy(80, 4)[40:])
    assert again.rack_windows.counts.sum() > 0


def test_corrupt_or_foreign_checkpoint_is_refused() -> None:
    shard, ids, nodes = _shard(2)
    shard.process(ids, nodes, timestamps(20), healthy(20, 2))
    blob = shard_bytes(shard, {"samples": 1})
    try:
        restore_shard(DetectorShard(small_config()), blob[: len(blob) // 2])
    except CheckpointError as exc:
        assert "corrupt" in str(exc)
    else:
        raise AssertionError("a torn checkpoint was accepted")


def test_a_change_the_whole_node_shares_is_a_job_not_a_fault() -> None:
    def new_regime(data: np.ndarray, gpus: slice) -> None:
        # A workload never seen before: half load, clocks pinned low, and hot.
        data[450:, gpus, COL["utilization_ratio"]] = 0.5
        data[450:, gpus, COL["sm_clock_hertz"]] = 0.9e9
        data[450:, gpus, COL["power_usage_watts"]] = 330.0
        data[450:, gpus, COL["temperature_celsius"]] += 15.0

    # Alerts open on the first anomalous step: the forests flag such a change for a minute
    # or two before they learn it, scattered (13-31 of the first 120 steps over seeds 0-9,
    # with the forest of any commit), so whether three in a row remain on one GPU is a
    # coin toss; one step is not, and no GPU alert with one step is the stronger claim.
    config = small_config(alerts=AlertConfig(open_after=1, resolve_after=20, cooldown_s=120.0))
    together, ids, nodes = _shard(8, config)
    data = healthy(650, 8, seed=9)
    new_regime(data, slice(0, 4))  # every GPU of node-0
    alerts = together.process(ids, nodes, timestamps(650), data)
    assert not [a for a in alerts if a.source.startswith("model:") and a.level == "gpu"]

    alone, ids, nodes = _shard(8, config)
    data = healthy(650, 8, seed=9)
    new_regime(data, slice(2, 3))  # only node-0/gpu-2
    alerts = alone.process(ids, nodes, timestamps(650), data)
    fired = {a.entity for a in alerts if a.source.startswith("model:") and a.level == "gpu"}
    assert fired == {f"{RACK}/node-0/gpu-2"}


def test_rack_heat_rule_fires_when_every_gpu_runs_hotter_than_its_model() -> None:
    shard, ids, nodes = _shard(8)
    data = healthy(2400, 8, seed=9)
    # The rack's inlet warms by 8 degC over five minutes from step 1800: every GPU warms
    # alike, so no GPU stands apart from its peers, but all are hotter than their models.
    ramp = np.clip((np.arange(2400) - 1800) / 300.0, 0, 1) * 8.0
    data[:, :, COL["temperature_celsius"]] += np.round(ramp)[:, None]
    alerts = shard.process(ids, nodes, timestamps(2400), data)
    heat = [a for a in alerts if a.source == "rule:rack_heat"]
    assert [a.state for a in heat] == [AlertState.FIRING] and heat[0].entity == RACK
    # 4 degC is reached half way up the ramp (1950), then held 60 s.
    assert 1990 <= (heat[0].started_ms - timestamps(1)[0]) // 1000 <= 2100
    assert not [a for a in alerts if a.source == "rule:thermal_excess"]


@pytest.mark.slow
def test_turning_the_forests_off_changes_no_page() -> None:
    """Pages come from the health rules, job peers and the rack heat rule; the per-GPU
    forests only signal by default (``alerts.model_severity = "info"``). So
    ``model.enabled = false`` must leave every page exactly as it was: that is what lets
    the soak benchmark count false pages at a fraction of the cost, and a site short of
    cores drop the forests. A fleet with faults of every kind, so there are pages to
    compare, and forests set to signal readily (a low threshold, a short cold start, no
    node veto or cooldown to speak of), so their episodes are many."""
    from agent.fleet.export import generate_zoo
    from benchmarks.detection import fleet_from_data, pages, run_detector, signals

    _, data = generate_zoo(5, 48, 2400.0, 9, hz=1.0)
    fleet = fleet_from_data(data, "zoo-5")
    eager = DetectorConfig(model=ModelConfig(z=2.0, floor=1.0, warmup=120),
                           alerts=AlertConfig(open_after=1, cooldown_s=60.0, node_veto=1.0))
    on, _, _, shard_on = run_detector(fleet, eager, "numba")
    off, _, _, shard_off = run_detector(
        fleet, dataclasses.replace(eager, model=dataclasses.replace(eager.model, enabled=False)),
        "numba")
    assert shard_on.gpu_steps > 0 and shard_off.gpu_steps == 0
    assert shard_off.skipped_steps == 0  # off is not shed: nothing is behind
    assert len(pages(on)) >= 4, "the fleet's faults raised too few pages to compare"
    assert pages(off) == pages(on)
    gpu_signals = [a for a in signals(on) if a.level == "gpu"]
    assert len(gpu_signals) >= 10, "the forests signalled too little to show anything"
    assert not [a for a in signals(off) if a.level == "gpu"]


def _as_before_the_2s_lag(blob: bytes) -> bytes:
    """The checkpoint ``blob`` as a version with lags 4, 15, 45 and 120 s wrote it: no 2 s
    column, no ``taus``, the chosen lag an index into those four (a GPU on 2 s on 4 s)."""
    with np.load(io.BytesIO(blob)) as z:
        arrays = {k: z[k] for k in z.files if not k.endswith(".taus")}
    lag_arrays = [f"features.thermal.{k}" for k in ThermalModels.LAG_ARRAYS]
    lag_arrays += [f"rules.{k}" for k in RuleBook.LAG_ARRAYS]
    for k in lag_arrays:
        assert arrays[k].shape[1] == len(TAUS_S) == 5
        arrays[k] = arrays[k][:, 1:]
    arrays["features.thermal.best"] = np.maximum(arrays["features.thermal.best"] - 1, 0)
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def test_a_checkpoint_from_before_the_2s_lag_loads_and_pages_the_same() -> None:
    """Checkpoints written with four candidate lags restore onto five: each lag from its
    own column, the new 2 s lag from the 4 s one (its nearest), every GPU on the lag it had;
    the restored detector pages what the uninterrupted one does."""
    data = healthy(520, 4, seed=7)
    data[400:, 2, COL["temperature_celsius"]] += 20.0
    ts = timestamps(520)
    whole, ids, nodes = _shard(4)
    alerts_whole = whole.process(ids, nodes, ts, data)

    first, ids, nodes = _shard(4)
    alerts = first.process(ids, nodes, ts[:300], data[:300])
    old = _as_before_the_2s_lag(shard_bytes(first, {"samples": 9}))
    second = DetectorShard(small_config())
    assert restore_shard(second, old) == {"samples": 9}
    thermal, before = second.features.thermal, first.features.thermal
    for k in ThermalModels.LAG_ARRAYS:
        got, had = getattr(thermal, k), getattr(before, k)
        np.testing.assert_array_equal(got[:, 1:], had[:, 1:])
        np.testing.assert_array_equal(got[:, 0], had[:, 1])
    np.testing.assert_array_equal(thermal.best, np.maximum(before.best, 1))
    np.testing.assert_array_equal(second.rules.excess_kplaus[:, 0],
                                  first.rules.excess_kplaus[:, 1])
    ids2, nodes2 = second.register([f"{RACK}/node-0/gpu-{g}" for g in range(4)],
                                   [RACK] * 4, [f"{RACK}/node-0"] * 4)
    alerts += second.process(ids2, nodes2, ts[300:], data[300:])
    assert [(a.entity, a.source, a.state) for a in alerts] == \
        [(a.entity, a.source, a.state) for a in alerts_whole]
    assert any(a.state is AlertState.FIRING for a in alerts)

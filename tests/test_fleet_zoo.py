"""The fleet zoo: profiles are deterministic and documented, and every fault shows at every size."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from agent.fleet import (
    METRICS,
    NAMED_PROFILES,
    ZOO_HELDOUT_SEEDS,
    ZOO_TUNING_SEEDS,
    Fault,
    FaultKind,
    FleetProfile,
    Topology,
    draw_profile,
    generate,
    generate_zoo,
    plan_zoo_faults,
    read_labels,
    realistic_fault_count,
    write_labels,
)
from agent.fleet.faults import ZOO_MAGNITUDES, observable_kinds
from agent.fleet.thermal import HW_POWER_BRAKE_SLOWDOWN, HW_SLOWDOWN
from agent.fleet.workloads import KIND_NAMES
from agent.fleet.zoo import DCGM_EXPORTER_MISSING, named_or_drawn
from schemas.catalog import CATALOG, Kind


def _col(name: str) -> int:
    return METRICS.index(f"fleetpulse_gpu_{name}")


def test_draws_are_deterministic_inside_their_ranges_and_seed_sets_disjoint():
    assert not set(ZOO_TUNING_SEEDS) & set(ZOO_HELDOUT_SEEDS)
    assert len(ZOO_TUNING_SEEDS) >= 10 and len(ZOO_HELDOUT_SEEDS) >= 10
    draws = [draw_profile(s) for s in ZOO_TUNING_SEEDS + ZOO_HELDOUT_SEEDS]
    assert draws == [draw_profile(s) for s in ZOO_TUNING_SEEDS + ZOO_HELDOUT_SEEDS]
    assert len({replace(p, name="") for p in draws}) == len(draws)
    for p in draws:
        p.validate()
        assert 0.2 <= p.hz <= 10 and 2 <= p.die_tau_s <= 120 and 3 <= (p.mem_tau_s or 0) <= 180
        assert 300 <= p.power_limit_w <= 700 and p.temp_resolution_c in (1.0, 0.5, 0.1)
        # A die rise of 12-50 degC at a 300-700 W limit, +-7 % across GPUs.
        assert 12 / 700 * 0.93 <= p.r_die_c_per_w[0] <= p.r_die_c_per_w[1] <= 50 / 300 * 1.07
        assert 120 <= p.mean_phase_s[0] <= 14_400 and p.fault_style == "zoo"
    # Wide means both corners turn up within the tuning draws alone.
    tuning = draws[: len(ZOO_TUNING_SEEDS)]
    assert {p.cooling for p in tuning} == {"air", "liquid"}
    assert {p.temp_resolution_c for p in tuning} >= {1.0, 0.1}
    assert len(KIND_NAMES) == len(FleetProfile().mix)
    assert named_or_drawn("zoo-1000") == draw_profile(1000) == named_or_drawn(1000)
    with pytest.raises(ValueError, match="unknown profile"):
        named_or_drawn("no-such-fleet")


def test_default_profile_is_the_default_model_bit_for_bit():
    plain = generate(64, 1.0, 120, faults=3, seed=4)
    for prof in (FleetProfile(), NAMED_PROFILES["default"]):
        same = generate(64, 1.0, 120, faults=3, seed=4, profile=prof)
        assert np.array_equal(plain.values, same.values, equal_nan=True)
        assert np.array_equal(plain.ts, same.ts) and plain.labels == same.labels


@pytest.mark.parametrize("spec", [*NAMED_PROFILES, 0, 2, 1003])
def test_every_named_and_some_drawn_profiles_generate(spec):
    prof, d = generate_zoo(7, 32, 150, faults=2, profile=spec)
    ticks = round(150 * prof.hz)
    assert d.values.shape == (32, ticks, len(METRICS)) and d.ts.shape == (32, ticks)
    assert np.all(np.diff(d.ts, axis=1) > 0)
    missing = [METRICS.index(m) for m in prof.missing]
    assert np.isnan(d.values[:, :, missing]).all()
    present = [i for i in range(len(METRICS)) if i not in missing and i != _col("xid")]
    dead = {lab["gpu"] for lab in d.labels if lab["kind"] == "fallen_off_bus"}
    alive = [g for g in range(32) if g not in dead]
    assert not np.isnan(d.values[np.ix_(alive, range(ticks), present)]).any()
    if "fleetpulse_gpu_temperature_celsius" not in prof.missing:
        temp = d.column("fleetpulse_gpu_temperature_celsius")[alive]
        steps = temp * prof.temp_steps_per_c
        assert np.array_equal(steps, np.rint(steps))  # the sensor's resolution, exactly
    power_mw = d.column("fleetpulse_gpu_power_usage_watts")[alive] * 1000.0
    assert np.allclose(power_mw / prof.power_step_mw, np.rint(power_mw / prof.power_step_mw))
    for m in CATALOG:
        if m.kind is Kind.COUNTER and m.name in METRICS and m.name not in prof.missing:
            step = np.diff(d.column(m.name)[alive], axis=1)
            assert np.all(step >= 0), m.name


def test_dcgm_exporter_profile_lacks_what_dcgm_exporter_lacks():
    prof = NAMED_PROFILES["sparse_metrics_0p2hz"]
    assert set(prof.missing) == set(DCGM_EXPORTER_MISSING)
    names = {m.removeprefix("fleetpulse_gpu_") for m in DCGM_EXPORTER_MISSING}
    assert {"power_limit_watts", "ecc_sbe_volatile_total", "clock_event_reasons",
            "nvlink_crc_errors_total"} <= names
    assert not names & {"temperature_celsius", "power_usage_watts", "utilization_ratio",
                        "xid", "framebuffer_used_bytes", "sm_clock_hertz"}
    # Kinds the exporter cannot show are not planned.
    kinds = set(observable_kinds(prof.missing))
    assert FaultKind.ECC_STORM not in kinds and FaultKind.NVLINK_ERRORS not in kinds
    plan = plan_zoo_faults(Topology(256), 12, 7200, prof.hz, 3, prof)
    assert {f.kind for f in plan} <= kinds


def test_long_time_constant_holds_an_integer_temperature_under_power_swings():
    """The physics the stuck-sensor rule missed: a cold plate's thermal mass."""
    steady = replace(NAMED_PROFILES["liquid_cooled_integer"], mix=(0, 1, 0, 0, 0, 0),
                     mean_phase_s=(1e7,) * 6)
    d = generate(16, 1.0, 1500, seed=2, profile=steady)
    temp = d.column("fleetpulse_gpu_temperature_celsius")[:, 900:]
    power = d.column("fleetpulse_gpu_power_usage_watts")[:, 900:]
    held = 0
    for g in range(16):
        assert np.ptp(temp[g]) <= 1  # ten minutes within one degree step (a ripple may flip
        assert np.ptp(power[g]) > 200  # a value near x.5) while power swings by 200 W+
        held += bool(np.ptp(temp[g]) == 0)
    assert held >= 8  # most GPUs read one integer value for all ten minutes
    fast = generate(16, 1.0, 1500, seed=2, profile=replace(steady, die_tau_s=2.0))
    assert np.ptp(fast.column("fleetpulse_gpu_temperature_celsius")[:, 900:], axis=1).min() >= 3


def _pure(kind: int) -> FleetProfile:
    """The pipeline profile running only workload ``kind``, phases that never end."""
    mix = [0.0] * 6
    mix[kind] = 1.0
    return replace(NAMED_PROFILES["pipeline_bubbles"], mix=tuple(mix), mean_phase_s=(1e7,) * 6)


def test_pipeline_stages_are_out_of_phase_and_random_inference_changes_every_tick():
    d = generate(16, 10.0, 60, seed=3, profile=_pure(3))
    util = d.column("fleetpulse_gpu_utilization_ratio")
    bubble = util < 0.3
    assert 0.1 < bubble.mean() < 0.45  # every stage idles a bubble's share of each step
    node = bubble[:8]
    mixed = node.any(axis=0) & ~node.all(axis=0)
    assert mixed.mean() > 0.5  # at most ticks some stages compute while others wait
    d = generate(16, 1.0, 60, seed=3, profile=_pure(4))
    util = d.column("fleetpulse_gpu_utilization_ratio")
    assert np.mean(np.abs(np.diff(util, axis=1))) > 0.1
    d = generate(64, 1.0, 30, seed=3, profile=_pure(5))
    busy = d.column("fleetpulse_gpu_performance_state")[:, -1] == 0
    per_node = busy.reshape(8, 8).sum(axis=1)
    assert np.all((per_node >= 1) & (per_node <= 7))  # k of 8 GPUs run the job


# Every kind at every zoo size, abrupt and ramped over 5 minutes, in two fleets that keep
# training (so "before" and "after" differ only by the fault) and cool slowly (90 s).
_STEADY = replace(NAMED_PROFILES["liquid_cooled_integer"], mix=(0, 1, 0, 0, 0, 0),
                  mean_phase_s=(1e7,) * 6)
_A, _B, _RAMP = 300.0, 900.0, 300.0
_VARIANTS = [(m, r) for r in (0.0, _RAMP) for m in (0.35, 0.6, 1.0)]


def _variants(kind: FaultKind) -> list[tuple[float, float]]:
    return [(m, r) for r in (0.0, _RAMP) for m in ZOO_MAGNITUDES[kind]]


@pytest.fixture(scope="module")
def rack_fleet():
    """Seven racks: cooling faults on racks 0-5 at every size, rack 6 the control."""
    faults = [Fault(FaultKind.COOLING_RACK, tuple(range(32 * i, 32 * i + 32)), _A, _B, m, r)
              for i, (m, r) in enumerate(_VARIANTS)]
    return faults, generate(224, 1.0, 1000, seed=8, profile=_STEADY, fault_plan=faults)


@pytest.fixture(scope="module")
def gpu_fleet():
    """One node per kind (one per straggler): every size of every per-GPU kind."""
    faults: list[Fault] = []
    node = 0
    for kind in (FaultKind.THERMAL_RUNAWAY, FaultKind.HOT_IDLE, FaultKind.ECC_STORM,
                 FaultKind.NVLINK_ERRORS, FaultKind.POWER_BRAKE):
        faults += [Fault(kind, (8 * node + i,), _A, _B, m, r)
                   for i, (m, r) in enumerate(_variants(kind))]
        node += 1
    for m, r in _variants(FaultKind.STRAGGLER):
        faults.append(Fault(FaultKind.STRAGGLER, (8 * node,), _A, _B, m, r))
        node += 1
    faults.append(Fault(FaultKind.STUCK_SENSOR, (8 * node,), _A, _B, 1.0, 0.0))
    faults.append(Fault(FaultKind.FALLEN_OFF_BUS, (8 * node + 1,), _A, 1000.0, 1.0, 0.0))
    return faults, generate(8 * (node + 1), 1.0, 1000, seed=9, profile=_STEADY,
                            fault_plan=faults)


_LATE = slice(int(_B) - 150, int(_B))
_BEFORE = slice(int(_A) - 120, int(_A))


def _peers(f: Fault, faults: list[Fault]) -> list[int]:
    node = f.gpus[0] // 8
    taken = {g for x in faults for g in x.gpus}
    return [g for g in range(node * 8, node * 8 + 8) if g not in taken]


def _of(faults: list[Fault], kind: FaultKind) -> list[Fault]:
    return [f for f in faults if f.kind is kind]


def test_cooling_rack_shows_at_every_size(rack_fleet):
    faults, d = rack_fleet
    temp = d.column("fleetpulse_gpu_temperature_celsius")
    rise = temp[:, _LATE].mean(axis=1) - temp[:, _BEFORE].mean(axis=1)
    control = rise[192:].mean()
    for f in faults:
        assert rise[list(f.gpus)].mean() - control > 0.6 * 21.0 * f.magnitude, f


def test_heat_faults_show_at_every_size(gpu_fleet):
    faults, d = gpu_fleet
    temp = d.column("fleetpulse_gpu_temperature_celsius")
    for kind, full in ((FaultKind.THERMAL_RUNAWAY, 42.0), (FaultKind.HOT_IDLE, 25.0)):
        for f in _of(faults, kind):
            g, peers = f.gpus[0], _peers(f, faults)
            hotter = temp[g, _LATE].mean() - temp[peers, _LATE].mean()
            assert hotter > 0.5 * full * f.magnitude, (f, hotter)
            if f.ramp_s:  # a slow fault is still small halfway up its ramp
                mid = int(_A + f.ramp_s / 4)
                assert temp[g, mid] - temp[peers, mid].mean() < 0.5 * full * f.magnitude
    power = d.column("fleetpulse_gpu_power_usage_watts")
    for f in _of(faults, FaultKind.HOT_IDLE):  # on an idle GPU
        assert power[f.gpus[0], _LATE].max() < 0.3 * _STEADY.power_limit_w


def test_counter_faults_show_at_every_size(gpu_fleet):
    faults, d = gpu_fleet
    for kind, metric, rate in ((FaultKind.ECC_STORM, "ecc_sbe_volatile_total", 40.0),
                               (FaultKind.NVLINK_ERRORS, "nvlink_crc_errors_total", 150.0)):
        x = d.column(f"fleetpulse_gpu_{metric}")
        for f in _of(faults, kind):
            g = f.gpus[0]
            full_s = _B - _A - f.ramp_seconds / 2  # a ramp delivers half its length
            assert x[g, int(_B) - 1] - x[g, int(_A)] > 0.6 * rate * f.magnitude * full_s, f
            assert x[g, int(_A) - 1] - x[g, 0] < 5 and x[g, -1] == x[g, int(_B) - 1]
    tx = d.column("fleetpulse_gpu_nvlink_transmit_bytes_per_second")
    for f in _of(faults, FaultKind.NVLINK_ERRORS):
        ratio = tx[f.gpus[0], _LATE].mean() / tx[_peers(f, faults), _LATE].mean()
        assert ratio < 1.0 - 0.45 * f.magnitude * 0.5, (f, ratio)


def test_clock_faults_show_at_every_size(gpu_fleet):
    faults, d = gpu_fleet
    clock = d.column("fleetpulse_gpu_sm_clock_hertz")
    util = d.column("fleetpulse_gpu_utilization_ratio")
    bits = np.nan_to_num(d.column("fleetpulse_gpu_clock_event_reasons")).astype(np.int64)
    for f in _of(faults, FaultKind.POWER_BRAKE):
        g = f.gpus[0]
        assert np.all(bits[g, int(_A) : int(_B)] & HW_POWER_BRAKE_SLOWDOWN)
        assert np.all(bits[g, int(_A) : int(_B)] & HW_SLOWDOWN)
        assert not np.any(bits[g, _BEFORE] & HW_POWER_BRAKE_SLOWDOWN)
        ratio = np.median(clock[g, _LATE]) / np.median(clock[_peers(f, faults), _LATE])
        assert ratio < 1.0 - 0.75 * f.magnitude * 0.5, (f, ratio)
    for f in _of(faults, FaultKind.STRAGGLER):
        g = f.gpus[0]
        ratio = np.median(clock[g, _LATE]) / np.median(clock[_peers(f, faults), _LATE])
        assert ratio < 1.0 - 0.4 * f.magnitude * 0.5, (f, ratio)
        assert np.all(util[g, int(_A) : int(_B)] == 1.0)


def test_stuck_sensor_and_fallen_off_bus(gpu_fleet):
    faults, d = gpu_fleet
    (stuck,) = _of(faults, FaultKind.STUCK_SENSOR)
    g = stuck.gpus[0]
    assert len(np.unique(d.column("fleetpulse_gpu_temperature_celsius")[g, int(_A) : int(_B)])) == 1
    assert np.ptp(d.column("fleetpulse_gpu_power_usage_watts")[g, int(_A) : int(_B)]) > 100
    (gone,) = _of(faults, FaultKind.FALLEN_OFF_BUS)
    v = d.values[gone.gpus[0]]
    assert v[int(_A), _col("xid")] == 79.0 and np.isnan(v[int(_A) + 1 :]).all()


def test_a_stuck_sensor_is_labelled_visible_once_its_die_moves_off_the_frozen_reading():
    # GPU 2 freezes while its node trains on steadily (its die stays within a degree or so
    # of the frozen reading: nothing shows); GPU 13 freezes as its node is pinned idle (a
    # hot_idle fault on GPU 8 holds the node idle) and its die cools 10 degC: it shows.
    prof = replace(named_or_drawn(0), hz=1.0, missing=())
    faults = [Fault(FaultKind.STUCK_SENSOR, (2,), 200.0, 800.0),
              Fault(FaultKind.HOT_IDLE, (8,), 200.0, 800.0, 0.01, 0.0),
              Fault(FaultKind.STUCK_SENSOR, (13,), 200.0, 800.0)]
    d = generate(16, 1.0, 900.0, seed=3, profile=prof, fault_plan=faults)
    labels = {lab["gpu"]: lab for lab in d.labels}
    temp = d.column("fleetpulse_gpu_temperature_celsius")
    assert "visible_s" not in labels[8]  # only stuck sensors say when they showed
    # The peers' readings (same load, same airflow) say how far each die moved.
    moved = {}
    for g in (2, 13):
        assert np.all(temp[g, 200:800] == temp[g, 200])
        peers = [p for p in range(g // 8 * 8, g // 8 * 8 + 8) if p not in (g, 8)]
        moved[g] = np.abs(np.median(temp[peers, 200:800], axis=0) - temp[g, 200])
    assert labels[2]["visible_s"] is None and moved[2].max() < 2.0, moved[2].max()
    vis = labels[13]["visible_s"]
    assert vis is not None and 200.0 <= vis < 230.0 and moved[13].max() >= 8.0


def test_labels_carry_size_and_ramp_and_old_files_still_read(tmp_path):
    faults = [Fault(FaultKind.ECC_STORM, (3,), 100.0, 520.0, 0.075, 0.0),
              Fault(FaultKind.COOLING_RACK, tuple(range(32, 64)), 100.0, 500.0)]
    path = tmp_path / "labels.json"
    write_labels(path, faults)
    labels = read_labels(path)
    assert labels[0] == {"gpu": 3, "kind": "ecc_storm", "start_s": 100.0, "end_s": 520.0,
                         "magnitude": 0.075, "ramp_s": 0.0}
    assert labels[1]["ramp_s"] == 120.0 and labels[1]["magnitude"] == 1.0  # classic ramp
    old = tmp_path / "old.json"
    old.write_text(json.dumps([{"gpu": 1, "kind": "straggler", "start_s": 1, "end_s": 9}]))
    assert read_labels(old)[0] == {"gpu": 1, "kind": "straggler", "start_s": 1, "end_s": 9,
                                   "magnitude": 1.0, "ramp_s": None}
    with pytest.raises(ValueError, match="magnitude"):
        Fault(FaultKind.ECC_STORM, (3,), 100.0, 200.0, 0.0)


def test_zoo_fault_plans_vary_size_and_speed_and_fit_their_windows():
    prof = draw_profile(1)
    topo = Topology(512)
    plan = plan_zoo_faults(topo, 40, 4 * 3600.0, 1.0, 5, prof)
    assert plan == plan_zoo_faults(topo, 40, 4 * 3600.0, 1.0, 5, prof)
    assert {f.kind for f in plan} == set(observable_kinds(prof.missing))
    gpus = [g for f in plan for g in f.gpus]
    assert len(gpus) == len(set(gpus))
    assert {f.magnitude for f in plan if f.kind is FaultKind.ECC_STORM} <= {0.075, 0.3, 1.0}
    assert len({f.magnitude for f in plan}) >= 3
    ramps = [f.ramp_s or 0.0 for f in plan]
    assert any(r == 0 for r in ramps) and any(300 <= r <= 1800 for r in ramps)
    for f in plan:
        assert f.start_s >= 0.2 * 4 * 3600 - 1 and f.start_s + f.ramp_seconds < f.end_s
        assert f.end_s <= 4 * 3600
    hot = [f for f in plan if f.kind is FaultKind.HOT_IDLE]
    for f in hot:  # a hot_idle fault has its node to itself
        node = set(range(f.gpus[0] // 8 * 8, f.gpus[0] // 8 * 8 + 8))
        assert not node & (set(gpus) - set(f.gpus))


def test_realistic_density_is_mostly_no_fault():
    counts = [realistic_fault_count(1024, 86_400.0, s) for s in range(400)]
    assert 0.35 < np.mean(counts) < 0.7  # 0.5 per 1000 GPU-days x 1024 GPU-days
    assert counts.count(0) > len(counts) / 2
    _, d = generate_zoo(5, 16, 60, faults=None)  # 0.01 GPU-days: no fault
    assert d.labels == []

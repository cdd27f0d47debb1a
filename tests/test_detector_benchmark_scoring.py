"""The detection benchmark's scoring (recall, false incidents, point FPR, delay) on a tiny
hand-made fleet whose answers are known; pages apart from signals; the soak's parts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from benchmarks import detection_soak
from benchmarks.detection import Episode, Fleet, evaluate, pages, poisson_upper
from schemas.records import AlertRecord, AlertState, Severity


def _fleet() -> Fleet:
    g, t = 8, 1000  # two racks of 4 GPUs, 1000 s at 1 Hz
    racks = [f"c/r/rack-{i // 4}" for i in range(g)]
    labels = [
        {"gpu": 1, "kind": "straggler", "start_s": 300.0, "end_s": 400.0},
        {"gpu": 4, "kind": "cooling_rack", "start_s": 500.0, "end_s": 600.0},
        {"gpu": 5, "kind": "cooling_rack", "start_s": 500.0, "end_s": 600.0},
        {"gpu": 6, "kind": "stuck_sensor", "start_s": 700.0, "end_s": 800.0},
    ]
    return Fleet(
        ts=np.tile(np.arange(t, dtype=np.int64) * 1000, (g, 1)),
        gathered=np.zeros((t, g, 1)), labels=labels,
        paths=[f"{racks[i]}/n/gpu-{i}" for i in range(g)], rack_paths=racks,
        node_paths=[f"{racks[i]}/n" for i in range(g)],
        rack_of_gpu=np.array([i // 4 for i in range(g)]), hz=1.0, source="test")


def test_scoring_counts_what_it_should() -> None:
    fleet = _fleet()
    episodes = [
        Episode(np.array([1]), 310.0, 420.0, "model"),  # straggler found after 10 s
        Episode(np.array([4, 5, 6, 7]), 530.0, 640.0, "rack"),  # cooling found by the rack
        Episode(np.array([2]), 150.0, 160.0, "model"),  # false: nothing near on rack 0
        Episode(np.array([3]), 420.0, 430.0, "model"),  # excused: within the grace of gpu 1
        Episode(np.array([0]), 50.0, 60.0, "model"),  # in the cold start: not counted
    ]
    r = evaluate(fleet, episodes, cold_start_s=100.0)
    assert r["faults"] == 3
    assert r["recall_per_kind"] == {"cooling_rack": 1.0, "straggler": 1.0, "stuck_sensor": 0.0}
    assert r["recall"] == round(2 / 3, 4)
    assert r["median_delay_s"] == 20.0  # delays 10 and 30
    # The cold-start episode is false too, but outside the counted hours it adds no points:
    # the GPU-days start after the cold start, the incident count does not look at time.
    assert r["false_incidents"] == 2
    assert r["gpu_days"] == round(8 * 900 / 86_400, 3)
    assert r["false_incidents_per_1000_gpu_days"] == round(2000 / (8 * 900 / 86_400), 2)
    # Each fault +-60 s excuses its rack: rack 0 for 220 s, rack 1 for 440..860 (two faults).
    normal = 8 * 900 - 4 * 220 - 4 * 420
    assert r["point_fpr"] == float(f"{10 / normal:.3g}")


def test_a_stuck_sensor_counts_from_when_it_showed_and_not_at_all_if_it_never_did() -> None:
    fleet = _fleet()
    fleet.labels[3]["visible_s"] = 730.0  # the die stood 2 degC off the frozen reading at 730 s
    found = [Episode(np.array([6]), 740.0, 800.0, "rule")]
    r = evaluate(fleet, found, cold_start_s=100.0)
    assert r["recall_per_kind"]["stuck_sensor"] == 1.0 and r["latent_by_kind"] == {}
    assert r["delays_by_kind"]["stuck_sensor"] == [10.0]  # from 730 s, not from 700 s
    fleet.labels[3]["visible_s"] = None  # the die never moved: nothing in the data to find
    r = evaluate(fleet, [], cold_start_s=100.0)
    assert r["faults"] == 2 and "stuck_sensor" not in r["recall_per_kind"]
    assert r["latent_by_kind"] == {"stuck_sensor": 1}
    # Its window still excuses an alert on its rack.
    r = evaluate(fleet, [Episode(np.array([6]), 720.0, 760.0, "rule")], cold_start_s=100.0)
    assert r["false_incidents"] == 0


def test_the_abrupt_delay_leaves_out_faults_that_ramp() -> None:
    fleet = _fleet()
    fleet.labels[0]["ramp_s"] = 300.0  # the straggler grows over 5 minutes
    fleet.labels[2]["ramp_s"] = 0.0  # the cooling wave is at full strength at once
    episodes = [Episode(np.array([1]), 390.0, 420.0, "rule"),  # 90 s into the ramp
                Episode(np.array([4, 5, 6, 7]), 530.0, 640.0, "rack")]  # 30 s
    r = evaluate(fleet, episodes, cold_start_s=100.0)
    assert r["delays_s"] == [30.0, 90.0] and r["median_delay_s"] == 60.0
    assert r["delays_abrupt_s"] == [30.0] and r["median_delay_abrupt_s"] == 30.0
    # Each fault found says what it was and which source found it first, and when.
    assert [(f["kind"], f["ramp_s"], f["delay_s"], f["source"], f["gpus"])
            for f in r["found_faults"]] == [("straggler", 300.0, 90.0, "rule", 1),
                                            ("cooling_rack", 0.0, 30.0, "rack", 2)]


def test_overlapping_false_episodes_on_one_rack_are_one_incident() -> None:
    fleet = _fleet()
    episodes = [
        Episode(np.array([2]), 150.0, 200.0, "rule:thermal_slowdown"),
        Episode(np.array([0, 1, 2, 3]), 160.0, 230.0, "model:numba:rack"),  # the same cause
        Episode(np.array([3]), 120.0, 170.0, "model:numba"),  # overlaps too
        Episode(np.array([7]), 150.0, 200.0, "rule:thermal_slowdown"),  # the other rack
    ]
    r = evaluate(fleet, episodes, cold_start_s=100.0)
    assert r["false_incidents"] == 2
    assert r["false_episodes_by_source"] == {"model:numba": 1, "model:numba:rack": 1,
                                             "rule:thermal_slowdown": 2}


def test_an_episode_that_opens_at_the_last_sample_is_scored() -> None:
    """A baseline's episode may open at the last sample or past it (held-out zoo-1592's MAD
    baseline did, and the zoo stopped with an IndexError)."""
    fleet = _fleet()
    r = evaluate(fleet, [Episode(np.array([0]), 999.0, 999.0, "mad"),
                         Episode(np.array([2]), 1005.0, 1010.0, "mad"),
                         Episode(np.array([6]), 999.0, 1005.0, "mad")], cold_start_s=100.0)
    # GPUs 0 and 2 (rack 0, no fault near the end) are one false incident; GPU 6's opens on
    # rack 1 long after its stuck sensor's grace ended (800 + 60 s): another.
    assert r["false_incidents"] == 2


def test_poisson_upper_bound() -> None:
    # Zero events in an exposure bound the rate by about 3 / exposure (the rule of three).
    assert abs(poisson_upper(0) - 2.996) < 1e-3
    assert abs(poisson_upper(1) - 4.744) < 1e-3
    assert abs(poisson_upper(10) - 17.0) < 0.1
    # Hundreds of events (a baseline's false incidents): exp(-mu) alone underflows there.
    # The normal approximation k + 1.645 sqrt(k) + ~2 is within a few tenths.
    assert abs(poisson_upper(1215) - (1215 + 1.645 * 1215 ** 0.5 + 2.0)) < 1.0


def test_pages_leave_info_signals_out() -> None:
    def rec(severity: Severity) -> AlertRecord:
        return AlertRecord(id=severity.value, entity="c/r/rack-0/n/gpu-1", level="gpu",
                           state=AlertState.FIRING, severity=severity, source="x",
                           summary="", score=1.0, threshold=1.0, started_ms=0, updated_ms=0)

    alerts = [rec(s) for s in Severity]
    assert [a.id for a in pages(alerts)] == [a.id for a in alerts
                                             if a.severity is not Severity.INFO]


def test_soak_runs_parts_in_workers_and_resumes(tmp_path: Path) -> None:
    out = tmp_path / "soak.json"
    common = ["--split", "tuning", "--gpus", "8", "--hours", "0.4", "--out", str(out)]
    assert detection_soak.main(["--parts", "2", "--workers", "2", *common]) == 0
    first = json.loads(out.read_text())
    assert [p["part"] for p in first["parts"]] == [0, 1]
    assert first["summary"]["parts"] == 2
    assert first["summary"]["gpu_days"] == pytest.approx(
        sum(p["gpu_days"] for p in first["parts"]), abs=0.01)
    assert all(p["gpu_days"] > 0 and "signals" in p for p in first["parts"])
    assert detection_soak.main(["--parts", "3", "--resume", *common]) == 0
    again = json.loads(out.read_text())
    assert again["parts"][:2] == first["parts"]  # kept, not rerun
    assert [p["part"] for p in again["parts"]] == [0, 1, 2]


def test_soak_starts_at_the_draw_asked_and_resumes_only_the_same_run(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--draws-from`` keeps a soak off the draws already studied; a resume that would
    mix parts of another start, split or mode into one figure is refused."""
    from agent.fleet.zoo import ZOO_TUNING_SEEDS, draw_profile

    out = tmp_path / "soak.json"
    common = ["--split", "tuning", "--gpus", "8", "--hours", "0.2", "--out", str(out)]
    last = len(ZOO_TUNING_SEEDS) - 1
    assert detection_soak.main(["--parts", "2", "--draws-from", str(last), "--pages-only",
                                *common]) == 0
    run = json.loads(out.read_text())
    # The last draw, then round to the first (on another fleet seed).
    assert [p["profile"] for p in run["parts"]] == [
        draw_profile(ZOO_TUNING_SEEDS[last]).name, draw_profile(ZOO_TUNING_SEEDS[0]).name]
    assert run["summary"]["draws_from"] == last and run["summary"]["pages_only"] is True
    with pytest.raises(SystemExit):
        detection_soak.main(["--parts", "3", "--resume", "--pages-only", *common])
    assert "was run with" in capsys.readouterr().err
    assert json.loads(out.read_text()) == run  # left as it was


def test_zoo_refuses_a_held_out_start_past_the_draws(capsys: pytest.CaptureFixture[str],
                                                     tmp_path: Path) -> None:
    """``--zoo-heldout-from`` takes an index; a seed there once selected no held-out draw and
    the run reported the tuning split alone, as if that were the whole result."""
    from benchmarks.detection import main

    with pytest.raises(SystemExit) as exc:
        main(["--zoo", "--zoo-splits", "heldout", "--zoo-heldout-from", "1018",
              "--out", str(tmp_path / "zoo.json")])
    assert exc.value.code == 2
    assert "an index into the" in capsys.readouterr().err

"""``fleetpulse demo``: its sample config, its scorecard, and a real run ending by --duration.

The browser side (and stopping by SIGINT) is in ``tests/test_demo_web.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.fleet import CLASSIC_KINDS, METRICS, Fault, FaultKind, Topology
from fleetpulse.config import ConfigError, load_config
from fleetpulse.demo import DemoConfig, Scorecard
from schemas.records import Action, AlertRecord, AlertState, Severity

ROOT = Path(__file__).resolve().parent.parent


def test_sample_config_loads_and_is_the_default_fleet() -> None:
    cfg = load_config(DemoConfig, ROOT / "config" / "demo.toml")
    topo = cfg.topology()
    assert topo.gpus == 1024
    assert (cfg.gpus_per_node, cfg.nodes_per_rack, cfg.racks_per_row) == (8, 8, 4)
    assert topo.racks.size == 16  # 4 rows x 4 racks
    assert cfg.listen == "127.0.0.1:8080"
    assert cfg.transport.is_memory
    assert cfg.detector.model.engine == DemoConfig().detector.model.engine == "numba"
    assert len(cfg.fault_plan()) == cfg.faults == 8
    assert {f.kind for f in cfg.fault_plan()} == set(CLASSIC_KINDS)


def test_config_errors_are_clear() -> None:
    with pytest.raises(ConfigError, match="do not fit"):
        load_config(DemoConfig, overrides={"gpus": 64, "faults": 8})
    with pytest.raises(ConfigError, match="fault_kinds"):
        load_config(DemoConfig, overrides={"fault_kinds": "overheating"})
    with pytest.raises(ConfigError, match="listen"):
        load_config(DemoConfig, overrides={"listen": "8080"})
    with pytest.raises(ConfigError, match="speed"):
        load_config(DemoConfig, overrides={"speed": 0})


def _alert(entity: str, start_s: float, start_ms: int, *, state: AlertState = AlertState.FIRING,
           end_s: float | None = None, level: str = "gpu") -> AlertRecord:
    t = start_ms + int(start_s * 1000)
    return AlertRecord(
        id=f"{entity}@{start_s}", entity=entity, level=level, state=state,
        severity=Severity.WARNING, source="rule:test", summary="test", score=1.0, threshold=1.0,
        started_ms=t, updated_ms=start_ms + int((end_s if end_s is not None else start_s) * 1000),
    )


def test_scorecard_matches_alerts_to_faults_like_the_detection_benchmark() -> None:
    topo = Topology(128, 8, 4, 2, "sim")
    plan = [Fault(FaultKind.ECC_STORM, (3,), 100.0, 200.0),
            Fault(FaultKind.COOLING_RACK, tuple(range(64, 96)), 150.0, 400.0)]
    t0 = 1_700_000_000_000
    card = Scorecard(topo, plan, t0)
    gpu3 = card.gpu_paths[3]
    rack2 = card.gpu_paths[64].rsplit("/", 2)[0]
    assert rack2 == "sim/row-001/rack-001-00"
    # over before the fault (and its grace): a false incident; during it: a detection
    card.add(_alert(gpu3, 10.0, t0))
    card.add(_alert(gpu3, 10.0, t0, state=AlertState.RESOLVED, end_s=30.0))
    card.add(_alert(gpu3, 130.0, t0))
    # a rack alert detects the cooling fault of every GPU in it
    card.add(_alert(rack2, 160.0, t0, level="rack"))
    # another GPU in the faulted GPU's rack, during the fault: excused, not detected
    neighbour = card.gpu_paths[5]
    card.add(_alert(neighbour, 120.0, t0))
    # a GPU in a healthy rack: a false incident, even after it resolves
    healthy = card.gpu_paths[40]
    card.add(_alert(healthy, 300.0, t0))
    card.add(_alert(healthy, 300.0, t0, state=AlertState.RESOLVED, end_s=320.0))
    s = card.summary(500.0, t0 + 500_000)
    assert s["faults_injected"] == 2
    assert s["faults_detected"] == 2
    assert s["detected_by_kind"] == {"cooling_rack": "1/1", "ecc_storm": "1/1"}
    assert s["median_delay_s"] == 20.0  # 30 s for the ECC storm, 10 s for the rack
    assert {a.entity for a in card.false_incidents(t0 + 500_000)} == {gpu3, healthy}
    assert s["false_incidents"] == 2
    assert s["alerts"] == 5
    assert s["alert_transitions"] == 7
    assert card.summary(120.0, t0)["faults_injected"] == 1


@pytest.mark.timeout(400)
def test_demo_duration_json_summary(tmp_path: Path) -> None:
    labels = tmp_path / "labels.json"
    cmd = [sys.executable, "-m", "fleetpulse", "demo", "--gpus", "128", "--speed", "30",
           "--duration", "8", "--faults", "2", "--fault-kinds", "fallen_off_bus,ecc_storm",
           "--labels", str(labels), "--listen", "127.0.0.1:0", "--json"]
    env = dict(os.environ) | {"FLEETPULSE_DEMO_NODES_PER_RACK": "4"}
    t = time.monotonic()
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=390)
    wall = time.monotonic() - t
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    for key in ("gpus", "samples", "metrics_per_s", "faults_injected", "faults_detected",
                "false_incidents", "alerts"):
        assert key in summary, key
    assert summary["gpus"] == 128
    assert 7.5 <= summary["elapsed_s"] < 30 and wall >= 8
    # every sample is accounted for: whole frames of 16 nodes x 8 GPUs x the fleet's metrics
    per_tick = 128 * len(METRICS)
    assert summary["samples"] > 0 and summary["samples"] % per_tick == 0
    assert summary["aggregated_metrics"] == summary["samples"]
    assert summary["metrics_per_s"] == pytest.approx(summary["samples"] / summary["elapsed_s"],
                                                     rel=0.05)
    truth = json.loads(labels.read_text())
    injected = sum(1 for lab in truth if lab["start_s"] <= summary["sim_s"])
    assert summary["faults_injected"] == injected
    assert 0 <= summary["faults_detected"] <= summary["faults_injected"]
    assert summary["alerts"] >= summary["faults_detected"]
    # incidents beside alerts, each with its action (the lost GPU's XID 79: drain, reboot)
    assert summary["incidents"] == len(summary["incident_list"]) <= summary["alerts"]
    assert summary["incidents"] >= min(1, summary["faults_detected"])
    assert all(i["action"] in {a.value for a in Action} for i in summary["incident_list"])
    assert "heatmap and query API on http://127.0.0.1:" in res.stderr
    # jobs: scheduled, attributed through job-mapping files, rolled up per job, listed
    assert summary["jobs_started"] > 0 and summary["job_list"]
    assert any(j["utilization"] is not None for j in summary["job_list"])
    assert "jobs: " in res.stderr and summary["job_list"][0]["job"] in res.stderr


@pytest.mark.kafka
@pytest.mark.timeout(400)
def test_demo_over_kafka(kafka_bootstrap: str, unique_prefix: str) -> None:
    """``--bootstrap`` runs the same stages over a real broker instead of the embedded one."""
    cmd = [sys.executable, "-m", "fleetpulse", "demo", "--gpus", "128", "--speed", "20",
           "--duration", "10", "--faults", "1", "--fault-kinds", "fallen_off_bus",
           "--bootstrap", kafka_bootstrap, "--listen", "127.0.0.1:0", "--json"]
    env = dict(os.environ) | {"FLEETPULSE_DEMO_NODES_PER_RACK": "4",
                              "FLEETPULSE_DEMO_TRANSPORT__TOPIC_PREFIX": unique_prefix}
    res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=390)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["gpus"] == 128 and summary["samples"] > 0
    # every published sample went through Kafka into the aggregator and the detector
    assert summary["aggregated_metrics"] == summary["samples"]
    gpu_steps = summary["samples"] // len(METRICS)
    assert 0.9 * gpu_steps <= summary["detector_updates"] <= gpu_steps
    assert f"transport {kafka_bootstrap}" in res.stderr

"""The ingest load test runs end to end against the real broker (a short smoke run)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.kafka
@pytest.mark.slow
def test_ingest_benchmark_reports_every_stage(kafka_bootstrap: str):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.ingest", "--gpus", "160", "--hz", "4",
         "--seconds", "8", "--bootstrap", kafka_bootstrap,
         "--partitions", "3", "--ticks-per-frame", "2", "--settle", "8", "--drain", "20",
         "--no-write", "--json"],
        capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"metrics_per_s", "lag_max_s", "lag_final_s", "bottleneck"} <= set(result)
    target = 160 * 4 * 33
    assert result["target_metrics_per_s"] == target
    decode = result["per_stage"]["decode"]
    assert decode["decode_errors"] == 0
    # Everything produced was decoded: the consumer caught up within the drain time.
    assert result["drain_s"] is not None
    assert 0.5 * target < result["metrics_per_s"] < 1.5 * target
    assert result["latency_ms_p50"] is not None and result["fleet"]["frames_lost"] == 0
    assert "stage" in proc.stdout and "end to end" in proc.stdout
    # The aggregator is measured by its own counters (it holds commits back by design).
    agg = result["per_stage"]["aggregator"]
    assert 0.5 * target < agg["consumed_metrics_per_s"] < 1.5 * target, agg
    assert agg["metrics_per_s"] == agg["consumed_metrics_per_s"]
    assert agg["position_lag_max_s"] is not None and "committed_metrics_per_s" in agg
    assert 10 < agg["rss_peak_mb"] < 4000
    # Every stage runs by default; the detector too is measured by its own counters (it
    # commits once a checkpoint covers the offsets), and it kept up without shedding.
    assert set(result["stages"]) == {"decode", "aggregator", "detector"}
    det = result["per_stage"]["detector"]
    assert 0.5 * target < det["metrics_per_s"] < 1.5 * target, det
    assert det["skipped_steps"] == 0 and not det["left_group"]
    # One model step per GPU and second (step_s), not one per 4 Hz tick.
    assert 0.5 * 160 < det["model_steps_per_s"] < 1.5 * 160, det
    assert result["metrics_per_s"] == min(r["metrics_per_s"] for r in result["per_stage"].values())

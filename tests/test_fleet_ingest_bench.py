"""The ingest load test runs end to end against the real broker (a short smoke run)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_aggregator_support import process_all

from agent.fleet import FleetModel, Topology
from agent.fleet.model import METRIC_IDS
from aggregator.rack_stage import RackStage
from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig
from benchmarks.ingest import compare_rollups
from fleetpulse.transport.base import Message
from schemas.frame import SampleFrame, decode_frame, encode_frame

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
    # Eight seconds old, every GPU's forest is still in its cold start, and the report says so.
    assert det["models_final"] == det["models_warming_final"] == 160, det
    assert det["models_held_final"] == 0, det  # none past output_after yet, none held
    assert result["metrics_per_s"] == min(r["metrics_per_s"] for r in result["per_stage"].values())


def _rack_messages(gpus: int, seconds: int, start_ms: int) -> list[Message]:
    """A small simulated fleet's sample frames, racks keyed onto two partitions."""
    topo = Topology(gpus, nodes_per_rack=2, racks_per_row=2)
    model = FleetModel(topo, hz=1.0, seed=3, start_ms=start_ms)
    msgs, offsets = [], [0, 0]
    for tick in range(seconds):
        ts, values = model.step()
        for n, ident in enumerate(topo.identities):
            g = topo.gpus_of_node(n)
            frame = SampleFrame(ident, f"agent-{ident.node}", tick, METRIC_IDS,
                                np.arange(topo.gpn, dtype=np.int32), tuple(model.uuids[g]),
                                ts[n:n + 1], np.ascontiguousarray(values[g][None]))
            p = int(topo.rack_of_node[n]) % 2
            msgs.append(Message("t.samples", p, offsets[p], ident.rack_key,
                                encode_frame(frame), int(ts[n])))
            offsets[p] += 1
    return msgs


def _roll_up(data_dir: Path, msgs: list[Message]) -> None:
    """What one aggregator instance stores of ``msgs`` (rack stage: GPU, node, rack)."""
    data_dir.mkdir()
    store = SeriesStore(StoreConfig(path=str(data_dir / "store"), fsync=False))
    index = EntityIndex(data_dir / "entities.jsonl")
    try:
        stage = RackStage(store, index, topic="t.samples", lateness_ms=5000)
        process_all(stage, msgs)
    finally:
        index.close()
        store.close()


def test_compare_rollups_finds_equal_missing_and_differing_series(tmp_path: Path):
    """The check behind ``--instances N``: two instances that split the partitions store,
    together, what one instance stores of all of them; a lost instance shows as missing
    series and one changed sample as differing ones."""
    msgs = _rack_messages(32, 75, 1_767_225_600_000)  # 2 racks: one on each partition
    assert {m.partition for m in msgs} == {0, 1}
    _roll_up(tmp_path / "reference", msgs)
    _roll_up(tmp_path / "a", [m for m in msgs if m.partition == 0])
    _roll_up(tmp_path / "b", [m for m in msgs if m.partition == 1])
    same = compare_rollups([tmp_path / "a", tmp_path / "b"], tmp_path / "reference")
    assert same["equal"] and same["series"] > 1000, same
    assert same["missing"] == same["extra"] == same["differ"] == 0
    lost = compare_rollups([tmp_path / "a"], tmp_path / "reference")
    assert not lost["equal"] and 0 < lost["missing"] < lost["series"], lost
    changed = list(msgs)
    i = next(i for i, m in enumerate(changed) if m.partition == 1 and m.offset == 40)
    frame = decode_frame(changed[i].value)
    values = frame.values.copy()
    values[0, 0, 0] += 1.0  # one sample of one GPU's first metric
    changed[i] = dataclasses.replace(
        changed[i], value=encode_frame(dataclasses.replace(frame, values=values)))
    _roll_up(tmp_path / "b2", [m for m in changed if m.partition == 1])
    differ = compare_rollups([tmp_path / "a", tmp_path / "b2"], tmp_path / "reference")
    assert not differ["equal"] and differ["differ"] > 0 and differ["missing"] == 0, differ

"""``fleetpulse fleet``: export files, the sample config, and live publishing to real Kafka."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from agent.fleet import METRICS, Topology, load_npz, read_labels
from agent.fleet.config import FleetConfig
from fleetpulse.config import ConfigError, TransportConfig, load_config
from fleetpulse.transport import open_transport
from schemas.catalog import BY_NAME
from schemas.frame import decode_frame
from schemas.topics import Topics

ROOT = Path(__file__).resolve().parents[1]


def _fleet(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetpulse", "fleet", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def test_sample_config_loads_and_bad_values_are_named():
    cfg = load_config(FleetConfig, ROOT / "config" / "fleet.toml", environ={})
    assert cfg.gpus % cfg.gpus_per_node == 0 and cfg.transport.topic_prefix == "fleetpulse"
    with pytest.raises(ConfigError, match="multiple of gpus_per_node"):
        load_config(FleetConfig, overrides={"gpus": 12})
    with pytest.raises(ConfigError, match="fault_kinds"):
        load_config(FleetConfig, overrides={"fault_kinds": "melted"})
    with pytest.raises(ConfigError, match="finite duration"):
        load_config(FleetConfig, overrides={"faults": 2, "duration_s": 0})


def test_export_writes_the_documented_file(tmp_path: Path):
    out, labels = tmp_path / "fleet.npz", tmp_path / "labels.json"
    proc = _fleet("--gpus", "64", "--hz", "2", "--duration", "60", "--faults", "4",
                  "--seed", "3", "--export", str(out), "--labels", str(labels))
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["values"] == 64 * 120 * len(METRICS)
    with np.load(out, allow_pickle=False) as z:
        assert z["ts"].dtype == np.int64 and z["ts"].shape == (64, 120)
        assert z["values"].dtype == np.float64 and z["values"].shape == (64, 120, len(METRICS))
        assert z["metrics"].shape == (len(METRICS),)
        assert all(str(m) in BY_NAME for m in z["metrics"])
    data = load_npz(out)
    assert data.metrics == METRICS and len(set(data.uuids)) == 64
    lab = read_labels(labels)
    assert len({x["kind"] for x in lab}) == 4 and all(0 <= x["gpu"] < 64 for x in lab)
    # The same command twice writes the same data (determinism through the CLI too).
    again = tmp_path / "again.npz"
    assert _fleet("--gpus", "64", "--hz", "2", "--duration", "60", "--faults", "4",
                  "--seed", "3", "--export", str(again)).returncode == 0
    assert np.array_equal(load_npz(again).values, data.values, equal_nan=True)


def test_export_rejects_a_fleet_that_does_not_fill_nodes(tmp_path: Path):
    proc = _fleet("--gpus", "12", "--duration", "5", "--export", str(tmp_path / "x.npz"))
    assert proc.returncode == 2 and "multiple of gpus_per_node" in proc.stderr


async def _drain(bootstrap: str, prefix: str, expect_frames: int, timeout_s: float = 60):
    """Every frame of ``prefix``'s samples topic, decoded, with its key."""
    transport = open_transport(TransportConfig(bootstrap=bootstrap, topic_prefix=prefix))
    await transport.start()
    frames = []
    try:
        consumer = transport.consumer([Topics(prefix).samples], f"{prefix}-check")
        deadline = time.monotonic() + timeout_s
        while len(frames) < expect_frames and time.monotonic() < deadline:
            for msg in await consumer.getmany(timeout_ms=500, max_records=5000):
                frames.append((msg.key, decode_frame(msg.value)))
        # Nothing beyond what was expected arrives (no duplicates from the generator).
        extra = await consumer.getmany(timeout_ms=1000)
        frames.extend((m.key, decode_frame(m.value)) for m in extra)
    finally:
        await transport.close()
    return frames


def _check_agents(frames, topo: Topology, ticks: int) -> None:
    by_agent: dict[str, list[int]] = defaultdict(list)
    ticks_by_agent: dict[str, int] = defaultdict(int)
    nodes_of_agent: dict[str, set[str]] = defaultdict(set)
    for key, f in frames:
        assert key == f.identity.rack_key
        assert f.shape[1:] == (topo.gpn, len(METRICS))
        by_agent[f.agent].append(f.seq)
        ticks_by_agent[f.agent] += f.shape[0]
        nodes_of_agent[f.agent].add(f.identity.path)
    assert len(by_agent) == topo.nodes  # one logical agent per node
    assert {p for s in nodes_of_agent.values() for p in s} == {i.path for i in topo.identities}
    for agent, seqs in by_agent.items():
        assert sorted(seqs) == list(range(len(seqs))), agent  # contiguous, no duplicates
        assert seqs == sorted(seqs), agent  # in order (one partition per rack key)
        assert ticks_by_agent[agent] == ticks
    # Frames are staggered across nodes: not every node closes a frame on the same tick.
    first_lengths = {f.shape[0] for _, f in frames if f.seq == 0}
    assert len(first_lengths) > 1 or ticks == 1


@pytest.mark.kafka
def test_live_fleet_publishes_every_node_in_order(kafka_bootstrap: str, unique_prefix: str,
                                                  tmp_path: Path):
    labels = tmp_path / "labels.json"
    proc = _fleet("--gpus", "64", "--hz", "5", "--duration", "3", "--ticks-per-frame", "4",
                  "--faults", "3", "--labels", str(labels), "--bootstrap", kafka_bootstrap,
                  "--topic-prefix", unique_prefix, "--partitions", "3", "--progress", "0.5")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    topo = Topology(64)
    # 15 ticks in frames of at most 4, nodes staggered: 4 or 5 frames per node.
    assert summary["frames"] == summary["frames_acked"]
    assert 4 * topo.nodes <= summary["frames"] <= 5 * topo.nodes
    assert summary["metrics"] == 64 * 15 * len(METRICS)
    assert "metrics/s" in proc.stderr and "ack p50" in proc.stderr
    assert len(read_labels(labels)) >= 3
    frames = asyncio.run(_drain(kafka_bootstrap, unique_prefix, summary["frames"]))
    assert len(frames) == summary["frames"]
    _check_agents(frames, topo, ticks=15)
    ts = np.concatenate([f.ts for _, f in frames])
    assert abs(int(ts.min()) - summary["start_ms"]) < 50
    assert sum(f.n_values for _, f in frames) == summary["metrics"]


@pytest.mark.kafka
def test_sigterm_flushes_whole_ticks(kafka_bootstrap: str, unique_prefix: str):
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetpulse", "fleet", "--gpus", "32", "--hz", "10",
         "--duration", "0", "--ticks-per-frame", "7", "--bootstrap", kafka_bootstrap,
         "--topic-prefix", unique_prefix, "--progress", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        time.sleep(4.0)
        os.kill(proc.pid, signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["ticks"] > 5 and summary["frames_acked"] == summary["frames"]
    frames = asyncio.run(_drain(kafka_bootstrap, unique_prefix, summary["frames"]))
    assert len(frames) == summary["frames"]
    _check_agents(frames, Topology(32), ticks=summary["ticks"])


def test_fleet_serves_its_own_metrics_while_running():
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetpulse", "fleet", "--gpus", "16", "--hz", "5",
         "--duration", "0", "--ticks-per-frame", "2", "--bootstrap", "memory://fleet-test",
         "--metrics-port", str(port), "--progress", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        body = ""
        deadline = time.monotonic() + 30
        while "fleetpulse_fleet_frames_total" not in body and time.monotonic() < deadline:
            time.sleep(0.5)
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
            except OSError:
                continue
        time.sleep(1.0)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            body = r.read().decode()
        frames = [float(line.split()[-1]) for line in body.splitlines()
                  if line.startswith("fleetpulse_fleet_frames_total ")]
        assert frames and frames[0] > 0
        assert 'fleetpulse_fleet_ack_latency_seconds{quantile="0.99"}' in body
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert f"127.0.0.1:{port}/metrics" in err
    assert json.loads(out.strip().splitlines()[-1])["frames_lost"] == 0

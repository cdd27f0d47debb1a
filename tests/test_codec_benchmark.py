"""The compression benchmark end to end on tiny data (peers skipped: they need Debian
packages and minutes; the benchmark itself runs them)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from benchmarks import compression


def test_benchmark_reports_lossless_results_for_every_dataset(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rng = np.random.default_rng(5)
    ts = np.tile(1_700_000_000_000 + np.arange(300, dtype=np.int64) * 250, (3, 1))
    values = np.stack([np.round(rng.normal(50, 2, (3, 300)), 1),
                       np.cumsum(rng.integers(0, 4, (3, 300)), axis=1).astype(float)], axis=2)
    values[1, 10:20, 0] = np.nan
    npz = tmp_path / "mine.npz"
    np.savez(npz, ts=ts, values=values, metrics=np.array(
        ["fleetpulse_gpu_temperature_celsius", "fleetpulse_gpu_pcie_replay_errors_total"]))
    out = tmp_path / "compression.json"
    rc = compression.main(["--no-peers", "--gpus", "8", "--duration", "240", "--dcgm-ticks",
                           "130", "--npz", str(npz), "--out", str(out)])
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = orjson.loads(last)
    assert summary["lossless"] is True
    assert set(summary["datasets"]) == {"fleet", "fleet-varying", "dcgm", "mine"}
    for name, r in orjson.loads(out.read_bytes())["datasets"].items():
        assert r["lossless"], name
        assert 0 < r["bytes_per_sample"] < r["gorilla_bytes_per_sample"], name
        assert r["samples_finite"] > 0
    mine = orjson.loads(out.read_bytes())["datasets"]["mine"]
    assert mine["samples_finite"] == 3 * 300 * 2 - 10
    for key in ("bytes_per_sample", "encode_samples_per_s", "decode_samples_per_s"):
        assert summary[key] > 0

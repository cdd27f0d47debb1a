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
                           "130", "--npz", str(npz), "--zoo", "sparse_metrics_0p2hz",
                           "--stall-gpus", "16", "--out", str(out)])
    assert rc == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    summary = orjson.loads(last)
    assert summary["lossless"] is True
    assert set(summary["datasets"]) == {"fleet", "fleet-varying", "dcgm", "mine",
                                        "zoo:sparse_metrics_0p2hz"}
    for name, r in orjson.loads(out.read_bytes())["datasets"].items():
        assert r["lossless"], name
        assert 0 < r["bytes_per_sample"] < r["gorilla_bytes_per_sample"], name
        # compaction's entropy-coded form never grows a chunk; the store holds that form
        assert r["bytes_per_sample"] <= r["sealed_bytes_per_sample"], name
        assert r["samples_finite"] > 0
        streamed = [pm["residual_column_bytes_per_sample"] for pm in r["per_metric"].values()]
        floor = [pm["residual_entropy_bytes_per_sample"] for pm in r["per_metric"].values()]
        assert all(f >= 0 for f in floor) and (sum(floor) > 0) == (sum(streamed) > 0), name
    mine = orjson.loads(out.read_bytes())["datasets"]["mine"]
    assert mine["samples_finite"] == 3 * 300 * 2 - 10
    for key in ("bytes_per_sample", "encode_samples_per_s", "decode_samples_per_s",
                "compaction_recode_samples_per_s"):
        assert summary[key] > 0


def _tiny_series() -> list:
    from benchmarks.peers import PeerSeries

    ts = 1_767_225_600_000 + np.arange(300, dtype=np.int64) * 1000
    vals = np.round(np.sin(np.arange(300) / 7) * 100, 3)
    vals[5] = np.nan  # not sampled: peers never see it
    return [PeerSeries("fleetpulse_gpu_power_usage_watts", {"node": 'a"b', "uuid": f"GPU-{i}"},
                       ts, vals + i) for i in range(3)]


def test_openmetrics_export_is_exact_and_escaped(tmp_path: Path) -> None:
    from benchmarks.peers.prometheus import write_openmetrics

    n = write_openmetrics(_tiny_series(), tmp_path / "x.om")
    lines = (tmp_path / "x.om").read_text().splitlines()
    assert n == 3 * 299 and lines[0].startswith("# TYPE") and lines[-1] == "# EOF"
    name, value, stamp = lines[1].rsplit(" ", 2)
    assert name == 'fleetpulse_gpu_power_usage_watts{node="a\\"b",uuid="GPU-0"}'
    assert float(value) == _tiny_series()[0].values[0] and stamp == "1767225600.000"


@pytest.mark.slow
def test_peers_store_every_sample_they_are_given() -> None:
    import shutil

    from benchmarks.peers import prometheus_tsdb_bytes, victoriametrics_bytes

    if not (shutil.which("promtool") and shutil.which("victoria-metrics")):
        pytest.skip("promtool / victoria-metrics not installed (the benchmark installs them)")
    prom = prometheus_tsdb_bytes(_tiny_series())
    assert prom["samples"] == 3 * 299 and prom["chunk_bytes"] > 0
    vm = victoriametrics_bytes(_tiny_series())
    assert vm["rows"] == 3 * 299 and vm["data_bytes"] > 0


def test_a_peer_that_cannot_run_is_reported_not_fatal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    def broken(series: list) -> dict:
        raise RuntimeError("apt-get: no network")

    monkeypatch.setattr(compression, "prometheus_tsdb_bytes", broken)
    monkeypatch.setattr(compression, "victoriametrics_bytes", broken)
    out = tmp_path / "c.json"
    assert compression.main(["--gpus", "8", "--duration", "130", "--dcgm-ticks", "130",
                             "--stall-gpus", "0", "--out", str(out)]) == 0
    summary = orjson.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["victoriametrics_bytes_per_sample"] is None
    assert summary["beats_victoriametrics_everywhere"] is None
    fleet = orjson.loads(out.read_bytes())["datasets"]["fleet"]
    assert fleet["victoriametrics_error"] == "apt-get: no network"
    assert fleet["lossless"] is True

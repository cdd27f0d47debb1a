"""``fleetpulse backtest`` on real CSV files, through the CLI entry point."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from fleetpulse.cli import main

CONFIG = """
[model]
trees = 12
sample_size = 64
warmup = 150
horizon = 400
[alerts]
open_after = 3
resolve_after = 20
"""


def _write(path: Path, n: int, shift_at: int | None) -> None:
    rng = np.random.default_rng(3)
    t = np.arange(n)
    a = 10 + 2 * np.sin(2 * np.pi * t / 50) + rng.normal(0, 0.2, n)
    b = 100 + rng.normal(0, 1, n)
    if shift_at is not None:
        a[shift_at:shift_at + 40] += 12
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["when", "a", "b", "ignored"])
        for i in range(n):
            stamp = f"2026-01-01T00:{i // 60:02d}:{i % 60:02d}Z"
            w.writerow([stamp, f"{a[i]:.3f}", "" if i == 7 else f"{b[i]:.3f}", "x"])


def _read(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture
def config(tmp_path: Path) -> Path:
    p = tmp_path / "detector.toml"
    p.write_text(CONFIG)
    return p


def test_backtest_scores_every_row_and_flags_the_injected_shift(tmp_path: Path,
                                                                config: Path) -> None:
    src, out = tmp_path / "in.csv", tmp_path / "scores.csv"
    _write(src, 600, shift_at=450)
    rc = main(["backtest", str(src), "--time-column", "when", "--columns", "a,b",
               "--out", str(out), "--config", str(config)])
    assert rc == 0
    rows = _read(out)
    assert list(rows[0]) == ["timestamp", "score", "threshold", "anomaly"]
    assert len(rows) == 600 and rows[0]["timestamp"] == "2026-01-01T00:00:00Z"
    anomaly = np.array([int(r["anomaly"]) for r in rows])
    assert anomaly[:450].sum() == 0  # cold start and normal history stay quiet
    assert anomaly[450:470].any()
    score = np.array([float(r["score"]) for r in rows])
    thr = np.array([float(r["threshold"]) for r in rows])
    first = 450 + int(np.argmax(anomaly[450:]))
    assert (score[first - 2:first + 1] > thr[first - 2:first + 1]).all()


def test_backtest_is_quiet_on_ordinary_history(tmp_path: Path, config: Path) -> None:
    src, out = tmp_path / "in.csv", tmp_path / "scores.csv"
    _write(src, 600, shift_at=None)
    assert main(["backtest", str(src), "--time-column", "when", "--columns", "a",
                 "--out", str(out), "--config", str(config)]) == 0
    assert sum(int(r["anomaly"]) for r in _read(out)) == 0


def test_backtest_names_a_missing_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    src = tmp_path / "in.csv"
    _write(src, 20, None)
    rc = main(["backtest", str(src), "--time-column", "when", "--columns", "a,nope",
               "--out", str(tmp_path / "o.csv")])
    assert rc == 2
    assert "nope" in capsys.readouterr().err

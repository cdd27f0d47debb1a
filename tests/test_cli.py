"""The CLI lists only commands that work: every listed command answers --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from fleetpulse.cli import COMMANDS, build_parser


def _fleetpulse(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fleetpulse", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_help_lists_every_registered_command() -> None:
    out = _fleetpulse("--help")
    assert out.returncode == 0, out.stderr
    for name in COMMANDS:
        assert name in out.stdout


def test_every_command_has_help() -> None:
    parser = build_parser()
    for name in COMMANDS:
        try:
            parser.parse_args([name, "--help"])
        except SystemExit as exc:
            assert exc.code == 0, name
        else:
            raise AssertionError(f"{name} --help did not exit")


def test_bench_runs_a_benchmark_by_name(tmp_path: Path) -> None:
    out = _fleetpulse("bench", "frame", "--seconds", "0.3", "--json", "--out", str(tmp_path / "f.json"))
    assert out.returncode == 0, out.stderr
    result = orjson.loads(out.stdout.strip().splitlines()[-1])
    assert result["decode_metrics_per_s"] > 0 and result["metrics_per_frame"] > 0
    assert orjson.loads((tmp_path / "f.json").read_bytes()) == result


def test_bench_unknown_name() -> None:
    out = _fleetpulse("bench", "nope")
    assert out.returncode == 2 and "available" in out.stderr

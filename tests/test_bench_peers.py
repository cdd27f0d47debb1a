"""A benchmark whose peer is not installed measures fleetpulse and names the peer in one line.

The peers (the ``bench`` extra) are installed where the test command runs, so "missing" is
made here by blocking the import (``sys.modules[name] = None`` makes ``import name`` raise
ModuleNotFoundError, exactly as an absent package does).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import numpy as np
import pytest

from benchmarks.peers import optional
from benchmarks.peers.optional import BENCH_EXTRA, import_peer, missing_peers


@pytest.fixture(autouse=True)
def fresh_reports() -> Iterator[None]:
    """Each test starts with nothing reported (the helper prints each peer once a process)."""
    saved = dict(optional._reported)
    optional._reported.clear()
    yield
    optional._reported.clear()
    optional._reported.update(saved)


def test_missing_peer_is_one_line_naming_it_and_the_install(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "ddsketch", None)
    assert import_peer("ddsketch") is None
    assert import_peer("ddsketch") is None  # asked twice, said once
    out, err = capsys.readouterr()
    assert out == ""  # stdout's last line stays the benchmark's JSON
    lines = err.splitlines()
    assert len(lines) == 1 and "ddsketch" in lines[0] and BENCH_EXTRA in lines[0]
    assert "Traceback" not in err
    assert missing_peers() == ["ddsketch"]


def test_a_present_peer_is_returned_and_a_broken_one_is_not_hidden(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert import_peer("json") is sys.modules["json"]
    assert missing_peers() == []

    def broken_import(name: str) -> None:  # installed, but one of its own imports fails
        raise ImportError("No module named 'its_dependency'", name="its_dependency")

    monkeypatch.setattr(optional.importlib, "import_module", broken_import)
    with pytest.raises(ImportError, match="its_dependency"):
        import_peer("somepeer")
    assert missing_peers() == []


def test_query_baseline_without_ddsketch_is_left_out(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from benchmarks import query

    msgs = query._frames(nodes=8, seconds=10, ticks=5)
    assert query._baseline(msgs) is not None  # with the peer: measured
    monkeypatch.setitem(sys.modules, "ddsketch", None)
    assert query._baseline(msgs) is None
    assert "peer ddsketch not measured" in capsys.readouterr().err


def _engine_figures(spearman: float | None) -> dict[str, object]:
    return {"updates_per_s": 21_000, "bytes_per_model": 261_816, "rss_bytes_per_model": 250_000,
            "checkpoint_bytes": 176_000, "spearman_vs_krcf": spearman,
            "synthetic": {"auc": 0.94, "recall_at_fpr": 0.3, "recall_by_kind": {}, "events": 9},
            "fleet": {"auc": 0.83, "recall_at_fpr": 0.06, "updates_per_s": 20_000}}


def test_forest_summary_and_table_without_krcf(capsys: pytest.CaptureFixture[str]) -> None:
    """Only numba ran: its figures are there, every krcf figure is None, the table prints."""
    from benchmarks import forest

    spread = {"seeds": [7, 8], "numba": {"auc": {"min": 0.9, "mean": 0.91, "max": 0.92}}}
    result = {"engines": {"numba": _engine_figures(None)}, "krcf_self_spearman": None,
              "seed_spread": spread, "fleet_seed_spread": spread}
    summary = forest.summarise(result)
    assert summary["updates_per_s"] == 21_000 and summary["auc"] == 0.94
    assert summary["fleet_auc"] == 0.83 and summary["auc_mean"] == 0.91
    for key in ("krcf_updates_per_s", "speedup_vs_krcf", "spearman_vs_krcf", "krcf_auc",
                "krcf_fleet_auc", "spearman_vs_krcf_mean", "krcf_auc_mean", "krcf_fleet_auc_mean"):
        assert summary[key] is None, key
    assert summary["targets_met"]["spearman_vs_krcf"] is None
    result["summary"] = summary
    forest.print_table(result)
    out = capsys.readouterr().out
    assert "numba" in out and "krcf" not in out.split("\n", 1)[1]


def test_forest_summary_with_krcf_compares() -> None:
    from benchmarks import forest

    krcf = {**_engine_figures(None), "updates_per_s": 3_500}
    result = {"engines": {"numba": _engine_figures(0.905), "krcf": krcf,
                          "krcf_other_seed": _engine_figures(None)},
              "krcf_self_spearman": 0.917}
    summary = forest.summarise(result)
    assert summary["speedup_vs_krcf"] == 6.0 and summary["krcf_fleet_auc"] == 0.83
    assert summary["targets_met"]["spearman_vs_krcf"] is True
    assert np.isclose(summary["krcf_self_spearman"], 0.917)

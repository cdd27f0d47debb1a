"""The remediation hook (detector.remediation): dry-run by default, real commands when
asked, and a circuit breaker that stops at its limits."""

from __future__ import annotations

import sys
from pathlib import Path

from prometheus_client import generate_latest

from detector.config import RemediationConfig
from detector.remediation import RemediationHook
from detector.service import Stats
from schemas.records import Action, AlertState, IncidentRecord, Severity

T = 1_767_225_600_000


def _incident(root: str, t_s: float, action: Action = Action.DRAIN_REBOOT,
              iid: str = "") -> IncidentRecord:
    ts = T + int(t_s * 1000)
    return IncidentRecord(
        id=iid or f"inc-{root}-{ts}", root=root, level="gpu", state=AlertState.FIRING,
        severity=Severity.CRITICAL, cause="xid:79", action=action, summary="", started_ms=ts,
        updated_ms=ts, members=("a",))


async def test_dry_run_is_the_default_and_runs_nothing(tmp_path: Path) -> None:
    mark = tmp_path / "ran"
    hook = RemediationHook(RemediationConfig(drain_reboot=f"touch {mark}"))
    d = await hook.handle(_incident("c/r/rack-1/node-1/gpu-2", 0), rack_nodes=8)
    assert d is not None and d.outcome == "dry_run" and d.command == ("touch", str(mark))
    assert not mark.exists()
    # once per incident and action; no template for an action: nothing to decide
    assert await hook.handle(_incident("c/r/rack-1/node-1/gpu-2", 0), rack_nodes=8) is None
    assert await hook.handle(_incident("c/r/rack-1/node-2/gpu-0", 1, Action.CHECK_COOLING),
                             rack_nodes=8) is None


async def test_live_commands_run_without_a_shell_and_failures_count(tmp_path: Path) -> None:
    hook = RemediationHook(RemediationConfig(
        dry_run=False, drain_reboot=f"{sys.executable} -c "
        f"\"import sys,pathlib; pathlib.Path(sys.argv[1]).write_text(sys.argv[2])\" "
        f"{tmp_path}/{{node}} {{reason}}",
        reset_gpu=f"{sys.executable} -c \"raise SystemExit(3)\""))
    d = await hook.handle(_incident("c/r/rack-1/node-7/gpu-2", 0, iid="inc-1"), rack_nodes=8)
    assert d is not None and d.outcome == "ran", d
    assert (tmp_path / "node-7").read_text() == "fleetpulse xid:79 inc-1"
    d = await hook.handle(_incident("c/r/rack-2/node-1/gpu-0", 5, Action.RESET_GPU),
                          rack_nodes=8)
    assert d is not None and d.outcome == "failed" and "exit 3" in d.detail


async def test_the_circuit_breaker_stops_at_its_limits() -> None:
    stats = Stats()
    hook = RemediationHook(RemediationConfig(drain_reboot="scontrol update nodename={node}",
                                             max_nodes_per_hour=3, max_rack_fraction=0.25))
    stats.remediation = hook.counts
    out = []
    # rack-1 has 8 nodes: 25 % is 2 of them
    for k, node in enumerate(["rack-1/node-0", "rack-1/node-1", "rack-1/node-2",
                              "rack-2/node-0", "rack-3/node-0"]):
        d = await hook.handle(_incident(f"c/r/{node}/gpu-0", 60 * k), rack_nodes=8)
        assert d is not None
        out.append(d.outcome)
    assert out == ["dry_run", "dry_run", "refused_rack", "dry_run", "refused_rate"]
    # a rack-wide incident is never automated
    d = await hook.handle(_incident("c/r/rack-4", 400), rack_nodes=8)
    assert d is not None and d.outcome == "not_node"
    # an hour later the rate allows new nodes again; rack-1 stays at its share for a day
    d = await hook.handle(_incident("c/r/rack-5/node-0/gpu-0", 3700), rack_nodes=8)
    assert d is not None and d.outcome == "dry_run"
    d = await hook.handle(_incident("c/r/rack-1/node-5/gpu-0", 3800), rack_nodes=8)
    assert d is not None and d.outcome == "refused_rack"
    scrape = generate_latest(stats.registry).decode()
    assert ('fleetpulse_detector_remediation_total{action="drain_reboot",outcome="dry_run"} 4.0'
            in scrape)
    assert ('fleetpulse_detector_remediation_total{action="drain_reboot",'
            'outcome="refused_rack"} 2.0') in scrape

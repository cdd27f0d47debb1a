"""Alert consumers: ``fleetpulse alerts tail`` (table and JSON) and the Alertmanager webhook's
format (its delivery to a real Alertmanager is tests/test_alertmanager.py's)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest

from detector.webhook import AlertmanagerWebhook, to_alertmanager
from fleetpulse.cli import main
from fleetpulse.config import TransportConfig
from fleetpulse.transport import open_transport
from schemas.records import AlertRecord, AlertState, Attribution, Severity
from schemas.topics import Topics

T = 1_767_225_600_000


def _alert(state: AlertState, entity: str = "c1/row-a/rack-3/node-17/gpu-5",
           source: str = "model:numba") -> AlertRecord:
    return AlertRecord(
        id="a1b2c3", entity=entity, level="gpu", state=state, severity=Severity.WARNING,
        source=source, summary="GPU behaves unlike its history", score=3.25, threshold=1.9,
        started_ms=T, updated_ms=T + (0 if state is AlertState.FIRING else 120_000),
        attribution=(Attribution("fleetpulse_gpu_temperature_celsius", "high", 0.71),
                     Attribution("fleetpulse_gpu_utilization_ratio", "low", 0.2)),
        context={"utilization_state": "idle"})


def _publish(bootstrap: str, records: list[AlertRecord], junk: bool = False) -> None:
    async def go() -> None:
        transport = open_transport(TransportConfig(bootstrap=bootstrap))
        await transport.start()
        topics = Topics()
        await transport.ensure_topics({topics.alerts: 2})
        if junk:
            await transport.send_and_wait(topics.alerts, b"{]", key=b"x")
        for rec in records:
            await transport.send_and_wait(topics.alerts, rec.to_bytes(), key=rec.key)
        await transport.close()

    asyncio.run(go())


def test_tail_prints_a_readable_table(capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = f"memory://tail-{uuid.uuid4().hex}"
    _publish(bootstrap, [_alert(AlertState.FIRING), _alert(AlertState.RESOLVED)], junk=True)
    rc = main(["alerts", "tail", "--bootstrap", bootstrap, "--from-beginning",
               "--idle-exit", "1"])
    out, err = capsys.readouterr()
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("time (UTC)")
    assert "FIRING" in lines[1] and "resolved" in lines[2]
    assert "c1/row-a/rack-3/node-17/gpu-5" in lines[1]
    assert "temperature_celsius high 71%" in lines[1]
    assert "3.25/1.90" in lines[1]
    assert "not an alert record" in err


def test_tail_json_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = f"memory://tail-{uuid.uuid4().hex}"
    sent = [_alert(AlertState.FIRING), _alert(AlertState.RESOLVED)]
    _publish(bootstrap, sent)
    assert main(["alerts", "tail", "--bootstrap", bootstrap, "--from-beginning", "--json",
                 "--idle-exit", "1"]) == 0
    got = [AlertRecord.from_bytes(line.encode())
           for line in capsys.readouterr().out.splitlines()]
    assert got == sent


def test_tail_pages_leaves_the_signals_out(capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = f"memory://tail-{uuid.uuid4().hex}"
    signal = dataclasses.replace(_alert(AlertState.FIRING), id="s1", severity=Severity.INFO)
    page = _alert(AlertState.FIRING, source="rule:thermal_excess")
    _publish(bootstrap, [signal, page])
    assert main(["alerts", "tail", "--bootstrap", bootstrap, "--from-beginning", "--json",
                 "--idle-exit", "1", "--pages"]) == 0
    got = [AlertRecord.from_bytes(line.encode())
           for line in capsys.readouterr().out.splitlines()]
    assert got == [page]


def test_alertmanager_format() -> None:
    fire = to_alertmanager(_alert(AlertState.FIRING))
    assert fire["labels"] == {
        "alertname": "fleetpulse_anomaly_gpu", "entity": "c1/row-a/rack-3/node-17/gpu-5",
        "level": "gpu", "source": "model:numba", "severity": "warning", "cluster": "c1",
        "row": "row-a", "rack": "rack-3", "node": "node-17", "gpu": "gpu-5",
        "action": "none"}
    assert fire["startsAt"] == "2026-01-01T00:00:00Z" and "endsAt" not in fire
    assert "fleetpulse_gpu_temperature_celsius high" in fire["annotations"]["attribution"]
    done = to_alertmanager(_alert(AlertState.RESOLVED, source="rule:xid"))
    assert done["endsAt"] == "2026-01-01T00:02:00Z"
    assert done["labels"]["alertname"] == "fleetpulse_xid"


async def test_webhook_survives_an_unreachable_alertmanager() -> None:
    hook = AlertmanagerWebhook("http://127.0.0.1:9", timeout_s=2)
    try:
        assert not await hook.deliver([_alert(AlertState.FIRING)])
    finally:
        await hook.close()
    assert hook.failures == 1

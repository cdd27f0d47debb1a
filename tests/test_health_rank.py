"""The worst GPUs (fleetpulse.health_rank): ranked from the alerts topic by incidents,
hardware events (once per incident), throttled and lost time; as ``fleetpulse health top``
and as the page's ``/web/health`` endpoint."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid

import aiohttp
import pytest
from aiohttp import web

from detector.incidents import Correlator
from fleetpulse.cli import main
from fleetpulse.config import TransportConfig
from fleetpulse.health_rank import HealthRank, parse_window
from fleetpulse.transport import open_transport
from fleetpulse.web import AlertBoard, add_web_routes
from schemas.records import AlertRecord, AlertState, IncidentRecord, Severity
from schemas.topics import Topics

T = 1_767_225_600_000
A, B, C = (f"c1/row-a/rack-1/node-{n}/gpu-0" for n in range(3))


def _alert(entity: str, source: str, t_s: float, **context: object) -> AlertRecord:
    ts = T + int(t_s * 1000)
    return AlertRecord(
        id=f"{entity}|{source}|{ts}", entity=entity, level="gpu", state=AlertState.FIRING,
        severity=Severity.CRITICAL, source=source, summary=source, score=1.0, threshold=1.0,
        started_ms=ts, updated_ms=ts, context=dict(context))


def _end(rec: AlertRecord, t_s: float) -> AlertRecord:
    return dataclasses.replace(rec, state=AlertState.RESOLVED, updated_ms=T + int(t_s * 1000))


def _history() -> list[AlertRecord | IncidentRecord]:
    """Through the real correlator: A has two XID 48s (each seen by the metric and the
    event rule), B throttled 300 s, C was lost 600 s, all within the last hour; A also had
    an XID 79 two days before."""
    c = Correlator()
    steps: list[list[AlertRecord]] = []
    old = _alert(A, "rule:xid", -2 * 86400, value=79.0)
    steps += [[old], [_end(old, -2 * 86400 + 60)]]
    for k in range(2):
        m = _alert(A, "rule:xid", 600 * k, value=48.0)
        e = _alert(A, "rule:event_xid", 600 * k + 1, xid=48)
        steps += [[m, e], [_end(m, 600 * k + 60), _end(e, 600 * k + 60)]]
    b = _alert(B, "rule:thermal_slowdown", 100)
    lost = _alert(C, "rule:gpu_lost", 200)
    steps += [[b, lost], [_end(b, 400)], [_end(lost, 800)]]
    out: list[AlertRecord | IncidentRecord] = []
    for batch in steps:
        alerts, incidents = c.observe(batch)
        out += [*alerts, *incidents]
    return out


def test_ranks_by_incidents_then_hardware_events_then_lost_time() -> None:
    rank = HealthRank()
    for rec in _history():
        rank.add(rec)
    top = rank.top(parse_window("1h"), now_ms=T + 3_000_000)
    assert [(h.gpu, h.incidents, h.xids, h.throttled_s, h.lost_s) for h in top] == [
        (A, 2, 2, 0.0, 0.0), (C, 1, 0, 0.0, 600.0), (B, 1, 0, 300.0, 0.0)]
    week = rank.top(parse_window("7d"), limit=1, now_ms=T + 3_000_000)
    assert [(h.gpu, h.incidents, h.xids) for h in week] == [(A, 3, 3)]
    with pytest.raises(ValueError, match="window"):
        parse_window("7 days")


def test_health_top_reads_the_alerts_topic(capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = f"memory://health-{uuid.uuid4().hex}"

    async def publish() -> None:
        transport = open_transport(TransportConfig(bootstrap=bootstrap))
        await transport.start()
        topics = Topics()
        await transport.ensure_topics({topics.alerts: 2})
        for rec in _history():
            await transport.send_and_wait(topics.alerts, rec.to_bytes(), key=rec.key)
        await transport.close()

    asyncio.run(publish())
    assert main(["health", "top", "--bootstrap", bootstrap, "--window", "1h", "--json",
                 "--idle-s", "1"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert [g["gpu"] for g in got["gpus"]] == [A, C, B]
    assert main(["health", "top", "--bootstrap", bootstrap, "--window", "soon"]) == 2
    assert "window must be" in capsys.readouterr().err


async def test_the_page_serves_the_ranking_and_answers_bad_input_in_its_error_shape() -> None:
    board = AlertBoard(clock=lambda: T + 3_000_000)
    for rec in _history():
        if isinstance(rec, IncidentRecord):
            board.add_incident(rec)
        else:
            board.add(rec)
    app = web.Application()
    add_web_routes(app, board)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}/web/health"
    try:
        async with aiohttp.ClientSession() as s:
            async with s.get(url, params={"window": "1h", "limit": "2"}) as r:
                body = await r.json()
            assert r.status == 200 and [g["gpu"] for g in body["data"]["gpus"]] == [A, C]
            async with s.get(url, params={"window": "-1d"}) as r:
                bad = await r.json()
            assert r.status == 400 and bad["status"] == "error"
            assert bad["errorType"] == "bad_data" and "window" in bad["error"]
    finally:
        await runner.cleanup()

"""Alerts and incidents against a real Alertmanager (Debian's, with deploy/alertmanager.yml):
a rack cooling fault arrives as one group, the rack incident holds back its GPUs' warnings,
resolution reaches it, and what happens while it is unreachable or down arrives later."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from alertmanager import Alertmanager, needs_alertmanager

from detector.incidents import Correlator
from detector.webhook import AlertmanagerWebhook
from schemas.records import AlertRecord, AlertState, Severity

pytestmark = needs_alertmanager

RACK = "c1/row-a/rack-3"


@pytest.fixture
def am(tmp_path: Path) -> Iterator[Alertmanager]:
    server = Alertmanager(tmp_path / "am")
    server.start()
    try:
        yield server
    finally:
        server.stop()


def _alert(entity: str, source: str, t0_ms: int, dt_s: float,
           severity: Severity = Severity.WARNING, **context: object) -> AlertRecord:
    ts = t0_ms + int(dt_s * 1000)
    return AlertRecord(
        id=f"{entity}|{source}|{ts}", entity=entity,
        level="rack" if entity.count("/") == 2 else "gpu", state=AlertState.FIRING,
        severity=severity, source=source, summary=source, score=1.0, threshold=1.0,
        started_ms=ts, updated_ms=ts, context=dict(context))


def _resolve(rec: AlertRecord) -> AlertRecord:
    return dataclasses.replace(rec, state=AlertState.RESOLVED,
                               updated_ms=int(time.time() * 1000))


async def _until(check: Callable[[], Any], timeout_s: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = await asyncio.to_thread(check)
        if got or time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.2)


def _ids(alerts: list[dict[str, Any]]) -> set[str]:
    return {a["annotations"]["alert_id"] for a in alerts}


async def _send(c: Correlator, hook: AlertmanagerWebhook, records: list[AlertRecord]) -> bool:
    alerts, incidents = c.observe(records)
    return await hook.deliver(alerts, incidents)


async def test_a_cooling_fault_is_one_group_its_gpu_warnings_held_back(
        am: Alertmanager) -> None:
    t0 = int(time.time() * 1000) - 120_000
    c = Correlator()
    hook = AlertmanagerWebhook(am.url, timeout_s=5)
    gpus = [_alert(f"{RACK}/node-{n}/gpu-{g}", "rule:thermal_slowdown", t0, n + g / 10)
            for n in range(3) for g in range(2)]
    xid = _alert(f"{RACK}/node-4/gpu-1", "rule:xid", t0, 5, Severity.CRITICAL, value=79.0)
    rack = _alert(RACK, "rule:rack_heat", t0, 30)
    try:
        # the GPUs throttle first (each its own incident), then the rack alert explains them
        assert await _send(c, hook, [*gpus, xid])
        assert await _send(c, hook, [rack])
        rack_inc = c.incident_of(rack.id)
        cooling = {a.id for a in gpus} | {rack.id}

        def one_group() -> list[dict[str, Any]]:
            groups = [g for g in am.groups() if _ids(g["alerts"]) & cooling]
            return groups if len(groups) == 1 and _ids(groups[0]["alerts"]) == cooling else []

        (group,) = await _until(one_group)
        assert group["labels"] == {"incident": rack_inc}
        alerts = {a["annotations"]["alert_id"]: a for a in am.alerts()}
        assert alerts[rack.id]["status"]["state"] == "active"
        assert alerts[rack.id]["labels"]["action"] == "check_cooling"
        for g in gpus:  # inhibited by the rack alert of their incident
            assert alerts[g.id]["status"]["state"] == "suppressed", alerts[g.id]
            assert alerts[g.id]["status"]["inhibitedBy"]
        # the XID on the same rack is another cause: its own group, not held back
        assert alerts[xid.id]["status"]["state"] == "active"
        assert alerts[xid.id]["labels"]["incident"] not in ("", rack_inc)
        assert alerts[xid.id]["labels"]["action"] == "drain_reboot"
        assert len(alerts) == len(cooling) + 1  # the GPUs' first labels were resolved
        # resolution reaches it: resolved alerts leave its list at once
        assert await _send(c, hook, [_resolve(r) for r in (*gpus, rack)])
        assert _ids(await _until(lambda: [a for a in am.alerts()
                                          if a["annotations"]["alert_id"] != xid.id] == []
                                 and am.alerts())) == {xid.id}
    finally:
        await hook.close()


async def test_forest_signals_reach_their_own_receiver_and_hold_back_nothing(
        am: Alertmanager) -> None:
    t0 = int(time.time() * 1000) - 120_000
    c = Correlator()
    hook = AlertmanagerWebhook(am.url, timeout_s=5)
    rack_signal = _alert(RACK, "model:numba:rack", t0, 0, Severity.INFO)
    gpu_signal = _alert(f"{RACK}/node-1/gpu-0", "model:numba", t0, 1, Severity.INFO)
    warning = _alert(f"{RACK}/node-2/gpu-3", "rule:clock_deficit", t0, 2)
    try:
        assert await _send(c, hook, [rack_signal, gpu_signal, warning])
        signals = {rack_signal.id, gpu_signal.id}

        def routed() -> dict[str, set[str]]:
            got: dict[str, set[str]] = {}
            for g in am.groups():
                got.setdefault(g["receiver"]["name"], set()).update(_ids(g["alerts"]))
            return got if got.get("signals") == signals and warning.id in got.get("sre", ())\
                else {}

        assert await _until(routed)
        alerts = {a["annotations"]["alert_id"]: a for a in am.alerts()}
        assert "incident" not in alerts[gpu_signal.id]["labels"]
        # a rack signal is no rack incident: the GPU warning on its rack still notifies
        assert alerts[warning.id]["status"]["state"] == "active", alerts[warning.id]
    finally:
        await hook.close()


class _Link:
    """A TCP forwarder in front of the Alertmanager: ``cut()`` makes it unreachable (the
    network fails, Alertmanager keeps its state), ``restore()`` brings it back."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.server: asyncio.Server | None = None
        self.port = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def restore(self) -> None:
        self.server = await asyncio.start_server(self._pipe, "127.0.0.1", self.port,
                                                 reuse_address=True)
        self.port = self.server.sockets[0].getsockname()[1]

    async def cut(self) -> None:
        assert self.server is not None
        self.server.close()
        for w in self.writers:
            w.close()
        self.writers.clear()
        await self.server.wait_closed()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_r, up_w = await asyncio.open_connection("127.0.0.1", self.target_port)
        self.writers += [writer, up_w]

        async def copy(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, OSError):
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            w.close()

        await asyncio.gather(copy(reader, up_w), copy(up_r, writer))


@contextlib.asynccontextmanager
async def _link(port: int) -> AsyncIterator[_Link]:
    link = _Link(port)
    await link.restore()
    try:
        yield link
    finally:
        if link.server is not None and link.server.is_serving():
            await link.cut()


async def test_what_happens_while_it_is_unreachable_or_down_arrives_later(
        am: Alertmanager) -> None:
    t0 = int(time.time() * 1000) - 60_000
    c = Correlator()
    x = _alert(f"{RACK}/node-0/gpu-0", "rule:ecc_dbe", t0, 0, Severity.CRITICAL)
    y = _alert(f"{RACK}/node-1/gpu-0", "rule:gpu_lost", t0, 10, Severity.CRITICAL)
    z = _alert(f"{RACK}/node-2/gpu-0", "rule:xid", t0, 20, Severity.CRITICAL, value=48.0)
    async with _link(am.port) as link:
        hook = AlertmanagerWebhook(f"http://127.0.0.1:{link.port}", timeout_s=2,
                                   resend_s=3600, retry_s=0.2)
        try:
            assert await _send(c, hook, [x])
            assert _ids(await _until(am.alerts)) == {x.id}
            # the network fails: x resolves and y fires meanwhile
            await link.cut()
            assert not await _send(c, hook, [_resolve(x), y])
            assert hook.failures == 1
            assert _ids(am.alerts()) == {x.id}  # it still believes x is firing
            await link.restore()
            await asyncio.sleep(0.3)
            await hook.resend_due()
            assert _ids(await _until(lambda: _ids(am.alerts()) == {y.id} and am.alerts())) \
                == {y.id}  # x's resolution and y both arrived
            assert not hook.unsent
            # now Alertmanager itself goes down (it keeps no alerts) and comes back
            am.stop()
            assert not await _send(c, hook, [z])
            am.start()
            await asyncio.sleep(0.3)
            await hook.resend_due()
            assert _ids(await _until(lambda: len(am.alerts()) == 2 and am.alerts())) \
                == {y.id, z.id}
        finally:
            await hook.close()

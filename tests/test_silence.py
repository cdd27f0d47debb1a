"""Senders that stop (detector.silence): a rack that goes dark is one incident, a silent node
another, a blank exporter is an alert of its own, an orderly stop is none."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from test_detector_service import _read_all, _run_until
from test_detector_support import frame, healthy, small_config, timestamps

from detector.incidents import Correlator
from detector.service import DetectorService
from detector.silence import SilenceWatch
from fleetpulse.config import TransportConfig
from fleetpulse.transport import open_transport
from schemas.errors import DecodeError
from schemas.frame import encode_frame
from schemas.records import (
    AlertRecord,
    AlertState,
    IncidentRecord,
    Severity,
    decode_alerts_topic,
)
from schemas.topics import Topics

T = 1_767_225_600_000


def _feed(watch: SilenceWatch, nodes: dict[str, int], t_s: float) -> None:
    for name, reporting in nodes.items():
        watch.seen(0, name, T + int(t_s * 1000), reporting)


def test_a_rack_going_dark_is_one_rack_alert_and_a_node_one_node_alert() -> None:
    watch = SilenceWatch(silent_after_s=30)
    rack_a = {f"c/r/rack-a/node-{i}": 8 for i in range(4)}
    rack_b = {f"c/r/rack-b/node-{i}": 8 for i in range(4)}
    out: list[AlertRecord] = []
    for t in range(0, 200, 5):
        # rack a's node-3 stops at 100 s while the rest of rack a reports
        _feed(watch, {k: v for k, v in rack_a.items() if t < 100 or not k.endswith("node-3")},
              t)
        if t < 60:  # rack b goes dark at 60 s, its nodes' last frames a few s apart
            _feed(watch, {k: v for i, (k, v) in enumerate(rack_b.items()) if t < 50 + 5 * i}, t)
        out += watch.tick({0: T + t * 1000})
    fired = [(a.entity, a.level, (a.started_ms - T) // 1000) for a in out
             if a.state is AlertState.FIRING]
    assert fired == [("c/r/rack-b", "rack", 85), ("c/r/rack-a/node-3", "node", 125)]
    assert all(a.action.value == "check_node" for a in out)


def test_a_silent_node_and_its_lost_gpus_are_one_incident() -> None:
    watch = SilenceWatch(silent_after_s=30)
    c = Correlator()
    nodes = {f"c/r/rack-a/node-{i}": 8 for i in range(3)}
    incidents: list[IncidentRecord] = []
    for t in range(0, 120, 5):
        _feed(watch, {k: v for k, v in nodes.items() if t < 40 or not k.endswith("node-1")}, t)
        alerts = watch.tick({0: T + t * 1000})
        if t == 55:  # the GPU rule saw the node's GPUs stop first (stale_after_s < 30 s)
            alerts = [AlertRecord(
                id=f"lost-{g}", entity=f"c/r/rack-a/node-1/gpu-{g}", level="gpu",
                state=AlertState.FIRING, severity=Severity.CRITICAL, source="rule:gpu_lost",
                summary="lost", score=1.0, threshold=1.0, started_ms=T + 55_000,
                updated_ms=T + 55_000) for g in range(8)] + alerts
        incidents += c.observe(alerts)[1]
    final = {i.id: i for i in incidents}  # each incident's newest transition
    (last,) = [i for i in final.values() if not i.merged_into]
    assert last.root == "c/r/rack-a/node-1" and last.cause == "silent"
    assert len(last.members) == 9 and last.action.value == "check_node"


def test_a_blank_exporter_is_an_alert_and_an_orderly_stop_none() -> None:
    watch = SilenceWatch(silent_after_s=30)
    out: list[AlertRecord] = []
    for t in range(0, 150, 5):
        blank = 0 if 40 <= t < 100 else 8
        _feed(watch, {"c/r/rack-a/node-0": blank, "c/r/rack-a/node-1": 8}, t)
        if t < 50:
            _feed(watch, {"c/r/rack-a/node-2": 8}, t)
        elif t == 50:
            watch.left("c/r/rack-a/node-2")  # agent_stop: maintenance, not silence
        out += watch.tick({0: T + t * 1000})
    got = [(a.entity, a.source, a.state.value, (a.updated_ms - T) // 1000) for a in out]
    assert got == [("c/r/rack-a/node-0", "rule:exporter_blank", "firing", 65),
                   ("c/r/rack-a/node-0", "rule:exporter_blank", "resolved", 100)]


class _TwoRacks:
    """A detector's config and memory transport, and two racks of two nodes x 4 GPUs whose
    frames (5 ticks each, 150 s of healthy data) ``send`` publishes."""

    SENDERS = (("rack-1", "node-0"), ("rack-1", "node-1"), ("rack-2", "node-0"),
               ("rack-2", "node-1"))

    def __init__(self, tmp_path: Path) -> None:
        self.config = small_config(
            transport=TransportConfig(bootstrap=f"memory://{uuid.uuid4().hex}"),
            state_dir=tmp_path / "state", partitions=1, metrics_port=-1, shed_after_s=0.0,
            batch_wait_s=0.05)
        self.transport = open_transport(self.config.transport)
        self.topics = Topics()
        self.steps = 150
        self.data, self.ts = healthy(self.steps, 16, seed=3), timestamps(self.steps)

    async def start(self) -> None:
        await self.transport.start()
        t = self.topics
        await self.transport.ensure_topics({t.samples: 1, t.events: 1, t.alerts: 1,
                                            t.deadletter: 1})

    async def send(self, first: int, last: int, racks: tuple[str, ...]) -> int:
        """Frames of steps ``first..last`` of the nodes in ``racks``; how many."""
        n = 0
        for s in range(first, last, 5):
            for k, (rack, node) in enumerate(self.SENDERS):
                if rack in racks:
                    f = frame(node, rack, self.ts[s:s + 5],
                              self.data[s:s + 5, 4 * k:4 * k + 4], seq=s // 5)
                    await self.transport.send(self.topics.samples, encode_frame(f),
                                              key=f.identity.rack_key)
                    n += 1
        await self.transport.flush()
        return n

    async def records(self) -> list[AlertRecord | IncidentRecord]:
        """Everything on the alerts topic; closes the transport."""
        msgs = await _read_all(self.transport, self.topics.alerts)
        await self.transport.close()
        return [decode_alerts_topic(m.value) for m in msgs]


async def test_the_service_raises_one_incident_for_a_rack_that_goes_silent(
        tmp_path: Path) -> None:
    fleet = _TwoRacks(tmp_path)
    await fleet.start()
    await fleet.send(0, 60, ("rack-1", "rack-2"))
    await fleet.send(60, fleet.steps, ("rack-1",))  # rack 2 loses power at 60 s
    service = DetectorService(fleet.config, fleet.transport)
    await _run_until(service, lambda: service.stats.frames >= 30 * 2 + 12 * 2
                     and service.silence.open, timeout=60)
    await asyncio.sleep(0)
    records = await fleet.records()
    incidents = {r.id: r for r in records if isinstance(r, IncidentRecord)}
    silent = [i for i in incidents.values() if i.cause == "silent"]
    assert [(i.root, i.level, i.action.value) for i in silent] == [
        ("c1/row-a/rack-2", "rack", "check_node")]
    assert not any(isinstance(r, AlertRecord) and r.entity.startswith("c1/row-a/rack-1")
                   and r.source == "rule:silent" for r in records)
    on_rack_2 = [i for i in incidents.values()
                 if i.root.startswith("c1/row-a/rack-2") and not i.merged_into]
    assert len(on_rack_2) == 1


async def test_a_rack_that_goes_dark_while_the_detector_restarts_is_found_silent(
        tmp_path: Path) -> None:
    fleet = _TwoRacks(tmp_path)
    await fleet.start()
    sent = await fleet.send(0, 60, ("rack-1", "rack-2"))
    first = DetectorService(fleet.config, fleet.transport)
    await _run_until(first, lambda: first.stats.frames >= sent, timeout=60)
    assert not first.silence.open
    # rack 2 loses power while no detector runs; rack 1 goes on
    sent = await fleet.send(60, fleet.steps, ("rack-1",))
    second = DetectorService(fleet.config, fleet.transport)
    await _run_until(second, lambda: second.stats.frames >= sent and second.silence.open,
                     timeout=60)
    silent = [r for r in await fleet.records()
              if isinstance(r, IncidentRecord) and r.cause == "silent"]
    assert [(i.root, i.level) for i in silent] == [("c1/row-a/rack-2", "rack")]


def test_silence_state_round_trips_per_partition_and_refuses_junk() -> None:
    watch = SilenceWatch(silent_after_s=30)
    _feed(watch, {"c/r/rack-a/node-0": 8, "c/r/rack-a/node-1": 8}, 0)
    watch.seen(1, "c/r/rack-b/node-0", T, 4)
    out = watch.tick({0: T + 40_000, 1: T})
    assert [(a.entity, a.state.value) for a in out] == [("c/r/rack-a", "firing")]
    again = SilenceWatch(silent_after_s=30)
    again.restore(0, watch.state(0))
    assert sorted(again.nodes) == ["c/r/rack-a/node-0", "c/r/rack-a/node-1"]
    assert list(again.open.values()) == out  # the open rack alert, not announced twice
    assert again.tick({0: T + 41_000}) == []
    watch.drop_partition(0)
    assert sorted(watch.nodes) == ["c/r/rack-b/node-0"] and not watch.open
    for junk in (b"{", b'{"version": 2}', b'{"version": 1, "nodes": {"x": 3}, "open": []}'):
        with pytest.raises(DecodeError):
            again.restore(0, junk)


def test_a_partition_behind_the_others_is_not_silent() -> None:
    """Partition 1 works through a backlog 90 s behind partition 0: judged by its own clock,
    its nodes are not silent."""
    watch = SilenceWatch(silent_after_s=30)
    out: list[AlertRecord] = []
    for t in range(0, 200, 5):
        watch.seen(0, "c/r/rack-a/node-0", T + t * 1000, 8)
        watch.seen(0, "c/r/rack-a/node-1", T + t * 1000, 8)
        if t >= 90:
            watch.seen(1, "c/r/rack-b/node-0", T + (t - 90) * 1000, 8)
            watch.seen(1, "c/r/rack-b/node-1", T + (t - 90) * 1000, 8)
        out += watch.tick({0: T + t * 1000, 1: T + max(t - 90, 0) * 1000})
    assert out == []

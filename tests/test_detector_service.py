"""The detector service on the in-memory transport (Kafka semantics, one process): frames
in, alerts out keyed by entity, bad input dead-lettered and counted, checkpoints written and
restored, event-topic rules."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
from alertmanager import Alertmanager, needs_alertmanager
from prometheus_client import generate_latest
from test_detector_support import frame, healthy, small_config, timestamps

from detector.admission import Admission
from detector.config import WebhookConfig
from detector.features import COL
from detector.service import LAG_SOURCE, DetectorService
from fleetpulse.config import TransportConfig
from fleetpulse.transport import Message, Transport, open_transport
from schemas.frame import encode_frame
from schemas.identity import NodeIdentity
from schemas.records import (
    AlertRecord,
    AlertState,
    EventKind,
    EventRecord,
    IncidentRecord,
    decode_alerts_topic,
)
from schemas.topics import Topics


def _config(tmp_path: Path, name: str, webhook: str = "") -> object:
    # The test data is stamped 2026-01-01: shedding (by age) is tested on its own.
    return small_config(transport=TransportConfig(bootstrap=f"memory://{name}"),
                        state_dir=tmp_path / "state", partitions=2, metrics_port=-1,
                        checkpoint_interval_s=0.5, webhook=WebhookConfig(url=webhook),
                        shed_after_s=0.0, batch_wait_s=0.05)


async def _publish_fleet(transport: Transport, topics: Topics, steps: int,
                         start: int = 0) -> None:
    data = healthy(start + steps, 8, seed=11)[start:]
    xid_step = 60 - start
    if 0 <= xid_step < steps:
        data[xid_step, 5, COL["xid"]] = 79.0
    ts = timestamps(steps, start)
    for s in range(0, steps, 5):
        for n, node in enumerate(("node-0", "node-1")):
            f = frame(node, "rack-1", ts[s:s + 5], data[s:s + 5, 4 * n:4 * n + 4],
                      seq=(start + s) // 5)
            await transport.send(topics.samples, encode_frame(f), key=f.identity.rack_key)
    await transport.flush()


async def _read_all(transport: Transport, topic: str) -> list[Message]:
    consumer = transport.consumer([topic], f"reader-{uuid.uuid4().hex}")
    out: list[Message] = []
    try:
        while batch := await consumer.getmany(timeout_ms=300):
            out.extend(batch)
    finally:
        await consumer.stop()
    return out


async def _run_until(service: DetectorService, done: object, timeout: float = 60) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    deadline = asyncio.get_running_loop().time() + timeout
    while not done() and asyncio.get_running_loop().time() < deadline:  # type: ignore[operator]
        await asyncio.sleep(0.1)
        if task.done():
            break
    stop.set()
    await task


@needs_alertmanager
async def test_frames_in_alerts_out_bad_input_dead_lettered(tmp_path: Path) -> None:
    am = Alertmanager(tmp_path / "am")
    am.start()
    name = f"det-{uuid.uuid4().hex}"
    config = _config(tmp_path, name, webhook=am.url)
    transport = open_transport(config.transport)  # type: ignore[attr-defined]
    await transport.start()
    topics = Topics()
    service = DetectorService(config, transport)  # type: ignore[arg-type]
    await transport.ensure_topics({topics.samples: 2, topics.events: 2, topics.alerts: 2,
                                   topics.deadletter: 1})
    await transport.send_and_wait(topics.samples, b"FPSF\x01garbage", key=b"c1/row-a/rack-1")
    await transport.send_and_wait(topics.events, b"{not json", key=b"c1/row-a/rack-1/node-0")
    ident = NodeIdentity("c1", "row-a", "rack-9", "node-7")
    event = EventRecord(EventKind.XID, ident, "node-7.1", int(timestamps(1)[0]), gpu=3,
                        data={"xid": 48})
    await transport.send_and_wait(topics.events, event.to_bytes(), key=event.key)
    await _publish_fleet(transport, topics, 120)
    await _run_until(service, lambda: service.stats.frames >= 48 and service.stats.events >= 1)

    assert service.stats.deadletter == {topics.samples: 1, topics.events: 1}
    scrape = generate_latest(service.stats.registry).decode()
    assert 'fleetpulse_detector_deadletter_total{topic="fleetpulse.samples"} 1.0' in scrape
    assert "fleetpulse_detector_frames_total 48.0" in scrape
    assert 'fleetpulse_detector_alerts_total{source="rule:xid",state="firing"} 1.0' in scrape
    dead = await _read_all(transport, topics.deadletter)
    reasons = sorted(dict(m.headers)["fp-reason"].decode()[:20] for m in dead)
    assert len(dead) == 2 and all(reasons)
    records = [(m.key, decode_alerts_topic(m.value))
               for m in await _read_all(transport, topics.alerts)]
    alerts = [(k, a) for k, a in records if isinstance(a, AlertRecord)]
    incidents = [i for _, i in records if isinstance(i, IncidentRecord)]
    assert {i.cause for i in incidents} == {"xid:79", "xid:48"}
    assert all(a.action.value == "drain_reboot" for _, a in alerts if a.source == "rule:xid")
    firing = {(a.entity, a.source) for _, a in alerts if a.state is AlertState.FIRING}
    assert ("c1/row-a/rack-1/node-1/gpu-1", "rule:xid") in firing
    assert ("c1/row-a/rack-9/node-7/gpu-3", "rule:event_xid") in firing
    assert all(key == a.entity.encode() for key, a in alerts)
    # The final checkpoint holds the models of the partition that carried the rack.
    saved = await service.changelog.load((topics.samples, p) for p in range(2))
    assert saved and all(len(v) > 1000 for v in saved.values())
    # Every transition reached the real Alertmanager (accepted), and the alerts open at the
    # end are the ones it holds, labelled with their incident.
    assert service.webhook is not None and service.webhook.failures == 0
    assert service.webhook.posted == len(alerts)
    try:
        held = {(a["labels"]["entity"], a["labels"]["source"], a["labels"]["incident"])
                for a in am.alerts()}
    finally:
        am.stop()
    still_open = {a.id for _, a in alerts} - {a.id for _, a in alerts
                                              if a.state is AlertState.RESOLVED}
    assert held == {(a.entity, a.source, a.context["incident"]) for _, a in alerts
                    if a.id in still_open and a.state is AlertState.FIRING}
    await transport.close()


async def test_restart_restores_models_and_does_not_repeat_alerts(tmp_path: Path) -> None:
    name = f"det-{uuid.uuid4().hex}"
    config = _config(tmp_path, name)
    transport = open_transport(config.transport)  # type: ignore[attr-defined]
    await transport.start()
    topics = Topics()
    await transport.ensure_topics({topics.samples: 2, topics.events: 2, topics.alerts: 2,
                                   topics.deadletter: 1})
    await _publish_fleet(transport, topics, 100)
    first = DetectorService(config, transport)  # type: ignore[arg-type]
    await _run_until(first, lambda: first.stats.frames >= 40)
    models_before = sum(len(s.gpu_paths) for s in first.shards.values())

    await _publish_fleet(transport, topics, 100, start=100)
    second = DetectorService(config, transport)  # type: ignore[arg-type]
    await _run_until(second, lambda: second.stats.frames >= 40)
    # Restored, not relearned: only the new frames were processed, models came back.
    assert second.stats.frames == 40
    assert sum(len(s.gpu_paths) for s in second.shards.values()) == models_before == 8
    alerts = [a for m in await _read_all(transport, topics.alerts)
              if isinstance(a := decode_alerts_topic(m.value), AlertRecord)]
    firing = [a.id for a in alerts if a.state is AlertState.FIRING]
    assert len(firing) == len(set(firing)) >= 1
    await transport.close()


async def _send_frames(transport: Transport, topics: Topics, ts: np.ndarray,
                       data: np.ndarray, seq0: int = 0) -> int:
    """Two nodes' frames of 5 ticks each; returns how many were sent."""
    sent = 0
    for s in range(0, ts.size, 5):
        for n, node in enumerate(("node-0", "node-1")):
            f = frame(node, "rack-1", ts[s:s + 5], data[s:s + 5, 4 * n:4 * n + 4],
                      seq=seq0 + s // 5)
            await transport.send(topics.samples, encode_frame(f), key=f.identity.rack_key)
            sent += 1
    await transport.flush()
    return sent


async def _shedding_setup(tmp_path: Path) -> tuple[Any, Transport, Topics]:
    """A config that sheds after 30 s and its started memory transport with the topics."""
    config = dataclasses.replace(_config(tmp_path, f"det-{uuid.uuid4().hex}"),  # type: ignore[type-var]
                                 shed_after_s=30.0)
    transport = open_transport(config.transport)
    await transport.start()
    topics = Topics()
    await transport.ensure_topics({topics.samples: 2, topics.events: 2, topics.alerts: 2,
                                   topics.deadletter: 1})
    return config, transport, topics


class _Clock:
    """The service's wall clock, ``ahead`` seconds ahead of the real one: records sent
    now look as if they had waited that long in Kafka."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.time() + self.ahead


async def test_behind_sheds_model_steps_alerts_and_resolves_when_caught_up(
        tmp_path: Path) -> None:
    """Records that waited in Kafka longer than ``shed_after_s`` are not modelled (but every
    tick reaches the rules and every offset is consumed); one ``detector:lag`` alert opens,
    and resolves once the detector reads records as they arrive. Lag is the records' wait,
    not the samples' age: old samples sent now (a spool replay) shed nothing."""
    config, transport, topics = await _shedding_setup(tmp_path)
    now = int(time.time() * 1000)
    data = healthy(70, 8, seed=5)
    data[20, 3, COL["xid"]] = 79.0  # in the shed part
    # hours-old samples sent now: not behind, nothing shed
    sent = await _send_frames(transport, topics, now - 7_200_000 + 1000 * np.arange(10),
                              data[:10])
    service = DetectorService(config, transport)
    clock = service.clock = _Clock()
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))

    async def until(done: object) -> None:
        deadline = asyncio.get_running_loop().time() + 60
        while not done():  # type: ignore[operator]
            assert asyncio.get_running_loop().time() < deadline and not task.done()
            await asyncio.sleep(0.05)

    await until(lambda: service.stats.model_steps == 10 * 8)
    assert service.stats.skipped_steps == 0 and service._lag_alert is None
    # 60 s of samples that (by the clock) waited 100 s in Kafka: shed, alert opens
    clock.ahead = 100.0
    sent += await _send_frames(transport, topics, now + 1000 * np.arange(10, 60),
                               data[10:60], seq0=2)
    await until(lambda: service.stats.skipped_steps + service.stats.model_steps == 60 * 8)
    assert service.stats.skipped_steps == 50 * 8 and service.stats.model_steps == 10 * 8
    # the alert was published (it may already be resolving: the few frames are read fast)
    await until(lambda: service.stats.alerts.get(("firing", LAG_SOURCE), 0) == 1)
    # caught up: fresh records are modelled, the alert resolves
    clock.ahead = 0.0
    sent += await _send_frames(transport, topics, now + 1000 * np.arange(60, 70),
                               data[60:70], seq0=12)
    await until(lambda: service.stats.model_steps == 20 * 8 and service._lag_alert is None)
    stop.set()
    await task
    assert service.stats.skipped_steps == 50 * 8 and service.stats.model_steps == 20 * 8
    scrape = generate_latest(service.stats.registry).decode()
    assert "fleetpulse_detector_model_steps_skipped_total 400.0" in scrape
    # 20 scored steps at most: every forest is still in its cold start
    assert "fleetpulse_detector_models_warming 8.0" in scrape
    alerts = [a for m in await _read_all(transport, topics.alerts)
              if isinstance(a := decode_alerts_topic(m.value), AlertRecord)]
    lag = [a for a in alerts if a.source == LAG_SOURCE]
    assert [a.state for a in lag] == [AlertState.FIRING, AlertState.RESOLVED]
    assert lag[0].level == "service" and lag[0].id == lag[1].id and lag[0].score > 30
    assert any(a.source == "rule:xid" for a in alerts)  # the rules saw the shed part
    await transport.close()


async def test_behind_holds_new_forests_in_their_cold_start_until_caught_up(
        tmp_path: Path) -> None:
    """Behind by more than ``admit_within_s`` but less than ``shed_after_s``: every step is
    modelled (none shed), but the forests whose cold start ends meanwhile (16 points) stay
    in it, sampling, unscored; once the records are fresh again they start scoring."""
    config, transport, topics = await _shedding_setup(tmp_path)
    now = int(time.time() * 1000)
    data = healthy(40, 8, seed=7)
    service = DetectorService(config, transport)
    clock = service.clock = _Clock()
    clock.ahead = 10.0
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))

    def scored() -> list[int]:
        return [int(c) for sh in service.shards.values()
                for c in sh.gpu_bank.thresholds.seen[:len(sh.gpu_paths)]]

    async def until(done: object) -> None:
        deadline = asyncio.get_running_loop().time() + 60
        while not done():  # type: ignore[operator]
            assert asyncio.get_running_loop().time() < deadline and not task.done()
            await asyncio.sleep(0.05)

    await _send_frames(transport, topics, now + 1000 * np.arange(30), data[:30])
    await until(lambda: service.stats.model_steps == 30 * 8)
    assert service.stats.skipped_steps == 0
    assert len(scored()) == 8 and max(scored()) == 0  # past 16 + shingle points, held
    assert "fleetpulse_detector_models_held 8.0" in generate_latest(
        service.stats.registry).decode()
    clock.ahead = 0.0
    await _send_frames(transport, topics, now + 1000 * np.arange(30, 40), data[30:40], seq0=6)
    await until(lambda: service.stats.model_steps == 40 * 8)
    stop.set()
    await task
    assert scored() == [10] * 8  # admitted at the first fresh chunk: every step scored
    assert service.stats.models_held == 0
    await transport.close()


async def test_a_mass_cold_start_is_admitted_at_the_configured_pace(tmp_path: Path) -> None:
    """Eight forests end their cold start together with room for three (``admit_per_s`` 3,
    its clock stopped so the bucket never refills): three build their trees and score,
    five sample on, held, counted on /metrics; the detector is never behind meanwhile."""
    config, transport, topics = await _shedding_setup(tmp_path)
    config = dataclasses.replace(config, admit_per_s=3.0)
    now = int(time.time() * 1000)
    service = DetectorService(config, transport)
    service.admission = Admission(config.admit_per_s, config.admit_within_s,
                                  config.admit_busy_below, clock=lambda: 0.0)
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    await _send_frames(transport, topics, now + 1000 * np.arange(30), healthy(30, 8, seed=9))
    deadline = asyncio.get_running_loop().time() + 60
    while service.stats.model_steps < 30 * 8:
        assert asyncio.get_running_loop().time() < deadline and not task.done()
        await asyncio.sleep(0.05)
    metrics = generate_latest(service.stats.registry).decode()
    stop.set()
    await task
    scored = sorted(int(c) for sh in service.shards.values()
                    for c in sh.gpu_bank.thresholds.seen[:len(sh.gpu_paths)])
    assert scored[:5] == [0] * 5 and min(scored[5:]) > 0
    assert service.stats.admitted == 3 and service.stats.models_held == 5
    assert "fleetpulse_detector_forests_admitted_total 3.0" in metrics
    assert "fleetpulse_detector_models_held 5.0" in metrics
    assert service.stats.skipped_steps == 0
    await transport.close()


async def test_a_periodic_checkpoint_paces_its_partitions_and_a_stop_hurries_it(
        tmp_path: Path) -> None:
    """Each partition's checkpoint work (0.05 s of CPU here) is followed by a pause that keeps it
    to ``checkpoint_max_share`` (2 %: 2.45 s) before the next partition's, in this round or
    the next; a shutdown in the middle of such a pause does not wait it out."""
    config = dataclasses.replace(_config(tmp_path, f"det-{uuid.uuid4().hex}"),  # type: ignore[type-var]
                                 checkpoint_interval_s=0.2, checkpoint_max_share=0.02)
    transport = open_transport(config.transport)
    await transport.start()
    topics = Topics()
    await transport.ensure_topics({topics.samples: 2, topics.events: 2, topics.alerts: 2,
                                   topics.deadletter: 1})
    loop = asyncio.get_running_loop()
    service = DetectorService(config, transport)
    starts: list[float] = []
    save = service._save

    async def slow_save(p: int, shard: Any, extra: dict[str, int]) -> int | None:
        starts.append(loop.time())
        spent = time.process_time()
        while time.process_time() - spent < 0.05:  # CPU, which the pacing counts
            pass
        return await save(p, shard, extra)

    service._save = slow_save  # type: ignore[method-assign]
    ts = timestamps(10, 0)
    data = healthy(10, 8, seed=3)
    for r in range(8):  # racks on both partitions
        f = frame(f"node-{r}", f"rack-{r}", ts[:5], data[:5, :4], seq=0)
        await transport.send(topics.samples, encode_frame(f), key=f.identity.rack_key)
    await transport.flush()
    stop = asyncio.Event()
    task = asyncio.create_task(service.run(stop))
    deadline = loop.time() + 30
    while len(service.shards) < 2 or len(starts) < 3:
        assert loop.time() < deadline and not task.done()
        await asyncio.sleep(0.01)
    gaps = np.diff(starts)
    assert gaps.min() >= 2.4, gaps  # 0.05 s of work, then 2.45 s of pause
    await asyncio.sleep(0.1)  # inside the next pause
    t0 = loop.time()
    stop.set()
    await task
    assert loop.time() - t0 < 1.5  # not 2.35 s more of pause, then the final checkpoint
    await transport.close()


async def test_an_open_lag_alert_survives_a_restart_once(tmp_path: Path) -> None:
    """The ``detector:lag`` alert open when the detector stops is still open after it
    restarts: not opened a second time while it is still behind, and resolved (same id)
    once it has caught up."""
    config, transport, topics = await _shedding_setup(tmp_path)
    now = int(time.time() * 1000)
    data = healthy(40, 8, seed=6)
    sent = 0

    async def run_until(service: DetectorService, done: object) -> None:
        await _run_until(service, done, timeout=60)
        assert done(), (service.stats.frames, sent)  # type: ignore[operator]

    def still_behind(service: DetectorService) -> DetectorService:
        """Record ages 100 s by its clock, and its lag poll held off: it never sees its
        partitions read to their ends, so it stops still behind, as one restarted under
        load does (the poll would otherwise resolve the alert once the few frames here
        are read)."""
        service.clock = clock = _Clock()
        clock.ahead = 100.0
        service._last_lag_poll = float("inf")
        return service

    first = still_behind(DetectorService(config, transport))
    sent += await _send_frames(transport, topics, now + 1000 * np.arange(20), data[:20])
    await run_until(first, lambda: first.stats.skipped_steps + first.stats.model_steps == 20 * 8
                    and first._lag_alert is not None)
    opened = first._lag_alert
    assert opened is not None and first.stats.skipped_steps > 0

    # restarted while still behind: the alert is the same one, not a second
    second = still_behind(DetectorService(config, transport))
    sent += await _send_frames(transport, topics, now + 1000 * np.arange(20, 30),
                               data[20:30], seq0=4)
    await run_until(second, lambda: second.stats.skipped_steps + second.stats.model_steps
                    == 10 * 8)
    assert second.stats.skipped_steps > 0
    assert second._lag_alert is not None and second._lag_alert.id == opened.id

    # restarted again, caught up: resolved, same id
    third = DetectorService(config, transport)
    sent += await _send_frames(transport, topics, now + 1000 * np.arange(30, 40),
                               data[30:40], seq0=6)
    await run_until(third, lambda: third.stats.model_steps == 10 * 8
                    and third._lag_alert is None)
    lag = [a for a in (decode_alerts_topic(m.value)
                       for m in await _read_all(transport, topics.alerts))
           if isinstance(a, AlertRecord) and a.source == LAG_SOURCE]
    assert [(a.state, a.id) for a in lag] == [(AlertState.FIRING, opened.id),
                                              (AlertState.RESOLVED, opened.id)]
    await transport.close()


async def test_the_service_batches_frames_and_commits_what_it_processed(tmp_path: Path) -> None:
    name = f"det-{uuid.uuid4().hex}"
    config = dataclasses.replace(_config(tmp_path, name), batch_frames=7)  # type: ignore[type-var]
    transport = open_transport(config.transport)
    await transport.start()
    topics = Topics()
    await transport.ensure_topics({topics.samples: 2, topics.events: 2, topics.alerts: 2,
                                   topics.deadletter: 1})
    await _publish_fleet(transport, topics, 200)
    service = DetectorService(config, transport)
    await _run_until(service, lambda: service.stats.frames >= 80)
    assert service.stats.frames == 80 and service.stats.model_steps == 200 * 8
    consumer = transport.consumer([topics.samples], config.group_id)  # type: ignore[attr-defined]
    try:
        committed = [await consumer.committed((topics.samples, p)) for p in range(2)]
    finally:
        await consumer.stop()
    assert sum(c or 0 for c in committed) == 80
    await transport.close()

"""Alerts name the workload (issue 18): the detector folds attribution events and puts the
GPU's job, pod and namespace in the alert record and in its Alertmanager labels (a real
Alertmanager); the map survives a restart; ``alerts tail --job`` and ``query --job`` select
one job."""

from __future__ import annotations

import argparse
import io
import uuid
from pathlib import Path

from alertmanager import Alertmanager, needs_alertmanager
from test_detector_service import _config, _read_all, _run_until
from test_detector_support import timestamps

from detector.service import DetectorService
from detector.webhook import to_alertmanager
from detector.workloads import WorkloadMap, tag_alerts
from fleetpulse.commands.alerts import _tail
from fleetpulse.commands.query import select_job
from fleetpulse.transport import open_transport
from schemas.attribution import Attachment
from schemas.identity import NodeIdentity
from schemas.records import (
    AlertRecord,
    AlertState,
    EventKind,
    EventRecord,
    Severity,
    decode_alerts_topic,
)
from schemas.topics import Topics

IDENT = NodeIdentity("c1", "row-a", "rack-9", "node-7")
LABELS = {"job": "J9", "pod": "train-0", "namespace": "ml", "container": "main"}


def _attach(gpu: int, workload: str, start: int, end: int | None,
            labels: dict[str, str] = LABELS) -> EventRecord:
    att = Attachment(f"GPU-{gpu}", workload, labels, start, end)
    return EventRecord(EventKind.ATTRIBUTION, IDENT, "node-7.1", end or start, gpu, att.uuid,
                       att.to_data())


def _alert(gpu: int, started: int, state: AlertState = AlertState.FIRING) -> AlertRecord:
    return AlertRecord(f"a{gpu}-{started}", f"{IDENT.path}/gpu-{gpu}", "gpu", state,
                       Severity.WARNING, "rule:x", "s", 1.0, 1.0, started, started + 5)


def test_alerts_name_the_job_attached_when_they_started() -> None:
    m = WorkloadMap()
    assert m.observe(_attach(3, "J9", 1000, None))
    assert m.observe(_attach(3, "J9", 1000, 5000))  # it ended
    assert m.observe(_attach(3, "J10", 7000, None, {"job": "J10"}))
    assert not m.observe(EventRecord(EventKind.XID, IDENT, "a", 1, 3, data={"xid": 1}))
    tagged = tag_alerts([_alert(3, 2000), _alert(3, 2000, AlertState.RESOLVED),
                         _alert(3, 6000), _alert(3, 9000), _alert(4, 2000)], [m])
    assert [r.context.get("job") for r in tagged] == ["J9", "J9", None, "J10", None]
    assert tagged[0].context["pod"] == "train-0" and tagged[0].context["namespace"] == "ml"
    labels = to_alertmanager(tagged[0])["labels"]
    assert (labels["job"], labels["pod"], labels["namespace"]) == ("J9", "train-0", "ml")
    assert "job" not in to_alertmanager(tagged[2])["labels"]
    again = WorkloadMap.from_bytes(m.to_bytes())
    assert again.at(f"{IDENT.path}/gpu-3", 9000) == m.at(f"{IDENT.path}/gpu-3", 9000)
    assert select_job('m{agg="max"}', "J9") == 'm{level="job",job="J9",agg="max"}'


@needs_alertmanager
async def test_detector_alert_carries_the_job_to_the_topic_and_alertmanager(
        tmp_path: Path) -> None:
    am = Alertmanager(tmp_path / "am")
    am.start()
    name = f"det-wl-{uuid.uuid4().hex}"
    config = _config(tmp_path, name, webhook=am.url)
    transport = open_transport(config.transport)  # type: ignore[attr-defined]
    await transport.start()
    topics = Topics()
    await transport.ensure_topics({topics.samples: 2, topics.events: 2, topics.alerts: 2,
                                   topics.deadletter: 1})
    t0 = int(timestamps(1)[0])
    for ev in (_attach(3, "J9", t0 - 60_000, None),
               EventRecord(EventKind.XID, IDENT, "node-7.1", t0, gpu=3, data={"xid": 48}),
               EventRecord(EventKind.XID, IDENT, "node-7.1", t0, gpu=5, data={"xid": 48})):
        await transport.send_and_wait(topics.events, ev.to_bytes(), key=ev.key)
    bad = _attach(3, "J9", t0, None).to_bytes().replace(b'"from_ms":', b'"from_ms":-')
    await transport.send_and_wait(topics.events, bad, key=IDENT.path.encode())
    service = DetectorService(config, transport)  # type: ignore[arg-type]
    await _run_until(service, lambda: service.stats.events >= 4 and service.webhook.posted >= 2,
                     timeout=180)  # a fresh clone compiles the numba kernels first
    try:
        held = {a["labels"]["gpu"]: a["labels"] for a in am.alerts()}
    finally:
        am.stop()
    alerts = [r for r in (decode_alerts_topic(m.value)
                          for m in await _read_all(transport, topics.alerts))
              if isinstance(r, AlertRecord)]
    by_gpu = {a.entity.rsplit("-", 1)[1]: a for a in alerts}
    assert by_gpu["3"].context["job"] == "J9" and by_gpu["3"].context["pod"] == "train-0"
    assert "job" not in by_gpu["5"].context
    assert held["gpu-3"]["job"] == "J9" and held["gpu-3"]["namespace"] == "ml"
    assert "job" not in held["gpu-5"]
    assert service.stats.deadletter == {topics.events: 1}  # the bad attribution
    # The workload map moves with its events partition: saved in the changelog beside it.
    saved = await service.changelog.load([service._workloads_key(p) for p in range(2)])
    assert any(WorkloadMap.from_bytes(v).at(f"{IDENT.path}/gpu-3", t0) for v in saved.values())
    # alerts tail --job: only that job's alerts (and their incidents)
    out = io.StringIO()
    args = argparse.Namespace(config=None, bootstrap=f"memory://{name}", prefix=None,
                              json=True, from_beginning=True, idle_exit=0.5, job="J9",
                              pages=False)
    assert await _tail(args, out) == 0
    shown = [decode_alerts_topic(line.encode()) for line in out.getvalue().splitlines()]
    assert shown and all(getattr(r, "context", {"job": "J9"}).get("job") == "J9"
                         for r in shown)
    assert any(isinstance(r, AlertRecord) for r in shown)
    await transport.close()

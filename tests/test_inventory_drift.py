"""``fleetpulse inventory drift`` over the events topic: a rack and a node with mixed drivers
show up, a uniform rack does not, and a VBIOS change on one GPU is listed; a job whose GPUs
run mixed drivers is named."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest

from fleetpulse.cli import main
from fleetpulse.config import TransportConfig
from fleetpulse.inventory_drift import InventoryLedger
from fleetpulse.transport import open_transport
from schemas.attribution import Attachment
from schemas.errors import DecodeError
from schemas.identity import NodeIdentity
from schemas.records import EventKind, EventRecord
from schemas.topics import Topics

T = 1_767_225_600_000


def _inventory(rack: str, node: str, gpu: int, driver: str, vbios: str, t: int) -> EventRecord:
    return EventRecord(EventKind.INVENTORY, NodeIdentity("c1", "row-a", rack, node),
                       f"{node}.1", T + t, gpu=gpu, uuid=f"GPU-{rack}-{node}-{gpu}",
                       data={"driver": driver, "vbios": vbios, "source": "nvml"})


def test_drift_report_names_mixed_racks_and_nodes_and_changes(
        capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = f"memory://inv-{uuid.uuid4().hex}"
    events = [_inventory(rack, node, g, "550.54.15", "96.00.89.00.01", 0)
              for rack in ("rack-1", "rack-2") for node in ("node-0", "node-1")
              for g in range(4)]
    events[5] = _inventory("rack-1", "node-1", 1, "535.104.12", "96.00.89.00.01", 0)
    events.append(_inventory("rack-2", "node-0", 3, "550.54.15", "96.00.89.00.02", 60_000))

    async def publish() -> None:
        transport = open_transport(TransportConfig(bootstrap=bootstrap))
        await transport.start()
        topics = Topics()
        await transport.ensure_topics({topics.events: 2})
        await transport.send_and_wait(topics.events, b"not an event", key=b"x")
        for ev in events:
            await transport.send_and_wait(topics.events, ev.to_bytes(), key=ev.key)
        await transport.close()

    asyncio.run(publish())
    assert main(["inventory", "drift", "--bootstrap", bootstrap, "--json", "--idle-s", "1"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gpus"] == 16 and report["skipped"] == 1
    mixed = {(m["level"], m["entity"], m["field"]): m["versions"] for m in report["mixed"]}
    assert mixed == {
        ("rack", "c1/row-a/rack-1", "driver"): {"535.104.12": 1, "550.54.15": 7},
        ("node", "c1/row-a/rack-1/node-1", "driver"): {"535.104.12": 1, "550.54.15": 3},
        ("rack", "c1/row-a/rack-2", "vbios"): {"96.00.89.00.01": 7, "96.00.89.00.02": 1},
        ("node", "c1/row-a/rack-2/node-0", "vbios"): {"96.00.89.00.01": 3,
                                                      "96.00.89.00.02": 1},
    }
    assert report["changes"] == [{"gpu": "c1/row-a/rack-2/node-0/gpu-3", "field": "vbios",
                                  "old": "96.00.89.00.01", "new": "96.00.89.00.02",
                                  "ts_ms": T + 60_000}]
    # the table form says the same
    assert main(["inventory", "drift", "--bootstrap", bootstrap, "--idle-s", "1"]) == 0
    text = capsys.readouterr().out
    assert "mixed  rack  c1/row-a/rack-1" in text and "535.104.12 x1" in text
    assert "96.00.89.00.01 -> 96.00.89.00.02" in text


def test_a_job_across_nodes_with_mixed_drivers_is_named() -> None:
    ledger = InventoryLedger()
    for node, driver in (("node-0", "550.54.15"), ("node-1", "535.104.12")):
        for g in range(2):
            ledger.observe(_inventory("rack-1", node, g, driver, "96.00.89.00.01", 0))

    def attach(node: str, gpu: int, job: str, start: int, end: int | None) -> EventRecord:
        att = Attachment(f"GPU-rack-1-{node}-{gpu}", job, {"job": job}, T + start,
                         None if end is None else T + end)
        return EventRecord(EventKind.ATTRIBUTION, NodeIdentity("c1", "row-a", "rack-1", node),
                           f"{node}.1", T + (end or start), gpu=gpu, uuid=att.uuid,
                           data=att.to_data())

    ledger.observe(attach("node-0", 0, "train-42", 1000, None))
    ledger.observe(attach("node-1", 0, "train-42", 1000, None))  # other driver: mixed
    ledger.observe(attach("node-0", 1, "eval-7", 1000, None))  # one driver: not listed
    ledger.observe(attach("node-1", 1, "old-3", 500, 2000))  # ended before the report
    ledger.observe(attach("node-0", 1, "eval-7", 1000, None))  # a repeat changes nothing
    jobs = {(m.entity, m.field): m.versions for m in ledger.drift() if m.level == "job"}
    assert jobs == {("train-42", "driver"): {"535.104.12": 1, "550.54.15": 1}}
    assert [m.level for m in ledger.drift()] == ["rack", "job"]
    with pytest.raises(DecodeError):
        ledger.observe(EventRecord(EventKind.ATTRIBUTION, NodeIdentity("c1", "row-a",
                                                                       "rack-1", "node-0"),
                                   "x", T, gpu=0, uuid="GPU-x", data={"workload": 7}))

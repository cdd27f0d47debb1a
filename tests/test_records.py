"""Event and alert records round-trip and reject bad input with DecodeError only."""

from __future__ import annotations

import orjson
import pytest

from schemas import (
    AlertRecord,
    AlertState,
    Attribution,
    DecodeError,
    EventKind,
    EventRecord,
    NodeIdentity,
    Severity,
)

IDENT = NodeIdentity("c1", "row-a", "rack-03", "node-17")


def alert() -> AlertRecord:
    return AlertRecord(
        id="a-1", entity="c1/row-a/rack-03/node-17/gpu-5", level="gpu", state=AlertState.FIRING,
        severity=Severity.CRITICAL, source="rule:xid", summary="XID 79: GPU fell off the bus",
        score=1.0, threshold=0.5, started_ms=1, updated_ms=2,
        attribution=(Attribution("fleetpulse_gpu_xid", "high", 1.0),), context={"xid": 79},
    )


def test_event_roundtrip() -> None:
    ev = EventRecord(EventKind.XID, IDENT, "node-17.1", 123, gpu=5, uuid="GPU-1", data={"xid": 79})
    assert EventRecord.from_bytes(ev.to_bytes()) == ev
    assert ev.key == b"c1/row-a/rack-03/node-17"


def test_alert_roundtrip() -> None:
    a = alert()
    assert AlertRecord.from_bytes(a.to_bytes()) == a


@pytest.mark.parametrize(
    ("patch", "message"),
    [
        ({"state": "open"}, "state"),
        ({"level": "planet"}, "level"),
        ({"score": "high"}, "score"),
        ({"attribution": [1]}, "attribution"),
        ({"started_ms": True}, "started_ms"),
    ],
)
def test_alert_validation(patch: dict, message: str) -> None:
    obj = orjson.loads(alert().to_bytes()) | patch
    with pytest.raises(DecodeError, match=message):
        AlertRecord.from_bytes(orjson.dumps(obj))


@pytest.mark.parametrize("data", [b"", b"[]", b"{", b'{"kind":"xid"}',
                                  b'{"kind":"meteor","identity":{},"agent":"a","ts_ms":1,"data":{}}'])
def test_event_garbage(data: bytes) -> None:
    with pytest.raises(DecodeError):
        EventRecord.from_bytes(data)


def test_event_identity_is_validated() -> None:
    obj = orjson.loads(EventRecord(EventKind.GPU_LOST, IDENT, "a", 1).to_bytes())
    obj["identity"]["node"] = "../../etc"
    with pytest.raises(DecodeError, match="node"):
        EventRecord.from_bytes(orjson.dumps(obj))

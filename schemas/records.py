"""Event and alert records: low-rate messages, so plain orjson objects.

Unlike sample frames these are one object per occurrence (an XID, an alert transition);
they are rare enough that readability wins over a binary layout. Decoders validate every
field and raise :class:`schemas.errors.DecodeError`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any, Final

import orjson

from schemas.errors import DecodeError
from schemas.identity import NodeIdentity, check_name

__all__ = [
    "ALERT_LEVELS",
    "Action",
    "AlertRecord",
    "AlertState",
    "Attribution",
    "EventKind",
    "EventRecord",
    "IncidentRecord",
    "Severity",
    "decode_alerts_topic",
]


ALERT_LEVELS: Final = ("gpu", "node", "rack", "row", "cluster", "service")
"""Fleet levels, and ``service``: the monitoring pipeline itself (``detector:lag``)."""


class EventKind(StrEnum):
    XID = "xid"
    """An XID error; ``data["xid"]`` holds the code."""
    ECC = "ecc"
    """An ECC event from the NVML event set; ``data`` says single/double bit."""
    GPU_LOST = "gpu_lost"
    """NVML answered GPU_IS_LOST (fell off the bus)."""
    INVENTORY = "inventory"
    """What the GPU is: uuid, serial, vbios, inforom, driver, pci bus id, model, MIG mode."""
    AGENT_START = "agent_start"
    AGENT_STOP = "agent_stop"
    ATTRIBUTION = "attribution"
    """A workload attached to or detached from a GPU (:mod:`schemas.attribution`)."""


class AlertState(StrEnum):
    FIRING = "firing"
    RESOLVED = "resolved"


class Severity(StrEnum):
    CRITICAL = "critical"
    WARNING = "warning"
    INFO = "info"


class Action(StrEnum):
    """What an SRE should do about an alert or incident, least to most disruptive (the
    order is :attr:`rank`; an incident takes its members' highest)."""

    NONE = "none"
    """Nothing now: watch it (informational, or the pipeline's own health)."""
    RESTART_APP = "restart_app"
    """The application (job, pod) hit the error; restart it, the GPU is fine."""
    CHECK_COOLING = "check_cooling"
    """Facilities: the air or liquid path of the GPU or rack (fans, CDU, doors, inlet)."""
    RESET_GPU = "reset_gpu"
    """Drain the GPU's jobs and reset it (``nvidia-smi -r``): clears the fault, activates
    pending row remaps / retired pages."""
    CHECK_NODE = "check_node"
    """The node stopped reporting or its board asserts a slowdown: power, network, agent."""
    DRAIN_REBOOT = "drain_reboot"
    """Drain the node and reboot it: a GPU reset cannot recover this (fell off the bus)."""
    REPLACE = "replace"
    """Hardware out of spares or failing repeatedly: RMA the GPU (or the board)."""

    @property
    def rank(self) -> int:
        return _ACTION_ORDER.index(self)


_ACTION_ORDER: Final = tuple(Action)


def _loads(data: bytes, what: str) -> dict[str, Any]:
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise DecodeError(f"{what} is not valid JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise DecodeError(f"{what} must be a JSON object")
    return obj


def _get(obj: dict[str, Any], key: str, types: type | tuple[type, ...], what: str) -> Any:
    value = obj.get(key)
    allowed = types if isinstance(types, tuple) else (types,)
    if not isinstance(value, allowed) or (isinstance(value, bool) and bool not in allowed):
        raise DecodeError(f"{what} field {key!r} is missing or of the wrong type: {value!r:.60}")
    return value


def _enum(cls: type[StrEnum], obj: dict[str, Any], key: str, what: str) -> Any:
    value = obj.get(key)
    if isinstance(value, str) and value in cls._value2member_map_:
        return cls(value)
    allowed = ", ".join(m.value for m in cls)
    raise DecodeError(f"{what} field {key!r} is {value!r:.40}, not one of {allowed}")


@dataclass(frozen=True, slots=True)
class EventRecord:
    """Something that happened on a node, published to the events topic keyed by node."""

    kind: EventKind
    identity: NodeIdentity
    agent: str
    ts_ms: int
    gpu: int | None = None
    uuid: str | None = None
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> bytes:
        return self.identity.path.encode()

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes) -> EventRecord:
        what = "event record"
        obj = _loads(data, what)
        ident = _get(obj, "identity", dict, what)
        gpu = obj.get("gpu")
        if gpu is not None and (type(gpu) is not int or gpu < 0):
            raise DecodeError(f"{what} field 'gpu' must be a non-negative integer or null")
        uuid = obj.get("uuid")
        if uuid is not None and not isinstance(uuid, str):
            raise DecodeError(f"{what} field 'uuid' must be a string or null")
        return cls(
            kind=_enum(EventKind, obj, "kind", what),
            identity=NodeIdentity(
                *(check_name(k, ident.get(k)) for k in ("cluster", "row", "rack", "node"))
            ),
            agent=check_name("agent", obj.get("agent")),
            ts_ms=_get(obj, "ts_ms", int, what),
            gpu=gpu,
            uuid=uuid,
            data=_get(obj, "data", dict, what),
        )


@dataclass(frozen=True, slots=True)
class Attribution:
    """How much one metric contributed to a score, and in which direction."""

    metric: str
    direction: str
    """"high" (above what the model expects) or "low"."""
    weight: float


@dataclass(frozen=True, slots=True)
class AlertRecord:
    """An alert transition, published to the alerts topic keyed by entity.

    ``id`` stays the same from firing to resolved, so a subscriber can pair them.
    """

    id: str
    entity: str
    """Entity path, e.g. ``c1/row-a/rack-03/node-17/gpu-5`` or ``c1/row-a/rack-03``."""
    level: str
    """gpu | node | rack | row | cluster."""
    state: AlertState
    severity: Severity
    source: str
    """``rule:<name>`` or ``model:<engine>``."""
    summary: str
    score: float
    threshold: float
    started_ms: int
    updated_ms: int
    attribution: tuple[Attribution, ...] = ()
    context: dict[str, Any] = field(default_factory=dict)
    action: Action = Action.NONE
    """What to do about it (``detector.actions``: the XID catalogue and repeat history);
    records written before this field existed read as ``none``."""

    @property
    def key(self) -> bytes:
        return self.entity.encode()

    def to_bytes(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def from_bytes(cls, data: bytes) -> AlertRecord:
        what = "alert record"
        obj = _loads(data, what)
        level = _get(obj, "level", str, what)
        if level not in ALERT_LEVELS:
            raise DecodeError(f"{what} level {level!r:.20} is not one of {ALERT_LEVELS}")
        attribution = []
        for item in _get(obj, "attribution", list, what):
            if not isinstance(item, dict):
                raise DecodeError(f"{what} attribution entries must be objects")
            attribution.append(
                Attribution(
                    metric=_get(item, "metric", str, what),
                    direction=_get(item, "direction", str, what),
                    weight=float(_get(item, "weight", (int, float), what)),
                )
            )
        return cls(
            id=_get(obj, "id", str, what),
            entity=_get(obj, "entity", str, what),
            level=level,
            state=_enum(AlertState, obj, "state", what),
            severity=_enum(Severity, obj, "severity", what),
            source=_get(obj, "source", str, what),
            summary=_get(obj, "summary", str, what),
            score=float(_get(obj, "score", (int, float), what)),
            threshold=float(_get(obj, "threshold", (int, float), what)),
            started_ms=_get(obj, "started_ms", int, what),
            updated_ms=_get(obj, "updated_ms", int, what),
            attribution=tuple(attribution),
            context=_get(obj, "context", dict, what),
            action=_enum(Action, obj, "action", what) if "action" in obj else Action.NONE,
        )


@dataclass(frozen=True, slots=True)
class IncidentRecord:
    """Alerts with one cause, as one thing to act on; published to the alerts topic (keyed
    by ``root``) beside the alerts it groups, with ``"record": "incident"`` in its JSON so a
    reader tells the two apart (:func:`decode_alerts_topic`).

    A transition is published when the incident opens, when it changes (a member joins, the
    severity or action rises: ``revision`` counts these) and when it resolves (every member
    resolved; ``updated_ms`` is then its end). An incident absorbed by a larger one (GPU
    alerts whose rack alert came later) resolves with ``merged_into`` set.
    """

    id: str
    root: str
    """The entity the cause sits at: a GPU, node or rack path."""
    level: str
    state: AlertState
    severity: Severity
    """The highest of its members'."""
    cause: str
    """What went wrong, e.g. ``xid:79``, ``rack_heat``, ``ecc_sbe_burst``, ``silent``."""
    action: Action
    summary: str
    started_ms: int
    updated_ms: int
    members: tuple[str, ...]
    """Alert ids, in the order they joined."""
    revision: int = 0
    merged_into: str = ""

    @property
    def key(self) -> bytes:
        return self.root.encode()

    def to_bytes(self) -> bytes:
        return orjson.dumps({"record": "incident", **asdict(self)})

    @classmethod
    def from_bytes(cls, data: bytes) -> IncidentRecord:
        what = "incident record"
        obj = _loads(data, what)
        if obj.get("record") != "incident":
            raise DecodeError(f"{what} field 'record' must be 'incident'")
        level = _get(obj, "level", str, what)
        if level not in ALERT_LEVELS:
            raise DecodeError(f"{what} level {level!r:.20} is not one of {ALERT_LEVELS}")
        members = _get(obj, "members", list, what)
        if not all(isinstance(m, str) for m in members):
            raise DecodeError(f"{what} members must be alert ids (strings)")
        return cls(
            id=_get(obj, "id", str, what),
            root=_get(obj, "root", str, what),
            level=level,
            state=_enum(AlertState, obj, "state", what),
            severity=_enum(Severity, obj, "severity", what),
            cause=_get(obj, "cause", str, what),
            action=_enum(Action, obj, "action", what),
            summary=_get(obj, "summary", str, what),
            started_ms=_get(obj, "started_ms", int, what),
            updated_ms=_get(obj, "updated_ms", int, what),
            members=tuple(members),
            revision=_get(obj, "revision", int, what),
            merged_into=_get(obj, "merged_into", str, what),
        )


def decode_alerts_topic(data: bytes) -> AlertRecord | IncidentRecord:
    """A message of the alerts topic: an alert transition or an incident transition."""
    if b'"record":"incident"' in data[:40]:
        return IncidentRecord.from_bytes(data)
    return AlertRecord.from_bytes(data)

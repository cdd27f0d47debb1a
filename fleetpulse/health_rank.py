"""The worst GPUs: a ranking by what the alerts topic says about each GPU in a window.

In large fleets about 1 % of GPUs cause half the failures; finding them is reading the
alerts topic per GPU. :class:`HealthRank` takes alert and incident records (in topic order)
and ranks GPUs within a window by, in this order: incidents rooted at the GPU; hardware
events (XIDs the catalogue calls hardware, ECC errors, row-remap trouble), each counted once
per incident so the metric and event view of one XID count once; then the time it spent
throttled (thermal / HW slowdown alerts open) and lost (``gpu_lost`` open), as unions of
intervals. ``fleetpulse health top`` prints it; the web page serves it at ``/web/health``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from detector.actions import ActionBook, alert_xid, rule_name
from schemas.records import AlertRecord, AlertState, IncidentRecord

__all__ = ["GpuHealth", "HealthRank", "parse_window"]

_THROTTLE = frozenset({"thermal_slowdown", "hw_slowdown"})
_LOST = frozenset({"gpu_lost", "event_gpu_lost"})
_ECC = frozenset({"ecc_dbe", "ecc_sbe_burst"})
_REMAP_XIDS = frozenset({63, 64})
_COUNT = {"xid": "xids", "ecc": "ecc", "remap": "remaps"}
"""Hardware event kind -> the GpuHealth counter it adds to."""
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_window(text: str) -> int:
    """``7d``, ``12h``, ``30m``, ``90s`` -> milliseconds; ValueError with the reason."""
    text = text.strip()
    if len(text) < 2 or text[-1] not in _UNITS or not text[:-1].isdigit() or int(text[:-1]) < 1:
        raise ValueError(f"window must be a positive integer with a unit s, m, h, d or w "
                         f"(e.g. 7d), got {text!r:.20}")
    return int(text[:-1]) * _UNITS[text[-1]] * 1000


@dataclass(slots=True)
class GpuHealth:
    gpu: str
    incidents: int = 0
    xids: int = 0
    ecc: int = 0
    remaps: int = 0
    throttled_s: float = 0.0
    lost_s: float = 0.0

    @property
    def hardware_events(self) -> int:
        return self.xids + self.ecc + self.remaps


@dataclass(slots=True)
class _Gpu:
    incidents: dict[str, int] = field(default_factory=dict)
    """Incident id -> start."""
    events: dict[tuple[str, str], int] = field(default_factory=dict)
    """(kind, incident or alert id) -> start."""
    spans: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    """kind -> alert id -> [start, end or -1]."""


class HealthRank:
    def __init__(self, book: ActionBook | None = None) -> None:
        self.book = book or ActionBook()
        self.gpus: dict[str, _Gpu] = {}
        self.newest_ms = 0

    def add(self, rec: AlertRecord | IncidentRecord) -> None:
        self.newest_ms = max(self.newest_ms, rec.updated_ms)
        if isinstance(rec, IncidentRecord):
            if rec.level == "gpu" and not rec.merged_into:
                self.gpus.setdefault(rec.root, _Gpu()).incidents.setdefault(rec.id,
                                                                              rec.started_ms)
            return
        if rec.level != "gpu":
            return
        g = self.gpus.setdefault(rec.entity, _Gpu())
        rule, code = rule_name(rec.source), alert_xid(rec)
        group = str(rec.context.get("incident") or rec.id)
        if code is not None and self.book.xid(code).hardware:
            kind = "remap" if code in _REMAP_XIDS else "xid"
            g.events.setdefault((kind, group), rec.started_ms)
        elif rule in _ECC:
            g.events.setdefault(("ecc", group), rec.started_ms)
        elif rule == "row_remap_failure":
            g.events.setdefault(("remap", group), rec.started_ms)
        kind = "throttle" if rule in _THROTTLE else "lost" if rule in _LOST else ""
        if kind:
            span = g.spans.setdefault(kind, {}).setdefault(rec.id, [rec.started_ms, -1])
            if rec.state is AlertState.RESOLVED:
                span[1] = rec.updated_ms

    def top(self, window_ms: int, limit: int = 20, now_ms: int | None = None
            ) -> list[GpuHealth]:
        """The ``limit`` worst GPUs in the ``window_ms`` before ``now_ms`` (default: the
        newest record's time); GPUs with nothing in the window are left out."""
        now = self.newest_ms if now_ms is None else now_ms
        since = now - window_ms
        out = []
        for path, g in self.gpus.items():
            h = GpuHealth(path, incidents=sum(1 for t in g.incidents.values() if t >= since))
            for (kind, _), t in g.events.items():
                if t >= since:
                    attr = _COUNT[kind]
                    setattr(h, attr, getattr(h, attr) + 1)
            h.throttled_s = _covered(g.spans.get("throttle", {}), since, now) / 1000
            h.lost_s = _covered(g.spans.get("lost", {}), since, now) / 1000
            if h.incidents or h.hardware_events or h.throttled_s or h.lost_s:
                out.append(h)
        out.sort(key=lambda h: (-h.incidents, -h.hardware_events, -(h.lost_s + h.throttled_s),
                                h.gpu))
        return out[:limit]


def _covered(spans: dict[str, list[int]], since: int, now: int) -> int:
    """Milliseconds of [since, now] covered by the union of the spans (open ones to now)."""
    cuts = sorted((max(s, since), min(now if e < 0 else e, now)) for s, e in spans.values())
    total, end = 0, since
    for s, e in cuts:
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total

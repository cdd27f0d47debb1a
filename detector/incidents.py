"""Alerts with one cause as one incident, and every alert with its action.

An SRE works from incidents: the rack whose cooling failed, not the 28 GPUs that throttled
because of it. :class:`Correlator` takes alert transitions in the order they are published
and groups them:

- a rack alert and the alerts of its GPUs and nodes that its cause explains
  (``FOLLOWS``: a hot rack explains thermal slowdowns, thermal excess, stragglers and the
  forest's unease; a silent rack explains silent nodes and lost GPUs), from ``window_s``
  before the rack alert opened until the rack incident ends. GPU incidents already open
  when the rack alert comes are absorbed (they resolve with ``merged_into``);
- likewise a silent node and its GPUs;
- everything else on one GPU while an incident of that GPU is open: the metric and the
  event view of one XID (``rule:xid`` and ``rule:event_xid``), an ECC storm and the XIDs it
  brings, the forest's alert beside a rule's.

An ``info`` alert (the forests' by default, ``alerts.model_severity``) is a signal: it joins
an open incident it belongs to as above, and otherwise stays on its own, opening none.

An incident's severity is its members' highest; its action is its root cause's for a rack
or node (a cooling fault is fixed at the rack, whatever its GPUs' alerts suggest; of
several alerts at the root, the one with the most disruptive action leads, so the rack heat
rule names the cause when the rack forest saw it first), or its members' highest while the
root's own alerts name none (the forest's "unlike its history"); for a GPU it is the
members' highest, escalated by the GPU's history (``detector.actions``). It resolves when
every member has. Transitions of one :meth:`Correlator.observe` call are
coalesced: each changed incident is reported once, in its final state.

State is in memory and rebuilt from the alerts replayed after a restart; incident ids derive
from the first member's alert id, so a replay names them the same.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field

from detector.actions import ActionBook, RepeatHistory, alert_xid, rule_name
from schemas.records import (
    Action,
    AlertRecord,
    AlertState,
    IncidentRecord,
    Severity,
)

__all__ = ["FOLLOWS", "Correlator"]

_THERMAL = frozenset({"thermal_slowdown", "thermal_excess", "hw_slowdown", "clock_deficit",
                      "model"})
_SILENT = frozenset({"silent", "gpu_lost", "event_gpu_lost", "exporter_blank", "model"})
FOLLOWS: dict[str, frozenset[str]] = {
    "rack_heat": _THERMAL,
    "model": _THERMAL,  # the rack forest: a correlated change across the rack
    "silent": _SILENT,
    "exporter_blank": _SILENT,
}
"""Root cause at a rack or node -> rules of its GPUs' (and nodes') alerts it explains."""

_SEVERITY_RANK = {Severity.INFO: 0, Severity.WARNING: 1, Severity.CRITICAL: 2}


def cause_of(rec: AlertRecord) -> str:
    """``xid:79`` for an XID alert, else the rule name (``rack_heat``, ``model``...)."""
    code = alert_xid(rec)
    return f"xid:{code}" if code is not None else rule_name(rec.source)


@dataclass(slots=True)
class _Incident:
    id: str
    root: str
    level: str
    cause: str
    action: Action
    severity: Severity
    summary: str
    started_ms: int
    updated_ms: int
    members: list[str] = field(default_factory=list)
    open_members: set[str] = field(default_factory=set)
    entities: set[str] = field(default_factory=set)
    sources: set[str] = field(default_factory=set)
    revision: int = -1
    merged_into: str = ""
    root_action: Action = Action.NONE
    """The highest action of the alerts at the root entity itself."""

    def record(self) -> IncidentRecord:
        state = AlertState.FIRING if self.open_members and not self.merged_into \
            else AlertState.RESOLVED
        n, k = len(self.members), len(self.entities)
        summary = (f"{self.cause} at {self.root}: {self.summary}"
                   + (f" (+{n - 1} related alerts on {k} entities)" if n > 1 else "")
                   + f"; action: {self.action.value}")
        return IncidentRecord(
            id=self.id, root=self.root, level=self.level, state=state,
            severity=self.severity, cause=self.cause, action=self.action, summary=summary,
            started_ms=self.started_ms, updated_ms=self.updated_ms,
            members=tuple(self.members), revision=self.revision,
            merged_into=self.merged_into)


class Correlator:
    """Groups alert transitions into incidents and gives each alert its action."""

    def __init__(self, book: ActionBook | None = None, window_s: float = 300.0) -> None:
        self.book = book or ActionBook()
        self.window_ms = int(window_s * 1000)
        self.history = RepeatHistory(self.book.escalations)
        self.open: dict[str, _Incident] = {}
        """Incident id -> open incident."""
        self._of_alert: dict[str, str] = {}
        """Alert id -> incident id (alerts of open incidents)."""
        self._at_root: dict[str, str] = {}
        """Root entity -> its open incident id."""

    # -- public ------------------------------------------------------------------------

    def observe(self, records: list[AlertRecord]
                ) -> tuple[list[AlertRecord], list[IncidentRecord]]:
        """``records`` with ``action`` and ``context["incident"]`` set, and the incident
        transitions they cause (one per changed incident)."""
        out: list[AlertRecord] = []
        touched: dict[str, _Incident] = {}
        for rec in records:
            if rec.state is AlertState.FIRING:
                inc, action = self._fire(rec, touched)
            else:
                inc, action = self._resolve(rec, touched)
            context = {**rec.context, **self.book.describe(rec)}
            if inc is not None:
                context["incident"] = inc.id
            out.append(dataclasses.replace(rec, action=action, context=context))
        incidents = []
        for inc in touched.values():
            inc.revision += 1
            irec = inc.record()
            incidents.append(irec)
            if irec.state is AlertState.RESOLVED:
                self._forget(inc)
        return out, incidents

    def incident_of(self, alert_id: str) -> str | None:
        return self._of_alert.get(alert_id)

    # -- firing ------------------------------------------------------------------------

    def _fire(self, rec: AlertRecord, touched: dict[str, _Incident]
              ) -> tuple[_Incident | None, Action]:
        if rec.id in self._of_alert:  # the same transition again (a replay): no change
            return self.open[self._of_alert[rec.id]], self._alert_action(rec)
        base = self.book.action_for(rec)
        rule = rule_name(rec.source)
        parts = rec.entity.split("/")
        inc: _Incident | None = None
        if rec.level in ("gpu", "node") and len(parts) >= 4:
            # a rack's (then a node's) cause that explains this alert
            for root in ("/".join(parts[:3]), "/".join(parts[:4])):
                cand = self._root_incident(root)
                if cand is not None and cand.root != rec.entity \
                        and rule in FOLLOWS.get(cand.cause, ()):
                    inc = cand
                    break
        if inc is None:
            inc = self._root_incident(rec.entity)
        if inc is None and rec.severity is Severity.INFO:
            return None, self._alert_action(rec)  # a signal joins an incident, never opens one
        if inc is None:
            inc = self._new(rec, base)
            if rec.level in ("rack", "node"):
                self._absorb(inc, touched)
        self._join(inc, rec, base)
        touched[inc.id] = inc
        return inc, self._alert_action(rec)

    def _root_incident(self, root: str) -> _Incident | None:
        iid = self._at_root.get(root)
        return self.open.get(iid) if iid is not None else None

    def _new(self, rec: AlertRecord, base: Action) -> _Incident:
        iid = "inc-" + hashlib.blake2b(rec.id.encode(), digest_size=8).hexdigest()
        action = base
        if rec.level == "gpu":
            action = self.history.record(rec.entity, base, rec.started_ms)
        inc = _Incident(iid, rec.entity, rec.level, cause_of(rec), action, rec.severity,
                        rec.summary, rec.started_ms, rec.updated_ms, root_action=base)
        self.open[iid] = inc
        self._at_root[rec.entity] = iid
        return inc

    def _join(self, inc: _Incident, rec: AlertRecord, base: Action) -> None:
        inc.members.append(rec.id)
        inc.open_members.add(rec.id)
        inc.entities.add(rec.entity)
        inc.sources.add(rec.source)
        self._of_alert[rec.id] = inc.id
        inc.updated_ms = max(inc.updated_ms, rec.updated_ms)
        if _SEVERITY_RANK[rec.severity] > _SEVERITY_RANK[inc.severity]:
            inc.severity = rec.severity
        if inc.level == "gpu" and base.rank > inc.action.rank:
            # a more serious cause on the same GPU (an XID after an ECC storm) leads
            inc.action = self.history.record(inc.root, base, rec.started_ms)
            inc.cause, inc.summary = cause_of(rec), rec.summary
        elif inc.level != "gpu":
            self._lead(inc, rec.entity, base, rec)

    @staticmethod
    def _lead(inc: _Incident, entity: str, base: Action, rec: AlertRecord | None) -> None:
        """A rack or node incident's action: its root alerts' highest, else its members'."""
        if entity == inc.root and rec is not None:
            if base.rank > inc.root_action.rank:
                inc.root_action = base
                inc.cause, inc.summary = cause_of(rec), rec.summary
            inc.action = inc.root_action
        if inc.root_action is Action.NONE and base.rank > inc.action.rank:
            inc.action = base

    def _absorb(self, root: _Incident, touched: dict[str, _Incident]) -> None:
        """GPU and node incidents under a new rack/node incident that its cause explains."""
        follows = FOLLOWS.get(root.cause, frozenset())
        prefix = root.root + "/"
        for inc in list(self.open.values()):
            if (inc is root or not inc.root.startswith(prefix)
                    or inc.started_ms < root.started_ms - self.window_ms
                    or not all(rule_name(s) in follows for s in inc.sources)):
                continue
            root.members.extend(inc.members)
            root.open_members |= inc.open_members
            root.entities |= inc.entities
            root.sources |= inc.sources
            for aid in inc.members:
                self._of_alert[aid] = root.id
            if _SEVERITY_RANK[inc.severity] > _SEVERITY_RANK[root.severity]:
                root.severity = inc.severity
            self._lead(root, inc.root, inc.action, None)
            inc.merged_into = root.id
            inc.open_members = set()
            touched[inc.id] = inc

    # -- resolution --------------------------------------------------------------------

    def _resolve(self, rec: AlertRecord, touched: dict[str, _Incident]
                 ) -> tuple[_Incident | None, Action]:
        iid = self._of_alert.pop(rec.id, None)
        inc = self.open.get(iid) if iid is not None else None
        action = self._alert_action(rec)
        if inc is None:  # opened before this process started: nothing to group
            return None, action
        inc.open_members.discard(rec.id)
        inc.updated_ms = max(inc.updated_ms, rec.updated_ms)
        touched[inc.id] = inc
        return inc, action

    def _forget(self, inc: _Incident) -> None:
        self.open.pop(inc.id, None)
        if self._at_root.get(inc.root) == inc.id:
            del self._at_root[inc.root]
        for aid in inc.members:
            if self._of_alert.get(aid) == inc.id:
                del self._of_alert[aid]

    def _alert_action(self, rec: AlertRecord) -> Action:
        base = self.book.action_for(rec)
        if rec.level == "gpu":
            return self.history.escalated(rec.entity, base, rec.started_ms)
        return base

"""From an alert to what an SRE should do: the XID catalogue and the repeat history.

The catalogue is data (``xid_catalogue.toml`` beside this module, with a header saying where
each entry comes from): per XID its meaning, whether it is hardware, and the action; per
health rule its action. :class:`ActionBook` reads it once; :meth:`ActionBook.action_for`
gives an alert's own action (an XID alert takes its code's entry).

Repeats escalate: :class:`RepeatHistory` remembers, per GPU, when incidents with each action
opened; the ``[[escalate]]`` entries turn, e.g., the third ``reset_gpu`` of one GPU within
24 h into ``replace`` (resetting it again will not keep it fixed). The history counts
incidents, not alerts, so the metric and the event view of one XID count once.
"""

from __future__ import annotations

import tomllib
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schemas.records import Action, AlertRecord

__all__ = ["CATALOGUE_PATH", "ActionBook", "Escalation", "RepeatHistory", "XidEntry"]

CATALOGUE_PATH = Path(__file__).with_name("xid_catalogue.toml")


@dataclass(frozen=True, slots=True)
class XidEntry:
    code: int
    meaning: str
    hardware: bool
    action: Action


@dataclass(frozen=True, slots=True)
class Escalation:
    """``count`` incidents with ``source`` on one GPU within ``window_ms`` become ``target``."""

    source: Action
    count: int
    window_ms: int
    target: Action


def alert_xid(rec: AlertRecord) -> int | None:
    """The XID code an alert is about (``rule:xid`` keeps it as ``value``, the event rule as
    ``xid``); None for other alerts."""
    if rec.source == "rule:xid":
        value = rec.context.get("value")
    elif rec.source == "rule:event_xid":
        value = rec.context.get("xid")
    else:
        return None
    return int(value) if isinstance(value, int | float) and value == value else None


def rule_name(source: str) -> str:
    """``rule:ecc_dbe`` -> ``ecc_dbe``; ``model:numba`` (and ``model:numba:rack``) -> ``model``."""
    kind, _, rest = source.partition(":")
    return rest.split(":")[0] if kind == "rule" else kind


class ActionBook:
    """The catalogue, loaded and checked."""

    def __init__(self, path: Path = CATALOGUE_PATH) -> None:
        raw = tomllib.loads(path.read_text())
        try:
            d = raw["default"]
            self.default = XidEntry(-1, d["meaning"], bool(d["hardware"]), Action(d["action"]))
            self.xids = {int(k): XidEntry(int(k), v["meaning"], bool(v["hardware"]),
                                          Action(v["action"]))
                         for k, v in raw["xid"].items()}
            self.rules: dict[str, Action | None] = {
                k: None if v == "catalogue" else Action(v) for k, v in raw["rule"].items()}
            self.escalations = tuple(
                Escalation(Action(e["from"]), int(e["count"]), int(float(e["window_h"]) * 3.6e6),
                           Action(e["to"])) for e in raw.get("escalate", []))
        except (KeyError, ValueError, TypeError) as exc:
            raise ValueError(f"{path}: bad catalogue entry: {exc!r}") from exc

    def xid(self, code: int) -> XidEntry:
        return self.xids.get(code, self.default)

    def action_for(self, rec: AlertRecord) -> Action:
        """The alert's own action, before repeats are counted."""
        code = alert_xid(rec)
        if code is not None:
            return self.xid(code).action
        action = self.rules.get(rule_name(rec.source), Action.NONE)
        return action if action is not None else Action.NONE

    def describe(self, rec: AlertRecord) -> dict[str, Any]:
        """Catalogue context for an XID alert (meaning, hardware); empty for others."""
        code = alert_xid(rec)
        if code is None:
            return {}
        e = self.xid(code)
        return {"xid_meaning": e.meaning, "xid_hardware": e.hardware}


class RepeatHistory:
    """Per GPU, the start times of its incidents by action, for escalation."""

    def __init__(self, escalations: tuple[Escalation, ...]) -> None:
        self.escalations = escalations
        self.seen: dict[tuple[str, Action], deque[int]] = {}
        self._longest = max((e.window_ms for e in escalations), default=0)

    def record(self, entity: str, action: Action, ts_ms: int) -> Action:
        """Note an incident with ``action`` on ``entity`` at ``ts_ms``; returns the action
        it escalates to (``action`` itself when it does not)."""
        times = self.seen.setdefault((entity, action), deque())
        times.append(ts_ms)
        while times and ts_ms - times[0] > self._longest:
            times.popleft()
        return self.escalated(entity, action, ts_ms)

    def escalated(self, entity: str, action: Action, ts_ms: int) -> Action:
        """The action the history of ``entity`` turns ``action`` into (without noting it)."""
        times = self.seen.get((entity, action), ())
        out = action
        for e in self.escalations:
            if (e.source is action and e.target.rank > out.rank
                    and sum(1 for t in times if ts_ms - e.window_ms < t <= ts_ms) >= e.count):
                out = e.target
        return out

"""Optional delivery of alerts to an Alertmanager, in its ``POST /api/v2/alerts`` format.

Alertmanager expects a JSON list of ``{labels, annotations, startsAt, endsAt,
generatorURL}``. A firing alert is posted without ``endsAt`` and re-posted every
``resend_s`` (Alertmanager resolves an alert it has not heard of for ``resolve_timeout``);
a resolved one is posted with ``endsAt``. Labels identify the alert (alertname per rule,
entity and its parts, source, severity, action) and name its ``incident``
(``detector.incidents``) and the workload on the GPU (``job``, ``pod``, ``namespace``,
``tenant``, from ``detector.workloads``), so Alertmanager groups by incident and a rack incident can inhibit
its GPUs' warnings (``deploy/alertmanager.yml``); annotations carry the summary, score,
threshold and attribution.

An alert whose incident changes (GPU alerts absorbed by the rack incident that came after
them) is re-posted under the new incident and its old label set resolved, since labels are
an Alertmanager alert's identity.

Delivery is best effort: the alerts topic is the system of record. A failed POST is counted
and logged, never fatal: open alerts are re-posted, and resolutions that did not get through
are kept and retried, every ``retry_s`` while Alertmanager is unreachable (then every
``resend_s``), so an Alertmanager that was down learns every transition once it is back.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp

from schemas.records import AlertRecord, AlertState, IncidentRecord

__all__ = ["AlertmanagerWebhook", "to_alertmanager"]

log = logging.getLogger(__name__)
_PARTS = ("cluster", "row", "rack", "node", "gpu")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC).isoformat().replace("+00:00", "Z")


def to_alertmanager(rec: AlertRecord, generator_url: str = "", incident: str = "",
                    ends_ms: int | None = None) -> dict[str, Any]:
    """One alert record as an Alertmanager v2 postable alert (``ends_ms``: resolve it at
    that time whatever its state)."""
    name = rec.source.split(":", 1)[1].split(":")[0] if ":" in rec.source else rec.source
    labels = {
        "alertname": f"fleetpulse_{name}" if rec.source.startswith("rule:")
        else "fleetpulse_" + rec.source.replace(":", "_") if rec.level == "service"
        else f"fleetpulse_anomaly_{rec.level}",
        "entity": rec.entity,
        "level": rec.level,
        "source": rec.source,
        "severity": rec.severity.value,
        "action": rec.action.value,
        "incident": incident or str(rec.context.get("incident", "")),
    }
    if not labels["incident"]:
        del labels["incident"]
    if rec.level != "service":  # a service's entity is not a fleet path
        for part, value in zip(_PARTS, rec.entity.split("/"), strict=False):
            labels[part] = value
    for key in ("job", "pod", "namespace", "tenant"):  # the workload (detector.workloads)
        workload = rec.context.get(key)
        if isinstance(workload, str) and workload:
            labels[key] = workload
    annotations = {
        "summary": rec.summary,
        "score": f"{rec.score:.3f}",
        "threshold": f"{rec.threshold:.3f}",
        "attribution": ", ".join(f"{a.metric} {a.direction} ({a.weight:.2f})"
                                 for a in rec.attribution),
        "alert_id": rec.id,
    }
    if "xid_meaning" in rec.context:
        annotations["xid_meaning"] = str(rec.context["xid_meaning"])
    out: dict[str, Any] = {"labels": labels, "annotations": annotations,
                           "startsAt": _iso(rec.started_ms)}
    if ends_ms is not None:
        out["endsAt"] = _iso(ends_ms)
    elif rec.state is AlertState.RESOLVED:
        out["endsAt"] = _iso(rec.updated_ms)
    if generator_url:
        out["generatorURL"] = generator_url
    return out


class AlertmanagerWebhook:
    """Posts alert transitions and re-posts open alerts; one aiohttp session."""

    def __init__(self, url: str, timeout_s: float = 5.0, resend_s: float = 60.0,
                 retry_s: float = 5.0) -> None:
        self.endpoint = url.rstrip("/") + "/api/v2/alerts"
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.resend_s = resend_s
        self.retry_s = min(retry_s, resend_s)
        self.open: dict[str, AlertRecord] = {}
        self.incident_of: dict[str, str] = {}
        """Alert id -> incident id, as the newest incident records say."""
        self.unsent: list[dict[str, Any]] = []
        """Resolutions whose POST failed, retried until one succeeds."""
        self.posted = 0
        self.failures = 0
        self._failing = False
        self._session: aiohttp.ClientSession | None = None
        self._last_resend = time.monotonic()

    async def _post(self, alerts: list[dict[str, Any]]) -> bool:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self.timeout)
        try:
            async with self._session.post(self.endpoint, json=alerts) as resp:
                if resp.status >= 300:
                    body = (await resp.text())[:200]
                    raise aiohttp.ClientResponseError(
                        resp.request_info, (), status=resp.status, message=body)
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.failures += 1
            if not self._failing:
                log.warning("alertmanager POST %s failed: %s", self.endpoint, exc)
            self._failing = True
            self.unsent.extend(a for a in alerts if "endsAt" in a)
            return False
        if self._failing:
            log.warning("alertmanager POST %s works again", self.endpoint)
        self._failing = False
        self.posted += len(alerts)
        return True

    def _payload(self, rec: AlertRecord) -> dict[str, Any]:
        return to_alertmanager(rec, incident=self.incident_of.get(rec.id, ""))

    async def deliver(self, records: list[AlertRecord],
                      incidents: list[IncidentRecord] | tuple[IncidentRecord, ...] = ()
                      ) -> bool:
        """Post ``records`` (transitions); firing ones are remembered for resends. An open
        alert that ``incidents`` move to another incident is re-posted under it."""
        out: list[dict[str, Any]] = []
        for rec in records:
            if "incident" in rec.context:
                self.incident_of.setdefault(rec.id, str(rec.context["incident"]))
        for inc in incidents:
            if inc.merged_into:
                continue
            for aid in inc.members:
                old = self.incident_of.get(aid)
                self.incident_of[aid] = inc.id
                if old is not None and old != inc.id and aid in self.open:
                    moved = self.open[aid]
                    out.append(to_alertmanager(moved, incident=old,
                                               ends_ms=int(time.time() * 1000)))
                    out.append(self._payload(moved))
        for rec in records:
            out.append(self._payload(rec))
            if rec.state is AlertState.FIRING:
                self.open[rec.id] = rec
            else:
                self.open.pop(rec.id, None)
                self.incident_of.pop(rec.id, None)
        if not out:
            return True
        return await self._post(out)

    async def resend_due(self) -> None:
        """Re-post every open alert (and resolutions not delivered yet) when ``resend_s``
        has passed, or ``retry_s`` while Alertmanager was failing."""
        wait = self.retry_s if self._failing else self.resend_s
        if time.monotonic() - self._last_resend < wait:
            return
        self._last_resend = time.monotonic()
        unsent, self.unsent = self.unsent, []
        batch = unsent + [self._payload(r) for r in self.open.values()]
        if batch:
            await self._post(batch)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

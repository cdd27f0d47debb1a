"""Optional delivery of alerts to an Alertmanager, in its ``POST /api/v2/alerts`` format.

Alertmanager expects a JSON list of ``{labels, annotations, startsAt, endsAt,
generatorURL}``. A firing alert is posted without ``endsAt`` and re-posted every
``resend_s`` (Alertmanager resolves an alert it has not heard of for ``resolve_timeout``);
a resolved one is posted with ``endsAt``. Labels identify the alert (alertname, entity and
its parts, source, severity), so Alertmanager groups and deduplicates by them; annotations
carry the summary, score, threshold and attribution.

Delivery is best effort: the alerts topic is the system of record. A failed POST is
counted and logged, never fatal, and the next resend covers open alerts.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import Any

import aiohttp

from schemas.records import AlertRecord, AlertState

__all__ = ["AlertmanagerWebhook", "to_alertmanager"]

log = logging.getLogger(__name__)
_PARTS = ("cluster", "row", "rack", "node", "gpu")


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC).isoformat().replace("+00:00", "Z")


def to_alertmanager(rec: AlertRecord, generator_url: str = "") -> dict[str, Any]:
    """One alert record as an Alertmanager v2 postable alert."""
    name = rec.source.split(":", 1)[1].split(":")[0] if ":" in rec.source else rec.source
    labels = {
        "alertname": f"fleetpulse_{name}" if rec.source.startswith("rule:")
        else "fleetpulse_" + rec.source.replace(":", "_") if rec.level == "service"
        else f"fleetpulse_anomaly_{rec.level}",
        "entity": rec.entity,
        "level": rec.level,
        "source": rec.source,
        "severity": rec.severity.value,
    }
    if rec.level != "service":  # a service's entity is not a fleet path
        for part, value in zip(_PARTS, rec.entity.split("/"), strict=False):
            labels[part] = value
    annotations = {
        "summary": rec.summary,
        "score": f"{rec.score:.3f}",
        "threshold": f"{rec.threshold:.3f}",
        "attribution": ", ".join(f"{a.metric} {a.direction} ({a.weight:.2f})"
                                 for a in rec.attribution),
        "alert_id": rec.id,
    }
    out: dict[str, Any] = {"labels": labels, "annotations": annotations,
                           "startsAt": _iso(rec.started_ms)}
    if rec.state is AlertState.RESOLVED:
        out["endsAt"] = _iso(rec.updated_ms)
    if generator_url:
        out["generatorURL"] = generator_url
    return out


class AlertmanagerWebhook:
    """Posts alert transitions and re-posts open alerts; one aiohttp session."""

    def __init__(self, url: str, timeout_s: float = 5.0, resend_s: float = 60.0) -> None:
        self.endpoint = url.rstrip("/") + "/api/v2/alerts"
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.resend_s = resend_s
        self.open: dict[str, AlertRecord] = {}
        self.posted = 0
        self.failures = 0
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
            log.warning("alertmanager POST %s failed: %s", self.endpoint, exc)
            return False
        self.posted += len(alerts)
        return True

    async def deliver(self, records: list[AlertRecord]) -> bool:
        """Post ``records`` (transitions); firing ones are remembered for resends."""
        for rec in records:
            if rec.state is AlertState.FIRING:
                self.open[rec.id] = rec
            else:
                self.open.pop(rec.id, None)
        if not records:
            return True
        return await self._post([to_alertmanager(r) for r in records])

    async def resend_due(self) -> None:
        """Re-post every open alert when ``resend_s`` has passed."""
        if time.monotonic() - self._last_resend < self.resend_s:
            return
        self._last_resend = time.monotonic()
        if self.open:
            await self._post([to_alertmanager(r) for r in self.open.values()])

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

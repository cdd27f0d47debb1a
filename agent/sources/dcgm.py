"""The ``dcgm`` source: scrape a dcgm-exporter endpoint, one HTTP GET per tick.

Thin I/O around :func:`agent.sources.dcgm_parse.parse_exposition`, which holds every
parsing rule. What this shell adds:

* one aiohttp session for the agent's life (keep-alive: a scrape is one request on an open
  connection), a per-scrape timeout below the sampling interval;
* a stable layout: while the exporter reports the same GPUs and fields, the same id / name
  / uuid objects are returned each tick, so the sampler keeps filling one frame;
* events: an inventory event per GPU row when it first appears or its labels change
  (model, driver, PCI bus id, MIG profile), and an XID event when a row's
  ``DCGM_FI_DEV_XID_ERRORS`` changes to a new non-zero code;
* counters of what the parser skipped (``stats``), exported on the agent's /metrics.

Options (``[source.dcgm]``): ``url`` (default ``http://127.0.0.1:9400/metrics``) and
``timeout_s``.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
import numpy as np
import numpy.typing as npt

from agent.sources.base import (
    Gathered,
    Source,
    SourceContext,
    SourceError,
    SourceEvent,
    register_source,
)
from agent.sources.dcgm_parse import DcgmRow, DcgmScrape, parse_exposition
from schemas.catalog import BY_DCGM_FIELD
from schemas.records import EventKind

__all__ = ["DEFAULT_URL", "DcgmSource", "DcgmStats"]

log = logging.getLogger(__name__)

DEFAULT_URL = "http://127.0.0.1:9400/metrics"
_XID_ID = BY_DCGM_FIELD["DCGM_FI_DEV_XID_ERRORS"].id
_MAX_PAGE = 32 << 20


@dataclass(slots=True)
class DcgmStats:
    """Scrape counters (plain ints, read by /metrics)."""

    scrapes: int = 0
    scrape_errors: int = 0
    sentinels: int = 0
    unattributed: int = 0
    duplicates: int = 0
    invalid_lines: int = 0


class DcgmSource(Source):
    """Reads dcgm-exporter's Prometheus page. See the module docstring."""

    name = "dcgm"

    def __init__(self, url: str = DEFAULT_URL, timeout_s: float = 2.0) -> None:
        if not url.startswith(("http://", "https://")):
            raise SourceError(f"dcgm url must be http(s)://..., got {url!r}", retriable=False)
        self.url = url
        self.timeout_s = timeout_s
        self.stats = DcgmStats()
        self.last_scrape: DcgmScrape | None = None
        self._session: aiohttp.ClientSession | None = None
        self._layout: tuple[npt.NDArray[np.uint16], tuple[str, ...],
                            npt.NDArray[np.int32], tuple[str, ...]] | None = None
        self._rows: dict[str, DcgmRow] = {}
        self._last_xid: dict[str, float] = {}
        self._warned_invalid = False

    def describe(self) -> str:
        return f"dcgm-exporter metrics scraped from {self.url}"

    def error_counts(self) -> dict[str, int]:
        st = self.stats
        return {"scrape": st.scrape_errors, "invalid_line": st.invalid_lines,
                "sentinel": st.sentinels, "unattributed": st.unattributed,
                "duplicate": st.duplicates}

    async def start(self) -> None:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout_s),
                headers={"Accept": "text/plain"},
            )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def fetch(self) -> str:
        """One GET of the exporter page; SourceError (retriable) on any HTTP trouble."""
        await self.start()
        assert self._session is not None
        try:
            async with self._session.get(self.url) as resp:
                if resp.status != 200:
                    raise SourceError(f"{self.url} answered HTTP {resp.status}")
                body = await resp.content.read(_MAX_PAGE + 1)
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.stats.scrape_errors += 1
            raise SourceError(f"scraping {self.url} failed: {exc!r}") from exc
        except SourceError:
            self.stats.scrape_errors += 1
            raise
        if len(body) > _MAX_PAGE:
            self.stats.scrape_errors += 1
            raise SourceError(f"{self.url} returned more than {_MAX_PAGE} bytes")
        return body.decode("utf-8", errors="replace")

    async def gather(self, ts_ms: int) -> Gathered:
        scrape = parse_exposition(await self.fetch())
        self.last_scrape = scrape
        st = self.stats
        st.scrapes += 1
        st.sentinels += scrape.sentinels
        st.unattributed += scrape.unattributed
        st.duplicates += scrape.duplicates
        st.invalid_lines += len(scrape.invalid_lines)
        if scrape.invalid_lines and not self._warned_invalid:
            self._warned_invalid = True
            lineno, text = scrape.invalid_lines[0]
            log.warning("%s: %d lines are not valid exposition text and were skipped, e.g. "
                        "line %d: %r", self.url, len(scrape.invalid_lines), lineno, text)
        ids, extra, gpus, uuids = scrape.metric_ids, scrape.extra, scrape.gpus, scrape.uuids
        prev = self._layout
        if (prev is not None and np.array_equal(prev[0], ids) and prev[1] == extra
                and np.array_equal(prev[2], gpus) and prev[3] == uuids):
            ids, extra, gpus, uuids = prev
        else:
            self._layout = (ids, extra, gpus, uuids)
        return Gathered(ts_ms=ts_ms, metric_ids=ids, extra=extra, gpus=gpus, uuids=uuids,
                        values=scrape.values, events=self._events(scrape, ts_ms),
                        native=scrape.fields)

    def _events(self, scrape: DcgmScrape, ts_ms: int) -> tuple[SourceEvent, ...]:
        events: list[SourceEvent] = []
        for row in scrape.rows:
            if self._rows.get(row.uuid) != row:
                self._rows[row.uuid] = row
                data: dict[str, Any] = {k: v for k, v in dataclasses.asdict(row).items()
                                        if v is not None and k not in ("gpu", "uuid")}
                data["source"] = "dcgm"
                events.append(SourceEvent(EventKind.INVENTORY, ts_ms, row.gpu, row.uuid, data))
        hits = np.flatnonzero(scrape.metric_ids == _XID_ID)
        if hits.size:
            col = scrape.values[:, int(hits[0])]
            for i, row in enumerate(scrape.rows):
                xid = float(col[i])
                if xid == xid and self._last_xid.get(row.uuid) != xid:
                    events.append(SourceEvent(EventKind.XID, ts_ms, row.gpu, row.uuid,
                                              {"xid": int(xid), "source": "dcgm"}))
                if xid == xid:
                    self._last_xid[row.uuid] = xid
        return tuple(events)


@register_source("dcgm")
def _open(ctx: SourceContext) -> Source:
    opts = ctx.options
    timeout = float(opts.get("timeout_s", min(2.0, max(ctx.interval_s * 0.8, 0.05))))
    return DcgmSource(str(opts.get("url", DEFAULT_URL)), timeout)

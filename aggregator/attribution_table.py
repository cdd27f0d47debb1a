"""Which workload each GPU served when, as the aggregator learned it from the events topic.

The table holds facts, never a running state: an attachment is keyed by
``(gpu entity path, workload, from_ms)`` and its end is ``to_ms`` once an event said so.
Folding the same events in any order, or twice (a replay after kill -9), gives the same
table -- a second start event is the same key, an end only fills ``to_ms``. So the workload
rollups computed from it (:mod:`aggregator.workload_query`) do not depend on how the events
topic and the samples topic interleaved, nor on a crash.

An attachment still open ends where the next attachment of the same GPU begins (an agent
restarted and re-announced, or missed the end): :meth:`spans` applies that at read time.

XID events are kept too (GPU path, time, code): a job's XIDs are those of its GPUs during
its attachments; so are GPU alerts (from the alerts topic: id and start), a job's alerts
being those that started on its GPUs while attached.

Persistence: an append-only JSON-lines file beside the entity index
(:class:`~aggregator.jsonl_log.JsonlAppender`), one line per new fact, handed to the OS at
once and fsynced by :meth:`flush` in the durability cycle before the events partition's
offset is committed. A torn last line is ignored at load; a disk that refuses a write
loses nothing (the facts wait in memory, and the cycle checkpoints and commits nothing
until they are on the disk).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from aggregator.jsonl_log import JsonlAppender, read_records
from schemas.attribution import Attachment
from schemas.records import AlertRecord, EventKind, EventRecord

__all__ = ["AttributionTable", "Span"]


@dataclass(frozen=True, slots=True)
class Span:
    """One workload on one GPU entity over ``[start, end)`` (``end`` None: open)."""

    gpu: str
    """GPU entity path ``cluster/row/rack/node/<index>``."""
    workload: str
    labels: dict[str, str]
    start: int
    end: int | None


class AttributionTable:
    """See the module docstring. Used from the aggregator's store thread only."""

    def __init__(self, path: str | Path | None) -> None:
        self._path = Path(path) if path is not None else None
        self._ends: dict[tuple[str, str, int], int | None] = {}
        self._labels: dict[tuple[str, str, int], dict[str, str]] = {}
        self.xids: dict[str, set[tuple[int, int]]] = {}
        """GPU path -> {(ts_ms, xid)}."""
        self.alerts: dict[str, dict[str, int]] = {}
        """GPU path -> {alert id: started_ms}."""
        self.unmapped = 0
        """Attribution events without a GPU index (a MIG uuid the agent could not place)."""
        self.version = 0
        self._log: JsonlAppender | None = None
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            if self._path.exists():
                self._load()
            self._log = JsonlAppender(self._path, "attribution table")

    def __len__(self) -> int:
        return len(self._ends)

    def _load(self) -> None:
        assert self._path is not None
        for rec in read_records(self._path):
            if "xid" in rec:
                self._xid(rec["gpu"], rec["ts"], rec["xid"])
            elif "alert" in rec:
                self._alert(rec["gpu"], rec["alert"], rec["ts"])
            else:
                self._attach(rec["gpu"], rec["workload"], rec["labels"], rec["from"], rec["to"])

    # ----------------------------------------------------------------- folding
    def observe(self, rec: EventRecord) -> bool:
        """Fold one event (raises DecodeError for a malformed attribution); True if new."""
        if rec.kind is EventKind.XID:
            xid = rec.data.get("xid")
            if rec.gpu is None or type(xid) is not int:
                return False
            path = f"{rec.identity.path}/{rec.gpu}"
            if self._xid(path, rec.ts_ms, xid):
                self._write({"gpu": path, "ts": rec.ts_ms, "xid": xid})
                return True
            return False
        if rec.kind is not EventKind.ATTRIBUTION:
            return False
        att = Attachment.from_event(rec)
        if rec.gpu is None:
            self.unmapped += 1
            return False
        path = f"{rec.identity.path}/{rec.gpu}"
        if self._attach(path, att.workload, att.labels, att.from_ms, att.to_ms):
            self._write({"gpu": path, "workload": att.workload, "labels": att.labels,
                         "from": att.from_ms, "to": att.to_ms})
            return True
        return False

    def observe_alert(self, rec: AlertRecord) -> bool:
        """Fold one alert transition (GPU level only); True if it is a new alert."""
        head, sep, index = rec.entity.rpartition("/gpu-")
        if rec.level != "gpu" or not sep or not index.isdigit():
            return False
        path = f"{head}/{index}"
        if self._alert(path, rec.id, rec.started_ms):
            self._write({"gpu": path, "alert": rec.id, "ts": rec.started_ms})
            return True
        return False

    def _alert(self, path: str, alert: str, ts: int) -> bool:
        seen = self.alerts.setdefault(path, {})
        if alert in seen:
            return False
        seen[alert] = ts
        self.version += 1
        return True

    def _xid(self, path: str, ts: int, xid: int) -> bool:
        seen = self.xids.setdefault(path, set())
        if (ts, xid) in seen:
            return False
        seen.add((ts, xid))
        self.version += 1
        return True

    def _attach(self, path: str, workload: str, labels: dict[str, str], start: int,
                end: int | None) -> bool:
        key = (path, workload, start)
        if key in self._ends:
            if end is None or self._ends[key] is not None:
                return False  # the same start again, or an end already known
            self._ends[key] = end
        else:
            self._ends[key] = end
            self._labels[key] = dict(labels)
        self.version += 1
        return True

    def _write(self, obj: dict[str, object]) -> None:
        if self._log is not None:
            self._log.append(obj)

    def flush(self) -> None:
        """Make every fact durable (the durability cycle, before offsets are committed);
        StoreWriteError while the disk refuses."""
        if self._log is not None:
            self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    # ----------------------------------------------------------------- reading
    def spans(self) -> list[Span]:
        """Every attachment, sorted by (GPU, start); an open one ends at the GPU's next."""
        out: list[Span] = []
        keys = sorted(self._ends)
        by_gpu: dict[str, list[tuple[str, str, int]]] = {}
        for k in keys:
            by_gpu.setdefault(k[0], []).append(k)
        for gpu in sorted(by_gpu):
            ks = sorted(by_gpu[gpu], key=lambda k: (k[2], k[1]))
            for i, k in enumerate(ks):
                end = self._ends[k]
                later = [o[2] for o in ks[i + 1:] if o[2] > k[2]]
                if later and (end is None or end > later[0]):
                    end = later[0]
                out.append(Span(gpu, k[1], self._labels[k], k[2], end))
        return out

    def xids_in(self, gpu: str, start: int, end: int | None) -> int:
        """XID events of ``gpu`` with ``start <= ts < end``."""
        hi = end if end is not None else 1 << 62
        return sum(1 for ts, _ in self.xids.get(gpu, ()) if start <= ts < hi)

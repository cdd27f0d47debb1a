"""Workload rollups: a job's (or a namespace's) metrics, from its own GPUs' stored windows.

``{level="job", job="4711"}`` or ``{level="namespace", namespace="ml"}`` selects the GPUs a
workload ran on (:class:`~aggregator.attribution_table.AttributionTable`) and, for each, the
part of that GPU's series inside the attachment: a window belongs to the workload that was
attached at its start (the raw tier: a sample at its timestamp); a coarse tier's window
only where it lies wholly inside the attachment, the 10 s windows covering the edges. The
job's value of a step
is then the merge of those windows over all its GPUs: sums, counts and increases add, min
and max take extremes, ``avg`` is sum / count, ``p50`` / ``p95`` / ``p99`` come from the
mergeable sketch (:mod:`aggregator.sketch`) over the job's GPU-windows (a window's mean; the
raw tier: its samples).

Why at read time and not as stored series of their own: the GPU windows are already stored
in every tier and are exact after a kill -9 (:mod:`aggregator.rack_stage`), and the table is
keyed by facts, so a job rollup read from them is exact too, whatever the order in which the
samples and events topics were consumed -- with no second copy of the data, and a job that
spans racks on several partitions costs nothing extra to assemble. The cost moves to the
query: one store read of the job's GPUs, columnar, as for any selector.

Besides the catalog metrics, three workload metrics:

* ``fleetpulse_workload_gpu_seconds``: attached GPU time within each step;
* ``fleetpulse_workload_throttled_seconds``: GPU time in windows whose clock-event reasons
  reached a slowdown bit (a value >= 4: anything but idle and application clocks), at the
  10 s tier or the tier asked for;
* ``fleetpulse_workload_xids``: XID events on the workload's GPUs while attached;
* ``fleetpulse_workload_alerts``: GPU alerts (from the alerts topic) that started on the
  workload's GPUs while attached.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numba as nb
import numpy as np
import numpy.typing as npt

from aggregator.attribution_table import AttributionTable, Span
from aggregator.promql import Selector
from aggregator.series_index import EntityIndex, compile_matcher, value_matches
from aggregator.series_layout import AGG_CODES, AGG_SLOTS, ENTITY_STRIDE, default_agg
from aggregator.sketch import slot_of, slot_value
from aggregator.step_kernels import OPS, step_reduce
from aggregator.store import SeriesStore
from schemas.catalog import BY_NAME, CATALOG, Kind

__all__ = ["WORKLOAD_LABELS", "WORKLOAD_LEVELS", "WORKLOAD_METRICS", "WorkloadQuery"]

WORKLOAD_LEVELS: Final = ("job", "namespace")
WORKLOAD_LABELS: Final = ("level", "job", "namespace", "pod", "container", "tenant",
                          "cluster")
GPU_SECONDS: Final = "fleetpulse_workload_gpu_seconds"
THROTTLED_SECONDS: Final = "fleetpulse_workload_throttled_seconds"
XIDS: Final = "fleetpulse_workload_xids"
ALERTS: Final = "fleetpulse_workload_alerts"
WORKLOAD_METRICS: Final = (GPU_SECONDS, THROTTLED_SECONDS, XIDS, ALERTS)
_THROTTLE_ID: Final = BY_NAME["fleetpulse_gpu_clock_event_reasons"].id
_SLOWDOWN_MIN: Final = 4.0
_QUANTILES: Final = {"p50": 0.5, "p90": 0.9, "p95": 0.95, "p99": 0.99}
_AGGS: Final = {Kind.GAUGE: ("count", "sum", "min", "max", "avg", *_QUANTILES),
                Kind.COUNTER: ("count", "increase"),
                Kind.STATE: ("count", "min", "max"),
                Kind.EVENT: ("count",)}
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class _Group:
    labels: dict[str, str]
    spans: list[tuple[int, int, int]]
    """(GPU entity id, start, end) -- end clipped to a far future when open."""
    paths: list[tuple[str, int, int]]
    """(GPU path, start, end) for the XID count."""


@nb.njit(cache=True)
def _slots(values: F64) -> I64:  # pragma: no cover - numba
    out = np.empty(values.size, np.int64)
    for i in range(values.size):
        out[i] = slot_of(values[i])
    return out


def _nan_merge(block: F64, op: str) -> F64:
    """Merge rows (one per GPU span) of [rows, n] into [n]; NaN where every row is NaN."""
    if block.shape[0] == 0:
        return np.full(block.shape[1], np.nan)
    empty = np.isnan(block).all(axis=0)
    with np.errstate(invalid="ignore"):
        if op == "min":
            row = np.nanmin(np.where(empty, 0.0, block), axis=0)
        elif op == "max":
            row = np.nanmax(np.where(empty, 0.0, block), axis=0)
        else:
            row = np.nansum(block, axis=0)
    return np.where(empty, np.nan, row)


class WorkloadQuery:
    """Evaluates workload-level selectors over one aggregator's store and table."""

    def __init__(self, table: AttributionTable, store: SeriesStore, index: EntityIndex,
                 max_series: int = 50_000) -> None:
        self.table = table
        self.store = store
        self.index = index
        self.max_series = max_series

    @staticmethod
    def applies(sel: Selector) -> bool:
        """True for a selector whose ``level`` matcher is ``="job"`` or ``="namespace"``."""
        return any(lab == "level" and op == "=" and v in WORKLOAD_LEVELS
                   for lab, op, v in sel.matchers)

    # ----------------------------------------------------------------- grouping
    def groups(self, level: str, matchers: list[tuple[str, str, str]]) -> dict[str, _Group]:
        """The workloads (or namespaces) the matchers select, with their GPU spans."""
        compiled = [(lab, op, v, compile_matcher(op, v)) for lab, op, v in matchers]
        out: dict[str, _Group] = {}
        far = 1 << 62
        for span in self.table.spans():
            key, labels = self._key(level, span)
            if not key or not all(value_matches(op, v, labels.get(lab, ""), rx)
                                  for lab, op, v, rx in compiled):
                continue
            parts = span.gpu.split("/")
            eid = self.index.get(("gpu", *parts))  # type: ignore[arg-type]
            g = out.get(key)
            if g is None:
                g = out[key] = _Group(labels, [], [])
            end = span.end if span.end is not None else far
            if eid is not None:
                g.spans.append((eid, span.start, end))
            g.paths.append((span.gpu, span.start, end))
        return dict(sorted(out.items()))

    @staticmethod
    def _key(level: str, span: Span) -> tuple[str, dict[str, str]]:
        lab = span.labels
        cluster = span.gpu.split("/", 1)[0]
        if level == "job":
            labels: dict[str, str] = {"level": "job", "job": span.workload,
                                      "cluster": cluster}
            labels.update({k: lab[k] for k in ("namespace", "pod", "tenant") if k in lab})
            return span.workload, labels
        ns = lab.get("namespace") or lab.get("tenant") or ""
        labels = {"level": "namespace", "namespace": ns, "cluster": cluster}
        if "tenant" in lab:
            labels["tenant"] = lab["tenant"]
        return ns, labels

    def label_values(self, name: str) -> list[str]:
        """Values of a workload label (``level``: the workload levels, once there are any)."""
        spans = self.table.spans()
        if name == "level":
            return list(WORKLOAD_LEVELS) if spans else []
        if name == "job":
            return sorted({s.workload for s in spans})
        if name in ("namespace", "pod", "tenant"):
            return sorted({s.labels[name] for s in spans if s.labels.get(name)})
        return []

    # ----------------------------------------------------------------- evaluation
    def evaluate(self, sel: Selector, tier: str, t0: int, step: int, n: int
                 ) -> tuple[list[dict[str, str]], F64]:
        """(labels, values [series, n]) of a workload selector on the output grid."""
        level = next(v for lab, op, v in sel.matchers if lab == "level" and op == "=")
        names = [m for m in sel.matchers if m[0] == "__name__"]
        aggs = [m for m in sel.matchers if m[0] == "agg"]
        rest = [m for m in sel.matchers if m[0] not in ("__name__", "agg", "level")]
        for lab, _, _ in rest:
            if lab not in WORKLOAD_LABELS:
                raise ValueError(f"unknown label {lab!r} at level {level!r}; labels are "
                                 f"__name__, agg, {', '.join(WORKLOAD_LABELS)}")
        groups = self.groups(level, rest)
        metric_names = [m.name for m in CATALOG] + list(WORKLOAD_METRICS)
        chosen = [nm for nm in metric_names
                  if all(value_matches(op, v, nm, compile_matcher(op, v)) for _, op, v in names)]
        labels: list[dict[str, str]] = []
        rows: list[F64] = []
        for name in chosen:
            metric = BY_NAME.get(name)
            if metric is None:
                cands: tuple[str, ...] = ("sum",)
            elif aggs:
                cands = _AGGS[metric.kind]
            else:
                cands = (default_agg(metric.kind) if metric.kind is not Kind.EVENT else "count",)
            cands = tuple(a for a in cands
                          if all(value_matches(op, v, a, compile_matcher(op, v))
                                 for _, op, v in aggs))
            for g in groups.values():
                if metric is not None and not self._has(g, metric.id):
                    continue
                for a in cands:
                    if len(rows) >= self.max_series:
                        raise ValueError(f"the query selects more than the limit of "
                                         f"{self.max_series} series; narrow the selector")
                    rows.append(self._values(g, name, a, tier, t0, step, n))
                    labels.append({**g.labels, "__name__": name, "agg": a})
        vals = np.stack(rows) if rows else np.zeros((0, n))
        return labels, vals

    def _has(self, g: _Group, metric_id: int) -> bool:
        return any(bool(self.index.metrics[e, metric_id]) for e, _, _ in g.spans)

    def _values(self, g: _Group, name: str, agg: str, tier: str, t0: int, step: int,
                n: int) -> F64:
        grid = t0 + np.arange(n, dtype=np.int64) * step
        if name == GPU_SECONDS:
            out = np.zeros(n)
            for _, a, b in g.paths:
                out += np.maximum(np.minimum(grid, b) - np.maximum(grid - step, a), 0) / 1000
            return out
        if name in (XIDS, ALERTS):
            out = np.zeros(n)
            for path, a, b in g.paths:
                times = ([at for at, _ in self.table.xids.get(path, ())] if name == XIDS
                         else list(self.table.alerts.get(path, {}).values()))
                for at in times:
                    if a <= at < b:
                        i = (at - t0) // step + 1
                        if 0 <= i < n:
                            out[i] += 1
            return out
        if name == THROTTLED_SECONDS:
            t = "10s" if tier == "raw" else tier
            width = self.store.tiers[t].resolution_ms
            ts, vals, offs = self._read(g, _THROTTLE_ID, "max", t, t0, step, n)
            hit = np.where(np.isnan(vals), np.nan, (vals >= _SLOWDOWN_MIN) * (width / 1000))
            return _nan_merge(step_reduce(ts, hit, offs, t0, step, self._span(t, step), n,
                                          OPS["sum"]), "sum")
        metric = BY_NAME[name]
        if tier == "raw" and metric.kind is Kind.COUNTER:
            tier = "10s"  # an increase needs the windows' reset handling, not raw samples
        raw = tier == "raw"
        span = self._span(tier, step)
        if agg in ("count", "sum", "min", "max", "increase"):
            stored = "raw" if raw else agg
            ts, vals, offs = self._read(g, metric.id, stored, tier, t0, step, n)
            op = {"count": "count" if raw else "sum", "min": "min", "max": "max"}.get(agg,
                                                                                    "sum")
            merged = step_reduce(ts, vals, offs, t0, step, span, n, OPS[op])
            return _nan_merge(merged, "sum" if op == "count" else op)
        if agg == "avg":
            s = self._merged(g, metric.id, "sum", tier, t0, step, n)
            c = self._merged(g, metric.id, "count", tier, t0, step, n)
            with np.errstate(invalid="ignore", divide="ignore"):
                return s / c
        return self._quantile(g, metric.id, _QUANTILES[agg], tier, t0, step, n)

    def _merged(self, g: _Group, mid: int, agg: str, tier: str, t0: int, step: int,
                n: int) -> F64:
        raw = tier == "raw"
        ts, vals, offs = self._read(g, mid, "raw" if raw else agg, tier, t0, step, n)
        op = "count" if raw and agg == "count" else "sum"
        return _nan_merge(step_reduce(ts, vals, offs, t0, step, self._span(tier, step), n,
                                      OPS[op]), "sum")

    def _span(self, tier: str, step: int) -> int:
        return step if tier == "raw" else max(step, self.store.tiers[tier].resolution_ms)

    def _pieces(self, g: _Group, tier: str) -> list[tuple[str, int, int, int]]:
        """(tier, GPU entity, lo, hi) covering each span: a coarse tier's windows only where
        they lie wholly inside the attachment, the 10 s tier at its edges -- so a job that
        starts mid-hour still gets its first minutes in an hourly query."""
        if tier in ("raw", "10s"):
            return [(tier, e, a, b) for e, a, b in g.spans]
        res = self.store.tiers[tier].resolution_ms
        out: list[tuple[str, int, int, int]] = []
        for e, a, b in g.spans:
            ia, ib = -(-a // res) * res, b // res * res
            if ia < ib:
                out += [("10s", e, a, ia), (tier, e, ia, ib), ("10s", e, ib, b)]
            else:
                out.append(("10s", e, a, b))
        return out

    def _read(self, g: _Group, mid: int, agg: str, tier: str, t0: int, step: int, n: int
              ) -> tuple[I64, F64, I64]:
        """CSR (ts, values, offsets) of each span piece's points inside its attachment."""
        ts_parts: list[I64] = []
        val_parts: list[F64] = []
        counts: list[I64] = []
        lo, hi = t0 - self._span(tier, step), t0 + (n - 1) * step
        pieces = self._pieces(g, tier)
        for t in dict.fromkeys(p[0] for p in pieces):
            mine = [p for p in pieces if p[0] == t]
            eids = np.asarray([e for _, e, _, _ in mine], np.int64)
            code = AGG_CODES["raw" if t == "raw" else agg]
            r = self.store.read(t, eids * ENTITY_STRIDE + mid * AGG_SLOTS + code, lo, hi)
            per = np.diff(r.offsets)
            owner = np.repeat(np.arange(eids.size), per)
            starts = np.asarray([a for _, _, a, _ in mine], np.int64)[owner]
            ends = np.asarray([b for _, _, _, b in mine], np.int64)[owner]
            ts_parts.append(r.ts)
            val_parts.append(np.where((r.ts >= starts) & (r.ts < ends), r.values, np.nan))
            counts.append(per)
        if not ts_parts:
            return np.zeros(0, np.int64), np.zeros(0), np.zeros(1, np.int64)
        offsets = np.zeros(sum(c.size for c in counts) + 1, np.int64)
        np.cumsum(np.concatenate(counts), out=offsets[1:])
        return np.concatenate(ts_parts), np.concatenate(val_parts), offsets

    def _quantile(self, g: _Group, mid: int, q: float, tier: str, t0: int, step: int,
                  n: int) -> F64:
        """Quantile ``q`` of the workload's GPU-windows (raw: samples) per output step."""
        raw = tier == "raw"
        ts, s, _ = self._read(g, mid, "raw" if raw else "sum", tier, t0, step, n)
        if not raw:
            _, c, _ = self._read(g, mid, "count", tier, t0, step, n)
            with np.errstate(invalid="ignore", divide="ignore"):
                s = s / c
        ok = ~np.isnan(s)
        ts, s = ts[ok], s[ok]
        out = np.full(n, np.nan)
        if s.size == 0:
            return out
        span = self._span(tier, step)
        # output i merges points with t_i - span <= ts < t_i (as step_reduce does)
        first = np.maximum((ts - t0) // step + 1, 0)
        last = np.minimum((ts - t0 + span) // step, n - 1)
        reps = np.maximum(last - first + 1, 0)
        outs = np.repeat(first, reps) + (np.arange(reps.sum()) - np.repeat(np.cumsum(reps)
                                                                          - reps, reps))
        slots = np.repeat(_slots(s), reps)
        order = np.lexsort((slots, outs))
        outs, slots = outs[order], slots[order]
        uniq, begin, cnt = np.unique(outs, return_index=True, return_counts=True)
        rank = np.floor(q * (cnt - 1.0) + 1e-9).astype(np.int64)
        out[uniq] = slot_value(slots[begin + rank])
        return out

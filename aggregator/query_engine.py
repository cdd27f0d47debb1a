"""Evaluating the PromQL subset over the entity index and the tiered store.

A selector resolves columnar: entity matchers -> entity ids (:class:`EntityIndex`), the
metric name -> catalog ids, ``agg`` -> stored or virtual aggregates; every series of one
stored aggregate is then read with *one* store call and reduced to output steps with one
numba call (:mod:`aggregator.step_kernels`). Nothing is done per sample in Python.

Tier choice: the coarsest tier whose resolution is at most the step (``raw`` only below
10 s, for GPU series), unless the request names one (``resolution``); a tier whose
retention does not reach back to ``start`` is skipped for the next coarser one.

Output point at time ``t`` merges the windows that *ended* by ``t`` and started within the
step before it (``[t - step, t)``), so a 1 h step over 1 min windows is the exact merge of 60
windows: sums add, min/max take extremes, ``avg`` is sum/count, quantiles merge sketches.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt
import orjson

from aggregator.promql import Aggregate, Selector, parse
from aggregator.series_index import EntityIndex, compile_matcher, value_matches
from aggregator.series_layout import (
    AGG_CODES,
    AGG_SLOTS,
    ENTITY_STRIDE,
    STORED_AGGS,
    default_agg,
)
from aggregator.sketch import N_SLOTS, slot_value
from aggregator.step_kernels import OPS, sketch_quantiles, step_reduce
from aggregator.store import SeriesStore
from aggregator.workload_query import WorkloadQuery
from schemas.catalog import BY_ID, CATALOG, Kind

__all__ = ["TIER_NAMES", "QueryEngine", "QueryError", "QueryLimits", "SeriesResult"]

TIER_NAMES: Final = ("raw", "10s", "1m", "1h", "1d")
_QUANTILE = re.compile(r"p(\d{1,2}(?:\.\d+)?)")
_SKETCH_LEVELS: Final = ("rack", "row", "cluster")
_VIRTUAL_CODE: Final = {"avg": 1, "stddev": 2}
_SLOT_VALUES = slot_value(np.arange(N_SLOTS, dtype=np.int64))
_MERGE: Final = {"count": "sum", "sum": "sum", "sumsq": "sum", "increase": "sum",
                 "min": "min", "max": "max", "last": "last"}
I64 = npt.NDArray[np.int64]
F64 = npt.NDArray[np.float64]


class QueryError(ValueError):
    """A request the engine refuses; ``error_type`` is Prometheus' errorType."""

    def __init__(self, message: str, error_type: str = "bad_data") -> None:
        super().__init__(message)
        self.error_type = error_type


@dataclass(frozen=True, slots=True)
class QueryLimits:
    max_points_per_series: int = 11_000
    max_series: int = 50_000
    lookback_ms: int = 300_000
    max_samples: int = 50_000_000
    """Most (series x output points) one selector may read, checked before any read: the
    response is bounded by it too. Prometheus' ``--query.max-samples`` default; a 422."""


@dataclass(slots=True)
class SeriesResult:
    """Labels plus values on the output grid (NaN = no data)."""

    labels: list[dict[str, str]]
    values: F64
    """[series, points]"""
    label_json: list[bytes] | None = None
    """The labels already as JSON (cached per series for selector results): a 10,000-GPU
    heatmap then answers without building a dict per series, whose garbage collections
    were the slow tail of its latency."""


@dataclass(frozen=True, slots=True)
class _Resolved:
    eids: I64
    mids: I64
    aggs: tuple[str, ...]
    """one aggregate name per series"""


def _aggs_for(kind: Kind, level: str, tier: str) -> tuple[str, ...]:
    stored = STORED_AGGS[kind]
    virtual: tuple[str, ...] = ()
    if kind is Kind.GAUGE:
        virtual = ("avg", "stddev")
        if level in _SKETCH_LEVELS and tier != "raw":
            virtual += ("p50", "p90", "p95", "p99")
    if tier == "raw":
        stored = ("raw", *stored)
    return stored + virtual


class QueryEngine:
    """Read-side of one aggregator: the same store and index the stages write."""

    def __init__(self, store: SeriesStore, index: EntityIndex,
                 limits: QueryLimits | None = None,
                 now_fn: Callable[[], int | None] | None = None,
                 workloads: WorkloadQuery | None = None) -> None:
        self.store = store
        self.workloads = workloads
        """Answers ``level="job"`` / ``level="namespace"`` (aggregator.workload_query)."""
        self.index = index
        self.limits = limits or QueryLimits()
        self.now_fn = now_fn
        self._labels: dict[tuple[int, int, bool], tuple[dict[str, str], bytes]] = {}
        """Data time in ms (the newest sample seen) that retention is measured against;
        None -> the query's end. Wall-clock time would be wrong for replayed history."""

    # ----------------------------------------------------------------- resolution
    def resolve(self, sel: Selector, tier: str) -> _Resolved:
        """Every (entity, metric, aggregate) the selector matches."""
        name_m = [m for m in sel.matchers if m[0] == "__name__"]
        agg_m = [m for m in sel.matchers if m[0] == "agg"]
        other = [m for m in sel.matchers if m[0] not in ("__name__", "agg")]
        for label, _, _ in other:
            if label not in ("level", "cluster", "row", "rack", "node", "gpu"):
                raise QueryError(f"unknown label {label!r}; labels are __name__, agg, level, "
                                 "cluster, row, rack, node, gpu")
        metrics = []
        for m in CATALOG:
            if all(value_matches(op, v, m.name, compile_matcher(op, v)) for _, op, v in name_m):
                metrics.append(m)
        try:
            eids = self.index.match(other)
        except ValueError as exc:
            raise QueryError(str(exc)) from None
        agg_rx = [(op, v, compile_matcher(op, v)) for _, op, v in agg_m]
        out_e: list[I64] = []
        out_m: list[I64] = []
        out_a: list[str] = []
        levels = self.index.codes("level", eids)
        for m in metrics:
            sel_m = self.index.metrics[eids, m.id]
            has = eids[sel_m]
            if has.size == 0:
                continue
            lv = levels[sel_m]
            for code in np.unique(lv).tolist():
                level = self.index.value_of("level", code)
                ents = has[lv == code]
                if agg_m:
                    cands = [a for a in _aggs_for(m.kind, level, tier)
                             if all(value_matches(op, v, a, rx) for op, v, rx in agg_rx)]
                    cands += self._explicit_quantiles(agg_m, m.kind, level, cands)
                else:
                    cands = ["raw" if tier == "raw" and m.kind is not Kind.COUNTER
                             else default_agg(m.kind)]
                for a in cands:
                    out_e.append(ents)
                    out_m.append(np.full(ents.size, m.id, np.int64))
                    out_a.extend([a] * ents.size)
        if not out_e:
            return _Resolved(np.zeros(0, np.int64), np.zeros(0, np.int64), ())
        res = _Resolved(np.concatenate(out_e), np.concatenate(out_m), tuple(out_a))
        if res.eids.size > self.limits.max_series:
            raise QueryError(f"the query selects {res.eids.size} series, more than the limit of "
                             f"{self.limits.max_series}; narrow the selector")
        return res

    @staticmethod
    def _explicit_quantiles(agg_m: list[tuple[str, str, str]], kind: Kind, level: str,
                            have: list[str]) -> list[str]:
        """``agg="p97.5"`` asks for any quantile the sketch can answer."""
        out = []
        for _, op, v in agg_m:
            q = _QUANTILE.fullmatch(v)
            if op == "=" and q and v not in have and kind is Kind.GAUGE and level in _SKETCH_LEVELS:
                out.append(v)
        return out

    def labels_of(self, res: _Resolved, keep_name: bool = True) -> list[dict[str, str]]:
        """Label sets of resolved series; shared, cached dicts: callers must not mutate them.

        A heatmap asks for 10,000 of them per request, so they are built once per series.
        """
        return [lab for lab, _ in self._cached_labels(res, keep_name)]

    def _cached_labels(self, res: _Resolved, keep_name: bool = True
                       ) -> list[tuple[dict[str, str], bytes]]:
        """(labels, the same as JSON) per resolved series, cached per series."""
        out = []
        cache = self._labels
        codes = [AGG_CODES.get(a, 16 + _VIRTUAL_CODE.get(a, 0)) for a in res.aggs]
        for e, m, a, code in zip(res.eids.tolist(), res.mids.tolist(), res.aggs, codes,
                                 strict=True):
            key = (e * ENTITY_STRIDE + m * AGG_SLOTS, code, keep_name)
            hit = cache.get(key)
            if hit is None or hit[0].get("agg") != a:
                lab = self.index.labels(e)
                lab["agg"] = a
                if keep_name:
                    lab["__name__"] = BY_ID[m].name
                if len(cache) > 1_000_000:
                    cache.clear()
                hit = cache[key] = (lab, orjson.dumps(lab))
            out.append(hit)
        return out

    # ----------------------------------------------------------------- tiers
    def choose_tier(self, step_ms: int, start_ms: int, now_ms: int,
                    resolution: str | None) -> str:
        if resolution and resolution != "auto":
            if resolution not in self.store.tiers:
                raise QueryError(f"resolution must be one of {list(self.store.tiers)} or auto")
            return resolution
        best = "10s"
        for name in TIER_NAMES[1:]:
            spec = self.store.tiers.get(name)
            if spec is not None and spec.resolution_ms <= max(step_ms, 10_000):
                best = name
        if step_ms < 10_000:
            best = "raw"
        order = list(TIER_NAMES)
        i = order.index(best)
        while i + 1 < len(order):
            spec = self.store.tiers.get(order[i])
            if spec is None or not spec.retention_ms or start_ms >= now_ms - spec.retention_ms:
                break
            i += 1
        return order[i]

    # ----------------------------------------------------------------- evaluation
    def _series_values(self, tier: str, res: _Resolved, t0: int, step: int, n: int) -> F64:
        """Values of every resolved series on the output grid, with ONE store read.

        Each requested aggregate needs one or more stored ones (avg = sum / count, stddev
        also sumsq, pNN the sketch); all their series ids go to the store together, so
        every record is checksummed and decoded once however many aggregates use it.
        """
        out = np.full((res.eids.size, n), np.nan)
        width = self.store.tiers[tier].resolution_ms
        span = max(step, width) if tier != "raw" else step
        aggs = np.asarray(res.aggs, dtype=object)
        plan: list[tuple[str, npt.NDArray[np.bool_], list[str]]] = []
        for agg in dict.fromkeys(res.aggs):
            sel = aggs == agg
            if agg in _MERGE or agg == "raw":
                needs = ["last" if agg == "raw" else agg]
            elif agg == "avg":
                needs = ["sum", "count"]
            elif agg == "stddev":
                needs = ["sum", "count", "sumsq"]
            elif _QUANTILE.fullmatch(agg) and tier != "raw":
                needs = ["sketch"]
            else:
                continue
            plan.append((agg, sel, needs))
        blocks: list[I64] = []
        for _, sel, needs in plan:
            for need in needs:
                code = AGG_CODES["raw" if tier == "raw" else need]
                blocks.append(res.eids[sel] * ENTITY_STRIDE + res.mids[sel] * AGG_SLOTS + code)
        if not blocks:
            return out
        r = self.store.read(tier, np.concatenate(blocks), t0 - span, t0 + (n - 1) * step)
        pos = 0

        def take(op: str, square: bool = False) -> F64:
            nonlocal pos
            k = int(np.count_nonzero(sel))
            a, b = int(r.offsets[pos]), int(r.offsets[pos + k])
            offs = r.offsets[pos:pos + k + 1] - a
            vals = r.values[a:b] * r.values[a:b] if square else r.values[a:b]
            pos += k
            return step_reduce(r.ts[a:b], vals, offs, t0, step, span, n, OPS[op])

        for agg, sel, _needs in plan:
            raw = tier == "raw"
            if agg == "raw" or agg in _MERGE:
                base = "last" if agg == "raw" else agg
                op = _MERGE[base]
                if raw:
                    op = {"count": "count", "sum": "sum", "sumsq": "sum",
                          "increase": "sum"}.get(base, op)
                out[sel] = take(op, square=raw and base == "sumsq")
            elif agg in ("avg", "stddev"):
                s = take("sum")
                c = take("count" if raw else "sum")
                with np.errstate(invalid="ignore", divide="ignore"):
                    mean = s / c
                    if agg == "avg":
                        out[sel] = mean
                    else:
                        sq = take("sum", square=raw)
                        out[sel] = np.sqrt(np.maximum(sq / c - mean * mean, 0.0))
            else:
                k = int(np.count_nonzero(sel))
                a, b = int(r.offsets[pos]), int(r.offsets[pos + k])
                q = _QUANTILE.fullmatch(agg)
                assert q is not None
                out[sel] = sketch_quantiles(r.ts[a:b], r.values[a:b],
                                            r.offsets[pos:pos + k + 1] - a, width, t0, step,
                                            span, n, float(q.group(1)) / 100.0, _SLOT_VALUES)
                pos += k
        return out

    def evaluate(self, sel: Selector, tier: str, t0: int, step: int, n: int) -> SeriesResult:
        """One selector on a given tier and output grid (``t0 + k * step``, k < n): what the
        remote-read API reads, with the same series and sample limits as a range query."""
        return self._eval(sel, tier, t0, step, n)

    def _eval(self, expr: Selector | Aggregate, tier: str, t0: int, step: int,
              n: int) -> SeriesResult:
        if isinstance(expr, Selector) and self.workloads is not None \
                and WorkloadQuery.applies(expr):
            try:
                labels, values = self.workloads.evaluate(expr, tier, t0, step, n)
            except ValueError as exc:
                raise QueryError(str(exc)) from None
            return SeriesResult(labels, values)
        if isinstance(expr, Selector):
            res = self.resolve(expr, tier)
            if res.eids.size * n > self.limits.max_samples:
                raise QueryError(f"query processing would load too many samples into memory: "
                                 f"{res.eids.size} series x {n} points is more than the limit "
                                 f"of {self.limits.max_samples}; narrow the selector or raise "
                                 "the step", "execution")
            cached = self._cached_labels(res)
            return SeriesResult([lab for lab, _ in cached],
                                self._series_values(tier, res, t0, step, n),
                                [js for _, js in cached])
        inner = self._eval(expr.expr, tier, t0, step, n)
        groups: dict[tuple[tuple[str, str], ...], list[int]] = {}
        for i, lab in enumerate(inner.labels):
            if expr.by is not None:
                key = tuple((k, lab[k]) for k in expr.by if k in lab)
            else:
                drop = set(expr.without or ()) | {"__name__"}
                key = tuple(sorted((k, v) for k, v in lab.items() if k not in drop))
            groups.setdefault(key, []).append(i)
        labels, rows = [], []
        with np.errstate(invalid="ignore"):
            for key, members in groups.items():
                block = inner.values[members]
                empty = np.isnan(block).all(axis=0)
                if expr.op == "sum":
                    row = np.nansum(block, axis=0)
                elif expr.op == "avg":
                    row = np.nansum(block, axis=0) / np.maximum((~np.isnan(block)).sum(axis=0), 1)
                elif expr.op == "min":
                    row = np.nanmin(np.where(empty, 0.0, block), axis=0)
                elif expr.op == "max":
                    row = np.nanmax(np.where(empty, 0.0, block), axis=0)
                else:
                    filled = np.where(empty, 0.0, block)
                    row = np.nanquantile(filled, float(expr.param or 0.0), axis=0)
                row = np.where(empty, np.nan, row)
                labels.append(dict(key))
                rows.append(row)
        vals = np.stack(rows) if rows else np.zeros((0, n))
        return SeriesResult(labels, vals)

    def query_range(self, query: str, start_ms: int, end_ms: int, step_ms: int,
                    resolution: str | None = None, now_ms: int | None = None) -> SeriesResult:
        if step_ms <= 0:
            raise QueryError("zero or negative query resolution step widths are not accepted. "
                             "Try a positive integer")
        if end_ms < start_ms:
            raise QueryError("end timestamp must not be before start time")
        n = (end_ms - start_ms) // step_ms + 1
        if n > self.limits.max_points_per_series:
            raise QueryError(f"exceeded maximum resolution of {self.limits.max_points_per_series}"
                             " points per timeseries. Try decreasing the query resolution "
                             "(?step=XX)")
        expr = parse(query)
        now = now_ms if now_ms is not None else (self.now_fn() if self.now_fn else None)
        now = end_ms if now is None else now
        tier = self.choose_tier(step_ms, start_ms, now, resolution)
        return self._eval(expr, tier, start_ms, step_ms, int(n))

    def query_instant(self, query: str, time_ms: int,
                      resolution: str | None = None) -> SeriesResult:
        """Each series' newest window (or raw sample) within the lookback before ``time``."""
        expr = parse(query)
        tier = resolution if resolution and resolution != "auto" else "10s"
        if tier not in self.store.tiers:
            raise QueryError(f"resolution must be one of {list(self.store.tiers)} or auto")
        width = max(self.store.tiers[tier].resolution_ms, 1000)
        look = max(self.limits.lookback_ms, width)
        n = look // width
        grid = self._eval(expr, tier, time_ms - (n - 1) * width, width, int(n))
        vals = grid.values
        idx = np.where(np.isnan(vals), -1, np.arange(vals.shape[1])[None, :]).max(axis=1)
        latest = np.full(vals.shape[0], np.nan)
        ok = idx >= 0
        latest[ok] = vals[np.flatnonzero(ok), idx[ok]]
        return SeriesResult(grid.labels, latest[:, None], grid.label_json)

    def series(self, selectors: list[str]) -> list[dict[str, str]]:
        """Label sets of every stored series matching any selector (10 s tier's view)."""
        out: list[dict[str, str]] = []
        seen: set[tuple[tuple[str, str], ...]] = set()
        if len(selectors) > 64:
            raise QueryError(f"{len(selectors)} match[] selectors, more than the limit of 64")
        for text in selectors:
            expr = parse(text)
            if not isinstance(expr, Selector):
                raise QueryError("match[] must be a vector selector")
            res = self.resolve(expr, "10s")
            for lab in self.labels_of(res):
                key = tuple(sorted(lab.items()))
                if key not in seen:
                    seen.add(key)
                    out.append(lab)
            if len(out) > self.limits.max_series:
                raise QueryError(f"the match[] selectors select more than the limit of "
                                 f"{self.limits.max_series} series; narrow them")
        return out

    def label_names(self) -> list[str]:
        names = {"__name__", "agg"}
        for label in ("level", "cluster", "row", "rack", "node", "gpu"):
            if self.index.label_values(label):
                names.add(label)
        if self.workloads is not None:
            names.update(k for k in ("job", "namespace", "pod", "tenant")
                         if self.workloads.label_values(k))
        return sorted(names)

    def label_values(self, name: str) -> list[str]:
        if name == "__name__":
            used = np.flatnonzero(self.index.metrics[: len(self.index)].any(axis=0))
            return sorted(BY_ID[i].name for i in used.tolist() if i in BY_ID)
        if name == "agg":
            return sorted({*AGG_CODES, "avg", "stddev", "p50", "p90", "p95", "p99"} - {"sketch"})
        extra = self.workloads.label_values(name) if self.workloads is not None else []
        if name in ("level", "cluster", "row", "rack", "node", "gpu"):
            return sorted({*self.index.label_values(name), *extra})
        return extra

"""``fleetpulse query``: run a PromQL-subset range query against an aggregator.

Examples::

    fleetpulse query 'fleetpulse_gpu_temperature_celsius{level="rack"}' --start -1h --step 1m
    fleetpulse query 'max by (rack) (fleetpulse_gpu_power_usage_watts{level="gpu",agg="max"})' \\
        --start 2026-01-01T00:00:00Z --end 2026-01-02T00:00:00Z --step 1h --csv

``--job J`` selects one workload: it adds ``level="job",job="J"`` to the selector, so
``fleetpulse query fleetpulse_gpu_utilization_ratio --job 4711`` is the job's utilisation
over its own GPUs (aggregator.workload_query).

It POSTs the same form a Grafana Prometheus data source sends to ``/api/v1/query_range``
and prints a table (time down, series across), or the API's JSON (``--json``), or long CSV.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from datetime import UTC, datetime
from typing import Any

__all__ = ["format_table", "parse_when", "register", "run", "select_job"]

_REL = re.compile(r"-(\d+(?:\.\d+)?)([smhdw])")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("query", help="query rollups (PromQL subset) from a running aggregator",
                       description="Range query against the aggregator's Prometheus-compatible "
                                   "API; prints a readable table by default.")
    p.add_argument("expr", help='e.g. fleetpulse_gpu_temperature_celsius{level="rack"}')
    p.add_argument("--start", default="-1h", help="RFC 3339, Unix seconds, now or -30m/-2h/-7d")
    p.add_argument("--end", default="now", help="as --start (default now)")
    p.add_argument("--step", default="60", help="seconds or a duration like 1m (default 60)")
    p.add_argument("--resolution", help="tier: raw, 10s, 1m, 1h, 1d or auto")
    p.add_argument("--job", help='one workload: adds level="job",job="J" to the selector')
    p.add_argument("--url", default="http://127.0.0.1:9464", help="aggregator base URL")
    p.add_argument("--token", default="", help="bearer token, if the API requires one")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the API's JSON response")
    fmt.add_argument("--csv", action="store_true", help="CSV: time,series,value")
    p.add_argument("--timeout", type=float, default=30.0)
    p.set_defaults(func=run)


def select_job(expr: str, job: str) -> str:
    """``expr`` with ``level="job",job="<job>"`` in its (first) selector."""
    quoted = job.replace("\\", "\\\\").replace('"', '\\"')
    matchers = f'level="job",job="{quoted}"'
    if "{" in expr:
        head, _, tail = expr.partition("{")
        return f"{head}{{{matchers}{',' if tail.strip() and tail.strip()[0] != '}' else ''}{tail}"
    if re.fullmatch(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr.strip()):
        return f"{expr.strip()}{{{matchers}}}"
    raise ValueError("--job needs a selector such as metric_name or metric_name{...}")


def parse_when(text: str, now: float) -> float:
    """Unix seconds from RFC 3339, Unix seconds, ``now`` or ``-<n><s|m|h|d|w>``."""
    if text == "now":
        return now
    m = _REL.fullmatch(text)
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        return float(text)
    except ValueError:
        pass
    dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


def _series_name(metric: dict[str, str]) -> str:
    name = metric.get("__name__", "")
    short = name.removeprefix("fleetpulse_gpu_")
    parts = [f"{k}={v}" for k, v in metric.items() if k not in ("__name__", "cluster", "level")]
    return f"{short}{{{','.join(parts)}}}" if short else "{" + ",".join(parts) + "}"


def format_table(result: list[dict[str, Any]], max_series: int = 8) -> str:
    """Time down, series across (the first ``max_series``), values right-aligned."""
    if not result:
        return "(no data)"
    shown = result[:max_series]
    names = [_series_name(r["metric"]) for r in shown]
    times = sorted({float(t) for r in shown for t, _ in r["values"]})
    cols = [{float(t): v for t, v in r["values"]} for r in shown]
    header = ["time (UTC)", *names]
    rows = [[datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S"),
             *[_num(c.get(t)) for c in cols]] for t in times]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows, strict=True)]
    lines = ["  ".join(h.ljust(w) if i == 0 else h.rjust(w)
                       for i, (h, w) in enumerate(zip(header, widths, strict=True)))]
    lines += ["  ".join(x.ljust(w) if i == 0 else x.rjust(w)
                        for i, (x, w) in enumerate(zip(r, widths, strict=True))) for r in rows]
    if len(result) > max_series:
        lines.append(f"... and {len(result) - max_series} more series (use --csv or --json)")
    return "\n".join(lines)


def _num(v: str | None) -> str:
    if v is None:
        return "-"
    try:
        f = float(v)
    except ValueError:
        return v
    return f"{f:.6g}"


def run(args: argparse.Namespace) -> int:
    now = time.time()
    try:
        start = parse_when(args.start, now)
        end = parse_when(args.end, now)
    except ValueError as exc:
        print(f"fleetpulse query: bad time: {exc}", file=sys.stderr)
        return 2
    expr = args.expr
    if args.job:
        try:
            expr = select_job(expr, args.job)
        except ValueError as exc:
            print(f"query: {exc}", file=sys.stderr)
            return 2
    form = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": args.step}
    if args.resolution:
        form["resolution"] = args.resolution
    req = urllib.request.Request(
        args.url.rstrip("/") + "/api/v1/query_range",
        data=urllib.parse.urlencode(form).encode(),
        headers={"Content-Type": "application/x-www-form-urlencoded",
                 **({"Authorization": f"Bearer {args.token}"} if args.token else {})})
    try:
        with urllib.request.urlopen(req, timeout=args.timeout) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            err = json.loads(exc.read()).get("error", str(exc))
        except ValueError:
            err = str(exc)
        print(f"fleetpulse query: {exc.code}: {err}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError) as exc:
        print(f"fleetpulse query: cannot reach {args.url}: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(body))
        return 0
    result = body["data"]["result"]
    if args.csv:
        w = csv.writer(sys.stdout)
        w.writerow(["time", "series", "value"])
        for r in result:
            name = _series_name(r["metric"])
            for t, v in r["values"]:
                w.writerow([f"{float(t):.3f}", name, v])
        return 0
    print(format_table(result))
    return 0

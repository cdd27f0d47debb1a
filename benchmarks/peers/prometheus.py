"""Prometheus TSDB: ``promtool tsdb create-blocks-from openmetrics``, then block sizes.

Timestamps go in as seconds with millisecond decimals and values as ``repr`` (the shortest
text that parses back to the same double), so Prometheus stores exactly our samples.
"""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from benchmarks.peers.debian import ensure_binary
from benchmarks.peers.series import PeerSeries, finite_only, label_text


def write_openmetrics(series: list[PeerSeries], path: Path) -> int:
    """OpenMetrics text, families contiguous; returns the number of samples written."""
    n = 0
    by_name: dict[str, list[PeerSeries]] = {}
    for s in finite_only(series):
        by_name.setdefault(s.name, []).append(s)
    with open(path, "w") as f:
        for name, group in by_name.items():
            f.write(f"# TYPE {name} gauge\n")
            for s in group:
                head = name + label_text(s.labels) + " "
                f.writelines(f"{head}{v!r} {t // 1000}.{t % 1000:03d}\n"
                             for t, v in zip(s.ts_ms.tolist(), s.values.tolist(), strict=True))
                n += s.ts_ms.size
        f.write("# EOF\n")
    return n


def prometheus_tsdb_bytes(series: list[PeerSeries]) -> dict[str, float]:
    """Build TSDB blocks from ``series``; returns samples, chunk bytes and whole-block bytes."""
    promtool = ensure_binary("promtool", "prometheus")
    with tempfile.TemporaryDirectory(prefix="fp-prom-") as tmp:
        src = Path(tmp) / "input.om"
        out = Path(tmp) / "blocks"
        samples = write_openmetrics(series, src)
        proc = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(src), str(out)],
            capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0:
            raise RuntimeError(f"promtool failed: {proc.stderr[-2000:]}")
        chunks = sum(p.stat().st_size for p in out.glob("*/chunks/*"))
        total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
        blocks = len([p for p in out.iterdir() if p.is_dir()])
    return {"samples": samples, "chunk_bytes": chunks, "block_bytes": total, "blocks": blocks}

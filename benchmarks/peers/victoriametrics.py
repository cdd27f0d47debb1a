"""VictoriaMetrics: import over HTTP, force flush and merge, read its own size metrics.

The server binds 127.0.0.1 on a free port with a temporary data directory and a 100-year
retention (the fleet's timestamps may be older than the default one month); it is stopped
in a ``finally``. Bytes are ``vm_data_size_bytes`` of the storage parts (small + big, i.e.
samples; the indexdb is reported separately), divided by ``vm_rows`` of the same parts.
"""

from __future__ import annotations

import re
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import orjson

from benchmarks.peers.debian import ensure_binary
from benchmarks.peers.series import PeerSeries, finite_only

_METRIC = re.compile(r'^(vm_data_size_bytes|vm_rows|vm_pending_rows|vm_active_merges)'
                     r'\{type="([^"]+)"\} (\S+)$', re.M)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str, timeout: float = 600) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return bytes(r.read())


def _metrics(base: str) -> dict[tuple[str, str], float]:
    text = _get(base + "/metrics").decode()
    return {(m[1], m[2]): float(m[3]) for m in _METRIC.finditer(text)}


def victoriametrics_bytes(series: list[PeerSeries]) -> dict[str, float]:
    """Import ``series`` into a fresh VictoriaMetrics; returns samples, rows and bytes."""
    binary = ensure_binary("victoria-metrics", "victoria-metrics")
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory(prefix="fp-vm-") as tmp:
        log = open(Path(tmp) / "vm.log", "wb")  # noqa: SIM115 - closed in finally
        proc = subprocess.Popen(
            [binary, f"-storageDataPath={tmp}/data", f"-httpListenAddr=127.0.0.1:{port}",
             "-retentionPeriod=100y", "-search.disableCache"],
            stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    _get(base + "/health", timeout=2)
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("victoria-metrics did not start: "
                                           + (Path(tmp) / "vm.log").read_text()[-2000:]) from None
                    time.sleep(0.2)
            samples = 0
            batch: list[bytes] = []
            for s in finite_only(series):
                labels = {"__name__": s.name, **s.labels}
                batch.append(orjson.dumps({"metric": labels, "values": s.values.tolist(),
                                           "timestamps": s.ts_ms.tolist()}))
                samples += s.ts_ms.size
                if len(batch) >= 200:
                    _post(base + "/api/v1/import", b"\n".join(batch))
                    batch = []
            if batch:
                _post(base + "/api/v1/import", b"\n".join(batch))
            _get(base + "/internal/force_flush")
            parts = ("storage/small", "storage/big")
            deadline = time.monotonic() + 600
            while True:  # wait until every imported row sits in a part
                m = _metrics(base)
                rows = sum(m.get(("vm_rows", p), 0.0) for p in parts)
                pending = m.get(("vm_pending_rows", "storage"), 0.0)
                if rows >= samples and pending == 0:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"VictoriaMetrics holds {rows} of {samples} rows")
                time.sleep(0.5)
                _get(base + "/internal/force_flush")
            _get(base + "/internal/force_merge")
            deadline = time.monotonic() + 600
            while True:  # force_merge may return before the merge is done
                time.sleep(1.0)
                m = _metrics(base)
                merging = sum(v for (name, _), v in m.items() if name == "vm_active_merges")
                if merging == 0 or time.monotonic() > deadline:
                    break
            m = _metrics(base)
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
    return {
        "samples": samples,
        "rows": sum(m.get(("vm_rows", p), 0.0) for p in parts),
        "data_bytes": sum(m.get(("vm_data_size_bytes", p), 0.0) for p in parts),
        "indexdb_bytes": m.get(("vm_data_size_bytes", "indexdb"), 0.0),
    }


def _post(url: str, body: bytes) -> None:
    req = urllib.request.Request(url, data=body, method="POST")
    with urllib.request.urlopen(req, timeout=600) as r:
        if r.status not in (200, 204):
            raise RuntimeError(f"import failed: HTTP {r.status}")

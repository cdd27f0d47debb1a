"""A real Prometheus for tests: Debian's ``prometheus`` on a free loopback port, state in a
temporary directory (scripts/test.sh installs the package).

Its config holds one ``remote_read`` entry per aggregator instance (``read_recent: true``,
so every range is read from the instances, not only what is older than its own TSDB) and
one scrape job per component. The helpers are async: the aggregators under test usually
serve from the test's own event loop, which a blocking call here would stall while
Prometheus waits on them.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from alertmanager import free_port

BINARY = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")

needs_prometheus = pytest.mark.skipif(
    BINARY is None or PROMTOOL is None,
    reason="needs Debian prometheus (promtool too; scripts/test.sh installs it)",
    installed_by_test_command=True)


def config(remote_reads: Sequence[str], scrape: Mapping[str, Sequence[str]] | None = None,
           scrape_interval: str = "1s") -> dict[str, Any]:
    """A prometheus.yml: the remote-read URLs, and scrape jobs name -> ["host:port", ...]."""
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": "15s"},
        "remote_read": [{"url": url, "name": f"fleetpulse-{i}", "read_recent": True,
                         "remote_timeout": "20s"} for i, url in enumerate(remote_reads)],
        "scrape_configs": [{"job_name": job, "static_configs": [{"targets": list(targets)}]}
                           for job, targets in (scrape or {}).items()],
    }


class Prometheus:
    def __init__(self, data_dir: Path, cfg: dict[str, Any]) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.cfg_path = data_dir / "prometheus.yml"
        self.log = data_dir / "prometheus.log"
        self.proc: subprocess.Popen[bytes] | None = None
        data_dir.mkdir(parents=True, exist_ok=True)
        self.cfg_path.write_text(yaml.safe_dump(cfg))

    async def start(self, timeout_s: float = 30.0) -> None:
        assert BINARY is not None
        proc = subprocess.run([PROMTOOL or "promtool", "check", "config", str(self.cfg_path)],
                              capture_output=True, text=True, check=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [BINARY, f"--config.file={self.cfg_path}",
                 f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
                 f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"prometheus exited: {self.log.read_text()[-2000:]}")
                try:
                    async with s.get(self.url + "/-/ready") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"prometheus not ready in {timeout_s} s: "
                           f"{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    async def api(self, path: str, **params: str) -> Any:
        """GET an /api/v1 path; the ``data`` of a success, else an AssertionError."""
        async with aiohttp.ClientSession() as s, s.get(self.url + path, params=params) as r:
            body = await r.json()
        assert body.get("status") == "success", (path, params, body)
        assert not body.get("warnings"), (path, params, body["warnings"])  # a failed remote read
        return body["data"]

    async def vector(self, query: str, time_s: float) -> dict[tuple[tuple[str, str], ...], float]:
        """An instant query's result as {sorted labels: value}."""
        data = await self.api("/api/v1/query", query=query, time=repr(time_s))
        assert data["resultType"] == "vector", data
        return {tuple(sorted(x["metric"].items())): float(x["value"][1]) for x in data["result"]}

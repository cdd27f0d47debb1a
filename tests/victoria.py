"""A real VictoriaMetrics for tests: Debian's ``victoria-metrics`` (single node) on a free
loopback port, storage in a temporary directory (scripts/test.sh installs the package).

``stop``/``start`` keep the port and the storage, as a receiver that goes down and comes
back does. Retention is 100 years: the tests' data is stamped in 2023, which the default
one month would refuse as too old. Helpers are async (see tests/prometheus.py).
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
from alertmanager import free_port

BINARY = shutil.which("victoria-metrics")

needs_victoria = pytest.mark.skipif(
    BINARY is None, reason="needs Debian victoria-metrics (scripts/test.sh installs it)",
    installed_by_test_command=True)


class VictoriaMetrics:
    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.write_url = self.url + "/api/v1/write"
        self.log = data_dir / "victoria-metrics.log"
        self.proc: subprocess.Popen[bytes] | None = None
        data_dir.mkdir(parents=True, exist_ok=True)

    async def start(self, timeout_s: float = 30.0) -> None:
        assert BINARY is not None
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [BINARY, f"-storageDataPath={self.data_dir / 'storage'}",
                 f"-httpListenAddr=127.0.0.1:{self.port}", "-retentionPeriod=100y",
                 "-search.latencyOffset=0s", "-loggerLevel=WARN"],
                stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        async with aiohttp.ClientSession() as s:
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"victoria-metrics exited: {self.log.read_text()[-2000:]}")
                try:
                    async with s.get(self.url + "/health") as r:
                        if r.status == 200:
                            return
                except aiohttp.ClientError:
                    pass
                await asyncio.sleep(0.1)
        raise RuntimeError(f"victoria-metrics not ready in {timeout_s} s: "
                           f"{self.log.read_text()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    async def export(self, match: str) -> list[dict[str, Any]]:
        """Every stored sample of the series matching ``match`` (``/api/v1/export``), after
        forcing in-memory data to searchable parts."""
        async with aiohttp.ClientSession() as s:
            async with s.get(self.url + "/internal/force_flush") as r:
                assert r.status == 200, await r.text()
            async with s.get(self.url + "/api/v1/export", params={
                    "match[]": match, "start": "0", "end": str(int(time.time()) + 86_400)}) as r:
                assert r.status == 200, await r.text()
                body = await r.read()
        return [orjson.loads(line) for line in body.splitlines() if line.strip()]

"""A real Alertmanager for tests: Debian's ``prometheus-alertmanager`` on a free loopback
port with the shipped ``deploy/alertmanager.yml`` (scripts/test.sh installs the package).

Gossip clustering is off (``--cluster.listen-address=``) so nothing binds beyond the one
port; state lives in a temporary directory. ``stop``/``start`` on the same port simulate an
Alertmanager that goes down and comes back (it keeps no alerts across a restart, as in
production).
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy" / "alertmanager.yml"
BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

needs_alertmanager = pytest.mark.skipif(
    BINARY is None, reason="needs Debian prometheus-alertmanager (scripts/test.sh installs it)",
    installed_by_test_command=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Alertmanager:
    def __init__(self, data_dir: Path, config: Path = CONFIG) -> None:
        self.data_dir = data_dir
        self.config = config
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = data_dir / "alertmanager.log"

    def start(self, timeout_s: float = 20.0) -> None:
        assert BINARY is not None
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [BINARY, f"--config.file={self.config}",
                 f"--web.listen-address=127.0.0.1:{self.port}",
                 f"--storage.path={self.data_dir / 'data'}", "--cluster.listen-address=",
                 "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"alertmanager exited: {self.log.read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"alertmanager not ready in {timeout_s} s: "
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

    def get(self, path: str) -> Any:
        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return json.loads(r.read())

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts it holds that have not ended (resolved ones are not listed)."""
        return list(self.get("/api/v2/alerts"))

    def groups(self) -> list[dict[str, Any]]:
        return list(self.get("/api/v2/alerts/groups"))

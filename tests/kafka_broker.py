"""A real Kafka broker for tests, driven through scripts/kafka.sh (one way to start one).

Each :class:`KafkaBroker` owns a state directory; ``stop()`` and ``start()`` on the same
object keep its ports and data, which is what the broker-restart tests need. The broker
is tied to this Python process (``--owner``), so a test run killed with -9 leaves none behind.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KAFKA_SH = REPO / "scripts" / "kafka.sh"
START_TIMEOUT_S = 180.0
SASL_USER = "fleet"
SASL_PASSWORD = "fleet-secret"
"""Test-only credentials of the broker's SASL listener (PLAIN and SCRAM-SHA-256)."""


class BrokerError(RuntimeError):
    """scripts/kafka.sh failed; the message carries its output (and the broker log)."""


class KafkaBroker:
    """One single-node KRaft broker in ``state_dir``, restartable."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.bootstrap = ""
        """``127.0.0.1:PORT``; set by the first ``start()`` and unchanged by restarts."""

    @property
    def sasl_bootstrap(self) -> str:
        """Address of the SASL_PLAINTEXT listener (users in scripts/kafka.sh: SASL_USER)."""
        return (self.state_dir / "sasl_bootstrap").read_text().strip()

    @property
    def tls_bootstrap(self) -> str:
        """Address of the TLS listener; its certificate is signed by :attr:`tls_cafile`."""
        return (self.state_dir / "tls_bootstrap").read_text().strip()

    @property
    def tls_cafile(self) -> str:
        return str(self.state_dir / "ca.pem")

    @property
    def log_path(self) -> Path:
        return self.state_dir / "server.log"

    def _run(self, command: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", str(KAFKA_SH), command, "--dir", str(self.state_dir),
             "--owner", str(os.getpid())],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def start(self) -> str:
        """Start (or find running) and return the bootstrap address."""
        try:
            proc = self._run("start", START_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise BrokerError(f"scripts/kafka.sh start timed out\n{self.log_tail()}") from exc
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise BrokerError(
                f"scripts/kafka.sh start --dir {self.state_dir} exited {proc.returncode}\n"
                f"{proc.stdout}\n{proc.stderr}"
            )
        self.bootstrap = lines[-1].strip()
        return self.bootstrap

    def stop(self) -> None:
        """Stop gracefully (SIGTERM, then SIGKILL after a grace period)."""
        proc = self._run("stop", 60)
        if proc.returncode != 0:
            raise BrokerError(f"scripts/kafka.sh stop failed\n{proc.stdout}\n{proc.stderr}")

    def running(self) -> bool:
        return self._run("status", 30).returncode == 0

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 80) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])


def reachable(bootstrap: str, timeout: float = 2.0) -> bool:
    """True if the first address of ``bootstrap`` accepts a TCP connection."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    try:
        with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False

"""Shared fixtures: a real Kafka broker, private restartable brokers, unique topic prefixes.

Kafka tests use a real broker, never a fake. ``scripts/test.sh`` starts one for the whole
run and exports ``FLEETPULSE_KAFKA_BOOTSTRAP``; a bare ``pytest`` starts its own through
``scripts/kafka.sh``. With ``CI=true`` a Kafka test that cannot get a broker FAILS, and a
Kafka test that skips for any reason is reported as a failure: CI never passes silently
without Kafka. When a Kafka test fails, the broker log written during it is attached to
the report.
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kafka_broker import BrokerError, KafkaBroker, reachable

IN_CI = os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}
LOG_TAIL_LINES = 150

_BROKERS = pytest.StashKey[list[KafkaBroker]]()
_LOG_OFFSETS = pytest.StashKey[dict[Path, int]]()
_SESSION_LOGS: list[Path] = []
"""server.log of the session broker (ours, or the one scripts/test.sh started)."""

if os.environ.get("FLEETPULSE_KAFKA_LOG"):
    _SESSION_LOGS.append(Path(os.environ["FLEETPULSE_KAFKA_LOG"]))


def _no_broker(reason: str) -> None:
    """Fail in CI, skip elsewhere (a laptop without Java can still run the unit tests)."""
    if IN_CI:
        pytest.fail(f"CI=true and no Kafka broker: {reason}", pytrace=False)
    pytest.skip(f"no Kafka broker: {reason}")


@pytest.fixture(scope="session")
def _session_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """Addresses of the session's broker: the one scripts/test.sh started, or our own."""
    given = os.environ.get("FLEETPULSE_KAFKA_BOOTSTRAP", "").strip()
    if given:
        if not reachable(given):
            _no_broker(f"FLEETPULSE_KAFKA_BOOTSTRAP={given} does not accept connections")
        yield {
            "plain": given,
            "sasl": os.environ.get("FLEETPULSE_KAFKA_SASL_BOOTSTRAP", "").strip(),
            "tls": os.environ.get("FLEETPULSE_KAFKA_TLS_BOOTSTRAP", "").strip(),
            "tls_ca": os.environ.get("FLEETPULSE_KAFKA_TLS_CAFILE", "").strip(),
        }
        return
    broker = KafkaBroker(tmp_path_factory.mktemp("kafka-session"))
    try:
        broker.start()
    except (BrokerError, OSError) as exc:
        _no_broker(f"scripts/kafka.sh could not start one: {exc}")
    _SESSION_LOGS.append(broker.log_path)
    try:
        yield {
            "plain": broker.bootstrap,
            "sasl": broker.sasl_bootstrap,
            "tls": broker.tls_bootstrap,
            "tls_ca": broker.tls_cafile,
        }
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(_session_broker: dict[str, str]) -> str:
    """Bootstrap address (PLAINTEXT) of the session's Kafka broker."""
    return _session_broker["plain"]


@pytest.fixture(scope="session")
def kafka_sasl_bootstrap(_session_broker: dict[str, str]) -> str:
    """The session broker's SASL_PLAINTEXT address (kafka_broker.SASL_USER/SASL_PASSWORD)."""
    if not _session_broker["sasl"]:
        _no_broker("FLEETPULSE_KAFKA_SASL_BOOTSTRAP is not set for the given broker")
    return _session_broker["sasl"]


@pytest.fixture(scope="session")
def kafka_tls(_session_broker: dict[str, str]) -> tuple[str, str]:
    """(address of the session broker's TLS listener, CA file that signed its certificate)."""
    if not (_session_broker["tls"] and _session_broker["tls_ca"]):
        _no_broker("FLEETPULSE_KAFKA_TLS_BOOTSTRAP/_TLS_CAFILE are not set for the given broker")
    return _session_broker["tls"], _session_broker["tls_ca"]


@pytest.fixture
def kafka_broker_factory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Callable[[], KafkaBroker]]:
    """Starts private brokers (own state dir) that a test may stop and start again.

    Every broker made here is stopped when the test ends.
    """
    brokers: list[KafkaBroker] = []
    request.node.stash[_BROKERS] = brokers

    def start_broker() -> KafkaBroker:
        broker = KafkaBroker(tmp_path_factory.mktemp("kafka-private"))
        brokers.append(broker)
        try:
            broker.start()
        except (BrokerError, OSError) as exc:
            _no_broker(f"scripts/kafka.sh could not start a private broker: {exc}")
        return broker

    yield start_broker
    for broker in brokers:
        try:
            broker.stop()
        except BrokerError as exc:  # report, but let the other brokers stop too
            print(f"stopping broker {broker.state_dir} failed: {exc}")


@pytest.fixture
def unique_prefix(request: pytest.FixtureRequest) -> str:
    """A topic prefix no other test (or earlier run on the same broker) uses.

    Valid both as a Kafka topic name part and as a ``schemas.Topics`` prefix.
    """
    name = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name).strip("-")[:60]
    return f"t-{name}-{uuid.uuid4().hex[:10]}"


# ------------------------------------------------------------------ broker log on failure


def _uses_kafka(item: pytest.Item) -> bool:
    names = getattr(item, "fixturenames", ())
    return (
        item.get_closest_marker("kafka") is not None
        or "kafka_bootstrap" in names
        or "kafka_sasl_bootstrap" in names
        or "kafka_tls" in names
        or "kafka_broker_factory" in names
    )


def _logs_of(item: pytest.Item) -> list[Path]:
    private = [b.log_path for b in item.stash.get(_BROKERS, [])]
    return [*_SESSION_LOGS, *private]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if _uses_kafka(item):
        item.stash[_LOG_OFFSETS] = {
            p: p.stat().st_size for p in _SESSION_LOGS if p.exists()
        }


def _needs_installed_server(item: pytest.Item) -> bool:
    """A test skipped for lack of a real server that ``scripts/test.sh`` installs (Debian's
    Prometheus, VictoriaMetrics, Alertmanager, Chromium): its skipif says
    ``installed_by_test_command=True``. Under CI such a skip is a failure, as a Kafka test's."""
    return any(m.kwargs.get("installed_by_test_command") for m in item.iter_markers("skipif"))


def _log_section(item: pytest.Item) -> str:
    offsets = item.stash.get(_LOG_OFFSETS, {})
    parts = []
    for path in _logs_of(item):
        try:
            with path.open("rb") as fh:
                fh.seek(offsets.get(path, 0))
                text = fh.read().decode(errors="replace")
        except OSError as exc:
            parts.append(f"== {path}: unreadable ({exc})")
            continue
        tail = text.splitlines()[-LOG_TAIL_LINES:]
        parts.append(f"== {path} (written during this test, last {len(tail)} lines)")
        parts.extend(tail)
    return "\n".join(parts)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if IN_CI and report.skipped and _needs_installed_server(item):
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI=true, but the test command installs what it needs: "
                           f"{report.longrepr}")
        return
    if not _uses_kafka(item):
        return
    if IN_CI and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"Kafka test skipped under CI=true (Kafka tests must run): {report.longrepr}"
    if report.failed:
        report.sections.append(("Kafka broker log", _log_section(item)))

"""scripts/kafka.sh: the address it prints works, restarts keep ports and data, stop is precise.

These run the script itself (through tests/kafka_broker.py), with real JVMs.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from kafka_broker import KAFKA_SH, BrokerError, KafkaBroker, reachable

pytestmark = pytest.mark.kafka


async def roundtrip(bootstrap: str, topic: str, value: bytes) -> list[bytes]:
    """Produce ``value`` with plain aiokafka, then read the whole topic back."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True)
    await producer.start()
    try:
        await producer.send_and_wait(topic, value)
    finally:
        await producer.stop()
    return await read_all(bootstrap, topic)


async def read_all(bootstrap: str, topic: str) -> list[bytes]:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest", enable_auto_commit=False
    )
    await consumer.start()
    try:
        out: list[bytes] = []
        for _ in range(50):
            batches = await consumer.getmany(timeout_ms=200)
            out.extend(r.value for rs in batches.values() for r in rs if r.value is not None)
            if out and not batches:
                break
        return out
    finally:
        await consumer.stop()


def test_status_of_a_dir_without_broker(tmp_path: Path) -> None:
    proc = subprocess.run(
        ["bash", str(KAFKA_SH), "status", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=30, check=False,
    )
    assert proc.returncode == 3
    assert "not running" in proc.stderr


async def test_address_works_restart_keeps_ports_and_data_stop_is_precise(
    kafka_broker_factory: Callable[[], KafkaBroker], kafka_bootstrap: str, unique_prefix: str
) -> None:
    a = kafka_broker_factory()
    assert a.bootstrap.startswith("127.0.0.1:") and a.bootstrap != kafka_bootstrap
    topic = f"{unique_prefix}.persist"

    # The printed address is one aiokafka can produce to and consume from.
    assert await roundtrip(a.bootstrap, topic, b"before restart") == [b"before restart"]
    # start on a running broker's dir is a no-op that prints the same address.
    assert a.start() == a.bootstrap

    # stop stops only that broker: the session's broker is untouched.
    a.stop()
    assert not a.running()
    assert not reachable(a.bootstrap)
    assert await roundtrip(kafka_bootstrap, topic, b"other is fine") == [b"other is fine"]

    # Restarting the same dir keeps the port and the data.
    address = a.bootstrap
    assert a.start() == address
    assert await roundtrip(a.bootstrap, topic, b"after restart") == [
        b"before restart",
        b"after restart",
    ]

    # A broker that cannot start makes the script fail with the log, not hang.
    a.stop()
    props = a.state_dir / "server.properties"
    props.write_text(props.read_text().replace("num.io.threads=2", "num.io.threads=lots"))
    with pytest.raises(BrokerError) as info:
        a.start()
    assert "exited during start-up" in str(info.value)
    assert "num.io.threads" in str(info.value), "the broker's own error must be shown"
    assert not a.running()

"""The state changelog: chunked, checksummed checkpoints in a compacted topic, on both
transports (``[kafka]`` against the real broker of the test run)."""

from __future__ import annotations

import zlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import pytest

from fleetpulse.changelog import CHUNK_BYTES, HEADER_BYTES, Changelog, ChangelogError
from fleetpulse.config import TransportConfig
from fleetpulse.transport import Transport, open_transport

KINDS = [
    pytest.param("memory", id="memory"),
    pytest.param("kafka", id="kafka", marks=pytest.mark.kafka),
]
Make = Callable[[], Awaitable[Transport]]


@pytest.fixture(params=KINDS)
async def make(request: pytest.FixtureRequest, unique_prefix: str) -> AsyncIterator[Make]:
    bootstrap = (f"memory://{unique_prefix}" if request.param == "memory"
                 else request.getfixturevalue("kafka_bootstrap"))
    opened: list[Transport] = []

    async def open_one() -> Transport:
        t = open_transport(TransportConfig(bootstrap=bootstrap, client_id=unique_prefix))
        await t.start()
        opened.append(t)
        return t

    yield open_one
    for t in reversed(opened):
        await t.close()


def _blob(n: int, seed: int) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8).tobytes()


async def test_states_round_trip_chunked_newest_wins(make: Make, unique_prefix: str) -> None:
    topic = f"{unique_prefix}-changelog"
    writer = Changelog(await make(), topic, 3, chunk_bytes=1000)
    await writer.ensure()
    tps = [("s", 0), ("s", 1), ("s", 2), ("e", 0)]
    first = {tps[0]: b"", tps[1]: _blob(500, 1), tps[2]: _blob(5_500, 2), tps[3]: b"x"}
    await writer.save(first)
    second = {tps[1]: _blob(12_000, 3), tps[2]: _blob(999, 4)}  # more chunks, then fewer
    await writer.save(second)
    await writer.save({tps[2]: _blob(3_001, 5)})

    reader = Changelog(await make(), topic, 3, chunk_bytes=1000)
    got = await reader.load([*tps, ("s", 7)])
    assert got == {tps[0]: b"", tps[1]: second[tps[1]], tps[2]: _blob(3_001, 5),
                   tps[3]: b"x"}
    assert reader.last_restore.records >= 20 and reader.last_restore.bytes > 20_000
    # The next owner continues the generations where the last writer left off.
    await reader.save({tps[1]: b"from the next owner"})
    again = await Changelog(await make(), topic, 3).load([tps[1]])
    assert again == {tps[1]: b"from the next owner"}


class _DiesBeforeManifest(Changelog):
    """A writer killed after its chunks were acknowledged, before the manifest went out."""

    async def _send_all(self, records: list[tuple[bytes, bytes, int]]) -> None:
        if records and b"/" not in records[0][0]:
            raise RuntimeError("killed")
        await super()._send_all(records)


async def test_a_writer_dying_mid_checkpoint_leaves_the_previous_one(make: Make,
                                                                     unique_prefix: str) -> None:
    topic = f"{unique_prefix}-changelog"
    ok = Changelog(await make(), topic, 2, chunk_bytes=700)
    await ok.ensure()
    old = _blob(4_000, 7)
    await ok.save({("s", 1): old})
    dying = _DiesBeforeManifest(await make(), topic, 2, chunk_bytes=700)
    await dying.load([("s", 1)])
    with pytest.raises(RuntimeError, match="killed"):
        await dying.save({("s", 1): _blob(9_000, 8)})  # its chunks overwrite nothing in use
    assert await Changelog(await make(), topic, 2).load([("s", 1)]) == {("s", 1): old}


async def test_a_corrupt_chunk_is_an_error_not_a_state(make: Make, unique_prefix: str) -> None:
    topic = f"{unique_prefix}-changelog"
    log = Changelog(await make(), topic, 1, chunk_bytes=100)
    await log.ensure()
    await log.save({("s", 0): _blob(450, 9)})
    transport = await make()
    msgs = await transport.read_log([(topic, 0)])
    chunk = next(m for m in msgs if m.key == f"s:0/{1 % 2}/2".encode())
    bad = bytearray(chunk.value)
    bad[HEADER_BYTES + 5] ^= 0xFF
    await transport.send_and_wait(topic, bytes(bad), key=chunk.key)
    with pytest.raises(ChangelogError, match="chunk 2 of generation 1 fails its CRC"):
        await Changelog(transport, topic, 1).load([("s", 0)])
    assert zlib.crc32(bytes(bad[HEADER_BYTES:])) != zlib.crc32(chunk.value[HEADER_BYTES:])


@pytest.mark.kafka
async def test_kafka_topic_is_compacted_and_big_states_fit_its_record_limit(
        kafka_bootstrap: str, unique_prefix: str) -> None:
    """A real broker at its default 1 MiB record limit takes a 3 MB state in chunks, and the
    topic is created with ``cleanup.policy=compact``."""
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

    transport = open_transport(TransportConfig(bootstrap=kafka_bootstrap))
    await transport.start()
    try:
        topic = f"{unique_prefix}-changelog"
        log = Changelog(transport, topic, 2)
        await log.ensure()
        big = _blob(3_000_000, 11)
        await log.save({("s", 1): big})
        assert await Changelog(transport, topic, 2).load([("s", 1)]) == {("s", 1): big}
        assert -(-len(big) // CHUNK_BYTES) == 4
        admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap)
        await admin.start()
        try:
            res: Any = await admin.describe_configs(
                [ConfigResource(ConfigResourceType.TOPIC, topic)])
            entries = {e[0]: e[1] for e in res[0].resources[0][4]}
        finally:
            await admin.close()
        assert entries["cleanup.policy"] == "compact"
    finally:
        await transport.close()

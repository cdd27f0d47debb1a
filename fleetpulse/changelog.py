"""Per-partition state kept in a compacted Kafka topic, as Kafka Streams keeps its stores.

Why: a partition's checkpoint must follow the partition to whichever instance the group
gives it next, and instances share nothing but the broker (no shared folder). So a stage
writes each partition's checkpoint here before it commits that partition's offset, and
reads it back when the partition is assigned; the topic is compacted, so the broker keeps
the newest checkpoint of every partition however long it runs.

Layout: the state of source partition ``p`` lives in changelog partition ``p`` (mod the
changelog's partitions), so a restore reads only its own partition's log. A checkpoint
larger than one Kafka record is cut into chunks; every record starts with a fixed header:

    magic b"FPCL" | version u8 | kind u8 (0 chunk, 1 manifest) | generation u64 |
    index u32 | count u32 | total length u64 | CRC-32 u32   (big-endian, 34 bytes)

Chunk ``i`` of generation ``g`` is keyed ``<topic>:<partition>/<g % 2>/<i>`` and carries
bytes ``[i * chunk, (i + 1) * chunk)``; the CRC of a chunk covers its payload. The
manifest, keyed ``<topic>:<partition>``, is written after every chunk was acknowledged and
has no payload: its CRC covers the whole checkpoint. Generations alternate between two
key sets, so a crash while chunks of ``g + 1`` are written leaves the chunks of ``g`` (the
manifest's) intact; a restore takes the newest manifest, the newest record of each of its
chunk keys, and checks generation, index, length and CRC. Anything that does not add up is
a :class:`ChangelogError`, never a silently wrong state.
"""

from __future__ import annotations

import asyncio
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from fleetpulse.transport.base import Message, TopicPartition, Transport

__all__ = ["CHUNK_BYTES", "Changelog", "ChangelogError", "RestoreStats"]

MAGIC: Final = b"FPCL"
VERSION: Final = 1
_HEADER = struct.Struct(">4sBBQIIQI")
HEADER_BYTES: Final = _HEADER.size
_CHUNK, _MANIFEST = 0, 1
CHUNK_BYTES: Final = 900 * 1024
"""Payload per record: under the 1 MiB that a broker left at its defaults accepts."""


class ChangelogError(RuntimeError):
    """A partition's changelog holds a checkpoint that cannot be put back together."""


@dataclass(frozen=True, slots=True)
class RestoreStats:
    """What the last :meth:`Changelog.load` read: records, bytes and seconds."""

    records: int
    bytes: int
    seconds: float


def _key(tp: TopicPartition) -> bytes:
    return f"{tp[0]}:{tp[1]}".encode()


def _chunk_key(tp: TopicPartition, generation: int, index: int) -> bytes:
    return f"{tp[0]}:{tp[1]}/{generation % 2}/{index}".encode()


def _header(kind: int, generation: int, index: int, count: int, total: int, crc: int) -> bytes:
    return _HEADER.pack(MAGIC, VERSION, kind, generation, index, count, total, crc)


def _parse(value: bytes) -> tuple[int, int, int, int, int, int]:
    if len(value) < HEADER_BYTES:
        raise ChangelogError(f"record of {len(value)} bytes is shorter than its header")
    magic, version, kind, gen, index, count, total, crc = _HEADER.unpack_from(value)
    if magic != MAGIC or version != VERSION:
        raise ChangelogError(f"not a changelog record (magic {magic!r}, version {version})")
    return kind, gen, index, count, total, crc


class Changelog:
    """The changelog topic of one consumer group's state (one instance's handle on it)."""

    def __init__(self, transport: Transport, topic: str, partitions: int, *,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        if chunk_bytes < 1:
            raise ValueError("chunk_bytes must be positive")
        self.transport = transport
        self.topic = topic
        self.partitions = partitions
        self.chunk_bytes = chunk_bytes
        self._generation: dict[TopicPartition, int] = {}
        """Per source partition, the generation of the newest checkpoint written or read."""
        self.last_restore = RestoreStats(0, 0, 0.0)

    async def ensure(self) -> None:
        """Create the compacted topic if missing (an existing one keeps its partitions)."""
        await self.transport.ensure_topics({self.topic: self.partitions},
                                           compacted=(self.topic,))
        self.partitions = await self.transport.partitions_for(self.topic)

    def _partition(self, tp: TopicPartition) -> int:
        return tp[1] % self.partitions

    async def save(self, states: Mapping[TopicPartition, bytes]) -> None:
        """Write ``states`` (source partition -> checkpoint) and wait until the broker has
        every record; only then may the caller commit those partitions' offsets."""
        chunks = []
        manifests = []
        for tp, data in sorted(states.items()):
            gen = self._generation.get(tp, 0) + 1
            part = self._partition(tp)
            pieces = [data[i:i + self.chunk_bytes]
                      for i in range(0, len(data), self.chunk_bytes)] or [b""]
            for i, piece in enumerate(pieces):
                head = _header(_CHUNK, gen, i, len(pieces), len(data), zlib.crc32(piece))
                chunks.append((_chunk_key(tp, gen, i), head + piece, part))
            manifests.append((tp, gen, part, _header(_MANIFEST, gen, 0, len(pieces),
                                                     len(data), zlib.crc32(data))))
        await self._send_all(chunks)
        await self._send_all([(_key(tp), head, part) for tp, _, part, head in manifests])
        for tp, gen, _, _ in manifests:
            self._generation[tp] = gen

    async def _send_all(self, records: list[tuple[bytes, bytes, int]]) -> None:
        futures = [await self.transport.send(self.topic, value, key=key, partition=part)
                   for key, value, part in records]
        await asyncio.gather(*futures)

    async def load(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, bytes]:
        """The newest complete checkpoint of each of ``tps`` that has one."""
        wanted = sorted(set(tps))
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        parts = sorted({self._partition(tp) for tp in wanted})
        msgs = await self.transport.read_log([(self.topic, p) for p in parts])
        newest: dict[bytes, Message] = {}
        for msg in msgs:
            if msg.key is not None:
                newest[msg.key] = msg
        out: dict[TopicPartition, bytes] = {}
        for tp in wanted:
            data = self._assemble(tp, newest)
            if data is not None:
                out[tp] = data
        self.last_restore = RestoreStats(len(msgs), sum(len(m.value) for m in msgs),
                                         loop.time() - t0)
        return out

    def _assemble(self, tp: TopicPartition, newest: Mapping[bytes, Message]) -> bytes | None:
        manifest = newest.get(_key(tp))
        if manifest is None:
            self._generation.setdefault(tp, 0)
            return None
        kind, gen, _, count, total, crc = _parse(manifest.value)
        if kind != _MANIFEST:
            raise ChangelogError(f"{tp}: the record under the manifest key is not a manifest")
        self._generation[tp] = max(self._generation.get(tp, 0), gen)
        pieces = []
        for i in range(count):
            rec = newest.get(_chunk_key(tp, gen, i))
            if rec is None:
                raise ChangelogError(f"{tp}: chunk {i} of {count} (generation {gen}) is missing")
            c_kind, c_gen, c_index, c_count, c_total, c_crc = _parse(rec.value)
            payload = rec.value[HEADER_BYTES:]
            if (c_kind, c_gen, c_index, c_count, c_total) != (_CHUNK, gen, i, count, total):
                raise ChangelogError(f"{tp}: chunk {i} belongs to generation {c_gen}, not {gen}")
            if zlib.crc32(payload) != c_crc:
                raise ChangelogError(f"{tp}: chunk {i} of generation {gen} fails its CRC")
            pieces.append(payload)
        data = b"".join(pieces)
        if len(data) != total or zlib.crc32(data) != crc:
            raise ChangelogError(f"{tp}: generation {gen} is {len(data)} bytes, CRC "
                                 f"{zlib.crc32(data):08x}; its manifest says {total}, {crc:08x}")
        return data

"""The agent's disk spool: frames the broker could not take, kept in order until it can.

Why a spool and not a bigger in-memory queue: a broker outage can outlast the agent (a
node reboot, an OOM kill, ``kill -9`` by an operator), and DESIGN.md promises that nothing
the agent sampled is lost to a broker outage. So frames that fail to publish go to disk,
and a restarted agent replays them before any new data.

Layout: a directory of append-only segment files ``000000000042.seg`` plus a ``cursor``
file. Each record is::

    offset  size  field
    0       4     payload length P (u32, little-endian)
    4       4     CRC-32 of the payload (zlib.crc32)
    8       P     payload: key length K (i32, -1 = no key), K key bytes, the value bytes

A record is valid only if its whole payload is present and its CRC matches. On open, every
unacknowledged segment is scanned; the first invalid record (a torn write from a crash, or
bit rot) truncates its segment there and is counted in ``corrupt_bytes`` - the records
before it are kept, and nothing after an invalid length is trusted.

The ``cursor`` file holds the position up to which records were acknowledged by the broker
(written to a temporary file and renamed, so it is never half-written). If the agent dies
between an acknowledgement and the cursor write, those records are replayed once more:
the spool is at-least-once, and downstream de-duplicates by (agent, seq) from the frame.

**Bounded bytes.** The segment files never hold more than ``max_bytes``. When a new record
does not fit, the configured policy decides, loudly (``dropped_frames`` counter and a
warning log): ``drop_oldest`` deletes the oldest segment (keeps the freshest data, what an
SRE wants after a long outage) and ``drop_newest`` refuses the new record (keeps history
contiguous).

**fsync policy** (``fsync``): ``always`` fsyncs every append and the cursor (survives power
loss, one disk flush per frame); ``interval`` (default) fsyncs at most every
``fsync_interval_s`` and on close (a power loss may lose that last interval; a killed
process loses nothing, since written data is in the kernel's page cache); ``never`` leaves
it to the kernel.
"""

from __future__ import annotations

import errno
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Final

__all__ = ["DropPolicy", "FsyncPolicy", "Spool", "SpoolRecord", "SpoolStats"]

log = logging.getLogger(__name__)

_HEADER: Final = struct.Struct("<II")
_KEYLEN: Final = struct.Struct("<i")
_SEG_SUFFIX: Final = ".seg"
_CURSOR: Final = "cursor"
_CURSOR_FMT: Final = struct.Struct("<4sQQI")  # magic, segment, offset, crc of the first 20 bytes
_CURSOR_MAGIC: Final = b"FPSC"


class DropPolicy(StrEnum):
    """What to do when the spool is full."""

    DROP_OLDEST = "drop_oldest"
    DROP_NEWEST = "drop_newest"


class FsyncPolicy(StrEnum):
    """When appended bytes are forced to disk (see the module docstring)."""

    ALWAYS = "always"
    INTERVAL = "interval"
    NEVER = "never"


@dataclass(frozen=True, slots=True)
class SpoolRecord:
    """One spooled frame as read back, with its position for :meth:`Spool.ack`."""

    key: bytes | None
    value: bytes
    segment: int
    end: int
    """Offset just past this record in its segment."""
    size: int
    """Bytes on disk, header included."""


@dataclass(slots=True)
class SpoolStats:
    """Counters read by the agent's /metrics at scrape time (plain ints: no locks)."""

    appended_frames: int = 0
    appended_bytes: int = 0
    acked_frames: int = 0
    dropped_frames: int = 0
    dropped_bytes: int = 0
    corrupt_bytes: int = 0
    pending_frames: int = 0
    pending_bytes: int = 0
    write_errors: int = 0
    """Appends and cursor writes the disk refused (full, read-only); the record was not
    kept and the segment was cut back to its last whole record."""


@dataclass(slots=True)
class _Segment:
    size: int = 0
    records: int = 0


class Spool:
    """Append-only, checksummed, bounded on-disk queue of (key, value) records.

    Not thread-safe: the publisher uses it from one asyncio task at a time.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        max_bytes: int = 256 << 20,
        segment_bytes: int | None = None,
        drop_policy: DropPolicy | str = DropPolicy.DROP_OLDEST,
        fsync: FsyncPolicy | str = FsyncPolicy.INTERVAL,
        fsync_interval_s: float = 1.0,
    ) -> None:
        self.dir = Path(directory)
        self.max_bytes = int(max_bytes)
        self.segment_bytes = int(segment_bytes or max(64 << 10, self.max_bytes // 16))
        if self.max_bytes < 2 * self.segment_bytes:
            raise ValueError(f"spool max_bytes {self.max_bytes} must be at least two segments "
                             f"({self.segment_bytes} bytes each)")
        self.drop_policy = DropPolicy(drop_policy)
        self.fsync = FsyncPolicy(fsync)
        self.fsync_interval_s = fsync_interval_s
        self.stats = SpoolStats()
        self._segments: dict[int, _Segment] = {}
        self._ack_seg = 0
        self._ack_off = 0
        self._read_seg = 0
        self._read_off = 0
        self._write_seg = -1
        self._wfd: int = -1
        self._last_sync = time.monotonic()
        self._dirty = False
        self._closed = False
        self.dir.mkdir(parents=True, exist_ok=True)
        self._recover()

    # ----------------------------------------------------------------- recovery

    def _seg_path(self, seg: int) -> Path:
        return self.dir / f"{seg:012d}{_SEG_SUFFIX}"

    def _read_cursor(self) -> tuple[int, int] | None:
        try:
            raw = (self.dir / _CURSOR).read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) != _CURSOR_FMT.size:
            log.warning("spool cursor in %s is damaged; replaying the whole spool", self.dir)
            return None
        magic, seg, off, crc = _CURSOR_FMT.unpack(raw)
        if magic != _CURSOR_MAGIC or zlib.crc32(raw[:20]) != crc:
            log.warning("spool cursor in %s is damaged; replaying the whole spool", self.dir)
            return None
        return seg, off

    def _recover(self) -> None:
        segs = sorted(
            int(p.name[: -len(_SEG_SUFFIX)])
            for p in self.dir.iterdir()
            if p.name.endswith(_SEG_SUFFIX) and p.name[: -len(_SEG_SUFFIX)].isdigit()
        )
        cursor = self._read_cursor()
        ack_seg, ack_off = cursor if cursor else ((segs[0], 0) if segs else (0, 0))
        for seg in segs:
            path = self._seg_path(seg)
            if seg < ack_seg:
                path.unlink()
                continue
            start = ack_off if seg == ack_seg else 0
            good, n_pending, pending_bytes = self._scan(path, start)
            size = path.stat().st_size
            if good < size:
                self.stats.corrupt_bytes += size - good
                log.warning("spool segment %s: %d bytes after offset %d are not valid records "
                            "(torn write or corruption); truncated", path, size - good, good)
                with open(path, "r+b") as fh:
                    fh.truncate(good)
            if seg == ack_seg and good < start:
                start = good
                ack_off = good
            self._segments[seg] = _Segment(size=good, records=n_pending)
            self.stats.pending_frames += n_pending
            self.stats.pending_bytes += pending_bytes
        self._ack_seg, self._ack_off = ack_seg, ack_off
        if self._segments and self._ack_seg < min(self._segments):
            self._ack_seg, self._ack_off = min(self._segments), 0
        self._read_seg, self._read_off = self._ack_seg, self._ack_off
        self._write_seg = max(self._segments, default=self._ack_seg - 1) + 1

    @staticmethod
    def _scan(path: Path, start: int) -> tuple[int, int, int]:
        """Return (end of the last valid record, records after start, their bytes)."""
        data = path.read_bytes()
        off, n, nbytes = 0, 0, 0
        while off + _HEADER.size <= len(data):
            plen, crc = _HEADER.unpack_from(data, off)
            end = off + _HEADER.size + plen
            if plen < _KEYLEN.size or end > len(data):
                break
            if zlib.crc32(memoryview(data)[off + _HEADER.size : end]) != crc:
                break
            if off >= start:
                n += 1
                nbytes += end - off
            off = end
        return off, n, nbytes

    # ----------------------------------------------------------------- writing

    @property
    def total_bytes(self) -> int:
        """Bytes in segment files (acknowledged head of the oldest one included)."""
        return sum(s.size for s in self._segments.values())

    def _open_segment(self) -> None:
        self._close_writer()
        seg = self._write_seg
        self._wfd = os.open(self._seg_path(seg), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._segments.setdefault(seg, _Segment())
        if self.fsync is FsyncPolicy.ALWAYS:
            dfd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)

    def _close_writer(self) -> None:
        if self._wfd >= 0:
            if self.fsync is not FsyncPolicy.NEVER and self._dirty:
                os.fsync(self._wfd)
                self._dirty = False
            os.close(self._wfd)
            self._wfd = -1

    def _drop_oldest_segment(self) -> bool:
        """Delete the oldest segment other than the one being written; False if none."""
        candidates = [s for s in self._segments if s != self._write_seg]
        if not candidates:
            return False
        seg = min(candidates)
        info = self._segments.pop(seg)
        if seg < self._ack_seg:  # delivered already, only its deletion was pending a commit
            lost_frames, lost_bytes = 0, 0
        elif seg == self._ack_seg:
            lost_frames, lost_bytes = self._count_from(seg, self._ack_off)
        else:
            lost_frames, lost_bytes = info.records, info.size
        if lost_frames:
            self._count_drop(lost_frames, lost_bytes, f"deleted oldest spool segment {seg}")
        self.stats.pending_frames -= lost_frames
        self.stats.pending_bytes -= lost_bytes
        self._seg_path(seg).unlink(missing_ok=True)
        nxt = min(self._segments, default=self._write_seg)
        if (self._ack_seg, self._ack_off) < (nxt, 0):
            self._ack_seg, self._ack_off = nxt, 0
        if (self._read_seg, self._read_off) < (nxt, 0):
            self._read_seg, self._read_off = nxt, 0
        return True

    def _count_from(self, seg: int, start: int) -> tuple[int, int]:
        _good, n, nbytes = self._scan(self._seg_path(seg), start)
        return n, nbytes

    def _count_drop(self, frames: int, nbytes: int, why: str) -> None:
        self.stats.dropped_frames += frames
        self.stats.dropped_bytes += nbytes
        log.warning("SPOOL FULL (%d bytes max, policy %s): dropped %d frames / %d bytes: %s",
                    self.max_bytes, self.drop_policy.value, frames, nbytes, why)

    def append(self, key: bytes | None, value: bytes) -> bool:
        """Append one record; False if the drop policy refused it (counted, logged)."""
        if self._closed:
            raise RuntimeError("spool is closed")
        klen = -1 if key is None else len(key)
        payload = b"".join((_KEYLEN.pack(klen), key or b"", value))
        rec = b"".join((_HEADER.pack(len(payload), zlib.crc32(payload)), payload))
        size = len(rec)
        if size > self.max_bytes - self.segment_bytes:
            self._count_drop(1, size, "record larger than the spool")
            return False
        while self.total_bytes + size > self.max_bytes:
            if self.drop_policy is DropPolicy.DROP_NEWEST or not self._drop_oldest_segment():
                self._count_drop(1, size, "new record refused")
                return False
        cur = self._segments.get(self._write_seg)
        if self._wfd < 0 or cur is None or (cur.size and cur.size + size > self.segment_bytes):
            if self._wfd >= 0:
                self._write_seg += 1
            self._open_segment()
            cur = self._segments[self._write_seg]
        try:
            written = os.write(self._wfd, rec)
            if written != size:  # a short write on a regular file means the disk is full
                raise OSError(errno.ENOSPC, f"short write to the spool ({written} of {size} "
                              "bytes)")
        except OSError:
            # No torn record may stay behind: the next append would land after it and the
            # scan at the next open would truncate the segment there, losing the records
            # after it. Cut the file back to its last whole record (shrinking needs no space).
            self.stats.write_errors += 1
            os.ftruncate(self._wfd, cur.size)
            raise
        cur.size += size
        cur.records += 1
        self.stats.appended_frames += 1
        self.stats.appended_bytes += size
        self.stats.pending_frames += 1
        self.stats.pending_bytes += size
        self._dirty = True
        self.maybe_sync()
        return True

    def maybe_sync(self) -> None:
        """fsync written bytes if the policy says it is time (also called while idle, so
        the last records before a quiet spell do not wait for the next append)."""
        if self.fsync is FsyncPolicy.NEVER or not self._dirty or self._wfd < 0:
            return
        now = time.monotonic()
        if self.fsync is FsyncPolicy.ALWAYS or now - self._last_sync >= self.fsync_interval_s:
            os.fsync(self._wfd)
            self._dirty = False
            self._last_sync = now

    # ----------------------------------------------------------------- reading

    @property
    def pending_frames(self) -> int:
        """Records not yet acknowledged (read-but-unacked included)."""
        return self.stats.pending_frames

    def _advance(self) -> bool:
        """Move the read position past exhausted or deleted segments; True if data is left."""
        while True:
            info = self._segments.get(self._read_seg)
            if info is not None and self._read_off < info.size:
                return True
            later = [s for s in self._segments if s > self._read_seg]
            if not later:
                return False
            self._read_seg, self._read_off = min(later), 0

    def has_unread(self) -> bool:
        """True if :meth:`read` would return something now."""
        return self._advance()

    def read(self, max_records: int = 256, max_bytes: int = 4 << 20) -> list[SpoolRecord]:
        """Records after the read position, in order; advances the read position only.

        Call :meth:`ack` for each record the broker took (in order), or :meth:`rewind` to
        read the unacknowledged ones again after a failure.
        """
        out: list[SpoolRecord] = []
        total = 0
        while len(out) < max_records and total < max_bytes and self._advance():
            seg, base = self._read_seg, self._read_off
            size = self._segments[seg].size
            with open(self._seg_path(seg), "rb") as fh:
                fh.seek(base)
                data = fh.read(min(size - base, max(max_bytes - total, 1 << 20)))
                if len(data) >= _HEADER.size:
                    plen = _HEADER.unpack_from(data, 0)[0]
                    if _HEADER.size + plen > len(data) and base + _HEADER.size + plen <= size:
                        fh.seek(base)  # one record larger than the window: read it whole
                        data = fh.read(_HEADER.size + plen)
            off = 0
            view = memoryview(data)
            while len(out) < max_records and total < max_bytes and off < len(data):
                if off + _HEADER.size > len(data):
                    break
                plen, crc = _HEADER.unpack_from(data, off)
                end = off + _HEADER.size + plen
                if end > len(data):
                    if base + end <= size:
                        break  # the rest is valid but outside this read window
                    self._skip_corrupt(seg, base + off)
                    return out
                payload = view[off + _HEADER.size : end]
                if plen < _KEYLEN.size or zlib.crc32(payload) != crc:
                    self._skip_corrupt(seg, base + off)
                    return out
                (klen,) = _KEYLEN.unpack_from(payload, 0)
                kend = _KEYLEN.size + max(klen, 0)
                key = None if klen < 0 else bytes(payload[_KEYLEN.size : kend])
                out.append(SpoolRecord(key, bytes(payload[kend:]), seg, base + end, end - off))
                total += end - off
                off = end
            self._read_off = base + off
            if off == 0:
                break
        return out

    def _skip_corrupt(self, seg: int, at: int) -> None:
        info = self._segments[seg]
        lost = info.size - at
        self.stats.corrupt_bytes += lost
        log.warning("spool segment %d: invalid record at offset %d; skipping the remaining "
                    "%d bytes of the segment", seg, at, lost)
        self._read_off = info.size

    def rewind(self) -> None:
        """Read again from the oldest unacknowledged record (after a failed replay)."""
        self._read_seg, self._read_off = self._ack_seg, self._ack_off

    def ack(self, rec: SpoolRecord) -> None:
        """The broker acknowledged ``rec``; call in read order. Persist with :meth:`commit`
        (until then a restart replays it again)."""
        if (rec.segment, rec.end) <= (self._ack_seg, self._ack_off):
            return  # already acknowledged, or its segment was dropped meanwhile
        self._ack_seg, self._ack_off = rec.segment, rec.end
        self.stats.acked_frames += 1
        self.stats.pending_frames -= 1
        self.stats.pending_bytes -= rec.size

    def _delete_segment(self, seg: int) -> None:
        if seg == self._write_seg:
            return
        self._segments.pop(seg, None)
        self._seg_path(seg).unlink(missing_ok=True)

    def commit(self) -> None:
        """Persist the acknowledged position, then delete the segments entirely before it.

        Segments are deleted only here, after the cursor is written, so a crash replays
        exactly what follows the last committed position. A drained spool is reset to empty.
        """
        if self.stats.pending_frames == 0 and not self.has_unread():
            self._reset_when_drained()
        try:
            self._write_cursor()
        except OSError as exc:
            # A full disk: keep the old cursor (and the segments it still needs). The
            # records acknowledged since are replayed once more after a crash; downstream
            # de-duplicates by (agent, seq). Deleting segments frees the space it lacks.
            self.stats.write_errors += 1
            log.error("cannot write the spool cursor (%s); keeping the previous one", exc)
            return
        for seg in [s for s in self._segments if s < self._ack_seg]:
            self._delete_segment(seg)

    def _write_cursor(self) -> None:
        head = _CURSOR_FMT.pack(_CURSOR_MAGIC, self._ack_seg, self._ack_off, 0)[:20]
        raw = head + struct.pack("<I", zlib.crc32(head))
        tmp = self.dir / (_CURSOR + ".tmp")
        with open(tmp, "wb") as fh:
            fh.write(raw)
            if self.fsync is FsyncPolicy.ALWAYS:
                fh.flush()
                os.fsync(fh.fileno())
        os.replace(tmp, self.dir / _CURSOR)

    def _reset_when_drained(self) -> None:
        """Everything was delivered: delete all segments so the spool costs no disk."""
        self._close_writer()
        for seg in list(self._segments):
            self._segments.pop(seg)
            self._seg_path(seg).unlink(missing_ok=True)
        self._write_seg += 1
        self._ack_seg, self._ack_off = self._write_seg, 0
        self._read_seg, self._read_off = self._write_seg, 0

    def close(self) -> None:
        """Flush (per the fsync policy) and release the file; safe to call twice."""
        if self._closed:
            return
        self._close_writer()
        self._closed = True

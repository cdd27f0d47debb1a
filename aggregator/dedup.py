"""De-duplication of sample frames by (agent, sequence), replay-safe.

A frame is a duplicate when the same (agent, seq) was already seen at an *earlier* offset of
the partition. Remembering the offset (not just the seq) is what lets a restarted aggregator
restore this table as of its last checkpoint and re-read the messages after its committed
offset without mistaking them for duplicates of themselves.

Per agent only the most recent ``keep`` sequence numbers are remembered; a frame more than
``keep`` below the agent's highest sequence is treated as a duplicate (agents publish in
order, so such a frame can only be a stale redelivery). Entries at or above the partition's
resume offset are never pruned, so a replay always finds them.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SeqDeduper"]


class SeqDeduper:
    """The (agent, seq) table of one partition."""

    def __init__(self, keep: int = 256) -> None:
        self.keep = keep
        self._seen: dict[str, dict[int, int]] = {}
        self._hw: dict[str, int] = {}

    def is_duplicate(self, agent: str, seq: int, offset: int) -> bool:
        """Check and record; True means drop the frame."""
        seen = self._seen.get(agent)
        if seen is None:
            self._seen[agent] = {seq: offset}
            self._hw[agent] = seq
            return False
        first = seen.get(seq)
        if first is not None:
            return first < offset
        hw = self._hw[agent]
        if seq <= hw - self.keep:
            return True
        seen[seq] = offset
        if seq > hw:
            self._hw[agent] = seq
        return False

    def prune(self, resume_offset: int) -> None:
        """Forget entries no replay can need (older than ``keep`` and below the resume offset)."""
        for agent, seen in self._seen.items():
            if len(seen) <= self.keep:
                continue
            floor = self._hw[agent] - self.keep
            for seq in [s for s, off in seen.items() if s <= floor and off < resume_offset]:
                del seen[seq]

    def to_json(self) -> dict[str, Any]:
        return {a: [[s, o] for s, o in seen.items()] for a, seen in self._seen.items()}

    @classmethod
    def from_json(cls, data: dict[str, Any], keep: int = 256) -> SeqDeduper:
        d = cls(keep)
        for agent, pairs in data.items():
            d._seen[agent] = {int(s): int(o) for s, o in pairs}
            d._hw[agent] = max(d._seen[agent], default=-1)
        return d

"""Where a sample comes from: cluster / row / rack / node, validated once.

Identity strings travel in every frame and end up in store paths, label values and topic
keys, so they are restricted to a safe character set here, at the contract, rather than
escaped at every use.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from schemas.errors import DecodeError

__all__ = ["NAME_PATTERN", "NodeIdentity", "check_name"]

NAME_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}")


def check_name(what: str, value: object) -> str:
    """Return ``value`` if it is a safe identity string, else raise DecodeError."""
    if not isinstance(value, str) or NAME_PATTERN.fullmatch(value) is None:
        raise DecodeError(
            f"{what} must be 1-128 characters of [A-Za-z0-9._:-] starting with a letter or "
            f"digit, got {value!r:.80}"
        )
    return value


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    """The place of one GPU host in the fleet hierarchy."""

    cluster: str
    row: str
    rack: str
    node: str

    def __post_init__(self) -> None:
        for field in ("cluster", "row", "rack", "node"):
            check_name(field, getattr(self, field))

    @property
    def rack_key(self) -> bytes:
        """Kafka key for samples: a rack's nodes share a partition (see DESIGN.md)."""
        return f"{self.cluster}/{self.row}/{self.rack}".encode()

    @property
    def path(self) -> str:
        return f"{self.cluster}/{self.row}/{self.rack}/{self.node}"

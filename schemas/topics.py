"""Topic names, with the configurable prefix of DESIGN.md ("fleetpulse" by default)."""

from __future__ import annotations

from dataclasses import dataclass

from schemas.identity import check_name

__all__ = ["Topics"]


@dataclass(frozen=True, slots=True)
class Topics:
    """The five topics of one fleetpulse deployment.

    Two deployments share a broker by choosing different prefixes.
    """

    prefix: str = "fleetpulse"

    def __post_init__(self) -> None:
        check_name("topic prefix", self.prefix)

    @property
    def samples(self) -> str:
        """Sample frames, keyed by rack."""
        return f"{self.prefix}.samples"

    @property
    def events(self) -> str:
        """Event records (XID, GPU lost, inventory, agent start/stop), keyed by node."""
        return f"{self.prefix}.events"

    @property
    def rollups(self) -> str:
        """Rollup frames of rack level and up, keyed by row."""
        return f"{self.prefix}.rollups"

    @property
    def alerts(self) -> str:
        """Alert records (firing / resolved), keyed by entity."""
        return f"{self.prefix}.alerts"

    @property
    def deadletter(self) -> str:
        """Messages no consumer could decode: the original bytes plus a reason header."""
        return f"{self.prefix}.deadletter"

    def all(self) -> tuple[str, ...]:
        return (self.samples, self.events, self.rollups, self.alerts, self.deadletter)

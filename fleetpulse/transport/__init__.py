"""How stages publish and consume: one interface (base.py), two implementations.

``open_transport`` picks the implementation from the bootstrap string, so a stage's code
never names one: ``memory://NAME`` is the embedded in-process broker called NAME (stages
of one process that use the same name share it), anything else is a Kafka address list.
"""

from __future__ import annotations

from fleetpulse.config import TransportConfig
from fleetpulse.transport.base import (
    DEADLETTER_HEADERS,
    Consumer,
    Message,
    RebalanceListener,
    RecordMeta,
    TopicPartition,
    Transport,
    TransportError,
)

__all__ = [
    "DEADLETTER_HEADERS",
    "Consumer",
    "Message",
    "RebalanceListener",
    "RecordMeta",
    "TopicPartition",
    "Transport",
    "TransportConfig",
    "TransportError",
    "open_transport",
]


def open_transport(cfg: TransportConfig) -> Transport:
    """A not-yet-started transport for ``cfg`` (call ``await t.start()``, later ``close()``).

    The implementations are imported on demand, so importing this package (for the
    interface types) stays cheap.
    """
    cfg.validate()
    if cfg.is_memory:
        from fleetpulse.transport.memory import MemoryTransport

        return MemoryTransport(cfg)
    from fleetpulse.transport.kafka import KafkaTransport

    return KafkaTransport(cfg)

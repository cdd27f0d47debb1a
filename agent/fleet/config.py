"""Settings of ``fleetpulse fleet`` (the load generator), loaded from TOML + environment.

See ``config/fleet.toml`` for a commented sample; ``FLEETPULSE_FLEET_<FIELD>`` overrides a
field (``FLEETPULSE_FLEET_TRANSPORT__BOOTSTRAP=127.0.0.1:9092``), CLI flags override both.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.fleet.faults import FaultKind
from fleetpulse.config import ConfigError, TransportConfig

__all__ = ["FleetConfig"]


@dataclass(frozen=True, slots=True)
class FleetConfig:
    """One synthetic fleet run: its shape, its faults, and how it publishes."""

    gpus: int = 80
    """Total simulated GPUs (a multiple of ``gpus_per_node``)."""
    hz: float = 1.0
    """Ticks per second of every simulated agent."""
    duration_s: float = 60.0
    """How long to run; 0 runs until SIGINT/SIGTERM (then faults are not allowed)."""
    seed: int = 0
    """Everything random (workloads, noise, fault plan) follows from it."""
    faults: int = 0
    """How many faults to inject; kinds cycle so 8 or more include every kind."""
    fault_kinds: tuple[str, ...] = ()
    """Restrict injected kinds (empty: all of agent.fleet.FaultKind)."""
    labels: str = ""
    """Where to write the ground-truth labels (JSON list), empty for none."""
    gpus_per_node: int = 8
    nodes_per_rack: int = 4
    racks_per_row: int = 8
    cluster: str = "sim"
    ticks_per_frame: int = 5
    """Ticks per frame: one Kafka message per node per this many ticks (latency vs. overhead)."""
    partitions: int = 12
    """Partitions of the samples topic when the fleet has to create it."""
    max_in_flight: int = 2048
    """Frames awaiting the broker's acknowledgement before publishing waits (backpressure)."""
    realtime: bool = True
    """Pace ticks at ``hz`` on the wall clock; False publishes as fast as the broker takes."""
    progress_s: float = 2.0
    """Seconds between progress lines on stderr (0: none)."""
    metrics_host: str = "127.0.0.1"
    metrics_port: int = -1
    """Prometheus /metrics of the load generator itself: -1 off, 0 any free port."""
    jobs_dir: str = ""
    """Schedule jobs (agent.fleet.jobs) and write their job-mapping dirs here, one per node;
    their attribution events go to the events topic as the nodes' agents would send them.
    Empty: no jobs."""
    job_min_s: float = 300.0
    """Shortest job, seconds (job lengths are log-uniform in [min, max])."""
    job_max_s: float = 3 * 86400.0
    """Longest job (three days)."""
    job_poll_s: float = 5.0
    """Seconds between job-mapping polls (the agents' attribution.interval_s)."""
    transport: TransportConfig = field(default_factory=TransportConfig)

    def validate(self) -> None:
        if self.gpus < 1:
            raise ConfigError("gpus must be >= 1")
        if not 0 < self.hz <= 50:
            raise ConfigError(f"hz must be in (0, 50], got {self.hz}")
        if self.duration_s < 0:
            raise ConfigError("duration_s must be >= 0")
        if self.faults < 0:
            raise ConfigError("faults must be >= 0")
        if self.faults and self.duration_s == 0:
            raise ConfigError("faults need a finite duration_s (labels need an end)")
        kinds = {k.value for k in FaultKind}
        bad = [k for k in self.fault_kinds if k not in kinds]
        if bad:
            raise ConfigError(f"fault_kinds: unknown {bad}; choose from {sorted(kinds)}")
        if self.gpus > self.gpus_per_node and self.gpus % self.gpus_per_node:
            raise ConfigError(f"gpus ({self.gpus}) must be a multiple of gpus_per_node "
                              f"({self.gpus_per_node})")
        if not 1 <= self.ticks_per_frame <= 4096:
            raise ConfigError("ticks_per_frame must be in [1, 4096]")
        if self.partitions < 1 or self.max_in_flight < 1:
            raise ConfigError("partitions and max_in_flight must be >= 1")
        if not -1 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port must be -1 (off), 0 (any) or a port number")
        if self.progress_s < 0:
            raise ConfigError("progress_s must be >= 0")
        if not 0 < self.job_min_s <= self.job_max_s or self.job_poll_s <= 0:
            raise ConfigError("jobs need 0 < job_min_s <= job_max_s and job_poll_s > 0")

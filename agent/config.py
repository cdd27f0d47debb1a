"""The agent's settings: one frozen dataclass tree, loaded from TOML + environment.

Load with :func:`load_agent_config` (``fleetpulse.config.load_config`` underneath):
defaults < ``config/agent.toml`` (or ``--config``) < environment variables
``FLEETPULSE_AGENT_<TABLE>__<FIELD>`` (e.g. ``FLEETPULSE_AGENT_IDENTITY__RACK=rack-07``,
``FLEETPULSE_AGENT_TRANSPORT__BOOTSTRAP=kafka-1:9092``) < command-line flags. Every table
validates itself, so a bad value stops the agent at start with the field's name in the error.
"""

from __future__ import annotations

import dataclasses
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from fleetpulse.config import ConfigError, TransportConfig, load_config
from schemas.identity import NAME_PATTERN, NodeIdentity

__all__ = [
    "ENV_PREFIX",
    "AgentConfig",
    "AttributionConfig",
    "DcgmSourceConfig",
    "IdentityConfig",
    "MetricsConfig",
    "NvmlSourceConfig",
    "PublishConfig",
    "SamplingConfig",
    "SourceConfig",
    "SpoolConfig",
    "SyntheticSourceConfig",
    "default_node_name",
    "load_agent_config",
]

ENV_PREFIX: Final = "FLEETPULSE_AGENT_"
MIN_INTERVAL_S: Final = 0.1
"""The issue's floor: faster than 10 Hz costs more than it tells (NVML refreshes ~1-10 Hz)."""


def default_node_name() -> str:
    """The short host name, made safe for the identity character set."""
    name = re.sub(r"[^A-Za-z0-9._:\-]", "-", socket.gethostname().split(".")[0])[:128]
    return name if NAME_PATTERN.fullmatch(name) else "node"


@dataclass(frozen=True, slots=True)
class IdentityConfig:
    """Where this host sits in the fleet (carried in every frame and event)."""

    cluster: str = "default"
    """Cluster name."""
    row: str = "row-0"
    """Data-center row."""
    rack: str = "rack-0"
    """Rack; samples are keyed by cluster/row/rack, so a rack shares a Kafka partition."""
    node: str = ""
    """Node name; empty means the host name."""

    def resolved(self) -> NodeIdentity:
        return NodeIdentity(self.cluster, self.row, self.rack, self.node or default_node_name())

    def validate(self) -> None:
        try:
            self.resolved()
        except ValueError as exc:
            raise ConfigError(f"identity: {exc}") from None


@dataclass(frozen=True, slots=True)
class NvmlSourceConfig:
    """Options of the ``nvml`` source."""

    events: bool = True
    """Watch XID and ECC events in a background thread (nvmlEventSetWait)."""
    event_wait_ms: int = 1000
    """How long one nvmlEventSetWait blocks; bounds how fast the thread notices shutdown."""

    def validate(self) -> None:
        if not 10 <= self.event_wait_ms <= 60_000:
            raise ConfigError("source.nvml.event_wait_ms must be in [10, 60000]")


@dataclass(frozen=True, slots=True)
class DcgmSourceConfig:
    """Options of the ``dcgm`` source."""

    url: str = "http://127.0.0.1:9400/metrics"
    """The dcgm-exporter page to scrape."""
    timeout_s: float = 2.0
    """Per-scrape timeout; keep it below the sampling interval."""

    def validate(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"source.dcgm.url must start with http:// or https://, "
                              f"got {self.url!r}")
        if not 0 < self.timeout_s <= 60:
            raise ConfigError("source.dcgm.timeout_s must be in (0, 60]")


@dataclass(frozen=True, slots=True)
class SyntheticSourceConfig:
    """Options of the ``synthetic`` source (one node of the synthetic fleet)."""

    gpus: int = 8
    """GPUs on the simulated node."""
    seed: int = 0
    """Random seed; with the node identity it makes the node's data reproducible."""
    faults: int = 0
    """Faults to inject into this node, planned over ``horizon_s``."""
    fault_kinds: tuple[str, ...] = ()
    """Restrict injected faults to these kinds (agent/fleet/faults.py); empty: any."""
    horizon_s: float = 3600.0
    """The run length faults are planned over."""

    def validate(self) -> None:
        if not 1 <= self.gpus <= 64:
            raise ConfigError("source.synthetic.gpus must be in [1, 64]")
        if self.faults < 0 or self.horizon_s <= 0:
            raise ConfigError("source.synthetic: faults >= 0 and horizon_s > 0 required")


@dataclass(frozen=True, slots=True)
class SourceConfig:
    """Which source to sample, and the options of each."""

    name: str = "nvml"
    """``nvml``, ``dcgm`` or ``synthetic``."""
    nvml: NvmlSourceConfig = field(default_factory=NvmlSourceConfig)
    dcgm: DcgmSourceConfig = field(default_factory=DcgmSourceConfig)
    synthetic: SyntheticSourceConfig = field(default_factory=SyntheticSourceConfig)

    def validate(self) -> None:
        if self.name not in ("nvml", "dcgm", "synthetic"):
            raise ConfigError(f"source.name must be nvml, dcgm or synthetic, got {self.name!r}")

    def options(self) -> dict[str, Any]:
        """The chosen source's table as plain values (what its factory receives)."""
        return dataclasses.asdict(getattr(self, self.name))


@dataclass(frozen=True, slots=True)
class AttributionConfig:
    """Which workload each GPU serves (agent/attribution/): sources polled every few seconds,
    changes sent as ``attribution`` events."""

    sources: tuple[str, ...] = ()
    """``kubelet``, ``job_mapping``, ``dcgm`` and/or ``static``, merged in this order (the
    first to name a label wins); empty: no attribution."""
    interval_s: float = 5.0
    """Seconds between polls: an ended workload is detached at most this late."""
    timeout_s: float = 2.0
    """Per poll of one source (the kubelet's gRPC call)."""
    kubelet_socket: str = "/var/lib/kubelet/pod-resources/kubelet.sock"
    """The kubelet's pod-resources socket (``kubelet`` source)."""
    kubelet_resources: tuple[str, ...] = ("nvidia.com/gpu", "nvidia.com/mig-")
    """Resource-name prefixes whose devices are GPUs (or MIG instances)."""
    job_mapping_dir: str = ""
    """dcgm-exporter's ``--hpc-job-mapping-dir``: one file per GPU index or uuid listing job
    ids (``job_mapping`` source)."""
    static_labels: tuple[str, ...] = ()
    """``key=value`` labels added to every GPU's workload (``static`` source), e.g.
    ``tenant=acme``."""

    def validate(self) -> None:
        known = ("kubelet", "job_mapping", "dcgm", "static")
        for name in self.sources:
            if name not in known:
                raise ConfigError(f"attribution.sources: {name!r} is not one of "
                                  f"{', '.join(known)}")
        if len(set(self.sources)) != len(self.sources):
            raise ConfigError("attribution.sources names a source twice")
        if not 0.5 <= self.interval_s <= 3600:
            raise ConfigError("attribution.interval_s must be in [0.5, 3600]")
        if not 0 < self.timeout_s <= 60:
            raise ConfigError("attribution.timeout_s must be in (0, 60]")
        if "job_mapping" in self.sources and not self.job_mapping_dir:
            raise ConfigError("attribution.job_mapping_dir must be set for job_mapping")
        for item in self.static_labels:
            if "=" not in item:
                raise ConfigError(f"attribution.static_labels: {item!r} is not key=value")


@dataclass(frozen=True, slots=True)
class SamplingConfig:
    """The tick clock and frame batching."""

    interval_s: float = 1.0
    """Seconds between ticks (>= 0.1). Ticks are aligned to multiples of it in wall time."""
    ticks_per_frame: int = 5
    """Ticks per published frame; a frame also closes early when the GPU/metric layout changes."""
    late_after_s: float = 0.0
    """A tick that starts later than this after its schedule is 'late' (counted, real
    timestamp); 0 means a tenth of the interval."""

    def validate(self) -> None:
        if self.interval_s < MIN_INTERVAL_S:
            raise ConfigError(f"sampling.interval_s must be >= {MIN_INTERVAL_S}, "
                              f"got {self.interval_s}")
        if not 1 <= self.ticks_per_frame <= 600:
            raise ConfigError("sampling.ticks_per_frame must be in [1, 600]")
        if self.late_after_s < 0:
            raise ConfigError("sampling.late_after_s must be >= 0")

    @property
    def late_threshold_s(self) -> float:
        return self.late_after_s or self.interval_s / 10


@dataclass(frozen=True, slots=True)
class SpoolConfig:
    """The on-disk spool for frames the broker could not take (see agent/spool.py)."""

    directory: Path = Path("/var/lib/fleetpulse/agent-spool")
    """Spool directory (samples/ and events/ below it); must be on local disk."""
    max_bytes: int = 256 << 20
    """Disk budget for the samples spool (events get a sixteenth of it)."""
    drop_policy: str = "drop_oldest"
    """When full: drop_oldest (keep fresh data) or drop_newest (keep history); both counted."""
    fsync: str = "interval"
    """always | interval | never (agent/spool.py explains what each survives)."""
    fsync_interval_s: float = 1.0
    """For fsync = interval: the most a power loss can take."""

    def validate(self) -> None:
        if self.drop_policy not in ("drop_oldest", "drop_newest"):
            raise ConfigError("spool.drop_policy must be drop_oldest or drop_newest")
        if self.fsync not in ("always", "interval", "never"):
            raise ConfigError("spool.fsync must be always, interval or never")
        if self.max_bytes < 1 << 20:
            raise ConfigError("spool.max_bytes must be at least 1 MiB")
        if self.fsync_interval_s <= 0:
            raise ConfigError("spool.fsync_interval_s must be > 0")


@dataclass(frozen=True, slots=True)
class PublishConfig:
    """How frames reach the broker."""

    max_in_flight: int = 256
    """Frames sent but not yet acknowledged, at most."""
    ack_timeout_s: float = 40.0
    """A frame not acknowledged within this goes to the spool (a slow broker counts as down).
    Must exceed ``transport.request_timeout_ms``: the client fails a send by itself first,
    so a frame is never both spooled and still queued inside the client (a duplicate)."""
    retry_initial_s: float = 0.5
    """First back-off while the broker keeps failing; doubles up to retry_max_s."""
    retry_max_s: float = 10.0
    """Longest back-off between replay attempts."""
    create_topics: int = 0
    """If > 0, create missing topics with this many partitions at start (for tests, demos)."""

    def validate(self) -> None:
        if self.max_in_flight < 1 or self.ack_timeout_s <= 0:
            raise ConfigError("publish.max_in_flight and publish.ack_timeout_s must be > 0")
        if not 0 < self.retry_initial_s <= self.retry_max_s:
            raise ConfigError("publish: need 0 < retry_initial_s <= retry_max_s")
        if self.create_topics < 0:
            raise ConfigError("publish.create_topics must be >= 0")


@dataclass(frozen=True, slots=True)
class MetricsConfig:
    """The agent's own Prometheus endpoint."""

    enabled: bool = True
    """Serve /metrics."""
    host: str = "127.0.0.1"
    """Bind address; loopback by default, set 0.0.0.0 deliberately to expose it."""
    port: int = 9108
    """Port (0 picks a free one, printed at start)."""

    def validate(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ConfigError("metrics.port must be in [0, 65535]")


@dataclass(frozen=True, slots=True)
class AgentConfig:
    """Everything ``fleetpulse agent`` needs."""

    identity: IdentityConfig = field(default_factory=IdentityConfig)
    source: SourceConfig = field(default_factory=SourceConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    publish: PublishConfig = field(default_factory=PublishConfig)
    spool: SpoolConfig = field(default_factory=SpoolConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    shutdown_timeout_s: float = 10.0
    """On SIGTERM/SIGINT: how long to try the broker before leaving the rest in the spool."""

    def validate(self) -> None:
        if self.shutdown_timeout_s < 0:
            raise ConfigError("shutdown_timeout_s must be >= 0")
        if self.publish.ack_timeout_s * 1000 <= self.transport.request_timeout_ms:
            raise ConfigError(
                f"publish.ack_timeout_s ({self.publish.ack_timeout_s}) must exceed "
                f"transport.request_timeout_ms ({self.transport.request_timeout_ms} ms)")


def load_agent_config(
    path: str | Path | None = None,
    *,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> AgentConfig:
    """Defaults < TOML file < ``FLEETPULSE_AGENT_*`` environment < ``overrides``."""
    return load_config(AgentConfig, path, env_prefix=ENV_PREFIX, overrides=overrides,
                       environ=environ)

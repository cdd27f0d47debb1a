"""The aggregator's settings (``config/aggregator.toml``, env ``FLEETPULSE_AGGREGATOR_*``)."""

from __future__ import annotations

from dataclasses import dataclass, field

from aggregator.remote_write import RemoteWriteConfig
from fleetpulse.config import ConfigError, TransportConfig

__all__ = ["AggregatorConfig"]


@dataclass(frozen=True, slots=True)
class AggregatorConfig:
    """One aggregator instance: rack stage, row/cluster stage, store and query API."""

    transport: TransportConfig = field(default_factory=TransportConfig)
    """How to reach Kafka (or the embedded broker)."""
    data_dir: str = "data/aggregator"
    """Store and entity index of this instance (its own: partition checkpoints travel
    through the group's changelog topics, ``<group_id>-changelog``)."""
    listen: str = "127.0.0.1:9464"
    """host:port of the query API and /metrics (127.0.0.1 unless you mean otherwise)."""
    group_id: str = "fleetpulse-aggregator"
    """Consumer group of the rack stage; the row stage uses ``<group_id>-rows``."""
    lateness_ms: int = 20_000
    """A window closes when its partition's watermark passes its end by this much."""
    row_lateness_ms: int = 300_000
    """Row/cluster stage: a parent window closes when all its children moved past it, or
    (a dead rack) when the most advanced child is this far past the window's end."""
    row_settle_ms: int = 60_000
    """Row/cluster stage: for this long (event time) after a row or cluster is first seen,
    its windows close only by lateness, so a rack whose first rollup comes late (an instance
    slower to start) is still counted in them. The first windows are published this much
    later; after that it costs nothing."""
    commit_interval_ms: int = 30_000
    """How often to flush the store, checkpoint and commit offsets (Kafka Streams' default
    commit interval too). Each flush writes one record per group with new points, and each
    checkpoint carries every partition's running 1 m / 1 h / 1 d windows (about 15 MB a
    partition, 180 MB a cycle, at 31,000 GPUs), so a longer interval is cheaper: at 31,000
    GPUs the rack stage and store cost 0.93 CPU-s per million metrics with a cycle every
    10 s of data, 0.66 every 30 s (``benchmarks.rack_stage --cycle-s``, two runs each,
    2026-12-06; at 30,000 GPUs 2 s had cost 0.80, 10 s 0.65 with the code of then). What it
    costs is replay after a crash: up to this much more data is read again from Kafka."""
    max_batch: int = 2_000
    """Messages per poll."""
    samples_partitions: int = 8
    """Partitions to create for the samples topic when it does not exist."""
    rollups_partitions: int = 4
    raw: bool = True
    """Keep raw samples (the raw tier) besides the rollups."""
    row_stage: bool = True
    """Run the row/cluster stage in this process too."""
    workloads: bool = True
    """Read the whole events topic (a group of its own per data directory) for workload
    attribution, so the query API answers ``level="job"`` and ``level="namespace"``."""
    fsync: bool = True
    """fsync at every flush; off only for throwaway benchmarks."""
    compact_recode: bool = True
    """Store compaction re-encodes finished segments with the codec's entropy stage and
    joins chunks (``StoreConfig.compact_recode``): 22-35 % smaller than VictoriaMetrics.
    The re-encode runs a slice at a time inside each durability cycle's flush (see
    ``compact_budget_s``). Data written with it on stays readable after it is turned off."""
    compact_budget_s: float = 0.25
    """Most time one store flush spends rewriting finished segments (plus one record), so
    compaction never stalls the store thread for a whole segment
    (``StoreConfig.compact_budget_s``). At the default ``commit_interval_ms`` that is
    2.5 % of a core, enough for a 2 h raw segment of 10,000 GPUs x 33 metrics at 1 Hz to
    be rewritten within the next 2 h; a smaller budget or a larger fleet per instance can
    let rewrites fall behind."""
    bearer_token: str = ""
    """If set, the query API requires ``Authorization: Bearer <token>``."""
    max_points_per_series: int = 11_000
    """Like Prometheus: a range query asking for more points per series is a 400."""
    max_series: int = 50_000
    """Most series one query may select."""
    lookback_ms: int = 300_000
    """Instant queries take the newest window within this much before the query time."""
    max_future_ms: int = 600_000
    """Samples stamped further ahead of this host's clock are counted, not rolled up (an
    agent whose clock jumped); 0 turns it off, for synthetic time run faster than real."""
    peers: tuple[str, ...] = ()
    """Query API base URLs (``http://host:port``) of the other instances of the group: the
    query API then answers for the whole fleet (:mod:`aggregator.fleet_query`). This
    instance's own address may be listed too (skipped), so every instance can share one
    list."""
    max_samples: int = 50_000_000
    """Most series x points one selector may read; more is refused (422) before reading."""
    remote_write: RemoteWriteConfig = field(default_factory=RemoteWriteConfig)
    """Send chosen levels and tiers to a Prometheus remote-write receiver (off: no url)."""

    @property
    def host_port(self) -> tuple[str, int]:
        host, _, port = self.listen.rpartition(":")
        return host or "127.0.0.1", int(port)

    def validate(self) -> None:
        if min(self.lateness_ms, self.row_lateness_ms, self.row_settle_ms,
               self.max_future_ms) < 0:
            raise ConfigError("lateness_ms, row_lateness_ms, row_settle_ms and max_future_ms "
                              "must not be negative")
        if self.commit_interval_ms < 10 or self.max_batch < 1:
            raise ConfigError("commit_interval_ms >= 10 and max_batch >= 1")
        host, _, port = self.listen.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) < 65536:
            raise ConfigError(f"listen must be host:port, got {self.listen!r}")
        for peer in self.peers:
            if not peer.startswith(("http://", "https://")):
                raise ConfigError(f"peers are http(s):// URLs, got {peer!r}")
        if self.max_points_per_series < 1 or self.max_series < 1 or self.max_samples < 1:
            raise ConfigError("query limits must be positive")
        if not self.compact_budget_s > 0:  # (NaN too)
            raise ConfigError(f"compact_budget_s must be positive, not {self.compact_budget_s}")

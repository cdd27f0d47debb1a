"""The detector's settings: one frozen dataclass per concern, loaded from TOML + environment.

Defaults are the values the detection benchmark (``benchmarks/detection.py``) was tuned
with; ``config/detector.toml`` lists every field.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Final

from detector.engines.base import EngineConfig
from detector.episodes import EpisodeParams
from detector.job_peers import JobPeerParams
from detector.rules import RuleParams
from detector.thresholds import ThresholdParams
from fleetpulse.config import ConfigError, TransportConfig

__all__ = [
    "AlertConfig",
    "DetectorConfig",
    "ModelConfig",
    "RackModelConfig",
    "RulesConfig",
    "WebhookConfig",
]


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The per-GPU forest and its threshold."""

    enabled: bool = True
    """False runs no per-GPU forest: no model steps and no model signals, while the health
    rules, job peers and the rack model run as always. The forests page nobody by default
    (``alerts.model_severity = "info"``) and cost most of a GPU-step, so a site short of
    cores keeps every page this way; the soak benchmark measures false pages so."""
    engine: str = ""
    """Forest engine name (``detector.engines.ENGINE_NAMES``); empty means the default."""
    step_s: float = 1.0
    """Seconds per model step. Each GPU's ticks within a step are folded into one point
    (``detector.step_fold``: means of levels, last counters, OR of throttle bits), so a
    forest costs one update per GPU and step whatever the sampling rate, and every count
    in steps (``shingle``, ``warmup``, ``horizon``, the hysteresis) means the same time at
    1 Hz and at 5 Hz. The health rules see every tick regardless."""
    trees: int = 30
    """Trees per forest."""
    sample_size: int = 256
    """Points kept per tree."""
    shingle: int = 4
    """Steps per shingled point."""
    screen_trees: int = 2
    """Trees per sample group scored first; a point whose score on them is below
    ``screen_below`` times its threshold skips the rest (``EngineConfig.screen_trees``);
    0 scores every tree. Chosen on the tuning zoo: 2 of 15 per group gives the same
    forest alerts as every tree at about three quarters of the detector's CPU per GPU-step."""
    screen_below: float = 0.5
    """... as a share of the threshold. Well under the node veto's "elevated" (0.8 of the
    threshold, ``detector.shard``): a point whose few trees say less than half is almost
    never one the whole forest puts that high."""
    time_decay: float = 0.0
    """Reservoir decay lambda; 0 means AWS's default 1 / (10 * sample_size)."""
    seed: int = 7
    """Seed of the forests' random cuts (each model derives its own)."""
    z: float = 6.0
    """Threshold = running score mean + z * running score std ..."""
    floor: float = 2.8
    """... but never below this score."""
    horizon: int = 2000
    """Steps of memory of the running score statistics."""
    warmup: int = 600
    """Cold start: scored steps before a model may alert."""
    std_floor: float = 0.05
    """Smallest standard deviation the threshold assumes."""

    def threshold_params(self) -> ThresholdParams:
        return ThresholdParams(z=self.z, floor=self.floor, horizon=self.horizon,
                               warmup=self.warmup, std_floor=self.std_floor)

    def engine_config(self, dims: int) -> EngineConfig:
        """The forest of one model over ``dims`` base features (GPU models and backtest)."""
        return EngineConfig(dims=dims, shingle=self.shingle, trees=self.trees,
                            sample_size=self.sample_size, time_decay=self.time_decay or None,
                            seed=self.seed, screen_trees=self.screen_trees,
                            screen_below=self.screen_below)

    def validate(self) -> None:
        if not 0.05 <= self.step_s <= 3600.0:
            raise ConfigError(f"model.step_s must be in [0.05, 3600], got {self.step_s}")
        if self.trees < 1 or self.sample_size < 8 or self.shingle < 1:
            raise ConfigError("model: trees >= 1, sample_size >= 8 and shingle >= 1 required")
        if not 0.0 <= self.time_decay < 1.0:
            raise ConfigError(f"model.time_decay must be in [0, 1), got {self.time_decay}")
        if self.screen_trees < 0 or not 0.0 <= self.screen_below <= 1.0:
            raise ConfigError("model: screen_trees >= 0 and screen_below in [0, 1] required")
        if self.z <= 0 or self.floor <= 0 or self.horizon < 10 or self.warmup < 0:
            raise ConfigError("model: z > 0, floor > 0, horizon >= 10, warmup >= 0 required")


@dataclass(frozen=True, slots=True)
class RackModelConfig:
    """The rack-level forest over rack aggregates."""

    enabled: bool = True
    """Run a forest per rack over rack means (cooling waves)."""
    window_s: float = 10.0
    """Event-time window of the rack aggregates."""
    trees: int = 30
    """Trees per rack forest."""
    sample_size: int = 64
    """Points kept per tree (scores start after a quarter of it)."""
    shingle: int = 3
    """Windows per shingled point."""
    z: float = 6.0
    """Threshold z factor (as for GPUs)."""
    floor: float = 2.2
    """Threshold floor."""
    warmup: int = 60
    """Cold start in windows (after the engine's own ``sample_size / 4``)."""
    open_after: int = 3
    """Anomalous windows (nearly consecutive, of about the last 4) that open a rack alert."""
    resolve_after: int = 4
    """Consecutive quiet windows that resolve it."""
    heat_excess_c: float = 4.0
    """Rack heat rule: the rack's GPUs run this much hotter than their thermal models, on
    average ..."""
    heat_after_s: float = 60.0
    """... for this long, gathered faster the hotter it runs (a quarter of it at twice
    ``heat_excess_c`` or more; it resolves at the first window below half of it)."""
    heat_baseline_s: float = 3600.0
    """... above the rack's own baseline, learned over this many seconds from the windows near
    it: the models' lag on an inlet that drifts with the day (at most about 1 degC an hour)
    is left a degree behind, while a cooling fault (minutes) outruns it."""

    def validate(self) -> None:
        if self.window_s <= 0 or self.open_after < 1 or self.resolve_after < 1:
            raise ConfigError("rack: window_s > 0, open_after >= 1, resolve_after >= 1")
        if self.heat_excess_c <= 0 or self.heat_after_s < 0 or self.heat_baseline_s <= 0:
            raise ConfigError("rack: heat_excess_c > 0, heat_after_s >= 0 and "
                              "heat_baseline_s > 0 required")


@dataclass(frozen=True, slots=True)
class AlertConfig:
    """Hysteresis of model alerts."""

    open_after: int = 3
    """Anomalous steps (consecutive, or nearly: see ``detector.episodes``) that open a GPU
    alert. A forest absorbs a new regime within about ten steps, so this must be short."""
    open_window: int = 10
    """Steps of memory of that count."""
    resolve_after: int = 30
    """Consecutive quiet steps that resolve it."""
    cooldown_s: float = 900.0
    """After a resolution, seconds before the same GPU may alert again (level shifts)."""
    top_metrics: int = 3
    """Attributed metrics listed in an alert."""
    node_veto: float = 0.25
    """When at least this fraction of a node's GPUs (two or more) scored anomalous within
    ``node_window_s``, their anomalies do not count (a job started or ended), except for a GPU
    set apart from its node's median utilisation or power. 1.0 turns the veto off."""
    node_window_s: float = 30.0
    """How close together a node's anomalies must be to count as one shared change."""
    model_severity: str = "info"
    """Severity of the forests' alerts (GPU and rack): ``info`` (a signal: on the alerts
    topic and in Alertmanager, but it opens no incident and the shipped Alertmanager config
    pages nobody with it) or ``warning`` (pages as a rule does; critical at twice the
    threshold). Info because on every fleet of the zoo the forests found no fault the health
    rules did not, while every incident they raised alone was false (README, "Detection
    benchmark"): "unlike its history" is context for an SRE, not a reason to wake one."""

    def episode_params(self) -> EpisodeParams:
        return EpisodeParams(self.open_after, self.open_window, self.resolve_after,
                             self.cooldown_s)

    def validate(self) -> None:
        if (self.open_after < 1 or self.open_window < 2 or self.resolve_after < 1
                or self.cooldown_s < 0):
            raise ConfigError("alerts: open_after >= 1, resolve_after >= 1, cooldown_s >= 0")
        if not 0.0 < self.node_veto <= 1.0:
            raise ConfigError(f"alerts.node_veto must be in (0, 1], got {self.node_veto}")
        if self.model_severity not in ("info", "warning"):
            raise ConfigError("alerts.model_severity must be 'info' or 'warning', got "
                              f"{self.model_severity!r}")


_RULES: Final = RuleParams()
"""The rules' own defaults: the config's are theirs (one place to change one)."""


@dataclass(frozen=True, slots=True)
class RulesConfig:
    """Deterministic health rules (``detector.rules``)."""

    stale_after_s: float = _RULES.stale_after_s
    """A GPU silent this long while its rack reports is lost."""
    silent_after_s: float = 30.0
    """A node (or a whole rack) that sent nothing this long is silent (``detector.silence``);
    a node whose frames have no reading this long has a blank exporter."""
    lost_open_after: int = _RULES.lost_open_after
    """All-NaN steps before a reporting GPU counts as lost."""
    slowdown_open_after: int = _RULES.slowdown_open_after
    """Steps with a slowdown bit before the slowdown rules fire."""
    stuck_after_s: float = _RULES.stuck_after_s
    """A temperature reading unchanged this long ..."""
    stuck_predicted_c: float = _RULES.stuck_predicted_c
    """... while the GPU's own thermal model predicts this much change is a stuck sensor."""
    excess_c: float = _RULES.excess_c
    """Degrees above the GPU's thermal prediction and its node peers' ..."""
    excess_after_s: float = _RULES.excess_after_s
    """... held this long: the GPU's heat path degraded."""
    stuck_history_s: float = _RULES.stuck_history_s
    """Seconds learned at a power before the sensor's own longest runs of one value at that
    power are trusted."""
    peer_excess_c: float = _RULES.peer_excess_c
    """A die this far above the median of its node's GPUs that drew its power (now and over
    each candidate lag), beyond its learned seat, for ``excess_after_s``: its heat path
    degraded, judged with no thermal model."""
    rest_excess_c: float = _RULES.rest_excess_c
    """A GPU of a node at rest this far above the node's median beyond its learned place ..."""
    rest_unlearned_c: float = _RULES.rest_unlearned_c
    """... or this far above it before its place is learned ..."""
    rest_settle_s: float = _RULES.rest_settle_s
    """... once the whole node has idled this long ..."""
    rest_learn_s: float = _RULES.rest_learn_s
    """... its place learned over this many seconds at rest: the heat path degraded."""
    deficit_ratio: float = _RULES.deficit_ratio
    """A busy GPU this far below its peers' (or its own best) SM clock with no reason bit ..."""
    deficit_after_s: float = _RULES.deficit_after_s
    """... this long is a straggler."""
    burst_count: float = _RULES.burst_count
    """ECC / link errors within about ``burst_window_s`` that make a burst ..."""
    burst_window_s: float = _RULES.burst_window_s
    """... the exponential memory of that count, seconds."""
    event_hold_s: float = _RULES.event_hold_s
    """XID / DBE / burst alerts stay open this long after the last occurrence."""
    state_hold_s: float = _RULES.state_hold_s
    """State rules resolve after this long clear."""

    def params(self) -> RuleParams:
        return RuleParams(**{f.name: getattr(self, f.name) for f in fields(RuleParams)})

    def validate(self) -> None:
        if (self.stale_after_s <= 0 or self.silent_after_s <= 0 or self.lost_open_after < 1
                or self.slowdown_open_after < 1):
            raise ConfigError("rules: stale_after_s, silent_after_s > 0 and open counts >= 1 "
                              "required")
        if min(self.stuck_after_s, self.stuck_predicted_c, self.excess_c, self.peer_excess_c,
               self.burst_count, self.burst_window_s) <= 0 or min(self.excess_after_s, self.stuck_history_s,
                                                self.deficit_after_s) < 0 \
                or not 0.0 < self.deficit_ratio < 1.0 \
                or not 0 < self.rest_excess_c <= self.rest_unlearned_c \
                or self.rest_settle_s < 0 or self.rest_learn_s <= 0:
            raise ConfigError("rules: stuck_*, excess_c, peer_excess_c, burst_count and "
                              "burst_window_s must "
                              "be > 0, the *_after_s and stuck_history_s >= 0, deficit_ratio "
                              "in (0, 1), 0 < rest_excess_c <= rest_unlearned_c, "
                              "rest_settle_s >= 0 and rest_learn_s > 0")


@dataclass(frozen=True, slots=True)
class JobPeersConfig:
    """GPUs judged against their job's GPUs, and job starts and ends as known changes of
    regime (``detector.job_peers``; jobs come from the ``attribution`` events)."""

    enabled: bool = True
    """Off: jobs only name alerts, as before."""
    below_ratio: float = 0.7
    """A GPU at this fraction or less of its job's median utilisation ... (chosen on the
    tuning seeds of ``benchmarks.detection_jobs``)"""
    busy: float = 0.5
    """... while that median is at least this (an idle job sets no pace) ..."""
    after_s: float = 60.0
    """... this long is a straggler (``rule:job_straggler``)."""
    settle_s: float = 120.0
    """After a GPU's job attached or detached, or its job gained or lost a GPU, this long it
    is settling: no straggler test, and its forest anomalies do not count."""
    hold_s: float = 30.0
    """A straggler alert resolves after this long clear."""
    floor: float = 0.0
    """A GPU's own utilisation must be at least this to be judged (0: a rank stalled at 0 %
    in a busy job is a straggler too)."""

    def params(self) -> JobPeerParams:
        return JobPeerParams(self.enabled, self.below_ratio, self.busy, self.after_s,
                             self.settle_s, self.hold_s, self.floor)

    def validate(self) -> None:
        if not 0.0 < self.below_ratio < 1.0 or not 0.0 <= self.busy <= 1.0:
            raise ConfigError("job_peers: below_ratio in (0, 1) and busy in [0, 1] required")
        if min(self.after_s, self.settle_s, self.hold_s) < 0:
            raise ConfigError("job_peers: after_s, settle_s and hold_s must be >= 0")


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Optional Alertmanager receiver."""

    url: str = ""
    """Alertmanager base URL (``http://host:9093``); alerts go to ``/api/v2/alerts``. Empty:
    no webhook."""
    timeout_s: float = 5.0
    """Per-request timeout; a failed POST is logged and counted, never fatal."""
    resend_s: float = 60.0
    """Firing alerts are re-posted this often (Alertmanager expires silent ones)."""

    def validate(self) -> None:
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"webhook.url must be http(s)://..., got {self.url!r}")


@dataclass(frozen=True, slots=True)
class RemediationConfig:
    """Optional remediation hook (``detector.remediation``): a command per action, run for
    an incident on one node, behind a circuit breaker. Every template empty: no hook."""

    dry_run: bool = True
    """Log and count what would run, run nothing (the default: turn it off deliberately)."""
    reset_gpu: str = ""
    """Command template for ``reset_gpu``, e.g. ``ssh {node} nvidia-smi -r -i {gpu}``.
    Placeholders: {node} {rack} {row} {cluster} {gpu} {incident} {action} {reason}; each
    argument is formatted on its own and run without a shell."""
    drain_reboot: str = ""
    """For ``drain_reboot``, e.g. ``scontrol update nodename={node} state=drain
    reason={reason}`` or ``kubectl cordon {node}``."""
    replace: str = ""
    """For ``replace`` (usually a drain too, and a ticket)."""
    check_node: str = ""
    """For ``check_node`` (a silent node), e.g. ``kubectl cordon {node}``."""
    max_nodes_per_hour: int = 2
    """Circuit breaker: distinct nodes acted on within any hour, at most."""
    max_rack_fraction: float = 0.25
    """Circuit breaker: of a rack's known nodes, at most this share acted on within
    ``rack_window_h`` (at least one node)."""
    rack_window_h: float = 24.0
    """How long a node counts as taken out of its rack after an action."""
    timeout_s: float = 30.0
    """A command running longer is killed and counted as failed."""

    def templates(self) -> dict[str, str]:
        return {k: v for k, v in (("reset_gpu", self.reset_gpu),
                                  ("drain_reboot", self.drain_reboot),
                                  ("replace", self.replace),
                                  ("check_node", self.check_node)) if v}

    def validate(self) -> None:
        if self.max_nodes_per_hour < 0 or not 0.0 <= self.max_rack_fraction <= 1.0 \
                or self.rack_window_h <= 0 or self.timeout_s <= 0:
            raise ConfigError("remediation: max_nodes_per_hour >= 0, max_rack_fraction in "
                              "[0, 1], rack_window_h and timeout_s > 0")


@dataclass(frozen=True, slots=True)
class DetectorConfig:
    """``fleetpulse detector``: consumer group over samples and events -> alerts."""

    transport: TransportConfig = field(default_factory=TransportConfig)
    """Where the topics are."""
    group_id: str = "fleetpulse-detector"
    """Consumer group; instances with the same group share the racks."""
    state_dir: Path = Path("detector-state")
    """Checkpoints (models, thresholds, open alerts, consumed offsets), one file per
    partition."""
    checkpoint_interval_s: float = 60.0
    """Seconds between periodic checkpoints (one is also written at shutdown) ..."""
    checkpoint_max_share: float = 0.05
    """... unless that would take more than this share of the detector's time: a periodic
    checkpoint writes its partitions one at a time and after each waits, besides an even
    share of half the interval, long enough for that partition's serialising and writing to
    be at most this share of the time. A shard's checkpoint is about 115 KB per GPU forest
    (298 MB and 6 s of work for 2,600 GPUs here), so at a large site a round stretches past
    the interval: each partition is checkpointed less often, and a crash replays more
    (``benchmarks.restore``, README: Load test). 1 writes them back to back."""
    partitions: int = 8
    """Partitions to create for topics that do not exist yet."""
    metrics_port: int = 0
    """Port of the Prometheus /metrics endpoint; 0 picks a free one, -1 disables it."""
    metrics_host: str = "127.0.0.1"
    """Address the /metrics endpoint binds to."""
    max_batch: int = 500
    """Messages fetched per poll."""
    batch_frames: int = 256
    """Frames of a partition processed together at most: one vector pass over many nodes'
    frames costs little more than one frame alone. Also the most work the consumer does
    before it yields to its event loop (heartbeats, rebalances, /metrics)."""
    batch_wait_s: float = 0.5
    """A partition's frames wait at most this long for others to be processed with (the
    latency this adds to every alert)."""
    shed_after_s: float = 30.0
    """Load shedding: model steps of records that waited in Kafka longer than this (this
    machine's clock minus the record's timestamp; not the samples' own time, which a spool
    replay or a node's wrong clock makes old) are skipped, so a detector that fell behind
    catches up instead of falling further behind; the rules still see every tick, offsets
    are committed as usual, skipped steps are counted, and a ``detector:lag`` alert is open
    while it lasts (kept across restarts; resolved once every partition is back within half
    this). 0 never sheds."""
    admit_within_s: float = 5.0
    """Cold-start admission: a GPU forest whose cold start ends (``output_after`` points)
    builds its trees and starts scoring only in a chunk of records that waited in Kafka
    less than this (the clock of ``shed_after_s``). While the detector is behind, such
    forests go on sampling, unscored, at about 1 us a step, and start once it has caught
    up: a forest's first thousand points are its dearest steps (its reservoirs take most
    of them), so a mass cold start (a new cluster, a restart without checkpoints) starts
    as many forests as the CPU keeps up with instead of falling behind and shedding. The
    forests still waiting count as warming on /metrics. 0 never holds one back (and
    ignores the two settings below)."""
    admit_per_s: float = 25.0
    """... at most this many forests a second (0: no limit): a forest built now costs its
    full price from its next step, while the detector sees that it is short of CPU only
    seconds later, so admitting a whole cold-started fleet in one chunk would overshoot
    what it can carry (``detector.admission``)."""
    admit_busy_below: float = 0.7
    """... and only while the detector's worker spent less than this share of the last
    seconds processing (``fleetpulse_detector_busy_ratio``), so the forests it starts leave
    room for the rules, for bursts and for the forests' dearer first steps."""
    model: ModelConfig = field(default_factory=ModelConfig)
    """The per-GPU forests."""
    rack: RackModelConfig = field(default_factory=RackModelConfig)
    """The rack forests."""
    alerts: AlertConfig = field(default_factory=AlertConfig)
    """Hysteresis."""
    rules: RulesConfig = field(default_factory=RulesConfig)
    """Health rules."""
    job_peers: JobPeersConfig = field(default_factory=JobPeersConfig)
    """A GPU against its job's GPUs; job starts and ends as known changes."""
    webhook: WebhookConfig = field(default_factory=WebhookConfig)
    """Alertmanager."""
    remediation: RemediationConfig = field(default_factory=RemediationConfig)
    """The remediation hook (off unless a command template is set; dry-run by default)."""

    def validate(self) -> None:
        if self.checkpoint_interval_s <= 0:
            raise ConfigError("checkpoint_interval_s must be > 0")
        if not 0.0 < self.checkpoint_max_share <= 1.0:
            raise ConfigError("checkpoint_max_share must be in (0, 1]")
        if self.partitions < 1 or self.max_batch < 1 or self.batch_frames < 1:
            raise ConfigError("partitions, max_batch and batch_frames must be >= 1")
        if self.batch_wait_s < 0 or self.shed_after_s < 0 or self.admit_within_s < 0:
            raise ConfigError("batch_wait_s, shed_after_s and admit_within_s must be >= 0")
        if self.admit_per_s < 0 or not 0.0 < self.admit_busy_below <= 1.0:
            raise ConfigError("admit_per_s must be >= 0 and admit_busy_below in (0, 1]")
        if not -1 <= self.metrics_port <= 65535:
            raise ConfigError(f"metrics_port must be -1..65535, got {self.metrics_port}")

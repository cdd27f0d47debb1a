"""The detector service: a consumer group over samples and events, alerts out.

One :class:`~detector.shard.DetectorShard` per assigned samples partition and one
:class:`~detector.event_rules.EventShard` per events partition. The rebalance listener
loads a partition's checkpoint when it is assigned and writes one when it is revoked;
checkpoints live in the group's compacted changelog topic (``<group_id>-changelog``, see
:mod:`fleetpulse.changelog`), so a partition's state follows it to any instance;
checkpoints are also written every ``checkpoint_interval_s`` (paced to at most
``checkpoint_max_share`` of the time, so later at a large site) and at shutdown, each with the
offset its state covers, and only then are those offsets committed to Kafka (the committed
offset is the lag gauge; the checkpoint's own offset is the truth, so a message below it is
skipped when re-read).

Not re-announcing after a crash: a shard restored from a checkpoint re-reads the messages
after it and, the replay being deterministic (restored forests score identically, alert ids
derive from entity, source and start), produces again the transitions it had published
before dying. Each checkpoint records the alert topic's end offsets; at restore the service
reads the alert records published since then and suppresses exactly those (id, state) pairs
when the replay produces them. An alert that was open stays open, once.

Undecodable messages go to the dead-letter topic with the reason and are counted.

Behind means what an operator means by it: how long the records being read now have waited
in Kafka (this machine's clock minus each record's timestamp, which the producer sets when
it sends), not how old their samples are. An agent replaying its disk spool after an outage
sends hours-old samples, and a node whose clock is off stamps them so, yet a detector
reading them as they arrive is not behind. ``shed_after_s`` and ``detector:lag`` are judged
this way; the open ``detector:lag`` alert is kept in ``state_dir`` (written before it is
published), so a restart neither forgets to resolve it nor opens a second one.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from detector.admission import Admission
from detector.checkpoint import CheckpointError, atomic_write, restore_shard, shard_bytes
from detector.config import DetectorConfig
from detector.event_rules import EventShard
from detector.features import GATHERED, gather, group_median
from detector.incidents import Correlator
from detector.remediation import RemediationHook
from detector.shard import DetectorShard, TickBlock, alert_id
from detector.silence import SilenceWatch
from detector.webhook import AlertmanagerWebhook
from detector.workloads import WorkloadMap, tag_alerts
from fleetpulse.changelog import Changelog, ChangelogError
from fleetpulse.transport import (
    Consumer,
    Message,
    RecordMeta,
    TopicPartition,
    Transport,
)
from schemas.attribution import Attachment
from schemas.errors import DecodeError
from schemas.frame import SampleFrame, decode_frame
from schemas.records import (
    AlertRecord,
    AlertState,
    Attribution,
    EventKind,
    EventRecord,
    IncidentRecord,
    Severity,
    decode_alerts_topic,
)
from schemas.topics import Topics

__all__ = ["LAG_SOURCE", "DetectorService", "frame_block", "process_frame"]

LAG_SOURCE = "detector:lag"
"""Source of the alert that says the detector is behind (model steps being shed)."""
_LAG_FILE = "lag-alert.json"
"""The open ``detector:lag`` alert in ``state_dir`` (empty file: none open)."""

log = logging.getLogger(__name__)


def frame_block(shard: DetectorShard, frame: SampleFrame) -> TickBlock | None:
    """A decoded frame as a block of ticks for ``shard``; None when the node's ticks were all
    seen already (a frame replayed from an agent's spool is not learned twice)."""
    ident = frame.identity
    node = ident.path
    rack = node.rsplit("/", 1)[0]
    paths = [f"{node}/gpu-{int(g)}" for g in frame.gpus]
    ids, nodes = shard.register(paths, [rack] * len(paths), [node] * len(paths),
                                list(frame.uuids))
    last = shard.node_last_ts.get(node, -1)
    keep = np.flatnonzero(frame.ts > last)
    if keep.size == 0:
        return None
    shard.node_last_ts[node] = int(frame.ts[-1])
    gathered = gather(frame.values[keep], frame.metric_ids)
    return TickBlock(ids, nodes, np.asarray(frame.ts[keep], dtype=np.int64), gathered)


def process_frame(shard: DetectorShard, frame: SampleFrame) -> list[AlertRecord]:
    """Run one decoded frame through ``shard`` on its own (tests, tools)."""
    block = frame_block(shard, frame)
    return shard.process_blocks([block]) if block is not None else []


class Stats:
    """The service's counters: plain numbers on the hot path, read by /metrics at scrape
    time (``registry``) and by the progress line."""

    def __init__(self) -> None:
        self.frames = 0
        self.updates = 0
        """GPU ticks processed (every one reaches the rules)."""
        self.metrics = 0
        """Sample values consumed (frames' GPUs x metrics x ticks)."""
        self.model_steps = 0
        self.skipped_steps = 0
        self.behind_s = 0.0
        self.lag_messages = 0
        self.events = 0
        self.suppressed = 0
        self.checkpoints = 0
        self.models = 0
        self.models_warming = 0
        self.models_held = 0
        self.admitted = 0
        """GPU forests that left their cold start (built their trees and started scoring)."""
        self.busy_ratio = 0.0
        self.open_alerts = 0
        self.alerts: dict[tuple[str, str], int] = {}
        self.incidents: dict[str, int] = {}
        self.remediation: dict[tuple[str, str], int] = {}
        """(action, outcome) -> remediation decisions (detector.remediation)."""
        self.deadletter: dict[str, int] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StatsCollector(self))


def _reason(what: str, exc: DecodeError) -> str:
    """A dead letter's reason names the record it failed to decode (as the aggregator's)."""
    text = str(exc)
    return text if text.startswith(what) else f"{what}: {text}"


class _StatsCollector:
    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        p = "fleetpulse_detector_"
        for name, value, help_ in (
            ("frames", s.frames, "Sample frames processed."),
            ("gpu_updates", s.updates, "GPU ticks processed (each one reaches the rules)."),
            ("metrics", s.metrics, "Sample values consumed."),
            ("model_steps", s.model_steps,
             "GPU model steps (forest score + learn) run, one per GPU and model.step_s."),
            ("model_steps_skipped", s.skipped_steps,
             "GPU model steps shed because the detector was behind (shed_after_s)."),
            ("events", s.events, "Event records processed."),
            ("alerts_suppressed", s.suppressed,
             "Replayed transitions already published before a restart."),
            ("checkpoints", s.checkpoints, "Checkpoints written."),
            ("forests_admitted", s.admitted,
             "GPU forests that left their cold start: built their trees, started scoring."),
        ):
            yield CounterMetricFamily(p + name, help_, value=value)
        alerts = CounterMetricFamily(p + "alerts", "Alert transitions published.",
                                     labels=["state", "source"])
        for (state, source), n in s.alerts.items():
            alerts.add_metric([state, source], n)
        yield alerts
        incidents = CounterMetricFamily(p + "incidents",
                                        "Incident transitions published (opened or changed: "
                                        "firing; ended: resolved).", labels=["state"])
        for state, n in s.incidents.items():
            incidents.add_metric([state], n)
        yield incidents
        fixes = CounterMetricFamily(p + "remediation",
                                    "Remediation decisions (dry_run, ran, failed, refused_rate, "
                                    "refused_rack, not_node).", labels=["action", "outcome"])
        for (action, outcome), n in s.remediation.items():
            fixes.add_metric([action, outcome], n)
        yield fixes
        dead = CounterMetricFamily(p + "deadletter", "Undecodable messages dead-lettered.",
                                   labels=["topic"])
        for topic, n in s.deadletter.items():
            dead.add_metric([topic], n)
        yield dead
        yield GaugeMetricFamily(p + "models", "GPU models held.", value=s.models)
        yield GaugeMetricFamily(p + "models_warming",
                                "GPU forests that cannot alert yet (fewer than model.warmup "
                                "scored steps); their steps cost the most.",
                                value=s.models_warming)
        yield GaugeMetricFamily(p + "models_held",
                                "GPU forests past their cold start held in it because the "
                                "detector had no room for them (admit_within_s, admit_per_s, "
                                "admit_busy_below): sampling, unscored.",
                                value=s.models_held)
        yield GaugeMetricFamily(p + "busy_ratio",
                                "Share of recent wall time the detector's worker spent "
                                "processing samples (1: it has no room left).",
                                value=s.busy_ratio)
        yield GaugeMetricFamily(p + "behind_seconds",
                                "How long the newest record processed had waited in Kafka, "
                                "worst partition (0 once a partition is read to its end).",
                                value=s.behind_s)
        yield GaugeMetricFamily(p + "consumer_lag_messages",
                                "Samples messages behind the partitions' ends.",
                                value=s.lag_messages)
        yield GaugeMetricFamily(p + "open_alerts", "Alerts open now.", value=s.open_alerts)


class DetectorService:
    """Consumes, scores, alerts, checkpoints. ``run(stop)`` until ``stop`` is set.

    The event loop is never held for long: frames wait per partition (``batch_wait_s``,
    ``batch_frames``) and are processed together, at most ``batch_frames`` at a time, each
    such chunk in a thread, and a periodic checkpoint serialises each shard in a thread
    while the other partitions go on (that partition's frames wait meanwhile; a lock per
    shard keeps processing and serialising apart), then writes it in a thread. So
    heartbeats, rebalances and /metrics always get their turn, however starved the CPU.
    """

    def __init__(self, config: DetectorConfig, transport: Transport,
                 engine: str | None = None) -> None:
        self.config = config
        self.transport = transport
        self.engine = engine
        self.topics = Topics(config.transport.topic_prefix)
        self.state_dir = Path(config.state_dir)
        """This instance's own files (the open lag alert); partition state is in Kafka."""
        self.changelog = Changelog(transport, f"{config.group_id}-changelog", config.partitions)
        self.shards: dict[int, DetectorShard] = {}
        self.event_shards: dict[int, EventShard] = {}
        self.workload_maps: dict[int, WorkloadMap] = {}
        """Per events partition: the workload on each GPU, named in its alerts."""
        self._workloads_version = 0
        """Attribution events folded so far: a shard re-reads its GPUs' jobs when it moved."""
        self.next_offset: dict[TopicPartition, int] = {}
        """Per partition: the next offset whose message the state does not cover yet."""
        self.suppress: set[tuple[str, str]] = set()
        self.incidents = Correlator()
        """Groups the published alerts into incidents and gives each its action."""
        self.silence = SilenceWatch(config.rules.silent_after_s)
        """Nodes and racks that stop sending, exporters that send blank pages."""
        self.stats = Stats()
        self.remediation = RemediationHook(config.remediation)
        self.stats.remediation = self.remediation.counts
        self.consumer: Consumer | None = None
        self.webhook = (AlertmanagerWebhook(config.webhook.url, config.webhook.timeout_s,
                                            config.webhook.resend_s)
                        if config.webhook.url else None)
        self._pending: list[asyncio.Future[RecordMeta]] = []
        self._last_checkpoint = time.monotonic()
        self._alert_partitions = 0
        self._batches: dict[int, list[tuple[int, SampleFrame | None, int]]] = {}
        """Samples partition -> (offset, frame, record timestamp ms) read but not processed
        yet (frame None: nothing to process, e.g. dead-lettered, but the offset moves past
        it)."""
        self._batch_since: dict[int, float] = {}
        self._read_offset: dict[TopicPartition, int] = {}
        """Next offset to accept into a batch (messages below it were read already)."""
        self._busy: set[int] = set()
        """Partitions whose shard a background checkpoint is serialising."""
        self._owned: set[TopicPartition] = set()
        """Partitions assigned to this member now (kept by the rebalance listener): a
        message fetched before its partition was revoked is dropped, never processed."""
        self._drain_lock = asyncio.Lock()
        """Held by a drain for its whole run. The loop's drain awaits threads, and a
        revocation (aiokafka calls the listener from its own task) drains too: one at a time,
        a revoked partition's frames are all processed before its checkpoint, and none after."""
        self._shard_locks: dict[int, asyncio.Lock] = {}
        """Per samples partition: held while its shard is processed or serialised (both run
        in threads), so the two never overlap."""
        self._checkpointer: asyncio.Task[None] | None = None
        self._next_save_at = 0.0
        """When the periodic checkpoint may write its next partition (monotonic clock):
        the pause after each partition carries over into the next round."""
        self._hurry = asyncio.Event()
        """Set while a revocation or shutdown waits for the periodic checkpoint: it then
        writes its remaining partitions without pausing between them."""
        self._behind_s: dict[int, float] = {}
        self._lag_alert: AlertRecord | None = None
        self._skipped_seen = 0
        self._shed_age_s = 0.0
        """Age of the oldest data whose steps were shed since the last lag check."""
        self._shed_partitions: set[int] = set()
        self._last_lag_poll = 0.0
        self.clock = time.time
        """Wall clock (s) that record ages are measured on; a test may move it."""
        self.admission = Admission(config.admit_per_s, config.admit_within_s,
                                   config.admit_busy_below)
        """The pace at which GPU forests leave their cold start."""
        self._caught_up: set[int] = set()
        """Samples partitions with nothing left to read at the last lag poll: their clock is
        the fleet's (a rack that went silent does not stop time for its partition)."""

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        t = self.topics
        await self.transport.ensure_topics({t.samples: cfg.partitions, t.events: cfg.partitions,
                                            t.alerts: cfg.partitions, t.deadletter: 1})
        await self.changelog.ensure()
        self._alert_partitions = await self.transport.partitions_for(t.alerts)
        await asyncio.to_thread(warm_up, cfg, self.engine)
        self._lag_alert = await asyncio.to_thread(self._load_lag_alert)
        self.consumer = self.transport.consumer([t.samples, t.events], cfg.group_id,
                                                listener=self, from_beginning=True)
        try:
            while not stop.is_set():
                wait_ms = 100 if self._batches else 200
                msgs = await self.consumer.getmany(timeout_ms=wait_ms, max_records=cfg.max_batch)
                out: list[AlertRecord] = []
                for msg in msgs:
                    out.extend(await self._accept(msg))
                out.extend(await self._drain())
                now = max((s.last_ts_ms for s in self.shards.values()), default=0)
                for es in self.event_shards.values():
                    out.extend(es.tick(now))
                out.extend(self.silence.tick({
                    p: now if p in self._caught_up else s.last_ts_ms
                    for p, s in self.shards.items()}))
                await self._poll_lag()
                lag = self._lag_transitions()
                if lag:  # kept before it is published: see the module docstring
                    await asyncio.to_thread(self._save_lag_alert, self._lag_alert)
                out.extend(lag)
                await self._publish(out)
                await self._checkpoint_when_due()
                if self.webhook is not None:
                    await self.webhook.resend_due()
        finally:
            try:
                await self._checkpoint_settled()
                await self._publish(await self._drain(force=True))
                await self.checkpoint_all()
            finally:
                await self.consumer.stop()
                if self.webhook is not None:
                    await self.webhook.close()

    # -- rebalance listener -------------------------------------------------------------

    async def on_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        self._owned.update(assigned)
        alert_from: dict[int, int] = {}
        new = [(t, p) for t, p in assigned
               if (t == self.topics.samples and p not in self.shards)
               or (t == self.topics.events and p not in self.event_shards)]
        keys = (new + [self._workloads_key(p) for t, p in new if t == self.topics.events]
                + [self._silence_key(p) for t, p in new if t == self.topics.samples])
        try:
            states = await self.changelog.load(keys)
        except ChangelogError as exc:
            log.error("changelog unusable (%s); starting %s afresh", exc, sorted(new))
            states = {}
        for tp in sorted(assigned):
            topic, p = tp
            data = states.get(tp)
            if topic == self.topics.samples and p not in self.shards:
                shard = DetectorShard(self.config, self.engine)
                try:
                    # In a thread: restoring many models takes seconds (heartbeats go on).
                    offsets = (await asyncio.to_thread(restore_shard, shard, data)
                               if data is not None else None)
                except CheckpointError as exc:
                    log.error("partition %d: %s; starting its models afresh", p, exc)
                    shard, offsets = DetectorShard(self.config, self.engine), None
                self.shards[p] = shard
                self._restore_silence(p, states.get(self._silence_key(p)))
                if offsets is None:
                    # No checkpoint: the partition is replayed from the committed offset (or
                    # the start), so anything it ever published may come again.
                    for q in range(self._alert_partitions):
                        alert_from[q] = 0
                else:
                    self.next_offset[tp] = offsets["samples"]
                    for key, off in offsets.items():
                        if key.startswith("alerts:"):
                            q = int(key.split(":", 1)[1])
                            alert_from[q] = min(alert_from.get(q, off), off)
                    log.info("partition %d restored: %d GPU models, offset %d", p,
                             len(shard.gpu_paths), offsets["samples"])
            elif topic == self.topics.events and p not in self.event_shards:
                es = EventShard(self.config.rules.event_hold_s)
                if data is not None:
                    try:
                        self.next_offset[tp] = es.load(data)
                    except (ValueError, KeyError, DecodeError) as exc:
                        log.error("events partition %d checkpoint unusable: %s", p, exc)
                        es = EventShard(self.config.rules.event_hold_s)
                self.event_shards[p] = es
                self.workload_maps[p] = self._load_workloads(
                    p, states.get(self._workloads_key(p)))
        if alert_from:
            await self._load_published(alert_from)
        if self.consumer is not None:
            for tp in assigned:
                if tp in self.next_offset:
                    await self.consumer.seek(tp, self.next_offset[tp])
                    self._read_offset[tp] = self.next_offset[tp]
        self._count_models()

    async def on_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        await self._checkpoint_settled()
        await self._publish(await self._drain(force=True, only=revoked))
        await self.checkpoint_all(only=revoked)
        self._owned.difference_update(revoked)
        for topic, p in revoked:
            self._read_offset.pop((topic, p), None)
            if topic == self.topics.samples:
                self._behind_s.pop(p, None)
            if topic == self.topics.samples:
                self.shards.pop(p, None)
                self.silence.drop_partition(p)
            elif topic == self.topics.events:
                self.event_shards.pop(p, None)
                self.workload_maps.pop(p, None)
            self.next_offset.pop((topic, p), None)

    async def _load_published(self, start: dict[int, int]) -> None:
        """Collect (id, state) of alert records published since the checkpoints."""
        reader = self.transport.consumer([self.topics.alerts],
                                         f"{self.config.group_id}-replay-{uuid.uuid4().hex}",
                                         from_beginning=True)
        try:
            tps = [(self.topics.alerts, q) for q in range(self._alert_partitions)]
            ends = await reader.end_offsets(tps)
            todo = {tp for tp in tps if ends[tp] > start.get(tp[1], 0)}
            positions: dict[TopicPartition, int] = {}
            deadline = time.monotonic() + 30.0
            while todo and time.monotonic() < deadline:
                msgs = await reader.getmany(timeout_ms=500, max_records=1000)
                for msg in msgs:
                    positions[msg.tp] = msg.offset + 1
                    if msg.offset < start.get(msg.partition, 0):
                        continue
                    try:
                        rec = decode_alerts_topic(msg.value)
                    except DecodeError:
                        continue
                    self.suppress.add(_transition(rec))
                todo = {tp for tp in todo if positions.get(tp, 0) < ends[tp]}
            if todo:
                log.warning("could not read back alerts of %s in time; replay may repeat "
                            "some transitions", sorted(todo))
        finally:
            await reader.stop()

    # -- messages ----------------------------------------------------------------------

    async def _accept(self, msg: Message) -> list[AlertRecord]:
        """Take one message: a sample frame joins its partition's batch, an event is
        processed at once."""
        tp = msg.tp
        if tp not in self._owned:
            return []  # fetched before a revocation: the new owner reads it
        if msg.offset < max(self.next_offset.get(tp, 0), self._read_offset.get(tp, 0)):
            return []  # covered by the restored checkpoint, or read already
        self._read_offset[tp] = msg.offset + 1
        if msg.topic == self.topics.samples:
            frame: SampleFrame | None = None
            try:
                frame = decode_frame(msg.value)
            except DecodeError as exc:
                await self._dead_letter(msg, _reason("sample frame", exc))
            # a record without a timestamp (-1) counts as arriving now: never judged late
            arrived = msg.timestamp_ms if msg.timestamp_ms > 0 else int(self.clock() * 1000)
            self._batches.setdefault(msg.partition, []).append((msg.offset, frame, arrived))
            self._batch_since.setdefault(msg.partition, time.monotonic())
            return []
        self.next_offset[tp] = msg.offset + 1
        if msg.topic == self.topics.events:
            try:
                event = EventRecord.from_bytes(msg.value)
            except DecodeError as exc:
                await self._dead_letter(msg, _reason("event record", exc))
                return []
            es = self.event_shards.get(msg.partition)
            if es is None:
                es = self.event_shards[msg.partition] = EventShard(
                    self.config.rules.event_hold_s)
            self.stats.events += 1
            try:
                if self.workload_maps.setdefault(msg.partition, WorkloadMap()).observe(event):
                    self._workloads_version += 1
                    return []
            except DecodeError as exc:
                await self._dead_letter(msg, _reason("attribution event", exc))
                return []
            if event.kind is EventKind.AGENT_STOP:
                self.silence.left(event.identity.path)
            return es.observe(event)
        return []

    async def _drain(self, force: bool = False,
                     only: frozenset[TopicPartition] | None = None) -> list[AlertRecord]:
        """Process the batches that are due (full, waited ``batch_wait_s``, or ``force``),
        ``batch_frames`` frames at a time, yielding to the event loop after each."""
        async with self._drain_lock:
            return await self._drain_locked(force, only)

    async def _drain_locked(self, force: bool,
                            only: frozenset[TopicPartition] | None) -> list[AlertRecord]:
        cfg = self.config
        out: list[AlertRecord] = []
        now = time.monotonic()
        for p in list(self._batches):
            if only is not None and (self.topics.samples, p) not in only:
                continue
            batch = self._batches[p]
            if not (force or len(batch) >= cfg.batch_frames
                    or now - self._batch_since[p] >= cfg.batch_wait_s):
                continue
            while batch and p not in self._busy:
                chunk = batch[: cfg.batch_frames]
                del batch[: cfg.batch_frames]
                # In a thread: a chunk is seconds of CPU on a starved machine, and the loop
                # must go on sending heartbeats meanwhile (the GIL passes every few ms).
                async with self._shard_lock(p):
                    out.extend(await asyncio.to_thread(self._process_chunk, p, chunk))
            if not batch:
                self._batches.pop(p, None)
                self._batch_since.pop(p, None)
        return out

    def _shard_lock(self, p: int) -> asyncio.Lock:
        lock = self._shard_locks.get(p)
        if lock is None:
            lock = self._shard_locks[p] = asyncio.Lock()
        return lock

    def _process_chunk(self, p: int, chunk: list[tuple[int, SampleFrame | None, int]]
                       ) -> list[AlertRecord]:
        cfg = self.config
        started = time.perf_counter()
        shard = self.shards.get(p)
        if shard is None:  # assigned without a callback (should not happen): start fresh
            shard = self.shards[p] = DetectorShard(self.config, self.engine)
        blocks: list[TickBlock] = []
        now_ms = self.clock() * 1000.0
        late_ms = now_ms - cfg.shed_after_s * 1000.0
        step_ms = round(cfg.model.step_s * 1000)
        shed_before: int | None = None
        oldest_record = min(r for _, _, r in chunk)
        with shard.growing_once():  # a fleet's first frames: grow once, not per node
            for _, frame, record_ms in chunk:
                if frame is None:
                    continue
                block = frame_block(shard, frame)
                reporting = (np.isfinite(frame.values).any(axis=(0, 2)) if frame.values.size
                             else ())
                self.silence.seen(p, frame.identity.path,
                                  int(frame.ts[-1]) if frame.ts.size else 0,
                                  int(np.count_nonzero(reporting)))
                self.stats.frames += 1
                self.stats.updates += frame.values.shape[0] * frame.values.shape[1]
                self.stats.metrics += frame.n_values
                if block is not None:
                    blocks.append(block)
                    if cfg.shed_after_s > 0 and record_ms < late_ms:
                        # Waited too long in Kafka: shed the model steps of its ticks. A step
                        # is stamped at its end ((k + 1) * step_ms), so the step holding the
                        # newest tick t is stamped <= t + step_ms, and the next one later.
                        end = int(block.ts_ms[-1]) + step_ms + 1
                        shed_before = end if shed_before is None else max(shed_before, end)
        if cfg.job_peers.enabled:  # after registering the chunk's GPUs
            shard.jobs.sync(shard.gpu_paths, self._spans, self._workloads_version)
        steps, skipped, admitted = shard.gpu_steps, shard.skipped_steps, shard.admitted
        allowance = self.admission.allowance((now_ms - oldest_record) / 1000.0)
        out = shard.process_blocks(blocks, shed_before_ms=shed_before, admit_at_most=allowance)
        admitted = shard.admitted - admitted
        self.admission.admitted(admitted)
        self.stats.admitted += admitted
        self.next_offset[(self.topics.samples, p)] = chunk[-1][0] + 1
        self.stats.model_steps += shard.gpu_steps - steps
        self.stats.skipped_steps += shard.skipped_steps - skipped
        self._behind_s[p] = max(0.0, (now_ms - chunk[-1][2]) / 1000.0)
        if shard.skipped_steps > skipped:
            self._shed_age_s = max(self._shed_age_s, (now_ms - oldest_record) / 1000.0)
            self._shed_partitions.add(p)
        self._count_models()
        self.admission.worked(time.perf_counter() - started)
        self.stats.busy_ratio = round(self.admission.busy_ratio, 3)
        return out

    def _count_models(self) -> None:
        self.stats.models = sum(len(s.gpu_paths) for s in self.shards.values())
        self.stats.models_warming = sum(s.models_warming() for s in self.shards.values())
        self.stats.models_held = sum(s.models_held() for s in self.shards.values())

    # -- lag ---------------------------------------------------------------------------

    async def _poll_lag(self) -> None:
        """Messages behind the partitions' ends, every 2 s (one request); a partition with
        nothing left to read is not behind, however old its newest sample."""
        if self.consumer is None or time.monotonic() - self._last_lag_poll < 2.0:
            return
        self._last_lag_poll = time.monotonic()
        tps = [(self.topics.samples, p) for p in self.shards]
        if not tps:
            return
        try:
            ends = await self.consumer.end_offsets(tps)
        except Exception as exc:  # best effort: a broker hiccup must not stop the detector
            log.debug("end offsets for the lag gauge: %r", exc)
            return
        lag = {tp: max(0, ends.get(tp, 0) - self.next_offset.get(tp, 0)) for tp in tps}
        self.stats.lag_messages = sum(lag.values())
        self._caught_up = set()
        for (_, p), n in lag.items():
            if n == 0 and p not in self._batches:
                self._behind_s[p] = 0.0
                self._caught_up.add(p)

    def _lag_transitions(self) -> list[AlertRecord]:
        """Open ``detector:lag`` when model steps were shed; resolve it once no step was
        shed since and every partition is back within half of ``shed_after_s``."""
        cfg = self.config
        worst = max(self._behind_s.values(), default=0.0)
        self.stats.behind_s = round(worst, 3)
        shedding = self.stats.skipped_steps > self._skipped_seen
        self._skipped_seen = self.stats.skipped_steps
        now_ms = int(self.clock() * 1000)
        entity = f"detector/{cfg.group_id}"
        age, self._shed_age_s = self._shed_age_s, 0.0
        parts, self._shed_partitions = sorted(self._shed_partitions), set()
        if self._lag_alert is None and shedding:
            self._lag_alert = AlertRecord(
                id=alert_id(entity, LAG_SOURCE, now_ms), entity=entity, level="service",
                state=AlertState.FIRING, severity=Severity.WARNING, source=LAG_SOURCE,
                summary=(f"detector is {age:.0f} s behind: model steps of records that "
                         f"waited in Kafka more than {cfg.shed_after_s:g} s are skipped "
                         "(rules still see every sample)"),
                score=round(age, 3), threshold=cfg.shed_after_s, started_ms=now_ms,
                updated_ms=now_ms, attribution=(Attribution("fleetpulse_detector_behind_seconds",
                                                            "high", 1.0),),
                context={"partitions": parts, "skipped_steps": self.stats.skipped_steps})
            log.warning("%s", self._lag_alert.summary)
            return [self._lag_alert]
        # Every partition measured first: right after a restart nothing was read yet, and
        # "0 s behind" then would resolve an alert that is still true.
        measured = bool(self.shards) and all(p in self._behind_s for p in self.shards)
        if (self._lag_alert is not None and not shedding and measured
                and worst <= cfg.shed_after_s / 2):
            opened, self._lag_alert = self._lag_alert, None
            log.warning("detector caught up (%.1f s behind); %d model steps were skipped",
                        worst, self.stats.skipped_steps)
            return [dataclasses.replace(
                opened, state=AlertState.RESOLVED, score=round(worst, 3), updated_ms=now_ms,
                context={**opened.context, "skipped_steps": self.stats.skipped_steps})]
        return []

    def _load_lag_alert(self) -> AlertRecord | None:
        """The ``detector:lag`` alert a previous run left open, if any."""
        try:
            data = (self.state_dir / _LAG_FILE).read_bytes()
        except FileNotFoundError:
            return None
        if not data:
            return None
        try:
            rec = AlertRecord.from_bytes(data)
        except DecodeError as exc:
            log.error("%s unusable (%s); a detector:lag alert may stay open", _LAG_FILE, exc)
            return None
        log.info("detector:lag alert %s is still open from before the restart", rec.id)
        return rec

    def _save_lag_alert(self, rec: AlertRecord | None) -> None:
        atomic_write(self.state_dir / _LAG_FILE, b"" if rec is None else rec.to_bytes())

    async def _dead_letter(self, msg: Message, reason: str) -> None:
        log.warning("dead-lettering %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset,
                    reason)
        self.stats.deadletter[msg.topic] = self.stats.deadletter.get(msg.topic, 0) + 1
        await self.transport.dead_letter(self.topics.deadletter, msg, reason)

    async def _publish(self, records: list[AlertRecord]) -> None:
        # The correlator sees replayed transitions too: its state is rebuilt from them.
        records = tag_alerts(records, self.workload_maps.values())
        records, incidents = self.incidents.observe(records)
        sent: list[AlertRecord] = []
        sent_incidents: list[IncidentRecord] = []
        transitions: list[AlertRecord | IncidentRecord] = [*records, *incidents]
        for rec in transitions:
            key = _transition(rec)
            if key in self.suppress:
                self.suppress.discard(key)
                self.stats.suppressed += 1
                continue
            fut = await self.transport.send(self.topics.alerts, rec.to_bytes(), key=rec.key)
            self._pending.append(fut)
            if isinstance(rec, IncidentRecord):
                self.stats.incidents[rec.state.value] = (
                    self.stats.incidents.get(rec.state.value, 0) + 1)
                log.info("incident %s %s %s", rec.state.value, rec.id, rec.summary)
                sent_incidents.append(rec)
                continue
            k = (rec.state.value, rec.source)
            self.stats.alerts[k] = self.stats.alerts.get(k, 0) + 1
            log.info("alert %s %s %s %s (%s)", rec.state.value, rec.entity, rec.source,
                     rec.summary, rec.action.value)
            sent.append(rec)
        self.stats.open_alerts = (sum(len(s.open_alerts) for s in self.shards.values())
                                  + sum(len(e.open) for e in self.event_shards.values()))
        if self.webhook is not None and (sent or sent_incidents):
            await self.webhook.deliver(sent, sent_incidents)
        if self.remediation.enabled:
            for inc in sent_incidents:
                await self.remediation.handle(inc, self.silence.rack_nodes(inc.root))

    # -- checkpoints -------------------------------------------------------------------

    async def checkpoint_all(self, only: frozenset[TopicPartition] | None = None) -> None:
        """Wait for published alerts, save state + offsets, then commit the offsets.

        Each shard is serialised and written in a thread (the event loop keeps serving
        heartbeats); the caller holds its own processing meanwhile."""
        await self._flush_published()
        if self.consumer is None:
            return
        extra = await self._alert_ends()
        commit: dict[TopicPartition, int] = {}
        for p, shard in list(self.shards.items()):
            tp = (self.topics.samples, p)
            if (only is not None and tp not in only) or tp not in self.next_offset:
                continue
            offset = await self._save(p, shard, extra)
            if offset is not None:
                commit[tp] = offset
        commit.update(await self._save_events(only))
        if commit:
            await self.consumer.commit_checkpointed(commit)
        self.stats.checkpoints += 1
        self._last_checkpoint = time.monotonic()

    async def _checkpoint_when_due(self) -> None:
        task = self._checkpointer
        if task is not None and task.done():
            self._checkpointer = None
            task.result()  # a failed checkpoint fails the service, as it did inline
        if (self._checkpointer is None
                and time.monotonic() - self._last_checkpoint >= self.config.checkpoint_interval_s):
            self._last_checkpoint = time.monotonic()
            self._checkpointer = asyncio.create_task(self._checkpoint_in_background())

    async def _checkpoint_settled(self) -> None:
        """Let a running background checkpoint finish (revocation, shutdown)."""
        if self._checkpointer is not None:
            task, self._checkpointer = self._checkpointer, None
            self._hurry.set()
            try:
                await task
            finally:
                self._hurry.clear()

    async def _checkpoint_in_background(self) -> None:
        """The periodic checkpoint, one partition at a time beside the consuming loop: a
        partition's frames wait while its shard is serialised, the others go on.

        The partitions are not written back to back: after each one the next (in this round
        or the next) waits an even share of half the interval, and at least long enough for
        that partition's work (the process's CPU meanwhile) to be ``checkpoint_max_share`` of
        the time. A large site's checkpoint is seconds of work per partition (about 115 KB
        per GPU forest, serialised, checksummed and sent), and taken at once it stalls a
        detector with little room for tens of seconds, long enough to shed model steps;
        paced, it costs a bounded share and a few seconds of lag at a time. A revocation or
        shutdown (``_hurry``) finishes the round without pauses."""
        assert self.consumer is not None
        await self._flush_published()
        extra = await self._alert_ends()
        partitions = list(self.shards)
        cfg = self.config
        even = cfg.checkpoint_interval_s / (2 * max(1, len(partitions)))
        for p in partitions:
            pause = self._next_save_at - time.monotonic()
            if pause > 0 and not self._hurry.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._hurry.wait(), pause)
            # CPU, not wall time: a partition whose records wait on a broker that is away
            # costs little, and must not put off the next checkpoint by minutes.
            started = time.process_time()
            tp = (self.topics.samples, p)
            shard = self.shards.get(p)
            if shard is None or tp not in self.next_offset:
                continue
            self._busy.add(p)
            try:
                offset = await self._save(p, shard, extra)
            finally:
                self._busy.discard(p)
            if offset is not None and self.shards.get(p) is shard:  # still ours
                await self.consumer.commit_checkpointed({tp: offset})
            work = time.process_time() - started
            self._next_save_at = time.monotonic() + max(
                even, work * (1.0 - cfg.checkpoint_max_share) / cfg.checkpoint_max_share)
        events = await self._save_events(None)
        if events:
            await self.consumer.commit_checkpointed(events)
        self.stats.checkpoints += 1

    async def _flush_published(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, []
            await asyncio.gather(*pending)

    async def _alert_ends(self) -> dict[str, int]:
        assert self.consumer is not None
        alert_tps = [(self.topics.alerts, q) for q in range(self._alert_partitions)]
        ends = await self.consumer.end_offsets(alert_tps) if alert_tps else {}
        return {f"alerts:{q}": off for (_, q), off in ends.items()}

    async def _save(self, p: int, shard: DetectorShard, extra: dict[str, int]) -> int | None:
        """Checkpoint partition ``p``; returns the samples offset it covers (read under the
        shard's lock: a chunk being processed in its thread is either in it or after it),
        None when the partition was revoked while the lock was awaited (nothing written)."""
        async with self._shard_lock(p):
            offset = self.next_offset.get((self.topics.samples, p))
            if offset is None:
                return None
            silence = self.silence.state(p)  # as of the same offset: frames wait on the lock
            data = await asyncio.to_thread(shard_bytes, shard, {"samples": offset, **extra})
        await self.changelog.save({(self.topics.samples, p): data,
                                   self._silence_key(p): silence})
        return offset

    def _silence_key(self, p: int) -> TopicPartition:
        """The changelog key of samples partition ``p``'s expected senders (they move with
        it)."""
        return (f"{self.topics.samples}#silence", p)

    def _restore_silence(self, p: int, data: bytes | None) -> None:
        if data is None:
            return
        try:
            self.silence.restore(p, data)
        except DecodeError as exc:
            log.error("partition %d: %s; its senders count as expected from their next "
                      "frame", p, exc)

    def _spans(self, path: str) -> list[Attachment]:
        """A GPU's attachments, oldest first, from whichever events partition holds them."""
        for m in self.workload_maps.values():
            spans = m.gpus.get(path)
            if spans:
                return spans
        return []

    def _workloads_key(self, p: int) -> TopicPartition:
        """The changelog key of events partition ``p``'s workload map (it moves with it)."""
        return (f"{self.topics.events}#workloads", p)

    def _load_workloads(self, p: int, data: bytes | None) -> WorkloadMap:
        try:
            return WorkloadMap.from_bytes(data) if data is not None else WorkloadMap()
        except (ValueError, KeyError, TypeError, DecodeError) as exc:
            log.error("workloads of events partition %d unusable (%s); alerts name jobs again "
                      "from their next attribution event", p, exc)
            return WorkloadMap()

    async def _save_events(self, only: frozenset[TopicPartition] | None
                           ) -> dict[TopicPartition, int]:
        commit: dict[TopicPartition, int] = {}
        states: dict[TopicPartition, bytes] = {}
        for p, es in list(self.event_shards.items()):
            tp = (self.topics.events, p)
            if (only is not None and tp not in only) or tp not in self.next_offset:
                continue
            states[tp] = es.to_bytes(self.next_offset[tp])
            if p in self.workload_maps:  # saved before the offset that covers it is committed
                states[self._workloads_key(p)] = self.workload_maps[p].to_bytes()
            commit[tp] = self.next_offset[tp]
        await self.changelog.save(states)
        return commit


def _transition(rec: AlertRecord | IncidentRecord) -> tuple[str, str]:
    """What makes a published transition unique (for suppressing a replay): an alert's id
    and state; an incident's id, state and revision (it changes while open)."""
    if isinstance(rec, IncidentRecord):
        return rec.id, f"{rec.state.value}#{rec.revision}"
    return rec.id, rec.state.value


def warm_up(config: DetectorConfig, engine: str | None = None) -> None:
    """Compile (or load from numba's cache) the scoring kernels before joining the group.

    A first numba compile can take tens of seconds on a busy machine. Inside the consumer
    loop it would stop heartbeats past the session timeout and get this member expelled
    from its group (seen on a loaded 2-core machine), so ``run`` does it before the first
    poll, in a thread, on throwaway models.
    """
    shard = DetectorShard(config, engine)
    rng = np.random.default_rng(0)
    ids = np.zeros(1, dtype=np.int64)
    for eng in (shard.gpu_bank.engine, shard.rack_bank.engine):
        dims = eng.config.dims
        eng.ensure_models(1)
        for _ in range(eng.config.effective_output_after + eng.config.shingle + 2):
            eng.update(ids, rng.random((1, dims), dtype=np.float32),
                       attribute_above=np.zeros(1))
        eng.score(ids, rng.random((1, dims), dtype=np.float32))
    group_median(np.zeros(2), np.zeros(2, dtype=np.int64))
    # The rest of the path once (step folding, features, rules: numba kernels too).
    ids, nodes = shard.register(["warm/row/rack/node/gpu-0", "warm/row/rack/node/gpu-1"],
                                ["warm/row/rack"] * 2, ["warm/row/rack/node"] * 2)
    shard.process(ids, nodes, 1000 * np.arange(1, 5, dtype=np.int64),
                  np.ones((4, 2, len(GATHERED))))

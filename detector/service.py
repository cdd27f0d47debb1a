"""The detector service: a consumer group over samples and events, alerts out.

One :class:`~detector.shard.DetectorShard` per assigned samples partition and one
:class:`~detector.event_rules.EventShard` per events partition. The rebalance listener
loads a partition's checkpoint when it is assigned and writes one when it is revoked;
checkpoints are also written every ``checkpoint_interval_s`` and at shutdown, each with the
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
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from detector.checkpoint import CheckpointError, atomic_write, load_shard, save_shard
from detector.config import DetectorConfig
from detector.event_rules import EventShard
from detector.features import gather, group_median
from detector.shard import DetectorShard
from detector.webhook import AlertmanagerWebhook
from fleetpulse.transport import (
    Consumer,
    Message,
    RecordMeta,
    TopicPartition,
    Transport,
)
from schemas.errors import DecodeError
from schemas.frame import SampleFrame, decode_frame
from schemas.records import AlertRecord, EventRecord
from schemas.topics import Topics

__all__ = ["DetectorService", "process_frame"]

log = logging.getLogger(__name__)


def process_frame(shard: DetectorShard, frame: SampleFrame) -> list[AlertRecord]:
    """Run one decoded frame through ``shard`` (ticks already seen for the node are skipped,
    so a frame replayed from an agent's spool is not learned twice)."""
    ident = frame.identity
    node = ident.path
    rack = node.rsplit("/", 1)[0]
    paths = [f"{node}/gpu-{int(g)}" for g in frame.gpus]
    ids, nodes = shard.register(paths, [rack] * len(paths), [node] * len(paths),
                                list(frame.uuids))
    last = shard.node_last_ts.get(node, -1)
    keep = np.flatnonzero(frame.ts > last)
    if keep.size == 0:
        return []
    shard.node_last_ts[node] = int(frame.ts[-1])
    gathered = gather(frame.values[keep], frame.metric_ids)
    return shard.process(ids, nodes, np.asarray(frame.ts[keep]), gathered)


class Stats:
    """The service's counters: plain numbers on the hot path, read by /metrics at scrape
    time (``registry``) and by the progress line."""

    def __init__(self) -> None:
        self.frames = 0
        self.updates = 0
        self.events = 0
        self.suppressed = 0
        self.checkpoints = 0
        self.models = 0
        self.open_alerts = 0
        self.alerts: dict[tuple[str, str], int] = {}
        self.deadletter: dict[str, int] = {}
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_StatsCollector(self))


class _StatsCollector:
    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        s = self.stats
        p = "fleetpulse_detector_"
        for name, value, help_ in (
            ("frames", s.frames, "Sample frames processed."),
            ("gpu_updates", s.updates, "GPU steps scored and learned."),
            ("events", s.events, "Event records processed."),
            ("alerts_suppressed", s.suppressed,
             "Replayed transitions already published before a restart."),
            ("checkpoints", s.checkpoints, "Checkpoints written."),
        ):
            yield CounterMetricFamily(p + name, help_, value=value)
        alerts = CounterMetricFamily(p + "alerts", "Alert transitions published.",
                                     labels=["state", "source"])
        for (state, source), n in s.alerts.items():
            alerts.add_metric([state, source], n)
        yield alerts
        dead = CounterMetricFamily(p + "deadletter", "Undecodable messages dead-lettered.",
                                   labels=["topic"])
        for topic, n in s.deadletter.items():
            dead.add_metric([topic], n)
        yield dead
        yield GaugeMetricFamily(p + "models", "GPU models held.", value=s.models)
        yield GaugeMetricFamily(p + "open_alerts", "Alerts open now.", value=s.open_alerts)


class DetectorService:
    """Consumes, scores, alerts, checkpoints. ``run(stop)`` until ``stop`` is set."""

    def __init__(self, config: DetectorConfig, transport: Transport,
                 engine: str | None = None) -> None:
        self.config = config
        self.transport = transport
        self.engine = engine
        self.topics = Topics(config.transport.topic_prefix)
        self.state_dir = Path(config.state_dir)
        self.shards: dict[int, DetectorShard] = {}
        self.event_shards: dict[int, EventShard] = {}
        self.next_offset: dict[TopicPartition, int] = {}
        self.suppress: set[tuple[str, str]] = set()
        self.stats = Stats()
        self.consumer: Consumer | None = None
        self.webhook = (AlertmanagerWebhook(config.webhook.url, config.webhook.timeout_s,
                                            config.webhook.resend_s)
                        if config.webhook.url else None)
        self._pending: list[asyncio.Future[RecordMeta]] = []
        self._last_checkpoint = time.monotonic()
        self._alert_partitions = 0

    # -- lifecycle ---------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        cfg = self.config
        t = self.topics
        await self.transport.ensure_topics({t.samples: cfg.partitions, t.events: cfg.partitions,
                                            t.alerts: cfg.partitions, t.deadletter: 1})
        self._alert_partitions = await self.transport.partitions_for(t.alerts)
        await asyncio.to_thread(warm_up, cfg, self.engine)
        self.consumer = self.transport.consumer([t.samples, t.events], cfg.group_id,
                                                listener=self, from_beginning=True)
        try:
            while not stop.is_set():
                msgs = await self.consumer.getmany(timeout_ms=200, max_records=cfg.max_batch)
                out: list[AlertRecord] = []
                for msg in msgs:
                    out.extend(await self._handle(msg))
                now = max((s.last_ts_ms for s in self.shards.values()), default=0)
                for es in self.event_shards.values():
                    out.extend(es.tick(now))
                await self._publish(out)
                if time.monotonic() - self._last_checkpoint >= cfg.checkpoint_interval_s:
                    await self.checkpoint_all()
                if self.webhook is not None:
                    await self.webhook.resend_due()
        finally:
            try:
                await self.checkpoint_all()
            finally:
                await self.consumer.stop()
                if self.webhook is not None:
                    await self.webhook.close()

    # -- rebalance listener -------------------------------------------------------------

    async def on_assigned(self, assigned: frozenset[TopicPartition]) -> None:
        alert_from: dict[int, int] = {}
        for tp in sorted(assigned):
            topic, p = tp
            if topic == self.topics.samples and p not in self.shards:
                shard = DetectorShard(self.config, self.engine)
                try:
                    offsets = load_shard(self.state_dir, p, shard)
                except CheckpointError as exc:
                    log.error("partition %d: %s; starting its models afresh", p, exc)
                    shard, offsets = DetectorShard(self.config, self.engine), None
                self.shards[p] = shard
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
                path = self.state_dir / f"events-{p}.ckpt"
                if path.exists():
                    try:
                        self.next_offset[tp] = es.load(path.read_bytes())
                    except (ValueError, KeyError, DecodeError) as exc:
                        log.error("events partition %d checkpoint unusable: %s", p, exc)
                        es = EventShard(self.config.rules.event_hold_s)
                self.event_shards[p] = es
        if alert_from:
            await self._load_published(alert_from)
        if self.consumer is not None:
            for tp in assigned:
                if tp in self.next_offset:
                    await self.consumer.seek(tp, self.next_offset[tp])
        self.stats.models = sum(len(s.gpu_paths) for s in self.shards.values())

    async def on_revoked(self, revoked: frozenset[TopicPartition]) -> None:
        await self.checkpoint_all(only=revoked)
        for topic, p in revoked:
            if topic == self.topics.samples:
                self.shards.pop(p, None)
            elif topic == self.topics.events:
                self.event_shards.pop(p, None)
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
                        rec = AlertRecord.from_bytes(msg.value)
                    except DecodeError:
                        continue
                    self.suppress.add((rec.id, rec.state.value))
                todo = {tp for tp in todo if positions.get(tp, 0) < ends[tp]}
            if todo:
                log.warning("could not read back alerts of %s in time; replay may repeat "
                            "some transitions", sorted(todo))
        finally:
            await reader.stop()

    # -- messages ----------------------------------------------------------------------

    async def _handle(self, msg: Message) -> list[AlertRecord]:
        tp = msg.tp
        if msg.offset < self.next_offset.get(tp, 0):
            return []  # covered by the restored checkpoint
        self.next_offset[tp] = msg.offset + 1
        if msg.topic == self.topics.samples:
            try:
                frame = decode_frame(msg.value)
            except DecodeError as exc:
                await self._dead_letter(msg, str(exc))
                return []
            shard = self.shards.get(msg.partition)
            if shard is None:  # assigned without a callback (should not happen): start fresh
                shard = self.shards[msg.partition] = DetectorShard(self.config, self.engine)
            out = process_frame(shard, frame)
            self.stats.frames += 1
            self.stats.updates += frame.values.shape[0] * frame.values.shape[1]
            self.stats.models = sum(len(s.gpu_paths) for s in self.shards.values())
            return out
        if msg.topic == self.topics.events:
            try:
                event = EventRecord.from_bytes(msg.value)
            except DecodeError as exc:
                await self._dead_letter(msg, str(exc))
                return []
            es = self.event_shards.get(msg.partition)
            if es is None:
                es = self.event_shards[msg.partition] = EventShard(
                    self.config.rules.event_hold_s)
            self.stats.events += 1
            return es.observe(event)
        return []

    async def _dead_letter(self, msg: Message, reason: str) -> None:
        log.warning("dead-lettering %s[%d]@%d: %s", msg.topic, msg.partition, msg.offset,
                    reason)
        self.stats.deadletter[msg.topic] = self.stats.deadletter.get(msg.topic, 0) + 1
        await self.transport.dead_letter(self.topics.deadletter, msg, reason)

    async def _publish(self, records: list[AlertRecord]) -> None:
        sent: list[AlertRecord] = []
        for rec in records:
            key = (rec.id, rec.state.value)
            if key in self.suppress:
                self.suppress.discard(key)
                self.stats.suppressed += 1
                continue
            fut = await self.transport.send(self.topics.alerts, rec.to_bytes(), key=rec.key)
            self._pending.append(fut)
            k = (rec.state.value, rec.source)
            self.stats.alerts[k] = self.stats.alerts.get(k, 0) + 1
            log.info("alert %s %s %s %s", rec.state.value, rec.entity, rec.source, rec.summary)
            sent.append(rec)
        self.stats.open_alerts = (sum(len(s.open_alerts) for s in self.shards.values())
                                  + sum(len(e.open) for e in self.event_shards.values()))
        if self.webhook is not None and sent:
            await self.webhook.deliver(sent)

    # -- checkpoints -------------------------------------------------------------------

    async def checkpoint_all(self, only: frozenset[TopicPartition] | None = None) -> None:
        """Wait for published alerts, save state + offsets, then commit the offsets."""
        if self._pending:
            pending, self._pending = self._pending, []
            await asyncio.gather(*pending)
        if self.consumer is None:
            return
        alert_tps = [(self.topics.alerts, q) for q in range(self._alert_partitions)]
        ends = await self.consumer.end_offsets(alert_tps) if alert_tps else {}
        extra = {f"alerts:{q}": off for (_, q), off in ends.items()}
        commit: dict[TopicPartition, int] = {}
        for p, shard in self.shards.items():
            tp = (self.topics.samples, p)
            if (only is not None and tp not in only) or tp not in self.next_offset:
                continue
            save_shard(self.state_dir, p, shard, {"samples": self.next_offset[tp], **extra})
            commit[tp] = self.next_offset[tp]
        for p, es in self.event_shards.items():
            tp = (self.topics.events, p)
            if (only is not None and tp not in only) or tp not in self.next_offset:
                continue
            atomic_write(self.state_dir / f"events-{p}.ckpt", es.to_bytes(self.next_offset[tp]))
            commit[tp] = self.next_offset[tp]
        if commit:
            await self.consumer.commit_checkpointed(commit)
        self.stats.checkpoints += 1
        self._last_checkpoint = time.monotonic()



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

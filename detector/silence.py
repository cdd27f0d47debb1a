"""Senders that stop: a node or a whole rack that goes quiet, an exporter with blank pages.

The GPU rules see only what arrives: a GPU that fell off the bus still has a node sending
frames around it (``rule:gpu_lost``), but a node whose agent, power or network died sends
nothing, and a rack that loses power or its top-of-rack switch sends nothing at all, so no
rule sees it. This watch knows the expected senders (every node it has had frames from, and
how many GPUs they reported) and their last frame in event time:

- a node silent for ``silent_after_s`` while others of its rack still send raises one node
  alert (``rule:silent``);
- a rack whose every node is silent raises one rack alert instead (a node already alerted
  before the rest of its rack fell silent is absorbed into the rack's incident by
  ``detector.incidents``). While some node of a rack is half-way to silent (no frame for
  half of ``silent_after_s``), the rack is left undecided, so a rack going dark over a few
  seconds is one rack alert, not a node alert and then a rack alert;
- a node that still sends but whose frames carry no reading at all (a dcgm-exporter
  answering with an empty page, or one of sentinels only) for ``silent_after_s``, after it
  had readings, raises ``rule:exporter_blank``: the node is up, its exporter is not;
- an agent that stops in order (``agent_stop`` event) leaves the expected senders.

Time is event time per samples partition (``tick({partition: now_ms})``; a rack's nodes
share a partition): the newest sample time of that partition, and the fleet's newest once
the partition has nothing left to read. So a partition still working through a backlog never
finds the nodes of another partition silent, a replay judges as the live run did, and a rack
alone on its partition is judged by the fleet's clock once its partition is drained. A
detector that receives nothing at all cannot tell a silent fleet from a broken feed; its
own lag alert covers that. The state of each samples partition (its nodes and the open
alerts of its racks) is checkpointed beside its shard (:meth:`SilenceWatch.state`,
:meth:`SilenceWatch.restore`), so a rack that goes dark while the detector restarts, or while
its partition moves to another instance, is still expected, and found silent.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

from detector.shard import alert_id
from schemas.errors import DecodeError
from schemas.records import Action, AlertRecord, AlertState, Severity

__all__ = ["SilenceWatch"]

SILENT = "rule:silent"
BLANK = "rule:exporter_blank"


@dataclass(slots=True)
class _Node:
    partition: int
    last_ms: int
    last_reading_ms: int
    gpus: int
    """GPUs reporting in its best frame so far (its inventory, as far as frames tell)."""


class SilenceWatch:
    """Expected senders and their silence; ``tick`` opens and resolves the alerts."""

    def __init__(self, silent_after_s: float = 30.0) -> None:
        self.after_ms = int(silent_after_s * 1000)
        self.nodes: dict[str, _Node] = {}
        self.open: dict[tuple[str, str], AlertRecord] = {}
        self.now_ms = 0

    def seen(self, partition: int, node: str, ts_ms: int, reporting: int) -> None:
        """A frame of ``node`` up to ``ts_ms`` in which ``reporting`` GPUs had a reading."""
        n = self.nodes.get(node)
        if n is None:
            n = self.nodes[node] = _Node(partition, ts_ms, ts_ms if reporting else -1, 0)
        n.partition = partition
        n.last_ms = max(n.last_ms, ts_ms)
        if reporting:
            n.last_reading_ms = max(n.last_reading_ms, ts_ms)
        n.gpus = max(n.gpus, reporting)

    def rack_nodes(self, path: str) -> int:
        """Expected senders in the rack of ``path`` (a rack, node or GPU path)."""
        rack = "/".join(path.split("/")[:3]) + "/"
        return sum(1 for name in self.nodes if name.startswith(rack))

    def left(self, node: str) -> None:
        """The node's agent stopped in order: no longer expected."""
        self.nodes.pop(node, None)

    def drop_partition(self, partition: int) -> None:
        """The partition moved to another detector instance: its senders are theirs, and so
        are the open alerts of its racks."""
        mine = [k for k, n in list(self.nodes.items()) if n.partition == partition]
        racks = {_rack(k) for k in mine}
        for name in mine:
            del self.nodes[name]
        for key in [k for k in self.open if _rack(k[0]) in racks]:
            del self.open[key]

    def state(self, partition: int) -> bytes:
        """The expected senders of ``partition`` and the open alerts of their racks. (The
        service calls it while other partitions' frames are taken in threads: ``list`` copies
        the nodes in one step under the GIL.)"""
        nodes = {name: [n.last_ms, n.last_reading_ms, n.gpus]
                 for name, n in list(self.nodes.items()) if n.partition == partition}
        racks = {_rack(name) for name in nodes}
        return orjson.dumps({"version": 1, "nodes": nodes, "open": [
            orjson.loads(rec.to_bytes()) for key, rec in self.open.items()
            if _rack(key[0]) in racks]})

    def restore(self, partition: int, data: bytes) -> None:
        """Take back what :meth:`state` saved (DecodeError if it is not that)."""
        try:
            obj = orjson.loads(data)
            if obj.get("version") != 1:
                raise DecodeError(f"silence state version {obj.get('version')} is not 1")
            nodes = {str(name): _Node(partition, int(last), int(reading), int(gpus))
                     for name, (last, reading, gpus) in obj["nodes"].items()}
            opened = [AlertRecord.from_bytes(orjson.dumps(r)) for r in obj["open"]]
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
            raise DecodeError(f"silence state unusable: {exc}") from exc
        self.nodes.update(nodes)
        for rec in opened:
            self.open[(rec.entity, rec.source)] = rec

    def tick(self, now_by_partition: dict[int, int]) -> list[AlertRecord]:
        """Judge every expected sender at its partition's event time: at most once per
        second of event time (the service calls this every loop; a pass is Python over all
        nodes). Nodes of a partition not in ``now_by_partition`` are not judged."""
        newest = max(now_by_partition.values(), default=0)
        if newest < self.now_ms + 1000:
            return []
        self.now_ms = newest
        want: dict[tuple[str, str], str] = {}
        """(entity, source) -> summary of each alert that should be open now."""
        racks: dict[str, list[tuple[str, _Node]]] = {}
        for name, n in self.nodes.items():
            if n.partition in now_by_partition:
                racks.setdefault(name.rsplit("/", 1)[0], []).append((name, n))
        rack_now = {rack: now_by_partition[nodes[0][1].partition]
                    for rack, nodes in racks.items()}
        for rack, nodes in racks.items():
            now_ms = rack_now[rack]
            ages = [now_ms - n.last_ms for _, n in nodes]
            silent = [name for (name, _), age in zip(nodes, ages, strict=True)
                      if age >= self.after_ms]
            fading = any(self.after_ms / 2 <= age < self.after_ms for age in ages)
            if len(nodes) > 1 and len(silent) == len(nodes):
                want[(rack, SILENT)] = (f"the whole rack stopped sending: {len(nodes)} nodes, "
                                        f"{sum(n.gpus for _, n in nodes)} GPUs silent")
                for name in silent:  # a node alert already open stays (its incident merges)
                    if (name, SILENT) in self.open:
                        want[(name, SILENT)] = self.open[(name, SILENT)].summary
            elif silent and (not fading or any((s, SILENT) in self.open for s in silent)):
                for name in silent:
                    if not fading or (name, SILENT) in self.open:
                        n = self.nodes[name]
                        want[(name, SILENT)] = (f"node stopped sending ({n.gpus} GPUs), while "
                                                "the rest of its rack reports")
            for name, n in nodes:
                if (n.gpus and now_ms - n.last_ms < self.after_ms
                        and now_ms - max(n.last_reading_ms, 0) >= self.after_ms
                        and n.last_reading_ms >= 0):
                    want[(name, BLANK)] = ("node sends, but without any GPU reading: its "
                                           "exporter answers with an empty or sentinel page")
        out = []
        for key in [k for k in self.open if k not in want and _rack(k[0]) in rack_now]:
            opened = self.open.pop(key)
            now_ms = rack_now[_rack(key[0])]
            out.append(AlertRecord(
                id=opened.id, entity=opened.entity, level=opened.level,
                state=AlertState.RESOLVED, severity=opened.severity, source=opened.source,
                summary=opened.summary, score=0.0, threshold=opened.threshold,
                started_ms=opened.started_ms, updated_ms=now_ms,
                attribution=opened.attribution, context=opened.context,
                action=opened.action))
        for (entity, source), summary in want.items():
            if (entity, source) in self.open:
                continue
            level = "rack" if entity.count("/") == 2 else "node"
            now_ms = rack_now[_rack(entity)]
            rec = AlertRecord(
                id=alert_id(entity, source, now_ms), entity=entity, level=level,
                state=AlertState.FIRING,
                severity=Severity.CRITICAL if source == SILENT else Severity.WARNING,
                source=source, summary=summary, score=1.0, threshold=1.0,
                started_ms=now_ms, updated_ms=now_ms,
                context={"silent_after_s": self.after_ms / 1000}, action=Action.CHECK_NODE)
            self.open[(entity, source)] = rec
            out.append(rec)
        return out


def _rack(entity: str) -> str:
    return "/".join(entity.split("/")[:3])

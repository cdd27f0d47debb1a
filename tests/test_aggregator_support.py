"""Shared helpers of the aggregator tests: a small deterministic fleet as sample frames.

(No tests here; the module is imported by the other ``test_aggregator*`` / ``test_query*``
files.) Values are quantised like NVML readings so sums are easy to check, and the energy
counter resets once so the increase logic is exercised.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from aggregator.series_index import EntityIndex
from aggregator.series_layout import split_series_id
from aggregator.store import SeriesStore, StoreConfig
from fleetpulse.transport.base import Message
from schemas.frame import SampleFrame, encode_frame
from schemas.identity import NodeIdentity

TEMP, POWER, ENERGY, PSTATE = 1, 3, 5, 31
METRICS = np.asarray([TEMP, POWER, ENERGY, PSTATE], np.uint16)
T0 = 1_700_000_000_000  # a multiple of 10 s


@dataclass
class FleetData:
    """What was sent: per node, ts [T] and values [T, G, M]; plus the messages."""

    nodes: list[NodeIdentity]
    ts: np.ndarray
    values: list[np.ndarray]
    messages: list[Message]
    frames: list[bytes]
    keys: list[bytes]


def make_fleet(n_racks: int = 2, nodes_per_rack: int = 2, gpus: int = 4, seconds: int = 60,
               partitions: int = 2, seed: int = 0, ticks_per_frame: int = 1,
               start_ms: int = T0, rows: int = 1) -> FleetData:
    rng = np.random.default_rng(seed)
    nodes = [NodeIdentity("c1", f"row{r % rows}", f"rack{r:02d}", f"node{r:02d}-{n}")
             for r in range(n_racks) for n in range(nodes_per_rack)]
    ts = start_ms + np.arange(seconds, dtype=np.int64) * 1000
    values = []
    for i, _ in enumerate(nodes):
        v = np.empty((seconds, gpus, len(METRICS)))
        v[:, :, 0] = rng.integers(30, 90, (seconds, gpus))
        v[:, :, 1] = rng.integers(50_000, 700_000, (seconds, gpus)) / 1000.0
        energy = np.cumsum(rng.integers(100, 900, (seconds, gpus)), axis=0) / 1000.0
        if i == 0:
            energy[seconds // 2:] -= energy[seconds // 2 - 1]  # a driver reload: reset
            energy[seconds // 2:] += 0.5
        v[:, :, 2] = energy
        v[:, :, 3] = rng.integers(0, 3, (seconds, gpus))
        v[rng.random((seconds, gpus, len(METRICS))) < 0.02] = np.nan  # not sampled
        values.append(v)
    msgs, frames, keys = [], [], []
    offsets = [0] * partitions
    for t0 in range(0, seconds, ticks_per_frame):
        for i, node in enumerate(nodes):
            sl = slice(t0, t0 + ticks_per_frame)
            frame = SampleFrame(node, f"agent-{node.node}", t0 // ticks_per_frame,
                                METRICS, np.arange(gpus, dtype=np.int32),
                                tuple(f"GPU-{node.node}-{g}" for g in range(gpus)),
                                ts[sl], np.ascontiguousarray(values[i][sl]))
            data = encode_frame(frame)
            p = int(node.rack[4:]) % partitions
            msgs.append(Message("t.samples", p, offsets[p], node.rack_key, data, int(ts[t0])))
            offsets[p] += 1
            frames.append(data)
            keys.append(node.rack_key)
    return FleetData(nodes, ts, values, msgs, frames, keys)


def open_store(path) -> SeriesStore:
    return SeriesStore(StoreConfig(path=str(path), fsync=False))


def stored_points(store: SeriesStore, index: EntityIndex, tiers: Sequence[str]
                  ) -> Iterator[tuple[tuple, bytes]]:
    """Every stored point of ``tiers`` as ((tier, entity labels, metric, aggregate, t),
    float64 bits): keyed by labels, since entity ids differ between instances and runs."""
    for tier in tiers:
        sids = np.sort(store.series_ids(tier))
        r = store.read(tier, sids, 0, 1 << 62)
        for i, sid in enumerate(r.series_ids.tolist()):
            eid, metric, agg = split_series_id(sid)
            ts, vals = r.series(i)
            for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
                yield (tier, index.keys[eid], metric, agg, t), np.float64(v).tobytes()


def process_all(stage: Any, msgs: list[Message]) -> tuple[list[Any], list[Any]]:
    """``stage.process(msgs)`` and then whatever it deferred: a rack stage closes due windows
    within a wall-clock budget per batch, which a first numba compile (a cold cache, a fresh
    clone) can spend alone; the service closes the rest on its next, empty, batch."""
    dead, out = stage.process(msgs)
    while stage.pending_close():
        more_dead, more = stage.process([])
        dead += more_dead
        out += more
    return dead, out

"""Helpers shared by the detector tests (no tests here): small configs and GPU data.

The data is a simple, seeded stand-in for a node's GPUs: utilisation alternating between
idle and busy phases, power and temperature following it with noise, clocks steady. It is
deliberately plainer than ``agent.fleet`` so a test can say exactly what it injected.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import numpy.typing as npt

from detector.config import AlertConfig, DetectorConfig, ModelConfig, RackModelConfig, RulesConfig
from detector.features import COL, COUNTER_COLS, GATHERED
from detector.shard import DetectorShard
from fleetpulse.transport import Transport
from schemas.catalog import BY_NAME
from schemas.frame import SampleFrame
from schemas.identity import NodeIdentity
from schemas.records import AlertRecord, decode_alerts_topic
from schemas.topics import Topics

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z


def small_config(**overrides: object) -> DetectorConfig:
    """A detector that warms up in 150 steps and runs fast with any engine."""
    model = ModelConfig(trees=12, sample_size=64, warmup=150, horizon=400, floor=2.0)
    rack = RackModelConfig(trees=10, sample_size=32, warmup=20, window_s=5.0)
    alerts = AlertConfig(open_after=3, resolve_after=20, cooldown_s=120.0)
    base = {"model": model, "rack": rack, "alerts": alerts}
    base.update(overrides)
    return DetectorConfig(**base)  # type: ignore[arg-type]


def healthy(steps: int, gpus: int, seed: int = 0) -> npt.NDArray[np.float64]:
    """(steps, gpus, len(GATHERED)) gathered metrics of well-behaved GPUs."""
    rng = np.random.default_rng(seed)
    x = np.full((steps, gpus, len(GATHERED)), np.nan)
    phase = (np.arange(steps) // 40) % 2  # 40 s idle, 40 s busy, as one node
    util = np.clip(phase[:, None] * 0.9 + rng.normal(0.03, 0.02, (steps, gpus)), 0, 1)
    x[:, :, COL["utilization_ratio"]] = np.round(util, 2)
    power = 80 + 500 * util + rng.normal(0, 4, (steps, gpus))
    x[:, :, COL["power_usage_watts"]] = np.round(power, 3)
    x[:, :, COL["power_limit_watts"]] = 700.0
    temp = np.empty((steps, gpus))
    t = np.full(gpus, 35.0)
    for s in range(steps):
        t += (30 + 0.06 * power[s] - t) / 15.0
        temp[s] = t
    x[:, :, COL["temperature_celsius"]] = np.round(temp + rng.normal(0, 0.3, temp.shape))
    x[:, :, COL["memory_temperature_celsius"]] = np.round(temp + 5)
    x[:, :, COL["sm_clock_hertz"]] = np.where(phase[:, None] > 0, 1.98e9, 0.345e9)
    x[:, :, COL["clock_event_reasons"]] = np.where(phase[:, None] > 0, 0, 1)
    for name in ("ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "nvlink_crc_errors_total",
                 "nvlink_replay_errors_total", "nvlink_recovery_errors_total",
                 "pcie_replay_errors_total", "ecc_dbe_aggregate_total"):
        x[:, :, COL[name]] = 0.0
    x[:, :, COL["row_remap_failure"]] = 0.0
    return x


def timestamps(steps: int, start: int = 0) -> npt.NDArray[np.int64]:
    return T0_MS + 1000 * np.arange(start, start + steps, dtype=np.int64)


def recorded_rows(temp_c: npt.NDArray[np.float64], power_w: npt.NDArray[np.float64],
                  util: npt.NDArray[np.float64], limit_w: float) -> npt.NDArray[np.float64]:
    """Gathered rows (steps, gpus, len(COL)) from a recorded series (``tests/fixtures/zoo``):
    die temperature, power and utilisation as recorded, the power limit, error counters at 0,
    everything else not exported (NaN)."""
    x = np.full((*temp_c.shape, len(COL)), np.nan)
    x[:, :, COL["temperature_celsius"]] = temp_c
    x[:, :, COL["power_usage_watts"]] = power_w
    x[:, :, COL["power_limit_watts"]] = limit_w
    x[:, :, COL["utilization_ratio"]] = util
    for c in COUNTER_COLS:
        x[:, :, c] = 0.0
    return x


_RECORDED_SCALE = {"temp_deci_c": 10.0, "temp_half_c": 2.0, "temp_c": 1.0, "power_mw": 1000.0,
                   "power_deciwatts": 10.0, "power_w": 1.0, "util_pct": 100.0}
"""Each integer field a ``tests/fixtures/zoo`` recording may hold, and what it is divided by
to give degrees, watts or a utilisation ratio (each recording keeps its sensor's resolution
in as few bytes as it needs)."""


def load_recorded(path: Path, limit_w: float) -> npt.NDArray[np.float64]:
    """``recorded_rows`` of a ``tests/fixtures/zoo`` recording, whichever of the fields of
    ``_RECORDED_SCALE`` it was stored in."""
    f = np.load(path)

    def field(prefix: str) -> npt.NDArray[np.float64]:
        (name,) = [n for n in f.files if n.startswith(prefix) and n in _RECORDED_SCALE]
        return f[name] / _RECORDED_SCALE[name]

    return recorded_rows(field("temp_"), field("power_"), field("util_"), limit_w)


def rules_shard(paths: list[str], rack: bool = False, rules: RulesConfig | None = None
                ) -> tuple[DetectorShard, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """A default detector without the per-GPU forests (the rules under test, default ones
    unless ``rules``), the rack model only if asked, with ``paths`` (``.../rack/node/gpu``)
    registered."""
    shard = DetectorShard(DetectorConfig(model=ModelConfig(enabled=False),
                                         rack=RackModelConfig(enabled=rack),
                                         rules=rules or RulesConfig()))
    nodes = [p.rsplit("/", 1)[0] for p in paths]
    ids, node_ids = shard.register(paths, [n.rsplit("/", 1)[0] for n in nodes], nodes)
    return shard, ids, node_ids


def replay_node(rows: npt.NDArray[np.float64], step_ms: int, rules: RulesConfig | None = None
                ) -> list[AlertRecord]:
    """The alerts of a rules-only shard (``rules_shard``) over one node's recorded rows
    (``recorded_rows``: steps x GPUs), fed 300 steps a call as a consumer's batches would."""
    steps, gpus = rows.shape[:2]
    shard, ids, nodes = rules_shard([f"c/row-0/rack-0/node-0/gpu-{g}" for g in range(gpus)],
                                    rules=rules)
    ts = T0_MS + step_ms * np.arange(steps, dtype=np.int64)
    alerts: list[AlertRecord] = []
    for s in range(0, steps, 300):
        alerts += shard.process(ids, nodes, ts[s:s + 300], rows[s:s + 300])
    return alerts


GATHERED_IDS = np.array([BY_NAME[m].id for m in GATHERED], dtype=np.uint16)


def frame(node: str, rack: str, ts: npt.NDArray[np.int64], values: npt.NDArray[np.float64],
          seq: int, cluster: str = "c1", row: str = "row-a") -> SampleFrame:
    """A sample frame of one node carrying the gathered metrics (T, G, K) in catalog ids."""
    g = values.shape[1]
    return SampleFrame(
        identity=NodeIdentity(cluster, row, rack, node), agent=f"{node}.1", seq=seq,
        metric_ids=GATHERED_IDS, gpus=np.arange(g, dtype=np.int32),
        uuids=tuple(f"GPU-{node}-{i}" for i in range(g)), ts=np.asarray(ts, dtype=np.int64),
        values=np.ascontiguousarray(values))


async def read_alerts(transport: Transport, topics: Topics, *, rounds: int = 6,
                      timeout_ms: int = 1000) -> list[AlertRecord]:
    """Every alert record on the alerts topic so far, read by a fresh consumer group (it
    stops at the first empty batch once it has read some, after at most ``rounds`` polls)."""
    consumer = transport.consumer([topics.alerts], f"check-{uuid.uuid4().hex}")
    out: list[AlertRecord] = []
    try:
        for _ in range(rounds):
            batch = await consumer.getmany(timeout_ms=timeout_ms)
            out.extend(a for m in batch
                       if isinstance(a := decode_alerts_topic(m.value), AlertRecord))
            if not batch and out:
                break
    finally:
        await consumer.stop()
    return out

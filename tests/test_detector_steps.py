"""The shard on its own step clock: 5 Hz costs the models what 1 Hz does and scores the same,
the rules still see every tick, frames of many nodes batched together give what frames one
by one give, and shed steps skip the models but nothing else."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
from test_detector_support import T0_MS, healthy, small_config

from detector.features import COL
from detector.shard import DetectorShard, StepTrace, TickBlock
from schemas.records import AlertRecord, AlertState

RACK = "c1/row-a/rack-1"
HZ = 5


def _shard(gpus: int = 8) -> tuple[DetectorShard, npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    shard = DetectorShard(small_config())
    paths = [f"{RACK}/node-{g // 4}/gpu-{g % 4}" for g in range(gpus)]
    ids, nodes = shard.register(paths, [RACK] * gpus, [p.rsplit("/", 1)[0] for p in paths])
    return shard, ids, nodes


def _upsample(data: npt.NDArray[np.float64]) -> tuple[npt.NDArray[np.int64],
                                                       npt.NDArray[np.float64]]:
    """1 Hz data as 5 Hz ticks holding each second's values (a few ms of jitter)."""
    steps = data.shape[0]
    jitter = np.random.default_rng(0).integers(0, 8, steps * HZ)
    ts = T0_MS + np.arange(steps * HZ, dtype=np.int64) * (1000 // HZ) + jitter
    return ts, np.repeat(data, HZ, axis=0)


def _fired(alerts: list[AlertRecord]) -> set[tuple[str, str]]:
    return {(a.entity, a.source) for a in alerts if a.state is AlertState.FIRING}


def test_5hz_costs_one_model_step_per_second_and_scores_as_1hz() -> None:
    data = healthy(700, 8, seed=4)
    data[450:, 3, COL["temperature_celsius"]] += 20.0
    data[450:, 3, COL["memory_temperature_celsius"]] += 20.0
    one, ids, nodes = _shard()
    trace_1 = StepTrace()
    alerts_1 = one.process(ids, nodes, T0_MS + 1000 * np.arange(700, dtype=np.int64), data,
                           trace_1)
    five, ids, nodes = _shard()
    trace_5 = StepTrace()
    ts, ticks = _upsample(data)
    alerts_5 = []
    for s in range(0, len(ts), 25):  # frames of 5 s, as agents send them
        alerts_5 += five.process(ids, nodes, ts[s:s + 25], ticks[s:s + 25], trace_5)
    assert one.gpu_steps == 700 * 8
    assert five.gpu_steps == 700 * 8  # each step complete at its fifth tick
    np.testing.assert_allclose(np.array(trace_5.scores), np.array(trace_1.scores))
    model = {k for k in _fired(alerts_5) if k[1].startswith("model:")}
    assert model == {k for k in _fired(alerts_1) if k[1].startswith("model:")}


def test_rules_see_a_single_tick_the_step_would_average_away() -> None:
    shard, ids, nodes = _shard()
    ts, ticks = _upsample(healthy(60, 8, seed=2))
    ticks[101, 1, COL["xid"]] = 79.0  # one 200 ms tick
    ticks[150:153, 2, COL["clock_event_reasons"]] = 0x40  # a 600 ms thermal slowdown
    ticks[203, 5] = np.nan  # one tick lost: the forest does not see a hole
    alerts = shard.process(ids, nodes, ts, ticks)
    fired = _fired(alerts)
    assert (f"{RACK}/node-0/gpu-1", "rule:xid") in fired
    assert (f"{RACK}/node-0/gpu-2", "rule:thermal_slowdown") in fired
    assert not [a for a in alerts if a.source == "rule:gpu_lost"]


def test_frames_batched_together_give_what_frames_one_by_one_give() -> None:
    data = healthy(400, 8, seed=6)
    data[300:, 6, COL["utilization_ratio"]] = 1.0
    data[300:, 6, COL["sm_clock_hertz"]] = 1.1e9
    ts, ticks = _upsample(data)
    # Two nodes whose clocks are 137 ms apart, each sending 5-tick frames.
    node_ts = [ts, ts + 137]
    alone, ids, nodes = _shard()
    together, _, _ = _shard()
    one_by_one: list[AlertRecord] = []
    batched: list[AlertRecord] = []
    for s in range(0, len(ts), 25):
        blocks = [TickBlock(ids[4 * n:4 * n + 4], nodes[4 * n:4 * n + 4], node_ts[n][s:s + 5],
                            ticks[s:s + 5, 4 * n:4 * n + 4]) for n in (0, 1)]
        blocks += [TickBlock(b.ids, b.nodes, node_ts[n][s + k:s + k + 5],
                             ticks[s + k:s + k + 5, 4 * n:4 * n + 4])
                   for k in (5, 10, 15, 20) for n, b in enumerate(blocks[:2])]
        for b in blocks:
            one_by_one += alone.process_blocks([b])
        batched += together.process_blocks(blocks)
    key = sorted((a.id, a.state.value, a.updated_ms) for a in one_by_one)
    assert key == sorted((a.id, a.state.value, a.updated_ms) for a in batched)
    assert together.gpu_steps == alone.gpu_steps
    np.testing.assert_array_equal(together.gpu_bank.thresholds.threshold(ids),
                                  alone.gpu_bank.thresholds.threshold(ids))


def test_shed_steps_skip_the_models_but_not_the_rules() -> None:
    shard, ids, nodes = _shard()
    ts, ticks = _upsample(healthy(200, 8, seed=3))
    ticks[400, 0, COL["xid"]] = 48.0
    alerts = shard.process(ids, nodes, ts[:500], ticks[:500], shed_before_ms=int(ts[500]))
    assert shard.gpu_steps == 0 and shard.skipped_steps == 100 * 8
    assert (f"{RACK}/node-0/gpu-0", "rule:xid") in _fired(alerts)
    shard.process(ids, nodes, ts[500:], ticks[500:], shed_before_ms=int(ts[500]))
    assert shard.gpu_steps == 100 * 8  # caught up: every later step modelled

"""The agent's ``synthetic`` source: one node of the fleet model behind the source interface."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from agent.fleet import METRIC_IDS, METRICS
from agent.sources.base import SourceContext, open_source
from schemas.identity import NodeIdentity
from schemas.records import EventKind

NODE = NodeIdentity("lab", "row-1", "rack-1", "node-1")


async def _ticks(ctx: SourceContext, n: int):
    src = open_source("synthetic", ctx)
    await src.start()
    out = []
    for k in range(n):
        got = await src.gather(1_800_000_000_000 + 1000 * k)
        # The source may reuse its buffer (the sampler copies), so keep a copy per tick.
        out.append(dataclasses.replace(got, values=got.values.copy()))
    await src.close()
    return src, out


async def test_gathers_every_nvml_metric_for_each_gpu():
    src, ticks = await _ticks(SourceContext(NODE, 1.0), 5)
    assert "synthetic" in src.describe()
    first = ticks[0]
    assert first.values.shape == (8, len(METRICS))
    assert first.metric_ids is METRIC_IDS and first.extra == ()
    assert first.gpus.tolist() == list(range(8)) and len(set(first.uuids)) == 8
    # Layout objects are stable from tick to tick (the sampler checks identity first).
    assert all(t.uuids is first.uuids and t.gpus is first.gpus for t in ticks)
    assert ticks[-1].ts_ms == 1_800_000_000_000 + 4000
    temp = np.array([t.values[:, 0] for t in ticks])
    assert np.all((temp > 15) & (temp < 100)) and np.array_equal(temp, np.rint(temp))


async def test_seeded_by_identity():
    _, a = await _ticks(SourceContext(NODE, 1.0, {"seed": 5}), 3)
    _, b = await _ticks(SourceContext(NODE, 1.0, {"seed": 5}), 3)
    other = NodeIdentity("lab", "row-1", "rack-1", "node-2")
    _, c = await _ticks(SourceContext(other, 1.0, {"seed": 5}), 3)
    assert all(np.array_equal(x.values, y.values, equal_nan=True) for x, y in zip(a, b, strict=True))
    assert not np.array_equal(a[-1].values, c[-1].values, equal_nan=True)


async def test_fallen_off_bus_becomes_gpu_lost_event_and_nan_row():
    opts = {"faults": 1, "fault_kinds": ["fallen_off_bus"], "horizon_s": 20}
    src, ticks = await _ticks(SourceContext(NODE, 0.5, opts), 40)
    (fault,) = src.faults
    (gpu,) = fault.gpus
    events = [e for t in ticks for e in t.events]
    lost = [e for e in events if e.kind is EventKind.GPU_LOST]
    assert len(lost) == 1 and lost[0].gpu == gpu and lost[0].uuid == ticks[0].uuids[gpu]
    assert any(e.kind is EventKind.XID and e.data["xid"] == 79 for e in events)
    start = round(fault.start_s / 0.5)
    xid = METRICS.index("fleetpulse_gpu_xid")
    assert not np.isnan(np.delete(ticks[start - 1].values[gpu], xid)).any()
    assert np.isnan(ticks[start + 1].values[gpu]).all()
    others = np.delete(ticks[start + 1].values, gpu, axis=0)
    assert not np.isnan(np.delete(others, xid, axis=1)).any()


def test_unknown_options_are_refused():
    with pytest.raises(ValueError, match="unknown options"):
        open_source("synthetic", SourceContext(NODE, 1.0, {"gpu": 8}))

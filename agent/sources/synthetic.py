"""The ``synthetic`` source: one node's worth of the synthetic fleet, for agents without GPUs.

It runs :class:`agent.fleet.FleetModel` over a one-node topology, so an agent on a laptop
(or in the agent's own tests and benchmark) samples the same NVML-shaped data, at the same
granularity, as the load generator publishes, and goes through the real sampler, spool and
publisher.

Options (the ``[source.synthetic]`` table of the agent config):

``gpus``     GPUs on the node (default 8)
``seed``     base seed (default 0); the node's identity is mixed in, so two agents with the
             same config on different nodes do not produce identical data
``faults``   faults to inject into this node (default 0), planned over ``horizon_s``
``fault_kinds``  restrict kinds (list of names)
``horizon_s``    the run length faults are planned over (default 3600)

XIDs in a tick become ``xid`` events; XID 79 becomes a ``gpu_lost`` event, after which the
GPU's row is all NaN, as NVML answers GPU_IS_LOST.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from agent.fleet.faults import FaultKind, plan_faults
from agent.fleet.model import METRIC_IDS, METRICS, FleetModel
from agent.fleet.topology import Topology
from agent.sources.base import Gathered, Source, SourceContext, SourceEvent, register_source
from schemas.records import EventKind

__all__ = ["SyntheticSource"]

_XID = METRICS.index("fleetpulse_gpu_xid")


class SyntheticSource(Source):
    """One simulated node; ``gather`` advances the model by one tick."""

    name = "synthetic"

    def __init__(self, ctx: SourceContext) -> None:
        opts: dict[str, Any] = dict(ctx.options)
        unknown = set(opts) - {"gpus", "seed", "faults", "fault_kinds", "horizon_s"}
        if unknown:
            raise ValueError(f"source.synthetic: unknown options {sorted(unknown)}")
        gpus = int(opts.get("gpus", 8))
        if not 1 <= gpus <= 64:
            raise ValueError(f"source.synthetic.gpus must be in [1, 64], got {gpus}")
        self.identity = ctx.identity
        seed = int(opts.get("seed", 0)) ^ zlib.crc32(ctx.identity.path.encode())
        self.hz = 1.0 / ctx.interval_s
        topo = Topology(gpus, gpus_per_node=gpus, cluster=ctx.identity.cluster)
        horizon = float(opts.get("horizon_s", 3600.0))
        kinds = [FaultKind(k) for k in opts.get("fault_kinds", ())] or None
        faults = plan_faults(topo, int(opts.get("faults", 0)), horizon, self.hz, seed, kinds)
        self.model = FleetModel(topo, hz=self.hz, seed=seed, faults=faults)
        self.faults = faults
        self._gpus = np.arange(gpus, dtype=np.int32)
        self._uuids = self.model.uuids
        self._values = np.empty((gpus, len(METRICS)))
        self._lost: set[int] = set()

    def describe(self) -> str:
        return (f"synthetic: {len(self._gpus)} simulated H100s at {self.hz:g} Hz "
                f"({len(self.faults)} injected faults)")

    async def gather(self, ts_ms: int) -> Gathered:
        _, values = self.model.step(out=self._values)
        events: list[SourceEvent] = []
        hits = np.flatnonzero(~np.isnan(values[:, _XID]))
        for g in (int(x) for x in hits):
            code = int(values[g, _XID])
            events.append(SourceEvent(EventKind.XID, ts_ms, g, self._uuids[g], {"xid": code}))
            if code == 79 and g not in self._lost:
                self._lost.add(g)
                events.append(SourceEvent(EventKind.GPU_LOST, ts_ms, g, self._uuids[g],
                                          {"xid": code}))
        return Gathered(ts_ms, METRIC_IDS, (), self._gpus, self._uuids, values, tuple(events))


@register_source("synthetic")
def _open(ctx: SourceContext) -> Source:
    return SyntheticSource(ctx)

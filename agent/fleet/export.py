"""Bulk generation and the ``.npz`` export that the offline benchmarks read.

File layout (``numpy.savez``, no pickles, so ``np.load(path)`` reads it safely):

``ts``       (G, T) int64   sample time per GPU and tick, epoch milliseconds
``values``   (G, T, M) float64  base units (schemas.catalog), NaN = not sampled
``metrics``  (M,) str       catalog names of the columns
``uuids``    (G,) str       GPU UUIDs                      (optional for readers)
``nodes``    (G,) str       node path cluster/row/rack/node (optional for readers)

Other producers may write any subset of the catalog's metrics and omit the optional arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from agent.fleet.faults import (
    Fault,
    FaultKind,
    labels_of,
    plan_faults,
    plan_zoo_faults,
    realistic_fault_count,
)
from agent.fleet.jobs import JobScheduler, job_attachments
from agent.fleet.model import DEFAULT_START_MS, METRICS, FleetModel
from agent.fleet.topology import Topology
from agent.fleet.zoo import FleetProfile, named_or_drawn
from schemas.attribution import Attachment
from schemas.catalog import BY_NAME

__all__ = ["FleetData", "generate", "generate_zoo", "load_npz", "save_npz"]

JOB_MIN_S = 300.0
JOB_MAX_S = 4 * 3600.0
"""Job lengths of a generated run with ``jobs`` (log-uniform, five minutes to four hours):
short enough that an hour's run sees jobs start and end on every scale."""


@dataclass(frozen=True, slots=True, eq=False)
class FleetData:
    """A whole run in memory: the export file's arrays plus the ground truth."""

    ts: npt.NDArray[np.int64]
    values: npt.NDArray[np.float64]
    metrics: tuple[str, ...]
    labels: list[dict[str, Any]] = field(default_factory=list)
    uuids: tuple[str, ...] = ()
    nodes: tuple[str, ...] = ()
    attachments: tuple[tuple[int, int, Attachment], ...] = ()
    """(time ms, GPU, attachment) in time order, when the run scheduled jobs (not saved in
    the npz: the export layout holds samples only)."""

    def column(self, metric: str) -> npt.NDArray[np.float64]:
        """(G, T) values of one metric by catalog name."""
        return self.values[:, :, self.metrics.index(metric)]


def generate(
    gpus: int,
    hz: float,
    duration_s: float,
    *,
    faults: int = 0,
    seed: int = 0,
    fault_kinds: Sequence[FaultKind | str] | None = None,
    gpus_per_node: int = 8,
    nodes_per_rack: int = 4,
    racks_per_row: int = 8,
    start_ms: int = DEFAULT_START_MS,
    cluster: str = "sim",
    profile: FleetProfile | None = None,
    fault_plan: Sequence[Fault] | None = None,
    jobs: bool = False,
    job_poll_s: float = 5.0,
) -> FleetData:
    """Run the fleet model for ``duration_s`` seconds at ``hz`` and keep everything.

    ``profile`` (default: today's model) sets the fleet's constants and, through its
    ``fault_style``, how the ``faults`` are planned (:func:`plan_faults` or
    :func:`plan_zoo_faults`); its metrics in ``missing`` are NaN columns of ``values``.
    ``fault_plan`` injects exactly these faults instead (``faults`` and ``fault_kinds`` are
    then ignored). ``jobs`` schedules jobs (:class:`~agent.fleet.jobs.JobScheduler`, from
    ``seed``, advanced every ``job_poll_s``) and the load follows them; their attachments
    are in ``attachments``. Memory is G x T x M x 8 bytes (10,000 GPUs x 1 h at 1 Hz is
    9.5 GB).
    """
    topo = Topology(gpus, gpus_per_node, nodes_per_rack, racks_per_row, cluster)
    ticks = round(duration_s * hz)
    if ticks < 1:
        raise ValueError(f"{duration_s} s at {hz} Hz is less than one tick")
    if fault_plan is not None:
        plan = list(fault_plan)
    elif profile is not None and profile.fault_style == "zoo":
        plan = plan_zoo_faults(topo, faults, duration_s, hz, seed, profile, kinds=fault_kinds)
    else:
        plan = plan_faults(topo, faults, duration_s, hz, seed, fault_kinds)
    scheduler = JobScheduler(topo, seed, min_s=JOB_MIN_S, max_s=JOB_MAX_S) if jobs else None
    model = FleetModel(topo, hz=hz, seed=seed, start_ms=start_ms, faults=plan, profile=profile,
                       jobs=scheduler)
    ts = np.empty((topo.gpus, ticks), dtype=np.int64)
    values = np.empty((topo.gpus, ticks, len(METRICS)))
    nog = topo.node_of_gpu
    attachments: list[tuple[int, int, Attachment]] = []
    next_poll_ms = start_ms
    for k in range(ticks):
        now_ms = start_ms + round(k * 1000 / hz)
        if scheduler is not None and now_ms >= next_poll_ms:
            next_poll_ms = now_ms + round(job_poll_s * 1000)
            attachments += [(now_ms, g, a) for g, a in job_attachments(
                *scheduler.advance(now_ms), model.uuids, now_ms)]
        node_ts, _ = model.step(out=values[:, k, :])
        ts[:, k] = node_ts[nog]
    nodes = tuple(topo.identities[n].path for n in nog.tolist())
    return FleetData(ts, values, METRICS, labels_of(plan, model.stuck_visible_s), model.uuids, nodes,
                     tuple(attachments))


def generate_zoo(
    seed: int,
    gpus: int,
    duration_s: float,
    faults: int | None = 0,
    *,
    profile: str | int | FleetProfile | None = None,
    hz: float | None = None,
    **kwargs: Any,
) -> tuple[FleetProfile, FleetData]:
    """A zoo fleet: ``draw_profile(seed)`` (or ``profile``: a name, a seed, a profile), run.

    ``faults`` None draws the count at a real fleet's rate
    (:func:`~agent.fleet.faults.realistic_fault_count`: ~0.5 per 1000 GPU-days, mostly
    none); ``hz`` overrides the profile's rate; other keywords go to :func:`generate`.
    """
    prof = named_or_drawn(seed if profile is None else profile)
    rate = prof.hz if hz is None else hz
    count = realistic_fault_count(gpus, duration_s, seed) if faults is None else faults
    data = generate(gpus, rate, duration_s, faults=count, seed=seed, profile=prof, **kwargs)
    return prof, data


def save_npz(path: str | Path, data: FleetData) -> None:
    """Write ``data`` in the export layout (uncompressed: the readers want speed)."""
    arrays: dict[str, Any] = {
        "ts": data.ts,
        "values": data.values,
        "metrics": np.array(data.metrics, dtype=str),
    }
    if data.uuids:
        arrays["uuids"] = np.array(data.uuids, dtype=str)
    if data.nodes:
        arrays["nodes"] = np.array(data.nodes, dtype=str)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)


def load_npz(path: str | Path) -> FleetData:
    """Read an export file (ours or anyone's in the same layout), checking shapes and names."""
    with np.load(path, allow_pickle=False) as z:
        for key in ("ts", "values", "metrics"):
            if key not in z:
                raise ValueError(f"{path}: missing array {key!r}")
        ts = z["ts"].astype(np.int64, copy=False)
        values = z["values"].astype(np.float64, copy=False)
        metrics = tuple(str(m) for m in z["metrics"])
        uuids = tuple(str(u) for u in z["uuids"]) if "uuids" in z else ()
        nodes = tuple(str(n) for n in z["nodes"]) if "nodes" in z else ()
    if values.ndim != 3 or ts.shape != values.shape[:2] or values.shape[2] != len(metrics):
        raise ValueError(f"{path}: shapes ts {ts.shape}, values {values.shape}, "
                         f"{len(metrics)} metrics do not fit (G, T), (G, T, M), (M,)")
    unknown = [m for m in metrics if m not in BY_NAME]
    if unknown:
        raise ValueError(f"{path}: metrics not in the catalog: {unknown[:5]}")
    return FleetData(ts, values, metrics, [], uuids, nodes)

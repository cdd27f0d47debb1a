"""The synthetic GPU fleet: load generator and ground truth for the detector.

A vectorised numpy model of N GPUs in rows / racks / nodes, deterministic from a seed, with
every catalog metric that NVML provides at NVML's granularity, workloads, thermal dynamics,
throttling, rare ECC/XID, and injected faults with labels.

For the benchmarks (compression, detection), in Python::

    from agent.fleet import generate, save_npz, load_npz
    data = generate(gpus=64, hz=1.0, duration_s=3600, faults=8, seed=1)
    data.ts        # (G, T) int64 epoch ms
    data.values    # (G, T, M) float64, base units, NaN = not sampled
    data.metrics   # (M,) catalog names (agent.fleet.METRICS)
    data.labels    # [{"gpu", "kind", "start_s", "end_s"}, ...] one per affected GPU
    save_npz("fleet.npz", data); load_npz("fleet.npz")

or from the shell: ``fleetpulse fleet --gpus 64 --hz 1 --duration 3600 --faults 8
--export fleet.npz --labels labels.json``.

Step by step (live publishing, the agent's synthetic source)::

    topo = Topology(gpus=10_000)
    model = FleetModel(topo, hz=1.0, seed=1, faults=plan_faults(topo, 8, 600, 1.0, seed=1))
    ts, values = model.step()   # ts (nodes,) int64 ms, values (G, M) float64
    # node n's GPUs are rows topo.gpus_of_node(n); columns are METRIC_IDS

Live, through the agent's publisher (what ``fleetpulse fleet`` runs; the demo can too)::

    from agent.fleet.live import LiveFleet
    fleet = LiveFleet(model, started_transport, Topics(), ticks_per_frame=5, speed=1.0)
    await fleet.run(stop_event)   # one logical agent per node, frames keyed by rack
    fleet.summary(); fleet.sim_now_ms; fleet.stats

The fleet zoo (profiles drawn from documented ranges, to tune on some and test on others)::

    from agent.fleet import ZOO_HELDOUT_SEEDS, draw_profile, generate, generate_zoo
    p = draw_profile(1000)             # or NAMED_PROFILES["liquid_cooled_integer"]
    data = generate(64, p.hz, 7200, faults=6, seed=1000, profile=p)
    p, data = generate_zoo(1000, 64, 7200, faults=6)    # the same in one call
    data.labels  # + "magnitude", "ramp_s": faults from barely visible to classic, slow or not

Modules: topology (names and index arrays), workloads (what nodes run), thermal (inlet air,
temperatures, clock governor and NVML clock-event bits), faults (kinds, plan, labels), model
(one tick), export (bulk and .npz), zoo (fleet profiles), live (publishing), config (the
command's settings).
"""

from agent.fleet.export import FleetData, generate, generate_zoo, load_npz, save_npz
from agent.fleet.faults import (
    CLASSIC_KINDS,
    Fault,
    FaultKind,
    labels_of,
    plan_faults,
    plan_zoo_faults,
    read_labels,
    realistic_fault_count,
    write_labels,
)
from agent.fleet.model import DEFAULT_START_MS, METRIC_IDS, METRICS, FleetModel
from agent.fleet.topology import Topology
from agent.fleet.zoo import (
    NAMED_PROFILES,
    ZOO_HELDOUT_SEEDS,
    ZOO_TUNING_SEEDS,
    FleetProfile,
    draw_profile,
)

__all__ = [
    "CLASSIC_KINDS",
    "DEFAULT_START_MS",
    "METRICS",
    "METRIC_IDS",
    "NAMED_PROFILES",
    "ZOO_HELDOUT_SEEDS",
    "ZOO_TUNING_SEEDS",
    "Fault",
    "FaultKind",
    "FleetData",
    "FleetModel",
    "FleetProfile",
    "Topology",
    "draw_profile",
    "generate",
    "generate_zoo",
    "labels_of",
    "load_npz",
    "plan_faults",
    "plan_zoo_faults",
    "read_labels",
    "realistic_fault_count",
    "save_npz",
    "write_labels",
]

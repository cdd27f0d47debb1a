"""A fleet whose load follows its scheduled jobs (``agent.fleet.job_load``): a multi-node
job's GPUs run in lock step across nodes, GPUs no job holds idle, a job's end frees its GPUs
at once, and an offline run records the attachments a detector needs."""

from __future__ import annotations

import numpy as np

from agent.fleet import FleetModel, Topology
from agent.fleet.export import generate
from agent.fleet.jobs import JobScheduler
from agent.fleet.model import METRICS

T0 = 1_767_225_600_000
UTIL = METRICS.index("fleetpulse_gpu_utilization_ratio")
PSTATE = METRICS.index("fleetpulse_gpu_performance_state")


def test_a_jobs_gpus_run_alike_across_nodes_and_free_gpus_idle() -> None:
    topo = Topology(256, 8, 4, 2, "sim")
    sched = JobScheduler(topo, seed=3, min_s=60, max_s=1800, occupancy=0.75)
    model = FleetModel(topo, hz=1.0, seed=3, start_ms=T0, jobs=sched)
    multi_node = 0
    for k in range(900):
        if k % 5 == 0:
            sched.advance(T0 + k * 1000)
        _, values = model.step()
        if k % 30 != 29:
            continue
        util = values[:, UTIL]
        free = sched.owner < 0
        assert free.any() and (util[free] == 0).all()
        assert (values[free, PSTATE] == 8).all()  # idle clocks
        for job in sched.jobs.values():
            if np.unique(job.gpus // topo.gpn).size < 2:
                continue
            multi_node += 1
            u = util[job.gpus]
            # lock step: the compute phase and the all-reduce are the job's, not the node's
            assert u.max() - u.min() <= 0.2, (job.id, u)
    assert multi_node >= 20
    # the node-phase model (no scheduler) does not run jobs: the same GPUs spread wider
    plain = FleetModel(topo, hz=1.0, seed=3, start_ms=T0)
    spreads = []
    for _ in range(60):
        _, values = plain.step()
        spreads.append(np.ptp(values[:64, UTIL]))
    assert max(spreads) > 0.4


def test_a_jobs_end_frees_its_gpus_at_the_next_tick() -> None:
    topo = Topology(64, 8, 4, 2, "sim")
    sched = JobScheduler(topo, seed=1, min_s=30, max_s=60, occupancy=1.0)
    model = FleetModel(topo, hz=1.0, seed=1, start_ms=T0, jobs=sched)
    sched.advance(T0)
    for _ in range(5):
        _, values = model.step()
    busy = sched.owner >= 0
    assert busy.any() and (values[busy, PSTATE] == 0).all()
    first = dict(sched.jobs)
    ended, k = [], 5
    while not ended:
        k += 1
        _, ended = sched.advance(T0 + k * 1000)
    gone = np.concatenate([j.gpus for j in ended])
    still_free = gone[sched.owner[gone] < 0]
    _, values = model.step()
    assert still_free.size and (values[still_free, UTIL] == 0).all()
    assert {j.id for j in ended} <= {j.id for j in first.values()}


def test_generate_with_jobs_records_attachments_in_time_order() -> None:
    data = generate(64, 1.0, 1200, seed=2, jobs=True, job_poll_s=5.0)
    att = data.attachments
    assert att and [ms for ms, _, _ in att] == sorted(ms for ms, _, _ in att)
    opened: dict[int, str] = {}
    for ms, gpu, a in att:
        assert a.uuid == data.uuids[gpu] and (ms - T0) % 5000 == 0
        if a.to_ms is None:
            assert gpu not in opened and a.from_ms == ms  # one job per GPU at a time
            opened[gpu] = a.workload
        else:
            assert opened.pop(gpu) == a.workload and a.to_ms == ms
    assert any(a.to_ms is not None for _, _, a in att)  # jobs of 5+ min end within 20 min
    # a GPU holds a job exactly when it is busy (P0) in the samples
    pstate = data.values[:, :, PSTATE]
    held = np.zeros(pstate.shape, dtype=bool)
    for ms, gpu, a in att:
        k = (ms - T0) // 1000
        held[gpu, k:] = a.to_ms is None
    assert np.array_equal(held, pstate == 0)
    # without jobs nothing is recorded and the model is the node-phase one
    assert generate(64, 1.0, 30, seed=2).attachments == ()

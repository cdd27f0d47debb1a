"""The synthetic fleet's jobs (issue 18): sizes from one GPU to whole rows, no GPU in two
jobs, ends on time, and job-mapping files that the agent's own job_mapping source reads
back into attribution events."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from agent.fleet import FleetModel, Topology
from agent.fleet.jobs import FleetAttribution, JobScheduler
from schemas.attribution import Attachment
from schemas.records import EventKind

T0 = 1_767_225_600_000


def test_scheduler_places_every_size_without_overlap_and_ends_jobs() -> None:
    topo = Topology(512, 8, 4, 4, "sim")  # 4 rows x 4 racks x 4 nodes
    s = JobScheduler(topo, seed=3, min_s=60, max_s=4 * 3600, occupancy=0.8)
    sizes: set[str] = set()
    live: dict[str, tuple[int, int]] = {}
    for k in range(400):
        now = T0 + k * 30_000
        started, ended = s.advance(now)
        for j in ended:
            assert j.end_ms <= now and j.id in live
            del live[j.id]
        for j in started:
            sizes.add(j.size)
            live[j.id] = (j.start_ms, j.end_ms)
            assert 60_000 <= j.end_ms - j.start_ms <= 4 * 3600_000
        busy = s.owner >= 0
        counted = sum(job.gpus.size for job in s.jobs.values())
        assert counted == np.count_nonzero(busy)  # no GPU is in two jobs
        assert np.count_nonzero(busy) <= 0.8 * topo.gpus + 128
    assert sizes == {"gpu", "gpus", "node", "nodes", "rack", "row"}
    for job in s.jobs.values():
        if job.size == "row":
            assert job.gpus.size == 128
        if job.size in ("gpu", "gpus"):
            assert len(set((job.gpus // topo.gpn).tolist())) == 1  # one node
    again = JobScheduler(topo, seed=3, min_s=60, max_s=4 * 3600, occupancy=0.8)
    assert [j.id for j in again.advance(T0)[0]] == [j.id for j in
                                                    JobScheduler(topo, 3, min_s=60,
                                                                 max_s=4 * 3600,
                                                                 occupancy=0.8).advance(T0)[0]]


async def test_job_mapping_files_become_attribution_events(tmp_path: Path) -> None:
    topo = Topology(64, 8, 4, 2, "sim")
    model = FleetModel(topo, hz=1.0, seed=1, start_ms=T0)
    fa = FleetAttribution(topo, tmp_path / "jobs", list(model.uuids), seed=5, min_s=30,
                          max_s=120)
    events = await fa.step(T0)
    running = fa.scheduler.jobs
    assert running and len(events) == sum(j.gpus.size for j in running.values())
    # the files are dcgm-exporter's format: <node dir>/<gpu index> holding the job id
    job = next(iter(running.values()))
    g = int(job.gpus[0])
    node = topo.identities[g // topo.gpn].node
    assert (tmp_path / "jobs" / node / str(g % topo.gpn)).read_text() == job.id + "\n"
    atts = [Attachment.from_event(e) for e in events]
    assert {a.workload for a in atts} == {j.id for j in running.values()}
    assert all(e.kind is EventKind.ATTRIBUTION and a.to_ms is None
               for e, a in zip(events, atts, strict=True))
    # later: every job that ends is detached, at the poll that sees its file gone
    first = {j.id for j in running.values()}
    ended: list[Attachment] = []
    for k in range(1, 40):
        ended += [a for a in map(Attachment.from_event, await fa.step(T0 + k * 5000))
                  if a.to_ms is not None]
    assert first <= {a.workload for a in ended}
    assert all(a.to_ms is not None and a.to_ms - a.from_ms >= 30_000 for a in ended)


async def test_fleet_command_publishes_attribution_events(tmp_path: Path) -> None:
    from agent.fleet.config import FleetConfig
    from agent.fleet.live import run_live
    from fleetpulse.config import TransportConfig
    from fleetpulse.transport import open_transport
    from schemas.records import EventRecord
    from schemas.topics import Topics

    bootstrap = f"memory://fleet-jobs-{tmp_path.name}"
    cfg = FleetConfig(gpus=64, duration_s=60, realtime=False, progress_s=0,
                      jobs_dir=str(tmp_path / "jobs"), job_min_s=10, job_max_s=40,
                      transport=TransportConfig(bootstrap=bootstrap))
    reader = open_transport(cfg.transport)
    await reader.start()
    consumer = reader.consumer([Topics().events], "check")
    summary = await run_live(cfg, progress=None)
    recs = []
    while batch := await consumer.getmany(timeout_ms=200):
        recs += [EventRecord.from_bytes(m.value) for m in batch]
    await consumer.stop()
    await reader.close()
    atts = [Attachment.from_event(r) for r in recs if r.kind is EventKind.ATTRIBUTION]
    assert summary["jobs_started"] > 0 and summary["events"] >= len(atts) > 0
    assert any(a.to_ms is not None for a in atts)  # jobs of 10-40 s end within the minute

"""Workload attribution in the agent (issue 18): the kubelet pod-resources API over a real
gRPC unix socket, a job-mapping dir rewritten on disk, dcgm-exporter's own pod labels from
real captures, and the daemon sending changes as events within one poll."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from fakes.kubelet import KubeletStandIn, Pod

from agent.attribution.base import AttributionContext, GpuView, open_attribution
from agent.attribution.dcgm_labels import DcgmLabelsSource
from agent.attribution.job_mapping import JobMappingSource
from agent.attribution.kubelet import KubeletSource
from agent.attribution.static import StaticSource
from agent.attribution.tracker import AttributionTracker
from agent.config import load_agent_config
from agent.run import Agent
from agent.sources.base import SourceError
from agent.sources.dcgm import DcgmSource
from agent.sources.dcgm_parse import parse_exposition
from benchmarks.dcgm_fixtures import DCGM_FIXTURES
from fleetpulse.config import ConfigError, TransportConfig
from fleetpulse.transport.memory import MemoryTransport
from schemas.attribution import Attachment
from schemas.errors import DecodeError
from schemas.identity import NodeIdentity
from schemas.records import EventKind, EventRecord
from schemas.topics import Topics

VIEW = GpuView((0, 1, 2), ("GPU-aaa", "GPU-bbb", "GPU-ccc"))
GPU = "nvidia.com/gpu"


@pytest.fixture
async def kubelet(tmp_path: Path) -> AsyncIterator[KubeletStandIn]:
    server = KubeletStandIn(str(tmp_path / "kubelet.sock"))
    await server.start()
    yield server
    await server.stop()


def _atts(events: list) -> list[tuple[str, str, int, int | None]]:
    return [(e.uuid, e.data["workload"], e.data["from_ms"], e.data["to_ms"]) for e in events]


async def test_kubelet_pods_coming_and_going(kubelet: KubeletStandIn) -> None:
    src = KubeletSource(kubelet.socket_path)
    tracker = AttributionTracker([src])
    await tracker.start()
    try:
        kubelet.pods = [
            Pod("train-0", "ml", {"main": {GPU: ["GPU-aaa", "GPU-bbb"], "cpu": ["0"]}}),
            Pod("infer-1", "web", {"srv": {"nvidia.com/mig-1g.10gb": ["MIG-123"]}}),
            Pod("side", "ml", {"logger": {"example.com/nic": ["eth1"]}}),
        ]
        ev = await tracker.poll(VIEW, 1000)
        assert _atts(ev) == [("GPU-aaa", "ml/train-0", 1000, None),
                             ("GPU-bbb", "ml/train-0", 1000, None),
                             ("MIG-123", "web/infer-1", 1000, None)]
        assert ev[0].gpu == 0 and ev[2].gpu is None
        assert ev[0].data["labels"] == {"pod": "train-0", "namespace": "ml", "container": "main"}
        assert await tracker.poll(VIEW, 6000) == []  # nothing changed: nothing sent
        # train-0 ends; a new pod takes one of its GPUs
        kubelet.pods = [Pod("train-1", "ml", {"main": {GPU: ["GPU-bbb"]}}), kubelet.pods[1]]
        ev = await tracker.poll(VIEW, 11000)
        assert _atts(ev) == [("GPU-aaa", "ml/train-0", 1000, 11000),
                             ("GPU-bbb", "ml/train-0", 1000, 11000),
                             ("GPU-bbb", "ml/train-1", 11000, None)]
        # the kubelet fails one poll: nothing is detached, the failure is counted
        kubelet.fail = grpc.StatusCode.UNAVAILABLE
        assert await tracker.poll(VIEW, 16000) == []
        assert tracker.errors["kubelet"] == 1
        kubelet.fail = None
        kubelet.pods = []
        ev = await tracker.poll(VIEW, 21000)
        assert _atts(ev) == [("GPU-bbb", "ml/train-1", 11000, 21000),
                             ("MIG-123", "web/infer-1", 1000, 21000)]
        assert tracker.current == {}
        assert kubelet.calls == 5
    finally:
        await tracker.close()


async def test_kubelet_unreachable_is_a_retriable_source_error(tmp_path: Path) -> None:
    src = KubeletSource(str(tmp_path / "absent.sock"), timeout_s=0.5)
    try:
        with pytest.raises(SourceError, match="UNAVAILABLE") as info:
            await src.poll(VIEW)
        assert info.value.retriable
    finally:
        await src.close()


async def test_job_mapping_dir_rewritten(tmp_path: Path) -> None:
    d = tmp_path / "jobs"
    d.mkdir()
    (d / "0").write_text("4711\n")
    (d / "GPU-ccc").write_text("88\n89\n")
    (d / "7").write_text("1\n")  # no GPU 7 here: skipped, counted
    (d / ".0.tmp").write_text("junk")
    src = JobMappingSource(d)
    tracker = AttributionTracker([src])
    ev = await tracker.poll(VIEW, 1000)
    assert _atts(ev) == [("GPU-aaa", "4711", 1000, None), ("GPU-ccc", "88,89", 1000, None)]
    assert ev[0].data["labels"] == {"job": "4711"} and src.skipped == 1
    (d / "0").write_text("")  # the epilog empties it
    (d / "1").write_text("4712\n")
    (d / "GPU-ccc").unlink()
    ev = await tracker.poll(VIEW, 2000)
    assert _atts(ev) == [("GPU-aaa", "4711", 1000, 2000), ("GPU-bbb", "4712", 2000, None),
                         ("GPU-ccc", "88,89", 1000, 2000)]
    with pytest.raises(SourceError):
        JobMappingSource("")


def test_dcgm_exporter_pod_labels_from_real_captures() -> None:
    h100 = parse_exposition((DCGM_FIXTURES / "sample-h100-8gpu.prom").read_text())
    assert h100.workloads[0] == {"pod": "vllm-agg-0-vllmdecodeworker-s65j5",
                                 "namespace": "dynamo-workload", "container": "main"}
    assert all(w == {} for w in h100.workloads[1:])  # GPUs 1-7 carry no pod labels
    t4 = parse_exposition((DCGM_FIXTURES / "sample-t4-1gpu.prom").read_text())
    a10g = [w for r, w in zip(t4.rows, t4.workloads, strict=True) if r.uuid == "GPU-abc"]
    assert a10g == [{"pod": "ray-1111111", "namespace": "ray-llm", "container": "ray-worker"}]


async def test_dcgm_attribution_reads_the_last_scrape() -> None:
    dcgm = DcgmSource("http://127.0.0.1:1/metrics")
    src = open_attribution("dcgm", AttributionContext({}, dcgm))
    assert isinstance(src, DcgmLabelsSource)
    with pytest.raises(SourceError, match="no dcgm-exporter scrape"):
        await src.poll(VIEW)
    dcgm.last_scrape = parse_exposition((DCGM_FIXTURES / "sample-h100-8gpu.prom").read_text())
    uuid0 = dcgm.last_scrape.rows[0].uuid
    tracker = AttributionTracker([src, StaticSource({"tenant": "acme", "pod": "ignored"})])
    ev = await tracker.poll(GpuView((0,), (uuid0,)), 5)
    assert _atts(ev) == [(uuid0, "dynamo-workload/vllm-agg-0-vllmdecodeworker-s65j5", 5, None)]
    assert ev[0].data["labels"]["tenant"] == "acme"  # static adds, never overrides
    assert ev[0].data["labels"]["pod"] == "vllm-agg-0-vllmdecodeworker-s65j5"
    with pytest.raises(SourceError, match=r"needs source\.name"):
        open_attribution("dcgm", AttributionContext({}, None))


def test_attribution_record_is_validated() -> None:
    ident = NodeIdentity("c", "r", "k", "n")
    good = Attachment("GPU-1", "ns/p", {"pod": "p"}, 10, None)
    rec = EventRecord(EventKind.ATTRIBUTION, ident, "a", 10, 0, "GPU-1", good.to_data())
    assert Attachment.from_event(EventRecord.from_bytes(rec.to_bytes())) == good
    for data in ({**good.to_data(), "to_ms": 5}, {**good.to_data(), "workload": ""},
                 {**good.to_data(), "labels": {"pod": 3}}, {"workload": "x"}):
        bad = EventRecord(EventKind.ATTRIBUTION, ident, "a", 10, 0, "GPU-1", data)
        with pytest.raises(DecodeError):
            Attachment.from_event(bad)
    with pytest.raises(ConfigError, match="job_mapping_dir"):
        load_agent_config(None, overrides={"attribution": {"sources": ["job_mapping"]}},
                          environ={})


async def test_agent_sends_changes_within_one_poll(tmp_path: Path,
                                                   kubelet: KubeletStandIn) -> None:
    bootstrap = f"memory://att-{uuid.uuid4().hex}"
    interval = 0.5
    cfg = load_agent_config(None, overrides={
        "identity": {"cluster": "c1", "row": "row-a", "rack": "rack-03", "node": "node-17"},
        "source": {"name": "synthetic", "synthetic": {"gpus": 2}},
        "sampling": {"interval_s": 0.1, "ticks_per_frame": 5},
        "transport": {"bootstrap": bootstrap},
        "publish": {"create_topics": 1},
        "spool": {"directory": str(tmp_path / "spool")},
        "metrics": {"enabled": False},
        "attribution": {"sources": ["kubelet", "static"], "interval_s": interval,
                        "kubelet_socket": kubelet.socket_path,
                        "static_labels": ["tenant=acme"]},
    }, environ={})
    agent = Agent(cfg)
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    reader = MemoryTransport(TransportConfig(bootstrap=bootstrap))
    await reader.start()
    consumer = reader.consumer([Topics().events], f"g-{uuid.uuid4().hex}")

    async def next_attribution(deadline_s: float) -> EventRecord:
        end = time.monotonic() + deadline_s
        while time.monotonic() < end:
            for m in await consumer.getmany(timeout_ms=50):
                rec = EventRecord.from_bytes(m.value)
                if rec.kind is EventKind.ATTRIBUTION:
                    return rec
        raise AssertionError(f"no attribution event within {deadline_s} s")

    try:
        while agent.sampler is None or agent.sampler.last is None:
            await asyncio.sleep(0.05)
        uuids = agent.sampler.last.uuids
        kubelet.pods = [Pod("job-a", "ml", {"main": {GPU: [uuids[1]]}})]
        t0 = time.monotonic()
        rec = await next_attribution(3 * interval)
        within = time.monotonic() - t0
        assert rec.uuid == uuids[1] and rec.gpu == 1 and rec.data["to_ms"] is None
        assert rec.data["labels"] == {"pod": "job-a", "namespace": "ml", "container": "main",
                                      "tenant": "acme"}
        assert within <= interval + 0.4, within  # one poll, plus scheduling slack
        kubelet.pods = []
        t0 = time.monotonic()
        rec = await next_attribution(3 * interval)
        assert time.monotonic() - t0 <= interval + 0.4
        assert rec.data["workload"] == "ml/job-a" and rec.data["to_ms"] is not None
    finally:
        stop.set()
        assert await task == 0
        await consumer.stop()
        await reader.close()

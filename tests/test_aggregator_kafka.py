"""Exactness against a real broker: kill -9 under load, and a rebalance between instances.

Every run consumes the same pre-produced topic with its own consumer group and data
directory. The reference is one uninterrupted instance; the others must store the same
rollups, bit for bit (every level, every aggregate, the 10 s tier and the raw tier; the
1 min tier too for the crash case).
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from test_aggregator_support import make_fleet, stored_points

from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig
from fleetpulse.config import TransportConfig
from fleetpulse.transport import open_transport
from schemas.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
PARTITIONS = 4


@pytest.fixture(scope="module")
def produced(kafka_bootstrap, tmp_path_factory):
    """One topic prefix with a 4-minute fleet in it (8 racks over 4 partitions)."""
    prefix = f"t-aggx-{os.getpid()}-{int(time.time() * 1000) % 10**8}"
    fl = make_fleet(n_racks=8, nodes_per_rack=2, gpus=4, seconds=240, partitions=PARTITIONS,
                    rows=2)

    async def produce() -> None:
        t = open_transport(TransportConfig(bootstrap=kafka_bootstrap, topic_prefix=prefix))
        await t.start()
        topics = Topics(prefix)
        await t.ensure_topics({topics.samples: PARTITIONS, topics.rollups: 2,
                               topics.deadletter: 1})
        futs = [await t.send(topics.samples, v, key=k) for v, k in zip(fl.frames, fl.keys,
                                                                       strict=True)]
        await asyncio.gather(*futs)
        await t.close()

    asyncio.run(produce())
    return kafka_bootstrap, prefix, len(fl.frames)


class Instance:
    """``fleetpulse aggregator`` as a real process."""

    def __init__(self, tmp: Path, name: str, bootstrap: str, prefix: str, group: str) -> None:
        self.data = tmp / name
        self.log = tmp / f"{name}.log"
        self.args = [sys.executable, "-m", "fleetpulse", "aggregator", "--bootstrap", bootstrap,
                     "--data-dir", str(self.data), "--listen",
                     "127.0.0.1:0", "--topic-prefix", prefix, "--group", group]
        self.env = {**os.environ, "FLEETPULSE_AGGREGATOR_MAX_BATCH": "40",
                    "FLEETPULSE_AGGREGATOR_COMMIT_INTERVAL_MS": "300",
                    "FLEETPULSE_AGGREGATOR_LATENESS_MS": "5000",
                    "FLEETPULSE_AGGREGATOR_ROW_LATENESS_MS": "600000",
                    "FLEETPULSE_AGGREGATOR_SAMPLES_PARTITIONS": str(PARTITIONS),
                    "FLEETPULSE_AGGREGATOR_ROLLUPS_PARTITIONS": "2"}
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0

    def start(self) -> None:
        """Launch and wait for this launch's "query API on" line (the log is appended to)."""
        before = self.log.read_bytes().count(b"query API on") if self.log.exists() else 0
        fh = open(self.log, "ab")  # noqa: SIM115 - handed to the child
        self.proc = subprocess.Popen(self.args, cwd=ROOT, env=self.env, stdout=fh, stderr=fh)
        fh.close()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            ports = re.findall(rb"query API on http://127.0.0.1:(\d+)", self.log.read_bytes())
            if len(ports) > before:
                self.port = int(ports[-1])
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"aggregator exited: {self.log.read_text()[-3000:]}")
            time.sleep(0.1)
        raise AssertionError(f"aggregator did not start: {self.log.read_text()[-3000:]}")

    def metrics(self) -> dict[str, float]:
        """Parsed /metrics; {} while the process is too busy to answer (a loaded machine)."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics",
                                        timeout=10) as r:
                text = r.read().decode()
        except (TimeoutError, OSError):
            return {}
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                out[name] = out.get(name, 0.0) + float(value)
        return out

    def frames(self) -> float:
        return self.metrics().get("fleetpulse_aggregator_frames_total", 0.0)

    def lag_and_partitions(self) -> tuple[float, float, float]:
        m = self.metrics()
        if not m:
            return (1.0, 0.0, 0.0)
        lag = sum(v for k, v in m.items() if k.startswith("fleetpulse_aggregator_consumer_lag"))
        return (lag, m.get('fleetpulse_aggregator_partitions{stage="rack"}', 0.0),
                m.get('fleetpulse_aggregator_partitions{stage="row"}', 0.0))

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise
        assert self.proc is None or self.proc.returncode == 0, self.log.read_text()[-3000:]


def wait_drained(instances: list[Instance], timeout: float = 240.0) -> None:
    """Until all partitions are owned and every stage reports zero lag, four polls in a row."""
    deadline = time.monotonic() + timeout
    quiet = 0
    while time.monotonic() < deadline:
        time.sleep(0.4)
        polls = [i.lag_and_partitions() for i in instances]
        done = (all(p[0] == 0 for p in polls) and sum(p[1] for p in polls) == PARTITIONS
                and sum(p[2] for p in polls) == 2)
        quiet = quiet + 1 if done else 0
        if quiet >= 4:
            return
    raise AssertionError("aggregators did not drain: " + " | ".join(
        i.log.read_text()[-1500:] for i in instances))


def dump(data_dirs: list[Path], tiers=("raw", "10s")) -> dict[tuple, bytes]:
    """Every stored point of every tier, keyed by labels (ids differ between instances)."""
    out: dict[tuple, bytes] = {}
    for d in data_dirs:
        index = EntityIndex(d / "entities.jsonl")
        store = SeriesStore(StoreConfig(path=str(d / "store"), fsync=False))
        try:
            for key, bits in stored_points(store, index, tiers):
                assert key not in out or out[key] == bits, f"conflict at {key}"
                out[key] = bits
        finally:
            store.close()
            index.close()
    return out


@pytest.fixture(scope="module")
def reference(produced, tmp_path_factory):
    bootstrap, prefix, _ = produced
    tmp = tmp_path_factory.mktemp("ref")
    inst = Instance(tmp, "ref", bootstrap, prefix, f"{prefix}-ref")
    inst.start()
    try:
        wait_drained([inst])
    finally:
        inst.stop()
    return dump([inst.data], ("raw", "10s", "1m"))


def assert_same(got: dict, want: dict) -> None:
    """Equality with a readable account of the first differences."""
    if got == want:
        return
    missing = sorted(set(want) - set(got))
    extra = sorted(set(got) - set(want))
    differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])
    raise AssertionError(
        f"{len(missing)} missing, {len(extra)} extra, {len(differ)} different of {len(want)}; "
        f"missing {missing[:5]} extra {extra[:5]} differ "
        f"{[(k, np.frombuffer(got[k]), np.frombuffer(want[k])) for k in differ[:5]]}")


def _levels(d: dict) -> set[str]:
    return {k[1][0] for k in d}


def test_kill9_under_load_then_restart_gives_identical_rollups(produced, reference, tmp_path):
    bootstrap, prefix, n_frames = produced
    inst = Instance(tmp_path, "crash", bootstrap, prefix, f"{prefix}-crash")
    inst.start()
    deadline = time.monotonic() + 180
    while inst.frames() < n_frames / 3:
        assert time.monotonic() < deadline, inst.log.read_text()[-2000:]
        time.sleep(0.02)
    inst.kill9()
    inst.start()
    try:
        wait_drained([inst])
    finally:
        inst.stop()
    got = dump([inst.data], ("raw", "10s", "1m"))
    assert {"gpu", "node", "rack", "row", "cluster"} <= _levels(reference)
    assert len(reference) > 50_000
    assert_same(got, reference)


def test_two_instances_across_a_rebalance_equal_one(produced, reference, tmp_path):
    bootstrap, prefix, n_frames = produced
    group = f"{prefix}-pair"  # no shared folder: partition state moves through Kafka
    a = Instance(tmp_path, "a", bootstrap, prefix, group)
    b = Instance(tmp_path, "b", bootstrap, prefix, group)
    a.start()
    try:
        deadline = time.monotonic() + 180
        while a.frames() < n_frames / 4:
            assert time.monotonic() < deadline, a.log.read_text()[-2000:]
            time.sleep(0.02)
        b.start()
        wait_drained([a, b])
        assert b.frames() > 0, "the second instance never got a partition"
    finally:
        a.stop()
        b.stop()
    got = dump([a.data, b.data], ("raw", "10s"))
    want = {k: v for k, v in reference.items() if k[0] in ("raw", "10s")}
    assert_same(got, want)

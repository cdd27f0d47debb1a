"""The aggregator and the detector across a broker restart and a partition longer than
the session timeout, as real processes on a private real broker.

Both run as ``fleetpulse aggregator`` / ``fleetpulse detector`` under a supervisor that
does what systemd's ``Restart=always`` does in deploy/ (a consumer whose broker is gone
exits non-zero by design: Kafka is the write-ahead log, a restart resumes exactly). While
they consume, the broker is stopped and started again, and later SIGSTOPped for 60 s --
six times Kafka's 10 s session timeout, so the group coordinator expels every member when
it wakes. Afterwards the aggregator's stored points (10 s and raw tiers, every level) must
equal, bit for bit, those of an undisturbed aggregator over the same samples, and the
detector's alert transitions those of an undisturbed detector: none lost, none twice.
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
import uuid
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from kafka_broker import KafkaBroker
from test_aggregator_support import stored_points
from test_detector_support import frame, healthy, read_alerts, timestamps

from aggregator.series_index import EntityIndex
from aggregator.store import SeriesStore, StoreConfig
from detector.features import COL
from detector.service import LAG_SOURCE
from fleetpulse.config import TransportConfig
from fleetpulse.transport import Transport, TransportError, open_transport
from schemas.frame import encode_frame
from schemas.records import AlertRecord
from schemas.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]
STEPS = 600
NODES = ("node-0", "node-1")
PAUSE_S = 60.0
RESTART_SEC = 1.0


def _data() -> np.ndarray:
    data = healthy(STEPS, 8, seed=5)
    data[30, 1, COL["xid"]] = 79.0  # node-0/gpu-1: critical, stays open
    data[200:260, 2, COL["clock_event_reasons"]] = 0x40  # node-0/gpu-2: fires, resolves
    data[STEPS - 20, 7, COL["xid"]] = 48.0  # node-1/gpu-3: the end-of-stream marker
    return data


DATA = _data()


def _frames(lo: int, hi: int) -> list[tuple[bytes, bytes]]:
    ts = timestamps(STEPS)
    out = []
    for s in range(lo, hi, 5):
        for n, node in enumerate(NODES):
            f = frame(node, "rack-1", ts[s:s + 5], DATA[s:s + 5, 4 * n:4 * n + 4], seq=s // 5)
            out.append((encode_frame(f), f.identity.rack_key))
    return out


async def _produce(transport: Transport, topics: Topics, lo: int, hi: int) -> None:
    for value, key in _frames(lo, hi):
        for attempt in range(60):  # the broker just came back: retry until it leads again
            try:
                await transport.send_and_wait(topics.samples, value, key=key)
                break
            except TransportError:
                if attempt == 59:
                    raise
                await asyncio.sleep(1.0)


class Supervised:
    """One fleetpulse command, restarted RESTART_SEC after it exits (systemd-like)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None
        self.exits: list[int] = []
        self._down_since = 0.0

    def start(self) -> None:
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env={**os.environ, **self.env},
                                         stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def tend(self) -> None:
        """Call often: restarts the process RESTART_SEC after it exited."""
        assert self.proc is not None
        rc = self.proc.poll()
        if rc is None:
            return
        now = time.monotonic()
        if not self._down_since:
            self._down_since = now
            self.exits.append(rc)
        elif now - self._down_since >= RESTART_SEC:
            self._down_since = 0.0
            self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(90)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
                raise AssertionError(f"{self.name} ignored SIGTERM: {self.tail()}") from None
            assert self.proc.returncode == 0, self.tail()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def _aggregator(tmp: Path, name: str, bootstrap: str, prefix: str) -> Supervised:
    data = tmp / name
    return Supervised(name, [
        sys.executable, "-m", "fleetpulse", "aggregator", "--bootstrap", bootstrap,
        "--data-dir", str(data), "--listen", "127.0.0.1:0", "--topic-prefix", prefix,
        "--group", f"{prefix}-agg"], {
        "FLEETPULSE_AGGREGATOR_COMMIT_INTERVAL_MS": "300",
        "FLEETPULSE_AGGREGATOR_LATENESS_MS": "5000",
        "FLEETPULSE_AGGREGATOR_ROW_LATENESS_MS": "600000",
        "FLEETPULSE_AGGREGATOR_SAMPLES_PARTITIONS": "2",
        "FLEETPULSE_AGGREGATOR_ROLLUPS_PARTITIONS": "2",
        "FLEETPULSE_AGGREGATOR_MAX_BATCH": "20"}, tmp / f"{name}.log")


def _detector(tmp: Path, name: str, bootstrap: str, prefix: str) -> Supervised:
    config = tmp / f"{name}.toml"
    config.write_text(f"""
state_dir = "{tmp / (name + '-state')}"
checkpoint_interval_s = 1.0
shed_after_s = 0.0
partitions = 2
metrics_port = -1
group_id = "{prefix}-detector"
[transport]
bootstrap = "{bootstrap}"
topic_prefix = "{prefix}"
[model]
trees = 10
sample_size = 64
warmup = 100
[rack]
trees = 8
sample_size = 32
""")
    return Supervised(name, [sys.executable, "-m", "fleetpulse", "detector", "--config",
                             str(config), "--quiet"], {}, tmp / f"{name}.log")


def _metrics(agg: Supervised) -> dict[str, float]:
    """The running aggregator's /metrics ({} while it is down or busy)."""
    ports = re.findall(rb"query API on http://127.0.0.1:(\d+)", agg.log.read_bytes())
    if not ports or agg.proc is None or agg.proc.poll() is not None:
        return {}
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{int(ports[-1])}/metrics",
                                    timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


class Drained:
    """The aggregator owns both partitions, has rolled frames up in this incarnation and
    reports zero lag, four polls in a row (its lag gauge refreshes every commit)."""

    def __init__(self, agg: Supervised) -> None:
        self.agg, self.quiet = agg, 0

    def __call__(self) -> bool:
        m = self._m = _metrics(self.agg)
        ok = (m.get("fleetpulse_aggregator_frames_total", 0) > 0
              and m.get('fleetpulse_aggregator_partitions{stage="rack"}') == 2
              and m.get('fleetpulse_aggregator_consumer_lag_messages{stage="rack"}') == 0
              and m.get('fleetpulse_aggregator_consumer_lag_messages{stage="row"}') == 0)
        self.quiet = self.quiet + 1 if ok else 0
        return self.quiet >= 4


async def _alerts(transport: Transport, topics: Topics) -> list[AlertRecord]:
    return await read_alerts(transport, topics, rounds=8, timeout_ms=800)


def _transitions(alerts: list[AlertRecord]) -> Counter[tuple[str, str, str, str, int]]:
    return Counter((a.id, a.state.value, a.entity, a.source, a.started_ms) for a in alerts
                   if a.source != LAG_SOURCE)


async def _until(pred, procs: list[Supervised], timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while True:
        for p in procs:
            p.tend()
        if await pred():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n" +
                                 "\n".join(f"== {p.name}\n{p.tail()}" for p in procs))
        await asyncio.sleep(0.5)


def _points(data_dir: Path) -> dict[tuple, bytes]:
    store = SeriesStore(StoreConfig(path=str(data_dir / "store"), fsync=False))
    index = EntityIndex(data_dir / "entities.jsonl")
    try:
        return dict(stored_points(store, index, ("10s", "raw")))
    finally:
        index.close()
        store.close()


def _end_marker(alerts: list[AlertRecord]) -> bool:
    return any(a.entity.endswith("node-1/gpu-3") and a.source == "rule:xid" for a in alerts)


async def _run_to_end(transport: Transport, topics: Topics, agg: Supervised,
                      det: Supervised) -> list[AlertRecord]:
    drained = Drained(agg)

    async def done() -> bool:
        return drained() and _end_marker(await _alerts(transport, topics))
    await _until(done, [agg, det], 300, "the end of the stream")
    await asyncio.sleep(3.0)  # the frames after the end marker
    alerts = await _alerts(transport, topics)
    agg.stop()
    det.stop()
    return alerts


async def test_consumers_across_a_broker_restart_and_a_60s_partition_equal_an_undisturbed_run(
        kafka_broker_factory, tmp_path: Path) -> None:
    broker: KafkaBroker = kafka_broker_factory()
    bootstrap = broker.bootstrap
    hit, ref = Topics(f"hit-{uuid.uuid4().hex[:8]}"), Topics(f"ref-{uuid.uuid4().hex[:8]}")
    transport = open_transport(TransportConfig(bootstrap=bootstrap))
    await transport.start()
    for t in (hit, ref):
        await transport.ensure_topics({t.samples: 2, t.events: 2, t.rollups: 2, t.alerts: 2,
                                       t.deadletter: 1})
    agg = _aggregator(tmp_path, "agg-hit", bootstrap, hit.prefix)
    det = _detector(tmp_path, "det-hit", bootstrap, hit.prefix)
    try:
        await _produce(transport, hit, 0, 200)
        agg.start()
        det.start()

        async def first_alert() -> bool:
            return _metrics(agg).get("fleetpulse_aggregator_frames_total", 0) >= 40 and any(
                a.source == "rule:xid" for a in await _alerts(transport, hit))
        await _until(first_alert, [agg, det], 180, "both consumers to be working")

        # 1. the broker goes away and comes back (same ports and data)
        broker.stop()
        for _ in range(10):
            agg.tend()
            det.tend()
            await asyncio.sleep(0.5)
        broker.start()
        await _produce(transport, hit, 200, 400)

        # 2. a partition longer than the session timeout: the broker frozen for 60 s
        pid = int((broker.state_dir / "broker.pid").read_text().strip())
        os.kill(pid, signal.SIGSTOP)
        try:
            t_end = time.monotonic() + PAUSE_S
            while time.monotonic() < t_end:
                agg.tend()
                det.tend()
                await asyncio.sleep(0.5)
        finally:
            os.kill(pid, signal.SIGCONT)
        await _produce(transport, hit, 400, STEPS)
        hit_alerts = await _run_to_end(transport, hit, agg, det)
        restarts = {"aggregator": agg.exits, "detector": det.exits}

        # the undisturbed run over the same samples
        await _produce(transport, ref, 0, STEPS)
        agg_ref = _aggregator(tmp_path, "agg-ref", bootstrap, ref.prefix)
        det_ref = _detector(tmp_path, "det-ref", bootstrap, ref.prefix)
        agg_ref.start()
        det_ref.start()
        ref_alerts = await _run_to_end(transport, ref, agg_ref, det_ref)
        assert agg_ref.exits == [] and det_ref.exits == []
    finally:
        for p in (agg, det):
            if p.proc is not None and p.proc.poll() is None:
                os.killpg(p.proc.pid, signal.SIGKILL)
        await transport.close()

    print("restarts (exit codes) across the outages:", restarts)
    got, want = _points(tmp_path / "agg-hit"), _points(tmp_path / "agg-ref")
    assert len(want) > 10_000
    assert got.keys() == want.keys(), (len(got), len(want))
    assert got == want, sum(1 for k in want if got[k] != want[k])
    hit_t, ref_t = _transitions(hit_alerts), _transitions(ref_alerts)
    assert max(hit_t.values()) == 1, hit_t.most_common(3)  # no transition twice
    assert hit_t == ref_t, (hit_t - ref_t, ref_t - hit_t)
    assert len(ref_t) >= 3

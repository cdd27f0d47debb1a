"""Three aggregators and two detectors sharing nothing but the broker, two of them killed.

Real processes (``fleetpulse aggregator`` / ``fleetpulse detector``) on the session's real
broker, each with its own temporary data directory; 24 racks over three minutes of samples
that cross midnight, so every tier (raw, 10 s, 1 min, 1 h, 1 d) closes windows. Mid-run one
aggregator and one detector are killed with SIGKILL: the group moves their partitions to
the survivors, which restore the partitions' state from the changelog topics (no shared
folder exists) and go on; later the killed ones restart on their own data directories and
rejoin. Then every point of every tier of every series, read through one instance's
fleet-wide query API (which reads every instance's store), must equal what a single
undisturbed aggregator stored over the same samples, and no alert transition may have
been announced twice.

Then the same through a real Prometheus (Debian's, :mod:`prometheus`) with one
``remote_read`` entry per aggregator instance: each instance answers only from its own
store, Prometheus merges the series of equal labels, and every point of every tier of every
series (each tier read by a Prometheus whose ``remote_read`` URLs name it), and every GPU's
raw samples as Prometheus reads them by default, must equal the undisturbed instance's, bit
for bit (a raw sample at its own time, which the query API shows at the end of its 1 s step).
"""

from __future__ import annotations

import asyncio
import os
import pprint
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest
from prometheus import Prometheus, config, needs_prometheus
from test_detector_support import frame, healthy, read_alerts

from aggregator.config import AggregatorConfig
from aggregator.service import AggregatorService
from detector.config import DetectorConfig
from detector.features import COL
from detector.service import LAG_SOURCE
from detector.service import warm_up as warm_up_detector
from fleetpulse.config import TransportConfig
from fleetpulse.transport import Transport, open_transport
from schemas.frame import encode_frame
from schemas.records import AlertRecord
from schemas.topics import Topics

pytestmark = [pytest.mark.kafka, pytest.mark.slow,
              pytest.mark.timeout(600)]
"""3 to 4 minutes here, 30-70 s of it Prometheus reading every tier; past the
default 300 s once on the shared 2-core machine at load 12 (its own waits allow 630 s)."""

ROOT = Path(__file__).resolve().parents[1]
RACKS = 24
GPUS = 2
STEPS = 180
TICKS = 5
DAY_MS = 86_400_000
START_MS = 19_675 * DAY_MS + DAY_MS - 60_000
"""23:59:00: the three minutes cross an hour and a day boundary."""
PARTITIONS = 6
PACE_S = 0.2
TIERS = {"raw": 1000, "10s": 10_000, "1m": 60_000, "1h": 3_600_000, "1d": DAY_MS}
STRADDLING = {"raw": 10_000, "10s": 60_000}
"""Steps that merge several stored windows (or samples), which after a rebalance lie in
different instances' stores: sums and counts add, avg, stddev and quantiles recombine."""
XID_AT = {3: 15, 10: 110, 17: 160, 22: 40}
"""rack -> step of an XID 79 on its GPU 1 (critical, stays open): alerts before the kill,
between the kill and the restart, after it, and one open across the kill."""


def _data(rack: int) -> np.ndarray:
    data = healthy(STEPS, GPUS, seed=rack)
    if rack in XID_AT:
        data[XID_AT[rack], 1, COL["xid"]] = 79.0
    return data


DATA = [_data(r) for r in range(RACKS)]


def _frames(lo: int, hi: int) -> list[tuple[bytes, bytes]]:
    ts = START_MS + 1000 * np.arange(STEPS, dtype=np.int64)
    out = []
    for s in range(lo, hi, TICKS):
        for r in range(RACKS):
            f = frame(f"node-{r:02d}", f"rack-{r:02d}", ts[s:s + TICKS],
                      DATA[r][s:s + TICKS], seq=s // TICKS, row=f"row-{r % 3}")
            out.append((encode_frame(f), f.identity.rack_key))
    return out


async def _produce(transport: Transport, topics: list[Topics], lo: int, hi: int) -> None:
    """Steps [lo, hi) as they would arrive live: a frame per rack every PACE_S, into every
    prefix at once. (The row stage closes a row window once every rack it has seen moved
    past it; a backlog consumed partition by partition would make a rack's first rollups
    late at the row stage in one run and not in another.)"""
    for s in range(lo, hi, TICKS):
        futures = [await transport.send(t.samples, v, key=k)
                   for t in topics for v, k in _frames(s, s + TICKS)]
        await asyncio.gather(*futures)
        await asyncio.sleep(PACE_S)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """One fleetpulse command with its log; killed or stopped by the test."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.argv, self.env, self.log = name, argv, env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as fh:
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env={**os.environ, **self.env},
                                         stdout=fh, stderr=subprocess.STDOUT,
                                         start_new_session=True)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                rc = self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.kill()
                raise AssertionError(f"{self.name} ignored SIGTERM: {self.tail()}") from None
            assert rc == 0, self.tail()

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


def _aggregator(tmp: Path, i: int, bootstrap: str, prefix: str, ports: list[int]) -> Proc:
    return Proc(f"agg-{i}", [
        sys.executable, "-m", "fleetpulse", "aggregator", "--bootstrap", bootstrap,
        "--data-dir", str(tmp / f"agg-{i}"), "--listen", f"127.0.0.1:{ports[i]}",
        "--topic-prefix", prefix, "--group", f"{prefix}-agg"], {
        **_AGG_ENV,
        "FLEETPULSE_AGGREGATOR_PEERS": ",".join(f"http://127.0.0.1:{p}" for p in ports)},
        tmp / f"agg-{i}.log")


_AGG_ENV = {
    "FLEETPULSE_AGGREGATOR_COMMIT_INTERVAL_MS": "300",
    "FLEETPULSE_AGGREGATOR_LATENESS_MS": "5000",
    "FLEETPULSE_AGGREGATOR_ROW_LATENESS_MS": "600000",
    # Event time runs 25x wall time here: an instance a few seconds slower to start puts
    # its racks' first rollups a minute or more (event time) behind their siblings'.
    "FLEETPULSE_AGGREGATOR_ROW_SETTLE_MS": "150000",
    "FLEETPULSE_AGGREGATOR_SAMPLES_PARTITIONS": str(PARTITIONS),
    "FLEETPULSE_AGGREGATOR_ROLLUPS_PARTITIONS": "3",
    "FLEETPULSE_AGGREGATOR_MAX_FUTURE_MS": "0",
    "FLEETPULSE_AGGREGATOR_MAX_SERIES": "1000000",
    "FLEETPULSE_AGGREGATOR_MAX_BATCH": "50"}


def _detector(tmp: Path, i: int, bootstrap: str, prefix: str) -> Proc:
    config = tmp / f"det-{i}.toml"
    config.write_text(f"""
state_dir = "{tmp / f'det-{i}-state'}"
checkpoint_interval_s = 1.0
shed_after_s = 0.0
partitions = {PARTITIONS}
metrics_port = -1
group_id = "{prefix}-detector"
[transport]
bootstrap = "{bootstrap}"
topic_prefix = "{prefix}"
[model]
trees = 8
sample_size = 32
warmup = 60
[rack]
trees = 4
sample_size = 16
""")
    return Proc(f"det-{i}", [sys.executable, "-m", "fleetpulse", "detector", "--config",
                             str(config), "--quiet"], {}, tmp / f"det-{i}.log")


def _get(port: int, path: str, params: dict[str, str] | None = None) -> Any:
    url = f"http://127.0.0.1:{port}{path}"
    if params:
        url += "?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=60) as r:
        body = r.read()
    return orjson.loads(body) if path.startswith("/api/") else body.decode()


def _metrics(port: int) -> dict[str, float]:
    try:
        text = _get(port, "/metrics")
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def _settled(ports: list[int], live: list[int]) -> bool:
    """The live instances own every partition of both stages between them and are not
    behind (a frame was rolled up by each since its start)."""
    ms = [_metrics(ports[i]) for i in live]
    if not all(ms):
        return False
    return (sum(m.get('fleetpulse_aggregator_partitions{stage="rack"}', 0) for m in ms)
            == PARTITIONS
            and sum(m.get('fleetpulse_aggregator_partitions{stage="row"}', 0) for m in ms) == 3
            and all(m.get('fleetpulse_aggregator_consumer_lag_messages{stage="rack"}', 1) == 0
                    and m.get('fleetpulse_aggregator_consumer_lag_messages{stage="row"}', 1) == 0
                    for m in ms))


async def _settled_now(ports: list[int], live: list[int]) -> bool:
    """:func:`_settled` in a thread: the reference aggregator shares this event loop, and
    its heartbeats must not wait for these HTTP calls."""
    return await asyncio.to_thread(_settled, ports, live)


def _owns_all(svc: AggregatorService) -> bool:
    """The reference owns every partition of its rack and row stages (its workload loops,
    in groups of their own, are not what the comparison is about)."""
    owned = {lp.name: len(lp.owned) for lp in svc.loops}
    return owned.get("rack") == PARTITIONS and owned.get("row") == 3


async def _alerts(transport: Transport, topics: Topics) -> list[AlertRecord]:
    return await read_alerts(transport, topics, rounds=6, timeout_ms=700)


def _xid_racks(alerts: list[AlertRecord]) -> set[int]:
    return {int(a.entity.split("/")[2][5:]) for a in alerts if a.source == "rule:xid"}


async def _until(pred: Any, procs: list[Proc], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        for p in procs:
            assert p.alive(), f"{p.name} exited:\n{p.tail()}"
        if await pred():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}:\n" +
                                 "\n".join(f"== {p.name}\n{p.tail()}" for p in procs))
        await asyncio.sleep(0.3)


def _span(step: int) -> tuple[int, int]:
    """[start, end] in ms of the whole run on a grid of ``step``."""
    return (START_MS - START_MS % step) + step, START_MS + STEPS * 1000 + step + 20_000


def _every_point(query: Any) -> dict[tuple[str, tuple[tuple[str, str], ...]], list[Any]]:
    """Every point of every tier: one range query per tier at its own resolution, so each
    output point is exactly one stored window (or raw sample)."""
    out = {}
    for name, tier, step in [*((t, t, r) for t, r in TIERS.items()),
                             *((f"{t}/{s // 1000}s", t, s) for t, s in STRADDLING.items())]:
        start, end = _span(step)
        data = query({"query": '{__name__=~"fleetpulse_.+", agg=~".+"}',
                      "start": str(start / 1000), "end": str(end / 1000),
                      "step": str(step / 1000), "resolution": tier})
        assert data["status"] == "success", data
        for s in data["data"]["result"]:
            out[(name, tuple(sorted(s["metric"].items())))] = s["values"]
    return out


HEATMAP = 'fleetpulse_gpu_temperature_celsius{level="gpu"}'
"""The web page's whole-fleet heatmap (one instant query): every GPU's newest 10 s window,
or with ``resolution=raw`` its newest sample."""


def _heatmap(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], tuple[float, str]]:
    """The heatmap's two queries at the run's end, as one instance's query API answers."""
    out = {}
    for tier in ("10s", "raw"):
        data = _get(port, "/api/v1/query", {
            "query": HEATMAP, "time": str((START_MS + STEPS * 1000 + 20_000) / 1000),
            **({"resolution": tier} if tier == "raw" else {})})
        assert data["status"] == "success", data
        for s in data["data"]["result"]:
            out[(tier, tuple(sorted(s["metric"].items())))] = tuple(s["value"])
    return out


PROM_READS = {**{t: (t, '{__name__=~"fleetpulse_.+", agg=~".+"}', 0) for t in TIERS},
              "raw samples": ("raw", '{__name__=~"fleetpulse_.+", agg="raw"}', TIERS["raw"])}
"""name -> (tier, selector, earlier) of each read through Prometheus: every series of every
tier, the tier fixed by the ``resolution`` parameter of the ``remote_read`` URLs, each
sample compared with the query API's point at the same time at step = the tier's
resolution; and every GPU's raw samples as Prometheus reads them by default (``agg="raw"``
at their own times), which is ``earlier`` ms before the query API shows them: a query
step's point at t reduces the stored points in [t - step, t), so at 1 s steps the raw
sample at t - 1 s is shown at t. (A window's stamp is its end in both.)"""

Points = dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[int, str]]]


def _exact(values: list[Any], earlier: int = 0) -> list[tuple[int, str]]:
    """[[seconds, "value"], ...] of either API as (ms - ``earlier``, repr of the float):
    equal only for equal timestamps and equal values (NaN included)."""
    return [(round(float(t) * 1000) - earlier, repr(float(v))) for t, v in values]


async def _through_prometheus(tmp: Path, ports: list[int]) -> Points:
    """Every series over the whole run, read by a real Prometheus with one ``remote_read``
    entry per aggregator instance (each answers from its own store only; Prometheus merges
    the series of equal labels), one Prometheus per tier. A range selector at the run's end
    returns the stored points themselves, at their own times, with no lookback filling.
    The range starts half a step before the first point, so a range closed or open at its
    start (Prometheus 2 or 3) selects the same points."""
    out: Points = {}
    for tier in TIERS:
        prom = Prometheus(tmp / f"prom-{tier}", config(
            [f"http://127.0.0.1:{p}/api/v1/read?resolution={tier}" for p in ports]))
        await prom.start()
        try:
            for name, (read_tier, selector, earlier) in PROM_READS.items():
                if read_tier != tier:
                    continue
                start, end = (t - earlier for t in _span(TIERS[tier]))
                data = await prom.api(
                    "/api/v1/query", query=f"{selector}[{end - start + TIERS[tier] // 2}ms]",
                    time=repr(end / 1000))
                assert data["resultType"] == "matrix", data
                for s in data["result"]:
                    out[(name, tuple(sorted(s["metric"].items())))] = _exact(s["values"])
        finally:
            prom.stop()
    return out


COUNTERS = ("late_samples", "duplicate_frames", "future_samples", "dead_letters",
            "fleet_peer_errors", "store_rewrites", "windows_closed", "frames")
"""The counters a failed comparison reports per instance: what each one dropped, skipped
or rewrote is what tells a lost window's cause apart."""


def _counters(ports: list[int]) -> list[dict[str, float]]:
    out = []
    for m in (_metrics(p) for p in ports):
        out.append({name: sum(v for k, v in m.items()
                              if k.startswith(f"fleetpulse_aggregator_{name}"))
                    for name in COUNTERS})
    return out


def _differences(got: Points, want: Points, counters: list[dict[str, float]]) -> str:
    """Where two sets of points differ, summed up for a failure message: how many series
    per tier, which racks, per tier the timestamps only one side has or where the values
    differ (the first few), and each instance's counters (agg-0, agg-1, agg-2, the
    reference). A string, so that pytest prints all of it."""
    bad = [k for k in want.keys() | got.keys() if got.get(k) != want.get(k)]
    tiers: Counter[str] = Counter(name for name, _ in bad)
    racks = sorted({dict(labels).get("rack", "-") for _, labels in bad})
    stamps: dict[str, Counter[str]] = {}
    for name, labels in bad:
        g, w = dict(got.get((name, labels), [])), dict(want.get((name, labels), []))
        c = stamps.setdefault(name, Counter())
        for t in sorted(g.keys() | w.keys()):
            if t not in g:
                c[f"{t} missing"] += 1
            elif t not in w:
                c[f"{t} extra"] += 1
            elif g[t] != w[t]:
                c[f"{t} differs"] += 1
    return pprint.pformat({"series": len(bad), "by_tier": dict(tiers), "racks": racks,
                           "stamps": {k: v.most_common(4) for k, v in stamps.items()},
                           "counters": counters}, width=100)


def _chosen(points: dict[tuple[str, tuple[tuple[str, str], ...]], list[Any]]) -> Points:
    """The reference's points as :func:`_through_prometheus` reads them: every series of
    every tier, less the query API's NaN points (remote read sends no sample for a step
    without a value); the GPUs' raw samples once more, at their own times."""
    out: Points = {}
    for (name, labels), values in points.items():
        for read, (tier, _, earlier) in PROM_READS.items():
            if tier != name or (earlier and dict(labels)["agg"] != "raw"):
                continue
            kept = [v for v in _exact(values, earlier) if v[1] != "nan"]
            if kept:
                out[(read, labels)] = kept
    return out


@needs_prometheus
async def test_three_aggregators_two_detectors_kill_9_and_rejoin_equal_one_instance(
        kafka_bootstrap: str, tmp_path: Path) -> None:
    bootstrap = kafka_bootstrap
    hit, ref = Topics(f"mi-{uuid.uuid4().hex[:8]}"), Topics(f"mr-{uuid.uuid4().hex[:8]}")
    transport = open_transport(TransportConfig(bootstrap=bootstrap))
    await transport.start()
    for t in (hit, ref):
        await transport.ensure_topics({t.samples: PARTITIONS, t.events: PARTITIONS,
                                       t.rollups: 3, t.alerts: PARTITIONS, t.deadletter: 1})
    ports = [_free_port() for _ in range(3)]
    aggs = [_aggregator(tmp_path, i, bootstrap, hit.prefix, ports) for i in range(3)]
    dets = [_detector(tmp_path, i, bootstrap, hit.prefix) for i in range(2)]
    everyone = aggs + dets
    # The single undisturbed instance, in this process, over the same samples.
    ref_cfg = AggregatorConfig(
        transport=TransportConfig(bootstrap=bootstrap, topic_prefix=ref.prefix),
        data_dir=str(tmp_path / "ref"), listen="127.0.0.1:0", group_id=f"{ref.prefix}-agg",
        commit_interval_ms=300, lateness_ms=5000, row_lateness_ms=600_000, row_settle_ms=150_000,
        samples_partitions=PARTITIONS, rollups_partitions=3, max_future_ms=0,
        max_series=1_000_000, max_batch=50, fsync=False)
    # max_batch as the instances': a stage closes due windows only while batches come (a
    # budget per batch), so one huge batch at the end of the data would leave some open.
    ref_svc = AggregatorService(ref_cfg)
    ref_task: asyncio.Task[None] | None = None
    stop_errors: list[str] = []
    try:
        # The numba kernels compiled once, here, into numba's cache before five processes
        # start: on a fresh checkout five concurrent cold compiles on a busy 2-core machine
        # outlasted the join timeout (and a process in its warm-up cannot act on SIGTERM).
        await asyncio.to_thread(warm_up_detector, DetectorConfig())
        await ref_svc.start()  # the aggregator's kernels
        for p in everyone:
            p.start()
        ref_task = asyncio.create_task(ref_svc.run())

        async def all_joined() -> bool:
            return (await _settled_now(ports, [0, 1, 2])
                    and _owns_all(ref_svc))
        await _until(all_joined, everyone, 150, "every aggregator to join")
        await _produce(transport, [hit, ref], 0, 80)

        async def all_working() -> bool:
            return await _settled_now(ports, [0, 1, 2]) and {3, 22} <= _xid_racks(
                await _alerts(transport, hit))
        await _until(all_working, everyone, 150, "every instance to be working")

        aggs[1].kill()  # mid-run, with open windows and unflushed data
        dets[1].kill()
        await _produce(transport, [hit, ref], 80, 140)
        live = [aggs[0], aggs[2], dets[0]]

        async def survivors_took_over() -> bool:
            return (await _settled_now(ports, [0, 2])
                    and 10 in _xid_racks(await _alerts(transport, hit)))
        await _until(survivors_took_over, live, 120, "the survivors to take over")

        aggs[1].start()  # the same data directories: they rejoin
        dets[1].start()
        await _produce(transport, [hit, ref], 140, STEPS)

        async def rejoined() -> bool:
            ms = await asyncio.to_thread(lambda: [_metrics(p) for p in ports])
            return (await _settled_now(ports, [0, 1, 2])
                    and ms[1].get('fleetpulse_aggregator_partitions{stage="rack"}', 0) > 0
                    and 17 in _xid_racks(await _alerts(transport, hit)))
        await _until(rejoined, everyone, 150, "the killed instances to rejoin")

        async def ref_done() -> bool:
            return (_owns_all(ref_svc)
                    and await ref_svc.behind() == 0 and ref_svc.rack.stats.frames > 0)
        await _until(ref_done, everyone, 60, "the reference to drain")
        await asyncio.sleep(1.0)  # one more durable cycle everywhere

        got = await asyncio.to_thread(_every_point, lambda q: _get(ports[0],
                                                                  "/api/v1/query_range", q))
        assert ref_svc.port is not None
        ref_port = ref_svc.port
        want = await asyncio.to_thread(_every_point, lambda q: _get(ref_port,
                                                                   "/api/v1/query_range", q))
        heat_got = await asyncio.to_thread(_heatmap, ports[0])
        heat_want = await asyncio.to_thread(_heatmap, ref_port)
        prom_s = time.monotonic()
        prom_got = await _through_prometheus(tmp_path, ports)
        prom_s = time.monotonic() - prom_s
        fleet_metrics = _metrics(ports[0])
        counters = await asyncio.to_thread(_counters, [*ports, ref_port])
        alerts = await _alerts(transport, hit)
    finally:
        for p in everyone:  # every one stopped, and a failure above is not hidden by this
            if p.alive():
                try:
                    p.stop()
                except AssertionError as e:
                    stop_errors.append(str(e))
        ref_svc.stop()
        if ref_task is not None:
            await ref_task
        await transport.close()
    assert not stop_errors, stop_errors

    points = Counter({name: 0 for name in TIERS})
    for (name, _), values in want.items():
        points[name] += len(values)
    print("points per tier:", dict(points), "series:", len(want))
    assert all(n > 0 for n in points.values()) and len(points) == len(TIERS) + 2, points
    assert got.keys() == want.keys(), (len(got), len(want), sorted(want.keys() - got.keys())[:3])
    bad = [k for k in want if got[k] != want[k]]
    assert not bad, _differences({k: _exact(v) for k, v in got.items()},
                                 {k: _exact(v) for k, v in want.items()}, counters)
    assert len(heat_want) == 2 * RACKS * GPUS and heat_got == heat_want, (
        len(heat_got), len(heat_want), sorted(heat_got.items() ^ heat_want.items())[:2])
    prom_want = _chosen(want)
    prom_points = Counter({read: 0 for read in PROM_READS})
    for (tier, _), values in prom_want.items():
        prom_points[tier] += len(values)
    print("through prometheus, points per tier:", dict(prom_points), "series:", len(prom_want),
          f"in {prom_s:.1f} s")
    racks = {dict(k).get("rack", "") for _, k in prom_want} - {""}
    assert all(n > 0 for n in prom_points.values()) and len(racks) == RACKS, prom_points
    assert prom_got.keys() == prom_want.keys(), (
        len(prom_got), len(prom_want), sorted(prom_want.keys() ^ prom_got.keys())[:3])
    assert prom_got == prom_want, _differences(prom_got, prom_want, counters)
    assert fleet_metrics["fleetpulse_aggregator_fleet_conflicts_total"] == 0
    transitions = Counter((a.id, a.state.value) for a in alerts if a.source != LAG_SOURCE)
    twice = [(a.source, a.entity, a.state.value, a.started_ms, a.updated_ms, a.score)
             for a in alerts if transitions[(a.id, a.state.value)] > 1]
    assert not twice, twice
    assert _xid_racks(alerts) == set(XID_AT)

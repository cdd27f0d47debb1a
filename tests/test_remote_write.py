"""Remote write into a real VictoriaMetrics, across a receiver outage and a writer restart.

The rack stage rolls up a small fleet into a real store whose appends feed the
:class:`RemoteWriter`; Debian's VictoriaMetrics (loopback, temp dir) receives. Half-way the
receiver is stopped: batches queue on disk, requests fail and are counted; the writer is
then closed and a new one opened on the same queue (a restarted aggregator), the receiver
started again; the queue drains. Read back with VM's ``/api/v1/export``, every point the
store holds for the chosen levels and tiers is there once, with its value, and nothing else.
"""

from __future__ import annotations

import asyncio
import math
import time

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from test_aggregator_support import T0, make_fleet, process_all
from victoria import VictoriaMetrics, needs_victoria

from aggregator import prom_wire
from aggregator.rack_stage import RackStage
from aggregator.remote_write import RemoteWriteCollector, RemoteWriteConfig, RemoteWriter
from aggregator.series_index import EntityIndex
from aggregator.series_layout import AGG_CODES, AGG_SLOTS, split_series_id
from aggregator.store import SeriesStore, StoreConfig
from fleetpulse.commands.aggregator import load_aggregator_config
from fleetpulse.config import ConfigError
from schemas.catalog import BY_ID

CHOSEN = ("rack:10s", "node:10s", "gpu:1m")


def expected(store: SeriesStore, index: EntityIndex) -> dict[tuple, float]:
    """Every stored point of the chosen (level, tier)s, keyed as VM exports them."""
    out = {}
    for item in CHOSEN:
        level, tier = item.split(":")
        width = store.tiers[tier].resolution_ms
        sids = np.sort(store.series_ids(tier))
        r = store.read(tier, sids, 0, 1 << 62)
        for i, sid in enumerate(r.series_ids.tolist()):
            eid, metric, agg = split_series_id(sid)
            labels = index.labels(eid)
            if labels["level"] != level or sid % AGG_SLOTS == AGG_CODES["sketch"]:
                continue
            labels |= {"__name__": BY_ID[metric].name, "agg": agg, "tier": tier}
            ts, vals = r.series(i)
            for t, v in zip(ts.tolist(), vals.tolist(), strict=True):
                if not math.isnan(v):
                    out[(tuple(sorted(labels.items())), t + width)] = v
    return out


async def _until(pred, timeout_s: float, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.1)


@needs_victoria
async def test_remote_write_reaches_victoria_metrics_across_its_restart(tmp_path):
    prom_wire.warm_up()
    vm = VictoriaMetrics(tmp_path / "vm")
    await vm.start()
    fl = make_fleet(n_racks=2, nodes_per_rack=2, gpus=4, seconds=240, partitions=2)
    store = SeriesStore(StoreConfig(path=str(tmp_path / "store"), fsync=False))
    index = EntityIndex(tmp_path / "entities.jsonl")
    cfg = RemoteWriteConfig(url=vm.write_url, series=CHOSEN, batch_samples=4000,
                            retry_initial_s=0.05, retry_max_s=0.3, timeout_s=5)
    writer = RemoteWriter(cfg, store, index, tmp_path / "queue")
    store.on_append = writer.offer
    stage = RackStage(store, index, topic="t.samples", lateness_ms=5000)
    try:
        stage.process([m for m in fl.messages if m.timestamp_ms < T0 + 120_000])
        writer.seal()
        task = asyncio.create_task(writer.run())
        await _until(lambda: writer.stats.sent_samples == writer.stats.queued_samples > 0, 30,
                     "first half sent")
        first = writer.stats.sent_samples

        vm.stop()
        stage.process([m for m in fl.messages if m.timestamp_ms >= T0 + 120_000])
        writer.seal()
        await _until(lambda: writer.stats.failed_requests >= 2, 30, "requests fail while down")
        assert writer.queue.stats.pending_frames > 0 and writer.stats.sent_samples == first
        writer.stop()
        await task
        writer.close()

        again = RemoteWriter(cfg, store, index, tmp_path / "queue")  # a restarted aggregator
        store.on_append = again.offer
        assert again.queue.stats.pending_frames > 0
        await vm.start()
        task = asyncio.create_task(again.run())
        await _until(lambda: again.queue.stats.pending_frames == 0, 30, "queue drained")
        again.stop()
        await task
        registry = CollectorRegistry()
        registry.register(RemoteWriteCollector(again))
        text = generate_latest(registry).decode()
        assert f"fleetpulse_remote_write_sent_samples_total {float(again.stats.sent_samples)}" \
            in text and again.stats.sent_samples > 0
        assert "fleetpulse_remote_write_queue_batches 0.0" in text
        again.close()

        rows = await vm.export('{__name__=~"fleetpulse_.+"}')
        got: dict[tuple, float] = {}
        for row in rows:
            labels = tuple(sorted(row["metric"].items()))
            for t, v in zip(row["timestamps"], row["values"], strict=True):
                got[(labels, t)] = v
        want = expected(store, index)
        levels = {dict(k[0])["level"] for k in want}
        assert levels == {"rack", "node", "gpu"} and len(want) > 1000
        assert set(got) == set(want)
        for k, v in want.items():  # VM keeps values as decimals: 15 significant digits
            assert got[k] == pytest.approx(v, rel=1e-13, abs=1e-300), k
        assert max(t for _, t in want) > T0 + 200_000, "the second half is in too"
    finally:
        vm.stop()
        index.close()
        store.close()


def test_a_full_queue_drops_the_oldest_batches_and_counts_them(tmp_path):
    fl = make_fleet(n_racks=4, nodes_per_rack=2, gpus=8, seconds=240, partitions=2)
    store = SeriesStore(StoreConfig(path=str(tmp_path / "store"), fsync=False))
    index = EntityIndex(tmp_path / "entities.jsonl")
    cfg = RemoteWriteConfig(url="http://127.0.0.1:9/api/v1/write",
                            series=("gpu:raw", "gpu:10s"),
                            queue_max_bytes=128 << 10, batch_samples=2000)
    writer = RemoteWriter(cfg, store, index, tmp_path / "queue")
    store.on_append = writer.offer
    try:
        process_all(RackStage(store, index, topic="t.samples", lateness_ms=5000), fl.messages)
        writer.seal()
        assert writer.queue.stats.dropped_frames > 0
        assert writer.queue.total_bytes <= 128 << 10
        registry = CollectorRegistry()
        registry.register(RemoteWriteCollector(writer))
        text = generate_latest(registry).decode()
        line = next(x for x in text.splitlines()
                    if x.startswith("fleetpulse_remote_write_dropped_batches_total "))
        assert float(line.split()[-1]) == writer.queue.stats.dropped_frames
    finally:
        writer.close()
        index.close()
        store.close()


def test_remote_write_config_from_toml_and_environment(tmp_path):
    path = tmp_path / "aggregator.toml"
    path.write_text('[remote_write]\nurl = "http://127.0.0.1:8428/api/v1/write"\n')
    cfg = load_aggregator_config(path)
    assert cfg.remote_write.url.endswith("/api/v1/write")
    assert cfg.remote_write.series == ("rack:10s", "row:10s", "cluster:10s", "gpu:1m")
    path.write_text('[remote_write]\nseries = ["shelf:10s"]\n')
    with pytest.raises(ConfigError, match=r"remote_write\.series"):
        load_aggregator_config(path)

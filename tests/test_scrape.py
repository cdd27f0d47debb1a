"""One real Prometheus scrapes every component's /metrics and reads the aggregator back.

The agent (synthetic GPUs), the aggregator and the detector run as real processes on the
session's Kafka broker; Debian's Prometheus scrapes the three /metrics endpoints and has
the aggregator as its ``remote_read`` store. Checked: every target is up, ``promtool check
metrics`` finds nothing to flag in any exposition, and the GPUs the agent samples come
back through Prometheus' PromQL from the aggregator's raw tier. The aggregator also
remote-writes its GPUs' 10 s tier to a real VictoriaMetrics (the service's wiring: the
queue sealed at each durability cycle, the sender task, the counters on /metrics).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
import pytest
from alertmanager import free_port
from prometheus import PROMTOOL, Prometheus, config, needs_prometheus
from victoria import VictoriaMetrics, needs_victoria

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[1]


def _spawn(argv: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "fleetpulse", *argv], cwd=ROOT,
                                env={**os.environ, **env}, stdout=fh,
                                stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def _until(check, timeout_s: float, what: str, logs: list[Path]):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = await check()
        if last:
            return last
        await asyncio.sleep(0.5)
    tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-1500:]}" for p in logs)
    raise AssertionError(f"{what} not within {timeout_s} s (last: {last})\n{tails}")


@needs_prometheus
@needs_victoria
async def test_prometheus_scrapes_every_component_and_reads_the_aggregator(
        kafka_bootstrap: str, unique_prefix: str, tmp_path: Path) -> None:
    vm = VictoriaMetrics(tmp_path / "vm")
    await vm.start()
    ports = {"agent": free_port(), "aggregator": free_port(), "detector": free_port()}
    logs = {name: tmp_path / f"{name}.log" for name in ports}
    (tmp_path / "detector.toml").write_text(f"""
state_dir = "{tmp_path / 'detector-state'}"
partitions = 2
metrics_port = {ports['detector']}
group_id = "{unique_prefix}-detector"
[transport]
bootstrap = "{kafka_bootstrap}"
topic_prefix = "{unique_prefix}"
""")
    procs = [
        _spawn(["aggregator", "--bootstrap", kafka_bootstrap, "--data-dir",
                str(tmp_path / "agg"), "--listen", f"127.0.0.1:{ports['aggregator']}",
                "--topic-prefix", unique_prefix, "--group", f"{unique_prefix}-agg"],
               {"FLEETPULSE_AGGREGATOR_LATENESS_MS": "1000",
                "FLEETPULSE_AGGREGATOR_COMMIT_INTERVAL_MS": "500",
                "FLEETPULSE_AGGREGATOR_SAMPLES_PARTITIONS": "2",
                "FLEETPULSE_AGGREGATOR_REMOTE_WRITE__URL": vm.write_url,
                "FLEETPULSE_AGGREGATOR_REMOTE_WRITE__SERIES": "gpu:10s"}, logs["aggregator"]),
        _spawn(["detector", "--config", str(tmp_path / "detector.toml"), "--quiet"], {},
               logs["detector"]),
        _spawn(["agent"], {
            "FLEETPULSE_AGENT_IDENTITY__CLUSTER": "c1", "FLEETPULSE_AGENT_IDENTITY__ROW": "r1",
            "FLEETPULSE_AGENT_IDENTITY__RACK": "rack-07",
            "FLEETPULSE_AGENT_IDENTITY__NODE": "node-3",
            "FLEETPULSE_AGENT_SOURCE__NAME": "synthetic",
            "FLEETPULSE_AGENT_SAMPLING__INTERVAL_S": "0.5",
            "FLEETPULSE_AGENT_SPOOL__DIRECTORY": str(tmp_path / "spool"),
            "FLEETPULSE_AGENT_METRICS__PORT": str(ports["agent"]),
            "FLEETPULSE_AGENT_TRANSPORT__BOOTSTRAP": kafka_bootstrap,
            "FLEETPULSE_AGENT_TRANSPORT__TOPIC_PREFIX": unique_prefix}, logs["agent"]),
    ]
    targets = {name: [f"127.0.0.1:{port}"] for name, port in ports.items()}
    prom = Prometheus(tmp_path / "prom", config(
        [f"http://127.0.0.1:{ports['aggregator']}/api/v1/read"], targets))
    await prom.start()
    try:
        async def all_up():
            data = await prom.api("/api/v1/targets")
            health = {t["labels"]["job"]: t["health"] for t in data["activeTargets"]}
            return health if health == dict.fromkeys(ports, "up") else None

        await _until(all_up, 90, "every target up", [*logs.values(), prom.log])
        async with aiohttp.ClientSession() as s:
            for name, port in ports.items():
                async with s.get(f"http://127.0.0.1:{port}/metrics") as r:
                    assert r.status == 200
                    body = await r.read()
                check = subprocess.run([PROMTOOL or "promtool", "check", "metrics"], input=body,
                                       capture_output=True, check=False)
                assert check.returncode == 0 and not check.stdout + check.stderr, (
                    name, (check.stdout + check.stderr).decode())
        up = await prom.vector("up", time.time())
        assert {dict(k)["job"]: v for k, v in up.items()} == dict.fromkeys(ports, 1.0)

        async def sampled_gpus():
            got = await prom.vector(
                'count by (node) (fleetpulse_gpu_temperature_celsius{agg="raw"})', time.time())
            return got or None

        got = await _until(sampled_gpus, 90, "the agent's GPUs through Prometheus",
                           [*logs.values(), prom.log])
        assert [dict(k) for k in got] == [{"node": "node-3"}] and next(iter(got.values())) > 0

        async def written():
            rows = await vm.export('{__name__="fleetpulse_gpu_temperature_celsius"}')
            return {(r["metric"]["node"], r["metric"]["tier"]) for r in rows} or None

        assert await _until(written, 60, "the GPUs' 10 s tier in VictoriaMetrics",
                            [logs["aggregator"], vm.log]) == {("node-3", "10s")}
        async with aiohttp.ClientSession() as s, s.get(
                f"http://127.0.0.1:{ports['aggregator']}/metrics") as r:
            text = await r.text()
        sent = [float(x.split()[-1]) for x in text.splitlines()
                if x.startswith("fleetpulse_remote_write_sent_samples_total ")]
        assert sent and sent[0] > 0, text
    finally:
        prom.stop()
        for p in reversed(procs):
            _stop(p)
        vm.stop()

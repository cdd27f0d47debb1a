"""The nvml source through the one documented fake of the pynvml bindings (tests/fakes/nvml.py)."""

from __future__ import annotations

import asyncio
import io
import math
from collections.abc import AsyncIterator
from pathlib import Path

import orjson
import pynvml
import pytest
from fakes.nvml import FakeNvml, h100s

from agent.run import print_tick
from agent.sources.base import Gathered, SourceError
from agent.sources.nvml import NvmlSource
from schemas.catalog import BY_ID, BY_NAME, CATALOG
from schemas.records import EventKind

NVML_METRICS = {m.id for m in CATALOG if m.nvml is not None}


def col(g: Gathered, name: str) -> int:
    return list(g.metric_ids).index(BY_NAME["fleetpulse_gpu_" + name].id)


@pytest.fixture
async def fake() -> AsyncIterator[FakeNvml]:
    yield FakeNvml(h100s(2))


async def _source(nv: FakeNvml, **kw: object) -> NvmlSource:
    src = NvmlSource(nv, event_wait_ms=20, **kw)  # type: ignore[arg-type]
    await src.start()
    return src


async def test_every_nvml_catalog_metric_in_base_units(fake: FakeNvml) -> None:
    src = await _source(fake)
    g1 = await src.gather(1000)
    g2 = await src.gather(2000)
    await src.close()
    assert set(g2.metric_ids.tolist()) == NVML_METRICS, "every catalog metric with an NVML call"
    assert g2.uuids == ("GPU-fake-0000", "GPU-fake-0001")
    v = g2.values
    gpu = fake.gpus[0]
    expect = {
        "temperature_celsius": 41.0,
        "memory_temperature_celsius": 48.0,
        "power_usage_watts": 312.456,
        "power_limit_watts": 700.0,
        "energy_consumption_joules_total": 987654.321,
        "utilization_ratio": 0.87,
        "memory_utilization_ratio": 0.45,
        "framebuffer_used_bytes": float(40 << 30),
        "framebuffer_free_bytes": float(40 << 30),
        "sm_clock_hertz": 1.98e9,
        "memory_clock_hertz": 2.619e9,
        "clock_event_reasons": 4.0,
        "pcie_transmit_bytes_per_second": 1234 * 1024.0,
        "pcie_receive_bytes_per_second": 5678 * 1024.0,
        "pcie_replay_errors_total": 3.0,
        "nvlink_crc_errors_total": 5.0,
        "nvlink_replay_errors_total": 6.0,
        "nvlink_recovery_errors_total": 7.0,
        "ecc_sbe_volatile_total": 11.0,
        "ecc_dbe_volatile_total": 0.0,
        "ecc_sbe_aggregate_total": 120.0,
        "ecc_dbe_aggregate_total": 2.0,
        "retired_pages_sbe": 1.0,
        "retired_pages_dbe": 0.0,
        "remapped_rows_correctable": 1.0,
        "remapped_rows_uncorrectable": 0.0,
        "row_remap_failure": 0.0,
        "fan_speed_ratio": 0.0,
        "performance_state": 0.0,
        "slowdown_temperature_celsius": 92.0,
    }
    for name, want in expect.items():
        assert v[0, col(g2, name)] == want, name
    assert math.isnan(v[0, col(g2, "xid")]), "no XID this tick"
    # NVLink: cumulative KiB counters become bytes/s; the probe at start gives the first
    # reading, so the first tick already has a rate.
    assert g1.values[0, col(g1, "nvlink_transmit_bytes_per_second")] > 0
    tx = v[0, col(g2, "nvlink_transmit_bytes_per_second")]
    rx = v[0, col(g2, "nvlink_receive_bytes_per_second")]
    assert tx > 0 and rx > 0 and tx / rx == pytest.approx(gpu.nvlink_step_kib[0]
                                                          / gpu.nvlink_step_kib[1], rel=0.05)


async def test_field_values_batch_once_per_gpu_and_multi_metric_calls_once(
        fake: FakeNvml) -> None:
    src = await _source(fake)
    before = fake.count("nvmlDeviceGetFieldValues", 0)
    util_before = fake.count("nvmlDeviceGetUtilizationRates", 1)
    for t in range(3):
        await src.gather(t)
    await src.close()
    assert fake.count("nvmlDeviceGetFieldValues", 0) - before == 3
    assert fake.count("nvmlDeviceGetUtilizationRates", 1) - util_before == 3
    # ECC, energy, retired pages and remapped rows came from the batch, not direct calls.
    for direct in ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetTotalEnergyConsumption",
                   "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPages"):
        assert fake.count(direct, 0) == 0, direct
    assert fake.initialised == 0, "nvmlInit once, nvmlShutdown once"
    assert fake.count("nvmlInit") == 1 and fake.count("nvmlDeviceGetHandleByIndex") == 2


async def test_not_supported_is_asked_once_and_columns_follow_support(fake: FakeNvml) -> None:
    fake.gpus[1].unsupported.add("nvmlDeviceGetFanSpeed")
    for gpu in fake.gpus:  # memory temperature: no field, no direct call -> no column
        gpu.unsupported.add(f"field:{pynvml.NVML_FI_DEV_MEMORY_TEMP}")
    src = await _source(fake)
    gathered = [await src.gather(t) for t in range(4)]
    await src.close()
    g = gathered[-1]
    assert BY_NAME["fleetpulse_gpu_memory_temperature_celsius"].id not in set(g.metric_ids)
    fan = col(g, "fan_speed_ratio")
    assert g.values[0, fan] == 0.0 and math.isnan(g.values[1, fan])
    assert fake.count("nvmlDeviceGetFanSpeed", 1) == 1, "asked once, remembered"
    assert fake.count("nvmlDeviceGetFanSpeed", 0) == 5, "probe + 4 ticks on the GPU that has it"
    assert src.error_counts()["not_supported"] == 3  # fan on GPU 1, memory temp on both


async def test_unsupported_field_falls_back_to_the_direct_call(fake: FakeNvml) -> None:
    for gpu in fake.gpus:
        gpu.unsupported.add(f"field:{pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL}")
    src = await _source(fake)
    g = await src.gather(0)
    await src.close()
    assert g.values[1, col(g, "ecc_dbe_aggregate_total")] == 2.0
    assert fake.count("nvmlDeviceGetTotalEccErrors", 1) == 2  # probe + tick


async def test_old_driver_without_field_values_reads_everything_directly(fake: FakeNvml) -> None:
    for gpu in fake.gpus:
        gpu.unsupported.add("nvmlDeviceGetFieldValues")
        gpu.failing["nvmlDeviceGetCurrentClocksEventReasons"] = \
            pynvml.NVML_ERROR_FUNCTION_NOT_FOUND
    src = await _source(fake)
    g = await src.gather(0)
    await src.close()
    assert g.values[0, col(g, "energy_consumption_joules_total")] == 987654.321
    assert g.values[0, col(g, "remapped_rows_correctable")] == 1.0
    assert g.values[0, col(g, "retired_pages_sbe")] == 1.0
    assert g.values[0, col(g, "clock_event_reasons")] == 4.0, "throttle-reasons fallback"
    assert fake.count("nvmlDeviceGetCurrentClocksThrottleReasons", 0) == 2
    assert fake.count("nvmlDeviceGetFieldValues", 0) == 1, "batching is given up after one try"


async def test_gpu_lost_is_an_event_and_nan_and_never_stops_the_agent(fake: FakeNvml) -> None:
    src = await _source(fake)
    await src.gather(0)
    fake.lose(1)
    g = await src.gather(1)
    lost = [e for e in g.events if e.kind is EventKind.GPU_LOST]
    assert [(e.gpu, e.uuid) for e in lost] == [(1, "GPU-fake-0001")]
    assert all(math.isnan(x) for x in g.values[1])
    assert g.values[0, col(g, "temperature_celsius")] == 41.0
    calls = sum(n for (name, gpu), n in fake.calls.items() if gpu == 1)
    g2 = await src.gather(2)
    assert sum(n for (name, gpu), n in fake.calls.items() if gpu == 1) == calls, \
        "a lost GPU is not asked again"
    assert not [e for e in g2.events if e.kind is EventKind.GPU_LOST], "one event, not one per tick"
    assert src.error_counts()["gpu_is_lost"] == 1
    await src.close()


async def test_transient_errors_are_counted_by_kind_and_retried(fake: FakeNvml) -> None:
    src = await _source(fake)
    fake.gpus[0].failing["nvmlDeviceGetPowerUsage"] = pynvml.NVML_ERROR_TIMEOUT
    g = await src.gather(0)
    assert math.isnan(g.values[0, col(g, "power_usage_watts")])
    del fake.gpus[0].failing["nvmlDeviceGetPowerUsage"]
    g = await src.gather(1)
    assert g.values[0, col(g, "power_usage_watts")] == 312.456
    assert src.error_counts() == {"timeout": 1}
    await src.close()


async def test_xid_and_ecc_events_from_the_event_thread(fake: FakeNvml) -> None:
    src = await _source(fake)
    assert fake.registered == {0: fake.gpus[0].supported_events, 1: fake.gpus[1].supported_events}
    await src.gather(0)
    fake.inject_event(0, pynvml.nvmlEventTypeXidCriticalError, 79)
    fake.inject_event(1, pynvml.nvmlEventTypeDoubleBitEccError)
    await asyncio.sleep(0.2)
    g = await src.gather(1)
    xids = [e for e in g.events if e.kind is EventKind.XID]
    eccs = [e for e in g.events if e.kind is EventKind.ECC]
    assert [(e.gpu, e.data["xid"]) for e in xids] == [(0, 79)]
    assert [(e.gpu, e.data["bits"]) for e in eccs] == [(1, "double")]
    assert g.values[0, col(g, "xid")] == 79.0 and math.isnan(g.values[1, col(g, "xid")])
    g = await src.gather(2)
    assert math.isnan(g.values[0, col(g, "xid")]), "the XID column marks the tick it happened"
    await src.close()
    assert src._thread is not None and not src._thread.is_alive()


async def test_inventory_at_start_and_on_change(fake: FakeNvml) -> None:
    src = await _source(fake)
    g = await src.gather(0)
    inv = [e for e in g.events if e.kind is EventKind.INVENTORY]
    assert [e.gpu for e in inv] == [0, 1]
    assert inv[1].data == {
        "uuid": "GPU-fake-0001", "driver": "580.105.08", "source": "nvml",
        "model": "NVIDIA H100 80GB HBM3", "serial": "1654922001234",
        "vbios": "96.00.89.00.01", "inforom": "G520.0200.00.05",
        "pci_bus_id": "00000000:54:00.0", "mig_mode": 0,
    }
    fake.gpus[1].mig_mode = 1
    src._next_inventory = 0.0  # the periodic re-read is due
    g = await src.gather(1)
    changed = [e for e in g.events if e.kind is EventKind.INVENTORY]
    assert [(e.gpu, e.data["mig_mode"]) for e in changed] == [(1, 1)]
    await src.close()


async def test_print_lines_for_nvml(fake: FakeNvml) -> None:
    src = await _source(fake)
    g = await src.gather(1234)
    await src.close()
    out = io.StringIO()
    n = print_tick(src, g, out)
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    assert n == len(lines) == 2 * (len(NVML_METRICS) - 1)  # xid is NaN: not printed
    first = lines[0]
    assert {"gpu", "uuid", "metric", "dcgm_field", "value", "ts_ms"} <= set(first)
    assert first["dcgm_field"] is None and first["ts_ms"] == 1234
    assert {ln["metric"] for ln in lines} == {BY_ID[i].name for i in NVML_METRICS} - {
        "fleetpulse_gpu_xid"}


async def test_nvml_unusable_is_a_source_error() -> None:
    nv = FakeNvml(h100s(1))
    nv.driver = "x"

    def broken_init() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    nv.nvmlInit = broken_init  # type: ignore[method-assign]
    src = NvmlSource(nv)
    with pytest.raises(SourceError, match="not usable"):
        await src.start()
    assert src.error_counts() == {"driver_not_loaded": 1}


def test_nvml_capture_names_the_file_after_model_and_driver(tmp_path: Path) -> None:
    from benchmarks.agent import nvml_capture

    assert nvml_capture(FakeNvml(h100s(2)), tmp_path) == 0
    path = tmp_path / "agent-nvml-NVIDIA-H100-80GB-HBM3-580.105.08.jsonl"
    lines = [orjson.loads(line) for line in path.read_text().splitlines()]
    assert {ln["gpu"] for ln in lines} == {0, 1}

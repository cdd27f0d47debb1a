"""The metric catalog: naming rules, DCGM coverage of the real fixtures, exact unit scaling."""

from __future__ import annotations

import re

import numpy as np

from benchmarks.dcgm_fixtures import DCGM_FIXTURES
from schemas.catalog import BY_DCGM_FIELD, BY_NAME, CATALOG, Kind, metric_ids, to_base_units

FIXTURES = DCGM_FIXTURES


def test_names_follow_prometheus_conventions() -> None:
    for m in CATALOG:
        assert re.fullmatch(r"fleetpulse_gpu_[a-z0-9_]+", m.name), m.name
        assert (m.kind is Kind.COUNTER) == m.name.endswith("_total")
        assert m.nvml or m.dcgm, f"{m.name} has no source"


def test_design_metrics_are_all_present() -> None:
    required = ["temperature_celsius", "memory_temperature_celsius", "power_usage_watts",
                "energy_consumption_joules_total", "utilization_ratio", "memory_utilization_ratio",
                "framebuffer_used_bytes", "framebuffer_free_bytes", "sm_clock_hertz",
                "memory_clock_hertz", "clock_event_reasons", "pcie_transmit_bytes_per_second",
                "pcie_receive_bytes_per_second", "nvlink_transmit_bytes_per_second",
                "nvlink_receive_bytes_per_second", "nvlink_crc_errors_total",
                "ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "ecc_sbe_aggregate_total",
                "ecc_dbe_aggregate_total", "retired_pages_dbe", "remapped_rows_uncorrectable",
                "fan_speed_ratio", "performance_state", "xid"]
    for suffix in required:
        assert f"fleetpulse_gpu_{suffix}" in BY_NAME


def test_real_dcgm_fixtures_map_mostly_to_the_catalog() -> None:
    fields = set()
    for path in FIXTURES.glob("*.prom"):
        for line in path.read_text().splitlines():
            if line.startswith("DCGM_FI_"):
                fields.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    known = fields & set(BY_DCGM_FIELD)
    # The H100 captures' fields are all in the catalog; the T4 file adds legacy/odd fields.
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_GPU_UTIL",
            "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS"} <= known
    assert len(known) >= 0.6 * len(fields)


def test_unit_conversion_gives_the_double_of_the_decimal_reading() -> None:
    mw = np.arange(0, 700_000, 7, dtype=np.int64)
    watts = to_base_units(mw, BY_NAME["fleetpulse_gpu_power_usage_watts"].nvml_scale)
    expected = np.array([float(f"{v // 1000}.{v % 1000:03d}") for v in mw])
    assert watts.tobytes() == expected.tobytes()
    mib = to_base_units([1, 81559], BY_NAME["fleetpulse_gpu_framebuffer_used_bytes"].dcgm_scale)
    assert mib.tolist() == [1048576.0, 81559 * 1048576.0]


def test_metric_ids_names_unknown() -> None:
    ids = metric_ids(["fleetpulse_gpu_temperature_celsius", "fleetpulse_gpu_xid"])
    assert ids.tolist() == [1, 32]
    try:
        metric_ids(["nope"])
    except KeyError as exc:
        assert "nope" in str(exc)
    else:
        raise AssertionError("unknown metric accepted")

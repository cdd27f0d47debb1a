"""The metric catalog: one table of every metric fleetpulse knows.

Every stage speaks in catalog ids (small stable integers carried in frames) and catalog
names (Prometheus-style, base units, ``_total`` for counters). A source converts its native
units with :func:`to_base_units` so that the rest of the system sees one unit per metric.

Ids are part of the wire format: never renumber a metric, only append new ones.

Unit conversions are exact rationals (``value * mul / div``) rather than a float factor so
that a reading of 123456 mW becomes the double nearest to 123.456 W, the same double that
parsing "123.456" gives; the store's scaled-integer codec relies on that.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "BY_DCGM_FIELD",
    "BY_ID",
    "BY_NAME",
    "CATALOG",
    "Kind",
    "Metric",
    "metric_ids",
    "to_base_units",
]


class Kind(StrEnum):
    """How a metric's values behave over time, which decides how it is rolled up."""

    GAUGE = "gauge"
    """A reading that goes up and down (temperature, power)."""
    COUNTER = "counter"
    """A monotonically increasing total that may reset (energy, ECC errors)."""
    STATE = "state"
    """A code or bitmask (P-state, clock-event reasons): only last/min/max make sense."""
    EVENT = "event"
    """A value that marks an occurrence (XID code), NaN when nothing happened."""


GAUGE_AGGREGATES: Final = ("count", "sum", "min", "max", "last", "sumsq", "sketch")
COUNTER_AGGREGATES: Final = ("count", "increase", "last")
STATE_AGGREGATES: Final = ("count", "min", "max", "last", "or")
EVENT_AGGREGATES: Final = ("count", "last")


@dataclass(frozen=True, slots=True)
class Metric:
    """One catalog row."""

    id: int
    """Stable wire id (frames carry it); never reused."""
    name: str
    """Prometheus-style name in base units."""
    unit: str
    """Base unit after conversion (celsius, watts, joules, bytes, hertz, ratio, ...)."""
    kind: Kind
    help: str
    nvml: str | None
    """The NVML call (or field id) that reads it, None when NVML has no equivalent."""
    dcgm: str | None
    """The ``DCGM_FI_*`` field, None when DCGM has none."""
    nvml_scale: tuple[int, int] = (1, 1)
    """(mul, div) from NVML's native unit to the base unit."""
    dcgm_scale: tuple[int, int] = (1, 1)
    """(mul, div) from dcgm-exporter's unit to the base unit."""
    aggregates: tuple[str, ...] = GAUGE_AGGREGATES
    """The rollup aggregates kept for this metric."""
    dcgm_aliases: tuple[str, ...] = ()
    """Older DCGM field names for the same quantity."""


def _g(id_: int, name: str, unit: str, help_: str, nvml: str | None, dcgm: str | None,
       nvml_scale: tuple[int, int] = (1, 1), dcgm_scale: tuple[int, int] = (1, 1),
       aliases: tuple[str, ...] = ()) -> Metric:
    return Metric(id_, name, unit, Kind.GAUGE, help_, nvml, dcgm, nvml_scale, dcgm_scale,
                  GAUGE_AGGREGATES, aliases)


def _c(id_: int, name: str, unit: str, help_: str, nvml: str | None, dcgm: str | None,
       nvml_scale: tuple[int, int] = (1, 1), dcgm_scale: tuple[int, int] = (1, 1)) -> Metric:
    return Metric(id_, name, unit, Kind.COUNTER, help_, nvml, dcgm, nvml_scale, dcgm_scale,
                  COUNTER_AGGREGATES)


def _s(id_: int, name: str, unit: str, help_: str, nvml: str | None, dcgm: str | None,
       aliases: tuple[str, ...] = ()) -> Metric:
    return Metric(id_, name, unit, Kind.STATE, help_, nvml, dcgm, (1, 1), (1, 1),
                  STATE_AGGREGATES, aliases)


_MIB: Final = (1 << 20, 1)
_MILLI: Final = (1, 1000)
_PERCENT: Final = (1, 100)
_MHZ: Final = (1_000_000, 1)
_KIB: Final = (1024, 1)

CATALOG: Final[tuple[Metric, ...]] = (
    _g(1, "fleetpulse_gpu_temperature_celsius", "celsius", "GPU die temperature.",
       "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)", "DCGM_FI_DEV_GPU_TEMP"),
    _g(2, "fleetpulse_gpu_memory_temperature_celsius", "celsius", "HBM temperature.",
       "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)", "DCGM_FI_DEV_MEMORY_TEMP"),
    _g(3, "fleetpulse_gpu_power_usage_watts", "watts", "Board power draw.",
       "nvmlDeviceGetPowerUsage", "DCGM_FI_DEV_POWER_USAGE", nvml_scale=_MILLI),
    _g(4, "fleetpulse_gpu_power_limit_watts", "watts", "Enforced power limit.",
       "nvmlDeviceGetEnforcedPowerLimit", "DCGM_FI_DEV_POWER_MGMT_LIMIT", nvml_scale=_MILLI),
    _c(5, "fleetpulse_gpu_energy_consumption_joules_total", "joules",
       "Energy used since the driver was loaded.", "nvmlDeviceGetTotalEnergyConsumption",
       "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", nvml_scale=_MILLI, dcgm_scale=_MILLI),
    _g(6, "fleetpulse_gpu_utilization_ratio", "ratio",
       "Fraction of time a kernel was running (NVML 'gpu' utilisation).",
       "nvmlDeviceGetUtilizationRates.gpu", "DCGM_FI_DEV_GPU_UTIL",
       nvml_scale=_PERCENT, dcgm_scale=_PERCENT),
    _g(7, "fleetpulse_gpu_memory_utilization_ratio", "ratio",
       "Fraction of time device memory was read or written.",
       "nvmlDeviceGetUtilizationRates.memory", "DCGM_FI_DEV_MEM_COPY_UTIL",
       nvml_scale=_PERCENT, dcgm_scale=_PERCENT),
    _g(8, "fleetpulse_gpu_framebuffer_used_bytes", "bytes", "Framebuffer memory in use.",
       "nvmlDeviceGetMemoryInfo.used", "DCGM_FI_DEV_FB_USED", dcgm_scale=_MIB),
    _g(9, "fleetpulse_gpu_framebuffer_free_bytes", "bytes", "Framebuffer memory free.",
       "nvmlDeviceGetMemoryInfo.free", "DCGM_FI_DEV_FB_FREE", dcgm_scale=_MIB),
    _g(10, "fleetpulse_gpu_sm_clock_hertz", "hertz", "SM clock.",
       "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)", "DCGM_FI_DEV_SM_CLOCK",
       nvml_scale=_MHZ, dcgm_scale=_MHZ),
    _g(11, "fleetpulse_gpu_memory_clock_hertz", "hertz", "Memory clock.",
       "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)", "DCGM_FI_DEV_MEM_CLOCK",
       nvml_scale=_MHZ, dcgm_scale=_MHZ),
    _s(12, "fleetpulse_gpu_clock_event_reasons", "bitmask",
       "Why clocks are below maximum (nvmlClocksEventReason* bits, formerly throttle reasons).",
       "nvmlDeviceGetCurrentClocksEventReasons", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
       aliases=("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",)),
    _g(13, "fleetpulse_gpu_pcie_transmit_bytes_per_second", "bytes_per_second",
       "PCIe transmit throughput.", "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES)",
       "DCGM_FI_PROF_PCIE_TX_BYTES", nvml_scale=_KIB),
    _g(14, "fleetpulse_gpu_pcie_receive_bytes_per_second", "bytes_per_second",
       "PCIe receive throughput.", "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES)",
       "DCGM_FI_PROF_PCIE_RX_BYTES", nvml_scale=_KIB),
    _c(15, "fleetpulse_gpu_pcie_replay_errors_total", "errors", "PCIe replay counter.",
       "nvmlDeviceGetPcieReplayCounter", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),
    _g(16, "fleetpulse_gpu_nvlink_transmit_bytes_per_second", "bytes_per_second",
       "NVLink transmit throughput, all links.",
       "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX)",
       "DCGM_FI_PROF_NVLINK_TX_BYTES"),
    _g(17, "fleetpulse_gpu_nvlink_receive_bytes_per_second", "bytes_per_second",
       "NVLink receive throughput, all links.",
       "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX)",
       "DCGM_FI_PROF_NVLINK_RX_BYTES"),
    _c(18, "fleetpulse_gpu_nvlink_crc_errors_total", "errors", "NVLink CRC flit errors.",
       "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL)",
       "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"),
    _c(19, "fleetpulse_gpu_nvlink_replay_errors_total", "errors", "NVLink replay errors.",
       "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL)",
       "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL"),
    _c(20, "fleetpulse_gpu_nvlink_recovery_errors_total", "errors", "NVLink recovery errors.",
       "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL)",
       "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL"),
    _c(21, "fleetpulse_gpu_ecc_sbe_volatile_total", "errors",
       "Corrected (single-bit) ECC errors since the last driver load.",
       "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE_ECC)", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"),
    _c(22, "fleetpulse_gpu_ecc_dbe_volatile_total", "errors",
       "Uncorrected (double-bit) ECC errors since the last driver load.",
       "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE_ECC)", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"),
    _c(23, "fleetpulse_gpu_ecc_sbe_aggregate_total", "errors",
       "Corrected ECC errors over the GPU's life.",
       "nvmlDeviceGetTotalEccErrors(CORRECTED, AGGREGATE_ECC)", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"),
    _c(24, "fleetpulse_gpu_ecc_dbe_aggregate_total", "errors",
       "Uncorrected ECC errors over the GPU's life.",
       "nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE_ECC)", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"),
    _g(25, "fleetpulse_gpu_retired_pages_sbe", "pages",
       "Pages retired for single-bit errors (pre-Ampere).",
       "nvmlDeviceGetRetiredPages(MULTIPLE_SINGLE_BIT_ECC_ERRORS)", "DCGM_FI_DEV_RETIRED_SBE"),
    _g(26, "fleetpulse_gpu_retired_pages_dbe", "pages",
       "Pages retired for double-bit errors (pre-Ampere).",
       "nvmlDeviceGetRetiredPages(DOUBLE_BIT_ECC_ERROR)", "DCGM_FI_DEV_RETIRED_DBE"),
    _g(27, "fleetpulse_gpu_remapped_rows_correctable", "rows",
       "Rows remapped for correctable errors (Ampere and later).",
       "nvmlDeviceGetRemappedRows.corrRows", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"),
    _g(28, "fleetpulse_gpu_remapped_rows_uncorrectable", "rows",
       "Rows remapped for uncorrectable errors (Ampere and later).",
       "nvmlDeviceGetRemappedRows.uncRows", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
    _s(29, "fleetpulse_gpu_row_remap_failure", "bool",
       "1 when a row remap failed: the GPU needs service.",
       "nvmlDeviceGetRemappedRows.isFailureOccurred", "DCGM_FI_DEV_ROW_REMAP_FAILURE"),
    _g(30, "fleetpulse_gpu_fan_speed_ratio", "ratio", "Fan speed as a fraction of maximum.",
       "nvmlDeviceGetFanSpeed", "DCGM_FI_DEV_FAN_SPEED",
       nvml_scale=_PERCENT, dcgm_scale=_PERCENT),
    _s(31, "fleetpulse_gpu_performance_state", "pstate", "Performance state, 0 (P0) to 15.",
       "nvmlDeviceGetPerformanceState", "DCGM_FI_DEV_PSTATE"),
    Metric(32, "fleetpulse_gpu_xid", "code", Kind.EVENT,
           "Last XID error code seen in the tick, NaN when none.",
           "nvmlEventSetWait(nvmlEventTypeXidCriticalError)", "DCGM_FI_DEV_XID_ERRORS",
           aggregates=EVENT_AGGREGATES),
    _g(33, "fleetpulse_gpu_graphics_engine_active_ratio", "ratio",
       "Fraction of time the graphics/compute engine was active (DCGM profiling).",
       None, "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
    _g(34, "fleetpulse_gpu_sm_active_ratio", "ratio",
       "Fraction of time at least one warp was resident on an SM (DCGM profiling).",
       None, "DCGM_FI_PROF_SM_ACTIVE"),
    _g(35, "fleetpulse_gpu_tensor_active_ratio", "ratio",
       "Fraction of cycles the tensor pipes were active (DCGM profiling).",
       None, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),
    _g(36, "fleetpulse_gpu_dram_active_ratio", "ratio",
       "Fraction of cycles device memory was busy (DCGM profiling).",
       None, "DCGM_FI_PROF_DRAM_ACTIVE"),
    _g(37, "fleetpulse_gpu_slowdown_temperature_celsius", "celsius",
       "Temperature at which the GPU starts to slow down.",
       "nvmlDeviceGetTemperatureThreshold(NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)",
       "DCGM_FI_DEV_SLOWDOWN_TEMP"),
)

BY_ID: Final[dict[int, Metric]] = {m.id: m for m in CATALOG}
BY_NAME: Final[dict[str, Metric]] = {m.name: m for m in CATALOG}
BY_DCGM_FIELD: Final[dict[str, Metric]] = {
    field: m for m in CATALOG for field in ((m.dcgm,) if m.dcgm else ()) + m.dcgm_aliases
}
MAX_ID: Final = max(BY_ID)


def metric_ids(names: list[str] | tuple[str, ...]) -> npt.NDArray[np.uint16]:
    """Catalog ids for ``names``; raises KeyError naming the first unknown metric."""
    out = np.empty(len(names), dtype=np.uint16)
    for i, name in enumerate(names):
        try:
            out[i] = BY_NAME[name].id
        except KeyError:
            raise KeyError(f"metric {name!r} is not in the catalog") from None
    return out


def to_base_units(values: npt.ArrayLike, scale: tuple[int, int]) -> npt.NDArray[np.float64]:
    """Convert native readings with an exact ``(mul, div)`` rational, as one vector op."""
    mul, div = scale
    arr = np.asarray(values, dtype=np.float64)
    if mul != 1:
        arr = arr * float(mul)
    if div != 1:
        arr = arr / float(div)
    return arr


def _check_catalog() -> None:
    """Import-time sanity: unique ids and names, Prometheus naming for counters."""
    if len(BY_ID) != len(CATALOG) or len(BY_NAME) != len(CATALOG):
        raise AssertionError("catalog ids and names must be unique")
    for m in CATALOG:
        if (m.kind is Kind.COUNTER) != m.name.endswith("_total"):
            raise AssertionError(f"{m.name}: counters and only counters end in _total")


_check_catalog()

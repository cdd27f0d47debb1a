"""The one fake in the test suite: a thin stand-in for the ``pynvml`` functions NvmlSource calls.

Why a fake here and nowhere else: NVML needs an NVIDIA driver and GPUs, which CI machines do
not have, and GPU failures (a lost GPU, an XID) cannot be produced on demand even where they
do. Everything else in the tests is real.

How it stays honest:

* constants (``NVML_*``, ``nvmlEventType*``) and the exception class (``NVMLError``, whose
  constructor maps a code to its subclass) are the real ones from nvidia-ml-py;
* return values have pynvml's types: plain ``int`` for scalar getters, ``str`` for
  strings (pynvml decodes them), and the real ctypes structures for structured results
  (``c_nvmlUtilization_t``, ``c_nvmlMemory_t``, ``nvmlPciInfo_t`` with a ``bytes`` busId,
  ``c_nvmlFieldValue_t`` arrays with per-field ``nvmlReturn``/``valueType``/``timestamp``,
  ``c_nvmlEventData_t``); device handles are real ``c_nvmlDevice_t`` pointers;
* errors are raised as pynvml raises them: ``NVMLError(code)``.

Implemented: nvmlInit, nvmlShutdown, nvmlSystemGetDriverVersion, nvmlDeviceGetCount,
nvmlDeviceGetHandleByIndex, nvmlDeviceGetUUID, nvmlDeviceGetName, nvmlDeviceGetSerial,
nvmlDeviceGetVbiosVersion, nvmlDeviceGetInforomImageVersion, nvmlDeviceGetPciInfo,
nvmlDeviceGetMigMode, nvmlDeviceGetFieldValues, nvmlDeviceGetTemperature,
nvmlDeviceGetTemperatureThreshold, nvmlDeviceGetPowerUsage, nvmlDeviceGetEnforcedPowerLimit,
nvmlDeviceGetTotalEnergyConsumption, nvmlDeviceGetUtilizationRates, nvmlDeviceGetMemoryInfo,
nvmlDeviceGetClockInfo, nvmlDeviceGetCurrentClocksEventReasons,
nvmlDeviceGetCurrentClocksThrottleReasons, nvmlDeviceGetPcieThroughput,
nvmlDeviceGetPcieReplayCounter, nvmlDeviceGetTotalEccErrors, nvmlDeviceGetRetiredPages,
nvmlDeviceGetRemappedRows, nvmlDeviceGetFanSpeed, nvmlDeviceGetPerformanceState,
nvmlEventSetCreate, nvmlEventSetFree, nvmlDeviceGetSupportedEventTypes,
nvmlDeviceRegisterEvents, nvmlEventSetWait.

Test controls: ``gpus[i]`` holds each GPU's readings (native NVML units), ``unsupported``
(call names or ``field:<id>``), ``failing`` (call name -> NVML error code, transient),
``lose(i)``, ``inject_event(i, type, data)``; ``calls`` counts every call per
``(name, gpu index)``.
"""

from __future__ import annotations

import ctypes
import queue
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pynvml


@dataclass
class FakeGpu:
    """One GPU's readings, in NVML's native units."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    serial: str = "1654922001234"
    vbios: str = "96.00.89.00.01"
    inforom: str = "G520.0200.00.05"
    pci_bus_id: str = "00000000:53:00.0"
    mig_mode: int = 0
    temperature: int = 41
    slowdown: int = 92
    power_mw: int = 312_456
    power_limit_mw: int = 700_000
    energy_mj: int = 987_654_321
    util_gpu: int = 87
    util_mem: int = 45
    mem_used: int = 40 << 30
    mem_free: int = 40 << 30
    sm_mhz: int = 1980
    mem_mhz: int = 2619
    clock_reasons: int = 0x4
    pcie_tx_kbs: int = 1234
    pcie_rx_kbs: int = 5678
    pcie_replays: int = 3
    fan: int = 0
    pstate: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=lambda: {
        (0, 0): 11, (1, 0): 0, (0, 1): 120, (1, 1): 2})
    """(NVML_MEMORY_ERROR_TYPE_*, NVML_*_ECC) -> count."""
    retired: dict[int, list[int]] = field(default_factory=lambda: {0: [0x1000], 1: []})
    remapped: tuple[int, int, int, int] = (1, 0, 0, 0)
    nvlink_kib: list[int] = field(default_factory=lambda: [1_000_000, 2_000_000])
    """Cumulative NVLink data KiB (tx, rx); grows by ``nvlink_step_kib`` per FieldValues."""
    nvlink_step_kib: tuple[int, int] = (512, 256)
    nvlink_errors: tuple[int, int, int] = (5, 6, 7)
    memory_temp: int = 48
    supported_events: int = (pynvml.nvmlEventTypeXidCriticalError
                             | pynvml.nvmlEventTypeSingleBitEccError
                             | pynvml.nvmlEventTypeDoubleBitEccError)
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)
    failing: dict[str, int] = field(default_factory=dict)


def h100s(n: int) -> list[FakeGpu]:
    return [FakeGpu(uuid=f"GPU-fake-{i:04d}", pci_bus_id=f"00000000:{0x53 + i:02X}:00.0")
            for i in range(n)]


class FakeNvml:
    """Module-like object exposing the pynvml subset above. Not thread-safe beyond what the
    source needs (the event queue is a real thread-safe queue)."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu], driver: str = "580.105.08") -> None:
        self.gpus = gpus
        self.driver = driver
        self.calls: Counter[tuple[str, int | None]] = Counter()
        self.initialised = 0
        self.registered: dict[int, int] = {}
        self._structs = [pynvml.struct_c_nvmlDevice_t() for _ in gpus]
        self._handles = [ctypes.pointer(s) for s in self._structs]
        self._by_addr = {ctypes.addressof(s): i for i, s in enumerate(self._structs)}
        self._events: queue.Queue[Any] = queue.Queue()

    def __dir__(self) -> list[str]:
        consts = [n for n in dir(pynvml) if n.startswith(("NVML_", "nvmlEventType"))]
        return sorted(set(super().__dir__()) | set(consts))

    def __getattr__(self, name: str) -> Any:
        if name.startswith(("NVML_", "nvmlEventType")):
            return getattr(pynvml, name)  # the real constants
        raise AttributeError(name)

    # ------------------------------------------------------------ test controls

    def lose(self, index: int) -> None:
        self.gpus[index].lost = True

    def inject_event(self, index: int, event_type: int, data: int = 0) -> None:
        self._events.put((index, event_type, data))

    def count(self, name: str, index: int | None = None) -> int:
        return self.calls[(name, index)]

    # ------------------------------------------------------------ plumbing

    def _gpu(self, name: str, handle: Any) -> FakeGpu:
        index = self._by_addr[ctypes.addressof(handle.contents)]
        self.calls[(name, index)] += 1
        gpu = self.gpus[index]
        if gpu.lost:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
        if name in gpu.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if name in gpu.failing:
            raise pynvml.NVMLError(gpu.failing[name])
        return gpu

    def _call(self, name: str) -> None:
        self.calls[(name, None)] += 1
        if self.initialised <= 0 and name != "nvmlInit":
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)

    # ------------------------------------------------------------ library

    def nvmlInit(self) -> None:
        self._call("nvmlInit")
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._call("nvmlShutdown")
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._call("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._call("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._call("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return ctypes.cast(self._handles[index], pynvml.c_nvmlDevice_t)

    # ------------------------------------------------------------ inventory

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return self._gpu("nvmlDeviceGetUUID", h).uuid

    def nvmlDeviceGetName(self, h: Any) -> str:
        return self._gpu("nvmlDeviceGetName", h).name

    def nvmlDeviceGetSerial(self, h: Any) -> str:
        return self._gpu("nvmlDeviceGetSerial", h).serial

    def nvmlDeviceGetVbiosVersion(self, h: Any) -> str:
        return self._gpu("nvmlDeviceGetVbiosVersion", h).vbios

    def nvmlDeviceGetInforomImageVersion(self, h: Any) -> str:
        return self._gpu("nvmlDeviceGetInforomImageVersion", h).inforom

    def nvmlDeviceGetPciInfo(self, h: Any) -> Any:
        info = pynvml.nvmlPciInfo_t()
        info.busId = self._gpu("nvmlDeviceGetPciInfo", h).pci_bus_id.encode()
        return info

    def nvmlDeviceGetMigMode(self, h: Any) -> list[int]:
        mode = self._gpu("nvmlDeviceGetMigMode", h).mig_mode
        return [mode, mode]

    # ------------------------------------------------------------ readings

    def nvmlDeviceGetFieldValues(self, h: Any, field_ids: list[Any]) -> Any:
        gpu = self._gpu("nvmlDeviceGetFieldValues", h)
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        now_us = time.time_ns() // 1000
        for i, spec in enumerate(field_ids):
            fid, scope = spec if isinstance(spec, tuple) else (spec, 0)
            v = values[i]
            v.fieldId, v.scopeId, v.timestamp, v.latencyUsec = fid, scope, now_us, 3
            if f"field:{fid}" in gpu.unsupported:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            result = self._field(gpu, fid)
            if result is None:
                v.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
                continue
            vtype, value = result
            v.nvmlReturn = pynvml.NVML_SUCCESS
            v.valueType = vtype
            setattr(v.value, ("dVal", "uiVal", "ulVal", "ullVal", "sllVal")[vtype], value)
        return values

    def _field(self, gpu: FakeGpu, fid: int) -> tuple[int, Any] | None:
        nv = pynvml
        ull, ui = nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, nv.NVML_VALUE_TYPE_UNSIGNED_INT
        if fid == nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX:
            gpu.nvlink_kib[0] += gpu.nvlink_step_kib[0]
            return ull, gpu.nvlink_kib[0]
        if fid == nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX:
            gpu.nvlink_kib[1] += gpu.nvlink_step_kib[1]
            return ull, gpu.nvlink_kib[1]
        table: dict[int, tuple[int, Any]] = {
            nv.NVML_FI_DEV_MEMORY_TEMP: (ui, gpu.memory_temp),
            nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: (ull, gpu.energy_mj),
            nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER: (ull, gpu.pcie_replays),
            nv.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: (ull, gpu.nvlink_errors[0]),
            nv.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: (ull, gpu.nvlink_errors[1]),
            nv.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: (ull, gpu.nvlink_errors[2]),
            nv.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (ull, gpu.ecc[(0, 0)]),
            nv.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (ull, gpu.ecc[(1, 0)]),
            nv.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (ull, gpu.ecc[(0, 1)]),
            nv.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (ull, gpu.ecc[(1, 1)]),
            nv.NVML_FI_DEV_RETIRED_SBE: (ull, len(gpu.retired[0])),
            nv.NVML_FI_DEV_RETIRED_DBE: (ull, len(gpu.retired[1])),
            nv.NVML_FI_DEV_REMAPPED_COR: (ui, gpu.remapped[0]),
            nv.NVML_FI_DEV_REMAPPED_UNC: (ui, gpu.remapped[1]),
            nv.NVML_FI_DEV_REMAPPED_FAILURE: (ui, gpu.remapped[3]),
        }
        return table.get(fid)

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return self._gpu("nvmlDeviceGetTemperature", h).temperature

    def nvmlDeviceGetTemperatureThreshold(self, h: Any, threshold: int) -> int:
        assert threshold == pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN
        return self._gpu("nvmlDeviceGetTemperatureThreshold", h).slowdown

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", h).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", h).power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetTotalEnergyConsumption", h).energy_mj

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", h)
        return pynvml.c_nvmlUtilization_t(gpu=gpu.util_gpu, memory=gpu.util_mem)

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        gpu = self._gpu("nvmlDeviceGetMemoryInfo", h)
        return pynvml.c_nvmlMemory_t(total=gpu.mem_used + gpu.mem_free, free=gpu.mem_free,
                                     used=gpu.mem_used)

    def nvmlDeviceGetClockInfo(self, h: Any, clock: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", h)
        return {pynvml.NVML_CLOCK_SM: gpu.sm_mhz, pynvml.NVML_CLOCK_MEM: gpu.mem_mhz}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksEventReasons", h).clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", h).clock_reasons

    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        gpu = self._gpu("nvmlDeviceGetPcieThroughput", h)
        return {pynvml.NVML_PCIE_UTIL_TX_BYTES: gpu.pcie_tx_kbs,
                pynvml.NVML_PCIE_UTIL_RX_BYTES: gpu.pcie_rx_kbs}[counter]

    def nvmlDeviceGetPcieReplayCounter(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetPcieReplayCounter", h).pcie_replays

    def nvmlDeviceGetTotalEccErrors(self, h: Any, error_type: int, counter_type: int) -> int:
        return self._gpu("nvmlDeviceGetTotalEccErrors", h).ecc[(error_type, counter_type)]

    def nvmlDeviceGetRetiredPages(self, h: Any, cause: int) -> list[int]:
        return list(self._gpu("nvmlDeviceGetRetiredPages", h).retired[cause])

    def nvmlDeviceGetRemappedRows(self, h: Any) -> tuple[int, int, int, int]:
        return self._gpu("nvmlDeviceGetRemappedRows", h).remapped

    def nvmlDeviceGetFanSpeed(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetFanSpeed", h).fan

    def nvmlDeviceGetPerformanceState(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetPerformanceState", h).pstate

    # ------------------------------------------------------------ events

    def nvmlEventSetCreate(self) -> Any:
        self._call("nvmlEventSetCreate")
        return pynvml.c_nvmlEventSet_t()

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._call("nvmlEventSetFree")

    def nvmlDeviceGetSupportedEventTypes(self, h: Any) -> int:
        return self._gpu("nvmlDeviceGetSupportedEventTypes", h).supported_events

    def nvmlDeviceRegisterEvents(self, h: Any, event_types: int, event_set: Any) -> None:
        self._gpu("nvmlDeviceRegisterEvents", h)
        self.registered[self._by_addr[ctypes.addressof(h.contents)]] = event_types

    def nvmlEventSetWait(self, event_set: Any, timeout_ms: int) -> Any:
        try:
            index, etype, data = self._events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None
        out = pynvml.c_nvmlEventData_t()
        out.device = ctypes.cast(self._handles[index], pynvml.c_nvmlDevice_t)
        out.eventType = etype
        out.eventData = data
        return out

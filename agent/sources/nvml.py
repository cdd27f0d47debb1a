"""The ``nvml`` source: every catalog metric NVML can read, through nvidia-ml-py (pynvml).

How it reads (all names are pynvml's, checked against nvidia-ml-py's ``pynvml.py``):

* ``nvmlInit`` once, ``nvmlDeviceGetCount`` and ``nvmlDeviceGetHandleByIndex`` once at start;
  handles are kept for the agent's life.
* **Batching.** Per GPU and tick, one ``nvmlDeviceGetFieldValues`` call reads every metric
  that has an ``NVML_FI_DEV_*`` field (memory temperature, energy, PCIe replays, NVLink
  throughput and error totals, ECC single/double bit volatile/aggregate totals, retired
  pages, remapped rows). The rest are one direct call each (temperature, power, power limit,
  utilisation, memory info, clocks, clock-event reasons, PCIe throughput, fan, P-state,
  slowdown threshold); a call that fills several metrics (utilisation, memory info) is made
  once.
* **Support is asked once.** A field answered ``NOT_SUPPORTED`` falls back to the direct
  call when there is one; a direct call answered ``NOT_SUPPORTED`` (or ``NO_PERMISSION``,
  ``FUNCTION_NOT_FOUND``) is never made again for that GPU. ``start`` probes every GPU once,
  and the tick's columns are the metrics at least one GPU supports, so frames carry no
  all-NaN columns and ``--once --print`` prints exactly what the GPUs support.
* **Errors never stop the agent.** Each NVML error is counted by kind (the
  ``NVML_ERROR_*`` name in lower case: ``not_supported``, ``gpu_is_lost``, ``timeout``, ...);
  the value becomes NaN. ``GPU_IS_LOST`` produces one ``gpu_lost`` event and the GPU's row
  stays NaN without further calls (a lost GPU needs a reset; the agent's restart re-probes).
* **Units.** Each column is converted with :func:`schemas.catalog.to_base_units` and the
  metric's ``nvml_scale`` (mW -> W, mJ -> J, MHz -> Hz, % -> ratio, KB/s -> B/s). The NVLink
  data fields are cumulative KiB counters, not rates: the source turns two readings into
  bytes per second with the fields' own microsecond timestamps (first tick NaN).
* **Events.** An NVML event set registered for XID and single/double-bit ECC events is
  waited on (``nvmlEventSetWait``) in a daemon thread, which only queues what it sees; each
  gather drains the queue into events (``xid``, ``ecc``) and puts the tick's last XID code
  in the ``fleetpulse_gpu_xid`` column (NaN when none).
* **Inventory.** An ``inventory`` event per GPU at start (UUID, serial, VBIOS, InfoROM,
  driver, PCI bus id, model, MIG mode) and again whenever a periodic re-read differs.

The bindings are passed in (``bindings=``) so that tests can use the one thin fake in
``tests/fakes/nvml.py``; by default the real ``pynvml`` module is imported at start.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import math
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from agent.sources.base import (
    Gathered,
    Source,
    SourceContext,
    SourceError,
    SourceEvent,
    register_source,
)
from schemas.catalog import BY_ID, BY_NAME, to_base_units
from schemas.records import EventKind

__all__ = ["INVENTORY_REFRESH_S", "NvmlSource"]

log = logging.getLogger(__name__)

INVENTORY_REFRESH_S: Final = 300.0
"""How often inventory is re-read to notice changes (MIG mode, driver after a reload)."""
UINT_MAX: Final = 0xFFFFFFFF
NVLINK_SCOPE: Final = UINT_MAX
"""scopeId for the NVLink throughput fields: all links together."""

_ID = {name.removeprefix("fleetpulse_gpu_"): m.id for name, m in BY_NAME.items()}
XID_ID: Final = _ID["xid"]

# Field-value metrics: catalog short name -> (NVML_FI_* constant name, scopeId, is_rate).
_FIELDS: Final[dict[str, tuple[str, int, bool]]] = {
    "memory_temperature_celsius": ("NVML_FI_DEV_MEMORY_TEMP", 0, False),
    "energy_consumption_joules_total": ("NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 0, False),
    "pcie_replay_errors_total": ("NVML_FI_DEV_PCIE_REPLAY_COUNTER", 0, False),
    "nvlink_transmit_bytes_per_second": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
                                         NVLINK_SCOPE, True),
    "nvlink_receive_bytes_per_second": ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX",
                                        NVLINK_SCOPE, True),
    "nvlink_crc_errors_total": ("NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", 0, False),
    "nvlink_replay_errors_total": ("NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", 0, False),
    "nvlink_recovery_errors_total": ("NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", 0, False),
    "ecc_sbe_volatile_total": ("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", 0, False),
    "ecc_dbe_volatile_total": ("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", 0, False),
    "ecc_sbe_aggregate_total": ("NVML_FI_DEV_ECC_SBE_AGG_TOTAL", 0, False),
    "ecc_dbe_aggregate_total": ("NVML_FI_DEV_ECC_DBE_AGG_TOTAL", 0, False),
    "retired_pages_sbe": ("NVML_FI_DEV_RETIRED_SBE", 0, False),
    "retired_pages_dbe": ("NVML_FI_DEV_RETIRED_DBE", 0, False),
    "remapped_rows_correctable": ("NVML_FI_DEV_REMAPPED_COR", 0, False),
    "remapped_rows_uncorrectable": ("NVML_FI_DEV_REMAPPED_UNC", 0, False),
    "row_remap_failure": ("NVML_FI_DEV_REMAPPED_FAILURE", 0, False),
}

# c_nvmlValue_t member per NVML_VALUE_TYPE_* (0..6).
_VALUE_MEMBER: Final = ("dVal", "uiVal", "ulVal", "ullVal", "sllVal", "siVal", "usVal")

# Errors after which a call is never repeated for that GPU.
_GIVE_UP: Final = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_NO_PERMISSION",
                   "NVML_ERROR_FUNCTION_NOT_FOUND", "NVML_ERROR_INVALID_ARGUMENT")

Reader = Callable[[Any, Any], tuple[float, ...]]


@dataclass(frozen=True, slots=True)
class _Direct:
    """One NVML call that fills ``ids`` (catalog ids) with the values it returns."""

    call: str
    ids: tuple[int, ...]
    read: Reader


def _direct_readers(nv: Any) -> list[_Direct]:
    """Every direct call, written against pynvml's signatures and return types."""

    def one(name: str, *args: Any) -> Reader:
        return lambda n, h: (float(getattr(n, name)(h, *args)),)

    def clock_reasons(n: Any, h: Any) -> tuple[float, ...]:
        try:
            return (float(n.nvmlDeviceGetCurrentClocksEventReasons(h)),)
        except n.NVMLError as exc:  # drivers before 535 only know the old name
            if exc.value != n.NVML_ERROR_FUNCTION_NOT_FOUND:
                raise
            return (float(n.nvmlDeviceGetCurrentClocksThrottleReasons(h)),)

    def util(n: Any, h: Any) -> tuple[float, ...]:
        u = n.nvmlDeviceGetUtilizationRates(h)
        return float(u.gpu), float(u.memory)

    def memory(n: Any, h: Any) -> tuple[float, ...]:
        m = n.nvmlDeviceGetMemoryInfo(h)
        return float(m.used), float(m.free)

    i = _ID
    return [
        _Direct("nvmlDeviceGetTemperature", (i["temperature_celsius"],),
                one("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU)),
        _Direct("nvmlDeviceGetPowerUsage", (i["power_usage_watts"],),
                one("nvmlDeviceGetPowerUsage")),
        _Direct("nvmlDeviceGetEnforcedPowerLimit", (i["power_limit_watts"],),
                one("nvmlDeviceGetEnforcedPowerLimit")),
        _Direct("nvmlDeviceGetUtilizationRates",
                (i["utilization_ratio"], i["memory_utilization_ratio"]), util),
        _Direct("nvmlDeviceGetMemoryInfo",
                (i["framebuffer_used_bytes"], i["framebuffer_free_bytes"]), memory),
        _Direct("nvmlDeviceGetClockInfo(SM)", (i["sm_clock_hertz"],),
                one("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_SM)),
        _Direct("nvmlDeviceGetClockInfo(MEM)", (i["memory_clock_hertz"],),
                one("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM)),
        _Direct("nvmlDeviceGetCurrentClocksEventReasons", (i["clock_event_reasons"],),
                clock_reasons),
        _Direct("nvmlDeviceGetPcieThroughput(TX)", (i["pcie_transmit_bytes_per_second"],),
                one("nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_TX_BYTES)),
        _Direct("nvmlDeviceGetPcieThroughput(RX)", (i["pcie_receive_bytes_per_second"],),
                one("nvmlDeviceGetPcieThroughput", nv.NVML_PCIE_UTIL_RX_BYTES)),
        _Direct("nvmlDeviceGetFanSpeed", (i["fan_speed_ratio"],), one("nvmlDeviceGetFanSpeed")),
        _Direct("nvmlDeviceGetPerformanceState", (i["performance_state"],),
                one("nvmlDeviceGetPerformanceState")),
        _Direct("nvmlDeviceGetTemperatureThreshold(SLOWDOWN)",
                (i["slowdown_temperature_celsius"],),
                one("nvmlDeviceGetTemperatureThreshold",
                    nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)),
    ]


def _fallbacks() -> dict[int, _Direct]:
    """Direct calls for field-value metrics, used when a field is not supported."""
    i = _ID
    out: dict[int, _Direct] = {}

    def add(call: str, names: tuple[str, ...], read: Reader) -> None:
        d = _Direct(call, tuple(i[n] for n in names), read)
        for n in names:
            out[i[n]] = d

    add("nvmlDeviceGetTotalEnergyConsumption", ("energy_consumption_joules_total",),
        lambda n, h: (float(n.nvmlDeviceGetTotalEnergyConsumption(h)),))
    add("nvmlDeviceGetPcieReplayCounter", ("pcie_replay_errors_total",),
        lambda n, h: (float(n.nvmlDeviceGetPcieReplayCounter(h)),))
    for name, kind, counter in (
        ("ecc_sbe_volatile_total", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC"),
        ("ecc_dbe_volatile_total", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC"),
        ("ecc_sbe_aggregate_total", "NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC"),
        ("ecc_dbe_aggregate_total", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC"),
    ):
        add(f"nvmlDeviceGetTotalEccErrors({kind[23:]},{counter[5:]})", (name,),
            (lambda k, c: lambda n, h: (float(n.nvmlDeviceGetTotalEccErrors(
                h, getattr(n, k), getattr(n, c))),))(kind, counter))
    for name, cause in (
        ("retired_pages_sbe", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
        ("retired_pages_dbe", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR"),
    ):
        add(f"nvmlDeviceGetRetiredPages({name[-3:]})", (name,),
            (lambda c: lambda n, h: (float(len(n.nvmlDeviceGetRetiredPages(
                h, getattr(n, c)))),))(cause))

    def remapped(n: Any, h: Any) -> tuple[float, ...]:
        corr, unc, _pending, failure = n.nvmlDeviceGetRemappedRows(h)
        return float(corr), float(unc), float(failure)

    d = _Direct("nvmlDeviceGetRemappedRows", (i["remapped_rows_correctable"],
                i["remapped_rows_uncorrectable"], i["row_remap_failure"]), remapped)
    for mid in d.ids:
        out[mid] = d
    return out


def _handle_key(handle: Any) -> int:
    """A hashable identity for an NVML device handle (a ctypes pointer)."""
    try:
        value = ctypes.cast(handle, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return id(handle)
    return int(value) if value is not None else id(handle)


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


@dataclass(slots=True)
class _Gpu:
    index: int
    handle: Any
    uuid: str
    fields: list[tuple[int, int, int, bool]]
    """(catalog id, field id, scope id, is_rate) still read through nvmlDeviceGetFieldValues."""
    direct: list[_Direct]
    lost: bool = False
    inventory: dict[str, Any] | None = None
    last_rate: dict[int, tuple[float, int]] | None = None
    """For rate fields: catalog id -> (last raw value, its NVML timestamp in us)."""


class NvmlSource(Source):
    """Reads every NVML-backed catalog metric of every GPU. See the module docstring."""

    name = "nvml"

    def __init__(self, bindings: Any = None, *, events: bool = True,
                 event_wait_ms: int = 1000) -> None:
        self._nv = bindings
        self.events_enabled = events
        self.event_wait_ms = event_wait_ms
        self.errors: Counter[str] = Counter()
        self._errors_lock = threading.Lock()  # the sampler's worker, the event thread, /metrics
        self.gpus: list[_Gpu] = []
        self._err_names: dict[int, str] = {}
        self._give_up: set[int] = set()
        self._by_handle: dict[int, _Gpu] = {}
        self._events: queue.SimpleQueue[SourceEvent] = queue.SimpleQueue()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._started = False
        self._ids = np.zeros(0, dtype=np.uint16)
        self._col: dict[int, int] = {}
        self._scales: list[tuple[int, int]] = []
        self._gpu_index = np.zeros(0, dtype=np.int32)
        self._uuids: tuple[str, ...] = ()
        self._raw = np.empty((0, 0))
        self._next_inventory = 0.0

    # ------------------------------------------------------------------ lifecycle

    def describe(self) -> str:
        return f"NVML: {len(self.gpus)} GPUs, {len(self._ids)} metrics, events " \
               f"{'on' if self._thread else 'off'}"

    def error_counts(self) -> dict[str, int]:
        with self._errors_lock:
            return dict(self.errors)

    async def start(self) -> None:
        if self._started:
            return
        await asyncio.to_thread(self._start_blocking)

    def _start_blocking(self) -> None:
        if self._nv is None:
            try:
                import pynvml
            except ImportError as exc:
                raise SourceError("nvidia-ml-py (pynvml) is not installed",
                                  retriable=False) from exc
            self._nv = pynvml
        nv = self._nv
        self._err_names = {getattr(nv, n): n[len("NVML_ERROR_"):].lower()
                           for n in dir(nv) if n.startswith("NVML_ERROR_")}
        self._give_up = {getattr(nv, n) for n in _GIVE_UP if hasattr(nv, n)}
        try:
            nv.nvmlInit()
            count = nv.nvmlDeviceGetCount()
        except nv.NVMLError as exc:
            self._count(exc)
            raise SourceError(f"NVML is not usable: {exc}", retriable=False) from exc
        self._started = True
        directs = _direct_readers(nv)
        for index in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(nv.nvmlDeviceGetUUID(handle))
            except nv.NVMLError as exc:
                self._count(exc)
                log.error("GPU %d: cannot open it (%s); it is left out", index, exc)
                continue
            fields = [(_ID[name], getattr(nv, const), scope, rate)
                      for name, (const, scope, rate) in _FIELDS.items() if hasattr(nv, const)]
            gpu = _Gpu(index, handle, uuid, fields, list(directs), last_rate={})
            self.gpus.append(gpu)
            self._by_handle[_handle_key(handle)] = gpu
        # The probe: ask every GPU for everything once; what is unsupported is dropped here.
        supported: set[int] = set()
        for gpu in self.gpus:
            row: dict[int, float] = {}
            self._read_gpu(gpu, row)
            supported.update(mid for mid in row)
            supported.update(mid for mid, *_ in gpu.fields)
            supported.update(mid for d in gpu.direct for mid in d.ids)
        if self.events_enabled and self.gpus:
            self._start_events()
            if self._event_set is not None:
                supported.add(XID_ID)
        ids = sorted(supported)
        self._ids = np.asarray(ids, dtype=np.uint16)
        self._col = {mid: j for j, mid in enumerate(ids)}
        self._scales = [BY_ID[mid].nvml_scale for mid in ids]
        self._gpu_index = np.asarray([g.index for g in self.gpus], dtype=np.int32)
        self._uuids = tuple(g.uuid for g in self.gpus)
        self._raw = np.full((len(self.gpus), len(ids)), np.nan)
        for ev in self._refresh_inventory(time.time_ns() // 1_000_000):
            self._events.put(ev)
        log.info("NVML: %d GPUs, %d metrics supported; unsupported calls: %s", len(self.gpus),
                 len(ids), dict(self.errors) or "none")

    async def close(self) -> None:
        if not self._started:
            return
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, self.event_wait_ms / 1000 + 2)
        nv = self._nv
        try:
            if self._event_set is not None:
                nv.nvmlEventSetFree(self._event_set)
            nv.nvmlShutdown()
        except nv.NVMLError as exc:
            self._count(exc)
        self._started = False

    # ------------------------------------------------------------------ errors

    def _count(self, exc: Any) -> str:
        kind = self._err_names.get(getattr(exc, "value", -1), "unknown")
        with self._errors_lock:
            self.errors[kind] += 1
        return kind

    def _lost(self, gpu: _Gpu, ts_ms: int, where: str) -> None:
        if not gpu.lost:
            gpu.lost = True
            log.error("GPU %d (%s) is lost (NVML GPU_IS_LOST in %s): its samples are NaN "
                      "until it is reset", gpu.index, gpu.uuid, where)
            self._events.put(SourceEvent(EventKind.GPU_LOST, ts_ms, gpu.index, gpu.uuid,
                                         {"where": where}))

    # ------------------------------------------------------------------ reading

    def _read_gpu(self, gpu: _Gpu, row: dict[int, float], ts_ms: int = 0) -> None:
        """Fill ``row`` (catalog id -> native value) for one GPU; drops unsupported reads."""
        nv = self._nv
        lost_code = nv.NVML_ERROR_GPU_IS_LOST
        fallbacks: list[_Direct] = []
        if gpu.fields:
            try:
                results = nv.nvmlDeviceGetFieldValues(
                    gpu.handle, [(fid, scope) for _mid, fid, scope, _rate in gpu.fields])
            except nv.NVMLError as exc:
                self._count(exc)
                if exc.value == lost_code:
                    self._lost(gpu, ts_ms, "nvmlDeviceGetFieldValues")
                    return
                if exc.value in self._give_up:  # no batching on this driver: all direct
                    fallbacks = self._to_direct(gpu, [f[0] for f in gpu.fields])
                    gpu.fields = []
                results = []
            keep: list[tuple[int, int, int, bool]] = []
            for spec, res in zip(gpu.fields, results, strict=False):
                mid, _fid, _scope, rate = spec
                ret = int(res.nvmlReturn)
                if ret == 0:
                    keep.append(spec)
                    value = float(getattr(res.value, _VALUE_MEMBER[int(res.valueType)]))
                    if rate:
                        value = self._rate(gpu, mid, value, int(res.timestamp))
                    row[mid] = value
                    continue
                self._count(nv.NVMLError(ret))
                if ret == lost_code:
                    self._lost(gpu, ts_ms, "nvmlDeviceGetFieldValues")
                    return
                if ret in self._give_up:
                    fallbacks += self._to_direct(gpu, [mid])
                else:
                    keep.append(spec)  # transient (timeout, ...): try again next tick
            if results:
                gpu.fields = keep
        for d in fallbacks:
            if d not in gpu.direct:
                gpu.direct.append(d)
        for d in list(gpu.direct):
            try:
                values = d.read(nv, gpu.handle)
            except nv.NVMLError as exc:
                self._count(exc)
                if exc.value == lost_code:
                    self._lost(gpu, ts_ms, d.call)
                    return
                if exc.value in self._give_up:
                    gpu.direct.remove(d)
                continue
            for mid, value in zip(d.ids, values, strict=True):
                row[mid] = value

    @staticmethod
    def _to_direct(gpu: _Gpu, ids: list[int]) -> list[_Direct]:
        fb = _FALLBACKS
        return [fb[mid] for mid in ids if mid in fb]

    @staticmethod
    def _rate(gpu: _Gpu, mid: int, value: float, ts_us: int) -> float:
        """KiB counter -> bytes per second between this reading and the last one."""
        assert gpu.last_rate is not None
        prev = gpu.last_rate.get(mid)
        gpu.last_rate[mid] = (value, ts_us)
        if prev is None or ts_us <= prev[1] or value < prev[0]:
            return math.nan
        return (value - prev[0]) * 1024.0 * 1e6 / (ts_us - prev[1])

    def _read_all(self, ts_ms: int) -> tuple[npt.NDArray[np.float64], list[SourceEvent]]:
        raw = self._raw
        raw.fill(np.nan)
        col = self._col
        row: dict[int, float] = {}
        for r, gpu in enumerate(self.gpus):
            if gpu.lost:
                continue
            row.clear()
            self._read_gpu(gpu, row, ts_ms)
            if gpu.lost:
                raw[r].fill(np.nan)
                continue
            for mid, value in row.items():
                j = col.get(mid)
                if j is not None:
                    raw[r, j] = value
        events: list[SourceEvent] = []
        xid_col = col.get(XID_ID)
        while True:
            try:
                ev = self._events.get_nowait()
            except queue.Empty:
                break
            events.append(ev)
            if ev.kind is EventKind.XID and xid_col is not None and ev.gpu is not None:
                rows = np.flatnonzero(self._gpu_index == ev.gpu)
                raw[rows, xid_col] = float(ev.data["xid"])
        if time.monotonic() >= self._next_inventory:
            events += self._refresh_inventory(ts_ms)
        out = np.empty_like(raw)
        for j, scale in enumerate(self._scales):
            out[:, j] = to_base_units(raw[:, j], scale)
        return out, events

    async def gather(self, ts_ms: int) -> Gathered:
        if not self._started:
            await self.start()
        values, events = await asyncio.to_thread(self._read_all, ts_ms)
        return Gathered(ts_ms=ts_ms, metric_ids=self._ids, extra=(), gpus=self._gpu_index,
                        uuids=self._uuids, values=values, events=tuple(events))

    # ------------------------------------------------------------------ inventory

    def _inventory_of(self, gpu: _Gpu, driver: str | None) -> dict[str, Any]:
        nv = self._nv
        inv: dict[str, Any] = {"uuid": gpu.uuid, "driver": driver, "source": "nvml"}

        def get(key: str, fn: Callable[[], Any]) -> None:
            try:
                inv[key] = fn()
            except nv.NVMLError as exc:
                self._count(exc)
                inv[key] = None

        h = gpu.handle
        get("model", lambda: _text(nv.nvmlDeviceGetName(h)))
        get("serial", lambda: _text(nv.nvmlDeviceGetSerial(h)))
        get("vbios", lambda: _text(nv.nvmlDeviceGetVbiosVersion(h)))
        get("inforom", lambda: _text(nv.nvmlDeviceGetInforomImageVersion(h)))
        get("pci_bus_id", lambda: _text(nv.nvmlDeviceGetPciInfo(h).busId))
        get("mig_mode", lambda: int(nv.nvmlDeviceGetMigMode(h)[0]))
        return inv

    def _refresh_inventory(self, ts_ms: int) -> list[SourceEvent]:
        self._next_inventory = time.monotonic() + INVENTORY_REFRESH_S
        nv = self._nv
        try:
            driver: str | None = _text(nv.nvmlSystemGetDriverVersion())
        except nv.NVMLError as exc:
            self._count(exc)
            driver = None
        out = []
        for gpu in self.gpus:
            if gpu.lost:
                continue
            inv = self._inventory_of(gpu, driver)
            if inv != gpu.inventory:
                gpu.inventory = inv
                ev = SourceEvent(EventKind.INVENTORY, ts_ms, gpu.index, gpu.uuid, dict(inv))
                out.append(ev)
        return out

    # ------------------------------------------------------------------ events thread

    def _start_events(self) -> None:
        nv = self._nv
        wanted = (nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeSingleBitEccError
                  | nv.nvmlEventTypeDoubleBitEccError)
        try:
            self._event_set = nv.nvmlEventSetCreate()
        except nv.NVMLError as exc:
            self._count(exc)
            log.warning("NVML events unavailable (%s): no XID/ECC events", exc)
            return
        registered = 0
        for gpu in self.gpus:
            try:
                mask = wanted & int(nv.nvmlDeviceGetSupportedEventTypes(gpu.handle))
                if mask:
                    nv.nvmlDeviceRegisterEvents(gpu.handle, mask, self._event_set)
                    registered += 1
            except nv.NVMLError as exc:
                self._count(exc)
                log.warning("GPU %d: cannot register NVML events: %s", gpu.index, exc)
        if not registered:
            nv.nvmlEventSetFree(self._event_set)
            self._event_set = None
            return
        self._thread = threading.Thread(target=self._event_loop, name="nvml-events",
                                        daemon=True)
        self._thread.start()

    def _event_loop(self) -> None:
        """Wait on the event set; queue what arrives. Runs until close()."""
        nv = self._nv
        timeout_code = nv.NVML_ERROR_TIMEOUT
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait(self._event_set, self.event_wait_ms)
            except nv.NVMLError as exc:
                if exc.value == timeout_code:
                    continue
                self._count(exc)
                self._stop.wait(1.0)  # do not spin on a persistent error
                continue
            ts_ms = time.time_ns() // 1_000_000
            gpu = self._by_handle.get(_handle_key(data.device))
            index = gpu.index if gpu else None
            uuid = gpu.uuid if gpu else None
            etype = int(data.eventType)
            if etype & nv.nvmlEventTypeXidCriticalError:
                self._events.put(SourceEvent(EventKind.XID, ts_ms, index, uuid,
                                             {"xid": int(data.eventData), "source": "nvml"}))
            if etype & (nv.nvmlEventTypeSingleBitEccError | nv.nvmlEventTypeDoubleBitEccError):
                bits = "double" if etype & nv.nvmlEventTypeDoubleBitEccError else "single"
                self._events.put(SourceEvent(EventKind.ECC, ts_ms, index, uuid,
                                             {"bits": bits, "source": "nvml"}))


_FALLBACKS: Final = _fallbacks()


@register_source("nvml")
def _open(ctx: SourceContext) -> Source:
    opts = ctx.options
    return NvmlSource(events=bool(opts.get("events", True)),
                      event_wait_ms=int(opts.get("event_wait_ms", 1000)))

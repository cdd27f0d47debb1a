"""Heat: rack inlet air, die and HBM temperatures, and the clock governor that reacts to them.

Temperatures follow a first-order lag towards ``inlet + R * power`` (R is the GPU's thermal
resistance to the air, a few hundredths of a degree per watt on an SXM heat sink), so a
power step shows as an exponential approach over tens of seconds, not a jump. The inlet is
per rack: a base temperature, a slow daily swing, and, under a cooling fault, a ramp that
every GPU of the rack feels.

The governor decides the SM clock from the previous tick's reported temperature and from the
power the load would draw, and records *why* the clock is below maximum in NVML's clock
event reasons bitmask (``nvmlClocksEventReason*``, formerly ``nvmlClocksThrottleReason*``),
with the driver's real bit values.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

__all__ = [
    "GPU_IDLE",
    "HW_POWER_BRAKE_SLOWDOWN",
    "HW_SLOWDOWN",
    "HW_THERMAL_SLOWDOWN",
    "SW_POWER_CAP",
    "SW_THERMAL_SLOWDOWN",
    "Governor",
    "Inlet",
    "quantize_clock_mhz",
]

# nvml.h: nvmlClocksEventReason* (bit values are part of the driver ABI).
GPU_IDLE: Final = 0x1
APPLICATIONS_CLOCKS_SETTING: Final = 0x2
SW_POWER_CAP: Final = 0x4
HW_SLOWDOWN: Final = 0x8
SYNC_BOOST: Final = 0x10
SW_THERMAL_SLOWDOWN: Final = 0x20
HW_THERMAL_SLOWDOWN: Final = 0x40
HW_POWER_BRAKE_SLOWDOWN: Final = 0x80

SM_CLOCK_MAX_MHZ: Final = 1980
SM_CLOCK_IDLE_MHZ: Final = 345
SM_CLOCK_MIN_MHZ: Final = 210
CLOCK_STEP_MHZ: Final = 15
"""H100 SM clocks come in 15 MHz steps (nvmlDeviceGetSupportedGraphicsClocks)."""
MEM_CLOCK_MHZ: Final = 2619
SLOWDOWN_C: Final = 89
"""nvmlDeviceGetTemperatureThreshold(SLOWDOWN) of an H100 SXM."""
SW_THERMAL_C: Final = 85
"""Above this the driver trims clocks in software before the hardware slowdown."""

F64 = npt.NDArray[np.float64]


def quantize_clock_mhz(mhz: F64) -> F64:
    """Round to the nearest supported clock step, clipped to the supported range."""
    q = np.rint(mhz * (1.0 / CLOCK_STEP_MHZ)) * CLOCK_STEP_MHZ
    return np.clip(q, SM_CLOCK_MIN_MHZ, SM_CLOCK_MAX_MHZ)


class Inlet:
    """Per-rack inlet air temperature in degrees C."""

    def __init__(self, racks: int, rng: np.random.Generator) -> None:
        self.base = rng.uniform(21.0, 27.0, racks)
        self.phase = rng.uniform(0.0, 2 * np.pi, racks)

    def at(self, t_s: float, extra: F64 | None = None) -> F64:
        """Inlet per rack at ``t_s``; ``extra`` adds a fault's heating per rack."""
        day = self.base + 1.5 * np.sin(self.phase + t_s * (2 * np.pi / 86_400.0))
        return day if extra is None else day + extra


@dataclass(slots=True)
class Governor:
    """Per-GPU electrical constants and the clock decision.

    Power is modelled as ``idle + dynamic * util * f**2`` where ``f`` is the clock fraction
    (dynamic power goes roughly with frequency times voltage squared; over the DVFS range the
    square is a fair fit). The power cap solves that for ``f``.
    """

    idle_w: F64
    dynamic_w: F64
    limit_w: F64

    def decide(
        self,
        util: F64,
        busy: npt.NDArray[np.bool_],
        temp_c: F64,
        cap: F64 | None,
        cap_bits: npt.NDArray[np.int64] | None,
    ) -> tuple[F64, F64, npt.NDArray[np.int64]]:
        """Return (clock fraction f, SM clock MHz, reasons bitmask) for every GPU.

        ``temp_c`` is the last *reported* temperature: the driver reacts to its own sensor.
        ``cap``/``cap_bits`` carry a fault's clock ceiling and the reason it reports (a power
        brake sets HW_SLOWDOWN | HW_POWER_BRAKE_SLOWDOWN; a straggler reports nothing).
        """
        u = util * 0.01
        headroom = (self.limit_w - self.idle_w) / np.maximum(self.dynamic_w * u, 1e-9)
        f = np.sqrt(np.clip(headroom, 0.0, 1.0))
        reasons = np.where(f < 1.0, SW_POWER_CAP, 0).astype(np.int64)
        hot = temp_c >= SW_THERMAL_C
        if hot.any():
            f = np.minimum(f, np.where(hot, np.clip(1.0 - 0.07 * (temp_c - 84.0), 0.35, 1.0),
                                       1.0))
            reasons |= np.where(hot, SW_THERMAL_SLOWDOWN, 0)
            very = temp_c >= SLOWDOWN_C
            f = np.where(very, np.minimum(f, 0.5), f)
            reasons |= np.where(very, HW_SLOWDOWN | HW_THERMAL_SLOWDOWN, 0)
        if cap is not None and cap_bits is not None:
            f = np.minimum(f, cap)
            reasons |= cap_bits
        mhz = np.where(busy, quantize_clock_mhz(SM_CLOCK_MAX_MHZ * f), SM_CLOCK_IDLE_MHZ)
        reasons = np.where(busy, reasons, reasons | GPU_IDLE)
        return f, mhz, reasons

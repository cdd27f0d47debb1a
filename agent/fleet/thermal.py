"""Heat: rack inlet air, die and HBM temperatures, and the clock governor that reacts to them.

Temperatures follow a first-order lag towards ``inlet + R * power`` (R is the GPU's thermal
resistance to the air, a few hundredths of a degree per watt on an SXM heat sink), so a
power step shows as an exponential approach over tens of seconds, not a jump. The inlet is
per rack: a base temperature, a slow daily swing, and, under a cooling fault, a ramp that
every GPU of the rack feels.

The zoo (:mod:`agent.fleet.zoo`) varies the time constants (:func:`lag_factor`, 2 s for a bare
air-cooled die to 2 min for a cold plate with a large coolant loop), the resistances, the inlet
range and swing, and the sensors' resolution (:func:`quantize_temp`: NVML's whole degrees, or
tenths / halves as some boards report through DCGM).

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
    "lag_factor",
    "quantize_clock_mhz",
    "quantize_temp",
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


def lag_factor(dt_s: float, tau_s: float) -> float:
    """The first-order lag's step per tick: ``x += (target - x) * lag_factor(dt, tau)``."""
    return 1.0 - float(np.exp(-dt_s / tau_s))


def quantize_temp(celsius: F64, steps_per_c: int) -> F64:
    """Round a temperature to the sensor's resolution, ``1 / steps_per_c`` degrees.

    Whole degrees are NVML's ``nvmlDeviceGetTemperature``; 2 or 10 steps give the halves and
    tenths that some boards report. ``k / 10.0`` is the double that parsing "k/10" gives.
    """
    if steps_per_c == 1:
        return np.rint(celsius)
    return np.rint(celsius * float(steps_per_c)) / float(steps_per_c)


class Inlet:
    """Per-rack inlet air (or coolant) temperature in degrees C.

    ``base_c`` is the range each rack's base is drawn from, ``swing_c`` the amplitude of the
    daily sine (each rack at its own phase).
    """

    def __init__(self, racks: int, rng: np.random.Generator,
                 base_c: tuple[float, float] = (21.0, 27.0), swing_c: float = 1.5) -> None:
        self.base = rng.uniform(base_c[0], base_c[1], racks)
        self.phase = rng.uniform(0.0, 2 * np.pi, racks)
        self.swing_c = swing_c

    def at(self, t_s: float, extra: F64 | None = None) -> F64:
        """Inlet per rack at ``t_s``; ``extra`` adds a fault's heating per rack."""
        day = self.base + self.swing_c * np.sin(self.phase + t_s * (2 * np.pi / 86_400.0))
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

"""The fleet zoo: fleet profiles drawn from wide, documented ranges, to tune and test detectors.

One synthetic fleet model teaches a detector that fleet's habits (a die that follows power
within seconds, a power limit that is always there, one workload mix). A profile fixes what
differs between real fleets: cooling (time constants from 2 s to 2 min, thermal resistance,
inlet), sensors (whole degrees or tenths, noise, power resolution), power (limit and idle),
workloads (mix and phase lengths of idle, lock-step and pipeline training, bursty and random
inference, jobs on part of a node), which metrics the exporter has, and the sample rate.

- :class:`FleetProfile` defaults to today's model, bit for bit (``FleetProfile()`` is
  ``NAMED_PROFILES["default"]``).
- :func:`draw_profile` draws every field from the ranges documented on the fields; tune on
  :data:`ZOO_TUNING_SEEDS`, report on :data:`ZOO_HELDOUT_SEEDS` (other draws of the same ranges).
- :data:`NAMED_PROFILES` are hand-set corners: the independent fleet the detector failed on
  (``liquid_cooled_integer``), and one profile per hard feature.

Use: ``generate(gpus, p.hz, duration_s, faults=K, seed=S, profile=p)`` or
``profile, data = generate_zoo(seed, gpus, duration_s, faults)`` (:mod:`agent.fleet.export`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Final

import numpy as np

from agent.fleet.workloads import KIND_NAMES, WorkloadParams
from schemas.catalog import CATALOG

__all__ = [
    "DCGM_EXPORTER_DEFAULT_FIELDS",
    "DCGM_EXPORTER_MISSING",
    "NAMED_PROFILES",
    "NO_MEMORY_TEMPERATURE",
    "NO_NVLINK",
    "NO_POWER_LIMIT",
    "ZOO_HELDOUT_SEEDS",
    "ZOO_TUNING_SEEDS",
    "FleetProfile",
    "draw_profile",
    "named_or_drawn",
]

_NVML_METRICS: Final = tuple(m.name for m in CATALOG if m.nvml is not None)
"""The model's columns (agent.fleet.model.METRICS, which imports this module)."""

DCGM_EXPORTER_DEFAULT_FIELDS: Final = frozenset({
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    # The default file has DCGM_FI_DEV_PCIE_{TX,RX}_THROUGHPUT (the same NVML PCIe counters,
    # in KB); the catalog names the profiling field for that quantity.
    "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_PROF_PCIE_RX_BYTES",
})
"""The catalog's fields that dcgm-exporter collects out of the box (``etc/default-counters.csv``:
ECC, NVLink error counters, clock-event reasons, power limit, fan and P-state are commented out
or absent; NVLink throughput comes only as one total, not as TX / RX)."""

DCGM_EXPORTER_MISSING: Final = tuple(
    m.name for m in CATALOG
    if m.nvml is not None and (m.dcgm is None or m.dcgm not in DCGM_EXPORTER_DEFAULT_FIELDS))
"""The model's metrics a default dcgm-exporter does not export (NaN in such a profile)."""
NO_POWER_LIMIT: Final = ("fleetpulse_gpu_power_limit_watts",)
NO_NVLINK: Final = tuple(n for n in _NVML_METRICS if "_nvlink_" in n)
NO_MEMORY_TEMPERATURE: Final = ("fleetpulse_gpu_memory_temperature_celsius",)

ZOO_TUNING_SEEDS: Final = tuple(range(12))
"""Draws to choose thresholds and settings on."""
ZOO_HELDOUT_SEEDS: Final = tuple(range(1000, 1999))
"""Draws the settings never saw: same ranges, other seeds; report these separately. A draw
whose misses or false pages someone has studied is tuning data in all but name, so the
detection benchmark reports on the draws after it (``--zoo-heldout-from``, an index): draws
1000-1005 were studied in the stop that added the rest path, 1006-1011 and 1012-1017 in the
next (the node-peer stuck path), 1018-1023 after the peer path waited for a settled median,
so the next held-out report starts at index 24 (draw 1024). The soak's parts take the draws
from ``--draws-from`` on (``benchmarks.detection_soak``: healthy fleets, where only false
pages count): 1030-1047 and, wrapping round, 1000-1005 were soaked at f368331 and its two
false pages studied (1031, 1040), so the next soak starts at index 48 (draw 1048).
Since then: 1048-1071 soaked at 2f37a17 (1058 studied), 1024-1029 and 1041-1046 zoo-run and
studied, 1047-1052 zoo-run at 506da05, 1072-1097 soaked at 955a554 (1088 studied),
1059-1064 zoo-run at 1aba66d (1060 studied), 1065-1070 zoo-run at 8d5f55b (its misses
rerun on older code), 1098-1123 soaked at 8d5f55b (1119 studied), 1053-1057 zoo-run at
fa9655c (1054 studied), 1124-1149 soaked at fa9655c (1149 studied), 1150-1155 zoo-run at
996b0f9, 1156-1181 soaked at 8ae769e, 1182-1187 zoo-run at 8ae769e (1186 studied),
1188-1193 zoo-run at 18e4c53, 1194 zoo-run on a change not kept (its figures not read). A
draw soaked without a false page showed nothing to tune on, but the next reports start past
all of these: the next zoo at index 195 (draws 1195-1200), the next soak at index 201 (draw
1201). Then: 1195-1200 zoo-run at 33e7e02 (1197 studied), 1201-1206 at 6154e57, 1207-1232
soaked at 6154e57 (1207 studied), 1233-1238 zoo-run at 7808442 (1233 studied), 1239-1247
soaked at 7808442 (stopped after 8 parts), 1265-1270 zoo-run at db41651 (1269 studied),
1300-1305 zoo-run and 1271-1296 soaked at c163dcd (1248-1264 and 1297-1299 not run; 1277
and 1292 studied). The draws now run to 1599 (the mapping of draws below 300 is unchanged).
Then: 1306-1311 zoo-run and 1312-1337 soaked at 51bd4b3 (1310 studied); 1338-1343 zoo-run
and 1344-1363 soaked on a change not landed (the 2 s candidate lag, measured from a
worktree of 688e05d; 1342-1343 rerun at 688e05d, 1342-1343 studied). That change landed as
d112880; 1364-1369 zoo-run at d112880 (1367 and 1369 studied), 1370-1395 soaked at e3ec346,
1396-1401 zoo-run at 5ddc9e2 (1398-1399 rerun at e3ec346); 1402-1407 zoo-run at 5dbdad0 and
again with 4dc4d60's forest screen (and since rerun at 5ec9038, 81fe6be and 91d2759);
1408-1413 zoo-run at 76cb2ab and at 31818ab, 1414-1439 soaked at 76cb2ab; 1440-1445 zoo-run
at 8d2ddd7 and at ca43139, 1446-1471 soaked at 8d2ddd7; 1472-1477 zoo-run at 0b781ad (and
since at 73d6657 and fbc7013), 1478-1481 soaked at 0b781ad (stopped after four parts for
fbc7013), 1482-1507 soaked at fbc7013 (1496 studied), 1508-1513 zoo-run at fbc7013 and
73d6657 (and since at fd7fb75, as 1472-1477), 1514-1519 zoo-run at 654d3c7, 1520-1545
soaked at fd7fb75, 1546-1551 and 1552-1557 zoo-run at b565cd6, 1558-1563 zoo-run at
6396e28 and d61974b (1558 studied), 1564-1589 soaked at d61974b (1571 and 1584 studied).
The draws now run to 1998 (every draw below 1600 is the one it was; 999 of them, so no seed,
1000 on, is also an index and a seed given as ``--zoo-heldout-from`` is still refused).
1590-1591 zoo-run at 12f2852 (the run stopped at 1592 on a scoring IndexError, b769438),
1590-1595 zoo-run at ef57bfa (1590 studied), 1596-1621 soaked at ef57bfa. Then 1622-1627
zoo-run at 3dc4e60 (1625 and 1626 studied), 1628-1633 at b6542cf (1629 and 1633 studied),
1634-1639 at 73b8f5a (1635 studied), 1640-1665 soaked at 73b8f5a. Then 1666-1671 zoo-run at
fa43f1b (1669 and 1671 studied, 1669 and 1671 rerun at 511aa9a), 1672-1697 soaked at
8425856 (a soak of fa43f1b on them was stopped after five minutes for 8425856, its output
not read), 1698-1703 zoo-run at 8425856 (1702 studied). Then 1704-1709 zoo-run at
cd89f98, 1710-1735 soaked at cd89f98, 1736-1741 zoo-run at bcbf41b (cd89f98's rules; both
sets rerun after for the per-fault record and studied), 1742-1747 zoo-run at 4fe4cc1 (and
then at bcbf41b), 1748-1773 soaked at 4fe4cc1. Then 1774-1779 zoo-run at b2f5d18 and at
ee1121b, 1780-1805 soaked at b2f5d18, 1806-1811 zoo-run at b2f5d18 and at ee1121b,
1812-1817 and 1818-1823 zoo-run at b2f5d18, so the next zoo starts at index 824 (draw 1824),
the next soak at index 830 (draw 1830)."""


@dataclass(frozen=True, slots=True)
class FleetProfile:
    """What one fleet is like. Defaults are today's model; ranges are what :func:`draw_profile`
    draws from (a named profile may sit anywhere inside them)."""

    name: str = "default"
    """For reports: ``default``, a :data:`NAMED_PROFILES` key, or ``zoo-<seed>``."""
    hz: float = 1.0
    """Samples per second, 0.2 .. 10 (drawn from 0.2, 0.5, 1, 2, 5, 10; 1 Hz most often).
    dcgm-exporter scrapes every 30 s by default, NVML agents 1-10 Hz; the model takes its hz from
    the caller (``generate(gpus, profile.hz, ...)``), this is the profile's suggestion."""
    cooling: str = "air"
    """``air`` or ``liquid``: which of the cooling ranges below the thermal fields came from."""
    die_tau_s: float = 15.0
    """Die temperature's time constant, 2 .. 120 s. Air: 2-40 s (a bare heat sink follows power
    within seconds); liquid: 20-120 s (cold plate and loop mass: an integer reading can hold
    one value for minutes while power swings by hundreds of watts)."""
    mem_tau_s: float | None = None
    """HBM's time constant, 3 .. 180 s (drawn 1-2x the die's: the stacks sit beside the die
    and heat through it). None: the default model's, 0.7 x the die's per-tick lag."""
    r_die_c_per_w: tuple[float, float] = (0.057, 0.066)
    """Range of die-to-inlet thermal resistance per GPU, degC/W, 0.012 .. 0.17. Drawn so that
    full power lifts the die 30-50 C above inlet on air and 12-28 C on liquid."""
    r_mem_c_per_w: tuple[float, float] = (0.050, 0.060)
    """Range of HBM-to-inlet resistance, degC/W: 0.8-1.0 x the die's."""
    inlet_c: tuple[float, float] = (21.0, 27.0)
    """Range of each rack's base inlet (air, or coolant for liquid), C. Air: low end 16-27, 1-6
    wide (ASHRAE A1 allows 15-32); liquid: low end 20-38 (warm-water loops), 1-4 wide."""
    inlet_swing_c: float = 1.5
    """Amplitude of the daily inlet sine, 0 .. 4 C (air) / 0 .. 1.5 C (liquid)."""
    temp_resolution_c: float = 1.0
    """Temperature sensor step: 1.0 (NVML's whole degrees; 60 % of draws), 0.5 or 0.1 (some
    boards through DCGM). Both die and HBM."""
    temp_noise_c: float = 0.25
    """Sensor noise before rounding, sigma in C, 0 .. 0.4 (0 in 30 % of draws: a quiet
    sensor with whole degrees holds one value exactly)."""
    power_limit_w: float = 700.0
    """Enforced power limit, 300 .. 700 W: 300 (A100 PCIe), 350 (H100 PCIe, L40S), 400 (A100
    SXM), 450, 500, 600 (H200 NVL), 700 (H100 / H200 SXM)."""
    idle_w: tuple[float, float] = (64.0, 76.0)
    """Range of per-GPU idle power, W: low end 7-15 % of the limit, high end 5-25 % above it."""
    dynamic_w: float = 630.0
    """Power at 100 % utilisation and full clock above idle, W: 0.85-1.2 x (limit - idle), so
    in some fleets training runs into the power cap (SW_POWER_CAP, clocks trimmed)."""
    dynamic_spread: float = 0.035
    """Per-GPU spread of ``dynamic_w`` (relative sigma), 0.01 .. 0.06 (silicon lottery)."""
    power_noise_w: float = 2.5
    """Power reading noise, sigma in W, 0.5 .. 12 (log-uniform)."""
    power_resolution_w: float = 0.001
    """Power reading step: 0.001 (NVML mW; 60 %), 0.1 or 1.0 (BMC / Redfish style; 20 % each)."""
    mix: tuple[float, ...] = (0.2, 0.45, 0.35, 0.0, 0.0, 0.0)
    """Probability of each workload when a node starts a phase, in ``KIND_NAMES`` order (idle,
    train = data-parallel lock step, infer = bursty, pipeline = pipeline-parallel bubbles,
    infer_random = utilisation uniform at random every tick, partial = a job on k of the
    node's GPUs). Drawn from a Dirichlet(1, 1.5, 1, 0.8, 0.8, 0.8): any mix, none excluded."""
    mean_phase_s: tuple[float, ...] = (300.0, 1800.0, 900.0, 1800.0, 600.0, 1200.0)
    """Mean phase length per kind, s (exponential). Drawn log-uniform: idle 120 .. 14,400 (long
    idle too), train 600 .. 7200, infer 300 .. 3600, pipeline 600 .. 7200, infer_random
    300 .. 2400, partial 300 .. 3600."""
    train_period_s: tuple[float, float] = (2.5, 9.0)
    """Range of a training step (all-reduce rhythm or pipeline step), s: low end 1-4, high
    end 1.5-4 x that."""
    bubble_frac: tuple[float, float] = (0.1, 0.3)
    """Range of a pipeline stage's bubble, fraction of a step: low end 0.05-0.2, 0.05-0.25
    wide ((p - 1) / (m + p - 1) for p stages and m micro-batches)."""
    random_util_pct: tuple[float, float, float, float] = (0.0, 30.0, 60.0, 100.0)
    """A random-inference job's utilisation band [lo, hi]: lo drawn in the first pair, hi in
    the second (fixed; per-job draws)."""
    missing: tuple[str, ...] = ()
    """Catalog names of metrics absent from this fleet: NaN on every tick. Drawn: power limit
    (35 %), NVLink (20 %), HBM temperature (10 %), the dcgm-exporter default set (20 %,
    :data:`DCGM_EXPORTER_MISSING`), independently."""
    fault_style: str = "classic"
    """How ``generate(faults=K)`` plans faults: ``classic`` (:func:`plan_faults`: fixed sizes,
    the eight classic kinds) or ``zoo`` (:func:`plan_zoo_faults`: sizes from barely visible to
    classic, abrupt or 5-30 min ramps, only kinds the metrics can show, hot_idle included).
    Drawn and named zoo profiles use ``zoo``; ``default`` keeps ``classic``."""
    notes: str = field(default="", compare=False)
    """What the profile stands for (named profiles)."""

    def validate(self) -> None:
        """Raise ValueError naming the first field outside what the model accepts."""
        def check(ok: bool, what: str) -> None:
            if not ok:
                raise ValueError(f"profile {self.name!r}: {what}")

        check(0 < self.hz <= 50, f"hz must be in (0, 50], got {self.hz}")
        check(self.cooling in ("air", "liquid"), f"cooling must be air or liquid: {self.cooling}")
        check(self.die_tau_s > 0, "die_tau_s must be > 0")
        check(self.mem_tau_s is None or self.mem_tau_s > 0, "mem_tau_s must be > 0 or None")
        for name in ("r_die_c_per_w", "r_mem_c_per_w", "inlet_c", "idle_w", "train_period_s",
                     "bubble_frac"):
            lo, hi = getattr(self, name)
            check(lo <= hi, f"{name} must be (low, high), got {(lo, hi)}")
        check(self.r_die_c_per_w[0] > 0 and self.r_mem_c_per_w[0] > 0, "resistances > 0")
        steps = 1.0 / self.temp_resolution_c
        check(self.temp_resolution_c <= 1.0 and abs(steps - round(steps)) < 1e-9,
              f"temp_resolution_c must be 1/k, got {self.temp_resolution_c}")
        check(self.temp_noise_c >= 0 and self.power_noise_w >= 0, "noise must be >= 0")
        mw = self.power_resolution_w * 1000.0
        check(mw >= 1 and abs(mw - round(mw)) < 1e-9,
              f"power_resolution_w must be whole mW, got {self.power_resolution_w}")
        check(self.idle_w[1] < self.power_limit_w, "idle power must be below the limit")
        check(self.dynamic_w > 0 and 0 <= self.dynamic_spread < 0.3, "dynamic_w, spread")
        check(len(self.mix) == len(KIND_NAMES) and len(self.mean_phase_s) == len(KIND_NAMES),
              f"mix and mean_phase_s need {len(KIND_NAMES)} entries ({', '.join(KIND_NAMES)})")
        check(min(self.mix) >= 0 and abs(sum(self.mix) - 1.0) < 1e-9, "mix must sum to 1")
        check(min(self.mean_phase_s) > 0, "mean_phase_s must be > 0")
        check(self.bubble_frac[0] >= 0 and self.bubble_frac[1] < 1, "bubble_frac in [0, 1)")
        lo0, lo1, hi0, hi1 = self.random_util_pct
        check(0 <= lo0 <= lo1 <= 100 and 0 <= hi0 <= hi1 <= 100, "random_util_pct in 0..100")
        unknown = [m for m in self.missing if m not in _NVML_METRICS]
        check(not unknown, f"missing names metrics the model does not produce: {unknown}")
        check(self.fault_style in ("classic", "zoo"), "fault_style must be classic or zoo")

    @property
    def temp_steps_per_c(self) -> int:
        """Sensor steps per degree (1, 2, 10)."""
        return round(1.0 / self.temp_resolution_c)

    @property
    def power_step_mw(self) -> int:
        """Power reading step in mW (1 is NVML's)."""
        return round(self.power_resolution_w * 1000.0)

    def workload_params(self) -> WorkloadParams:
        """What :class:`agent.fleet.workloads.Workloads` needs from the profile."""
        return WorkloadParams(self.mix, self.mean_phase_s, self.train_period_s,
                              self.bubble_frac, self.random_util_pct)


def _log_uniform(rng: np.random.Generator, lo: float, hi: float) -> float:
    return float(math.exp(rng.uniform(math.log(lo), math.log(hi))))


def draw_profile(seed: int) -> FleetProfile:
    """One fleet from the zoo's ranges (documented on :class:`FleetProfile`'s fields).

    Deterministic from ``seed``; the draw order is fixed, so a seed names the same fleet as
    long as the ranges do not change. Cooling is liquid in 40 % of draws.
    """
    rng = np.random.default_rng([seed, 0x200])
    hz = float(rng.choice([0.2, 0.5, 1.0, 2.0, 5.0, 10.0], p=[0.1, 0.15, 0.4, 0.15, 0.1, 0.1]))
    liquid = bool(rng.random() < 0.4)
    limit = float(rng.choice([300.0, 350.0, 400.0, 450.0, 500.0, 600.0, 700.0]))
    idle_lo = limit * rng.uniform(0.07, 0.15)
    idle = (round(idle_lo, 2), round(idle_lo * rng.uniform(1.05, 1.25), 2))
    dynamic = round((limit - 0.5 * (idle[0] + idle[1])) * rng.uniform(0.85, 1.2), 2)
    if liquid:
        tau = _log_uniform(rng, 20.0, 120.0)
        rise = rng.uniform(12.0, 28.0)
        inlet_lo = rng.uniform(20.0, 38.0)
        inlet = (inlet_lo, inlet_lo + rng.uniform(1.0, 4.0))
        swing = rng.uniform(0.0, 1.5)
    else:
        tau = _log_uniform(rng, 2.0, 40.0)
        rise = rng.uniform(30.0, 50.0)
        inlet_lo = rng.uniform(16.0, 27.0)
        inlet = (inlet_lo, inlet_lo + rng.uniform(1.0, 6.0))
        swing = rng.uniform(0.0, 4.0)
    r_mid = rise / limit
    r_die = (r_mid * 0.93, r_mid * 1.07)
    mem_ratio = rng.uniform(0.8, 1.0)
    mem_tau = min(180.0, max(3.0, tau * rng.uniform(1.0, 2.0)))
    resolution = float(rng.choice([1.0, 0.5, 0.1], p=[0.6, 0.15, 0.25]))
    noise_c = 0.0 if rng.random() < 0.3 else rng.uniform(0.0, 0.4)
    power_noise = _log_uniform(rng, 0.5, 12.0)
    power_res = float(rng.choice([0.001, 0.1, 1.0], p=[0.6, 0.2, 0.2]))
    mix = rng.dirichlet([1.0, 1.5, 1.0, 0.8, 0.8, 0.8])
    mix = np.round(mix, 6)
    mix[1] += 1.0 - mix.sum()  # exact sum 1 after rounding (train keeps the remainder)
    means = (
        _log_uniform(rng, 120.0, 14_400.0), _log_uniform(rng, 600.0, 7200.0),
        _log_uniform(rng, 300.0, 3600.0), _log_uniform(rng, 600.0, 7200.0),
        _log_uniform(rng, 300.0, 2400.0), _log_uniform(rng, 300.0, 3600.0),
    )
    period_lo = rng.uniform(1.0, 4.0)
    period = (period_lo, period_lo * rng.uniform(1.5, 4.0))
    bubble_lo = rng.uniform(0.05, 0.2)
    bubble = (bubble_lo, bubble_lo + rng.uniform(0.05, 0.25))
    missing: set[str] = set()
    if rng.random() < 0.35:
        missing.update(NO_POWER_LIMIT)
    if rng.random() < 0.2:
        missing.update(NO_NVLINK)
    if rng.random() < 0.1:
        missing.update(NO_MEMORY_TEMPERATURE)
    if rng.random() < 0.2:
        missing.update(DCGM_EXPORTER_MISSING)
    profile = FleetProfile(
        name=f"zoo-{seed}",
        hz=hz,
        cooling="liquid" if liquid else "air",
        die_tau_s=round(tau, 3),
        mem_tau_s=round(mem_tau, 3),
        r_die_c_per_w=(round(r_die[0], 5), round(r_die[1], 5)),
        r_mem_c_per_w=(round(r_die[0] * mem_ratio, 5), round(r_die[1] * mem_ratio, 5)),
        inlet_c=(round(inlet[0], 2), round(inlet[1], 2)),
        inlet_swing_c=round(swing, 2),
        temp_resolution_c=resolution,
        temp_noise_c=round(noise_c, 3),
        power_limit_w=limit,
        idle_w=idle,
        dynamic_w=dynamic,
        dynamic_spread=round(rng.uniform(0.01, 0.06), 4),
        power_noise_w=round(power_noise, 3),
        power_resolution_w=power_res,
        mix=tuple(float(x) for x in mix),
        mean_phase_s=tuple(round(m, 1) for m in means),
        train_period_s=(round(period[0], 3), round(period[1], 3)),
        bubble_frac=(round(bubble[0], 3), round(bubble[1], 3)),
        missing=tuple(m for m in _NVML_METRICS if m in missing),
        fault_style="zoo",
    )
    profile.validate()
    return profile


_ZOO_DEFAULTS: Final = FleetProfile(fault_style="zoo")

NAMED_PROFILES: Final[dict[str, FleetProfile]] = {
    "default": FleetProfile(notes="today's model: air, 15 s, whole degrees, H100 SXM 700 W"),
    "liquid_cooled_integer": replace(
        _ZOO_DEFAULTS, name="liquid_cooled_integer", cooling="liquid", die_tau_s=90.0,
        mem_tau_s=150.0, r_die_c_per_w=(0.027, 0.033), r_mem_c_per_w=(0.024, 0.030),
        inlet_c=(28.0, 32.0), inlet_swing_c=0.3, temp_noise_c=0.0, power_noise_w=4.0,
        mix=(0.3, 0.4, 0.0, 0.0, 0.3, 0.0), mean_phase_s=(1200.0, 1500.0, 900.0, 1800.0,
                                                           1200.0, 1200.0),
        missing=NO_POWER_LIMIT,
        notes="the independent fleet the detector failed on: integer C, 90 s thermal mass, "
              "no power limit metric, 5-40 min phases of idle / training / random inference"),
    "inference_random": replace(
        _ZOO_DEFAULTS, name="inference_random", die_tau_s=8.0, mem_tau_s=12.0,
        r_die_c_per_w=(0.11, 0.13), r_mem_c_per_w=(0.09, 0.11), inlet_c=(20.0, 26.0),
        temp_resolution_c=0.1, temp_noise_c=0.15, power_limit_w=350.0, idle_w=(38.0, 46.0),
        dynamic_w=340.0, power_noise_w=6.0, mix=(0.1, 0.0, 0.2, 0.0, 0.6, 0.1),
        notes="H100 PCIe 350 W serving: utilisation random every tick, tenths of a degree, "
              "fast air cooling, power cap binding"),
    "pipeline_bubbles": replace(
        _ZOO_DEFAULTS, name="pipeline_bubbles", die_tau_s=20.0, mem_tau_s=30.0,
        mix=(0.1, 0.15, 0.0, 0.6, 0.0, 0.15), train_period_s=(3.0, 12.0),
        bubble_frac=(0.15, 0.4),
        notes="pipeline-parallel training: per-GPU staggered bubbles, stages out of phase, "
              "plus jobs on part of a node"),
    "sparse_metrics_0p2hz": replace(
        _ZOO_DEFAULTS, name="sparse_metrics_0p2hz", hz=0.2, die_tau_s=30.0, mem_tau_s=45.0,
        power_resolution_w=1.0, mix=(0.45, 0.3, 0.25, 0.0, 0.0, 0.0),
        mean_phase_s=(7200.0, 3600.0, 1800.0, 1800.0, 600.0, 1200.0),
        missing=DCGM_EXPORTER_MISSING,
        notes="dcgm-exporter's default fields only, one sample per 5 s, whole watts, "
              "long idle"),
    "air_pcie_fast_half_degree": replace(
        _ZOO_DEFAULTS, name="air_pcie_fast_half_degree", die_tau_s=3.0, mem_tau_s=6.0,
        r_die_c_per_w=(0.15, 0.17), r_mem_c_per_w=(0.12, 0.14), inlet_c=(18.0, 24.0),
        inlet_swing_c=3.0, temp_resolution_c=0.5, temp_noise_c=0.3, power_limit_w=300.0,
        idle_w=(25.0, 32.0), dynamic_w=300.0, power_noise_w=1.0,
        mix=(0.25, 0.35, 0.2, 0.0, 0.1, 0.1), missing=NO_NVLINK, hz=2.0,
        notes="A100 PCIe 300 W in air: 3 s time constant, half degrees, no NVLink"),
}
"""Hand-set profiles, each inside the zoo's ranges (``default`` is today's model)."""
for _p in NAMED_PROFILES.values():
    _p.validate()


def named_or_drawn(spec: str | int | FleetProfile) -> FleetProfile:
    """A profile from a name in :data:`NAMED_PROFILES`, a seed (int or ``zoo-<seed>``), or as is."""
    if isinstance(spec, FleetProfile):
        return spec
    if isinstance(spec, int):
        return draw_profile(spec)
    if spec in NAMED_PROFILES:
        return NAMED_PROFILES[spec]
    if spec.startswith("zoo-") and spec[4:].lstrip("-").isdigit():
        return draw_profile(int(spec[4:]))
    raise ValueError(f"unknown profile {spec!r}: choose from {sorted(NAMED_PROFILES)} "
                     "or zoo-<seed>")

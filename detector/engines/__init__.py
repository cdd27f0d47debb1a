"""Random Cut Forest engines behind one batched interface (see ``base.py``).

``make_engine(name, config)`` is the one way to get an engine. Engines are imported lazily,
so a deployment that runs the default engine does not need the reference engine's package
(krcf is a test dependency).
"""

from __future__ import annotations

from detector.engines.base import EngineConfig, ForestEngine, ScoreBatch

__all__ = [
    "DEFAULT_ENGINE",
    "ENGINE_NAMES",
    "EngineConfig",
    "ForestEngine",
    "ScoreBatch",
    "make_engine",
]

ENGINE_NAMES: tuple[str, ...] = ("krcf", "numba")
"""Every engine ``make_engine`` knows."""

DEFAULT_ENGINE = "numba"
"""The engine the detector uses unless configured otherwise.

numba: benchmarks/forest.py measures over 20 k score+updates per second per core at
<= 256 KB per model (4x krcf's speed at 1/18 of its memory), rank correlation >= 0.9 with
krcf's scores and detection within 0.3 % of krcf's AUC; the detector's thresholds were tuned
on its score scale; and krcf, the reference it is tested against, is a test dependency."""


def make_engine(name: str, config: EngineConfig) -> ForestEngine:
    """Build the engine called ``name`` for ``config``."""
    if name == "krcf":
        from detector.engines.krcf_engine import KrcfEngine

        return KrcfEngine(config)
    if name == "numba":
        from detector.engines.numba_engine import NumbaEngine

        return NumbaEngine(config)
    raise ValueError(f"unknown forest engine {name!r}; known: {', '.join(ENGINE_NAMES)}")

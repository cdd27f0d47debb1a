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

DEFAULT_ENGINE = "krcf"
"""The engine the detector uses unless configured otherwise."""


def make_engine(name: str, config: EngineConfig) -> ForestEngine:
    """Build the engine called ``name`` for ``config``."""
    if name == "krcf":
        from detector.engines.krcf_engine import KrcfEngine

        return KrcfEngine(config)
    if name == "numba":
        from detector.engines.numba_engine import NumbaEngine

        return NumbaEngine(config)
    raise ValueError(f"unknown forest engine {name!r}; known: {', '.join(ENGINE_NAMES)}")

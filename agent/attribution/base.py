"""The attribution-source interface and its registry by name (like :mod:`agent.sources.base`).

An attribution source answers one question per poll: *which labels describe the workload on
each GPU now?* -- ``{uuid: {"pod": ..., "namespace": ..., "job": ...}}``. It knows nothing
about changes, events or time: :mod:`agent.attribution.tracker` merges the sources' answers,
compares them with the previous poll and turns differences into ``attribution`` events.
A GPU missing from an answer has no workload (as far as that source knows).

Polls are slow (every few seconds) and rare, so plain dicts are fine here; the hot path
(frames) never sees attribution at all.

Registry::

    @register_attribution("kubelet")
    def _open(ctx: AttributionContext) -> AttributionSource: ...

:func:`open_attribution` imports the built-in modules lazily (``kubelet`` needs grpcio).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from agent.sources.base import Source, SourceError

__all__ = [
    "BUILTIN_ATTRIBUTION",
    "AttributionContext",
    "AttributionSource",
    "GpuView",
    "Labels",
    "available_attribution",
    "open_attribution",
    "register_attribution",
]

Labels = dict[str, dict[str, str]]
"""One poll's answer: GPU (or MIG instance) uuid -> workload labels."""


@dataclass(frozen=True, slots=True)
class GpuView:
    """The GPUs the metric source reported last: index and uuid of each row."""

    gpus: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()

    def uuid_of(self, index: int) -> str | None:
        for g, u in zip(self.gpus, self.uuids, strict=True):
            if g == index and "/" not in u:  # the whole GPU, not one of its MIG rows
                return u
        return None


@dataclass(frozen=True, slots=True)
class AttributionContext:
    """What a factory gets to open an attribution source."""

    options: Mapping[str, Any] = field(default_factory=dict)
    """The agent config's ``[attribution]`` table, as plain values."""
    metric_source: Source | None = None
    """The agent's metric source (the ``dcgm`` attribution reads its last scrape)."""


class AttributionSource(ABC):
    """One way of learning workloads. Lifecycle: ``start`` once, ``poll`` often, ``close``."""

    name: str = "?"

    @abstractmethod
    def describe(self) -> str:
        """One line for logs: what it reads and from where."""

    async def start(self) -> None:  # noqa: B027 - optional hook
        """Open channels; raise SourceError if this source can never work."""

    @abstractmethod
    async def poll(self, view: GpuView) -> Labels:
        """The workload labels per GPU now. SourceError (retriable) if it could not tell
        this time: the tracker then keeps this source's previous answer."""

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``start`` opened; safe to call twice."""


AttributionFactory = Callable[[AttributionContext], AttributionSource]

BUILTIN_ATTRIBUTION: Final[dict[str, str]] = {
    "kubelet": "agent.attribution.kubelet",
    "job_mapping": "agent.attribution.job_mapping",
    "dcgm": "agent.attribution.dcgm_labels",
    "static": "agent.attribution.static",
}
_REGISTRY: dict[str, AttributionFactory] = {}


def register_attribution(name: str) -> Callable[[AttributionFactory], AttributionFactory]:
    """Decorator: make ``factory`` available as ``name``."""

    def deco(factory: AttributionFactory) -> AttributionFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"attribution source {name!r} is registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def available_attribution() -> tuple[str, ...]:
    return tuple(sorted(set(BUILTIN_ATTRIBUTION) | set(_REGISTRY)))


def open_attribution(name: str, ctx: AttributionContext) -> AttributionSource:
    """Build the attribution source registered as ``name``."""
    if name not in _REGISTRY and name in BUILTIN_ATTRIBUTION:
        try:
            importlib.import_module(BUILTIN_ATTRIBUTION[name])
        except ImportError as exc:
            raise SourceError(f"attribution source {name!r} is not available: {exc}",
                              retriable=False) from exc
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise SourceError(f"unknown attribution source {name!r}; choose one of "
                          f"{', '.join(available_attribution())}", retriable=False) from None
    return factory(ctx)

"""The source interface: what every input of the agent implements, and the registry by name.

A source is Telegraf-shaped: it can *describe* itself and it can *gather* one tick. The
agent's sampler calls :meth:`Source.gather` once per tick from a single asyncio task, so a
source needs no locks for its own state (a source that waits on something in a thread,
like NVML's event set, hands results over through a thread-safe queue and drains it in
``gather``).

One tick is columnar (DESIGN.md: never one Python object per metric on a hot path): a
``(G, M)`` float64 matrix, one row per GPU (or MIG instance) and one column per metric, with
NaN where a value was not sampled. The columns are catalog ids (``metric_ids``, already in
the catalog's base units, see :func:`schemas.catalog.to_base_units`) followed by
``extra`` names for metrics outside the catalog (dcgm-exporter fields we do not know),
exactly like :class:`schemas.frame.SampleFrame`, so the sampler copies rows into a frame
without renaming anything.

**Layout stability.** A source should return the *same objects* for ``metric_ids``,
``extra``, ``gpus`` and ``uuids`` from tick to tick while nothing changed: the sampler
checks ``is`` first (cheap) and only then equality; a real change (a GPU vanished, an
exporter started reporting a new field) closes the frame being built and starts a new one,
because a frame has one layout.

**Buffers.** ``values`` may be a buffer the source reuses for the next tick; the sampler
copies it before calling ``gather`` again.

**Registry.** A module registers its factory in one line::

    @register_source("dcgm")
    def _open(ctx: SourceContext) -> Source: ...

and :func:`open_source` imports the built-in modules lazily (``nvml`` needs
``pynvml``, ``dcgm`` needs aiohttp, ``synthetic`` needs the fleet model), so choosing one
source never imports the others.
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from schemas.identity import NodeIdentity
from schemas.records import EventKind

__all__ = [
    "BUILTIN_SOURCES",
    "Gathered",
    "Source",
    "SourceContext",
    "SourceError",
    "SourceEvent",
    "SourceFactory",
    "available_sources",
    "open_source",
    "register_source",
]


class SourceError(RuntimeError):
    """A source cannot produce data at all (library missing, endpoint unreachable).

    Per-GPU or per-metric trouble is *not* an exception: it becomes NaN, an event and a
    counter. ``retriable`` says whether the sampler should simply try again next tick.
    """

    def __init__(self, message: str, *, retriable: bool = True) -> None:
        super().__init__(message)
        self.retriable = retriable


@dataclass(frozen=True, slots=True)
class SourceEvent:
    """Something that happened on a GPU, as the source saw it.

    The sampler turns it into a :class:`schemas.records.EventRecord` by adding the node's
    identity and the agent incarnation, so sources never need to know where they run.
    """

    kind: EventKind
    ts_ms: int
    gpu: int | None = None
    uuid: str | None = None
    data: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Gathered:
    """One tick of one source, columnar. See the module docstring for the rules."""

    ts_ms: int
    """When the values were read (epoch ms); the sampler may override it with the tick time."""
    metric_ids: npt.NDArray[np.uint16]
    """Catalog ids of the first ``len(metric_ids)`` columns."""
    extra: tuple[str, ...]
    """Names of the remaining columns (metrics outside the catalog)."""
    gpus: npt.NDArray[np.int32]
    """GPU index per row (a MIG instance is its own row; see the source's docs)."""
    uuids: tuple[str, ...]
    """GPU (or MIG instance) UUID per row."""
    values: npt.NDArray[np.float64]
    """Shape ``(len(gpus), len(metric_ids) + len(extra))``; NaN = not sampled."""
    events: tuple[SourceEvent, ...] = ()
    """Events since the previous gather (XID, ECC, GPU lost, inventory)."""
    native: tuple[str, ...] = ()
    """Optional: the source's own name for each column (the ``DCGM_FI_*`` field a value
    came from), for ``fleetpulse agent --once --print``; empty when not meaningful."""

    def __post_init__(self) -> None:
        g, m = self.values.shape
        if g != len(self.gpus) or g != len(self.uuids):
            raise ValueError(f"values have {g} rows but {len(self.gpus)} gpus, "
                             f"{len(self.uuids)} uuids")
        if m != len(self.metric_ids) + len(self.extra):
            raise ValueError(f"values have {m} columns but {len(self.metric_ids)} ids + "
                             f"{len(self.extra)} extra names")


@dataclass(frozen=True, slots=True)
class SourceContext:
    """What a factory gets to open a source."""

    identity: NodeIdentity
    """Where the agent runs (the synthetic source seeds itself from it)."""
    interval_s: float
    """The sampling interval, for sources that model time (synthetic) or rate-limit."""
    options: Mapping[str, Any] = field(default_factory=dict)
    """The ``[source.<name>]`` table of the agent config, as plain values."""


class Source(ABC):
    """One input of the agent. Lifecycle: ``start`` once, ``gather`` per tick, ``close``."""

    name: str = "?"
    """The registry name; set by the implementation."""

    @abstractmethod
    def describe(self) -> str:
        """One line for logs and ``--help``: what this source reads and from where."""

    async def start(self) -> None:  # noqa: B027 - optional hook, most sources need nothing
        """Open libraries, handles, sessions. Raise SourceError if nothing can work."""

    @abstractmethod
    async def gather(self, ts_ms: int) -> Gathered:
        """Read one tick. ``ts_ms`` is the scheduled tick time (epoch ms).

        Raise SourceError only when the whole source failed this tick (the exporter did
        not answer); the sampler counts it and the tick is missing from the frames.
        """

    async def close(self) -> None:  # noqa: B027 - optional hook
        """Release what ``start`` opened; must be safe to call twice."""

    def error_counts(self) -> Mapping[str, int]:
        """Errors so far by kind (``not_supported``, ``gpu_is_lost``, ``scrape``, ...).

        Read by the agent's /metrics at scrape time; a plain dict of ints is enough.
        """
        return {}


SourceFactory = Callable[[SourceContext], Source]

BUILTIN_SOURCES: Final[dict[str, str]] = {
    "nvml": "agent.sources.nvml",
    "dcgm": "agent.sources.dcgm",
    "synthetic": "agent.sources.synthetic",
}
"""Registry name -> module that registers it when imported."""

_REGISTRY: dict[str, SourceFactory] = {}


def register_source(name: str) -> Callable[[SourceFactory], SourceFactory]:
    """Decorator: make ``factory`` available as ``name`` (one line per source)."""

    def deco(factory: SourceFactory) -> SourceFactory:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"source {name!r} is registered twice")
        _REGISTRY[name] = factory
        return factory

    return deco


def available_sources() -> tuple[str, ...]:
    """Names that :func:`open_source` accepts."""
    return tuple(sorted(set(BUILTIN_SOURCES) | set(_REGISTRY)))


def open_source(name: str, ctx: SourceContext) -> Source:
    """Build the source registered as ``name`` (importing a built-in module on demand)."""
    if name not in _REGISTRY and name in BUILTIN_SOURCES:
        try:
            importlib.import_module(BUILTIN_SOURCES[name])
        except ImportError as exc:
            raise SourceError(f"source {name!r} is not available: {exc}",
                              retriable=False) from exc
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise SourceError(
            f"unknown source {name!r}; choose one of {', '.join(available_sources())}",
            retriable=False,
        ) from None
    return factory(ctx)

"""The ``static`` attribution source: labels from config that hold for every GPU of the host.

For what no scheduler says: the tenant a node is leased to, its cluster role. The labels
(``attribution.static_labels = ["tenant=acme", "role=training"]``) are added to the
workload of every GPU; they name a workload on their own only when they include ``job``
(a node dedicated to one job).
"""

from __future__ import annotations

from agent.attribution.base import (
    AttributionContext,
    AttributionSource,
    GpuView,
    Labels,
    register_attribution,
)
from agent.sources.base import SourceError

__all__ = ["StaticSource", "parse_static_labels"]


def parse_static_labels(items: tuple[str, ...] | list[str]) -> dict[str, str]:
    """``["k=v", ...]`` -> ``{k: v}``; SourceError naming the bad item."""
    out: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise SourceError(f"attribution.static_labels: {item!r} is not key=value",
                              retriable=False)
        out[key.strip()] = value.strip()
    return out


class StaticSource(AttributionSource):
    """See the module docstring."""

    name = "static"

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = dict(labels)

    def describe(self) -> str:
        return "static labels " + ",".join(f"{k}={v}" for k, v in sorted(self.labels.items()))

    async def poll(self, view: GpuView) -> Labels:
        return {u: dict(self.labels) for u in view.uuids} if self.labels else {}


@register_attribution("static")
def _open(ctx: AttributionContext) -> AttributionSource:
    return StaticSource(parse_static_labels(tuple(ctx.options.get("static_labels", ()))))

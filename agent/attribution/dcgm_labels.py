"""The ``dcgm`` attribution source: the workload labels dcgm-exporter puts on its samples.

When the agent scrapes dcgm-exporter (``source.name = "dcgm"``), the exporter may already
know the workloads -- from the kubelet (``pod``, ``namespace``, ``container``) or from its own
job-mapping dir (``hpc_job``). This source reads them from the metric source's last scrape,
so it costs no extra request. It needs the ``dcgm`` metric source; with any other it refuses
to start. Its answer is as fresh as the exporter's own labels (which upstream reports can lag
a pod's end); the ``kubelet`` source, where the agent can reach the socket, is exact.
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
from agent.sources.dcgm import DcgmSource

__all__ = ["DcgmLabelsSource"]


class DcgmLabelsSource(AttributionSource):
    """See the module docstring."""

    name = "dcgm"

    def __init__(self, source: DcgmSource) -> None:
        self.source = source

    def describe(self) -> str:
        return f"pod/namespace/container/hpc_job labels of {self.source.url}"

    async def poll(self, view: GpuView) -> Labels:
        scrape = self.source.last_scrape
        if scrape is None:
            raise SourceError("no dcgm-exporter scrape yet")
        return {row.uuid: dict(w) for row, w in zip(scrape.rows, scrape.workloads, strict=True)
                if w}


@register_attribution("dcgm")
def _open(ctx: AttributionContext) -> AttributionSource:
    if not isinstance(ctx.metric_source, DcgmSource):
        raise SourceError("the dcgm attribution source needs source.name = \"dcgm\" (it reads "
                          "the labels of dcgm-exporter's page)", retriable=False)
    return DcgmLabelsSource(ctx.metric_source)

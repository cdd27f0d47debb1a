"""The ``kubelet`` attribution source: pod-resources ``v1`` ``List`` over the kubelet's socket.

Each poll is one unary gRPC call on a channel kept open for the agent's life. Every
container device whose resource is a GPU resource (``nvidia.com/gpu``, or a MIG resource
``nvidia.com/mig-<profile>``; configurable prefixes) maps its device ids -- the GPU or MIG
UUIDs the NVIDIA device plugin hands out -- to ``pod``, ``namespace`` and ``container``.

A pod the kubelet no longer lists is absent from the answer, so the tracker detaches it at
the next poll: fleetpulse never keeps a finished pod's labels on a GPU (dcgm-exporter's
labels were reported to linger for about half an hour after a pod ended).

Options (``[attribution]``): ``kubelet_socket``, ``kubelet_resources``, ``timeout_s``.
"""

from __future__ import annotations

from typing import Any, Final

import grpc

from agent.attribution import podresources_v1 as pb
from agent.attribution.base import (
    AttributionContext,
    AttributionSource,
    GpuView,
    Labels,
    register_attribution,
)
from agent.sources.base import SourceError

__all__ = ["DEFAULT_RESOURCES", "DEFAULT_SOCKET", "KubeletSource", "labels_from_list"]

DEFAULT_SOCKET: Final = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_RESOURCES: Final = ("nvidia.com/gpu", "nvidia.com/mig-")
_MAX_MESSAGE: Final = 16 << 20
"""The kubelet's own default limit for this API."""


def labels_from_list(resp: Any, resources: tuple[str, ...] = DEFAULT_RESOURCES) -> Labels:
    """Device uuid -> pod/namespace/container labels from a ``ListPodResourcesResponse``."""
    out: Labels = {}
    for pod in resp.pod_resources:
        for ctr in pod.containers:
            for dev in ctr.devices:
                if not dev.resource_name.startswith(resources):
                    continue
                for uuid in dev.device_ids:
                    labels = {"pod": pod.name, "namespace": pod.namespace,
                              "container": ctr.name}
                    out[uuid] = {k: v for k, v in labels.items() if v}
    return out


class KubeletSource(AttributionSource):
    """See the module docstring."""

    name = "kubelet"

    def __init__(self, socket_path: str = DEFAULT_SOCKET,
                 resources: tuple[str, ...] = DEFAULT_RESOURCES, timeout_s: float = 2.0) -> None:
        self.socket_path = socket_path
        self.resources = tuple(resources)
        self.timeout_s = timeout_s
        self._channel: grpc.aio.Channel | None = None
        self._list: Any = None

    def describe(self) -> str:
        return f"kubelet pod-resources v1 List on unix://{self.socket_path}"

    async def start(self) -> None:
        if self._channel is None:
            self._channel = grpc.aio.insecure_channel(
                f"unix://{self.socket_path}",
                options=[("grpc.max_receive_message_length", _MAX_MESSAGE)])
            self._list = self._channel.unary_unary(
                pb.LIST_METHOD,
                request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                response_deserializer=pb.ListPodResourcesResponse.FromString)

    async def poll(self, view: GpuView) -> Labels:
        await self.start()
        try:
            resp = await self._list(pb.ListPodResourcesRequest(), timeout=self.timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise SourceError(f"kubelet List on {self.socket_path}: {exc.code().name} "
                              f"{exc.details()}") from exc
        return labels_from_list(resp, self.resources)

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            await channel.close()


@register_attribution("kubelet")
def _open(ctx: AttributionContext) -> AttributionSource:
    o = ctx.options
    return KubeletSource(str(o.get("kubelet_socket", DEFAULT_SOCKET)),
                         tuple(o.get("kubelet_resources", DEFAULT_RESOURCES)),
                         float(o.get("timeout_s", 2.0)))

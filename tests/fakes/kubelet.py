"""The kubelet stand-in: a real gRPC server on a unix socket serving pod-resources ``v1.List``.

No kubelet runs on a CI machine, so this thin server plays its part of the protocol: a real
grpcio server, the real unix-socket transport, the published v1 message layout
(:mod:`agent.attribution.podresources_v1`). Its only state is the list of pods a test sets
(``pods``), so tests make pods come and go between polls. ``calls`` counts List requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import grpc

from agent.attribution import podresources_v1 as pb

__all__ = ["KubeletStandIn", "Pod"]


@dataclass
class Pod:
    name: str
    namespace: str
    containers: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    """container -> resource name -> device ids."""


class KubeletStandIn:
    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.pods: list[Pod] = []
        self.calls = 0
        self.fail: grpc.StatusCode | None = None
        self._server: grpc.aio.Server | None = None

    def _response(self) -> Any:
        return pb.ListPodResourcesResponse(pod_resources=[
            pb.PodResources(name=p.name, namespace=p.namespace, containers=[
                pb.ContainerResources(name=c, devices=[
                    pb.ContainerDevices(resource_name=r, device_ids=ids)
                    for r, ids in res.items()])
                for c, res in p.containers.items()])
            for p in self.pods])

    async def _list(self, request: Any, context: grpc.aio.ServicerContext) -> Any:
        self.calls += 1
        if self.fail is not None:
            await context.abort(self.fail, "kubelet stand-in told to fail")
        return self._response()

    async def start(self) -> None:
        handler = grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list, request_deserializer=pb.ListPodResourcesRequest.FromString,
                response_serializer=pb.ListPodResourcesResponse.SerializeToString)})
        self._server = grpc.aio.server()
        self._server.add_generic_rpc_handlers((handler,))
        self._server.add_insecure_port(f"unix://{self.socket_path}")
        await self._server.start()

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

"""The kubelet's pod-resources ``v1`` messages, declared in Python (no protoc step).

The kubelet serves ``v1.PodResourcesLister`` on a unix socket. Only the part the agent reads
is declared -- ``List`` and the messages it returns, with the field numbers of the published
``pkg/kubelet/apis/podresources/v1/api.proto``:

* ``ListPodResourcesResponse``: ``pod_resources`` (1, repeated ``PodResources``);
* ``PodResources``: ``name`` (1), ``namespace`` (2), ``containers`` (3, repeated);
* ``ContainerResources``: ``name`` (1), ``devices`` (2, repeated ``ContainerDevices``),
  ``cpu_ids`` (3, repeated int64);
* ``ContainerDevices``: ``resource_name`` (1), ``device_ids`` (2, repeated string),
  ``topology`` (3, ``TopologyInfo``); ``TopologyInfo``: ``nodes`` (1, repeated ``NUMANode``);
  ``NUMANode``: ``ID`` (1, int64).

Fields the agent does not declare (memory, dynamic resources) are kept as unknown fields by
the protobuf runtime and ignored, so a newer kubelet's answer still parses. Building the
descriptor here keeps the build free of ``grpcio-tools`` and the wire format is the same as
generated code's; the test's kubelet stand-in serves these same classes.
"""

from __future__ import annotations

from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = [
    "LIST_METHOD",
    "ContainerDevices",
    "ContainerResources",
    "ListPodResourcesRequest",
    "ListPodResourcesResponse",
    "PodResources",
]

LIST_METHOD: Final = "/v1.PodResourcesLister/List"
"""The gRPC method path of ``List`` (package ``v1``, service ``PodResourcesLister``)."""

_F = descriptor_pb2.FieldDescriptorProto
_STRING, _INT64, _MESSAGE = _F.TYPE_STRING, _F.TYPE_INT64, _F.TYPE_MESSAGE
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED

_MESSAGES: Final[dict[str, list[tuple[str, int, int, int, str]]]] = {
    # message: [(field, number, type, label, message type)]
    "NUMANode": [("ID", 1, _INT64, _ONE, "")],
    "TopologyInfo": [("nodes", 1, _MESSAGE, _MANY, ".v1.NUMANode")],
    "ContainerDevices": [("resource_name", 1, _STRING, _ONE, ""),
                         ("device_ids", 2, _STRING, _MANY, ""),
                         ("topology", 3, _MESSAGE, _ONE, ".v1.TopologyInfo")],
    "ContainerResources": [("name", 1, _STRING, _ONE, ""),
                           ("devices", 2, _MESSAGE, _MANY, ".v1.ContainerDevices"),
                           ("cpu_ids", 3, _INT64, _MANY, "")],
    "PodResources": [("name", 1, _STRING, _ONE, ""),
                     ("namespace", 2, _STRING, _ONE, ""),
                     ("containers", 3, _MESSAGE, _MANY, ".v1.ContainerResources")],
    "ListPodResourcesRequest": [],
    "ListPodResourcesResponse": [("pod_resources", 1, _MESSAGE, _MANY, ".v1.PodResources")],
}


def _build() -> dict[str, Any]:
    fd = descriptor_pb2.FileDescriptorProto(name="fleetpulse/podresources_v1.proto",
                                            package="v1", syntax="proto3")
    for name, fields in _MESSAGES.items():
        msg = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = msg.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name
    # A pool of our own: the default pool may already hold another "v1" package.
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"v1.{name}"))
            for name in _MESSAGES}


_CLASSES: Final = _build()
ListPodResourcesRequest: Any = _CLASSES["ListPodResourcesRequest"]
ListPodResourcesResponse: Any = _CLASSES["ListPodResourcesResponse"]
PodResources: Any = _CLASSES["PodResources"]
ContainerResources: Any = _CLASSES["ContainerResources"]
ContainerDevices: Any = _CLASSES["ContainerDevices"]

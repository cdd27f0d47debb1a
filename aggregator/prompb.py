"""Prometheus' remote-storage messages (``prompb``: remote.proto, types.proto) as protobuf classes.

There is no ``protoc`` in the build, so the file descriptor is written out here field by
field (names, numbers and types as in Prometheus' ``prompb`` package, proto3) and the
classes come from protobuf's message factory, in a private descriptor pool so they cannot
clash with another copy of the same package in the process.

These classes decode what clients send (a remote-read request, a remote-write body in the
tests) and let the tests decode what fleetpulse answers. The answers themselves are
encoded column-wise by :mod:`aggregator.prom_wire`, not by building one message object per
sample; the tests hold that encoder to these classes.
"""

from __future__ import annotations

from typing import Any, Final

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

__all__ = ["ChunkedReadResponse", "LabelMatcher", "ReadRequest", "ReadResponse", "WriteRequest"]

_F = descriptor_pb2.FieldDescriptorProto
_ONE, _MANY = _F.LABEL_OPTIONAL, _F.LABEL_REPEATED
_SCALARS: Final = {"double": _F.TYPE_DOUBLE, "int64": _F.TYPE_INT64, "string": _F.TYPE_STRING,
                   "bool": _F.TYPE_BOOL, "bytes": _F.TYPE_BYTES}

# message -> (field name, number, type, repeated); a type not in _SCALARS is a message or
# enum of this package (enums are named Outer.Inner).
_MESSAGES: Final[dict[str, tuple[tuple[str, int, str, bool], ...]]] = {
    "Sample": (("value", 1, "double", False), ("timestamp", 2, "int64", False)),
    "Label": (("name", 1, "string", False), ("value", 2, "string", False)),
    "TimeSeries": (("labels", 1, "Label", True), ("samples", 2, "Sample", True)),
    "LabelMatcher": (("type", 1, "LabelMatcher.Type", False), ("name", 2, "string", False),
                     ("value", 3, "string", False)),
    "ReadHints": (("step_ms", 1, "int64", False), ("func", 2, "string", False),
                  ("start_ms", 3, "int64", False), ("end_ms", 4, "int64", False),
                  ("grouping", 5, "string", True), ("by", 6, "bool", False),
                  ("range_ms", 7, "int64", False)),
    "Chunk": (("min_time_ms", 1, "int64", False), ("max_time_ms", 2, "int64", False),
              ("type", 3, "Chunk.Encoding", False), ("data", 4, "bytes", False)),
    "ChunkedSeries": (("labels", 1, "Label", True), ("chunks", 2, "Chunk", True)),
    "WriteRequest": (("timeseries", 1, "TimeSeries", True),),
    "Query": (("start_timestamp_ms", 1, "int64", False), ("end_timestamp_ms", 2, "int64", False),
              ("matchers", 3, "LabelMatcher", True), ("hints", 4, "ReadHints", False)),
    "ReadRequest": (("queries", 1, "Query", True),
                    ("accepted_response_types", 2, "ReadRequest.ResponseType", True)),
    "QueryResult": (("timeseries", 1, "TimeSeries", True),),
    "ReadResponse": (("results", 1, "QueryResult", True),),
    "ChunkedReadResponse": (("chunked_series", 1, "ChunkedSeries", True),
                            ("query_index", 2, "int64", False)),
}
_ENUMS: Final = {"LabelMatcher.Type": ("EQ", "NEQ", "RE", "NRE"),
                 "Chunk.Encoding": ("UNKNOWN", "XOR", "HISTOGRAM", "FLOAT_HISTOGRAM"),
                 "ReadRequest.ResponseType": ("SAMPLES", "STREAMED_XOR_CHUNKS")}


def _classes() -> dict[str, Any]:
    fd = descriptor_pb2.FileDescriptorProto(name="fleetpulse/prompb.proto",
                                            package="prometheus", syntax="proto3")
    for name, fields in _MESSAGES.items():
        msg = fd.message_type.add(name=name)
        for enum_name, values in _ENUMS.items():
            outer, inner = enum_name.split(".")
            if outer == name:
                enum = msg.enum_type.add(name=inner)
                for number, value in enumerate(values):
                    enum.value.add(name=value, number=number)
        for fname, number, ftype, repeated in fields:
            field = msg.field.add(name=fname, number=number, label=_MANY if repeated else _ONE)
            if ftype in _SCALARS:
                field.type = _SCALARS[ftype]
            else:
                field.type = _F.TYPE_ENUM if ftype in _ENUMS else _F.TYPE_MESSAGE
                field.type_name = f".prometheus.{ftype}"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prometheus.{name}"))
            for name in _MESSAGES}


_C: Final = _classes()
ReadRequest: Any = _C["ReadRequest"]
ReadResponse: Any = _C["ReadResponse"]
ChunkedReadResponse: Any = _C["ChunkedReadResponse"]
WriteRequest: Any = _C["WriteRequest"]
LabelMatcher: Any = _C["LabelMatcher"]

"""The contracts between fleetpulse stages: catalog, frames, records, topic names.

This package imports nothing else of the project, so every stage (and any third-party
consumer of our topics) can depend on it alone.
"""

from schemas.catalog import BY_DCGM_FIELD, BY_ID, BY_NAME, CATALOG, Kind, Metric
from schemas.errors import DecodeError
from schemas.frame import SampleFrame, decode_frame, encode_frame
from schemas.identity import NodeIdentity
from schemas.records import AlertRecord, AlertState, Attribution, EventKind, EventRecord, Severity
from schemas.topics import Topics

__all__ = [
    "BY_DCGM_FIELD",
    "BY_ID",
    "BY_NAME",
    "CATALOG",
    "AlertRecord",
    "AlertState",
    "Attribution",
    "DecodeError",
    "EventKind",
    "EventRecord",
    "Kind",
    "Metric",
    "NodeIdentity",
    "SampleFrame",
    "Severity",
    "Topics",
    "decode_frame",
    "encode_frame",
]

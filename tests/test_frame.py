"""Sample-frame codec: round-trips, validation messages, and a 100,000-frame fuzz."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from schemas import (
    BY_ID,
    CATALOG,
    DecodeError,
    NodeIdentity,
    SampleFrame,
    decode_frame,
    encode_frame,
)
from schemas.frame import MAGIC

IDENT = NodeIdentity("c1", "row-a", "rack-03", "node-17")
ALL_IDS = sorted(BY_ID)


def make_frame(t: int = 3, g: int = 8, m: int = 5, seed: int = 0, extra: tuple[str, ...] = ()) -> SampleFrame:
    rng = np.random.default_rng(seed)
    ids = np.array(ALL_IDS[: m - len(extra)], dtype=np.uint16)
    return SampleFrame(
        identity=IDENT,
        agent="node-17.1732890000",
        seq=42,
        metric_ids=ids,
        gpus=np.arange(g, dtype=np.int32),
        uuids=tuple(f"GPU-{i:08x}" for i in range(g)),
        ts=1_700_000_000_000 + 1000 * np.arange(t, dtype=np.int64),
        values=rng.normal(size=(t, g, m)),
        extra=extra,
    )


def assert_same(a: SampleFrame, b: SampleFrame) -> None:
    assert a.identity == b.identity and a.agent == b.agent and a.seq == b.seq
    assert a.uuids == b.uuids and a.extra == b.extra
    np.testing.assert_array_equal(a.metric_ids, b.metric_ids)
    np.testing.assert_array_equal(a.gpus, b.gpus)
    np.testing.assert_array_equal(a.ts, b.ts)
    # bit-for-bit, NaN payloads included
    assert a.values.shape == b.values.shape
    assert a.values.tobytes() == b.values.tobytes()


@settings(max_examples=200, deadline=None)
@given(
    t=st.integers(0, 12),
    g=st.integers(0, 9),
    m_ids=st.lists(st.sampled_from(ALL_IDS), unique=True, max_size=len(CATALOG)),
    extra=st.lists(st.from_regex(r"[a-z_][a-z0-9_]{0,20}", fullmatch=True), unique=True, max_size=3),
    data=st.data(),
)
def test_roundtrip_any_shape_and_float(t, g, m_ids, extra, data) -> None:
    m = len(m_ids) + len(extra)
    values = data.draw(
        hnp.arrays(np.float64, (t, g, m), elements=st.floats(allow_nan=True, allow_infinity=True))
    )
    start = data.draw(st.integers(0, 2**50))
    ts = start + np.cumsum(np.asarray(data.draw(st.lists(st.integers(1, 10**6), min_size=t, max_size=t)), dtype=np.int64))
    frame = SampleFrame(IDENT, "a1", data.draw(st.integers(0, 2**62)), np.array(m_ids, np.uint16),
                        np.arange(g, dtype=np.int32), tuple(f"u{i}" for i in range(g)), ts, values,
                        tuple(extra))
    assert_same(frame, decode_frame(encode_frame(frame)))


def test_nan_payloads_and_signed_zero_survive() -> None:
    frame = make_frame(t=1, g=1, m=4)
    special = np.array([np.nan, -0.0, np.inf, -np.inf]).reshape(1, 1, 4)
    special.view(np.uint64)[0, 0, 0] = 0x7FF8_DEAD_BEEF_0001  # a NaN with a payload
    frame = SampleFrame(**{**{f: getattr(frame, f) for f in frame.__slots__}, "values": special})
    assert_same(frame, decode_frame(encode_frame(frame)))


def test_decoded_arrays_are_views_not_copies() -> None:
    data = encode_frame(make_frame(t=4, g=8, m=30))
    decoded = decode_frame(data)
    assert not decoded.values.flags.writeable and not decoded.values.flags.owndata


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda b: b[:5], "too short"),
        (lambda b: b"XXXX" + b[4:], "bad magic"),
        (lambda b: b[:4] + b"\x09" + b[5:], "unsupported frame version 9"),
        (lambda b: b[:5] + b"\x01" + b[6:], "unknown flags"),
        (lambda b: b[:-8], "need"),
        (lambda b: b + b"\0" * 8, "need"),
        (lambda b: b[:8] + (10**6).to_bytes(4, "little") + b[12:], "header length"),
    ],
)
def test_errors_say_what_is_wrong(mutate, message) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_frame(mutate(encode_frame(make_frame())))


def _with_header(header: bytes, payload: bytes = b"") -> bytes:
    pad = -(12 + len(header)) % 8
    return MAGIC + bytes([1, 0, 0, 0]) + len(header).to_bytes(4, "little") + header + b"\0" * pad + payload


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"[1,2]", "JSON object"),
        (b"{not json", "not valid JSON"),
        (b'{"shape":[1,1]}', "shape"),
        (b'{"shape":[1,1,1],"metrics":[9999],"gpus":[0],"uuids":["u"]}', "not in the catalog"),
        (b'{"shape":[1,1,2],"metrics":[1,1],"gpus":[0],"uuids":["u"]}', "must not repeat"),
        (b'{"shape":[1,1,1],"metrics":[1],"gpus":[0],"uuids":["u"],"seq":-1}', "seq"),
        (b'{"shape":[1,1,1],"metrics":[1],"gpus":[0],"uuids":["u"],"seq":1,"agent":"../x"}', "agent"),
        (b'{"shape":[1,1,1],"metrics":[1],"gpus":[0],"uuids":["u"],"seq":1,"agent":"a",'
         b'"cluster":"c","row":"r","rack":"k","node":"n/../../etc"}', "node"),
        (b'{"shape":[1,1,1],"metrics":[],"extra":["bad name"],"gpus":[0],"uuids":["u"]}', "extra metric"),
        (b'{"shape":[99999,1,1]}', "out of range"),
    ],
)
def test_header_validation(header: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=message):
        decode_frame(_with_header(header, b"\0" * 16))


def test_timestamps_must_increase() -> None:
    frame = make_frame(t=3)
    bad = SampleFrame(**{**{f: getattr(frame, f) for f in frame.__slots__},
                         "ts": np.array([5, 5, 6], dtype=np.int64)})
    with pytest.raises(DecodeError, match="strictly increasing"):
        decode_frame(encode_frame(bad))


def test_encode_rejects_inconsistent_shapes() -> None:
    frame = make_frame(t=2, g=2, m=3)
    bad = SampleFrame(**{**{f: getattr(frame, f) for f in frame.__slots__}, "uuids": ("only-one",)})
    with pytest.raises(ValueError, match="inconsistent"):
        encode_frame(bad)


def test_fuzz_100k_mutated_frames_raise_only_decode_error() -> None:
    """Random byte flips, truncations, insertions and header splices: DecodeError or a
    valid frame, never another exception."""
    rng = random.Random(1234)
    seeds = [encode_frame(make_frame(t=rng.randint(0, 4), g=rng.randint(0, 8), m=rng.randint(1, 12),
                                     seed=i, extra=("dcgm_fi_x",) if i % 3 == 0 else ()))
             for i in range(16)]
    decoded = errors = 0
    for i in range(100_000):
        data = bytearray(rng.choice(seeds))
        op = i % 5
        if op == 0:  # flip bytes anywhere, the header most often
            for _ in range(rng.randint(1, 4)):
                pos = rng.randrange(min(len(data), 400)) if rng.random() < 0.8 else rng.randrange(len(data))
                data[pos] = rng.randrange(256)
        elif op == 1:  # truncate
            del data[rng.randrange(len(data)):]
        elif op == 2:  # insert junk
            pos = rng.randrange(len(data) + 1)
            data[pos:pos] = rng.randbytes(rng.randint(1, 16))
        elif op == 3:  # splice another frame's tail
            other = rng.choice(seeds)
            data = data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other)):]
        else:  # random garbage behind a valid fixed header
            data = data[:12] + rng.randbytes(rng.randint(0, 300))
        try:
            frame = decode_frame(bytes(data))
        except DecodeError:
            errors += 1
        else:
            decoded += 1
            assert frame.values.shape == (frame.ts.size, frame.gpus.size, frame.metric_ids.size + len(frame.extra))
    assert errors > 90_000  # the mutations really do break frames
    assert decoded + errors == 100_000

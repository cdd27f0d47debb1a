"""The rollup frame contract: round trips, and bad bytes raise DecodeError only."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schemas.catalog import BY_ID
from schemas.errors import DecodeError
from schemas.rollup import AGG_ROWS, RollupFrame, decode_rollup, encode_rollup

IDS = sorted(BY_ID)


def _frame(m: int, n: int, seed: int = 0, level: str = "rack") -> RollupFrame:
    rng = np.random.default_rng(seed)
    ids = np.asarray(IDS[:m], np.uint16)
    aggs = rng.normal(size=(len(AGG_ROWS), m))
    aggs[0, :] = rng.integers(0, 100, m)
    if m:
        aggs[2, 0] = np.nan
    return RollupFrame(level, "c1", "row-a", "rack-1" if level == "rack" else "", 10_000,
                       10_000, ids, rng.integers(0, 1 << 40, m), aggs, 9999,
                       rng.integers(0, max(m, 1), n).astype(np.int32),
                       rng.integers(0, 9999, n).astype(np.int32),
                       rng.integers(1, 50, n).astype(np.float64))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, len(IDS)), st.integers(0, 300), st.integers(0, 2**32 - 1),
       st.sampled_from(["rack", "row"]))
def test_round_trip(m, n, seed, level):
    fr = _frame(m, n, seed, level)
    back = decode_rollup(encode_rollup(fr))
    assert back.key == fr.key
    assert np.array_equal(back.metric_ids, fr.metric_ids)
    assert np.array_equal(back.aggs, fr.aggs, equal_nan=True)
    assert np.array_equal(back.last_ts, fr.last_ts)
    assert np.array_equal(back.sketch_counts, fr.sketch_counts)
    assert np.array_equal(back.sketch_slot, fr.sketch_slot)


def test_mutations_and_truncations_only_raise_decode_error():
    data = encode_rollup(_frame(5, 40))
    rng = np.random.default_rng(1)
    failures = 0
    for i in range(3000):
        buf = bytearray(data)
        if i % 3 == 0:
            buf = buf[: rng.integers(0, len(buf))]
        else:
            for _ in range(rng.integers(1, 4)):
                buf[rng.integers(0, len(buf))] = rng.integers(0, 256)
        try:
            decode_rollup(bytes(buf))
        except DecodeError:
            failures += 1
    assert failures > 1000


@pytest.mark.parametrize("patch", [
    lambda h: h.replace(b'"rack"', b'"gpu"', 1),
    lambda h: h.replace(b'"metrics":[', b'"metrics":[9999,', 1),
    lambda h: h.replace(b'"sketch_slots":9999', b'"sketch_slots":10', 1),
])
def test_semantic_errors_are_named(patch):
    data = encode_rollup(_frame(3, 5))
    hlen = int.from_bytes(data[8:12], "little")
    header = patch(data[12:12 + hlen])
    rebuilt = data[:8] + len(header).to_bytes(4, "little") + header
    pad = -(12 + len(header)) % 8
    body_start = 12 + hlen + (-(12 + hlen) % 8)
    with pytest.raises(DecodeError):
        decode_rollup(rebuilt + b"\0" * pad + data[body_start:])

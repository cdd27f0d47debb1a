"""Series ids handed from one instance to another go by entity key, sorted or not, and
arrays travel exactly, packed when large."""

from __future__ import annotations

import base64
from typing import Any

import cramjam
import numpy as np
import numpy.typing as npt
import pytest

from aggregator.handover import (
    PACK_FROM,
    array_from_json,
    array_to_json,
    sids_from_json,
    sids_to_json,
)
from aggregator.series_index import EntityIndex, EntityKey
from aggregator.series_layout import ENTITY_STRIDE


def _key(i: int) -> EntityKey:
    return ("gpu", "c0", "row-0", f"rack-{i // 8}", f"node-{i // 4}", str(i % 4))


def test_sids_reach_another_index_as_the_same_series_sorted_or_not() -> None:
    ours, theirs = EntityIndex(None), EntityIndex(None)
    eids = [ours.add(_key(i)) for i in range(40)]
    for i in (39, 7, 22):  # the other instance met some entities first, in its own order
        theirs.add(_key(i))
    rng = np.random.default_rng(4)
    picked = np.sort(rng.choice(eids, 25, replace=False))
    sids = np.concatenate([e * ENTITY_STRIDE + np.sort(rng.choice(900, 3, replace=False))
                           for e in picked.tolist()]).astype(np.int64)
    for order in (np.arange(sids.size), rng.permutation(sids.size)):  # sorted, shuffled
        given = sids[order]
        obj = sids_to_json(ours, given)
        assert len(obj["keys"]) == 25  # each entity once
        back = sids_from_json(theirs, obj)
        # The same entity key and the same rest of the id, series by series.
        assert [theirs.keys[int(e)] for e in (back // ENTITY_STRIDE).tolist()] == \
            [ours.keys[int(e)] for e in (given // ENTITY_STRIDE).tolist()]
        assert np.array_equal(back % ENTITY_STRIDE, given % ENTITY_STRIDE)
    # The sorted path writes what a sort would have: one record format, not two.
    uniq, inv = np.unique(sids // ENTITY_STRIDE, return_inverse=True)
    obj = sids_to_json(ours, sids)
    assert obj["keys"] == [list(ours.keys[int(e)]) for e in uniq.tolist()]
    assert np.array_equal(array_from_json(obj["key"], np.int32), inv.astype(np.int32))
    assert sids_to_json(ours, np.zeros(0, np.int64))["keys"] == []


def test_a_few_series_of_a_large_index_go_by_the_same_keys() -> None:
    """Few ids against many entities take the sorting path: the same record either way."""
    ours = EntityIndex(None)
    eids = [ours.add(_key(i)) for i in range(400)]
    sids = np.array([eids[300] * ENTITY_STRIDE + 5, eids[12] * ENTITY_STRIDE + 1,
                     eids[300] * ENTITY_STRIDE + 2], np.int64)
    obj = sids_to_json(ours, sids)
    assert obj["keys"] == [list(_key(12)), list(_key(300))]
    assert array_from_json(obj["key"], np.int32).tolist() == [1, 0, 1]
    assert np.array_equal(sids_from_json(ours, obj), sids)


def test_arrays_come_back_bit_for_bit_packed_or_not() -> None:
    rng = np.random.default_rng(9)
    floats = rng.normal(size=5_000)
    floats[[3, 70]] = [np.nan, -0.0]
    cases: list[npt.NDArray[Any]] = [
        np.arange(10_000, dtype=np.int64) * 7 + 3,  # sorted ids: packed
        floats, rng.integers(-9, 9, 3_000).astype(np.int32),
        np.packbits(rng.random((300, 200)) < 0.5, axis=1),  # 2-D bytes, flattened
        np.array([1.5, np.nan]), np.zeros(0, np.int64)]  # small: as they are
    for a in cases:
        text = array_to_json(a)
        assert text.startswith("zstd:") == (a.nbytes >= PACK_FROM)
        back = array_from_json(text, a.dtype.type)
        assert back.dtype == a.dtype and back.flags.writeable
        assert back.tobytes() == np.ascontiguousarray(a).tobytes()  # NaN and -0.0 bits too
    # Ids in order shrink far below their raw bytes (the point of packing a checkpoint).
    ids = np.repeat(np.arange(3_000, dtype=np.int64) * ENTITY_STRIDE, 160) + \
        np.tile(np.arange(160, dtype=np.int64), 3_000)
    assert len(array_to_json(ids)) < ids.nbytes / 20


def test_arrays_written_before_packing_still_read() -> None:
    a = np.arange(2_000, dtype=np.float64) / 3
    legacy = base64.b64encode(a.tobytes()).decode()  # what a checkpoint held before
    assert np.array_equal(array_from_json(legacy, np.float64), a)


def test_a_damaged_packed_array_is_a_clear_error() -> None:
    text = array_to_json(np.arange(4_000, dtype=np.int64))
    packed = base64.b64decode(text[len("zstd:"):])
    cut = "zstd:" + base64.b64encode(packed[: len(packed) // 2]).decode()  # a torn record
    with pytest.raises(ValueError, match="does not decompress"):
        array_from_json(cut, np.int64)
    odd = "zstd:" + base64.b64encode(cramjam.zstd.compress(b"\x00" * 12)).decode()
    with pytest.raises(ValueError, match="not one of"):
        array_from_json(odd, np.int64)

"""Series ids handed from one instance to another go by entity key, sorted or not."""

from __future__ import annotations

import numpy as np

from aggregator.handover import array_from_json, sids_from_json, sids_to_json
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

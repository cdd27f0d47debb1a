"""Entity index: persistence across restarts and torn tails, columnar matching, id layout."""

from __future__ import annotations

import numpy as np
import pytest

from aggregator.series_index import EntityIndex
from aggregator.series_layout import AGG_CODES, series_ids, split_series_id


def _fill(index: EntityIndex) -> list[int]:
    ids = []
    for r in range(3):
        ids.append(index.add(("rack", "c1", "row-a", f"r{r}", "", "")))
        for n in range(2):
            for g in range(4):
                ids.append(index.add(("gpu", "c1", "row-a", f"r{r}", f"n{r}{n}", str(g))))
    return ids


def test_ids_survive_a_restart_and_a_torn_tail(tmp_path):
    path = tmp_path / "entities.jsonl"
    index = EntityIndex(path)
    ids = _fill(index)
    index.add_metrics(ids[:5], [1, 3])
    index.flush()
    index.close()
    with open(path, "ab") as fh:  # a kill -9 in the middle of a line
        fh.write(b'{"level":"gpu","cluster":"c1","ro')
    again = EntityIndex(path)
    try:
        assert again.keys == index.keys and len(again) == len(ids)
        assert again.metrics[ids[4], 3] and not again.metrics[ids[5], 3]
        new = again.add(("row", "c1", "row-a", "", "", ""))
        assert new == len(ids)  # the torn line is gone, ids continue densely
    finally:
        again.close()
    third = EntityIndex(path)
    assert third.get(("row", "c1", "row-a", "", "", "")) == len(ids)
    third.close()


def test_matchers_equal_regex_and_negations():
    index = EntityIndex(None)
    _fill(index)
    def names(m):
        return sorted("/".join(x for x in index.keys[i] if x) for i in index.match(m))
    assert len(index.match([("level", "=", "gpu")])) == 24
    assert names([("level", "=", "rack"), ("rack", "!=", "r1")]) == ["rack/c1/row-a/r0",
                                                                     "rack/c1/row-a/r2"]
    assert len(index.match([("level", "=", "gpu"), ("node", "=~", "n1.|n20")])) == 12
    assert len(index.match([("level", "=", "gpu"), ("gpu", "!~", "[0-2]")])) == 6
    assert len(index.match([("gpu", "=", "")])) == 3  # Prometheus: missing label == ""
    with pytest.raises(ValueError, match="regular expression"):
        index.match([("rack", "=~", "(")])
    assert index.label_values("rack") == ["r0", "r1", "r2"]


def test_series_id_layout_round_trips():
    sids = series_ids([5, 9], [1, 37], "increase")
    assert sids.shape == (2, 2)
    assert split_series_id(int(sids[1, 1])) == (9, 37, "increase")
    assert {split_series_id(int(s))[2] for s in np.ravel(sids)} == {"increase"}
    assert len(set(AGG_CODES.values())) == len(AGG_CODES)

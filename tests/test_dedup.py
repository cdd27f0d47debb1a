"""The (agent, seq) table survives its checkpoint: columns now, pairs as written before."""

from __future__ import annotations

import orjson
import pytest

from aggregator.dedup import SeqDeduper


def _filled() -> SeqDeduper:
    d = SeqDeduper(keep=8)
    offset = 0
    for seq in range(20):
        for agent in ("agent-0", "agent-1", "columns", "agent-3"):  # a name like a field
            if (seq, agent) != (4, "agent-1"):  # one frame never arrived
                d.is_duplicate(agent, seq, offset)
                offset += 1
    d.prune(resume_offset=60)
    return d


def _answers(d: SeqDeduper) -> list[bool]:
    """What the table says about a replay of every frame, stale and new ones too."""
    return [d.is_duplicate(agent, seq, offset)
            for agent in ("agent-0", "agent-1", "columns", "agent-3", "agent-new")
            for seq in range(-1, 24) for offset in (0, 55, 70, 200)]


def test_a_restored_table_answers_as_the_one_checkpointed() -> None:
    data = orjson.loads(orjson.dumps(_filled().to_json()))  # through JSON, as stored
    assert _answers(SeqDeduper.from_json(data, keep=8)) == _answers(_filled())
    # A partition that has seen no frame yet checkpoints an empty table.
    empty = orjson.loads(orjson.dumps(SeqDeduper(keep=8).to_json()))
    assert _answers(SeqDeduper.from_json(empty, keep=8)) == _answers(SeqDeduper(keep=8))


def test_a_table_written_as_pairs_still_restores() -> None:
    d = _filled()
    pairs = {a: [[s, o] for s, o in seen.items()] for a, seen in d._seen.items()}
    assert _answers(SeqDeduper.from_json(pairs, keep=8)) == _answers(_filled())
    assert _answers(SeqDeduper.from_json({}, keep=8)) == _answers(SeqDeduper(keep=8))


def test_columns_that_do_not_add_up_are_refused() -> None:
    data = _filled().to_json()
    data["agents"] = data["agents"][:-1]
    with pytest.raises(ValueError, match="do not add up"):
        SeqDeduper.from_json(data)

"""The entity index: hierarchy labels <-> integer entity id, persisted, matched columnar.

Series ids are ``entity * ENTITY_STRIDE + metric * AGG_SLOTS + agg``
(:mod:`aggregator.series_layout`), so only entities need an index: a 10,000-GPU fleet has
~11,500 of them. Each label is kept as an integer code column, so a selector such as
``{level="gpu", rack=~"r0[1-3]"}`` is a few vector compares over all entities, which is what
lets a 10,000-GPU heatmap snapshot resolve in well under a millisecond.

Persistence is an append-only JSON-lines file (``entities.jsonl``): one line per new entity
(``{"id", "level", "cluster", "row", "rack", "node", "gpu"}``) and one per growth of an
entity's metric set (``{"id", "metrics": [...]}``), written through
:class:`~aggregator.jsonl_log.JsonlAppender`. :meth:`EntityIndex.flush` fsyncs it and
must run before the store's flush, and the store writes nothing while a line waits for a
full disk (:meth:`EntityIndex.drain` is its ``before_write``), so every id in the store
resolves after a crash. A torn last line (kill -9 mid-write) is ignored at load.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Final, cast

import numpy as np
import numpy.typing as npt

from aggregator.jsonl_log import JsonlAppender, read_records
from aggregator.series_layout import LEVELS, METRIC_SLOTS

__all__ = ["ENTITY_LABELS", "EntityIndex", "EntityKey", "Matcher"]

ENTITY_LABELS: Final = ("level", "cluster", "row", "rack", "node", "gpu")
EntityKey = tuple[str, str, str, str, str, str]
"""(level, cluster, row, rack, node, gpu); "" where a level has no such label."""

Matcher = tuple[str, str, str]
"""(label, op, value) with op one of =, !=, =~, !~ (Prometheus semantics)."""


def compile_matcher(op: str, value: str) -> re.Pattern[str] | None:
    """The anchored regex of a =~ / !~ matcher (None for = / !=)."""
    if op in ("=~", "!~"):
        try:
            return re.compile(f"(?:{value})\\Z")
        except re.error as exc:
            raise ValueError(f"invalid regular expression {value!r}: {exc}") from None
    if op not in ("=", "!="):
        raise ValueError(f"unknown matcher operator {op!r}")
    return None


def value_matches(op: str, value: str, candidate: str, rx: re.Pattern[str] | None) -> bool:
    if op == "=":
        return candidate == value
    if op == "!=":
        return candidate != value
    assert rx is not None
    hit = rx.match(candidate) is not None
    return hit if op == "=~" else not hit


class EntityIndex:
    """Entities of one store; single-threaded like the store it indexes."""

    def __init__(self, path: str | Path | None) -> None:
        self._path = Path(path) if path is not None else None
        self._ids: dict[EntityKey, int] = {}
        self.keys: list[EntityKey] = []
        self._values: list[list[str]] = [[""] for _ in ENTITY_LABELS]
        self._value_code: list[dict[str, int]] = [{"": 0} for _ in ENTITY_LABELS]
        self._codes = np.zeros((len(ENTITY_LABELS), 1024), np.int32)
        self.metrics = np.zeros((1024, METRIC_SLOTS), bool)
        self._labels: dict[int, dict[str, str]] = {}
        self._log: JsonlAppender | None = None
        if self._path is not None:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            if self._path.exists():
                self._load()
            self._log = JsonlAppender(self._path, "entity index")

    def __len__(self) -> int:
        return len(self.keys)

    # ----------------------------------------------------------------- building
    def _load(self) -> None:
        assert self._path is not None
        for rec in read_records(self._path):
            if "metrics" in rec:
                self.metrics[rec["id"], rec["metrics"]] = True
            else:
                key = cast(EntityKey, tuple(rec[k] for k in ENTITY_LABELS))
                self._insert(key)
                if self._ids[key] != rec["id"]:
                    raise ValueError(f"{self._path}: entity ids out of order at {rec['id']}")

    def _insert(self, key: EntityKey) -> int:
        eid = len(self.keys)
        self._ids[key] = eid
        self.keys.append(key)
        if eid >= self._codes.shape[1]:
            self._codes = np.concatenate([self._codes, np.zeros_like(self._codes)], axis=1)
            self.metrics = np.concatenate([self.metrics, np.zeros_like(self.metrics)])
        for i, value in enumerate(key):
            codes = self._value_code[i]
            code = codes.get(value)
            if code is None:
                code = codes[value] = len(self._values[i])
                self._values[i].append(value)
            self._codes[i, eid] = code
        return eid

    def get(self, key: EntityKey) -> int | None:
        return self._ids.get(key)

    def add(self, key: EntityKey) -> int:
        """The id of ``key``, registering it (and logging it) on first sight."""
        eid = self._ids.get(key)
        if eid is not None:
            return eid
        if key[0] not in LEVELS:
            raise ValueError(f"unknown level {key[0]!r}")
        eid = self._insert(key)
        rec: dict[str, object] = dict(zip(ENTITY_LABELS, key, strict=True))
        rec["id"] = eid
        self._write(rec)
        return eid

    def add_metrics(self, eids: npt.ArrayLike, metric_ids: Iterable[int]) -> None:
        """Record that ``eids`` have series of ``metric_ids`` (logged only when new)."""
        mids = np.fromiter(metric_ids, np.int64)
        for eid in np.asarray(eids, np.int64).tolist():
            row = self.metrics[eid]
            new = mids[~row[mids]]
            if new.size:
                row[new] = True
                self._write({"id": eid, "metrics": new.tolist()})

    def _write(self, rec: dict[str, object]) -> None:
        """Hand the line to the OS at once: a store write that survives a kill -9 (it is in
        the page cache too) must never refer to an id whose line did not."""
        if self._log is not None:
            self._log.append(rec)

    def drain(self) -> None:
        """Every line that waited for the disk written (StoreWriteError if it still refuses):
        the store calls it before each write, so no record refers to an unwritten id."""
        if self._log is not None:
            self._log.drain()

    def flush(self) -> None:
        """fsync what was added; call before the store's flush."""
        if self._log is not None:
            self._log.flush()

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    # ----------------------------------------------------------------- querying
    def label_values(self, label: str) -> list[str]:
        """Distinct non-empty values of ``label`` over all entities."""
        i = ENTITY_LABELS.index(label)
        used = np.unique(self._codes[i, : len(self.keys)])
        return sorted(self._values[i][c] for c in used.tolist() if c)

    def match(self, matchers: Iterable[Matcher]) -> npt.NDArray[np.int64]:
        """Ids of entities satisfying every matcher on an entity label (others ignored)."""
        n = len(self.keys)
        mask = np.ones(n, bool)
        for label, op, value in matchers:
            if label not in ENTITY_LABELS:
                continue
            i = ENTITY_LABELS.index(label)
            rx = compile_matcher(op, value)
            ok = np.fromiter(
                (value_matches(op, value, v, rx) for v in self._values[i]), bool,
                len(self._values[i]))
            mask &= ok[self._codes[i, :n]]
        return np.flatnonzero(mask).astype(np.int64)

    def codes(self, label: str, eids: npt.NDArray[np.int64]) -> npt.NDArray[np.int32]:
        """Integer codes of ``label`` for ``eids`` (decode with :meth:`value_of`)."""
        return self._codes[ENTITY_LABELS.index(label), eids]

    def value_of(self, label: str, code: int) -> str:
        return self._values[ENTITY_LABELS.index(label)][code]

    def labels(self, eid: int) -> dict[str, str]:
        """Non-empty labels of one entity (a fresh dict the caller may extend)."""
        cached = self._labels.get(eid)
        if cached is None:
            cached = self._labels[eid] = {
                k: v for k, v in zip(ENTITY_LABELS, self.keys[eid], strict=True) if v}
        return cached.copy()

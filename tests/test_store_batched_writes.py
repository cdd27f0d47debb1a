"""The store's batched write paths write what one call per group writes, byte for byte.

A closing window's points (``append_points``) and a window's sketches (``append_series``)
go in with one call for many groups, and a flush encodes every group's new rows with one
codec call (``codec.encode_ragged``); they exist for speed at fleet scale. The files must
be those the plain calls leave, and each blob the one ``encode_group`` gives, so readers,
compaction and a replay after a crash see no difference.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from aggregator.store import SeriesStore, StoreConfig, TierSpec, codec

H = 3_600_000
TIERS = (TierSpec("10s", 10_000, 48 * H, H),)


def test_ragged_encoding_gives_each_group_the_blob_encode_group_gives() -> None:
    rng = np.random.default_rng(5)
    ts, vals = [], []
    for n, k in ((1, 7), (5, 1), (3, 40), (12, 3)):
        ts.append(np.sort(rng.integers(0, 10**9, n)))
        v = np.round(rng.normal(50, 10, (n, k)), 1)
        v[rng.random((n, k)) < 0.2] = np.nan
        vals.append(v)
    buf, offsets = codec.encode_ragged(ts, vals)
    for g, (t, v) in enumerate(zip(ts, vals, strict=True)):
        assert buf[offsets[g]:offsets[g + 1]].tobytes() == codec.encode_group(t, v), g


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "LOCK"}


def test_points_and_sketches_written_in_batches_leave_the_same_files(tmp_path: Path) -> None:
    rng = np.random.default_rng(8)
    bounds = np.asarray([0, 4, 4, 9, 30], np.int64)  # an empty group among them
    sids = np.arange(30, dtype=np.int64) * 16 + 3
    sketch = np.repeat(np.asarray([7001, 7017, 7033], np.int64), [3, 1, 5])
    slots = np.concatenate([[0, 5, 9], [2], [1, 2, 3, 4, 8]]).astype(np.int64)
    stores = {}
    for way in ("plain", "batched"):
        store = SeriesStore(StoreConfig(path=str(tmp_path / way), tiers=TIERS,
                                        chunk_samples=4, fsync=False))
        stores[way] = store
    # Windows across a chunk seal (4 points) and a segment (1 h), and a last one whose
    # sketch points themselves straddle the next segment's start.
    for w, start in enumerate([w * 400_000 for w in range(11)] + [2 * H - 3]):
        vals = np.round(rng.normal(0, 3, sids.size), 2)
        counts = rng.integers(1, 9, sketch.size).astype(np.float64)
        plain, batched = stores["plain"], stores["batched"]
        for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
            if b > a:
                plain.append("10s", sids[a:b], np.asarray([start]), vals[None, a:b])
        for sid in np.unique(sketch).tolist():
            at = sketch == sid
            plain.append("10s", np.asarray([sid]), start + slots[at], counts[at, None])
        batched.append_points("10s", start, sids, bounds, vals)
        batched.append_series("10s", sketch, start + slots, counts)
        if w % 3 == 2:
            plain.flush()
            batched.flush()
    for store in stores.values():
        store.close()
    plain_files, batched_files = _files(tmp_path / "plain"), _files(tmp_path / "batched")
    assert len(plain_files) >= 3  # three segments of the tier
    assert batched_files == plain_files

"""The reference engine: one ``krcf`` forest (bindings to AWS's Rust RCF) per model.

krcf is the closest thing to AWS's own implementation that runs in Python, so it is the
yardstick the numba engine is measured against (scores, attribution, detection quality).
It is not batched: a call loops over its models in Python, and a forest with the bounding
box cache on holds about 4-5 MB. That is why it is the reference, not the default.

krcf shingles internally (``internal_shingling``): the caller passes ``dims`` base features
per step and the forest keeps the last ``shingle`` steps, exactly the engine contract. A
forest reports 0.0 until it has seen ``output_after`` complete shingles, like AWS.

Checkpoint layout (little-endian)::

    b"FPKR"  magic
    u8       format version (1)
    ...      krcf's own msgpack of the forest (options, trees, sampler, shingle buffer, RNG)
"""

from __future__ import annotations

import struct

import krcf
import numpy as np
import numpy.typing as npt

from detector.engines.base import EngineConfig, ForestEngine, ScoreBatch, check_batch, model_seed

__all__ = ["KrcfEngine"]

_MAGIC = b"FPKR"
_VERSION = 1
_HEADER = struct.Struct("<4sB")


class KrcfEngine(ForestEngine):
    """Many krcf forests behind the batched interface (a Python loop inside)."""

    name = "krcf"

    def __init__(self, config: EngineConfig) -> None:
        super().__init__(config)
        if config.sample_groups not in (None, config.trees):
            raise ValueError("krcf keeps one reservoir per tree; sample_groups must be None")
        self._forests: list[krcf.RandomCutForest] = []

    def _options(self, model_id: int) -> krcf.RandomCutForestOptions:
        cfg = self.config
        options: krcf.RandomCutForestOptions = {
            "dimensions": cfg.dims,
            "shingle_size": cfg.shingle,
            "internal_shingling": True,
            "num_trees": cfg.trees,
            "sample_size": cfg.sample_size,
            "output_after": cfg.effective_output_after,
            "random_seed": model_seed(cfg.seed, model_id),
            # One thread, so a benchmark's CPU time is per core, as for every engine.
            "parallel_execution_enabled": False,
        }
        # krcf declares "lambda" in a way type checkers cannot see (it is a keyword).
        options["lambda"] = cfg.effective_time_decay  # type: ignore[typeddict-unknown-key]
        return options

    def ensure_models(self, n: int) -> None:
        while len(self._forests) < n:
            self._forests.append(krcf.RandomCutForest(self._options(len(self._forests))))

    def _forest(self, model_id: int) -> krcf.RandomCutForest:
        if not 0 <= model_id < len(self._forests):
            raise KeyError(f"model {model_id} does not exist ({len(self._forests)} models)")
        return self._forests[model_id]

    def _run(
        self,
        model_ids: npt.NDArray[np.int64],
        points: npt.NDArray[np.float32],
        attribute_above: float | npt.NDArray[np.float64],
        learn: bool,
        admit_at_most: int | None = None,
    ) -> ScoreBatch:
        ids, pts = check_batch(self.config, model_ids, points)
        n, dims = len(ids), self.config.dims
        above = np.broadcast_to(np.asarray(attribute_above, dtype=np.float64), (n,))
        scores = np.zeros(n, dtype=np.float64)
        attribution = np.zeros((n, dims), dtype=np.float64)
        direction = np.zeros((n, dims), dtype=np.int8)
        rows = pts.astype(np.float64)
        for i in range(n):
            forest = self._forest(int(ids[i]))
            point = rows[i]
            score = forest.score(point)
            scores[i] = score
            if score > 0.0 and score > above[i]:
                div = forest.attribution(point)
                high = np.asarray(div["high"]).reshape(self.config.shingle, dims).sum(axis=0)
                low = np.asarray(div["low"]).reshape(self.config.shingle, dims).sum(axis=0)
                attribution[i] = high + low
                direction[i] = np.sign(high - low).astype(np.int8)
            # krcf's score() shingles the point against the buffer without storing it, so
            # only update() changes the model.
            if learn:
                forest.update(point)
        return ScoreBatch(scores=scores, attribution=attribution, direction=direction)

    def checkpoint(self, model_id: int) -> bytes:
        return _HEADER.pack(_MAGIC, _VERSION) + self._forest(model_id).to_msgpack()

    def restore(self, model_id: int, data: bytes) -> None:
        if len(data) < _HEADER.size:
            raise ValueError(f"krcf checkpoint too short: {len(data)} bytes")
        magic, version = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError(f"not a krcf checkpoint (magic {magic!r}, expected {_MAGIC!r})")
        if version != _VERSION:
            raise ValueError(f"unsupported krcf checkpoint version {version} (have {_VERSION})")
        try:
            forest = krcf.RandomCutForest.from_msgpack(bytes(data[_HEADER.size :]))
        except Exception as exc:  # krcf raises plain RuntimeError/ValueError
            raise ValueError(f"corrupt krcf checkpoint: {exc}") from exc
        options = forest.options()
        cfg = self.config
        found = (options["dimensions"], options["shingle_size"])
        if found != (cfg.dims, cfg.shingle):
            raise ValueError(
                f"krcf checkpoint has dims x shingle {found[0]}x{found[1]}, "
                f"engine expects {cfg.dims}x{cfg.shingle}"
            )
        self.ensure_models(model_id + 1)
        self._forests[model_id] = forest

    def model_bytes(self, model_id: int) -> int:
        """The serialized size: krcf exposes no resident size, and its in-memory form is
        at least as large (the benchmark measures resident memory by RSS)."""
        return len(self._forest(model_id).to_msgpack())


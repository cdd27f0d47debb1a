"""The batched numba Random Cut Forest engine (the default; krcf is its reference).

One call advances every model named in it inside a single compiled kernel, so Python
overhead is paid per frame, not per GPU. The algorithms are AWS RCF's (see
``detector/engines/rcf/kernels.py``); the memory layout is what differs: bounding boxes
cached only for the largest subtrees and as sample-slot indices, narrow index types, a
shingle-sharing point store, and optionally fewer independent reservoirs than trees
(``EngineConfig.sample_groups``).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from detector.engines.base import EngineConfig, ForestEngine, ScoreBatch, check_batch
from detector.engines.rcf import kernels
from detector.engines.rcf.state import ForestArrays

__all__ = ["NumbaEngine"]


class NumbaEngine(ForestEngine):
    """Many RCF models in shared numpy arrays, advanced by numba kernels."""

    name = "numba"

    def __init__(self, config: EngineConfig, cache_entries: int | None = None) -> None:
        """``cache_entries``: bounding boxes kept per tree (for its largest subtrees); None
        fills what the 256 KB per-model budget leaves (see ``rcf/state.py``)."""
        super().__init__(config)
        self._state = ForestArrays(config, cache_entries)

    def ensure_models(self, n: int) -> None:
        self._state.ensure(n)

    def _run(
        self,
        model_ids: npt.NDArray[np.int64],
        points: npt.NDArray[np.float32],
        attribute_above: float | npt.NDArray[np.float64],
        learn: bool,
        admit_at_most: int | None = None,
    ) -> ScoreBatch:
        cfg = self.config
        ids, pts = check_batch(cfg, model_ids, points)
        n = len(ids)
        if n and (ids.min() < 0 or ids.max() >= self._state.models):
            bad = ids[(ids < 0) | (ids >= self._state.models)][0]
            raise KeyError(f"model {bad} does not exist ({self._state.models} models)")
        above = np.asarray(attribute_above, dtype=np.float64)
        # np.full for the usual scalar: broadcast_to costs more than the rest of the call.
        above = (np.full(n, float(above)) if above.ndim == 0
                 else np.ascontiguousarray(np.broadcast_to(above, (n,))))
        scores = np.zeros(n, dtype=np.float64)
        attribution = np.zeros((n, cfg.dims), dtype=np.float64)
        direction = np.zeros((n, cfg.dims), dtype=np.int8)
        allowed = n if admit_at_most is None else max(0, min(n, admit_at_most))
        admit_left = np.array([allowed], dtype=np.int64)
        most = kernels.advance(  # type: ignore[call-arg]  # numba's Dispatcher stub takes no args
            ids, pts, learn, admit_left, above, cfg.screen_trees, cfg.screen_below,
            cfg.effective_output_after, cfg.effective_time_decay,
            *self._state.kernel_arrays(), scores, attribution, direction,
        )
        if learn:
            self._state.reserve_points(most)
        return ScoreBatch(scores=scores, attribution=attribution, direction=direction,
                          admitted=allowed - int(admit_left[0]))

    def _check_id(self, model_id: int) -> None:
        if not 0 <= model_id < self._state.models:
            raise KeyError(f"model {model_id} does not exist ({self._state.models} models)")

    def checkpoint(self, model_id: int) -> bytes:
        self._check_id(model_id)
        return self._state.checkpoint(model_id)

    def checkpoint_models(self, n: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        if n > self._state.models:
            self._check_id(n - 1)
        return self._state.checkpoint_models(n)

    def restore(self, model_id: int, data: bytes) -> None:
        if model_id < 0:
            raise KeyError(f"model {model_id} does not exist")
        self._state.restore(model_id, data)

    def model_bytes(self, model_id: int) -> int:
        self._check_id(model_id)
        return self._state.model_bytes()

    def held(self, n: int) -> int:
        st = self._state
        n = min(n, st.models)
        per_group = st.root.shape[1] // st.spid.shape[1]
        empty = np.all(st.root[:n, ::per_group] == -1, axis=1)
        due = st.meta[:n, kernels.META_SEQ] >= self.config.effective_output_after
        return int(np.count_nonzero(empty & due))

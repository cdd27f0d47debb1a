"""The arrays behind every model of a numba RCF engine, and one model's checkpoint bytes.

All models live in the same arrays (leading axis = model id), so one kernel call can
advance any subset of them. Index types are the narrowest that fit the config (uint8 cut
dimensions, int16 child codes and point ids for the usual sizes) because memory per model
is the point of this engine.

Checkpoint layout of one model (little-endian), version 2::

    b"FPNR"  magic
    u8       version
    u8 x 3   dtype codes of cut_dim, child codes, point ids (see _DTYPE_CODES)
    u32 x 7  dims, shingle, trees, sample_size, groups, point ids, arena floats stored
    u32      CRC-32 of everything after the header (a damaged file is refused, never run)
    then the arrays of ``_FIELDS`` in order, each exactly the model's slice, except the
    arena, which is compacted first and stored up to its end. The box cache (see
    ``kernels``) is derived state: not stored, refilled on restore.

Version 1 (before insertion shared the scoring walk) had ``sample_size - 1`` internal
nodes a tree; it still loads, with the extra node added free, and scores as it did.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from detector.engines.base import EngineConfig, model_seed
from detector.engines.rcf import kernels

__all__ = ["ForestArrays"]

_MAGIC = b"FPNR"
_VERSION = 2
_NODE_FIELDS = ("cut_dim", "cut_val", "left", "right")
"""Fields with one entry per internal node (one fewer per tree in version 1)."""
_HEADER = struct.Struct("<4sB3B8I")
_DTYPE_CODES = {np.dtype(np.uint8): 1, np.dtype(np.uint16): 2, np.dtype(np.int16): 3,
                np.dtype(np.int32): 4}
# Per-model arrays in checkpoint order (the arena is handled separately).
_FIELDS = ("meta", "shingle_buf", "weight", "spid", "ssize", "heavy", "root", "free_head",
           "cut_dim", "cut_val", "left", "right", "offset", "refcnt")
# Derived from the fields above, never checkpointed: each sampler slot's arena offset and
# the box cache.
_CACHE = ("soff", "cslot", "cbox", "cmass")


@dataclass
class _Layout:
    dim: int
    groups: int
    pids: int
    cut_dim: np.dtype
    child: np.dtype
    pid: np.dtype
    box_index: np.dtype
    arena_offset: np.dtype


DEFAULT_SAMPLE_GROUPS = 2
"""Reservoirs per model when the config leaves it open (see EngineConfig.sample_groups);
1 when the tree count is odd. Measured at the issue's parameters (benchmarks/forest.py):
one reservoir gives rank correlation 0.889 with krcf at 241 KB, two give 0.905 at 227 KB
(fewer cached box levels fit) and 20 % fewer updates/s; krcf against itself with another
seed gives 0.919. (Sizes and speeds measured with the earlier cache of the top tree levels;
the box cache now fills the budget either way.)"""

MODEL_BUDGET_BYTES = 256 * 1024
"""Memory per model the box cache may fill up to (issue 8's target)."""
MAX_CACHE_ENTRIES = 254
FALLBACK_CACHE_ENTRIES = 16
"""Cached boxes per tree when the model exceeds the budget even without a cache (then
speed wins)."""


def _layout(config: EngineConfig) -> _Layout:
    dim = config.dims * config.shingle
    groups = config.sample_groups
    if groups is None:
        groups = DEFAULT_SAMPLE_GROUPS if config.trees % DEFAULT_SAMPLE_GROUPS == 0 else 1
    pids = groups * config.sample_size + 2
    return _Layout(
        dim=dim,
        groups=groups,
        pids=pids,
        cut_dim=np.dtype(np.uint8 if dim <= 256 else np.uint16),
        child=np.dtype(np.int16 if 2 * config.sample_size + 4 < 2**15 else np.int32),
        pid=np.dtype(np.int16 if pids < 2**15 else np.int32),
        box_index=np.dtype(np.uint8 if config.sample_size <= 256 else np.uint16),
        # The arena never grows past (pids + 1) * dim floats (see _grow_arena).
        arena_offset=np.dtype(np.uint16 if (pids + 1) * dim <= 2**16 else np.int32),
    )


class ForestArrays:
    """State of ``models`` forests; grows by doubling along the model axis."""

    # One array per field of _FIELDS (plus the box cache and the arena), model axis first.
    meta: npt.NDArray[np.int64]
    shingle_buf: npt.NDArray[np.float32]
    weight: npt.NDArray[np.float32]
    spid: npt.NDArray[np.integer]
    ssize: npt.NDArray[np.int32]
    heavy: npt.NDArray[np.int32]
    root: npt.NDArray[np.integer]
    free_head: npt.NDArray[np.integer]
    cut_dim: npt.NDArray[np.integer]
    cut_val: npt.NDArray[np.float32]
    left: npt.NDArray[np.integer]
    right: npt.NDArray[np.integer]
    soff: npt.NDArray[np.integer]
    cslot: npt.NDArray[np.uint8]
    cbox: npt.NDArray[np.integer]
    cmass: npt.NDArray[np.uint16]
    offset: npt.NDArray[np.int32]
    refcnt: npt.NDArray[np.int32]
    arena: npt.NDArray[np.float32]

    def __init__(self, config: EngineConfig, cache_entries: int | None = None) -> None:
        self.config = config
        self.layout = _layout(config)
        lay = self.layout
        # Start the arena at room for a few samples' worth of distinct points; it grows
        # (for all models) when any model's live points need more.
        self.arena_cap = lay.dim * min(lay.pids, 2 * config.sample_size + 2)
        self.cache_entries = 0
        if cache_entries is None:
            cache_entries = self._budget_entries()
        if not 0 <= cache_entries <= MAX_CACHE_ENTRIES:
            raise ValueError(f"cache_entries must be 0..{MAX_CACHE_ENTRIES}, "
                             f"got {cache_entries}")
        self.cache_entries = cache_entries
        self.models = 0
        self._alloc(0)

    def _budget_entries(self) -> int:
        """The most cached boxes per tree that keep a model within MODEL_BUDGET_BYTES,
        counting the arena at the size it may grow to."""
        grown_arena = (self.layout.pids + 1) * self.layout.dim * 4
        self.cache_entries = 0
        spare = MODEL_BUDGET_BYTES - (self.model_bytes() - self.arena_cap * 4 + grown_arena)
        per_entry = self.config.trees * (2 * self.layout.dim * self.layout.box_index.itemsize
                                         + 2)
        entries = min(spare // per_entry, MAX_CACHE_ENTRIES)
        return int(entries) if entries > 0 else FALLBACK_CACHE_ENTRIES

    # -- allocation ---------------------------------------------------------------------
    def _shapes(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        cfg, lay = self.config, self.layout
        s, t, g = cfg.sample_size, cfg.trees, lay.groups
        return {
            "meta": ((kernels.META_FIELDS,), np.dtype(np.int64)),
            "shingle_buf": ((lay.dim,), np.dtype(np.float32)),
            "weight": ((g, s), np.dtype(np.float32)),
            "spid": ((g, s), lay.pid),
            "ssize": ((g,), np.dtype(np.int32)),
            "heavy": ((g,), np.dtype(np.int32)),
            "root": ((t,), lay.child),
            "free_head": ((t,), lay.child),
            # sample_size internal nodes a tree: one more than a full sample needs, for
            # the moment a new point is in before the one it evicts is out (version 1 of
            # the checkpoint had one fewer).
            "cut_dim": ((t, s), lay.cut_dim),
            "cut_val": ((t, s), np.dtype(np.float32)),
            "left": ((t, s), lay.child),
            "right": ((t, s), lay.child),
            "soff": ((g, s), lay.arena_offset),
            "cslot": ((t, s), np.dtype(np.uint8)),
            "cbox": ((t, self.cache_entries, 2, lay.dim), lay.box_index),
            "cmass": ((t, self.cache_entries), np.dtype(np.uint16)),
            "offset": ((lay.pids,), np.dtype(np.int32)),
            "refcnt": ((lay.pids,), np.dtype(np.int32)),
        }

    def _alloc(self, capacity: int) -> None:
        for name, (shape, dtype) in self._shapes().items():
            setattr(self, name, np.zeros((capacity, *shape), dtype=dtype))
        self.arena = np.zeros((capacity, self.arena_cap), dtype=np.float32)
        self.capacity = capacity

    def ensure(self, n: int) -> None:
        """Make models ``0 .. n-1`` exist, each empty and seeded from (seed, model id)."""
        if n <= self.models:
            return
        if n > self.capacity:
            # In place, to the rows needed: realloc remaps a large array instead of copying
            # it, and numpy zeroes only the rows added. A shard meeting a fleet grows its
            # arrays while it is already behind its first samples; doubling into new arrays
            # copied ~256 KB a model 1.6 times over (registering 2,600 GPUs: 2.99 s and
            # 1,166 MB peak RSS then, 0.74 s and 761 MB this way; doubling in place zeroed the
            # unused half too). No view of these arrays outlives a call into this class, so
            # nothing points at a buffer that moved.
            for name in (*_FIELDS, *_CACHE, "arena"):
                array = getattr(self, name)
                array.resize((n, *array.shape[1:]), refcheck=False)
            self.capacity = n
        for m in range(self.models, n):
            self.reset(m)
        self.models = n

    def reset(self, m: int) -> None:
        """Put model m in its initial (empty, cold-start) state."""
        s = self.config.sample_size
        meta = self.meta[m]
        meta[:] = 0
        meta[kernels.META_LAST_PID] = -1
        meta[kernels.META_LAST_SEQ] = -1
        meta[kernels.META_FREE_PID] = 0
        meta[kernels.META_RNG] = model_seed(self.config.seed, m)
        self.shingle_buf[m] = 0.0
        self.weight[m] = 0.0
        self.spid[m] = -1
        self.ssize[m] = 0
        self.heavy[m] = 0
        self.root[m] = -1
        self.free_head[m] = 0
        self.cut_dim[m] = 0
        self.cut_val[m] = 0.0
        chain = np.arange(1, s + 1, dtype=np.int64)
        chain[-1] = -1
        self.left[m] = chain.astype(self.layout.child)
        self.right[m] = -1
        self.soff[m] = 0
        self.cslot[m] = kernels.NO_ENTRY
        self.cbox[m] = 0
        self.cmass[m] = 0
        pid_chain = np.arange(1, self.layout.pids + 1, dtype=np.int32)
        pid_chain[-1] = -1
        self.offset[m] = pid_chain
        self.refcnt[m] = 0
        self.arena[m] = 0.0

    def reserve_points(self, most: int) -> None:
        """Keep room for a model holding ``most`` live points to store one more after
        compaction (``kernels.advance`` reports the most among the models it advanced)."""
        self._grow_arena((most + 2) * self.layout.dim)

    def _grow_arena(self, need: int) -> None:
        if need <= self.arena_cap:
            return
        cap = min(max(need, self.arena_cap * 3 // 2), (self.layout.pids + 1) * self.layout.dim)
        arena = np.zeros((self.capacity, cap), dtype=np.float32)
        arena[: self.models, : self.arena_cap] = self.arena[: self.models]
        self.arena, self.arena_cap = arena, cap

    def kernel_arrays(self) -> tuple[npt.NDArray, ...]:
        """The state arrays in the order ``kernels.advance`` takes them."""
        return (self.meta, self.shingle_buf, self.weight, self.spid, self.ssize, self.heavy,
                self.root, self.free_head, self.cut_dim, self.cut_val, self.left, self.right,
                self.cslot, self.cbox, self.cmass, self.arena, self.offset, self.soff,
                self.refcnt)

    def model_bytes(self) -> int:
        """Bytes one model holds in these arrays (its arena row at full capacity)."""
        fixed = sum(int(np.prod(shape)) * dtype.itemsize for shape, dtype in self._shapes().values())
        return fixed + self.arena_cap * 4

    # -- checkpoints ----------------------------------------------------------------------
    def _header_fields(self, arena_floats: int) -> tuple[int, ...]:
        cfg, lay = self.config, self.layout
        return (cfg.dims, cfg.shingle, cfg.trees, cfg.sample_size, lay.groups, lay.pids,
                arena_floats)

    def checkpoint(self, m: int) -> bytes:
        return self._pack(m, m + 1)[0].tobytes()

    def checkpoint_models(self, n: int) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
        """``checkpoint(m)`` of models ``0..n-1`` concatenated, with each one's end."""
        if n == 0:
            return np.zeros(0, dtype=np.uint8), np.zeros(0, dtype=np.int64)
        return self._pack(0, n)

    def _pack(self, first: int, stop: int) -> tuple[npt.NDArray[np.uint8],
                                                    npt.NDArray[np.int64]]:
        """The checkpoints of models ``first..stop-1``, one after the other, and where each
        ends: the one writer of the format. The arrays are cut once for all the models and
        only the header and CRC are written per model, so a shard of 2,600 forests is not
        2,600 rounds of slicing and joining."""
        lay = self.layout
        # Compacting changes only where points sit in the arena, never a score.
        kernels.compact_arenas(first, stop, self.arena, self.offset, self.refcnt, self.meta,
                               lay.dim, self.spid, self.soff)
        n = stop - first
        fixed = np.concatenate(
            [getattr(self, name)[first:stop].astype(
                getattr(self, name).dtype.newbyteorder("<"), copy=False).reshape(n, -1)
             .view(np.uint8) for name in _FIELDS], axis=1)
        floats = self.meta[first:stop, kernels.META_ARENA_END].astype(np.int64)
        arena = self.arena[first:stop].astype("<f4", copy=False).view(np.uint8)
        sizes = _HEADER.size + fixed.shape[1] + 4 * floats
        ends = np.cumsum(sizes)
        starts = ends - sizes
        out = np.empty(int(ends[-1]), dtype=np.uint8)
        kernels.pack_rows(out, starts + _HEADER.size, fixed, arena, 4 * floats)
        codes = (_DTYPE_CODES[lay.cut_dim], _DTYPE_CODES[lay.child], _DTYPE_CODES[lay.pid])
        view = memoryview(out.data)
        for a, b, f in zip(starts.tolist(), ends.tolist(), floats.tolist(), strict=True):
            h = a + _HEADER.size
            _HEADER.pack_into(view, a, _MAGIC, _VERSION, *codes, *self._header_fields(f),
                              zlib.crc32(view[h:b]))
        return out, ends

    def restore(self, m: int, data: bytes) -> None:
        if len(data) < _HEADER.size:
            raise ValueError(f"numba RCF checkpoint too short: {len(data)} bytes")
        magic, version, c_dim, c_child, c_pid, *fields, crc = _HEADER.unpack_from(data)
        if magic != _MAGIC:
            raise ValueError(f"not a numba RCF checkpoint (magic {magic!r}, "
                             f"expected {_MAGIC!r})")
        if version not in (1, _VERSION):
            raise ValueError(f"unsupported numba RCF checkpoint version {version} "
                             f"(have {_VERSION}, and read 1)")
        lay = self.layout
        arena_floats = fields[-1]
        expected = self._header_fields(arena_floats)
        codes = (_DTYPE_CODES[lay.cut_dim], _DTYPE_CODES[lay.child], _DTYPE_CODES[lay.pid])
        if tuple(fields) != expected or (c_dim, c_child, c_pid) != codes:
            names = "dims, shingle, trees, sample_size, groups, point ids"
            raise ValueError(f"checkpoint is for ({names}) = {tuple(fields[:-1])}, "
                             f"engine has {expected[:-1]}")
        if zlib.crc32(memoryview(data)[_HEADER.size :]) != crc:
            raise ValueError("numba RCF checkpoint is damaged (CRC mismatch)")
        pos = _HEADER.size
        arrays = {}
        shapes = self._shapes()
        for name in _FIELDS:
            shape, dtype = shapes[name]
            if version == 1 and name in _NODE_FIELDS:
                shape = (shape[0], shape[1] - 1)
            count = int(np.prod(shape))
            size = count * dtype.itemsize
            if pos + size > len(data):
                raise ValueError(f"numba RCF checkpoint truncated in {name}")
            arrays[name] = np.frombuffer(data, dtype=dtype.newbyteorder("<"), count=count,
                                         offset=pos).reshape(shape)
            pos += size
        if pos + 4 * arena_floats != len(data):
            raise ValueError(f"numba RCF checkpoint has {len(data) - pos} arena bytes, "
                             f"header says {4 * arena_floats}")
        arena = np.frombuffer(data, dtype="<f4", count=arena_floats, offset=pos)
        if version == 1:
            _add_free_node(arrays)
        meta = arrays["meta"]
        if meta[kernels.META_ARENA_END] != arena_floats or not (
            0 <= meta[kernels.META_NPOINTS] <= lay.pids
        ):
            raise ValueError("numba RCF checkpoint is inconsistent (arena end, point count)")
        _check_ranges(arrays, self.config, lay, arena_floats)
        self.ensure(m + 1)
        self._grow_arena(arena_floats + 2 * lay.dim)
        for name, array in arrays.items():
            getattr(self, name)[m] = array
        self.arena[m] = 0.0
        self.arena[m, :arena_floats] = arena
        kernels.rebuild_boxes(m, self.root, self.left, self.right, self.cslot, self.cbox,
                              self.cmass, self.spid, self.offset, self.soff, self.arena)


def _add_free_node(arrays: dict[str, npt.NDArray]) -> None:
    """Give each tree of a version-1 model the internal node version 2 has, on its free
    list (the trees themselves are unchanged, so are their scores)."""
    for name in _NODE_FIELDS:
        a = arrays[name]
        arrays[name] = np.concatenate([a, np.zeros((a.shape[0], 1), dtype=a.dtype)], axis=1)
    extra = arrays["left"].shape[1] - 1
    arrays["left"][:, extra] = arrays["free_head"]
    arrays["right"][:, extra] = -1
    arrays["free_head"] = np.full_like(arrays["free_head"], extra)


def _check_ranges(arrays: dict[str, npt.NDArray], config: EngineConfig, lay: _Layout,
                  arena_floats: int) -> None:
    """Refuse indices that would send a kernel outside its arrays (a CRC-valid file from a
    buggy or foreign writer must still not crash the detector)."""
    s = config.sample_size
    problems = []
    for name in ("root", "free_head", "left", "right"):
        a = arrays[name].astype(np.int64)
        if a.size and (a.min() < -(s + 1) or a.max() > s - 1):
            problems.append(name)
    if arrays["cut_dim"].size and int(arrays["cut_dim"].max()) >= lay.dim:
        problems.append("cut_dim")
    spid = arrays["spid"].astype(np.int64)
    if spid.size and (spid.min() < -1 or spid.max() >= lay.pids):
        problems.append("spid")
    ssize = arrays["ssize"]
    if ssize.min() < 0 or ssize.max() > s:
        problems.append("ssize")
    live = arrays["refcnt"] > 0
    offsets = arrays["offset"][live].astype(np.int64)
    if offsets.size and (offsets.min() < 0 or offsets.max() + lay.dim > arena_floats):
        problems.append("offset")
    if problems:
        raise ValueError(f"numba RCF checkpoint has out-of-range {', '.join(problems)}")

"""Numba kernels of the batched Random Cut Forest: trees, sampler, point store, scoring.

Everything is arrays indexed by model; no Python object per tree or node. One kernel call
advances many models (all GPUs of a frame). The algorithms follow AWS's Java/Rust RCF:

* Trees: internal nodes hold a cut (dimension, value, ``x[dim] <= value`` goes left) and two
  child codes; a child code >= 0 is an internal node, ``-(slot + 2)`` is a leaf that refers
  to a sampler slot, -1 is empty. Free internal nodes form a list threaded through ``left``.
  Float bounding boxes for every node would be 2 x 4 x dims x shingle bytes per node (the
  reason krcf needs MBs per model). Here a box is grown on the fly from the leaf upwards by
  adding the sibling subtrees, except for the nodes with the largest subtrees, whose boxes
  are cached compactly as sample-slot indices (see "Box cache" below); both scoring and
  insertion stop as soon as the box contains the point (as AWS does).
* Insertion is AWS's bottom-up form: descend by the cuts to a leaf, then walk up growing the
  box, drawing one random cut per level in box U {point}, and keep the highest cut that
  separates the point from the box. That is the score's walk too, so one walk does both
  (``_walk_forest``): the samplers decide first, the cuts are drawn while scoring, and the
  new leaf is spliced in before the evicted point is deleted (``_take``). Deletion descends
  by the point and splices the parent out; in cached ancestors, the extremes the deleted
  slot held are found anew.
* Cold start: until a model must score (``output_after`` points) its samplers fill and
  its trees stay empty; at the first point it scores every tree is cut top-down from its
  group's sample (``_build_trees``), which is the same random cut tree in distribution and
  costs about ``n log n`` where inserting into trees too small to cache boxes costs up
  to ``n^2`` (66 us a step before, 1.2 us now: ``benchmarks.forest_phases``).
* Sampler: time-decayed reservoir as AWS's CompactSampler: weight
  ``-(seq * lambda) + log(-log U)``, keep the ``sample_size`` smallest, accept everything
  while filling (then with AWS's decreasing initial-accept probability). A model has
  ``groups`` samplers; the trees of a group share one sample (groups == trees is AWS's one
  sampler per tree). Exact duplicates share one leaf whose mass is the number of slots that
  hold the same point id (AWS hands the sampler the leaf's point index for a duplicate).
* Point store: a float32 arena per model; a point id maps to an offset of ``D = dims *
  shingle`` consecutive floats. A new shingle that directly follows the last stored one
  only appends ``dims`` floats (the overlap is shared). Ids are reference counted by the
  samplers; the arena is compacted in place when its tail is full.
* Scores: AWS's anomaly score (score-seen ``1/(depth + log2(mass + 1))`` damped by
  ``1 - mass / (2 * tree_mass)``, score-unseen ``1/(depth + 1)``, mixed bottom-up by the
  probability of separation, normalised by ``log2(tree_mass + 1)``, averaged over trees),
  and the directional attribution (AWS's DiVector) from the same pass.
* Screening (``screen`` in ``advance``): a point of a healthy GPU scores far below its
  threshold, so a few trees per group, taken in turn, estimate its score and the rest are
  walked only when that estimate comes near the threshold (or a group takes the point and
  its trees need their cuts). Scoring is most of a warm model's step.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from detector.engines.rcf.prefetch import prefetch, prefetch_lines

# Indices into the per-model int64 scalar block ``meta[m, :]``.
META_STEPS = 0  # base vectors seen (shingle fill included)
META_SEQ = 1  # complete shingled points learned (AWS's entries seen)
META_WBASE = 2  # sequence number the stored sampler weights are relative to
META_ARENA_END = 3  # first free float in the arena
META_LAST_PID = 4  # id of the point stored last (candidate for shingle overlap), -1 none
META_LAST_SEQ = 5  # seq at which META_LAST_PID was stored
META_FREE_PID = 6  # head of the free point-id list (threaded through ``offset``), -1 none
META_NPOINTS = 7  # live point ids
META_RNG = 8  # splitmix64 state (stored as int64 bits)
META_FIELDS = 9

# Box cache. Bounding boxes of the internal nodes with the largest subtrees (the ones that
# are expensive to grow on the fly) are kept, exactly, as sample-slot indices: for each
# dimension, the slot of the group's sample whose point attains the box's minimum and
# maximum (a box's extremes are always attained by one of its leaves). That is 2 * D
# bytes a box instead of 8 * D for floats, so four times as many boxes fit a model's budget.
# Per tree: ``cslot[node]`` is the node's cache entry (_NONE if none); entry c holds
# ``cbox[c, 0/1, d]`` (the lo/hi slot indices) and ``cmass[c]``, the number of leaves under
# the node (0 marks a free entry). A node is cached once it has ``threshold`` leaves (and an
# entry is free) and leaves the cache when it drops below 3/4 of that; the cache changes
# speed only, never a score: every cached box is the exact box of its node. Reading a
# cached coordinate goes through ``soff[m, g, slot]``, the arena offset of the point each
# sampler slot holds. Both are derived state: not checkpointed, rebuilt on restore.
NO_ENTRY = 255
_NONE = NO_ENTRY
# Renormalise sampler weights when the decayed part grows past this (keeps float32 exact).
_WEIGHT_RENORM = 64.0
_INITIAL_ACCEPT_FRACTION = 0.125


@njit(cache=True, error_model="numpy")
def cache_threshold(sample_size: int, entries: int) -> int:
    """Leaves a subtree needs to be cached. A random tree of n leaves has about
    ``2.4 n / k`` internal nodes with k or more leaves, so this about fills ``entries``
    (and a root holding half the sample is always worth an entry)."""
    if entries <= 0:
        return 1 << 30
    return max(2, min(int(2.4 * sample_size / entries + 0.5), sample_size // 2))


# The kernels below take the whole state arrays and index them with (m, t) or (m, g), and
# their hot loops are written out instead of calling small helpers: in numba a view sliced
# per tree, and a call that passes arrays, each cost atomic reference-count updates (the
# refcount pruner gives up on callees that may raise); those measured at 10-12 % of an
# update (numba's inline="always" did not save it: a helper for the sibling-box growth
# measured 16.1 k updates/s against 19.3 k written out). Indices known to be >= 0 are cast
# to unsigned, which skips numba's negative-index wraparound and lets LLVM vectorise the
# per-dimension loops.


# Reassociating sums lets LLVM vectorise them; that moves a score, or where a random cut
# falls inside its gap, by rounding only. No finite-math flags: boxes start at +-inf.
_SCORE_MATH = {"nsz", "reassoc", "contract", "arcp"}


@njit(cache=True, error_model="numpy")
def _compute_entry(c: int, node: int, m: int, t: int, g: int, left: np.ndarray,
                   right: np.ndarray, cslot: np.ndarray, cbox: np.ndarray, cmass: np.ndarray,
                   soff: np.ndarray, arena: np.ndarray,
                   stack: np.ndarray, lo: np.ndarray, hi: np.ndarray, loi: np.ndarray,
                   hii: np.ndarray) -> None:
    """Recompute cache entry c of tree t as the box and leaf count of internal ``node``
    (cached entries below it must be up to date)."""
    dim = lo.shape[0]
    lo[:] = np.inf
    hi[:] = -np.inf
    # Branch-free selects over int32 scratch indices: LLVM vectorises the leaf loop.
    mass = 0
    top = 2
    stack[0] = left[m, t, node]
    stack[1] = right[m, t, node]
    while top > 0:
        top -= 1
        n = stack[top]
        if n >= 0:
            k = cslot[m, t, n]
            if k != _NONE:
                mass += cmass[m, t, k]
                ku = np.uint64(k)
                for d in range(dim):
                    du = np.uint64(d)
                    sl = np.int32(cbox[m, t, ku, 0, du])
                    sh = np.int32(cbox[m, t, ku, 1, du])
                    a = arena[m, np.uint64(soff[m, g, sl]) + du]
                    b = arena[m, np.uint64(soff[m, g, sh]) + du]
                    lt = a < lo[d]
                    lo[d] = a if lt else lo[d]
                    loi[d] = sl if lt else loi[d]
                    gt = b > hi[d]
                    hi[d] = b if gt else hi[d]
                    hii[d] = sh if gt else hii[d]
            else:
                stack[top] = left[m, t, n]
                stack[top + 1] = right[m, t, n]
                top += 2
        else:
            mass += 1
            s = np.int32(-n - 2)
            off = np.uint64(soff[m, g, s])
            for d in range(dim):
                v = arena[m, off + np.uint64(d)]
                lt = v < lo[d]
                lo[d] = v if lt else lo[d]
                loi[d] = s if lt else loi[d]
                gt = v > hi[d]
                hi[d] = v if gt else hi[d]
                hii[d] = s if gt else hii[d]
    for d in range(dim):
        cbox[m, t, c, 0, d] = loi[d]
        cbox[m, t, c, 1, d] = hii[d]
    cmass[m, t, c] = mass


@njit(cache=True, error_model="numpy")
def _rebuild_tree_cache(m: int, t: int, g: int, root: np.ndarray, left: np.ndarray,
                        right: np.ndarray, cslot: np.ndarray, cbox: np.ndarray,
                        cmass: np.ndarray, spid: np.ndarray, offset: np.ndarray, soff: np.ndarray,
                        arena: np.ndarray, threshold: int, stack: np.ndarray, lo: np.ndarray,
                        hi: np.ndarray, loi: np.ndarray, hii: np.ndarray) -> None:
    """Fill tree t's cache from scratch: the largest subtrees first (breadth first from
    the root), as many as have ``threshold`` leaves and fit."""
    cslot[m, t, :] = _NONE
    cmass[m, t, :] = 0
    entries = cmass.shape[2]
    r = root[m, t]
    if r < 0 or entries == 0:
        return
    nodes = left.shape[2]
    mass = np.zeros(nodes, dtype=np.int64)
    order = np.empty(nodes, dtype=np.int64)
    # Breadth-first order; masses in reverse of it (children before parents).
    order[0] = r
    count = 1
    k = 0
    while k < count:
        n = order[k]
        k += 1
        for child in (left[m, t, n], right[m, t, n]):
            if child >= 0:
                order[count] = child
                count += 1
    for k in range(count - 1, -1, -1):
        n = order[k]
        total = 0
        for child in (left[m, t, n], right[m, t, n]):
            total += mass[child] if child >= 0 else 1
        mass[n] = total
    chosen = np.empty(entries, dtype=np.int64)
    used = 0
    for k in range(count):
        if used == entries:
            break
        n = order[k]
        if mass[n] >= threshold:
            cslot[m, t, n] = used
            chosen[used] = n
            cmass[m, t, used] = 1  # taken (set exactly below)
            used += 1
    for c in range(used - 1, -1, -1):
        _compute_entry(c, chosen[c], m, t, g, left, right, cslot, cbox, cmass, soff, arena,
                       stack, lo, hi, loi, hii)


@njit(cache=True, error_model="numpy")
def _splitmix_uniform(state: np.int64) -> tuple[np.int64, float]:
    """splitmix64 step on a scalar state: (new state, float in (0, 1))."""
    x = np.uint64(state) + np.uint64(0x9E3779B97F4A7C15)
    z = x
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(x), (float(z >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)


@njit(cache=True, error_model="numpy")
def _uniform(meta: np.ndarray, m: int) -> float:
    """The next float in (0, 1) of model m, whose splitmix64 state is ``meta[m, META_RNG]``."""
    state, u = _splitmix_uniform(meta[m, META_RNG])
    meta[m, META_RNG] = state
    return u


@njit(cache=True, error_model="numpy")
def _splice_cuts(
    q: np.ndarray, slot: int, m: int, g: int, t0: int, t1: int, pend_level: np.ndarray,
    pend_dim: np.ndarray, pend_val: np.ndarray, pend_inside: np.ndarray, root: np.ndarray,
    free_head: np.ndarray, cut_dim: np.ndarray, cut_val: np.ndarray, left: np.ndarray,
    right: np.ndarray, cslot: np.ndarray, cbox: np.ndarray, cmass: np.ndarray,
    soff: np.ndarray, arena: np.ndarray, path: np.ndarray,
) -> None:
    """Insert sampler slot ``slot`` (point ``q``, not a duplicate) into trees t0 .. t1-1 of
    group g at the cuts ``_walk_forest`` drew, and add it to the cached boxes above it
    (``_grow_caches`` adds new entries, once the evicted point is out)."""
    dim = q.shape[0]
    new_leaf = -(slot + 2)
    for t in range(t0, t1):
        cdim = pend_dim[t]
        if cdim < 0:
            root[m, t] = new_leaf
            continue
        cval = pend_val[t]
        at = pend_level[t]
        # The tree is as the walk saw it, so q's way down passes the same nodes.
        below = np.int64(root[m, t])
        for level in range(at + 1):
            path[level] = below
            if q[cut_dim[m, t, below]] <= cut_val[m, t, below]:
                below = np.int64(left[m, t, below])
            else:
                below = np.int64(right[m, t, below])
        node = free_head[m, t]
        free_head[m, t] = left[m, t, node]
        cut_dim[m, t, node] = cdim
        cut_val[m, t, node] = cval
        if q[cdim] <= cval:
            left[m, t, node] = new_leaf
            right[m, t, node] = below
        else:
            left[m, t, node] = below
            right[m, t, node] = new_leaf
        if at < 0:
            root[m, t] = node
        else:
            parent = path[at]
            if left[m, t, parent] == below:
                left[m, t, parent] = node
            else:
                right[m, t, parent] = node
        if cmass.shape[2] == 0:
            continue
        # Every cached ancestor of the new node gained the point; the boxes of those the
        # walk found to contain it stay as they are.
        inside = pend_inside[t]
        for level in range(at, -1, -1):
            c = cslot[m, t, path[level]]
            if c == _NONE:
                continue
            cmass[m, t, c] += 1
            if level <= inside:
                continue
            cu = np.uint64(c)
            for d in range(dim):
                du = np.uint64(d)
                sl = soff[m, g, np.uint64(cbox[m, t, cu, 0, du])]
                sh = soff[m, g, np.uint64(cbox[m, t, cu, 1, du])]
                if q[d] < arena[m, np.uint64(sl) + du]:
                    cbox[m, t, cu, 0, du] = slot
                if q[d] > arena[m, np.uint64(sh) + du]:
                    cbox[m, t, cu, 1, du] = slot


@njit(cache=True, error_model="numpy")
def _grow_caches(
    q: np.ndarray, m: int, g: int, t0: int, t1: int, threshold: int, root: np.ndarray,
    cut_dim: np.ndarray, cut_val: np.ndarray, left: np.ndarray, right: np.ndarray,
    cslot: np.ndarray, cbox: np.ndarray, cmass: np.ndarray, soff: np.ndarray,
    arena: np.ndarray, stack: np.ndarray, lo: np.ndarray, hi: np.ndarray, loi: np.ndarray,
    hii: np.ndarray,
) -> None:
    """After q went into trees t0 .. t1-1: the highest uncached node on q's way down (the
    one with the most leaves) may have grown into the cache.

    Runs after the evicted point is out: a new entry is built from the cached entries
    below it, and until then those may name the evicted point's slot for the new point."""
    if cmass.shape[2] == 0:
        return
    for t in range(t0, t1):
        free = -1
        for c in range(cmass.shape[2]):
            if cmass[m, t, c] == 0:
                free = c
                break
        if free < 0:
            continue
        candidate = np.int64(root[m, t])
        while candidate >= 0 and cslot[m, t, candidate] != _NONE:
            if q[cut_dim[m, t, candidate]] <= cut_val[m, t, candidate]:
                candidate = np.int64(left[m, t, candidate])
            else:
                candidate = np.int64(right[m, t, candidate])
        if candidate < 0:
            continue
        # Its leaves, counted until the threshold (cached subtrees by their mass).
        count = 0
        top = 1
        stack[0] = candidate
        while top > 0 and count < threshold:
            top -= 1
            n = stack[top]
            if n < 0:
                count += 1
            elif cslot[m, t, n] != _NONE:
                count += cmass[m, t, cslot[m, t, n]]
            else:
                stack[top] = left[m, t, n]
                stack[top + 1] = right[m, t, n]
                top += 2
        if count >= threshold:
            cslot[m, t, candidate] = free
            _compute_entry(free, int(candidate), m, t, g, left, right, cslot, cbox, cmass,
                           soff, arena, stack, lo, hi, loi, hii)


@njit(cache=True, error_model="numpy")
def _delete_from_trees(
    y: np.ndarray,
    slot: int,
    replacement: int,
    m: int,
    g: int,
    t0: int,
    t1: int,
    threshold: int,
    root: np.ndarray,
    free_head: np.ndarray,
    cut_dim: np.ndarray,
    cut_val: np.ndarray,
    left: np.ndarray,
    right: np.ndarray,
    cslot: np.ndarray,
    cbox: np.ndarray,
    cmass: np.ndarray,
    soff: np.ndarray,
    arena: np.ndarray,
    path: np.ndarray,
    stack: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    loi: np.ndarray,
    hii: np.ndarray,
) -> None:
    """Remove sampler slot ``slot`` (point ``y``) from trees t0 .. t1-1 of group g. If
    ``replacement`` >= 0 other slots still hold the same point: the leaf stays, re-pointed
    if it referred to ``slot``."""
    dim = y.shape[0]
    keep_above = threshold - threshold // 4
    for t in range(t0, t1):
        node = np.int64(root[m, t])
        depth = 0
        while node >= 0:
            path[depth] = node
            depth += 1
            if y[cut_dim[m, t, node]] <= cut_val[m, t, node]:
                node = np.int64(left[m, t, node])
            else:
                node = np.int64(right[m, t, node])
        leaf = node
        if replacement >= 0:
            if leaf == -(slot + 2):
                new_code = -(replacement + 2)
                if depth == 0:
                    root[m, t] = new_code
                else:
                    parent = path[depth - 1]
                    if left[m, t, parent] == leaf:
                        left[m, t, parent] = new_code
                    else:
                        right[m, t, parent] = new_code
                # Cached boxes naming the slot name the same point under its new slot.
                for level in range(depth):
                    c = cslot[m, t, path[level]]
                    if c != _NONE:
                        for side in range(2):
                            for d in range(dim):
                                if cbox[m, t, c, side, d] == slot:
                                    cbox[m, t, c, side, d] = replacement
            continue
        if depth == 0:
            root[m, t] = -1
            continue
        parent = path[depth - 1]
        sibling = right[m, t, parent] if left[m, t, parent] == leaf else left[m, t, parent]
        if depth == 1:
            root[m, t] = sibling
        else:
            grand = path[depth - 2]
            if left[m, t, grand] == parent:
                left[m, t, grand] = sibling
            else:
                right[m, t, grand] = sibling
        left[m, t, parent] = free_head[m, t]
        free_head[m, t] = parent
        c = cslot[m, t, parent]
        if c != _NONE:
            cslot[m, t, parent] = _NONE
            cmass[m, t, c] = 0
        # Cached ancestors lost a leaf: leave the cache when small, else recompute the box
        # if the deleted slot was one of its extremes (deepest first: parents build on
        # children).
        for level in range(depth - 2, -1, -1):
            a = path[level]
            c = cslot[m, t, a]
            if c == _NONE:
                continue
            cmass[m, t, c] -= 1
            if cmass[m, t, c] < keep_above:
                cslot[m, t, a] = _NONE
                cmass[m, t, c] = 0
                continue
            # Only the extremes the deleted slot held change: list those dimensions and
            # find each one's new extreme over the node's leaves (cached subtrees in one
            # step), writing the best slot so far into the entry as it goes.
            nlo = 0
            nhi = 0
            for d in range(dim):
                if cbox[m, t, c, 0, d] == slot:
                    loi[nlo] = d
                    lo[nlo] = np.inf
                    nlo += 1
                if cbox[m, t, c, 1, d] == slot:
                    hii[nhi] = d
                    hi[nhi] = -np.inf
                    nhi += 1
            if nlo + nhi == 0:
                continue
            cu = np.uint64(c)
            # Depth first: go left, keep the right child for later.
            top = 1
            stack[0] = right[m, t, a]
            n = np.int64(left[m, t, a])
            while True:
                if n >= 0:
                    k = cslot[m, t, n]
                    if k == _NONE:
                        stack[top] = right[m, t, n]
                        top += 1
                        n = np.int64(left[m, t, n])
                        continue
                    ku = np.uint64(k)
                    for j in range(nlo):
                        du = np.uint64(loi[j])
                        s2 = cbox[m, t, ku, 0, du]
                        v = arena[m, np.uint64(soff[m, g, np.uint64(s2)]) + du]
                        if v < lo[j]:
                            lo[j] = v
                            cbox[m, t, cu, 0, du] = s2
                    for j in range(nhi):
                        du = np.uint64(hii[j])
                        s2 = cbox[m, t, ku, 1, du]
                        v = arena[m, np.uint64(soff[m, g, np.uint64(s2)]) + du]
                        if v > hi[j]:
                            hi[j] = v
                            cbox[m, t, cu, 1, du] = s2
                else:
                    s2 = -n - 2
                    off = np.uint64(soff[m, g, np.uint64(s2)])
                    for j in range(nlo):
                        du = np.uint64(loi[j])
                        v = arena[m, off + du]
                        if v < lo[j]:
                            lo[j] = v
                            cbox[m, t, cu, 0, du] = s2
                    for j in range(nhi):
                        du = np.uint64(hii[j])
                        v = arena[m, off + du]
                        if v > hi[j]:
                            hi[j] = v
                            cbox[m, t, cu, 1, du] = s2
                if top == 0:
                    break
                top -= 1
                n = stack[top]


@njit(cache=True, error_model="numpy")
def compact_arena(m: int, arena: np.ndarray, offset: np.ndarray, refcnt: np.ndarray,
                  meta: np.ndarray, dim: int, spid: np.ndarray, soff: np.ndarray) -> None:
    """Move live points to the front of model m's arena, keeping shared shingle overlaps
    (and the sampler slots' copies of their offsets in step)."""
    npid = offset.shape[1]
    live = np.empty(npid, dtype=np.int64)
    count = 0
    for p in range(npid):
        if refcnt[m, p] > 0:
            live[count] = p
            count += 1
    live = live[:count]
    order = np.argsort(offset[m, live], kind="mergesort")
    arena_m = arena[m]
    write = 0  # next free float in the compacted arena
    prev_old = -(1 << 40)
    prev_new = 0
    for k in range(count):
        p = live[order[k]]
        old = offset[m, p]
        # A point overlapping the previous live one keeps the same relative position.
        new = prev_new + (old - prev_old) if old < prev_old + dim else write
        start = max(write, new)  # floats before ``write`` are already in place
        for j in range(start - new, dim):
            arena_m[new + j] = arena_m[old + j]
        write = new + dim
        offset[m, p] = new
        prev_old = old
        prev_new = new
    meta[m, META_ARENA_END] = write
    refresh_slot_offsets(m, spid, offset, soff)


@njit(cache=True, error_model="numpy", nogil=True)
def compact_arenas(first: int, stop: int, arena: np.ndarray, offset: np.ndarray,
                   refcnt: np.ndarray, meta: np.ndarray, dim: int, spid: np.ndarray,
                   soff: np.ndarray) -> None:
    """``compact_arena`` for models ``first..stop-1`` (a whole shard's checkpoint; without
    the GIL, like ``pack_rows``: the checkpoint runs in a thread beside the consuming one)."""
    for m in range(first, stop):
        compact_arena(m, arena, offset, refcnt, meta, dim, spid, soff)


@njit(cache=True, error_model="numpy", nogil=True)
def pack_rows(out: np.ndarray, starts: np.ndarray, fixed: np.ndarray, arena: np.ndarray,
              arena_bytes: np.ndarray) -> None:
    """Row m of ``fixed`` and the first ``arena_bytes[m]`` of arena row m, one after the
    other, into ``out`` from ``starts[m]`` (every row's checkpoint body at once)."""
    for m in range(starts.shape[0]):
        s = starts[m]
        width = fixed.shape[1]
        out[s:s + width] = fixed[m]
        out[s + width:s + width + arena_bytes[m]] = arena[m, :arena_bytes[m]]


@njit(cache=True, error_model="numpy")
def refresh_slot_offsets(m: int, spid: np.ndarray, offset: np.ndarray,
                         soff: np.ndarray) -> None:
    """``soff[m, g, s]``: arena offset of the point in sampler slot s (one indirection less
    for every box kernel; derived from ``spid`` and ``offset``)."""
    for g in range(spid.shape[1]):
        for s in range(spid.shape[2]):
            pid = spid[m, g, s]
            soff[m, g, s] = offset[m, pid] if pid >= 0 else 0


@njit(cache=True, error_model="numpy")
def _store_point(q: np.ndarray, shift: int, m: int, arena: np.ndarray, offset: np.ndarray,
                 refcnt: np.ndarray, meta: np.ndarray, spid: np.ndarray,
                 soff: np.ndarray) -> int:
    """Store the current shingle ``q``; returns its point id (reference count 0)."""
    dim = q.shape[0]
    pid = meta[m, META_FREE_PID]
    meta[m, META_FREE_PID] = offset[m, pid]
    meta[m, META_NPOINTS] += 1
    last = meta[m, META_LAST_PID]
    end = meta[m, META_ARENA_END]
    cap = arena.shape[1]
    overlap = (
        last >= 0
        and meta[m, META_LAST_SEQ] == meta[m, META_SEQ] - 1
        and offset[m, last] + dim == end
        and end + shift <= cap
    )
    if overlap:
        start = end - dim + shift
        for j in range(dim - shift, dim):
            arena[m, start + j] = q[j]
        meta[m, META_ARENA_END] = end + shift
    else:
        if end + dim > cap:
            # ``pid`` has no references yet, so compaction leaves it alone.
            compact_arena(m, arena, offset, refcnt, meta, dim, spid, soff)
            end = meta[m, META_ARENA_END]
        start = end
        for j in range(dim):
            arena[m, start + j] = q[j]
        meta[m, META_ARENA_END] = end + dim
    offset[m, pid] = start
    meta[m, META_LAST_PID] = pid
    meta[m, META_LAST_SEQ] = meta[m, META_SEQ]
    return pid


@njit(cache=True, error_model="numpy")
def _release_point(pid: int, m: int, offset: np.ndarray, refcnt: np.ndarray,
                   meta: np.ndarray) -> None:
    refcnt[m, pid] -= 1
    if refcnt[m, pid] == 0:
        offset[m, pid] = meta[m, META_FREE_PID]
        meta[m, META_FREE_PID] = pid
        meta[m, META_NPOINTS] -= 1
        if meta[m, META_LAST_PID] == pid:
            meta[m, META_LAST_PID] = -1


@njit(cache=True, error_model="numpy")
def _heaviest(weight_g: np.ndarray, size: int) -> int:
    best = 0
    for s in range(1, size):
        if weight_g[s] > weight_g[best]:
            best = s
    return best


@njit(cache=True, error_model="numpy")
def _offer(m: int, decay: float, meta: np.ndarray, weight: np.ndarray, ssize: np.ndarray,
           heavy: np.ndarray, accept: np.ndarray, wnew: np.ndarray) -> bool:
    """Each sampler of model m decides on the next point (AWS's time-decayed reservoir):
    ``accept[g]`` 0 rejects it, 1 puts it in a free slot, 2 evicts the heaviest slot;
    ``wnew[g]`` is its weight. Nothing changes yet but the weights' base (and the random
    state): the trees take the point in ``_take``, after the walk that scores it. Returns
    whether any sampler took it."""
    groups = weight.shape[1]
    capacity = weight.shape[2]
    seq = meta[m, META_SEQ]
    if (seq - meta[m, META_WBASE]) * decay > _WEIGHT_RENORM:
        delta = np.float32((seq - meta[m, META_WBASE]) * decay)
        for g in range(groups):
            for s in range(ssize[m, g]):
                weight[m, g, s] += delta
        meta[m, META_WBASE] = seq
    base = -(seq - meta[m, META_WBASE]) * decay
    taken = False
    for g in range(groups):
        size = ssize[m, g]
        w = np.float32(base + np.log(-np.log(_uniform(meta, m))))
        wnew[g] = w
        initial = False
        if size < capacity:
            fill = size / capacity
            if fill < _INITIAL_ACCEPT_FRACTION:
                accept_p = 1.0
            else:
                accept_p = 1.0 - (fill - _INITIAL_ACCEPT_FRACTION) / (
                    1.0 - _INITIAL_ACCEPT_FRACTION
                )
            initial = _uniform(meta, m) < accept_p
        if initial:
            accept[g] = 1
        elif size > 0 and w < weight[m, g, heavy[m, g]]:
            accept[g] = 2
        else:
            accept[g] = 0
        taken = taken or accept[g] != 0
    return taken


@njit(cache=True, error_model="numpy")
def _take(
    q: np.ndarray, shift: int, m: int, trees: bool, accept: np.ndarray, wnew: np.ndarray,
    dup: np.ndarray,
    pend_level: np.ndarray, pend_dim: np.ndarray, pend_val: np.ndarray,
    pend_inside: np.ndarray, threshold: int, meta: np.ndarray, weight: np.ndarray,
    spid: np.ndarray, ssize: np.ndarray, heavy: np.ndarray, root: np.ndarray,
    free_head: np.ndarray, cut_dim: np.ndarray, cut_val: np.ndarray, left: np.ndarray,
    right: np.ndarray, cslot: np.ndarray, cbox: np.ndarray, cmass: np.ndarray,
    arena: np.ndarray, offset: np.ndarray, soff: np.ndarray, refcnt: np.ndarray,
    path: np.ndarray, stack: np.ndarray, lo: np.ndarray, hi: np.ndarray, loi: np.ndarray,
    hii: np.ndarray, ybuf: np.ndarray,
) -> None:
    """Put ``q`` into every sampler that accepted it (``_offer``) and, with ``trees``,
    into their trees at the cuts the walk drew, then take out the points it evicted.
    Without ``trees`` (a model that has not built them yet, see ``_build_trees``) only the
    samplers and the point store change.

    Insertion comes before deletion because the cuts were drawn on the trees as they
    were; in distribution that is the same as AWS's delete-then-insert (each keeps a tree
    a random cut tree of its sample). While both are in a tree, the evicted point's leaf
    and the new one carry the same slot, whose offset already names the new point: the
    deletion finds the old leaf by its coordinates and re-derives every cached extreme
    that names the slot, which covers the boxes that read the wrong point meanwhile; new
    cache entries, which are built from those, are made only after it."""
    groups = weight.shape[1]
    per_group = root.shape[1] // groups
    dim = q.shape[0]
    new_pid = -1
    for g in range(groups):
        if accept[g] == 0:
            continue
        t0 = g * per_group
        t1 = t0 + per_group
        size = ssize[m, g]
        old_pid = -1
        replacement = -1
        if accept[g] == 1:
            slot = size
            ssize[m, g] = size + 1
        else:
            slot = heavy[m, g]
            old_pid = spid[m, g, slot]
            if dup[g] == old_pid:
                # The point re-enters the slot that holds it: only its weight changes.
                weight[m, g, slot] = wnew[g]
                heavy[m, g] = _heaviest(weight[m, g], size)
                continue
            if trees:
                for s in range(size):
                    if s != slot and spid[m, g, s] == old_pid:
                        replacement = s
                        break
                old_off = offset[m, old_pid]
                for d in range(dim):
                    ybuf[d] = arena[m, old_off + d]
                if replacement >= 0:
                    # Another slot holds the evicted point: its leaf is only renamed, which
                    # leaves the trees' shapes (and so the drawn cuts) as they were.
                    _delete_from_trees(ybuf, slot, replacement, m, g, t0, t1, threshold,
                                       root, free_head, cut_dim, cut_val, left, right, cslot,
                                       cbox, cmass, soff, arena, path, stack, lo, hi, loi,
                                       hii)
        pid = dup[g]
        if pid < 0:
            if new_pid < 0:
                new_pid = _store_point(q, shift, m, arena, offset, refcnt, meta, spid, soff)
            pid = new_pid
        spid[m, g, slot] = pid
        soff[m, g, slot] = offset[m, pid]
        weight[m, g, slot] = wnew[g]
        heavy[m, g] = _heaviest(weight[m, g], ssize[m, g])
        refcnt[m, pid] += 1
        if trees and dup[g] < 0:
            _splice_cuts(q, slot, m, g, t0, t1, pend_level, pend_dim, pend_val, pend_inside,
                         root, free_head, cut_dim, cut_val, left, right, cslot, cbox, cmass,
                         soff, arena, path)
        if old_pid >= 0:
            if trees and replacement < 0:
                _delete_from_trees(ybuf, slot, -1, m, g, t0, t1, threshold, root, free_head,
                                   cut_dim, cut_val, left, right, cslot, cbox, cmass, soff,
                                   arena, path, stack, lo, hi, loi, hii)
            _release_point(old_pid, m, offset, refcnt, meta)
        if trees and dup[g] < 0:
            _grow_caches(q, m, g, t0, t1, threshold, root, cut_dim, cut_val, left, right,
                         cslot, cbox, cmass, soff, arena, stack, lo, hi, loi, hii)


@njit(cache=True, error_model="numpy")
def _trees_empty(m: int, root: np.ndarray, groups: int, per_group: int) -> bool:
    """Whether every tree of model m is empty: a new model, or one whose samplers fill
    before ``output_after`` with their trees not built yet (see ``_build_trees``)."""
    for g in range(groups):  # noqa: SIM110 - a loop, which numba compiles without a generator
        if root[m, g * per_group] != -1:
            return False
    return True


@njit(cache=True, error_model="numpy")
def _sampled_twin(q: np.ndarray, m: int, g: int, spid: np.ndarray, ssize: np.ndarray,
                  soff: np.ndarray, arena: np.ndarray) -> int:
    """The point id of group g's sample that equals ``q`` exactly, -1 none (what the first
    tree's walk finds once the trees are built)."""
    dim = q.shape[0]
    for s in range(ssize[m, g]):
        off = np.uint64(soff[m, g, s])
        same = True
        for d in range(dim):
            if arena[m, off + np.uint64(d)] != q[d]:
                same = False
                break
        if same:
            return spid[m, g, s]
    return -1


@njit(cache=True, error_model="numpy")
def _build_trees(
    m: int, threshold: int, meta: np.ndarray, spid: np.ndarray, ssize: np.ndarray,
    root: np.ndarray, free_head: np.ndarray, cut_dim: np.ndarray, cut_val: np.ndarray,
    left: np.ndarray, right: np.ndarray, cslot: np.ndarray, cbox: np.ndarray,
    cmass: np.ndarray, offset: np.ndarray, soff: np.ndarray, arena: np.ndarray,
    stack: np.ndarray, lo: np.ndarray, hi: np.ndarray, loi: np.ndarray, hii: np.ndarray,
) -> None:
    """Build model m's empty trees top-down from their groups' samples, then their caches.

    A random cut tree grown by inserting points one at a time is distributed as one cut
    top-down on the whole set (Guha et al. 2016, theorem 2): a box's cut picks a dimension
    in proportion to its range and a value uniform in it. Top-down costs about
    ``n log n`` per tree where insertion into trees too small to have cached boxes costs up
    to ``n^2``, so a young model samples without trees until it must score
    (``output_after``) and builds them then."""
    groups = spid.shape[1]
    per_group = root.shape[1] // groups
    capacity = spid.shape[2]
    dim = lo.shape[0]
    rep_of = np.full(offset.shape[1], -1, dtype=np.int64)
    reps = np.empty(capacity, dtype=np.int64)
    r_from = np.empty(capacity + 1, dtype=np.int64)
    r_to = np.empty(capacity + 1, dtype=np.int64)
    r_parent = np.empty(capacity + 1, dtype=np.int64)
    r_right = np.empty(capacity + 1, dtype=np.bool_)
    for g in range(groups):
        t0 = g * per_group
        size = ssize[m, g]
        if size == 0 or root[m, t0] != -1:
            continue
        # One leaf per distinct point, named by the first slot that holds it.
        n = 0
        for s in range(size):
            pid = spid[m, g, s]
            if rep_of[pid] < 0:
                rep_of[pid] = s
                reps[n] = s
                n += 1
        for s in range(size):
            rep_of[spid[m, g, s]] = -1
        for t in range(t0, t0 + per_group):
            r_from[0] = 0
            r_to[0] = n
            r_parent[0] = -1
            r_right[0] = False
            top = 1
            while top > 0:
                top -= 1
                a = r_from[top]
                b = r_to[top]
                parent = r_parent[top]
                to_right = r_right[top]
                if b - a == 1:
                    code = -(reps[a] + 2)
                else:
                    for d in range(dim):
                        lo[d] = np.inf
                        hi[d] = -np.inf
                    for k in range(a, b):
                        off = np.uint64(soff[m, g, reps[k]])
                        for d in range(dim):
                            v = arena[m, off + np.uint64(d)]
                            lo[d] = v if v < lo[d] else lo[d]
                            hi[d] = v if v > hi[d] else hi[d]
                    span = 0.0
                    for d in range(dim):
                        span += np.float64(hi[d]) - np.float64(lo[d])
                    r = _uniform(meta, m) * span
                    cdim = -1
                    last = -1
                    for d in range(dim):
                        width = np.float64(hi[d]) - np.float64(lo[d])
                        if width > 0.0:
                            last = d
                            if r < width:
                                cdim = d
                                break
                            r -= width
                    if cdim < 0:
                        # Rounding left r past the last range: cut at its top (below).
                        cdim = last
                        r = np.float64(hi[last]) - np.float64(lo[last])
                    # ``x <= cut`` goes left, as in ``_walk_forest``: the cut lies in
                    # [lo, hi), so the lowest point goes left and the highest right.
                    cval = np.float32(np.float64(lo[cdim]) + r)
                    if cval >= hi[cdim]:
                        cval = np.float32(np.nextafter(hi[cdim], lo[cdim]))
                    i = a
                    j = b - 1
                    while i <= j:
                        if arena[m, np.uint64(soff[m, g, reps[i]]) + np.uint64(cdim)] <= cval:
                            i += 1
                        else:
                            swap = reps[i]
                            reps[i] = reps[j]
                            reps[j] = swap
                            j -= 1
                    node = free_head[m, t]
                    free_head[m, t] = left[m, t, node]
                    cut_dim[m, t, node] = cdim
                    cut_val[m, t, node] = cval
                    r_from[top] = i
                    r_to[top] = b
                    r_parent[top] = node
                    r_right[top] = True
                    r_from[top + 1] = a
                    r_to[top + 1] = i
                    r_parent[top + 1] = node
                    r_right[top + 1] = False
                    top += 2
                    code = node
                if parent < 0:
                    root[m, t] = code
                elif to_right:
                    right[m, t, parent] = code
                else:
                    left[m, t, parent] = code
            _rebuild_tree_cache(m, t, g, root, left, right, cslot, cbox, cmass, spid, offset,
                                soff, arena, threshold, stack, lo, hi, loi, hii)


@njit(cache=True, error_model="numpy")
def _prefetch_model(m: int, cut_dim: np.ndarray, cut_val: np.ndarray, left: np.ndarray,
                    right: np.ndarray, cslot: np.ndarray, cbox: np.ndarray, arena: np.ndarray,
                    meta: np.ndarray) -> None:
    """Start bringing model m's trees, boxes and points into cache, all at once (see
    ``prefetch``): for the first row of a call, which has no row before it to overlap."""
    prefetch_lines(cut_val[m].reshape(-1), cut_val[m].size)
    prefetch_lines(cut_dim[m].reshape(-1), cut_dim[m].size)
    prefetch_lines(left[m].reshape(-1), left[m].size)
    prefetch_lines(right[m].reshape(-1), right[m].size)
    prefetch_lines(cslot[m].reshape(-1), cslot[m].size)
    prefetch_lines(cbox[m].reshape(-1), cbox[m].size)
    prefetch_lines(arena[m], meta[m, META_ARENA_END])


@njit(cache=True, error_model="numpy", fastmath=_SCORE_MATH)
def _walk_forest(
    q: np.ndarray, m: int, m_next: int, attribute: bool, score: bool, accept: np.ndarray,
    dup: np.ndarray, t_from: int, t_to: int, turn: int, walked: np.ndarray,
    pend_level: np.ndarray, pend_dim: np.ndarray, pend_val: np.ndarray,
    pend_inside: np.ndarray, root: np.ndarray, cut_dim: np.ndarray, cut_val: np.ndarray,
    left: np.ndarray, right: np.ndarray, cslot: np.ndarray, cbox: np.ndarray,
    spid: np.ndarray, ssize: np.ndarray, soff: np.ndarray, arena: np.ndarray,
    meta: np.ndarray, path: np.ndarray, stack: np.ndarray, lo: np.ndarray, hi: np.ndarray,
    ghigh: np.ndarray, glow: np.ndarray, vhigh: np.ndarray,
    vlow: np.ndarray, high_i: np.ndarray, low_i: np.ndarray,
) -> float:
    """Model m's trees ``t_from .. t_to - 1`` of every group, counted round from the group's
    tree ``turn``, walked for ``q``: returns the sum of their scores (``walked[0]`` counts
    the trees) and, in the trees of every group that accepted q (``accept[g] != 0``), draws
    the cut that will insert it; with ``attribute`` (over all trees) also the DiVector in
    ``high_i``/``low_i`` (mean over trees, summing to the score). With ``score`` False only
    the accepting groups are walked (learning before ``output_after``, or the rest of a
    screened walk, see ``advance``).

    Scoring and AWS's bottom-up insertion take the same walk: descend by the cuts to a
    leaf, then climb, growing the box of each ancestor (from the cache, or by adding the
    sibling subtree), until a box contains q. Scoring mixes in each level's probability of
    separation; insertion draws one random cut per level in box U {q} and keeps the highest
    that separates q (a draw that separates with exactly that probability). One walk does
    both, on the trees as they were before this point:
    ``pend_level[t]`` (the cut goes between ``path[level]`` and the node below it, -1: above
    the root), ``pend_dim``/``pend_val`` (the cut; dim -1: the tree is empty) and
    ``pend_inside`` (the lowest level whose box holds q, -1 none) are what ``_splice_cuts``
    applies. ``dup[g]`` is the point id q duplicates in group g (-1 none): a duplicate
    joins its leaf and needs no cut.

    One function with the loops written out: every call of a numba function that takes
    arrays costs atomic reference counts (the refcount pruner gives up on callees that may
    raise), which measured as much as the work itself."""
    groups = spid.shape[1]
    trees = root.shape[1]
    per_group = trees // groups
    dim = q.shape[0]
    rng = meta[m, META_RNG]
    total = 0.0
    nodes = cut_val.shape[2]
    box_row = cbox.shape[2] * 2 * dim
    step_val = 64 // cut_val.itemsize
    step_child = 64 // left.itemsize
    step_dim = 64 // cut_dim.itemsize
    step_box = 64 // cbox.itemsize
    next_end = meta[m_next, META_ARENA_END] if m_next >= 0 else 0
    arena_share = (next_end + trees - 1) // trees
    for g in range(groups):
        draw = accept[g] != 0
        if draw:
            if t_from == 0:
                dup[g] = -1
            elif dup[g] >= 0:
                # The first trees found q in the sample: the group only counts it again.
                draw = False
        if not (score or draw):
            continue
        t0 = g * per_group
        size = ssize[m, g]
        walked[0] += t_to - t_from
        if size == 0:
            for t in range(t0, t0 + per_group):
                pend_dim[t] = -1
            continue
        norm = np.log2(size + 1.0)
        ghigh[:] = 0.0
        glow[:] = 0.0
        group_total = 0.0
        for k in range(t_from, t_to):
            t = t0 + (turn + k) % per_group
            if m_next >= 0:
                # Tree t of the next row's model (and a share of its points) streams in
                # while this tree is walked: a few lines at a time, which the memory
                # system keeps up with, where a whole model at once it drops.
                base = (m_next * trees + t) * nodes
                for k in range(0, nodes, step_val):
                    prefetch(cut_val, base + k)
                for k in range(0, nodes, step_child):
                    prefetch(left, base + k)
                    prefetch(right, base + k)
                for k in range(0, nodes, step_dim):
                    prefetch(cut_dim, base + k)
                for k in range(0, nodes, 64):
                    prefetch(cslot, base + k)
                base = (m_next * trees + t) * box_row
                for k in range(0, box_row, step_box):
                    prefetch(cbox, base + k)
                base = m_next * arena.shape[1] + t * arena_share
                for k in range(0, min(arena_share, next_end - t * arena_share), 16):
                    prefetch(arena, base + k)
            # Descend to the leaf.
            node = np.int64(root[m, t])
            depth = 0
            while node >= 0:
                path[depth] = node
                depth += 1
                if q[cut_dim[m, t, node]] <= cut_val[m, t, node]:
                    node = np.int64(left[m, t, node])
                else:
                    node = np.int64(right[m, t, node])
            leaf = node
            pid = spid[m, g, np.uint64(-leaf - 2)]
            off = np.uint64(soff[m, g, np.uint64(-leaf - 2)])
            equal = True
            for d in range(dim):
                if arena[m, off + np.uint64(d)] != q[d]:
                    equal = False
                    break
            if equal:
                # q is a sampled point: every tree of the group leads it to that point's
                # leaf (the first tree tells), so an accepting group only counts it again.
                if draw:
                    dup[g] = pid
                    draw = False
                mass = 0
                for s in range(size):
                    if spid[m, g, s] == pid:
                        mass += 1
                score_t = (1.0 - mass / (2.0 * size)) / (depth + np.log2(mass + 1.0))
                if attribute:
                    share = score_t / (2.0 * dim)
                    for d in range(dim):
                        ghigh[d] += share
                        glow[d] += share
                group_total += score_t
                continue
            # Climb from the leaf (level == depth: its box is its point) until a box
            # holds q.
            for d in range(dim):
                v = arena[m, off + np.uint64(d)]
                lo[d] = v
                hi[d] = v
            if attribute:
                vhigh[:] = 0.0
                vlow[:] = 0.0
            score_t = 0.0
            pend_inside[t] = -1
            child = leaf
            for level in range(depth, -1, -1):
                if level < depth:
                    node = path[level]
                    if left[m, t, node] == child:
                        sibling = np.int64(right[m, t, node])
                    else:
                        sibling = np.int64(left[m, t, node])
                    child = node
                    c = cslot[m, t, node]
                    # A cached box costs 2 * D scattered reads; a sibling that is a single
                    # leaf is D contiguous floats, so it is grown even when the box is cached.
                    if c != _NONE and sibling >= 0:
                        cu = np.uint64(c)
                        for d in range(dim):
                            du = np.uint64(d)
                            sl = soff[m, g, np.uint64(cbox[m, t, cu, 0, du])]
                            sh = soff[m, g, np.uint64(cbox[m, t, cu, 1, du])]
                            lo[d] = arena[m, np.uint64(sl) + du]
                            hi[d] = arena[m, np.uint64(sh) + du]
                    elif sibling < 0:
                        loff = np.uint64(soff[m, g, np.uint64(-sibling - 2)])
                        for d in range(dim):
                            v = arena[m, loff + np.uint64(d)]
                            lo[d] = v if v < lo[d] else lo[d]
                            hi[d] = v if v > hi[d] else hi[d]
                    else:
                        # Depth first: go left, keep the right child for later.
                        top = 0
                        n = sibling
                        while True:
                            if n >= 0:
                                k = cslot[m, t, n]
                                if k == _NONE:
                                    stack[top] = right[m, t, n]
                                    top += 1
                                    n = np.int64(left[m, t, n])
                                    continue
                                ku = np.uint64(k)
                                for d in range(dim):
                                    du = np.uint64(d)
                                    sl = soff[m, g, np.uint64(cbox[m, t, ku, 0, du])]
                                    sh = soff[m, g, np.uint64(cbox[m, t, ku, 1, du])]
                                    a = arena[m, np.uint64(sl) + du]
                                    b = arena[m, np.uint64(sh) + du]
                                    lo[d] = a if a < lo[d] else lo[d]
                                    hi[d] = b if b > hi[d] else hi[d]
                            else:
                                loff = np.uint64(soff[m, g, np.uint64(-n - 2)])
                                for d in range(dim):
                                    v = arena[m, loff + np.uint64(d)]
                                    lo[d] = v if v < lo[d] else lo[d]
                                    hi[d] = v if v > hi[d] else hi[d]
                            if top == 0:
                                break
                            top -= 1
                            n = stack[top]
                # lo/hi is now the box of the node at depth ``level`` on q's way.
                gap = 0.0
                span = 0.0
                for d in range(dim):
                    qd = np.float64(q[d])
                    h = np.float64(hi[d])
                    lw = np.float64(lo[d])
                    gap += max(qd - h, 0.0) + max(lw - qd, 0.0)
                    span += h - lw
                if gap <= 0.0:
                    pend_inside[t] = level
                    break
                new_range = span + gap
                prob = gap / new_range
                unseen = 1.0 / (level + 1.0)
                score_t = prob * unseen + (1.0 - prob) * score_t
                if attribute:
                    keep = 1.0 - prob
                    scale = unseen / new_range
                    for d in range(dim):
                        qd = q[d]
                        gh = float(qd) - float(hi[d]) if qd > hi[d] else 0.0
                        gl = float(lo[d]) - float(qd) if qd < lo[d] else 0.0
                        vhigh[d] = gh * scale + keep * vhigh[d]
                        vlow[d] = gl * scale + keep * vlow[d]
                if draw:
                    # AWS's randomCut in box U {q}: a dimension chosen in proportion to its
                    # range, a value uniform in it; it separates q from the box when it
                    # falls in the gap between them (probability gap / new_range), and then
                    # it is uniform in that gap. The highest such cut is the one kept.
                    rng, u = _splitmix_uniform(rng)
                    r = u * new_range
                    if r < gap:
                        cdim = -1
                        last = -1
                        width = 0.0
                        for d in range(dim):
                            qd = np.float64(q[d])
                            width = max(qd - np.float64(hi[d]), 0.0) + max(
                                np.float64(lo[d]) - qd, 0.0)
                            if width > 0.0:
                                last = d
                                if r < width:
                                    cdim = d
                                    break
                                r -= width
                        if cdim < 0:
                            # Rounding left r past the last gap: cut at its far end.
                            cdim = last
                            r = np.float64(q[last]) - np.float64(hi[last])
                            if r <= 0.0:
                                r = np.float64(lo[last]) - np.float64(q[last])
                        # In [hi, q) when q is above the box, in [q, lo) when below.
                        if q[cdim] > hi[cdim]:
                            base = hi[cdim]
                            end = q[cdim]
                        else:
                            base = q[cdim]
                            end = lo[cdim]
                        cval = np.float32(np.float64(base) + r)
                        if cval >= end:
                            cval = np.float32(np.nextafter(end, base))
                        pend_level[t] = level - 1
                        pend_dim[t] = cdim
                        pend_val[t] = cval
            if attribute:
                for d in range(dim):
                    ghigh[d] += vhigh[d]
                    glow[d] += vlow[d]
            group_total += score_t
        total += group_total * norm
        if attribute:
            for d in range(dim):
                high_i[d] += ghigh[d] * norm / trees
                low_i[d] += glow[d] * norm / trees
    meta[m, META_RNG] = rng
    return total


@njit(cache=True, error_model="numpy")
def advance(
    ids: np.ndarray,
    points: np.ndarray,
    learn: bool,
    admit_left: np.ndarray,
    attribute_above: np.ndarray,
    screen: int,
    screen_below: float,
    output_after: int,
    decay: float,
    meta: np.ndarray,
    shingle_buf: np.ndarray,
    weight: np.ndarray,
    spid: np.ndarray,
    ssize: np.ndarray,
    heavy: np.ndarray,
    root: np.ndarray,
    free_head: np.ndarray,
    cut_dim: np.ndarray,
    cut_val: np.ndarray,
    left: np.ndarray,
    right: np.ndarray,
    cslot: np.ndarray,
    cbox: np.ndarray,
    cmass: np.ndarray,
    arena: np.ndarray,
    offset: np.ndarray,
    soff: np.ndarray,
    refcnt: np.ndarray,
    scores: np.ndarray,
    attribution: np.ndarray,
    direction: np.ndarray,
) -> int:
    """Score each row's shingled point against its model (and learn it if ``learn``).

    A model past ``output_after`` whose trees are not built yet builds them now while
    ``admit_left[0]`` (decremented for each) is positive; otherwise it stays in its cold
    start (scores 0, samples on) for this call.

    ``attribute_above`` is each row's threshold. For rows whose score exceeds it,
    ``attribution[i, f]`` is base feature f's share of the forest's DiVector (averaged over
    trees, summed over its shingle positions, high + low) and ``direction[i, f]`` the sign
    of high - low; zeros elsewhere.

    Screening (``0 < screen`` < trees per group): ``screen`` trees of every group, the next
    ones in turn for each point, are walked first; when their mean is below ``screen_below`` times the row's threshold
    the point is plainly ordinary and its score is the mean of the trees walked (the
    screen's, and the rest of any group that takes the point, whose trees need their cuts
    anyway), an unbiased estimate of the full mean from fewer trees. Otherwise every tree
    is walked, so a score near or above the threshold is always the whole forest's.
    Returns the most live points any learning model now holds (the arena must fit one more
    after compaction)."""
    n = ids.shape[0]
    dims = points.shape[1]
    dim = shingle_buf.shape[1]
    shingle = dim // dims
    capacity = weight.shape[2]
    q = np.empty(dim, dtype=np.float32)
    path = np.empty(capacity + 2, dtype=np.int64)
    stack = np.empty(2 * capacity + 4, dtype=np.int64)
    lo = np.empty(dim, dtype=np.float32)
    hi = np.empty(dim, dtype=np.float32)
    ybuf = np.empty(dim, dtype=np.float32)
    loi = np.empty(dim, dtype=np.int32)
    hii = np.empty(dim, dtype=np.int32)
    threshold = cache_threshold(capacity, cmass.shape[2])
    groups = weight.shape[1]
    trees = root.shape[1]
    per_group = trees // groups
    first = screen if 0 < screen < per_group else per_group
    walked = np.zeros(1, dtype=np.int64)
    accept = np.zeros(groups, dtype=np.int8)
    no_accept = np.zeros(groups, dtype=np.int8)
    wnew = np.empty(groups, dtype=np.float32)
    dup = np.empty(groups, dtype=np.int64)
    pend_level = np.empty(trees, dtype=np.int64)
    pend_dim = np.empty(trees, dtype=np.int64)
    pend_val = np.empty(trees, dtype=np.float32)
    pend_inside = np.empty(trees, dtype=np.int64)
    vhigh = np.empty(dim)
    vlow = np.empty(dim)
    ghigh = np.empty(dim)
    glow = np.empty(dim)
    high = np.empty(dim)
    low = np.empty(dim)
    most = 0
    if n > 0:
        _prefetch_model(ids[0], cut_dim, cut_val, left, right, cslot, cbox, arena, meta)
    for i in range(n):
        m = ids[i]
        m_next = ids[i + 1] if i + 1 < n else -1
        for d in range(dim - dims):
            q[d] = shingle_buf[m, d + dims]
        for d in range(dims):
            q[dim - dims + d] = points[i, d]
        steps = meta[m, META_STEPS]
        scores[i] = 0.0
        high[:] = 0.0
        low[:] = 0.0
        attributed = False
        full = steps + 1 >= shingle
        scoring = full and meta[m, META_SEQ] >= output_after and meta[m, META_SEQ] > 0
        empty = _trees_empty(m, root, groups, per_group)
        if scoring and empty:
            if admit_left[0] > 0:
                admit_left[0] -= 1
                _build_trees(m, threshold, meta, spid, ssize, root, free_head, cut_dim,
                             cut_val, left, right, cslot, cbox, cmass, offset, soff, arena,
                             stack, lo, hi, loi, hii)
            else:
                scoring = False  # held in its cold start: it samples on, unscored
        taking = learn and full and _offer(m, decay, meta, weight, ssize, heavy, accept, wnew)
        # Before it scores, a model only samples; its trees are built when it first must.
        sampling = taking and not scoring and empty
        if sampling:
            for g in range(groups):
                dup[g] = _sampled_twin(q, m, g, spid, ssize, soff, arena) if accept[g] else -1
        elif scoring or taking:
            # Score (and draw the cuts that learn q) without attribution; only a row above
            # its limit (an anomaly, rare) takes a second pass that fills the DiVector.
            offered = accept if taking else no_accept
            upto = first if scoring else per_group
            # The screen moves on by its own width each point: every tree takes its turn,
            # so no model's scores lean on the same few trees.
            turn = (meta[m, META_SEQ] * first) % per_group
            walked[0] = 0
            total = _walk_forest(q, m, m_next, False, scoring, offered, dup, 0, upto, turn,
                                 walked, pend_level, pend_dim, pend_val, pend_inside, root,
                                 cut_dim, cut_val, left, right, cslot, cbox, spid, ssize, soff,
                                 arena, meta, path, stack, lo, hi, ghigh, glow, vhigh, vlow,
                                 high, low)
            if upto < per_group:
                # Past the screen: every tree when the first ones are not plainly below
                # the threshold, else only the groups that take q.
                rest = total >= screen_below * attribute_above[i] * walked[0]
                if rest or taking:
                    total += _walk_forest(q, m, m_next, False, rest, offered, dup, upto,
                                          per_group, turn, walked, pend_level, pend_dim,
                                          pend_val, pend_inside, root, cut_dim, cut_val,
                                          left, right, cslot, cbox, spid, ssize, soff,
                                          arena, meta, path, stack, lo, hi, ghigh, glow,
                                          vhigh, vlow, high, low)
            if scoring:
                total /= walked[0]
                scores[i] = total
                if total > attribute_above[i]:
                    _walk_forest(q, m, -1, True, True, no_accept, dup, 0, per_group, 0,
                                 walked, pend_level, pend_dim, pend_val, pend_inside, root,
                                 cut_dim, cut_val, left, right, cslot, cbox, spid, ssize, soff,
                                 arena, meta, path, stack, lo, hi, ghigh, glow, vhigh, vlow,
                                 high, low)
                    attributed = True
        for f in range(dims):
            h = 0.0
            lw = 0.0
            if attributed:
                for j in range(shingle):
                    h += high[j * dims + f]
                    lw += low[j * dims + f]
            attribution[i, f] = h + lw
            direction[i, f] = 1 if h > lw else (-1 if h < lw else 0)
        if learn:
            for d in range(dim):
                shingle_buf[m, d] = q[d]
            meta[m, META_STEPS] = steps + 1
            if taking:
                _take(q, dims, m, not sampling, accept, wnew, dup, pend_level, pend_dim,
                      pend_val, pend_inside, threshold, meta, weight, spid, ssize, heavy,
                      root, free_head, cut_dim, cut_val, left, right, cslot, cbox, cmass,
                      arena, offset, soff, refcnt, path, stack, lo, hi, loi, hii, ybuf)
            if full:
                meta[m, META_SEQ] += 1
            most = max(most, meta[m, META_NPOINTS])
    return most


@njit(cache=True, error_model="numpy")
def rebuild_boxes(m: int, root: np.ndarray, left: np.ndarray, right: np.ndarray,
                  cslot: np.ndarray, cbox: np.ndarray, cmass: np.ndarray, spid: np.ndarray,
                  offset: np.ndarray, soff: np.ndarray, arena: np.ndarray) -> None:
    """Refill model m's slot offsets and box cache (derived state: not checkpointed)."""
    refresh_slot_offsets(m, spid, offset, soff)
    trees = root.shape[1]
    per_group = trees // spid.shape[1]
    capacity = spid.shape[2]
    dim = cbox.shape[4]
    threshold = cache_threshold(capacity, cmass.shape[2])
    stack = np.empty(2 * capacity + 4, dtype=np.int64)
    lo = np.empty(dim, dtype=np.float32)
    hi = np.empty(dim, dtype=np.float32)
    loi = np.empty(dim, dtype=np.int32)
    hii = np.empty(dim, dtype=np.int32)
    for t in range(trees):
        _rebuild_tree_cache(m, t, t // per_group, root, left, right, cslot, cbox, cmass, spid,
                            offset, soff, arena, threshold, stack, lo, hi, loi, hii)

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
  separates the point from the box. Deletion descends by the point and splices the parent
  out; cached ancestors whose box named the deleted slot are recomputed.
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
"""

from __future__ import annotations

import numpy as np
from numba import njit

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
# speed only, never a score: every cached box is the exact box of its node.
NO_ENTRY = 255
_NONE = NO_ENTRY
# Renormalise sampler weights when the decayed part grows past this (keeps float32 exact).
_WEIGHT_RENORM = 64.0
_INITIAL_ACCEPT_FRACTION = 0.125


@njit(cache=True)
def _uniform(meta: np.ndarray, m: int) -> float:
    """splitmix64 -> float in (0, 1); the state lives in ``meta[m, META_RNG]``."""
    x = np.uint64(meta[m, META_RNG]) + np.uint64(0x9E3779B97F4A7C15)
    meta[m, META_RNG] = np.int64(x)
    z = x
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return (float(z >> np.uint64(11)) + 0.5) * (1.0 / 9007199254740992.0)


@njit(cache=True, inline="always")
def _grow_leaf(arena_m: np.ndarray, off: int, lo: np.ndarray, hi: np.ndarray, dim: int) -> None:
    # Unsigned indices: numba then skips the negative-index check, and LLVM vectorises.
    base = np.uint64(off)
    for d in range(dim):
        v = arena_m[base + np.uint64(d)]
        lo[d] = v if v < lo[d] else lo[d]
        hi[d] = v if v > hi[d] else hi[d]


@njit(cache=True)
def cache_threshold(sample_size: int, entries: int) -> int:
    """Leaves a subtree needs to be cached. A random tree of n leaves has about
    ``2.4 n / k`` internal nodes with k or more leaves, so this about fills ``entries``
    (and a root holding half the sample is always worth an entry)."""
    if entries <= 0:
        return 1 << 30
    return max(2, min(int(2.4 * sample_size / entries + 0.5), sample_size // 2))


@njit(cache=True, inline="always")
def _slot_value(s: int, d: int, spid_g: np.ndarray, offset_m: np.ndarray,
                arena_m: np.ndarray) -> np.float32:
    """Coordinate d of the point in sampler slot s (a slot that holds a point)."""
    return arena_m[np.uint64(offset_m[np.uint64(spid_g[np.uint64(s)])]) + np.uint64(d)]


@njit(cache=True, inline="always")
def _grow_cached(c: int, cbox_t: np.ndarray, spid_g: np.ndarray, offset_m: np.ndarray,
                 arena_m: np.ndarray, lo: np.ndarray, hi: np.ndarray, dim: int) -> None:
    """Extend (lo, hi) by cached box c."""
    box = cbox_t[np.uint64(c)]
    for d in range(dim):
        a = _slot_value(box[0, d], d, spid_g, offset_m, arena_m)
        b = _slot_value(box[1, d], d, spid_g, offset_m, arena_m)
        lo[d] = a if a < lo[d] else lo[d]
        hi[d] = b if b > hi[d] else hi[d]


@njit(cache=True, inline="always")
def _read_cached(c: int, cbox_t: np.ndarray, spid_g: np.ndarray, offset_m: np.ndarray,
                 arena_m: np.ndarray, lo: np.ndarray, hi: np.ndarray, dim: int) -> None:
    """(lo, hi) := cached box c."""
    box = cbox_t[np.uint64(c)]
    for d in range(dim):
        lo[d] = _slot_value(box[0, d], d, spid_g, offset_m, arena_m)
        hi[d] = _slot_value(box[1, d], d, spid_g, offset_m, arena_m)


# Reassociating the two sums lets LLVM vectorise them; it moves a score by rounding only
# (no other kernel uses it, so trees grow exactly as without it).
@njit(cache=True, fastmath={"nsz", "reassoc", "contract", "arcp"})
def _gap_span(q: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[float, float]:
    """How far q lies outside the box (L1) and the box's summed side lengths."""
    gap = 0.0
    span = 0.0
    for d in range(q.shape[0]):
        qd = np.float64(q[d])
        h = np.float64(hi[d])
        lw = np.float64(lo[d])
        gap += max(qd - h, 0.0) + max(lw - qd, 0.0)
        span += h - lw
    return gap, span


@njit(cache=True)
def _grow_subtree(
    node: int,
    left_t: np.ndarray,
    right_t: np.ndarray,
    cslot_t: np.ndarray,
    cbox_t: np.ndarray,
    spid_g: np.ndarray,
    offset_m: np.ndarray,
    arena_m: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    stack: np.ndarray,
    dim: int,
) -> None:
    """Extend the box (lo, hi) by every point under ``node`` (cached subtrees in one step)."""
    top = 1
    stack[0] = node
    while top > 0:
        top -= 1
        n = stack[top]
        if n >= 0:
            c = cslot_t[n]
            if c != _NONE:
                _grow_cached(c, cbox_t, spid_g, offset_m, arena_m, lo, hi, dim)
            else:
                stack[top] = left_t[n]
                stack[top + 1] = right_t[n]
                top += 2
        else:
            _grow_leaf(arena_m, offset_m[np.uint64(spid_g[np.uint64(-n - 2)])], lo, hi, dim)


@njit(cache=True)
def _count_upto(node: int, limit: int, left_t: np.ndarray, right_t: np.ndarray,
                cslot_t: np.ndarray, cmass_t: np.ndarray, stack: np.ndarray) -> int:
    """Leaves under ``node``, counted until ``limit`` is reached."""
    count = 0
    top = 1
    stack[0] = node
    while top > 0 and count < limit:
        top -= 1
        n = stack[top]
        if n >= 0:
            c = cslot_t[n]
            if c != _NONE:
                count += cmass_t[c]
            else:
                stack[top] = left_t[n]
                stack[top + 1] = right_t[n]
                top += 2
        else:
            count += 1
    return count


@njit(cache=True)
def _compute_entry(c: int, node: int, left_t: np.ndarray, right_t: np.ndarray,
                   cslot_t: np.ndarray, cbox_t: np.ndarray, cmass_t: np.ndarray,
                   spid_g: np.ndarray, offset_m: np.ndarray, arena_m: np.ndarray,
                   stack: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> None:
    """Recompute cache entry c as the box and leaf count of internal ``node`` (cached
    entries below it must be up to date)."""
    dim = lo.shape[0]
    lo[:] = np.inf
    hi[:] = -np.inf
    # Branch-free selects over int32 scratch indices: LLVM vectorises the leaf loop.
    loi = np.zeros(dim, dtype=np.int32)
    hii = np.zeros(dim, dtype=np.int32)
    mass = 0
    top = 2
    stack[0] = left_t[node]
    stack[1] = right_t[node]
    while top > 0:
        top -= 1
        n = stack[top]
        if n >= 0:
            k = cslot_t[n]
            if k != _NONE:
                mass += cmass_t[k]
                box = cbox_t[np.uint64(k)]
                for d in range(dim):
                    sl = np.int32(box[0, d])
                    sh = np.int32(box[1, d])
                    a = _slot_value(sl, d, spid_g, offset_m, arena_m)
                    b = _slot_value(sh, d, spid_g, offset_m, arena_m)
                    lt = a < lo[d]
                    lo[d] = a if lt else lo[d]
                    loi[d] = sl if lt else loi[d]
                    gt = b > hi[d]
                    hi[d] = b if gt else hi[d]
                    hii[d] = sh if gt else hii[d]
            else:
                stack[top] = left_t[n]
                stack[top + 1] = right_t[n]
                top += 2
        else:
            mass += 1
            s = np.int32(-n - 2)
            off = np.uint64(offset_m[np.uint64(spid_g[np.uint64(s)])])
            for d in range(dim):
                v = arena_m[off + np.uint64(d)]
                lt = v < lo[d]
                lo[d] = v if lt else lo[d]
                loi[d] = s if lt else loi[d]
                gt = v > hi[d]
                hi[d] = v if gt else hi[d]
                hii[d] = s if gt else hii[d]
    for d in range(dim):
        cbox_t[c, 0, d] = loi[d]
        cbox_t[c, 1, d] = hii[d]
    cmass_t[c] = mass


@njit(cache=True)
def _free_entry(cmass_t: np.ndarray) -> int:
    for c in range(cmass_t.shape[0]):
        if cmass_t[c] == 0:
            return c
    return -1


@njit(cache=True)
def _descend(
    q: np.ndarray,
    root: int,
    cut_dim_t: np.ndarray,
    cut_val_t: np.ndarray,
    left_t: np.ndarray,
    right_t: np.ndarray,
    path: np.ndarray,
) -> tuple[int, int]:
    """Follow the cuts from the root; returns (leaf code, depth). ``path[:depth]`` holds the
    internal nodes from the root down."""
    node = root
    depth = 0
    while node >= 0:
        path[depth] = node
        depth += 1
        node = left_t[node] if q[cut_dim_t[node]] <= cut_val_t[node] else right_t[node]
    return node, depth


@njit(cache=True)
def _slot_mass(spid_g: np.ndarray, size: int, pid: int) -> int:
    count = 0
    for s in range(size):
        if spid_g[s] == pid:
            count += 1
    return count


@njit(cache=True)
def rebuild_tree_cache(root: int, left_t: np.ndarray, right_t: np.ndarray,
                       cslot_t: np.ndarray, cbox_t: np.ndarray, cmass_t: np.ndarray,
                       spid_g: np.ndarray, offset_m: np.ndarray, arena_m: np.ndarray,
                       threshold: int, stack: np.ndarray, lo: np.ndarray,
                       hi: np.ndarray) -> None:
    """Fill one tree's cache from scratch: the largest subtrees first (breadth first from
    the root), as many as have ``threshold`` leaves and fit."""
    cslot_t[:] = _NONE
    cmass_t[:] = 0
    entries = cmass_t.shape[0]
    if root < 0 or entries == 0:
        return
    nodes = left_t.shape[0]
    mass = np.zeros(nodes, dtype=np.int64)
    order = np.empty(nodes, dtype=np.int64)
    # Breadth-first order; masses in reverse of it (children before parents).
    order[0] = root
    count = 1
    k = 0
    while k < count:
        n = order[k]
        k += 1
        for child in (left_t[n], right_t[n]):
            if child >= 0:
                order[count] = child
                count += 1
    for k in range(count - 1, -1, -1):
        n = order[k]
        total = 0
        for child in (left_t[n], right_t[n]):
            total += mass[child] if child >= 0 else 1
        mass[n] = total
    chosen = np.empty(entries, dtype=np.int64)
    used = 0
    for k in range(count):
        if used == entries:
            break
        n = order[k]
        if mass[n] >= threshold:
            cslot_t[n] = used
            chosen[used] = n
            cmass_t[used] = 1  # taken (set exactly below)
            used += 1
    for c in range(used - 1, -1, -1):
        _compute_entry(c, chosen[c], left_t, right_t, cslot_t, cbox_t, cmass_t, spid_g,
                       offset_m, arena_m, stack, lo, hi)


@njit(cache=True)
def _score_tree(
    q: np.ndarray,
    root: int,
    cut_dim_t: np.ndarray,
    cut_val_t: np.ndarray,
    left_t: np.ndarray,
    right_t: np.ndarray,
    cslot_t: np.ndarray,
    cbox_t: np.ndarray,
    spid_g: np.ndarray,
    size: int,
    offset_m: np.ndarray,
    arena_m: np.ndarray,
    path: np.ndarray,
    stack: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    high: np.ndarray,
    low: np.ndarray,
    vhigh: np.ndarray,
    vlow: np.ndarray,
    attribute: bool,
) -> float:
    """AWS anomaly score of ``q`` in one tree (before normalisation); if ``attribute``, the
    tree's DiVector is added into ``high``/``low`` (summing to the returned score)."""
    dim = q.shape[0]
    leaf, depth = _descend(q, root, cut_dim_t, cut_val_t, left_t, right_t, path)
    pid = spid_g[-leaf - 2]
    off = offset_m[pid]
    x = arena_m[off : off + dim]
    equal = True
    for d in range(dim):
        if x[d] != q[d]:
            equal = False
            break
    if equal:
        mass = _slot_mass(spid_g, size, pid)
        score = (1.0 - mass / (2.0 * size)) / (depth + np.log2(mass + 1.0))
        if attribute:
            share = score / (2.0 * dim)
            for d in range(dim):
                high[d] += share
                low[d] += share
        return score
    # The leaf is a box holding one point: the separation probability is 1.
    score = 1.0 / (depth + 1.0)
    for d in range(dim):
        lo[d] = x[d]
        hi[d] = x[d]
    if attribute:
        total = 0.0
        for d in range(dim):
            diff = np.float64(q[d]) - np.float64(x[d])
            vhigh[d] = max(diff, 0.0)
            vlow[d] = max(-diff, 0.0)
            total += abs(diff)
        for d in range(dim):
            vhigh[d] = vhigh[d] / total * score
            vlow[d] = vlow[d] / total * score
    child = leaf
    for level in range(depth - 1, -1, -1):
        node = path[level]
        c = cslot_t[node]
        if c != _NONE:
            _read_cached(c, cbox_t, spid_g, offset_m, arena_m, lo, hi, dim)
        else:
            sibling = right_t[node] if left_t[node] == child else left_t[node]
            if sibling < 0:
                _grow_leaf(arena_m, offset_m[spid_g[-sibling - 2]], lo, hi, dim)
            else:
                _grow_subtree(sibling, left_t, right_t, cslot_t, cbox_t, spid_g, offset_m,
                              arena_m, lo, hi, stack, dim)
        child = node
        gap, span = _gap_span(q, lo, hi)
        if gap <= 0.0:
            break
        new_range = span + gap
        prob = gap / new_range
        unseen = 1.0 / (level + 1.0)
        score = prob * unseen + (1.0 - prob) * score
        if attribute:
            keep = 1.0 - prob
            scale = unseen / new_range
            for d in range(dim):
                qd = q[d]
                gh = float(qd) - float(hi[d]) if qd > hi[d] else 0.0
                gl = float(lo[d]) - float(qd) if qd < lo[d] else 0.0
                vhigh[d] = gh * scale + keep * vhigh[d]
                vlow[d] = gl * scale + keep * vlow[d]
    if attribute:
        for d in range(dim):
            high[d] += vhigh[d]
            low[d] += vlow[d]
    return score


@njit(cache=True)
def _random_cut(
    factor: float, q: np.ndarray, lo: np.ndarray, hi: np.ndarray
) -> tuple[int, np.float32]:
    """AWS's randomCut: a dimension chosen in proportion to the range of box U {q}, and a
    value uniform in it (kept in [min, max) so both sides are non-empty)."""
    dim = q.shape[0]
    total = 0.0
    for d in range(dim):
        mn = min(lo[d], q[d])
        mx = max(hi[d], q[d])
        total += float(mx) - float(mn)
    brk = factor * total
    last = -1
    for d in range(dim):
        mn = min(lo[d], q[d])
        mx = max(hi[d], q[d])
        gap = float(mx) - float(mn)
        if gap > 0.0:
            last = d
            if brk <= gap:
                value = np.float32(float(mn) + brk)
                if value >= mx:
                    value = np.float32(np.nextafter(mx, mn))
                return d, value
        brk -= gap
    # Rounding left brk above the last gap: cut just below the top of the last usable dim.
    mn = min(lo[last], q[last])
    mx = max(hi[last], q[last])
    return last, np.float32(np.nextafter(mx, mn))


@njit(cache=True)
def _insert_leaf(
    q: np.ndarray,
    slot: int,
    t: int,
    m: int,
    threshold: int,
    root: np.ndarray,
    free_head: np.ndarray,
    cut_dim_t: np.ndarray,
    cut_val_t: np.ndarray,
    left_t: np.ndarray,
    right_t: np.ndarray,
    cslot_t: np.ndarray,
    cbox_t: np.ndarray,
    cmass_t: np.ndarray,
    spid_g: np.ndarray,
    offset_m: np.ndarray,
    arena_m: np.ndarray,
    meta: np.ndarray,
    path: np.ndarray,
    stack: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
) -> None:
    """Insert sampler slot ``slot`` (whose point is ``q``, not a duplicate) into tree t."""
    dim = q.shape[0]
    new_leaf = -(slot + 2)
    r = root[m, t]
    if r == -1:
        root[m, t] = new_leaf
        return
    leaf, depth = _descend(q, r, cut_dim_t, cut_val_t, left_t, right_t, path)
    off = offset_m[spid_g[-leaf - 2]]
    x = arena_m[off : off + dim]
    for d in range(dim):
        lo[d] = x[d]
        hi[d] = x[d]
    cur = leaf
    level = depth - 1
    saved_node = leaf
    saved_level = level
    saved_dim = -1
    saved_val = np.float32(0.0)
    while True:
        factor = _uniform(meta, m)
        cdim, cval = _random_cut(factor, q, lo, hi)
        if (q[cdim] <= cval and cval < lo[cdim]) or (q[cdim] > cval and cval >= hi[cdim]):
            saved_node = cur
            saved_level = level
            saved_dim = cdim
            saved_val = cval
        contains = True
        for d in range(dim):
            if q[d] < lo[d] or q[d] > hi[d]:
                contains = False
                break
        if contains or level < 0:
            break
        parent = path[level]
        c = cslot_t[parent]
        if c != _NONE:
            _read_cached(c, cbox_t, spid_g, offset_m, arena_m, lo, hi, dim)
        else:
            sibling = right_t[parent] if left_t[parent] == cur else left_t[parent]
            _grow_subtree(sibling, left_t, right_t, cslot_t, cbox_t, spid_g, offset_m,
                          arena_m, lo, hi, stack, dim)
        cur = parent
        level -= 1
    node = free_head[m, t]
    free_head[m, t] = left_t[node]
    cut_dim_t[node] = saved_dim
    cut_val_t[node] = saved_val
    if q[saved_dim] <= saved_val:
        left_t[node] = new_leaf
        right_t[node] = saved_node
    else:
        left_t[node] = saved_node
        right_t[node] = new_leaf
    if saved_level < 0:
        root[m, t] = node
    else:
        parent = path[saved_level]
        if left_t[parent] == saved_node:
            left_t[parent] = node
        else:
            right_t[parent] = node
    if cmass_t.shape[0] == 0:
        return
    # Every cached ancestor of the new node gained the point.
    candidate = node
    for level in range(saved_level, -1, -1):
        a = path[level]
        c = cslot_t[a]
        if c == _NONE:
            candidate = a
            continue
        cmass_t[c] += 1
        for d in range(dim):
            if q[d] < arena_m[offset_m[spid_g[cbox_t[c, 0, d]]] + d]:
                cbox_t[c, 0, d] = slot
            if q[d] > arena_m[offset_m[spid_g[cbox_t[c, 1, d]]] + d]:
                cbox_t[c, 1, d] = slot
    # The highest uncached node on the way (the one with the most leaves) may have grown
    # into the cache.
    c = _free_entry(cmass_t)
    if c >= 0 and _count_upto(candidate, threshold, left_t, right_t, cslot_t, cmass_t,
                              stack) >= threshold:
        cslot_t[candidate] = c
        _compute_entry(c, candidate, left_t, right_t, cslot_t, cbox_t, cmass_t, spid_g,
                       offset_m, arena_m, stack, lo, hi)


@njit(cache=True)
def _delete_leaf(
    y: np.ndarray,
    slot: int,
    replacement: int,
    t: int,
    m: int,
    threshold: int,
    root: np.ndarray,
    free_head: np.ndarray,
    cut_dim_t: np.ndarray,
    cut_val_t: np.ndarray,
    left_t: np.ndarray,
    right_t: np.ndarray,
    cslot_t: np.ndarray,
    cbox_t: np.ndarray,
    cmass_t: np.ndarray,
    spid_g: np.ndarray,
    offset_m: np.ndarray,
    arena_m: np.ndarray,
    path: np.ndarray,
    stack: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
) -> None:
    """Remove sampler slot ``slot`` (point ``y``) from tree t. If ``replacement`` >= 0 other
    slots still hold the same point: the leaf stays, re-pointed if it referred to ``slot``."""
    dim = y.shape[0]
    leaf, depth = _descend(y, root[m, t], cut_dim_t, cut_val_t, left_t, right_t, path)
    if replacement >= 0:
        if leaf == -(slot + 2):
            new_code = -(replacement + 2)
            if depth == 0:
                root[m, t] = new_code
            else:
                parent = path[depth - 1]
                if left_t[parent] == leaf:
                    left_t[parent] = new_code
                else:
                    right_t[parent] = new_code
            # Cached boxes naming the slot name the same point under its new slot.
            for level in range(depth):
                c = cslot_t[path[level]]
                if c != _NONE:
                    for side in range(2):
                        for d in range(dim):
                            if cbox_t[c, side, d] == slot:
                                cbox_t[c, side, d] = replacement
        return
    if depth == 0:
        root[m, t] = -1
        return
    parent = path[depth - 1]
    sibling = right_t[parent] if left_t[parent] == leaf else left_t[parent]
    if depth == 1:
        root[m, t] = sibling
    else:
        grand = path[depth - 2]
        if left_t[grand] == parent:
            left_t[grand] = sibling
        else:
            right_t[grand] = sibling
    left_t[parent] = free_head[m, t]
    free_head[m, t] = parent
    c = cslot_t[parent]
    if c != _NONE:
        cslot_t[parent] = _NONE
        cmass_t[c] = 0
    # Cached ancestors lost a leaf: leave the cache when small, else recompute the box if
    # the deleted slot was one of its extremes (deepest first: parents build on children).
    keep_above = threshold - threshold // 4
    for level in range(depth - 2, -1, -1):
        a = path[level]
        c = cslot_t[a]
        if c == _NONE:
            continue
        cmass_t[c] -= 1
        if cmass_t[c] < keep_above:
            cslot_t[a] = _NONE
            cmass_t[c] = 0
            continue
        named = False
        for side in range(2):
            for d in range(dim):
                if cbox_t[c, side, d] == slot:
                    named = True
        if named:
            _compute_entry(c, a, left_t, right_t, cslot_t, cbox_t, cmass_t, spid_g, offset_m,
                           arena_m, stack, lo, hi)


@njit(cache=True)
def compact_arena(m: int, arena: np.ndarray, offset: np.ndarray, refcnt: np.ndarray,
                  meta: np.ndarray, dim: int) -> None:
    """Move live points to the front of model m's arena, keeping shared shingle overlaps."""
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


@njit(cache=True)
def _store_point(q: np.ndarray, shift: int, m: int, arena: np.ndarray, offset: np.ndarray,
                 refcnt: np.ndarray, meta: np.ndarray) -> int:
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
            compact_arena(m, arena, offset, refcnt, meta, dim)
            end = meta[m, META_ARENA_END]
        start = end
        for j in range(dim):
            arena[m, start + j] = q[j]
        meta[m, META_ARENA_END] = end + dim
    offset[m, pid] = start
    meta[m, META_LAST_PID] = pid
    meta[m, META_LAST_SEQ] = meta[m, META_SEQ]
    return pid


@njit(cache=True)
def _release_point(pid: int, m: int, offset: np.ndarray, refcnt: np.ndarray,
                   meta: np.ndarray) -> None:
    refcnt[m, pid] -= 1
    if refcnt[m, pid] == 0:
        offset[m, pid] = meta[m, META_FREE_PID]
        meta[m, META_FREE_PID] = pid
        meta[m, META_NPOINTS] -= 1
        if meta[m, META_LAST_PID] == pid:
            meta[m, META_LAST_PID] = -1


@njit(cache=True)
def _heaviest(weight_g: np.ndarray, size: int) -> int:
    best = 0
    for s in range(1, size):
        if weight_g[s] > weight_g[best]:
            best = s
    return best


@njit(cache=True)
def _learn(
    q: np.ndarray,
    shift: int,
    m: int,
    decay: float,
    meta: np.ndarray,
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
    threshold: int,
    arena: np.ndarray,
    offset: np.ndarray,
    refcnt: np.ndarray,
    path: np.ndarray,
    stack: np.ndarray,
    lo: np.ndarray,
    hi: np.ndarray,
    ybuf: np.ndarray,
) -> None:
    """Offer the shingled point ``q`` to every sampler of model m and update its trees."""
    groups = weight.shape[1]
    capacity = weight.shape[2]
    trees = root.shape[1]
    per_group = trees // groups
    dim = q.shape[0]
    seq = meta[m, META_SEQ]
    if (seq - meta[m, META_WBASE]) * decay > _WEIGHT_RENORM:
        delta = np.float32((seq - meta[m, META_WBASE]) * decay)
        for g in range(groups):
            for s in range(ssize[m, g]):
                weight[m, g, s] += delta
        meta[m, META_WBASE] = seq
    base = -(seq - meta[m, META_WBASE]) * decay
    new_pid = -1
    arena_m = arena[m]
    offset_m = offset[m]
    for g in range(groups):
        size = ssize[m, g]
        w = np.float32(base + np.log(-np.log(_uniform(meta, m))))
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
        top = heavy[m, g]
        if not initial and (size == 0 or w >= weight[m, g, top]):
            continue
        spid_g = spid[m, g]
        t0 = g * per_group
        if initial:
            slot = size
            ssize[m, g] = size + 1
        else:
            # Evict the heaviest (oldest-weighted) slot from every tree of the group.
            slot = top
            old_pid = spid_g[slot]
            replacement = -1
            for s in range(size):
                if s != slot and spid_g[s] == old_pid:
                    replacement = s
                    break
            old_off = offset_m[old_pid]
            for d in range(dim):
                ybuf[d] = arena_m[old_off + d]
            for t in range(t0, t0 + per_group):
                _delete_leaf(ybuf, slot, replacement, t, m, threshold, root, free_head,
                             cut_dim[m, t], cut_val[m, t], left[m, t], right[m, t],
                             cslot[m, t], cbox[m, t], cmass[m, t], spid_g, offset_m, arena_m,
                             path, stack, lo, hi)
            spid_g[slot] = -1
            _release_point(old_pid, m, offset, refcnt, meta)
        # Duplicate of a point already in this group's sample? (All its trees agree.)
        dup_pid = -1
        r = root[m, t0]
        if r != -1:
            leaf, _ = _descend(q, r, cut_dim[m, t0], cut_val[m, t0], left[m, t0], right[m, t0],
                               path)
            lp = spid_g[-leaf - 2]
            loff = offset_m[lp]
            dup_pid = lp
            for d in range(dim):
                if arena_m[loff + d] != q[d]:
                    dup_pid = -1
                    break
        if dup_pid >= 0:
            pid = dup_pid
        else:
            if new_pid < 0:
                new_pid = _store_point(q, shift, m, arena, offset, refcnt, meta)
            pid = new_pid
        spid_g[slot] = pid
        weight[m, g, slot] = w
        heavy[m, g] = _heaviest(weight[m, g], ssize[m, g])
        refcnt[m, pid] += 1
        if dup_pid < 0:
            for t in range(t0, t0 + per_group):
                _insert_leaf(q, slot, t, m, threshold, root, free_head, cut_dim[m, t],
                             cut_val[m, t], left[m, t], right[m, t], cslot[m, t], cbox[m, t],
                             cmass[m, t], spid_g, offset_m, arena_m, meta, path, stack, lo, hi)
    meta[m, META_SEQ] = seq + 1


@njit(cache=True)
def _stream_in(cut_dim_m: np.ndarray, cut_val_m: np.ndarray, left_m: np.ndarray,
               right_m: np.ndarray, cslot_m: np.ndarray, cbox_m: np.ndarray,
               arena_m: np.ndarray, end: int) -> float:
    """Read one value per cache line of model m's trees, boxes and points, in order.

    Scoring visits these in pointer-chasing order; with thousands of models they are not in
    cache, and a sequential sweep first lets the hardware prefetcher stream them in (it
    costs a fraction of the misses it saves). Returns a value so the reads stay."""
    acc = 0.0
    flat = cut_val_m.reshape(-1)
    for k in range(0, flat.shape[0], 16):
        acc += flat[k]
    fb = cbox_m.reshape(-1)
    for k in range(0, fb.shape[0], 64):
        acc += fb[k]
    fs = cslot_m.reshape(-1)
    for k in range(0, fs.shape[0], 64):
        acc += fs[k]
    for k in range(0, end, 16):
        acc += arena_m[k]
    fl = left_m.reshape(-1)
    fr = right_m.reshape(-1)
    for k in range(0, fl.shape[0], 32):
        acc += fl[k] + fr[k]
    fd = cut_dim_m.reshape(-1)
    for k in range(0, fd.shape[0], 64):
        acc += fd[k]
    return acc


@njit(cache=True)
def _score_forest(
    q: np.ndarray, m: int, attribute: bool, root: np.ndarray, cut_dim: np.ndarray,
    cut_val: np.ndarray, left: np.ndarray, right: np.ndarray, cslot: np.ndarray,
    cbox: np.ndarray, spid: np.ndarray, ssize: np.ndarray, offset: np.ndarray,
    arena: np.ndarray, path: np.ndarray, stack: np.ndarray, lo: np.ndarray, hi: np.ndarray,
    ghigh: np.ndarray, glow: np.ndarray, vhigh: np.ndarray, vlow: np.ndarray,
    high_i: np.ndarray, low_i: np.ndarray,
) -> float:
    """Model m's score of ``q`` (mean over trees); with ``attribute`` also its DiVector in
    ``high_i``/``low_i`` (mean over trees, summing to the score)."""
    groups = spid.shape[1]
    trees = root.shape[1]
    per_group = trees // groups
    dim = q.shape[0]
    total = 0.0
    for g in range(groups):
        size = ssize[m, g]
        if size == 0:
            continue
        norm = np.log2(size + 1.0)
        spid_g = spid[m, g]
        ghigh[:] = 0.0
        glow[:] = 0.0
        group_total = 0.0
        for t in range(g * per_group, (g + 1) * per_group):
            group_total += _score_tree(
                q, root[m, t], cut_dim[m, t], cut_val[m, t], left[m, t], right[m, t],
                cslot[m, t], cbox[m, t], spid_g, size, offset[m], arena[m], path, stack, lo, hi,
                ghigh, glow, vhigh, vlow, attribute,
            )
        total += group_total * norm
        if attribute:
            for d in range(dim):
                high_i[d] += ghigh[d] * norm / trees
                low_i[d] += glow[d] * norm / trees
    return total / trees


@njit(cache=True)
def advance(
    ids: np.ndarray,
    points: np.ndarray,
    learn: bool,
    attribute_above: np.ndarray,
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
    refcnt: np.ndarray,
    scores: np.ndarray,
    high: np.ndarray,
    low: np.ndarray,
) -> float:
    """Score each row's shingled point against its model (and learn it if ``learn``).

    ``high``/``low`` receive the forest's DiVector (averaged over trees, over the shingled
    dimensions) for rows whose score exceeds ``attribute_above``, zeros elsewhere."""
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
    threshold = cache_threshold(capacity, cmass.shape[2])
    vhigh = np.empty(dim)
    vlow = np.empty(dim)
    ghigh = np.empty(dim)
    glow = np.empty(dim)
    sink = 0.0
    for i in range(n):
        m = ids[i]
        for d in range(dim - dims):
            q[d] = shingle_buf[m, d + dims]
        for d in range(dims):
            q[dim - dims + d] = points[i, d]
        steps = meta[m, META_STEPS]
        scores[i] = 0.0
        for d in range(dim):
            high[i, d] = 0.0
            low[i, d] = 0.0
        full = steps + 1 >= shingle
        if full and meta[m, META_SEQ] >= output_after and meta[m, META_SEQ] > 0:
            sink += _stream_in(cut_dim[m], cut_val[m], left[m], right[m], cslot[m], cbox[m],
                               arena[m], meta[m, META_ARENA_END])
            # Score first without attribution; only a row above its limit (an anomaly,
            # rare) takes the second pass that also fills the DiVector.
            scores[i] = _score_forest(q, m, False, root, cut_dim, cut_val, left, right, cslot,
                                      cbox, spid, ssize, offset, arena, path, stack, lo, hi,
                                      ghigh, glow, vhigh, vlow, high[i], low[i])
            if scores[i] > attribute_above[i]:
                _score_forest(q, m, True, root, cut_dim, cut_val, left, right, cslot, cbox,
                              spid, ssize, offset, arena, path, stack, lo, hi, ghigh, glow,
                              vhigh, vlow, high[i], low[i])
        if learn:
            for d in range(dim):
                shingle_buf[m, d] = q[d]
            meta[m, META_STEPS] = steps + 1
            if full:
                _learn(q, dims, m, decay, meta, weight, spid, ssize, heavy, root, free_head,
                       cut_dim, cut_val, left, right, cslot, cbox, cmass, threshold, arena,
                       offset, refcnt, path, stack, lo, hi, ybuf)
    return sink


@njit(cache=True)
def rebuild_boxes(m: int, root: np.ndarray, left: np.ndarray, right: np.ndarray,
                  cslot: np.ndarray, cbox: np.ndarray, cmass: np.ndarray, spid: np.ndarray,
                  offset: np.ndarray, arena: np.ndarray) -> None:
    """Refill model m's box cache (derived state: not checkpointed)."""
    trees = root.shape[1]
    per_group = trees // spid.shape[1]
    capacity = spid.shape[2]
    dim = cbox.shape[4]
    threshold = cache_threshold(capacity, cmass.shape[2])
    stack = np.empty(2 * capacity + 4, dtype=np.int64)
    lo = np.empty(dim, dtype=np.float32)
    hi = np.empty(dim, dtype=np.float32)
    for t in range(trees):
        rebuild_tree_cache(root[m, t], left[m, t], right[m, t], cslot[m, t], cbox[m, t],
                           cmass[m, t], spid[m, t // per_group], offset[m], arena[m],
                           threshold, stack, lo, hi)

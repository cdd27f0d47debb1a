"""Job peers: a GPU judged against the other GPUs of its job, and a job's start or end taken
as a known change of regime.

Why. The GPUs of a data-parallel job run the same steps in lock step, so they are each
other's best yardstick; the GPUs of a node are not, once a node runs several jobs (one GPU of
each of eight multi-node jobs, or a notebook beside a fine-tune): their utilisation differs
by job and by phase. Two uses:

- **Straggler against its job** (``rule:job_straggler``, warning): a GPU whose utilisation
  stays at ``below_ratio`` or less of the median of its job's GPUs (itself included, at least
  ``MIN_GROUP`` of them reporting in the step, the median busy: ``busy`` or more), for
  ``after_s``. A rank starved by its input pipeline, its host or a slow link computes less
  while its peers spin in the collective (NCCL kernels count as utilisation), so it stands out
  below its job whatever the other jobs of its node do. It resolves ``hold_s`` after the
  condition last held. (A GPU that is slow itself, clock held low with no reason, is the
  ``clock_deficit`` rule's: the driver's clock says it whatever the peers.)
- **Regime change**: a GPU whose job attached or detached, or whose job gained or lost a
  GPU (ranks start and stop seconds apart), within ``settle_s`` is settling: its forest
  anomalies do not count (the fact the node veto in ``detector.shard`` guesses from power
  swings, known here from the attribution events) and the straggler test skips it.

Across shards. The detector is sharded by samples partition, which holds whole racks; a job
may span racks of other partitions, judged by other shards, perhaps on other instances. The
peers here are the job's GPUs *of this shard*. That is correct, not only cheaper: the ranks of
a data-parallel job run at one utilisation, so the median of any three or more of them
estimates the job's; a GPU with fewer than ``MIN_GROUP`` job GPUs in its shard is not judged
by job peers at all (no guess) and keeps the node-peer rules. The alternative, the job
rollups of the aggregator, was rejected: they are computed at query time from the store and
published on no topic, at 10 s windows and later than the samples, and they include the
straggler itself; exchanging per-job medians between shards through a topic would cover jobs
spread one GPU per partition, at the price of a second input whose lag the detector would
wait on. Schedulers place multi-node jobs on neighbouring nodes (topology-aware placement,
as the synthetic fleet's scheduler does), so most of a job's GPUs share racks.

Membership comes from the service's workload maps (``detector.workloads``, folded from the
``attribution`` events): :meth:`JobPeers.sync` copies each of the shard's GPUs' newest
attachment when the maps changed. The arrays here are checkpointed with the shard
(``detector.checkpoint``), so after a restart a job's GPUs are still its peers and a
straggler's hold time and open alert carry on, even before the events partition that holds
the job's start is restored.

Columnar: one sort of the step's GPUs by job and a grouped median per step; nothing runs while
no GPU of the shard has a job.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from detector.features import group_median, held_since
from detector.state_arrays import grow_rows
from schemas.attribution import Attachment

__all__ = ["MIN_GROUP", "NO_END", "SOURCE", "JobPeerParams", "JobPeers", "peer_ratio"]

MIN_GROUP: Final = 4
"""GPUs of a group reporting in a step (the judged one included) for its median to judge: with
three others, one straggler cannot move the median of the rest."""
NO_END: Final = np.iinfo(np.int64).max
"""``to_ms`` of an attachment still open."""
SOURCE: Final = "rule:job_straggler"


@dataclass(frozen=True, slots=True)
class JobPeerParams:
    enabled: bool = True
    below_ratio: float = 0.7
    busy: float = 0.5
    after_s: float = 60.0
    settle_s: float = 120.0
    hold_s: float = 30.0
    floor: float = 0.0
    """The GPU's own utilisation must be at least this to be judged (0: a rank stalled at
    0 % in a busy job is judged too)."""


def peer_ratio(util: npt.NDArray[np.float64], groups: npt.NDArray[np.int64], busy: float,
               min_group: int = MIN_GROUP) -> npt.NDArray[np.float64]:
    """Each GPU's utilisation over its group's median (itself included), NaN where it has no
    group (< 0), no reading, fewer than ``min_group`` readings in its group, or the median
    is below ``busy`` (an idle job has no pace to fall behind)."""
    out = np.full(len(util), np.nan)
    sel = np.flatnonzero((groups >= 0) & np.isfinite(util))
    if sel.size == 0:
        return out
    order = sel[np.argsort(groups[sel], kind="stable")]
    g = groups[order]
    med = group_median(util[order], g)
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    counts = np.diff(np.r_[starts, len(g)])
    size = np.repeat(counts, counts)
    ok = (size >= min_group) & (med >= busy)
    out[order] = np.where(ok, util[order] / np.where(ok, med, 1.0), np.nan)
    return out


class JobPeers:
    """Per GPU model id of one shard: its newest job attachment and the straggler test's
    state. Job names are interned in ``names`` (index = job id)."""

    ARRAYS: Final = ("job_of", "from_ms", "to_ms", "since_ms", "last_ms", "open")

    def __init__(self, params: JobPeerParams) -> None:
        self.params = params
        self.names: list[str] = []
        self.name_ids: dict[str, int] = {}
        self.job_of = np.zeros(0, dtype=np.int64)
        """Job of the GPU's newest attachment (-1: none) ..."""
        self.from_ms = np.zeros(0, dtype=np.int64)
        self.to_ms = np.zeros(0, dtype=np.int64)
        """... over ``[from_ms, to_ms)`` (``NO_END`` while attached)."""
        self.job_change_ms = np.zeros(0, dtype=np.int64)
        """Per job: its newest attach or detach of any GPU of this shard."""
        self.since_ms = np.zeros(0, dtype=np.int64)
        """Since when the GPU has run below its job (0: it does not)."""
        self.last_ms = np.zeros(0, dtype=np.int64)
        """When the straggler condition last held."""
        self.open = np.zeros(0, dtype=bool)
        self.synced: tuple[int, int] = (-1, -1)
        """(workload maps version, GPUs) of the last :meth:`sync`."""

    def ensure(self, n: int) -> None:
        grow_rows(self, self.ARRAYS, n, {"job_of": -1})

    @property
    def active(self) -> bool:
        """Whether any GPU of the shard was ever attached to a job (else nothing runs)."""
        return bool(self.names) and self.params.enabled

    # -- membership -------------------------------------------------------------------

    def attach(self, gid: int, att: Attachment) -> None:
        """Set GPU ``gid``'s newest attachment (an ended one detaches it at ``to_ms``)."""
        j = self.name_ids.get(att.workload)
        if j is None:
            j = self.name_ids[att.workload] = len(self.names)
            self.names.append(att.workload)
            self.job_change_ms = np.concatenate([self.job_change_ms, np.zeros(1, np.int64)])
        end = NO_END if att.to_ms is None else att.to_ms
        self.job_of[gid], self.from_ms[gid], self.to_ms[gid] = j, att.from_ms, end
        change = att.from_ms if att.to_ms is None else max(att.from_ms, att.to_ms)
        self.job_change_ms[j] = max(int(self.job_change_ms[j]), change)

    def sync(self, paths: Sequence[str], spans: Callable[[str], Sequence[Attachment]],
             version: int) -> None:
        """Take each GPU's newest attachment from the workload maps (``spans(path)``, oldest
        first) when they changed since the last sync or GPUs were added; GPUs the maps know
        nothing of keep what they had (a checkpoint's, or a map on another instance's)."""
        if self.synced == (version, len(paths)):
            return
        self.ensure(len(paths))
        for gid, path in enumerate(paths):
            got = spans(path)
            if got:
                self.attach(gid, got[-1])
                if len(got) > 1:  # the one before ended: a change of its job too
                    self._note_change(got[-2])
        self.synced = (version, len(paths))

    def _note_change(self, att: Attachment) -> None:
        j = self.name_ids.get(att.workload)
        if j is not None and att.to_ms is not None:
            self.job_change_ms[j] = max(int(self.job_change_ms[j]), att.to_ms)

    def member(self, ids: npt.NDArray[np.int64], ts: int) -> npt.NDArray[np.int64]:
        """Job of each GPU at ``ts`` (-1: none)."""
        on = (self.from_ms[ids] <= ts) & (ts < self.to_ms[ids])
        return np.where(on, self.job_of[ids], -1)

    def settling(self, ids: npt.NDArray[np.int64], ts: int) -> npt.NDArray[np.bool_]:
        """GPUs whose job attached or detached, or whose job changed its GPUs, within
        ``settle_s`` of ``ts``: a known change of regime."""
        if not self.active:
            return np.zeros(len(ids), dtype=bool)
        w = int(self.params.settle_s * 1000)
        own = (np.abs(ts - self.from_ms[ids]) < w) | (np.abs(ts - self.to_ms[ids]) < w)
        job = self.job_of[ids]
        known = job >= 0
        change = self.job_change_ms[np.where(known, job, 0)] if len(self.names) else 0
        return np.asarray(known & (own | (np.abs(ts - change) < w)))

    # -- the straggler test -----------------------------------------------------------

    def step(self, ids: npt.NDArray[np.int64], util: npt.NDArray[np.float64], ts: int
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """One model step of GPUs ``ids`` against their job peers of this step:
        (rows opened, rows resolved, each row's ratio to its job's median)."""
        return self.judge(ids, util, self.member(ids, ts), self.settling(ids, ts), ts)

    def judge(self, ids: npt.NDArray[np.int64], util: npt.NDArray[np.float64],
              groups: npt.NDArray[np.int64], settling: npt.NDArray[np.bool_], ts: int
              ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.float64]]:
        """The test against any peer groups (the benchmark passes nodes to compare)."""
        ratio = peer_ratio(util, groups, self.params.busy)
        opened, resolved = self.hold(ids, ratio, util, settling, ts)
        return opened, resolved, ratio

    def hold(self, ids: npt.NDArray[np.int64], ratio: npt.NDArray[np.float64],
             util: npt.NDArray[np.float64], settling: npt.NDArray[np.bool_], ts: int
             ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Advance the hold and the open alerts on this step's ratios (rows opened,
        resolved)."""
        p = self.params
        low = (ratio <= p.below_ratio) & (util >= p.floor) & ~settling
        since = held_since(self.since_ms[ids], low, ts)
        self.since_ms[ids] = since
        cond = low & (ts - since >= p.after_s * 1000)
        self.last_ms[ids] = np.where(cond, ts, self.last_ms[ids])
        was = self.open[ids]
        opens = cond & ~was
        resolves = was & ~cond & (ts - self.last_ms[ids] >= p.hold_s * 1000)
        self.open[ids] = (was & ~resolves) | opens
        return np.flatnonzero(opens), np.flatnonzero(resolves)

    def job_name(self, gid: int) -> str | None:
        j = int(self.job_of[gid])
        return self.names[j] if j >= 0 else None

    # -- checkpoint -------------------------------------------------------------------

    def state_arrays(self) -> dict[str, npt.NDArray[np.generic]]:
        out: dict[str, npt.NDArray[np.generic]] = {
            f"jobs.{k}": getattr(self, k).copy() for k in self.ARRAYS}
        out["jobs.names"] = np.array(self.names, dtype=np.str_)
        out["jobs.job_change_ms"] = self.job_change_ms.copy()
        return out

    def load_arrays(self, arrays: dict[str, npt.NDArray[np.generic]], n: int) -> None:
        """Restore for ``n`` GPUs; a checkpoint written before job peers starts with none."""
        self.__init__(self.params)  # type: ignore[misc]
        self.ensure(n)
        if "jobs.job_of" not in arrays:
            return
        for k in self.ARRAYS:
            cur = getattr(self, k)
            setattr(self, k, np.array(arrays[f"jobs.{k}"], dtype=cur.dtype))
        self.names = [str(s) for s in arrays["jobs.names"].tolist()]
        self.name_ids = {s: i for i, s in enumerate(self.names)}
        self.job_change_ms = np.array(arrays["jobs.job_change_ms"], dtype=np.int64)

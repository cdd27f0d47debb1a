"""One shard of the detector: every model, threshold and rule state of one samples partition.

Samples are keyed by rack, so a partition holds whole racks; a shard is the unit that moves
between detector instances on a rebalance and the unit of a checkpoint. Within a shard,
GPUs and racks get dense model ids in the order they are first seen.

``process_blocks`` takes blocks of ticks for many GPUs at once (the frames of many nodes in
the service, every GPU of the fleet in the benchmark) and runs, as vector operations over
the GPUs: the health rules on every tick; then, once a GPU's ticks of a step of
``model.step_s`` are in (``detector.step_fold``), features -> forest (score, then learn) ->
adaptive threshold -> hysteresis and the rack windows -> rack forest, once per step.
It returns alert transitions as :class:`schemas.records.AlertRecord`.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from detector.config import DetectorConfig
from detector.engines import EngineConfig, ScoreBatch, make_engine
from detector.episodes import EpisodeParams
from detector.features import COL, COUNTER_COLS, FEATURES, GATHERED, FeatureState
from detector.job_peers import SOURCE as JOB_STRAGGLER
from detector.job_peers import JobPeers
from detector.model_bank import ModelBank
from detector.rack_heat import RackHeat
from detector.rack_windows import RACK_FEATURES, Closed, RackWindows
from detector.rules import RuleBook
from detector.step_fold import GATHERED_FOLD, FoldedSteps, StepFold
from detector.thresholds import ThresholdParams
from schemas.records import AlertRecord, AlertState, Attribution, Severity

__all__ = ["DetectorShard", "StepTrace", "TickBlock", "alert_id"]

_UTIL_VS_NODE = next(i for i, f in enumerate(FEATURES) if f.name == "util_vs_node")
_POWER_VS_NODE = next(i for i, f in enumerate(FEATURES) if f.name == "power_vs_node")
_ELEVATED = 0.8
"""A score at this fraction of its threshold counts as a peer moving too (node veto)."""
RULE_CLOCK_MS = 100
"""The rules read time in steps of this: ticks of different nodes taken within the same
100 ms (agents' clocks differ by milliseconds) are judged in one vector call instead of one
call each. Every tick is still judged on its own; only its time is floored (rule holds and
windows are tens of seconds; a rule alert's start is exact to 0.1 s)."""


def alert_id(entity: str, source: str, started_ms: int) -> str:
    """Deterministic, so a replay after a crash recreates the same id."""
    digest = hashlib.blake2b(f"{entity}|{source}|{started_ms}".encode(), digest_size=10)
    return digest.hexdigest()


@dataclass(slots=True)
class StepTrace:
    """Per-step outputs for offline use (backtest, benchmark): one row per GPU and step."""

    scores: list[npt.NDArray[np.float64]] = field(default_factory=list)
    thresholds: list[npt.NDArray[np.float64]] = field(default_factory=list)
    open: list[npt.NDArray[np.bool_]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class TickBlock:
    """Ticks ``ts_ms`` (T,) of gathered metrics (T, G, K) for GPUs ``ids`` of nodes ``nodes``
    (one frame in the service; every GPU of the fleet in the benchmark)."""

    ids: npt.NDArray[np.int64]
    nodes: npt.NDArray[np.int64]
    ts_ms: npt.NDArray[np.int64]
    gathered: npt.NDArray[np.float64]


class DetectorShard:
    """All detector state for one partition's racks."""

    def __init__(self, config: DetectorConfig, engine_name: str | None = None) -> None:
        from detector.engines import DEFAULT_ENGINE

        self.config = config
        mc = config.model
        self.engine_name = engine_name or mc.engine or DEFAULT_ENGINE
        self.engine_config = mc.engine_config(len(FEATURES))
        self.gpu_bank = ModelBank(make_engine(self.engine_name, self.engine_config),
                                  mc.threshold_params(), config.alerts.episode_params())
        self.features = FeatureState()
        self.fold = StepFold(mc.step_s, [GATHERED_FOLD[m] for m in GATHERED])
        self.tick_counters = np.zeros((0, len(COUNTER_COLS)))
        """Each GPU's counters at its previous tick (the rules' per-tick increases)."""
        self.node_of = np.zeros(0, dtype=np.int64)
        """Node group id of each GPU, as the latest block said."""
        self.gpu_steps = 0
        """GPU model steps run (forest score + learn)."""
        self.skipped_steps = 0
        """GPU model steps shed because the detector was behind."""
        self.admitted = 0
        """GPU forests that left their cold start (built their trees) here."""
        self.rules = RuleBook(config.rules.params())
        self.jobs = JobPeers(config.job_peers.params())
        """Each GPU's job: its peers, and its starts and ends (``detector.job_peers``)."""
        rc = config.rack
        self.rack_engine_config = EngineConfig(
            dims=len(RACK_FEATURES), shingle=rc.shingle, trees=rc.trees,
            sample_size=rc.sample_size, seed=mc.seed + 1,
        )
        self.rack_bank = ModelBank(
            make_engine(self.engine_name, self.rack_engine_config),
            ThresholdParams(z=rc.z, floor=rc.floor, horizon=mc.horizon, warmup=rc.warmup,
                            std_floor=mc.std_floor),
            EpisodeParams(rc.open_after, 4, rc.resolve_after, config.alerts.cooldown_s))
        self.rack_windows = RackWindows(rc.window_s)
        self.rack_heat = RackHeat(rc.heat_excess_c, rc.heat_after_s, rc.window_s,
                                  rc.heat_baseline_s)
        # Registry: entity paths <-> dense ids.
        self.gpu_ids: dict[str, int] = {}
        self.gpu_paths: list[str] = []
        self.gpu_uuid: list[str] = []
        self.rack_ids: dict[str, int] = {}
        self.rack_paths: list[str] = []
        self.rack_of = np.zeros(0, dtype=np.int64)
        self.node_ids: dict[str, int] = {}
        self.last_anomalous_ms = np.zeros(0, dtype=np.int64)
        """Last step each GPU scored elevated (for the node veto)."""
        self.node_last_ts: dict[str, int] = {}
        """Newest tick processed per node path: replayed frames are not learned twice."""
        # Open alerts by (entity, source): what a resolution must pair with.
        self.open_alerts: dict[tuple[str, str], AlertRecord] = {}
        self.last_ts_ms = 0
        self.steps = 0
        self._deferring = False

    # -- registry ---------------------------------------------------------------------

    def register(self, paths: list[str], rack_paths: list[str], node_paths: list[str],
                 uuids: list[str] | None = None) -> tuple[npt.NDArray[np.int64],
                                                          npt.NDArray[np.int64]]:
        """Dense ids for GPU entity paths (new ones are created), and node group ids."""
        ids = np.empty(len(paths), dtype=np.int64)
        nodes = np.empty(len(paths), dtype=np.int64)
        new_racks: list[int] = []
        for i, path in enumerate(paths):
            gid = self.gpu_ids.get(path)
            if gid is None:
                gid = len(self.gpu_paths)
                self.gpu_ids[path] = gid
                self.gpu_paths.append(path)
                self.gpu_uuid.append(uuids[i] if uuids else "")
                rid = self.rack_ids.get(rack_paths[i])
                if rid is None:
                    rid = len(self.rack_paths)
                    self.rack_ids[rack_paths[i]] = rid
                    self.rack_paths.append(rack_paths[i])
                new_racks.append(rid)
            ids[i] = gid
            nodes[i] = self.node_ids.setdefault(node_paths[i], len(self.node_ids))
        if new_racks:
            self.rack_of = np.concatenate([self.rack_of, np.array(new_racks, dtype=np.int64)])
            if not self._deferring:
                self._grow()
        return ids, nodes

    @contextlib.contextmanager
    def growing_once(self) -> Iterator[None]:
        """Registrations inside grow the per-GPU state once, on leaving: a chunk of a fleet's
        first frames registers thousands of GPUs a node at a time, and every growth copies
        or reallocates every component's arrays (about 256 KB a GPU of forest), so growing
        per node cost the detector half of its first minute at 31,000 GPUs. Nothing may read
        the new GPUs' state before leaving."""
        self._deferring = True
        try:
            yield
        finally:
            self._deferring = False
            if len(self.node_of) < len(self.gpu_paths):  # GPUs registered, not grown yet
                self._grow()

    def _grow(self) -> None:
        n = len(self.gpu_paths)
        self.gpu_bank.ensure(n)
        self.last_anomalous_ms = np.concatenate(
            [self.last_anomalous_ms, np.zeros(n - len(self.last_anomalous_ms), dtype=np.int64)])
        self.features.ensure(n)
        self.fold.ensure(n)
        self.tick_counters = np.concatenate(
            [self.tick_counters, np.full((n - len(self.tick_counters), len(COUNTER_COLS)),
                                         np.nan)])
        self.node_of = np.concatenate([self.node_of,
                                       np.zeros(n - len(self.node_of), dtype=np.int64)])
        self.rules.ensure(n)
        self.jobs.ensure(n)
        r = len(self.rack_paths)
        self.rack_bank.ensure(r)
        self.rack_windows.ensure(r)
        self.rack_windows.ensure_gpus(n)
        self.rack_heat.ensure(r)

    def models_warming(self) -> int:
        """GPU forests that cannot alert yet: fewer than ``model.warmup`` scored steps (the
        engine's own cold start, ``sample_size / 4`` points, scores nothing, so it counts
        here too). Past that cold start a forest costs the most per step (its reservoirs
        take most points while they fill), so a fleet's first quarter hour, and any load
        test of a few minutes, runs dearer than a warm one."""
        if not self.config.model.enabled:
            return 0
        return self.gpu_bank.warming(len(self.gpu_paths))

    def models_held(self) -> int:
        """GPU forests past their cold start held in it because the detector was behind
        (``DetectorConfig.admit_within_s``): they sample on, unscored."""
        return self.gpu_bank.held(len(self.gpu_paths)) if self.config.model.enabled else 0

    # -- processing -------------------------------------------------------------------

    def process(
        self,
        ids: npt.NDArray[np.int64],
        nodes: npt.NDArray[np.int64],
        ts_ms: npt.NDArray[np.int64],
        gathered: npt.NDArray[np.float64],
        trace: StepTrace | None = None,
        shed_before_ms: int | None = None,
    ) -> list[AlertRecord]:
        """Run ticks ``ts_ms`` (T,) of gathered metrics (T, G, K) for GPUs ``ids``."""
        return self.process_blocks([TickBlock(ids, nodes, np.asarray(ts_ms), gathered)],
                                   trace, shed_before_ms)

    def process_blocks(self, blocks: list[TickBlock], trace: StepTrace | None = None,
                       shed_before_ms: int | None = None, admit_at_most: int | None = None
                       ) -> list[AlertRecord]:
        """Run several blocks of ticks (frames of many nodes) together.

        The health rules see every tick, rows with the same timestamp in one call; the
        ticks are folded into steps of ``model.step_s`` per GPU (:mod:`detector.step_fold`)
        and the models then run once per step stamp over every GPU whose step completed.
        So the cost of the models follows GPUs, not ticks, and a batch of many frames costs
        a few vector calls, not a few per frame. Steps stamped before ``shed_before_ms``
        are shed (the detector is behind, see ``DetectorConfig.shed_after_s``): their
        features are still computed (the per-GPU state stays continuous) but the forests,
        thresholds and hysteresis skip them; ``skipped_steps`` counts them. At most
        ``admit_at_most`` (None: every one) GPU forests whose cold start ends in these steps
        leave it; the others stay in it, sampling, unscored (``admitted`` counts those that
        left; see ``DetectorConfig.admit_per_s``).

        ``trace`` gets one entry per step stamp over the GPUs of the first block.
        Alerts come back in time order (their ``updated_ms``).
        """
        blocks = [b for b in blocks if len(b.ts_ms) and len(b.ids)]
        if not blocks:
            return []
        ids = np.concatenate([np.repeat(b.ids[None, :], len(b.ts_ms), 0).reshape(-1)
                              for b in blocks])
        ts = np.concatenate([np.repeat(np.asarray(b.ts_ms, dtype=np.int64), len(b.ids))
                             for b in blocks])
        rows = np.concatenate([b.gathered.reshape(-1, b.gathered.shape[-1]) for b in blocks])
        for b in blocks:
            self.node_of[b.ids] = b.nodes
        order = np.argsort(ts, kind="stable")  # a GPU's ticks keep their order
        ids, ts, rows = ids[order], ts[order], rows[order]
        self.last_ts_ms = max(self.last_ts_ms, int(ts[-1]))
        steps = self.fold.add(ids, ts, rows)
        # Step by step, in stamp order: the models on step S if it completed, then the rules
        # on the ticks of step S, which read the thermal models' view of the step just taken
        # (as without folding). A step's ticks all arrive in one call when frames hold whole
        # steps (5 ticks at 5 Hz, any tick at 1 Hz); ticks of a step split across calls see,
        # in the earlier call, the step before.
        tick_round = steps.tick_stamps
        round_of = np.argsort(tick_round, kind="stable")
        step_order = np.argsort(steps.stamps_ms, kind="stable")
        step_stamps = steps.stamps_ms[step_order]
        stamps = np.union1d(tick_round, step_stamps)
        tick_cut = np.searchsorted(tick_round[round_of], stamps, side="right")
        step_cut = np.searchsorted(step_stamps, stamps, side="right")
        out: list[AlertRecord] = []
        ta = sa = 0
        first = self.admitted
        for k, stamp in enumerate(stamps.tolist()):
            tb, sb = int(tick_cut[k]), int(step_cut[k])
            if sb > sa:
                left = (None if admit_at_most is None
                        else admit_at_most - (self.admitted - first))
                out.extend(self._model_step(steps, step_order[sa:sb], stamp, trace,
                                            blocks[0].ids, shed_before_ms, left))
            if tb > ta:
                sel = np.sort(round_of[ta:tb])  # time order within the step
                out.extend(self._rule_ticks(ids[sel], ts[sel], rows[sel]))
            ta, sa = tb, sb
        out.sort(key=lambda a: a.updated_ms)
        return out

    def _rule_ticks(self, ids: npt.NDArray[np.int64], ts: npt.NDArray[np.int64],
                    rows: npt.NDArray[np.float64]) -> list[AlertRecord]:
        """The health rules on every tick (rows sorted by time): one call per
        ``RULE_CLOCK_MS`` slot, and within a slot one per repeat of a GPU (sampling faster
        than the slot), so a GPU's ticks are judged one by one and in order."""
        out: list[AlertRecord] = []
        slot = ts // RULE_CLOCK_MS
        cuts = np.flatnonzero(np.diff(slot)) + 1
        for a, b in zip([0, *cuts.tolist()], [*cuts.tolist(), len(ts)], strict=True):
            now = int(slot[a]) * RULE_CLOCK_MS
            repeat = _repeat_index(ids[a:b])
            if not repeat.any():
                out.extend(self._rule_call(ids[a:b], rows[a:b], now))
                continue
            for r in range(int(repeat.max()) + 1):
                sel = a + np.flatnonzero(repeat == r)
                out.extend(self._rule_call(ids[sel], rows[sel], now))
        return out

    def _rule_call(self, gid: npt.NDArray[np.int64], row: npt.NDArray[np.float64], now: int
                   ) -> list[AlertRecord]:
        """One vector pass of the rules over distinct GPUs' ticks at rule time ``now``."""
        out: list[AlertRecord] = []
        valid: npt.NDArray[np.bool_] = np.asarray(np.isfinite(row).any(axis=1))
        inc = self._tick_increases(gid, row)
        cond, val = self.rules.conditions(gid, row, inc, valid, now,
                                          self.features.rule_context(gid, row,
                                                                     self.node_of[gid]))
        r_open, r_res = self.rules.step(gid, cond, val, valid, now)
        for r, k in r_open:
            out.append(self._open_rule_alert(int(gid[r]), k, now, row[r]))
        for r, k in r_res:
            out.append(self._resolve(self.gpu_paths[int(gid[r])],
                                     f"rule:{self.rules.rules[k].name}", now, 0.0))
        # GPUs of the same racks without a tick now: candidates for "stopped reporting".
        reporting = np.zeros(len(self.rack_paths), dtype=bool)
        reporting[self.rack_of[gid]] = True
        silent = reporting[self.rack_of]
        silent[gid] = False
        absent = np.flatnonzero(silent)
        if absent.size:
            out.extend(self._check_stale(absent, now))
        return out

    def _tick_increases(self, ids: npt.NDArray[np.int64], row: npt.NDArray[np.float64]
                        ) -> npt.NDArray[np.float64]:
        """Counter increases since each GPU's previous tick (reset or first sight: 0), for
        the rules; the features difference the folded steps themselves."""
        cur = row[:, list(COUNTER_COLS)]
        prev = self.tick_counters[ids]
        inc = cur - prev
        self.tick_counters[ids] = np.where(np.isfinite(cur), cur, prev)
        return np.where(np.isfinite(inc) & (inc > 0), inc, 0.0)

    def _model_step(self, steps: FoldedSteps, sel: npt.NDArray[np.int64], stamp: int,
                    trace: StepTrace | None, trace_ids: npt.NDArray[np.int64],
                    shed_before_ms: int | None, admit_at_most: int | None
                    ) -> list[AlertRecord]:
        """The completed steps ``sel`` (all stamped ``stamp``) through the models at once."""
        gid = steps.ids[sel]
        nodes = self.node_of[gid]
        by_node = np.argsort(nodes, kind="stable")  # node peers contiguous
        gid, nodes, rows = gid[by_node], nodes[by_node], steps.rows[sel][by_node]
        shed = shed_before_ms is not None and stamp < shed_before_ms
        return self._step(gid, nodes, stamp, rows, trace, trace_ids, shed, admit_at_most)

    def _step(
        self, ids: npt.NDArray[np.int64], nodes: npt.NDArray[np.int64], ts: int,
        row: npt.NDArray[np.float64], trace: StepTrace | None,
        trace_ids: npt.NDArray[np.int64], shed: bool, admit_at_most: int | None = None,
    ) -> list[AlertRecord]:
        """One model step (stamp ``ts``) for GPUs ``ids`` from their folded rows."""
        self.steps += 1
        out: list[AlertRecord] = []
        valid: npt.NDArray[np.bool_] = np.asarray(np.isfinite(row).any(axis=1))
        feats, _ = self.features.step(ids, row, nodes, ts)
        rack_rows = self.rack_of[ids]

        # Forest -> threshold -> hysteresis, for the GPUs that reported.
        vi = np.flatnonzero(valid)
        vids = ids[vi]
        scores = np.zeros(len(vi))
        thr = np.zeros(len(vi))
        if shed:
            self.skipped_steps += len(vi)
        elif self.config.model.enabled:
            self.gpu_steps += len(vi)
            res = self.gpu_bank.step(
                vids, feats[vi], ts,
                lambda a, b, th: self._node_veto(
                    vids, nodes[vi], feats[vi], _health_led(a, b),
                    b.scores >= _ELEVATED * th, ts) & ~self.jobs.settling(vids, ts),
                admit_at_most)
            batch, thr = res.batch, res.thresholds
            self.admitted += batch.admitted
            scores = batch.scores
            for r in res.opened:
                out.append(self._open_model_alert(int(vids[r]), ts, batch, int(r), thr[r],
                                                  row[vi[r]]))
            for r in res.resolved:
                out.append(self._resolve(self.gpu_paths[int(vids[r])], self._model_source(),
                                         ts, float(batch.scores[r])))
        if trace is not None:
            pos = np.full(len(self.gpu_paths), -1, dtype=np.int64)
            pos[trace_ids] = np.arange(len(trace_ids))
            mine = pos[vids] >= 0
            s = np.zeros(len(trace_ids))
            th = np.zeros(len(trace_ids))
            s[pos[vids[mine]]] = scores[mine]
            th[pos[vids[mine]]] = thr[mine]
            trace.scores.append(s)
            trace.thresholds.append(th)
            trace.open.append(self.gpu_bank.episodes.open[trace_ids]
                              | self.rules.open[trace_ids].any(axis=1)
                              | self.jobs.open[trace_ids])
        if self.jobs.active and len(vi) and not shed:
            out.extend(self._job_peer_step(vids, row[vi], ts))

        # Rack windows -> rack forest.
        if self.config.rack.enabled and len(vi):
            closed = self.rack_windows.add(rack_rows[vi], vids, feats[vi],
                                           self.features.last_resid[vids], ts,
                                           self.features.thermal.tau_s)
            if len(closed.racks):
                out.extend(self._rack_step(closed))
        return out

    def _node_veto(self, ids: npt.NDArray[np.int64], nodes: npt.NDArray[np.int64],
                   feats: npt.NDArray[np.float32], anomalous: npt.NDArray[np.bool_],
                   elevated: npt.NDArray[np.bool_], ts: int) -> npt.NDArray[np.bool_]:
        """A change the node's GPUs share is the workload, not a fault.

        Where at least ``node_veto`` of a node's GPUs (two or more) scored elevated (within
        ``_ELEVATED`` of their threshold) in the last ``node_window_s``, their anomalies do
        not count, except for a GPU that the peer features set apart from its node (a
        straggler makes its peers wait too, but it is the one whose utilisation or power
        differs from the node's median).
        """
        ac = self.config.alerts
        if ac.node_veto >= 1.0:
            return anomalous
        self.last_anomalous_ms[ids] = np.where(elevated, ts, self.last_anomalous_ms[ids])
        if not anomalous.any():
            return anomalous
        recent = (self.last_anomalous_ms[ids] > 0) & (
            ts - self.last_anomalous_ms[ids] <= ac.node_window_s * 1000)
        _, inv = np.unique(nodes, return_inverse=True)
        size = np.bincount(inv)
        hits = np.bincount(inv, weights=recent.astype(np.float64))
        shared = ((hits >= 2) & (hits >= ac.node_veto * size))[inv]
        apart = (np.abs(feats[:, _UTIL_VS_NODE]) >= 6.0) | (np.abs(feats[:, _POWER_VS_NODE]) >= 6.0)
        return anomalous & ~(shared & ~apart)

    def _job_peer_step(self, ids: npt.NDArray[np.int64], row: npt.NDArray[np.float64],
                       ts: int) -> list[AlertRecord]:
        """GPUs against their job's GPUs of this step (``detector.job_peers``)."""
        util = row[:, COL["utilization_ratio"]]
        opened, resolved, ratio = self.jobs.step(ids, util, ts)
        out: list[AlertRecord] = []
        below = self.config.job_peers.below_ratio
        for r in opened.tolist():
            gid = int(ids[r])
            out.append(self._fire(
                self.gpu_paths[gid], "gpu", JOB_STRAGGLER, Severity.WARNING,
                f"utilisation at {ratio[r]:.0%} of its job's GPUs (straggler?)",
                float(ratio[r]), below, ts,
                (Attribution("fleetpulse_gpu_utilization_ratio", "low", 1.0),),
                # the job and its labels are added where alerts are named (tag_alerts)
                {"uuid": self.gpu_uuid[gid], "utilization_ratio": float(util[r])}))
        for r in resolved.tolist():
            score = float(ratio[r]) if np.isfinite(ratio[r]) else 0.0
            out.append(self._resolve(self.gpu_paths[int(ids[r])], JOB_STRAGGLER, ts, score))
        return out

    def _rack_step(self, closed: Closed) -> list[AlertRecord]:
        out: list[AlertRecord] = []
        racks, means = closed.racks, closed.means
        end = closed.starts + self.rack_windows.window_ms
        res = self.rack_bank.step(racks, means, end, _rack_runs_hot)
        batch, thr, opened, resolved = res.batch, res.thresholds, res.opened, res.resolved
        src = f"model:{self.engine_name}:rack"
        for r in opened:
            path = self.rack_paths[int(racks[r])]
            attrib = self._attribution(batch, int(r), RACK_FEATURES)
            out.append(self._fire(
                path, "rack", src, self._model_severity(False),
                "rack behaves unlike its history: " + _describe(attrib),
                float(batch.scores[r]), float(thr[r]), int(end[r]), attrib,
                {"window_s": self.config.rack.window_s,
                 "means": {n: round(float(v), 3) for n, v in zip(RACK_FEATURES, means[r],
                                                                 strict=True)}}))
        for r in resolved:
            out.append(self._resolve(self.rack_paths[int(racks[r])], src, int(end[r]),
                                     float(batch.scores[r])))
        # The rack heat rule, on the same windows: the lower quartile of the judged GPUs'
        # residuals, degC.
        resid_c = closed.heat_c
        h_open, h_res = self.rack_heat.step(racks, resid_c, closed.judged, closed.lag_s)
        for r in h_open:
            path = self.rack_paths[int(racks[r])]
            out.append(self._fire(
                path, "rack", "rule:rack_heat", Severity.WARNING,
                f"three quarters of the rack's judged GPUs run {resid_c[r]:.1f} degC or more "
                "hotter than their thermal models (cooling trouble?)", float(resid_c[r]),
                self.config.rack.heat_excess_c, int(end[r]),
                (Attribution("fleetpulse_gpu_temperature_celsius", "high", 1.0),),
                {"window_s": self.config.rack.window_s, "excess_c": round(
                    float(resid_c[r]), 2)}))
        for r in h_res:
            out.append(self._resolve(self.rack_paths[int(racks[r])], "rule:rack_heat",
                                     int(end[r]), float(resid_c[r])))
        return out

    def _check_stale(self, members: npt.NDArray[np.int64], now: int) -> list[AlertRecord]:
        opened, _ = self.rules.check_stale(members, now)
        out = []
        for r, k in opened:
            gid = int(members[r])
            out.append(self._open_rule_alert(gid, k, now, None))
        return out

    # -- alert records -----------------------------------------------------------------

    def _model_source(self) -> str:
        return f"model:{self.engine_name}"

    def _model_severity(self, far_above: bool) -> Severity:
        """A forest alert's severity (``alerts.model_severity``): info, a signal that pages
        nobody, unless configured to page (then critical when far above the threshold)."""
        if self.config.alerts.model_severity == "info":
            return Severity.INFO
        return Severity.CRITICAL if far_above else Severity.WARNING

    def _attribution(self, batch: ScoreBatch, r: int, names: tuple[str, ...] | list[str]
                     ) -> tuple[Attribution, ...]:
        w = batch.attribution[r]
        total = float(w.sum())
        if total <= 0:
            return ()
        top = np.argsort(-w)[: self.config.alerts.top_metrics]
        return tuple(
            Attribution(metric=names[i], direction="high" if batch.direction[r, i] >= 0 else "low",
                        weight=round(float(w[i] / total), 4))
            for i in top if w[i] >= 0.05 * total  # a feature below 5 % explains nothing
        )

    def _open_model_alert(self, gid: int, ts: int, batch: ScoreBatch, r: int, thr: float,
                          raw: npt.NDArray[np.float64]) -> AlertRecord:
        attrib = self._attribution(batch, r, [f.metric for f in FEATURES])
        score = float(batch.scores[r])
        severity = self._model_severity(score >= 2 * thr)
        util = raw[COL["utilization_ratio"]]
        context: dict[str, Any] = {
            "uuid": self.gpu_uuid[gid],
            "utilization_state": "unknown" if not np.isfinite(util)
            else ("busy" if util >= 0.3 else "idle"),
            "features": [FEATURES[i].name for i in np.argsort(-batch.attribution[r])[:3]],
            "values": {k: float(raw[COL[k]]) for k in ("temperature_celsius",
                       "power_usage_watts", "utilization_ratio", "sm_clock_hertz")
                       if np.isfinite(raw[COL[k]])},
        }
        return self._fire(self.gpu_paths[gid], "gpu", self._model_source(), severity,
                          "GPU behaves unlike its history: " + _describe(attrib), score, thr,
                          ts, attrib, context)

    def _open_rule_alert(self, gid: int, k: int, ts: int,
                         raw: npt.NDArray[np.float64] | None) -> AlertRecord:
        rule = self.rules.rules[k]
        value = float(self.rules.value[gid, k])
        severity = rule.severity
        context: dict[str, Any] = {"uuid": self.gpu_uuid[gid], "value": value}
        summary = rule.summary
        if rule.name == "xid":
            from detector.rules import CRITICAL_XIDS

            summary = f"XID {int(value)}: {rule.summary}"
            severity = Severity.CRITICAL if int(value) in CRITICAL_XIDS else Severity.WARNING
        if raw is not None and rule.name in ("thermal_slowdown", "hw_slowdown"):
            context["temperature_celsius"] = float(raw[COL["temperature_celsius"]])
        attrib = (Attribution(rule.metric, "high", 1.0),)
        return self._fire(self.gpu_paths[gid], "gpu", f"rule:{rule.name}", severity, summary,
                          1.0, 1.0, ts, attrib, context)

    def _fire(self, entity: str, level: str, source: str, severity: Severity, summary: str,
              score: float, thr: float, ts: int, attrib: tuple[Attribution, ...],
              context: dict[str, Any]) -> AlertRecord:
        rec = AlertRecord(
            id=alert_id(entity, source, ts), entity=entity, level=level,
            state=AlertState.FIRING, severity=severity, source=source, summary=summary,
            score=round(float(score), 4), threshold=round(float(thr), 4), started_ms=int(ts),
            updated_ms=int(ts),
            attribution=attrib, context=context,
        )
        self.open_alerts[(entity, source)] = rec
        return rec

    def _resolve(self, entity: str, source: str, ts: int, score: float) -> AlertRecord:
        opened = self.open_alerts.pop((entity, source), None)
        if opened is None:  # state restored without its record: still say it resolved
            opened = AlertRecord(
                id=alert_id(entity, source, ts), entity=entity,
                level="rack" if entity.count("/") == 2 else "gpu", state=AlertState.FIRING,
                severity=Severity.WARNING, source=source, summary="", score=score,
                threshold=0.0, started_ms=ts, updated_ms=ts)
        return AlertRecord(
            id=opened.id, entity=entity, level=opened.level, state=AlertState.RESOLVED,
            severity=opened.severity, source=source, summary=opened.summary,
            score=round(float(score), 4), threshold=opened.threshold,
            started_ms=opened.started_ms, updated_ms=int(ts), attribution=opened.attribution, context=opened.context,
        )


_HEALTH = np.array([i for i, f in enumerate(FEATURES) if f.name in (
    "temp_residual", "throttle", "ecc_sbe_increase", "link_error_increase")])
"""GPU features that a healthy GPU keeps near 0 whatever it runs. The others move with
every job: temperature, power, utilisation and clock, and the peer deviations too, since a
job on part of a node or inference whose utilisation changes every second sets GPUs apart
from their node (on the zoo's tuning fleets, nearly every false forest alert named them).
Stragglers are the clock-deficit rule's, which judges by the driver's own reasons."""


def _health_led(anomalous: npt.NDArray[np.bool_], batch: ScoreBatch) -> npt.NDArray[np.bool_]:
    """A GPU anomaly counts only when health features explain at least half of it.

    A job that starts, ends or changes phase moves temperature, power, utilisation and clock
    together: the forest rightly finds such a point unusual, but it is the workload, and on
    the zoo's tuning fleets it was most of the forest's false alerts. A failing GPU shows in
    what its workload does not explain: hotter than its thermal model, throttled, erring.
    """
    return anomalous & _led_by(batch, _HEALTH, high_only=False)


def _led_by(batch: ScoreBatch, cols: npt.NDArray[np.int64], high_only: bool
            ) -> npt.NDArray[np.bool_]:
    """Rows whose attribution is at least half in ``cols`` (only where the point is above
    what the model expects, with ``high_only``); a row without attribution is led by none."""
    w = batch.attribution
    total = w.sum(axis=1)
    part = w[:, cols] * (batch.direction[:, cols] > 0) if high_only else w[:, cols]
    return np.asarray(part.sum(axis=1) >= 0.5 * np.where(total > 0, total, np.inf))


_RACK_THERMAL = np.array([RACK_FEATURES.index(n) for n in (
    "rack_temperature", "rack_temp_residual", "rack_memory_temperature", "rack_throttling")])


def _rack_runs_hot(anomalous: npt.NDArray[np.bool_], batch: ScoreBatch,
                   thr: npt.NDArray[np.float64]) -> npt.NDArray[np.bool_]:
    """A rack anomaly counts only when it says the rack runs hot.

    Cooling trouble makes a rack hotter (or throttled) for its load. A rack whose jobs ended
    together scores as unusual too, but low: utilisation, power and with them temperature
    fall. So at least half of the attribution must be thermal features above what the model
    expects; on a healthy fleet every rack alert of the forest was the other kind.
    """
    return anomalous & _led_by(batch, _RACK_THERMAL, high_only=True)


def _repeat_index(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For each row, how many earlier rows hold the same id (0 for a first occurrence)."""
    order = np.argsort(ids, kind="stable")
    ranked = ids[order]
    pos = np.arange(len(ids))
    first = np.maximum.accumulate(np.where(np.r_[True, ranked[1:] != ranked[:-1]], pos, 0))
    out = np.empty(len(ids), dtype=np.int64)
    out[order] = pos - first
    return out


def _describe(attrib: tuple[Attribution, ...]) -> str:
    if not attrib:
        return "no single metric stands out"
    return ", ".join(f"{a.metric.removeprefix('fleetpulse_gpu_')} {a.direction}" for a in attrib)

"""Stragglers against job peers beside node peers, on fleets whose nodes run several jobs.

    python -m benchmarks.detection_jobs [--tuning 1,2,3] [--heldout 11,12,13,14,15] --json

The synthetic fleet of ``agent.fleet`` schedules jobs but its load does not follow them, so
this benchmark builds its own scenario, where load follows jobs (per seed, 256 GPUs, 32
nodes of 8 in 8 racks of 4 nodes, 4 h at 1 Hz, 42.7 GPU-days):

- nodes 0-7 run whole-node jobs (8 GPUs of one node: node peers are job peers);
- on nodes 8-31, GPU k (k < 7) of 12 neighbouring nodes is one lane of multi-node jobs, one
  GPU per node (so each node holds seven different jobs), and GPU 7 runs one-GPU jobs (an
  inference server or a notebook: utilisation 5-80 % that moves every few minutes);
- jobs run 20-120 min back to back with idle gaps of 1-15 min (healthy churn); a training
  job runs at 75-98 % with eval / checkpoint phases of 30-240 s at 5-30 % every 10-30 min,
  all its GPUs together, out of phase with the other jobs; ranks start up to 30 s and stop up
  to 20 s apart, each attached (an attribution event) up to 5 s after its own start and
  detached up to 5 s after its stop, as a job-mapping poll would;
- a third of the multi-GPU jobs are pipeline-parallel: each rank is one stage, and stages
  are unequal (each computes 1 - imbalance x u of the job's profile, imbalance 5-35 % per
  job, u uniform per stage), so healthy ranks of one job differ by up to a third; false
  incidents that start on such a stage are counted apart;
- 12 stragglers per seed: one rank of a running multi-GPU job computes at 45-65 % of its
  profile (a starved rank; its peers spin in the collective and keep their utilisation)
  for 8-20 min.

Both arms run the same test (:meth:`detector.job_peers.JobPeers.judge`, the code the detector
runs each step) over the same utilisation; they differ in the peers: the GPU's job (from the
attachments, with job starts and ends as settling) or its node (no jobs known). A third arm
is job peers as a sharded detector sees them: only the job's GPUs of the GPU's samples
partition (racks hashed over 8 partitions), see the module docstring of
``detector.job_peers``. Each arm's ``below_ratio`` and ``floor`` are chosen on the tuning
seeds (the highest recall with at most ``--max-false`` false incidents per 1000 GPU-days;
if none, the fewest false incidents), then reported on the held-out seeds; beside them,
the held-out score of the detector's shipped defaults (``JobPeerParams()``), which are what
a user runs whatever this benchmark chooses.

Scored as ``benchmarks.detection`` scores: a straggler is found when an alert on its GPU
starts between its start and its end + 60 s; an alert episode that overlaps no straggler of
its GPU (widened by 60 s) is a false incident. The speed check runs the whole detector shard
(``detector.shard``) on the first 10 min of a seed's fleet twice, without jobs and with every
GPU attached, alternating, and reports the ratio of CPU time per GPU-step.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks.detection import poisson_upper
from detector.config import DetectorConfig
from detector.features import COL, GATHERED
from detector.job_peers import JobPeerParams, JobPeers, peer_ratio
from schemas.attribution import Attachment

RESULTS = Path(__file__).parent / "results" / "detection_jobs.json"
GRACE_S = 60.0
BASE_MS = 1_700_000_000_000
GPUS_PER_NODE = 8
NODES_PER_RACK = 4
PARTITIONS = 8
PIPELINE_SHARE = 1 / 3
"""Share of the multi-GPU jobs that are pipeline-parallel (each rank one stage)."""
STAGE_IMBALANCE = (0.05, 0.35)
"""Range of a pipeline job's stage imbalance: each stage computes ``1 - imbalance * u`` (u
uniform per stage) of the job's profile. An assumption, not a measurement: stages are cut
by whole layers, and the first and last carry the embedding and the output head, so some
stages wait on others for up to about a third of a step."""
RATIOS = (0.5, 0.6, 0.7, 0.8)
FLOORS = (0.0, 0.1, 0.25)


@dataclass(slots=True)
class Scenario:
    util: npt.NDArray[np.float64]
    """(T, G) utilisation ratio per second."""
    node: npt.NDArray[np.int64]
    rack: npt.NDArray[np.int64]
    events: list[tuple[int, int, Attachment]]
    """(time ms, GPU, attachment) in time order: attach (``to_ms`` None) and detach."""
    stragglers: list[tuple[int, float, float, bool]]
    """(GPU, start s, end s, on a node shared with other jobs)."""
    jobs: int = 0
    in_pipeline: npt.NDArray[np.bool_] | None = None
    """(T, G) the GPU runs a stage of a pipeline-parallel job at that second."""

    @property
    def gpu_days(self) -> float:
        t, g = self.util.shape
        return g * t / 86_400.0


@dataclass(slots=True)
class _Job:
    gpus: npt.NDArray[np.int64]
    start: int
    end: int
    name: str
    multi: bool
    shared: bool


def _training(rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
    """One training job's utilisation profile over ``n`` seconds (its ranks share it)."""
    u = np.full(n, rng.uniform(0.75, 0.98))
    period = int(rng.uniform(600, 1800))
    dip = int(rng.uniform(30, 240))
    level = rng.uniform(0.05, 0.3)
    t = (np.arange(n) + int(rng.integers(0, period))) % period
    u[t < dip] = level
    return u


def _single(rng: np.random.Generator, n: int) -> npt.NDArray[np.float64]:
    """A one-GPU job: a level that moves every 30-300 s."""
    out = np.empty(n)
    t = 0
    while t < n:
        d = int(rng.uniform(30, 300))
        out[t:t + d] = rng.uniform(0.05, 0.8)
        t += d
    return out


def make_scenario(seed: int, nodes: int = 32, hours: float = 4.0,
                  stragglers: int = 12, pipeline: float = PIPELINE_SHARE) -> Scenario:
    """See the module docstring."""
    rng = np.random.default_rng(seed)
    # Pipeline stages draw from their own stream: the rest of the scenario is the same
    # whatever share of the jobs is pipeline-parallel.
    stage_rng = np.random.default_rng([seed, 0x919E])
    steps = int(hours * 3600)
    g = nodes * GPUS_PER_NODE
    node = np.repeat(np.arange(nodes), GPUS_PER_NODE).astype(np.int64)
    rack = node // NODES_PER_RACK
    whole = nodes // 4
    lanes: list[tuple[npt.NDArray[np.int64], bool, bool]] = []  # gpus, multi, shared node
    for n in range(whole):
        lanes.append((np.arange(n * 8, n * 8 + 8, dtype=np.int64), True, False))
    half = (nodes - whole) // 2
    for k in range(GPUS_PER_NODE - 1):
        for a in (whole, whole + half):
            lanes.append((np.arange(a, a + half, dtype=np.int64) * 8 + k, True, True))
    for n in range(whole, nodes):
        lanes.append((np.array([n * 8 + 7], dtype=np.int64), False, True))
    util = np.zeros((steps, g))
    in_pipeline = np.zeros((steps, g), dtype=bool)
    events: list[tuple[int, int, Attachment]] = []
    jobs: list[_Job] = []
    for li, (gpus, multi, shared) in enumerate(lanes):
        t = -int(rng.uniform(0, 3600))
        while t < steps:
            dur = int(rng.uniform(1200, 7200))
            name = f"job-{seed}-{li}-{len(jobs)}"
            lo, hi = max(t, 0), min(t + dur, steps)
            if hi > lo:
                prof = _training(rng, hi - lo) if multi else _single(rng, hi - lo)
                piped = multi and stage_rng.random() < pipeline
                stage = 1.0 - stage_rng.uniform(*STAGE_IMBALANCE) * stage_rng.random(gpus.size) \
                    if piped else np.ones(gpus.size)
                starts = t + (rng.uniform(0, 30, gpus.size) if multi else np.zeros(1))
                stops = t + dur + (rng.uniform(0, 20, gpus.size) if multi else np.zeros(1))
                for i, gid in enumerate(gpus.tolist()):
                    a, b = int(starts[i]), int(stops[i])
                    s0, s1 = max(a, lo), min(b, steps)
                    if s1 > s0:
                        noise = rng.normal(0.0, 0.02, s1 - s0)
                        src = prof[np.clip(np.arange(s0, s1) - lo, 0, hi - lo - 1)]
                        util[s0:s1, gid] = np.clip(src * stage[i] + noise, 0.0, 1.0)
                        in_pipeline[s0:s1, gid] = piped
                    on_ms = BASE_MS + int((starts[i] + rng.uniform(0, 5)) * 1000)
                    off_ms = BASE_MS + int((stops[i] + rng.uniform(0, 5)) * 1000)
                    att = Attachment(f"GPU-{gid}", name, {}, on_ms, None)
                    events.append((on_ms, gid, att))
                    events.append((off_ms, gid, att.ended(off_ms)))
                jobs.append(_Job(gpus, t, t + dur, name, multi, shared))
            t += dur + int(rng.uniform(60, 900))
    events.sort(key=lambda e: e[0])
    # Stragglers: one rank of a long enough running multi-GPU job, inside the job.
    faults: list[tuple[int, float, float, bool]] = []
    cands = [j for j in jobs if j.multi and min(j.end, steps) - max(j.start, 0) >= 1800]
    used: set[int] = set()
    tries = 0
    while len(faults) < stragglers and cands and tries < 1000:
        tries += 1
        j = cands[int(rng.integers(len(cands)))]
        gid = int(j.gpus[int(rng.integers(j.gpus.size))])
        if gid in used:
            continue
        lo, hi = max(j.start, 0) + 300, min(j.end, steps) - 300
        dur = int(rng.uniform(480, 1200))
        if hi - dur <= lo:
            continue
        s = int(rng.uniform(lo, hi - dur))
        util[s:s + dur, gid] *= rng.uniform(0.45, 0.65)
        used.add(gid)
        faults.append((gid, float(s), float(s + dur), j.shared))
    return Scenario(util, node, rack, events, faults, len(jobs), in_pipeline)


def _partition_of(rack: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """Samples partition of each rack, as the rack-keyed topic would hash it."""
    return np.array([zlib.crc32(f"rack-{r}".encode()) % PARTITIONS for r in rack.tolist()],
                    dtype=np.int64)


@dataclass(slots=True)
class ArmInput:
    """What the peer test reads of one arm on one scenario, step by step."""

    ratio: npt.NDArray[np.float64]
    """(T, G) utilisation over the peers' median (NaN: not judged)."""
    settling: npt.NDArray[np.bool_]
    """(T, G) a known change of regime (job peers only)."""


def arm_input(sc: Scenario, peers: str) -> ArmInput:
    """The ratios of ``peers`` = "job", "node" or "job-sharded" over the whole scenario, with
    the attachments applied in time order to a :class:`JobPeers` as the detector does."""
    t, g = sc.util.shape
    busy = JobPeerParams().busy
    jp = JobPeers(JobPeerParams())
    jp.ensure(g)
    ids = np.arange(g, dtype=np.int64)
    part = _partition_of(sc.rack)
    ratio = np.empty((t, g))
    settling = np.zeros((t, g), dtype=bool)
    e = 0
    for s in range(t):
        ts = BASE_MS + s * 1000
        while e < len(sc.events) and sc.events[e][0] <= ts:
            jp.attach(sc.events[e][1], sc.events[e][2])
            e += 1
        if peers == "node":
            ratio[s] = peer_ratio(sc.util[s], sc.node, busy)
            continue
        groups = jp.member(ids, ts)
        if peers == "job-sharded":
            groups = np.where(groups >= 0, groups * PARTITIONS + part, -1)
        ratio[s] = peer_ratio(sc.util[s], groups, busy)
        settling[s] = jp.settling(ids, ts)
    return ArmInput(ratio, settling)


def run_arm(sc: Scenario, arm: ArmInput, params: JobPeerParams
            ) -> list[tuple[int, float, float]]:
    """Alert episodes (GPU, start s, end s) of the peer test with ``params``."""
    t, g = sc.util.shape
    jp = JobPeers(params)
    jp.ensure(g)
    ids = np.arange(g, dtype=np.int64)
    started: dict[int, float] = {}
    out: list[tuple[int, float, float]] = []
    for s in range(t):
        opened, resolved = jp.hold(ids, arm.ratio[s], sc.util[s], arm.settling[s],
                                   BASE_MS + s * 1000)
        for r in opened.tolist():
            started[r] = float(s)
        for r in resolved.tolist():
            out.append((r, started.pop(r), float(s)))
    out.extend((r, a, float(t)) for r, a in started.items())
    return out


@dataclass(slots=True)
class Score:
    found: int = 0
    faults: int = 0
    found_shared: int = 0
    faults_shared: int = 0
    false: int = 0
    false_pipeline: int = 0
    """False incidents that started on a stage of a pipeline-parallel job."""
    gpu_days: float = 0.0
    delays: list[float] = field(default_factory=list)

    def add(self, other: Score) -> None:
        self.found += other.found
        self.faults += other.faults
        self.found_shared += other.found_shared
        self.faults_shared += other.faults_shared
        self.false += other.false
        self.false_pipeline += other.false_pipeline
        self.gpu_days += other.gpu_days
        self.delays += other.delays

    @property
    def recall(self) -> float:
        return self.found / self.faults if self.faults else float("nan")

    @property
    def false_per_1000(self) -> float:
        return 1000.0 * self.false / self.gpu_days

    def as_dict(self) -> dict[str, Any]:
        return {
            "recall": round(self.recall, 3), "found": self.found, "faults": self.faults,
            "recall_shared_node": round(self.found_shared / max(self.faults_shared, 1), 3),
            "found_shared_node": self.found_shared, "faults_shared_node": self.faults_shared,
            "false_incidents": self.false,
            "false_incidents_pipeline_stage": self.false_pipeline,
            "false_per_1000_gpu_days": round(self.false_per_1000, 2),
            "false_per_1000_gpu_days_upper95": round(
                1000.0 * poisson_upper(self.false) / self.gpu_days, 2),
            "gpu_days": round(self.gpu_days, 1),
            "median_delay_s": round(float(np.median(self.delays)), 1) if self.delays else None,
        }


def score(sc: Scenario, episodes: list[tuple[int, float, float]]) -> Score:
    out = Score(faults=len(sc.stragglers), gpu_days=sc.gpu_days,
                faults_shared=sum(f[3] for f in sc.stragglers))
    for gid, a, b, shared in sc.stragglers:
        hits = [s for g, s, _ in episodes if g == gid and a <= s <= b + GRACE_S]
        if hits:
            out.found += 1
            out.found_shared += shared
            out.delays.append(min(hits) - a)
    for gid, s, e in episodes:
        if not any(g == gid and s <= b + GRACE_S and e >= a - GRACE_S
                   for g, a, b, _ in sc.stragglers):
            out.false += 1
            if sc.in_pipeline is not None:
                out.false_pipeline += bool(sc.in_pipeline[min(int(s), len(sc.util) - 1), gid])
    return out


def choose(grid: dict[tuple[float, float], Score], max_false: float) -> tuple[float, float]:
    ok = [k for k, v in grid.items() if v.false_per_1000 <= max_false]
    if ok:
        return max(ok, key=lambda k: (grid[k].recall, -grid[k].false, -k[0]))
    return min(grid, key=lambda k: (grid[k].false, -grid[k].recall))


def speed(seed: int, seconds: int = 600, repeats: int = 2) -> dict[str, Any]:
    """CPU seconds per GPU-step of the whole shard without jobs and with every GPU attached."""
    from detector.shard import DetectorShard

    sc = make_scenario(seed, hours=seconds / 3600.0, stragglers=0)
    t, g = sc.util.shape
    rng = np.random.default_rng(seed)
    gathered = np.full((t, g, len(GATHERED)), np.nan)
    u = sc.util
    gathered[:, :, COL["utilization_ratio"]] = u
    gathered[:, :, COL["power_usage_watts"]] = 80 + 600 * u + rng.normal(0, 5, u.shape)
    gathered[:, :, COL["power_limit_watts"]] = 700.0
    gathered[:, :, COL["temperature_celsius"]] = np.round(35 + 40 * u)
    gathered[:, :, COL["memory_temperature_celsius"]] = np.round(40 + 35 * u)
    gathered[:, :, COL["sm_clock_hertz"]] = np.where(u > 0.05, 1.98e9, 3.45e8)
    gathered[:, :, COL["clock_event_reasons"]] = 0.0
    for c in ("ecc_sbe_volatile_total", "ecc_dbe_volatile_total", "nvlink_crc_errors_total",
              "xid"):
        gathered[:, :, COL[c]] = 0.0
    ts = BASE_MS + np.arange(t, dtype=np.int64) * 1000
    cpu: dict[str, list[float]] = {"without_jobs": [], "with_jobs": []}
    for _ in range(repeats):
        for arm in ("without_jobs", "with_jobs"):
            shard = DetectorShard(DetectorConfig())
            paths = [f"dc/row/rack-{r}/node-{n}/gpu-{i % 8}" for i, (r, n) in
                     enumerate(zip(sc.rack.tolist(), sc.node.tolist(), strict=True))]
            ids, nodes = shard.register(paths, [p.rsplit("/", 2)[0] for p in paths],
                                        [p.rsplit("/", 1)[0] for p in paths])
            if arm == "with_jobs":
                for gid in range(g):
                    shard.jobs.attach(gid, Attachment(f"GPU-{gid}", f"job-{gid // 4}", {},
                                                      BASE_MS - 3_600_000))
            shard.process(ids, nodes, ts[:30], gathered[:30])  # compile / warm
            c0 = time.process_time()
            shard.process(ids, nodes, ts[30:], gathered[30:])
            cpu[arm].append((time.process_time() - c0) / (g * (t - 30)))
    best = {k: min(v) for k, v in cpu.items()}
    return {"gpus": g, "steps": t - 30, "repeats": repeats,
            "us_per_gpu_step": {k: round(v * 1e6, 3) for k, v in best.items()},
            "ratio_with_to_without": round(best["with_jobs"] / best["without_jobs"], 3)}


ARMS = ("node", "job", "job-sharded")


def evaluate(tuning: list[int], heldout: list[int], max_false: float, hours: float
             ) -> dict[str, Any]:
    result: dict[str, Any] = {"tuning_seeds": tuning, "heldout_seeds": heldout,
                              "hours_per_seed": hours, "max_false_per_1000": max_false,
                              "pipeline_share": round(PIPELINE_SHARE, 3),
                              "stage_imbalance": list(STAGE_IMBALANCE), "arms": {}}
    grids: dict[str, dict[tuple[float, float], Score]] = {
        arm: {(r, f): Score() for r in RATIOS for f in FLOORS} for arm in ARMS}
    for seed in tuning:
        sc = make_scenario(seed, hours=hours)
        for arm in ARMS:
            inp = arm_input(sc, arm)
            for (r, f), total in grids[arm].items():
                total.add(score(sc, run_arm(sc, inp, JobPeerParams(below_ratio=r, floor=f))))
        print(f"tuning seed {seed} done", file=sys.stderr)
    chosen = {arm: choose(grids[arm], max_false) for arm in ARMS}
    held = {arm: Score() for arm in ARMS}
    shipped = JobPeerParams()
    held_default = {arm: Score() for arm in ARMS}
    for seed in heldout:
        sc = make_scenario(seed, hours=hours)
        for arm in ARMS:
            r, f = chosen[arm]
            inp = arm_input(sc, arm)
            held[arm].add(score(sc, run_arm(sc, inp, JobPeerParams(below_ratio=r, floor=f))))
            held_default[arm].add(score(sc, run_arm(sc, inp, shipped)))
        print(f"held-out seed {seed} done", file=sys.stderr)
    for arm in ARMS:
        r, f = chosen[arm]
        result["arms"][arm] = {
            "chosen": {"below_ratio": r, "floor": f},
            "tuning": grids[arm][(r, f)].as_dict(),
            "heldout": held[arm].as_dict(),
            "heldout_shipped_default": {"below_ratio": shipped.below_ratio,
                                        "floor": shipped.floor,
                                        **held_default[arm].as_dict()},
            "tuning_grid": [{"below_ratio": a, "floor": b, "recall": round(v.recall, 3),
                             "false_per_1000_gpu_days": round(v.false_per_1000, 1)}
                            for (a, b), v in grids[arm].items()],
        }
    return result


def print_table(result: dict[str, Any], out: Any = sys.stdout) -> None:
    print(f"{'peers':<12} {'ratio':>5} {'floor':>5} | {'recall':>6} {'shared':>6} "
          f"{'false/1000 GPU-d (95% up)':>26} {'on a stage':>10} {'delay':>6} | "
          f"tuning recall, false/1000", file=out)
    for arm, r in result["arms"].items():
        h, t = r["heldout"], r["tuning"]
        print(f"{arm:<12} {r['chosen']['below_ratio']:>5} {r['chosen']['floor']:>5} | "
              f"{h['recall']:>6} {h['recall_shared_node']:>6} "
              f"{h['false_per_1000_gpu_days']:>13} ({h['false_per_1000_gpu_days_upper95']:>8})"
              f"    {h['false_incidents_pipeline_stage']:>10} {h['median_delay_s']!s:>6} | {t['recall']}, {t['false_per_1000_gpu_days']}",
              file=out)
    for arm, r in result["arms"].items():
        d = r.get("heldout_shipped_default")
        if d:
            print(f"{arm + ', shipped':<12} {d['below_ratio']:>5} {d['floor']:>5} | "
                  f"{d['recall']:>6} {d['recall_shared_node']:>6} "
                  f"{d['false_per_1000_gpu_days']:>13} ({d['false_per_1000_gpu_days_upper95']:>8})"
                  f"    {d['false_incidents_pipeline_stage']:>10} {d['median_delay_s']!s:>6} |",
                  file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tuning", default="1,2,3")
    parser.add_argument("--heldout", default="11,12,13,14,15")
    parser.add_argument("--hours", type=float, default=4.0)
    parser.add_argument("--max-false", type=float, default=10.0,
                        help="false incidents per 1000 GPU-days allowed when choosing")
    parser.add_argument("--no-speed", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    seeds = [int(s) for s in args.tuning.split(",")], [int(s) for s in args.heldout.split(",")]
    result = evaluate(seeds[0], seeds[1], args.max_false, args.hours)
    if not args.no_speed:
        result["speed"] = speed(seeds[0][0])
    print_table(result)
    if "speed" in result:
        print(f"detector shard CPU per GPU-step: {result['speed']['us_per_gpu_step']}, "
              f"with jobs / without: {result['speed']['ratio_with_to_without']}")
    if args.json:
        print(json.dumps(result, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

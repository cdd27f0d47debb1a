"""The aggregator's rack stage and store on one thread at fleet scale, without Kafka.

    python -m benchmarks.rack_stage --gpus 31000 --seconds 100 [--baseline DIR] [--runs 2]
                                    [--cycle-s 10]

The load test (``benchmarks.ingest``) runs every stage and the broker on one machine, so
what one process costs shows there only through the others' noise (one commit's runs spread
by 1.2-1.9x). This one times what the aggregator's store thread does, alone and
deterministically: the synthetic fleet's frames (``ticks_per_frame`` 5, 12 partitions
keyed by rack, made before the clock starts) go through ``RackStage.process`` in batches of
2,000 messages, every window closes as it falls due (no close budget: the same work in
every run), and every ``--cycle-s`` of data (10 s, a multiple of the frames' 5 s) the store
is flushed and every partition checkpointed, as the service's durability cycle does every
``commit_interval_ms``. The first quarter of the data is warm-up (GPUs
and groups appearing, the first windows); CPU seconds are counted over the rest.

With ``--baseline DIR`` (a checkout of another commit, e.g. a ``git worktree``), the same
measurement runs in a subprocess importing the aggregator from DIR, alternating with this
checkout's, and the result has both and their ratio. Not counted: the row stage, the HTTP
API and Kafka's client (see ``benchmarks.ingest`` for those).
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).parent / "results" / "rack_stage.json"
PARTITIONS = 12
TICKS_PER_FRAME = 5


def measure(gpus: int, seconds: int, cycle_s: int = 10) -> dict[str, Any]:
    """CPU seconds per million metrics of the rack stage + store (imports done here, so a
    subprocess with another checkout first on ``sys.path`` measures that one)."""
    import aggregator.rack_stage as rack_stage
    from agent.fleet.model import METRIC_IDS, FleetModel
    from agent.fleet.topology import Topology
    from aggregator.checkpoint import checkpoint_bytes
    from aggregator.series_index import EntityIndex
    from aggregator.store import SeriesStore, StoreConfig
    from fleetpulse.transport import Message
    from schemas.frame import SampleFrame, encode_frame

    rack_stage.CLOSE_BUDGET_S = float("inf")  # type: ignore[misc]
    topo = Topology(gpus, nodes_per_rack=4, racks_per_row=8)
    model = FleetModel(topo, hz=1.0, seed=3, start_ms=1_767_225_600_000)
    blocks: list[list[Message]] = []
    offsets = [0] * PARTITIONS
    seqs = np.zeros(len(topo.identities), np.int64)
    for _ in range(seconds // TICKS_PER_FRAME):
        steps = [model.step() for _ in range(TICKS_PER_FRAME)]
        ts = np.stack([s[0] for s in steps], axis=1)
        values = np.stack([s[1] for s in steps], axis=0)
        msgs = []
        for n, ident in enumerate(topo.identities):
            g = topo.gpus_of_node(n)
            frame = SampleFrame(ident, f"agent-{ident.node}", int(seqs[n]), METRIC_IDS,
                                np.arange(topo.gpn, dtype=np.int32), tuple(model.uuids[g]),
                                np.ascontiguousarray(ts[n]), np.ascontiguousarray(values[:, g]))
            seqs[n] += 1
            p = int(topo.rack_of_node[n]) % PARTITIONS
            msgs.append(Message("samples", p, offsets[p], ident.rack_key, encode_frame(frame),
                                int(ts[n, -1])))
            offsets[p] += 1
        blocks.append(msgs)
    per_block = len(topo.identities) * TICKS_PER_FRAME * topo.gpn * len(METRIC_IDS)
    with tempfile.TemporaryDirectory() as tmp:
        store = SeriesStore(StoreConfig(path=str(Path(tmp) / "store"), fsync=False))
        index = EntityIndex(Path(tmp) / "entities.jsonl")
        store.before_write = index.drain
        stage = rack_stage.RackStage(store, index, topic="samples", lateness_ms=20_000)
        warm = len(blocks) // 4
        cpu = 0.0
        for i, msgs in enumerate(blocks):
            if i == warm:
                cpu = time.process_time()
            for a in range(0, len(msgs), 2_000):
                stage.process(msgs[a:a + 2_000])
            if (i + 1) % (cycle_s // TICKS_PER_FRAME) == 0:  # the durability cycle
                store.flush()
                for p in sorted(stage.parts):
                    checkpoint_bytes(stage.checkpoint(p))
        cpu = time.process_time() - cpu
        metrics = (len(blocks) - warm) * per_block
        index.close()
        store.close()
    return {"cpu_s": round(cpu, 2), "metrics": metrics,
            "cpu_s_per_million": round(cpu / metrics * 1e6, 4),
            "maxrss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}


def _in_subprocess(root: Path, gpus: int, seconds: int, cycle_s: int) -> dict[str, Any]:
    # Run as a file from ``root`` (``-c``: the working directory first on sys.path, not
    # this file's folder, whose agent.py would shadow the agent package).
    code = ("import runpy, sys; sys.argv = sys.argv[1:]; "
            "runpy.run_path(sys.argv[0], run_name='__main__')")
    env = dict(os.environ, PYTHONPATH=str(root))
    out = subprocess.run([sys.executable, "-c", code, __file__, "--measure", "--gpus",
                          str(gpus), "--seconds", str(seconds), "--cycle-s", str(cycle_s)],
                         env=env, cwd=root,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"the measurement in {root} failed:\n{out.stderr[-3000:]}")
    import orjson
    result: dict[str, Any] = orjson.loads(out.stdout.strip().splitlines()[-1])
    return result


def _commit(root: Path) -> str:
    return subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip() or "?"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=31_000)
    ap.add_argument("--seconds", type=int, default=100)
    ap.add_argument("--baseline", type=Path, help="a checkout of the commit to compare with")
    ap.add_argument("--runs", type=int, default=2, help="runs of each, alternating")
    ap.add_argument("--cycle-s", type=int, default=10,
                    help="seconds of data between durability cycles (a multiple of 5)")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.seconds < 4 * 2 * TICKS_PER_FRAME:
        ap.error("--seconds must be at least 40 (a quarter is warm-up)")
    if args.cycle_s < TICKS_PER_FRAME or args.cycle_s % TICKS_PER_FRAME:
        ap.error(f"--cycle-s must be a multiple of {TICKS_PER_FRAME}")
    if args.measure:
        import orjson
        print(orjson.dumps(measure(args.gpus, args.seconds, args.cycle_s)).decode())
        return
    here = Path(__file__).resolve().parent.parent
    sides = {"this": here} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in sides}
    for _ in range(args.runs):
        for name, root in sides.items():
            runs[name].append(_in_subprocess(root, args.gpus, args.seconds, args.cycle_s))
            print(f"{name} ({_commit(root)}): {runs[name][-1]}", file=sys.stderr)
    result: dict[str, Any] = {
        "gpus": args.gpus, "seconds": args.seconds, "partitions": PARTITIONS,
        "cycle_s": args.cycle_s,
        "commits": {k: _commit(root) for k, root in sides.items()}, "runs": runs,
        "cpu_s_per_million": {k: float(np.median([r["cpu_s_per_million"] for r in v]))
                              for k, v in runs.items()}}
    if args.baseline:
        cost = result["cpu_s_per_million"]
        result["this_vs_baseline"] = round(cost["this"] / cost["baseline"], 3)
    from benchmarks.results_file import write_result
    write_result(result, args.out, args.json)


if __name__ == "__main__":
    main()

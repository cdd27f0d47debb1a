"""What one GPU forest step costs by the model's age, with the screen and with every tree.

A forest's step is not one price: in its first ``output_after`` points nothing is scored
and only its samplers learn (the trees are cut from their sample at the first score); while
its reservoirs fill the samplers take most points; once warm they take about one in ten and
the step is mostly scoring, which is what the screen (``model.screen_trees``) cuts. A load
test of a minute sees only the first phase, a fleet that has run for hours only the last, so
this reports each.

The stream (seeded): ``--models`` GPUs, each a fixed random point of the detector's
feature width plus Gaussian noise (sd 0.3) every step; the detector's forest parameters
(``ModelConfig``: trees, sample size, shingle); every row's threshold is the threshold
floor (``model.floor``), the lowest a real one can be, so the screen skips no more here
than it would live. CPU seconds of this process (single-threaded kernels), numba's
compile excluded.

    python -m benchmarks.forest_phases [--models N] [--steps T] [--json] [--out PATH]
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.results_file import write_result
from detector.config import ModelConfig
from detector.engines import make_engine
from detector.features import FEATURES

RESULTS = Path(__file__).parent / "results" / "forest_phases.json"


def phase_costs(mc: ModelConfig, models: int, edges: list[int], seed: int) -> list[float]:
    """Microseconds of CPU per model step within each span of ``edges`` (model ages)."""
    cfg = mc.engine_config(len(FEATURES))
    warm = make_engine("numba", cfg)  # compile outside the timing
    warm.ensure_models(1)
    warm.update(np.zeros(1, np.int64), np.zeros((1, cfg.dims), np.float32))
    engine = make_engine("numba", cfg)
    engine.ensure_models(models)
    rng = np.random.default_rng(seed)
    ids = np.arange(models, dtype=np.int64)
    base = rng.normal(size=(models, cfg.dims)).astype(np.float32)
    out = []
    for start, end in itertools.pairwise(edges):
        spent = 0.0
        for _ in range(start, end):
            points = base + rng.normal(scale=0.3, size=base.shape).astype(np.float32)
            t = time.process_time()
            engine.update(ids, points, attribute_above=mc.floor)
            spent += time.process_time() - t
        out.append(round(1e6 * spent / (models * (end - start)), 1))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--steps", type=int, default=6000, help="age of the models at the end")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print one JSON object last")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    mc = ModelConfig()
    edges = [e for e in (0, 64, 300, 1000, 3000, 6000, 12000) if e < args.steps] + [args.steps]
    result: dict[str, Any] = {"models": args.models, "trees": mc.trees,
                              "sample_size": mc.sample_size, "threshold": mc.floor,
                              "ages": [f"{a}-{b}" for a, b in itertools.pairwise(edges)],
                              "us_per_step": {}}
    for screen in (0, mc.screen_trees):
        costs = phase_costs(replace(mc, screen_trees=screen), args.models, edges, args.seed)
        name = f"screen_{screen}" if screen else "every_tree"
        result["us_per_step"][name] = costs
        print(f"{name:>10}: " + " | ".join(f"{a}: {c:.0f} us"
                                          for a, c in zip(result["ages"], costs, strict=True)),
              flush=True)
    write_result(result, args.out, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

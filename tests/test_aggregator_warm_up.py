"""After ``warm_up`` the aggregator's work compiles nothing: no numba compile inside a loop.

A kernel compiled lazily at its first call stalls the event loop for as long as the compile
takes (a minute for the codec on a busy 2-core machine, in a fresh checkout whose numba
cache is empty): the aggregator's first chunk seal did that and got it expelled from its
consumer group (issue 16). The check runs in a fresh interpreter, so what earlier tests
compiled cannot hide a kernel that warm_up leaves out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = textwrap.dedent("""
    import json, sys
    from pathlib import Path

    import numba
    import numpy as np

    sys.path.insert(0, str(Path(sys.argv[1])))
    from test_aggregator_support import make_fleet, open_store, process_all

    from aggregator.query_engine import QueryEngine, QueryLimits
    from aggregator.rack_stage import RackStage
    from aggregator.row_stage import RowStage
    from aggregator.series_index import EntityIndex
    from aggregator.window_kernel import warm_up
    from fleetpulse.transport.base import Message
    from schemas.rollup import encode_rollup

    def signatures():
        out = {}
        for name, mod in list(sys.modules.items()):
            if not name.startswith("aggregator"):
                continue
            for attr, obj in vars(mod).items():
                if isinstance(obj, numba.core.registry.CPUDispatcher):
                    out[f"{name}.{attr}"] = len(obj.signatures)
        return out

    warm_up()
    before = signatures()
    tmp = Path(sys.argv[2])
    store = open_store(tmp / "store")
    index = EntityIndex(tmp / "entities.jsonl")
    rack = RackStage(store, index, topic="s", lateness_ms=5000)
    row = RowStage(store, index, topic="r", lateness_ms=60_000, settle_ms=0)
    fl = make_fleet(n_racks=4, nodes_per_rack=2, gpus=4, seconds=150, partitions=2, rows=2,
                    ticks_per_frame=5)
    _, rollups = process_all(rack, fl.messages)
    msgs = [Message("r", 0, i, f.row.encode(), encode_rollup(f), 0)
            for i, f in enumerate(rollups)]
    row.process(msgs)
    store.flush()
    store.close()  # seals every open chunk: the codec's encode
    store = open_store(tmp / "store")
    engine = QueryEngine(store, index, QueryLimits(11_000, 50_000, 300_000))
    t0, t1 = int(fl.ts[0]), int(fl.ts[-1])
    answered = 0
    for q, step in (('fleetpulse_gpu_temperature_celsius{level="gpu"}', 1_000),
                    ('fleetpulse_gpu_power_usage_watts{level="rack",agg="p95"}', 10_000),
                    ('max(fleetpulse_gpu_temperature_celsius{level="node"})', 10_000),
                    ('fleetpulse_gpu_power_usage_watts{level="row"}', 60_000)):
        res = engine.query_range(q, t0, t1, step)
        answered += int(np.count_nonzero(~np.isnan(res.values)))
    r = store.read("raw", np.sort(store.series_ids("raw")), 0, 1 << 62)
    after = signatures()
    print(json.dumps({"compiled": {k: after[k] - before.get(k, 0) for k in after
                                   if after[k] != before.get(k, 0)},
                      "rollups": len(rollups), "answered": answered,
                      "raw_points": int(r.values.size)}))
""")


def test_nothing_compiles_after_warm_up(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", _SCRIPT, str(ROOT / "tests"), str(tmp_path)],
                         capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # the workload really went through closes, seals, reads and queries
    assert got["rollups"] > 0 and got["answered"] > 0 and got["raw_points"] > 0, got
    assert got["compiled"] == {}, got

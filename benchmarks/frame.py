"""Frame encode/decode throughput on one core, against one orjson dict per metric.

The baseline is what a straightforward agent would publish: a JSON list with one object
per (tick, GPU, metric). Both sides encode and decode the same readings of one node
(8 GPUs x every catalog metric x 5 ticks per frame). "decode" for fleetpulse frames is
validation plus zero-copy views; "decode+read" also reads every value once (nansum), so the
comparison stays honest for a consumer that touches all values.

    python -m benchmarks.frame [--json] [--seconds S]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from schemas import CATALOG, NodeIdentity, SampleFrame, decode_frame, encode_frame

RESULTS = Path(__file__).parent / "results" / "frame.json"


def _rate(fn: Callable[[], Any], metrics_per_call: int, seconds: float) -> float:
    """Metrics per second of ``fn`` over about ``seconds`` (best of 3 rounds)."""
    fn()
    best = 0.0
    for _ in range(3):
        calls, start = 0, time.process_time()
        while (elapsed := time.process_time() - start) < seconds / 3:
            for _ in range(20):
                fn()
            calls += 20
        best = max(best, calls * metrics_per_call / elapsed)
    return best


def build_frame(ticks: int = 5, gpus: int = 8) -> SampleFrame:
    rng = np.random.default_rng(7)
    ids = np.array([m.id for m in CATALOG], dtype=np.uint16)
    values = np.round(rng.uniform(0, 500, size=(ticks, gpus, len(ids))), 3)
    return SampleFrame(
        identity=NodeIdentity("c1", "row-a", "rack-03", "node-17"),
        agent="node-17.1",
        seq=1,
        metric_ids=ids,
        gpus=np.arange(gpus, dtype=np.int32),
        uuids=tuple(f"GPU-{i:032x}" for i in range(gpus)),
        ts=1_732_890_000_000 + 1000 * np.arange(ticks, dtype=np.int64),
        values=values,
    )


def baseline_objects(frame: SampleFrame) -> list[dict[str, Any]]:
    names = [m.name for m in CATALOG]
    return [
        {"cluster": "c1", "row": "row-a", "rack": "rack-03", "node": "node-17",
         "gpu": g, "uuid": frame.uuids[g], "metric": names[m],
         "ts": int(frame.ts[t]), "value": float(frame.values[t, g, m])}
        for t in range(frame.values.shape[0])
        for g in range(frame.values.shape[1])
        for m in range(frame.values.shape[2])
    ]


def run(seconds: float) -> dict[str, Any]:
    frame = build_frame()
    n = frame.n_values
    data = encode_frame(frame)
    objects = baseline_objects(frame)
    blob = orjson.dumps(objects)
    results = {
        "metrics_per_frame": n,
        "frame_bytes": len(data),
        "baseline_bytes": len(blob),
        "encode_metrics_per_s": _rate(lambda: encode_frame(frame), n, seconds),
        "decode_metrics_per_s": _rate(lambda: decode_frame(data), n, seconds),
        "decode_read_metrics_per_s": _rate(lambda: np.nansum(decode_frame(data).values), n, seconds),
        "baseline_encode_metrics_per_s": _rate(lambda: orjson.dumps(baseline_objects(frame)), n, seconds),
        "baseline_decode_metrics_per_s": _rate(lambda: orjson.loads(blob), n, seconds),
    }
    results["decode_speedup"] = results["decode_metrics_per_s"] / results["baseline_decode_metrics_per_s"]
    results["encode_speedup"] = results["encode_metrics_per_s"] / results["baseline_encode_metrics_per_s"]
    results["decode_target_metrics_per_s"] = 20e6
    results["decode_target_met"] = results["decode_metrics_per_s"] >= 20e6
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU seconds per measurement")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where to write the JSON")
    args = parser.parse_args()
    r = run(args.seconds)
    print(f"one frame: {r['metrics_per_frame']} metrics, {r['frame_bytes']} B "
          f"(orjson objects: {r['baseline_bytes']} B)")
    print(f"{'operation':<14}{'fleetpulse frame':>20}{'orjson dict/metric':>22}{'ratio':>9}")
    for op in ("encode", "decode"):
        ours, base = r[f"{op}_metrics_per_s"], r[f"baseline_{op}_metrics_per_s"]
        print(f"{op + ' metrics/s':<14}{ours:>20,.0f}{base:>22,.0f}{ours / base:>8.0f}x")
    print(f"{'decode+read':<14}{r['decode_read_metrics_per_s']:>20,.0f}")
    print(f"decode target 20,000,000 metrics/s: {'met' if r['decode_target_met'] else 'MISSED'}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_bytes(orjson.dumps(r, option=orjson.OPT_INDENT_2))
    if args.json:
        print(orjson.dumps(r).decode())


if __name__ == "__main__":
    main()

"""GEMM/conv tile autotune: what tuning costs at load and what it buys per run, per model.

    python bench/bench_autotune.py [--models resnet18_b1,...] [--repeat 20] [--cache-dir DIR] [--json out.json]

Per model on the wgpu backend: load with autotune=False (plan_gemm's heuristic), load with autotune=True into an
empty cache (the tuning time), load again as a new process would (a fresh tuner: everything from the disk cache,
nothing timed), then the median run time of the heuristic and the tuned model. Models come from
bench_models.py's workloads. The cache goes to a temporary directory unless --cache-dir names one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from bench_models import workloads  # noqa: E402

import ember  # noqa: E402
from ember.backends.wgpu import autotune  # noqa: E402


def ab_ms(a: ember.Model, b: ember.Model, feeds: dict, repeat: int, blocks: int = 6) -> tuple[float, float]:
    """Median run time of two models measured side by side: both warmed up (GPU clocks up), then alternating
    blocks of runs, so clock and load drift hit both alike (measuring one after the other read the first
    3.5x slow on an H200)."""
    end = time.perf_counter() + 0.5
    while time.perf_counter() < end:
        a.run(feeds)
        b.run(feeds)
    times: tuple[list[float], list[float]] = ([], [])
    per = max(1, repeat // blocks)
    for _ in range(blocks):
        for model, out in ((a, times[0]), (b, times[1])):
            for _ in range(per):
                t0 = time.perf_counter()
                model.run(feeds)
                out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times[0]), statistics.median(times[1])


def bench(name: str, repeat: int) -> dict[str, Any]:
    path, feeds, _ = workloads()[name]()
    be = ember.backend("wgpu")
    row: dict[str, Any] = {"model": name, "adapter": be.adapter_name}
    t0 = time.perf_counter()
    heuristic = ember.load_onnx(path, be, autotune=False)
    row["load_heuristic_s"] = time.perf_counter() - t0
    for label in ("tuned", "cached"):
        be._autotuner = None  # a new process, as far as tuning goes: only the disk cache remains
        t0 = time.perf_counter()
        model = ember.load_onnx(path, be, autotune=True)
        row[f"load_{label}_s"] = time.perf_counter() - t0
        info = model.plan_info(feeds)
        row[f"{label}_report"] = {k.split(".", 1)[1]: v for k, v in info.items() if k.startswith("autotune.")}
    row["run_heuristic_ms"], row["run_tuned_ms"] = ab_ms(heuristic, model, feeds, repeat)
    row["cache_file"] = str(autotune.tuner(be).cache.path)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet18_b1")
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--cache-dir", help="the autotune cache directory (default: a new temporary one)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    os.environ["EMBER_CACHE_DIR"] = args.cache_dir or tempfile.mkdtemp(prefix="ember-autotune-")
    rows = []
    for name in args.models.split(","):
        row = bench(name, args.repeat)
        rows.append(row)
        tuned, cached = row["tuned_report"], row["cached_report"]
        print(f"{name} on {row['adapter']}: load {row['load_heuristic_s']:.2f} s heuristic, "
              f"{row['load_tuned_s']:.2f} s tuning ({tuned['tuned']} shapes, {tuned['timed']} kernels timed, "
              f"{tuned['seconds']:.2f} s in the tuner), {row['load_cached_s']:.2f} s from the cache "
              f"({cached['hits']} hits, {cached['timed']} timed); run {row['run_heuristic_ms']:.3f} ms heuristic, "
              f"{row['run_tuned_ms']:.3f} ms tuned ({row['run_heuristic_ms'] / row['run_tuned_ms']:.2f}x)")
    print(f"cache: {rows[-1]['cache_file']}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

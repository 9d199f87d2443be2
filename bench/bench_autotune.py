"""GEMM/conv tile autotune: what tuning costs at load and what it buys per run, per model (wgpu).

    python bench/bench_autotune.py [--models resnet18_b1,...] [--repeat 20] [--cache-dir DIR] [--json out.json]
        [--md out.md]

Per model, each load on a backend object of its own (ember.backend("wgpu"): its own device and tuner, so only
the disk cache carries over, as between processes): load with autotune=False (the tile heuristic), load with
autotune=True into an empty cache (the tuning time), load again with autotune=True (everything from the disk
cache, nothing timed), then the heuristic and the tuned model's runs interleaved in pairs (harness.ab, after
half a second of both so the GPU clocks are up): medians and the per-pair ratio. Models: bench_models.py's
names or graphs.py's specs. The cache goes to a new temporary directory unless --cache-dir names one.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import graphs  # noqa: E402
import harness  # noqa: E402

import ember  # noqa: E402


def bench(name: str, args: argparse.Namespace) -> dict[str, Any]:
    source, feeds, _ = graphs.resolve(name)
    row: dict[str, Any] = {}
    models: dict[str, ember.Model] = {}
    for label, tune in (("heuristic", False), ("tuned", True), ("cached", True)):
        be = ember.backend("wgpu")
        t0 = time.perf_counter()
        models[label] = ember.load_onnx(source, backend=be, autotune=tune)
        row[f"load {label} s"] = time.perf_counter() - t0
        info = models[label].plan_info(feeds)
        row[f"{label} report"] = {k.split(".", 1)[1]: v for k, v in info.items() if k.startswith("autotune.")}
    row["adapter"] = harness.adapter_name(models["tuned"].compute_backend)
    res = harness.ab(lambda: models["heuristic"].run(feeds), lambda: models["tuned"].run(feeds), args.repeat,
                     warmup=args.warmup, warm_s=0.5)
    row["timing"] = res
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet18_b1")
    ap.add_argument("--cache-dir", help="the autotune cache directory (default: a new temporary one)")
    harness.add_common(ap, repeat=20, warmup=3, backends=False)
    args = ap.parse_args()
    # The environment, not settings.override: it reaches every backend made from here on, old sources too.
    cache = args.cache_dir or tempfile.mkdtemp(prefix="ember-autotune-")
    os.environ["EMBER_CACHE_DIR"] = cache
    report = harness.Report("Autotune: load cost and run time, heuristic tiles against tuned (wgpu)", args,
                            row_key="model", meta={"cache_dir": cache})
    for name in graphs.expand(args.models):
        row = bench(name, args)
        tuned, cached, res = row["tuned report"], row["cached report"], row["timing"]
        print(f"{name} on {row['adapter']}: load {row['load heuristic s']:.2f} s heuristic, "
              f"{row['load tuned s']:.2f} s tuning ({tuned.get('tuned')} shapes, {tuned.get('timed')} kernels timed, "
              f"{tuned.get('seconds', 0):.2f} s in the tuner), {row['load cached s']:.2f} s from the cache "
              f"({cached.get('hits')} hits, {cached.get('timed')} timed); run {res.a.median:.3f} ms heuristic, "
              f"{res.b.median:.3f} ms tuned (tuned / heuristic per pair {harness.fmt(res.ratio)})", flush=True)
        report.add(name, {"load heuristic s": row["load heuristic s"], "load tuning s": row["load tuned s"],
                          "load cached s": row["load cached s"], "shapes tuned": tuned.get("tuned"),
                          "kernels timed": tuned.get("timed"), "cache hits": cached.get("hits"),
                          "heuristic ms": res.a, "tuned ms": res.b, "tuned / heuristic": res.ratio},
                   **{k: v for k, v in row.items() if k.endswith("report") or k == "adapter"})
    print(f"cache: {cache} ({', '.join(sorted(p.name for p in Path(cache).glob('*'))) or 'empty'})")
    report.finish()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A/B of one ember knob on the wgpu backend, inside whole model runs: two copies of each model in one process,
one planned with the defaults (A) and one with module attributes changed (B), their runs alternating.

    python bench/bench_wgpu_ab.py --set ember.backends.wgpu.conv.DIRECT_MIN_WORKGROUPS=0 \\
        [--models resnet18_b1,mobilenetv2_b1] [--rounds 20] [--runs 10]

Generated kernels must be judged in whole runs, not only alone: a kernel that wins warm on its own can lose in
a model, where its code and data come cold (see BENCHMARKS.md, "Models, session 5"). Each round runs A then B
(B first every other round) `--runs` times each; printed: each copy's median and p10 wall time per run, the
per-round ratio B / A (median and quartiles), and each plan's GPU time per run (timestamp queries, min of 5).
The attributes are set while B loads and plans, then restored.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import ember  # noqa: E402


def parse_setting(text: str) -> tuple[object, str, object]:
    """'pkg.module.NAME=value' -> (module, NAME, value); the value a Python literal."""
    target, _, value = text.partition("=")
    mod_name, _, attr = target.rpartition(".")
    if not mod_name or not value:
        raise SystemExit(f"--set wants module.NAME=value, got {text!r}")
    mod = importlib.import_module(mod_name)
    if not hasattr(mod, attr):
        raise SystemExit(f"--set: {mod_name} has no attribute {attr!r}")
    return mod, attr, ast.literal_eval(value)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", required=True, help="module.NAME=value for copy B (repeatable)")
    ap.add_argument("--models", default="resnet18_b1,mobilenetv2_b1")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--runs", type=int, default=10, help="runs of each copy per round")
    args = ap.parse_args()
    settings = [parse_setting(s) for s in args.set]

    from bench.bench_models import workloads

    loads = workloads()
    for name in args.models.split(","):
        path, feeds, _ = loads[name]()
        a = ember.load_onnx(path, backend="wgpu")
        a.run(feeds)  # plans with the defaults
        saved = [(mod, attr, getattr(mod, attr)) for mod, attr, _ in settings]
        try:
            for mod, attr, value in settings:
                setattr(mod, attr, value)
            b = ember.load_onnx(path, backend="wgpu")
            got_b = b.run(feeds)
        finally:
            for mod, attr, value in saved:
                setattr(mod, attr, value)
        got_a = a.run(feeds)
        err = max(float(abs(got_a[k] - got_b[k]).max() / (abs(got_a[k]).max() + 1e-30)) for k in got_a)
        times: dict[str, list[float]] = {"A": [], "B": []}
        ratios = []
        for r in range(args.rounds):
            med = {}
            for key in ("AB" if r % 2 == 0 else "BA"):
                model = a if key == "A" else b
                ts = []
                for _ in range(args.runs):
                    t = time.perf_counter()
                    model.run(feeds)
                    ts.append((time.perf_counter() - t) * 1e3)
                times[key] += ts
                med[key] = statistics.median(ts)
            ratios.append(med["B"] / med["A"])
        q = statistics.quantiles(ratios, n=4)
        line = ", ".join(f"{key} {statistics.median(v):.3f} ms (p10 {sorted(v)[len(v) // 10]:.3f}, GPU "
                         f"{(a if key == 'A' else b).gpu_time(feeds):.3f})" for key, v in times.items())
        print(f"{name}: {line}; B / A per round {statistics.median(ratios):.3f} ({q[0]:.3f}-{q[2]:.3f}); "
              f"max rel diff A vs B {err:.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""ember's cpu backend against ONNX Runtime's CPU provider, measured side by side in one process.

    PYTHONPATH=src python bench/bench_cpu.py [--models resnet18_b1,mobilenetv2_b1] [--blocks 8] [--threads N]
        [--src OTHER/src]  # measure another checkout's ember (before/after comparisons)
        [--profile 15]   # also the slowest recorded steps of ember's plan and of ORT's session, and the time
                         # per op kind of each (ORT's from its own profiler, nodes as its optimiser fused them)

The machine may be shared and noisy, so the two engines run in alternating blocks (the first runs of each
block dropped: idle OpenBLAS and ORT workers spin for a while and would tax the other engine), and the ratio
is of the medians over all kept runs. ORT runs with its defaults but `--threads` intra-op threads (default:
the core count, which is what ORT picks itself).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# --src DIR: measure the ember found in DIR instead (another checkout: before/after comparisons).
_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else str(ROOT / "src")
sys.path.insert(0, _SRC)

import ember  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet18_b1,mobilenetv2_b1")
    ap.add_argument("--blocks", type=int, default=8, help="blocks of runs per engine, alternating")
    ap.add_argument("--block", type=int, default=8, help="runs per block")
    ap.add_argument("--drop", type=int, default=3, help="runs dropped at the start of each block")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--src", help="import ember from this src directory (default: this checkout's)")
    ap.add_argument("--profile", type=int, default=0, help="show the N slowest steps of ember's plan")
    args = ap.parse_args()

    import onnxruntime as ort
    from bench.bench_models import workloads  # after ember: it puts this checkout's src on sys.path

    print(f"ember from {ember.__file__}; onnxruntime {ort.__version__}, {args.threads} intra-op threads; "
          f"numpy {np.__version__}; {os.cpu_count()} cores")
    loads = workloads()
    for name in args.models.split(","):
        path, feeds, _ = loads[name]()
        model = ember.load_onnx(path, backend="cpu")
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)[0]
        got = model.run(feeds)[next(iter(model.run(feeds)))]
        err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
        # Blocks of runs, alternating between the engines; each block's first runs are dropped: both keep
        # worker threads spinning for a while after a run (OpenBLAS's, ORT's), which would tax the other.
        te: list[float] = []
        to: list[float] = []
        run_ember, run_ort = partial(model.run, feeds), partial(sess.run, None, feeds)
        for _ in range(args.blocks):
            te += timed(run_ember, args.block)[args.drop:]
            to += timed(run_ort, args.block)[args.drop:]
        me, mo = statistics.median(te), statistics.median(to)
        print(f"{name}: ember cpu {me:.2f} ms (p10 {pct(te, 10):.2f}, p90 {pct(te, 90):.2f}), ORT {mo:.2f} ms "
              f"(p10 {pct(to, 10):.2f}, p90 {pct(to, 90):.2f}): ratio {me / mo:.2f}x "
              f"(of p10s {pct(te, 10) / pct(to, 10):.2f}x)  [max rel err vs ORT {err:.1e}]")
        if args.profile:
            profile(model, feeds, args.profile)
            profile_ort(path, feeds, args.threads, args.profile)
    return 0


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e3)
    return out


def profile_ort(path: Path, feeds: dict, threads: int, top: int) -> None:
    """ORT's per-node kernel times (its profiler's median over 40 runs after 10), as the session runs them."""
    import json

    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_profiling = True
    so.profile_file_prefix = "/tmp/ember_bench_cpu_ort"
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    for _ in range(50):
        sess.run(None, feeds)
    trace = Path(sess.end_profiling())
    times: dict[tuple[str, str], list[float]] = defaultdict(list)
    for ev in json.loads(trace.read_text()):
        if ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time"):
            times[(ev["name"].removesuffix("_kernel_time"), ev["args"].get("op_name", "?"))].append(ev["dur"] / 1e3)
    trace.unlink()
    med = {key: statistics.median(v[10:]) for key, v in times.items()}
    total = sum(med.values())
    print(f"  ORT: {len(med)} nodes, sum of node medians {total:.2f} ms")
    by_kind: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for (_, kind), t in med.items():
        by_kind[kind] += t
        count[kind] += 1
    for kind, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"    {kind:28s} x{count[kind]:3d} {t:8.2f} ms  {100 * t / total:5.1f}%")
    print("  ORT's slowest nodes (named by their output after ORT's fusions):")
    for (node, kind), t in sorted(med.items(), key=lambda kv: -kv[1])[:top]:
        print(f"    {t:7.3f} ms  {node} ({kind})")


def pct(xs: list[float], q: int) -> float:
    return sorted(xs)[len(xs) * q // 100]


def profile(model: ember.Model, feeds: dict, top: int) -> None:
    """Median per-step time over several replays; grouped by the op that recorded the step."""
    model.profile(feeds)  # builds the plan, warms it
    plan = next(iter(model._plans.values()))
    labels = list(plan.labels)
    rows = [plan.profile() for _ in range(7)]
    med = [statistics.median(r[i][1] for r in rows) for i in range(len(labels))]
    total = sum(med)
    print(f"  {len(labels)} steps, sum of step medians {total:.2f} ms")
    by_kind: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for lab, t in zip(labels, med, strict=True):
        kind = lab.rsplit("(", 1)[-1].rstrip(")")
        by_kind[kind] += t
        count[kind] += 1
    for kind, t in sorted(by_kind.items(), key=lambda kv: -kv[1]):
        print(f"    {kind:28s} x{count[kind]:3d} {t:8.2f} ms  {100 * t / total:5.1f}%")
    print("  slowest steps:")
    for i in sorted(range(len(labels)), key=lambda i: -med[i])[:top]:
        print(f"    {med[i]:7.3f} ms  {labels[i]}")


if __name__ == "__main__":
    raise SystemExit(main())

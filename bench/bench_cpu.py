"""ember's cpu backend against ONNX Runtime's CPU provider, measured side by side in one process.

    PYTHONPATH=src python bench/bench_cpu.py [--models resnet18_b1,mobilenetv2_b1] [--blocks 8] [--block 8]
        [--drop 3] [--threads N] [--json out.json] [--md out.md]
        [--src OTHER/src]  # measure another checkout's ember (before/after comparisons; bench_ab.py --against
                           # interleaves two checkouts in one process, which is steadier)
        [--profile 15]   # also the slowest recorded steps of ember's plan and of ORT's session, and the time
                         # per op kind of each (ORT's from its own profiler, nodes as its optimiser fused them)

The machine may be shared and noisy, so the two engines run in alternating blocks (harness.interleave: the first
`--drop` runs of each block left out, since idle OpenBLAS and ORT workers spin for a while and would tax the other
engine; which engine goes first alternates). Reported: each engine's median, p10 and p90 over all kept runs, the
ratio of the medians and of the p10s, and the median of the per-block ratios. ORT runs with its defaults but
`--threads` intra-op threads (default: the core count, which is what ORT picks itself).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

# --src DIR: measure the ember found in DIR instead (another checkout), ahead of this checkout's src.
if "--src" in sys.argv:
    sys.path.insert(0, sys.argv[sys.argv.index("--src") + 1])

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
    harness.add_common(ap, warmup=3, backends=False)
    args = ap.parse_args()

    import graphs
    import onnxruntime as ort

    print(f"ember from {ember.__file__}; onnxruntime {ort.__version__}, {args.threads} intra-op threads; "
          f"numpy {np.__version__}; {os.cpu_count()} cores")
    report = harness.Report("ember cpu against ONNX Runtime (CPU), ms per run, blocks interleaved", args,
                            row_key="model", meta={"ember": ember.__file__, "onnxruntime": ort.__version__,
                                                   "threads": args.threads})
    for name in graphs.expand(args.models):
        path, feeds, _ = graphs.resolve(name)
        model = ember.load_onnx(path, backend="cpu")
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        blob = path.SerializeToString() if hasattr(path, "SerializeToString") else str(path)
        sess = ort.InferenceSession(blob, so, providers=["CPUExecutionProvider"])
        err = harness.max_rel_err(next(iter(model.run(feeds).values())), sess.run(None, feeds)[0])
        res = harness.interleave({"ORT": partial(sess.run, None, feeds), "ember cpu": partial(model.run, feeds)},
                                 args.blocks, block=args.block, drop=args.drop, warmup=args.warmup)
        te, to = res.stats["ember cpu"], res.stats["ORT"]
        print(f"{name}: ember cpu {te.median:.2f} ms (p10 {te.p10:.2f}, p90 {te.p90:.2f}), ORT {to.median:.2f} ms "
              f"(p10 {to.p10:.2f}, p90 {to.p90:.2f}): ratio {te.median / to.median:.2f}x "
              f"(of p10s {te.p10 / to.p10:.2f}x)  [max rel err vs ORT {err:.1e}]", flush=True)
        report.add(name, {"ember cpu": te, "ORT": to, "ratio of medians": te.median / to.median,
                          "of p10s": te.p10 / to.p10, "per block (ember / ORT)": res.ratios["ember cpu"],
                          "max rel err": f"{err:.1e}"}, timing=res.as_dict())
        if args.profile:
            report.row(name, ember_profile=profile(model, feeds, args.profile),
                       ort_profile=profile_ort(blob, feeds, args.threads, args.profile))
    report.finish()
    return 0


def by_kind(med: dict[str, float], kinds: dict[str, str], title: str, top: int) -> list[tuple[str, float]]:
    """Print the time per op kind and the slowest entries; return the slowest (label, ms)."""
    total = sum(med.values())
    print(f"  {title}: {len(med)} entries, sum of medians {total:.2f} ms")
    per: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for label, t in med.items():
        per[kinds[label]] += t
        count[kinds[label]] += 1
    for kind, t in sorted(per.items(), key=lambda kv: -kv[1]):
        print(f"    {kind:28s} x{count[kind]:3d} {t:8.2f} ms  {100 * t / max(total, 1e-12):5.1f}%")
    slow = sorted(med.items(), key=lambda kv: -kv[1])[:top]
    print("  slowest:")
    for label, t in slow:
        print(f"    {t:7.3f} ms  {label}")
    return slow


def profile(model: ember.Model, feeds: dict, top: int, reps: int = 7) -> list[tuple[str, float]]:
    """Median per-step time over several Model.profile calls, grouped by the op that recorded each step (a
    label's steps summed per call: one node may record several)."""
    runs: list[dict[str, float]] = []
    for _ in range(reps):
        per: dict[str, float] = defaultdict(float)
        for label, ms in model.profile(feeds):
            per[label] += ms
        runs.append(per)
    med = {label: statistics.median(r.get(label, 0.0) for r in runs) for label in runs[0]}
    kinds = {label: label.rsplit("(", 1)[-1].rstrip(")") for label in med}
    return by_kind(med, kinds, "ember steps", top)


def profile_ort(model: Any, feeds: dict, threads: int, top: int) -> list[tuple[str, float]]:
    """ORT's per-node kernel times (its profiler's median over 40 runs after 10), as the session runs them (named
    by their output after ORT's fusions)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.enable_profiling = True
    so.profile_file_prefix = "/tmp/ember_bench_cpu_ort"
    sess = ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])
    for _ in range(50):
        sess.run(None, feeds)
    trace = Path(sess.end_profiling())
    times: dict[str, list[float]] = defaultdict(list)
    kinds: dict[str, str] = {}
    for ev in json.loads(trace.read_text()):
        if ev.get("cat") == "Node" and ev["name"].endswith("_kernel_time"):
            node = ev["name"].removesuffix("_kernel_time")
            times[node].append(ev["dur"] / 1e3)
            kinds[node] = ev["args"].get("op_name", "?")
    trace.unlink()
    med = {node: statistics.median(v[10:] or v) for node, v in times.items()}
    return by_kind(med, kinds, "ORT nodes", top)


if __name__ == "__main__":
    raise SystemExit(main())

"""ember's cpu backend against ONNX Runtime's CPU provider, measured side by side in one process.

    PYTHONPATH=src python bench/bench_cpu.py [--models resnet18_b1,mobilenetv2_b1] [--repeat 40] [--threads N]
        [--src OTHER/src]  # measure another checkout's ember (before/after comparisons)
        [--profile 15]   # also the slowest recorded steps of ember's plan, and the time per op kind

The machine may be shared and noisy, so the two engines run interleaved (one ember run, one ORT run, ...) and
the reported ratio is the median of the per-pair ratios; ORT uses `--threads` intra-op threads (default: the
core count, which is what ORT picks by default).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# --src DIR: measure the ember found in DIR instead (another checkout: before/after comparisons).
_SRC = sys.argv[sys.argv.index("--src") + 1] if "--src" in sys.argv else str(ROOT / "src")
sys.path.insert(0, _SRC)

from bench.bench_models import workloads  # noqa: E402

import ember  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet18_b1,mobilenetv2_b1")
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--src", help="import ember from this src directory (default: this checkout's)")
    ap.add_argument("--profile", type=int, default=0, help="show the N slowest steps of ember's plan")
    args = ap.parse_args()

    import onnxruntime as ort

    print(f"ember from {ember.__file__}; onnxruntime {ort.__version__}, {args.threads} intra-op threads; "
          f"numpy {np.__version__}; {os.cpu_count()} cores")
    loads = workloads()
    for name in args.models.split(","):
        path, feeds, _ = loads[name]()
        model = ember.load_onnx(path, backend="cpu")
        so = ort.SessionOptions()
        so.intra_op_num_threads = args.threads
        # Idle ORT workers spin by default, stealing the cores from the ember run interleaved with them
        # (ember measured 2-3x slower); without spinning ORT's own time is unchanged here.
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
        want = sess.run(None, feeds)[0]
        got = model.run(feeds)[next(iter(model.run(feeds)))]
        err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
        for _ in range(3):
            model.run(feeds)
            sess.run(None, feeds)
        te, to, ratios = [], [], []
        for _ in range(args.repeat):
            t = time.perf_counter()
            model.run(feeds)
            a = time.perf_counter() - t
            t = time.perf_counter()
            sess.run(None, feeds)
            b = time.perf_counter() - t
            te.append(a * 1e3)
            to.append(b * 1e3)
            ratios.append(a / b)
        print(f"{name}: ember cpu {statistics.median(te):.2f} ms, ORT {statistics.median(to):.2f} ms, "
              f"ratio (median of pairs) {statistics.median(ratios):.2f}x  [max rel err vs ORT {err:.1e}]")
        if args.profile:
            profile(model, feeds, args.profile)
    return 0


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

"""Two checkouts' cpu backends and ONNX Runtime side by side in ONE process, runs alternating in blocks.

    PYTHONPATH=src python bench/bench_cpu_ab.py --against /work/main/src [--models resnet18_b1] [--blocks 12]

Separate processes (bench_cpu.py --src) each meet the VM in a different state: on this project's 2-core VM
the same code reads 22-27 ms from one process to the next, so a few percent between checkouts only shows when
their runs interleave. The other checkout's `ember` package is copied to a temporary directory as `ember_b` (its
imports are relative) and both are imported; each keeps its own thread pool (the idle one sleeps). As in
bench_cpu.py, each block's first runs are dropped and ratios are of medians (and of p10s) over kept runs.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).parent))

from bench_cpu import pct, timed  # noqa: E402

import ember  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, help="the other checkout's src directory")
    ap.add_argument("--models", default="resnet18_b1")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--drop", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime's intra-op threads")
    ap.add_argument("--swap", action="store_true", help="load and run the other checkout first (the order can "
                    "favour one: two copies of one model differed by up to 4%% in medians, 1%% in p10s)")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="ember_ab_"))
    shutil.copytree(Path(args.against) / "ember", tmp / "ember_b",
                    ignore=shutil.ignore_patterns("__pycache__"))
    sys.path.insert(0, str(tmp))
    import ember_b  # type: ignore[import-not-found]
    import onnxruntime as ort
    from bench.bench_models import workloads

    loads = workloads()
    try:
        for name in args.models.split(","):
            path, feeds, _ = loads[name]()
            so = ort.SessionOptions()
            so.intra_op_num_threads = args.threads
            sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
            want = sess.run(None, feeds)[0]
            runs: dict[str, Callable[[], object]] = {}
            pkgs = [(f"this ({ROOT.name})", ember), (f"against ({args.against})", ember_b)]
            for label, pkg in pkgs[::-1] if args.swap else pkgs:
                model = pkg.load_onnx(path, backend="cpu")
                got = next(iter(model.run(feeds).values()))
                err = float(np.max(np.abs(got - want)) / (np.max(np.abs(want)) + 1e-30))
                print(f"{name} {label}: max rel err vs ORT {err:.1e}")
                runs[label] = partial(model.run, feeds)
            runs["ORT"] = partial(sess.run, None, feeds)
            times: dict[str, list[float]] = {k: [] for k in runs}
            for _ in range(args.blocks):
                for label, fn in runs.items():
                    times[label] += timed(fn, args.block)[args.drop:]
            ort_med, ort_p10 = statistics.median(times["ORT"]), pct(times["ORT"], 10)
            for label, ts in times.items():
                med, p10 = statistics.median(ts), pct(ts, 10)
                print(f"{name} {label}: {med:.2f} ms (p10 {p10:.2f}): ratio to ORT {med / ort_med:.3f} "
                      f"(of p10s {p10 / ort_p10:.3f})")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

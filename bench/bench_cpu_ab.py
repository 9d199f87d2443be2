"""Two checkouts' cpu backends and ONNX Runtime side by side in ONE process, runs interleaved.

    PYTHONPATH=src python bench/bench_cpu_ab.py --against /work/main/src [--models resnet18_b1] [--blocks 12]

Separate processes (bench_cpu.py --src) each meet the VM in a different state: on this project's 2-core VM
the same code reads 22-27 ms from one process to the next, so a few percent between checkouts only shows when
their runs interleave. The other checkout's `ember` package is copied to a temporary directory as `ember_b` (its
imports are relative) and both are imported; each keeps its own thread pool (the idle one sleeps).

A round is `--block` pairs of runs of the two checkouts, one after the other (which goes first alternates),
then a block of ORT runs; the first `--drop` of each are left out (ORT's idle threads spin for a while after a
run and would tax the next runs). The VM has slow stretches (at times its two vCPUs get about one core's time
between them: two threads' products then take as long as one thread's doing both), seconds long: they slow
both runs of a pair alike, so the per-pair ratio of the checkouts is the steadiest figure (2026-11-30: its
quartiles within ~3% where per-block medians spread over 15%). Ratios to ORT are of medians and of p10s.

A round in which processes other than this one took more than --max-foreign of a core (from /proc/stat) is
left out and run again, up to twice the rounds asked for: other users' short jobs.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
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


def busy_ticks() -> tuple[int, int]:
    """(clock ticks every cpu spent busy, ticks this process spent), from /proc (Linux); (0, 0) elsewhere."""
    try:
        with open("/proc/stat") as f:
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, f.readline().split()[1:9])
        with open("/proc/self/stat") as f:
            own = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0, 0
    return user + nice + system + irq + softirq + steal, int(own[11]) + int(own[12])


def pairs(a: Callable[[], object], b: Callable[[], object], n: int) -> tuple[list[float], list[float]]:
    """n runs of each, a and b one after the other, which goes first alternating: ms each."""
    ta, tb = [], []
    for i in range(n):
        for fn, out in ((a, ta), (b, tb)) if i % 2 == 0 else ((b, tb), (a, ta)):
            out += timed(fn, 1)
    return ta, tb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", required=True, help="the other checkout's src directory")
    ap.add_argument("--models", default="resnet18_b1")
    ap.add_argument("--blocks", type=int, default=12)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--drop", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="ONNX Runtime's intra-op threads")
    ap.add_argument("--max-foreign", type=float, default=0.05,
                    help="leave out rounds in which other processes took more than this share of one core")
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
            ratios: list[float] = []  # per pair of runs: the first checkout's time over the second's
            (first, run_a), (second, run_b) = list(runs.items())[:2]
            kept = tried = 0
            hz = os.sysconf("SC_CLK_TCK")
            while kept < args.blocks and tried < 2 * args.blocks:
                tried += 1
                (busy0, own0), t0 = busy_ticks(), time.perf_counter()
                ta, tb = pairs(run_a, run_b, args.block)
                to = timed(runs["ORT"], args.block)
                busy1, own1 = busy_ticks()
                if (busy1 - busy0 - (own1 - own0)) / hz > args.max_foreign * (time.perf_counter() - t0):
                    continue
                kept += 1
                times[first] += ta[args.drop:]
                times[second] += tb[args.drop:]
                times["ORT"] += to[args.drop:]
                ratios += [x / y for x, y in zip(ta[args.drop:], tb[args.drop:], strict=True)]
            print(f"{name}: {kept} rounds kept of {tried} (the rest: others' cpu over {args.max_foreign:.0%} of a "
                  f"core)")
            ort_med, ort_p10 = statistics.median(times["ORT"]), pct(times["ORT"], 10)
            for label, ts in times.items():
                med, p10 = statistics.median(ts), pct(ts, 10)
                print(f"{name} {label}: {med:.2f} ms (p10 {p10:.2f}): ratio to ORT {med / ort_med:.3f} "
                      f"(of p10s {p10 / ort_p10:.3f})")
            print(f"{name} {first} / {second}, per pair of runs: median {statistics.median(ratios):.3f} "
                  f"(p25 {pct(ratios, 25):.3f}, p75 {pct(ratios, 75):.3f}, {len(ratios)} pairs)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Host overhead per step of a model run: what a run costs the CPU beyond the device's work, per recorded step.

    PYTHONPATH=src python bench/bench_host.py [--models chain200,chain8,resnet18_b1] [--repeat 200]
        [--backends wgpu] [--set KEY=VALUE] [--json out.json] [--md out.md]

Per model (fusion off for the chains, so each node is one step), medians of `repeat` runs, µs per step:
  run           Model.run end to end (host arrays in, host arrays out), wall clock
  run_cpu       the same, CPU time of the calling thread only (host work; excludes waiting for the device and,
                on lavapipe, the device's work done by its own threads)
  resident      Model.run on DeviceArray feeds with keep_on_device=True, then ComputeBackend.synchronize: no
                input writes, no readback (what a decode loop of chained models pays)
  resident_cpu  the same, calling thread's CPU time
  gpu           Model.gpu_time (GPU timestamps around one run's command buffer on wgpu; wall around the steps
                elsewhere)
On a software adapter (lavapipe) the device's work runs on the same CPU, so only run_cpu / resident_cpu separate
host cost there. The encode / raw-loop / cffi-floor breakdown of earlier versions reached into the wgpu
backend's internals; its figures are in BENCHMARKS.md. Knobs that change host work (encode_ahead,
wgpu_py_encode, wait_spin_us) are A/B'd in one process by bench_ab.py; --set here scopes them for a whole run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import graphs  # noqa: E402
import harness  # noqa: E402

import ember  # noqa: E402


def measure(name: str, backend: str, args: argparse.Namespace, arm: harness.Arm) -> dict[str, Any]:
    source, feeds, _ = graphs.resolve(name)
    with arm.scope():
        opts = {"fuse": False} if name.startswith("chain") else {}
        be = ember.backend(backend)  # the model's device, for DeviceArray feeds and synchronize
        model = ember.load_onnx(source, backend=be, **{**opts, **arm.load})
        steps = model.plan_info(feeds)["steps"]
        dev = {k: ember.DeviceArray.from_numpy(be, v) for k, v in feeds.items()}

        def resident() -> None:
            model.run(dev, keep_on_device=True)
            be.synchronize()

        def run() -> None:
            model.run(feeds)

        res: dict[str, Any] = {"steps": steps}
        for label, fn in (("run", run), ("resident", resident)):
            for suffix, clock in (("", time.perf_counter), ("_cpu", time.thread_time)):
                st = harness.measure(fn, args.repeat, args.warmup, clock=clock)
                res[label + suffix] = st.median * 1e3 / steps
        try:
            res["gpu"] = model.gpu_time(feeds) * 1e3 / steps
        except Exception as e:  # no timestamp queries on this adapter
            res["gpu"] = f"unavailable: {type(e).__name__}"
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="chain200,chain8")
    harness.add_common(ap, repeat=200, warmup=5)
    harness.add_settings(ap)
    args = ap.parse_args()
    avail = ember.available_backends()
    backends = harness.backend_list(args.backends or ("wgpu" if "wgpu" in avail else "cpu"), avail)
    arm = harness.Arm.parse("run", args.set)
    print(f"ember from {ember.__file__}; settings: {arm.describe()}")
    report = harness.Report(f"Host cost per step, µs (median of {args.repeat}; settings: {arm.describe()})", args,
                            row_key="model · backend", digits=2)
    for name in graphs.expand(args.models):
        for backend in backends:
            r = measure(name, backend, args, arm)
            cells = "  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items())
            print(f"{name:12} {backend:5} µs/step: {cells}", flush=True)
            report.add(f"{name} · {backend}", r)
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

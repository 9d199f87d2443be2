"""Where one Model.run's wall time goes on the wgpu backend: input writes, submit, GPU wait + readback.

    PYTHONPATH=src python bench/bench_run_parts.py [--models resnet18_b8] [--repeat 40]

Replays the plan's run step by step with timers (the same calls Plan.run makes), medians of `repeat`:
  write   writing every input (wgpuQueueWriteBuffer: a memcpy into wgpu's staging memory)
  submit  execute_prepared (submit of the command buffer encoded ahead, then encoding the next one)
  wait    reading the outputs (waits for the GPU, maps the readback buffer, copies out)
and the GPU time of the run's steps (timestamps). Each repetition also times a whole run with the readback wait
spinning (EMBER_WAIT_SPIN_US, the default) and one that blocks in the driver at once, alternately.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

from bench_models import workloads  # noqa: E402

import ember  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="resnet18_b8")
    ap.add_argument("--repeat", type=int, default=40)
    args = ap.parse_args()
    for name in args.models.split(","):
        path, feeds, _ = workloads()[name]()
        model = ember.load_onnx(path, backend="wgpu")
        for _ in range(10):
            model.run(feeds)
        plan = next(iter(model._plans.values()))
        be = plan.backend
        replay, _, readers = plan._readback
        parts: dict[str, list[float]] = {"write": [], "submit": [], "wait": [], "run": [], "run, blocking wait": []}
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            for n, _t, write in plan._writers:
                write(feeds[n])
            t1 = time.perf_counter()
            be.execute_prepared(replay)
            t2 = time.perf_counter()
            for n in readers:
                readers[n]()
            t3 = time.perf_counter()
            parts["write"].append(t1 - t0)
            parts["submit"].append(t2 - t1)
            parts["wait"].append(t3 - t2)
            t4 = time.perf_counter()
            model.run(feeds)
            parts["run"].append(time.perf_counter() - t4)
            with settings.override(wait_spin_us=0):
                t5 = time.perf_counter()
                model.run(feeds)
                parts["run, blocking wait"].append(time.perf_counter() - t5)
        med = {k: statistics.median(v) * 1e3 for k, v in parts.items()}
        gpu = be.gpu_time(plan.steps)
        print(f"{name}: run {med['run']:.3f} ms = write {med['write']:.3f} + submit {med['submit']:.3f} + wait "
              f"{med['wait']:.3f}; GPU {gpu:.3f} ms; run with a blocking wait (no spin) "
              f"{med['run, blocking wait']:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())

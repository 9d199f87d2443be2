"""Where a model's device time goes: ember's whole-run GPU time, its per-step marginal profile, and PyTorch's GPU
time for the same network (CUDA events, input already on the device) when torch has CUDA.

    PYTHONPATH=src python bench/profile_model.py [--models resnet18_b8] [--top 25] [--precision f32]
        [--backend wgpu] [--set winograd=0] [--no-profile] [--json out.json] [--md out.md]

--set scopes ember settings (or load options) for the load and the measurements, so two runs compare
configurations (bench_ab.py --gpu-time compares two in one process); EMBER_* variables are read as usual.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import graphs  # noqa: E402
import harness  # noqa: E402

import ember  # noqa: E402


def torch_gpu_ms(module: Any, feeds: dict, reps: int = 20) -> float | None:
    """Best of `reps` CUDA-event times of one forward, inputs on the device."""
    torch = harness.cuda_torch()
    if module is None or torch is None:
        return None
    mod = module.cuda().eval()
    xs = [torch.from_numpy(v).cuda() for v in feeds.values()]
    with torch.no_grad():
        for _ in range(5):
            mod(*xs)
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            mod(*xs)
            b.record()
            torch.cuda.synchronize()
            best = min(best, a.elapsed_time(b))
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="resnet18_b8")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--precision", default="f32")
    ap.add_argument("--backend", default="wgpu")
    ap.add_argument("--no-profile", action="store_true", help="only the whole-run GPU times")
    harness.add_settings(ap)
    harness.add_common(ap, repeat=3, warmup=1, backends=False)
    args = ap.parse_args()
    arm = harness.Arm.parse("run", [f"precision={args.precision}", *args.set])
    report = harness.Report(f"Device time per run on {args.backend} ({arm.describe()})", args, row_key="model")
    for name in graphs.expand(args.models):
        source, feeds, module = graphs.resolve(name)
        with arm.scope():
            model = ember.load_onnx(source, backend=args.backend, **arm.load)
            for _ in range(args.warmup):
                model.run(feeds)
            info = model.plan_info(feeds)
            print(f"== {name}: {info.get('steps')} steps, stats {model.stats()}")
            times = [model.gpu_time(feeds) for _ in range(max(1, args.repeat))]
            print(f"   ember GPU time per run: {min(times):.3f} ms ({len(times)} calls: "
                  f"{', '.join(f'{t:.3f}' for t in times)})")
            t = torch_gpu_ms(module, feeds)
            if t is not None:
                print(f"   torch eager GPU time (CUDA events, input on device): {t:.3f} ms")
            cells: dict[str, Any] = {"steps": info.get("steps"), "ember ms": min(times), "torch eager ms": t}
            prof: list[tuple[str, float]] = []
            if not args.no_profile:
                prof = model.profile(feeds)
                total = sum(ms for _, ms in prof)
                cells["profile sum ms"] = total
                print(f"   marginal profile: sum {total:.3f} ms; top {args.top}:")
                for label, ms in prof[: args.top]:
                    print(f"     {ms:7.4f} ms  {label}")
        report.add(name, cells, gpu_ms_calls=times, stats=model.stats(), plan_info=info, profile=prof[: args.top],
                   adapter=harness.adapter_name(model.compute_backend))
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

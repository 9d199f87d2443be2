"""Where a model's GPU time goes: ember's whole-run GPU time, its per-step marginal profile, and PyTorch's GPU
time for the same network (CUDA events, input already on the device) when torch has CUDA.

    PYTHONPATH=src python bench/profile_model.py [--models resnet18_b8] [--top 25] [--precision f32]

Env knobs are read as usual (EMBER_WINOGRAD=0|2|4, EMBER_AUTOTUNE, ...), so two runs compare configurations.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

from bench_kernels import cuda_torch  # noqa: E402
from bench_models import workloads  # noqa: E402

import ember  # noqa: E402


def torch_gpu_ms(module, feeds: dict, reps: int = 20) -> float | None:
    torch = cuda_torch()
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
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--models", default="resnet18_b8")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--precision", default="f32")
    ap.add_argument("--no-profile", action="store_true", help="only the whole-run GPU times")
    args = ap.parse_args()
    builders = workloads()
    for name in args.models.split(","):
        path, feeds, module = builders[name]()
        model = ember.load_onnx(path, backend="wgpu", precision=args.precision)
        out = model.run(feeds)
        info = model.plan_info(feeds)
        print(f"== {name}: {info.get('steps')} steps, stats {model.stats()}")
        times = [model.gpu_time(feeds) for _ in range(3)]
        print(f"   ember GPU time per run: {min(times):.3f} ms (3 calls: {', '.join(f'{t:.3f}' for t in times)})")
        t = torch_gpu_ms(module, feeds)
        if t is not None:
            print(f"   torch eager GPU time (CUDA events, input on device): {t:.3f} ms")
        if args.no_profile:
            continue
        prof = model.profile(feeds)
        total = sum(ms for _, ms in prof)
        print(f"   marginal profile: sum {total:.3f} ms; top {args.top}:")
        for label, ms in sorted(prof, key=lambda p: -p[1])[: args.top]:
            print(f"     {ms:7.4f} ms  {label}")
        del out
    return 0


if __name__ == "__main__":
    sys.exit(main())

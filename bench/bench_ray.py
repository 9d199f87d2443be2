"""Ray Data batch inference: ResNet-18 through ember (wgpu, cpu) and PyTorch CUDA in the same pipeline, images/s at
1..N GPUs (one actor per GPU).

    python bench/bench_ray.py [--gpus 1,2,4,8] [--images 8192] [--batch 32] [--size 224]
        [--engines ember-wgpu,torch-cuda] [--precision f32] [--num-cpus N] [--json out.json] [--md out.md]
    # a machine without GPUs (one actor, no GPU resource): a tiny proof run
    python bench/bench_ray.py --gpus 0 --images 128 --size 32 --engines ember-wgpu,ember-cpu

The pipeline: ray.data.range(images) -> random float32 images, made per batch in the workers (the same for every
engine) -> map_batches(predictor, batch_size=batch, one actor per GPU with num_gpus=1; on --gpus 0 one actor, no
GPU) -> consumed by the driver. Per row: images/s over the whole run (actor start and model load included), and
in steady state (from the first batch out to the last). torch-cuda runs only where torch.cuda is available (its
actors see their GPU as cuda:0 through CUDA_VISIBLE_DEVICES, which Ray sets); ember's actors pick their wgpu
adapter from ray.get_gpu_ids() (ember.ray.pick_adapter).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402  (puts this checkout's src and tests on sys.path)

ENGINES = ("ember-wgpu", "ember-cpu", "torch-cuda")
SEED = 18


def resnet18() -> Any:
    from tests.models import zoo

    return zoo.randomize_(zoo.build_resnet18(), SEED, zoo.RESNET_INPUT).eval()


def export(batch: int, size: int) -> Path:
    from tests.models.transformers import export as export_torch

    x = np.random.default_rng(0).random((batch, 3, size, size), dtype=np.float32)
    return export_torch(resnet18(), {"input": x}, f"bench_ray_resnet18_b{batch}_s{size}")


class TorchPredictor:
    """ResNet-18 on the actor's GPU (cuda:0 of what CUDA_VISIBLE_DEVICES leaves), fp32 without TF32 as ember."""

    def __init__(self) -> None:
        self.torch = harness.cuda_torch()
        if self.torch is None:
            raise RuntimeError("torch-cuda: this actor sees no CUDA device")
        self.model = resnet18().cuda()

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self.torch
        with torch.no_grad():
            y = self.model(torch.from_numpy(batch["image"]).cuda()).cpu().numpy()
        return {"y": y}


def images(n: int, size: int) -> Any:
    import ray.data

    def make(batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(int(batch["id"][0]))
        return {"image": rng.random((len(batch["id"]), 3, size, size), dtype=np.float32)}

    return ray.data.range(n).map_batches(make, batch_format="numpy")


def run_pipeline(engine: str, gpus: int, args: argparse.Namespace, model: Path) -> dict[str, float]:
    import ember.ray as er

    actors = max(gpus, 1)
    common = {"batch_format": "numpy", "batch_size": args.batch, "num_gpus": 1 if gpus else 0,
              "num_cpus": args.actor_cpus, **er.actor_pool(actors)}
    ds = images(args.images, args.size)
    if engine.startswith("ember-"):
        ds = ds.map_batches(er.OnnxPredictor, fn_constructor_kwargs={
            "model": str(model), "backend": engine.removeprefix("ember-"), "input_columns": {"image": "input"},
            "precision": args.precision}, **common)
    else:
        ds = ds.map_batches(TorchPredictor, **common)
    t0 = time.perf_counter()
    first = rows = 0
    t_first = t0
    for batch in ds.iter_batches(batch_size=None, batch_format="numpy"):
        n = len(batch["y"])
        if not rows:
            first, t_first = n, time.perf_counter()
        rows += n
    wall = time.perf_counter() - t0
    steady = time.perf_counter() - t_first
    if rows != args.images:
        raise RuntimeError(f"{engine}: {rows} rows out of {args.images}")
    return {"images/s": rows / wall, "images/s steady": (rows - first) / steady if steady > 0 else float("nan"),
            "wall s": wall}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", default=None, help="comma-separated GPU counts (default 1..all GPUs Ray sees; 0: "
                                                 "one actor without a GPU)")
    ap.add_argument("--images", type=int, default=8192)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=224, help="image height and width (224: ImageNet)")
    ap.add_argument("--engines", default="ember-wgpu,torch-cuda", help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--precision", default="f32", choices=("f32", "f16"), help="ember's load option")
    ap.add_argument("--num-cpus", type=int, default=None, help="ray.init's num_cpus (default: all)")
    ap.add_argument("--actor-cpus", type=float, default=1.0, help="CPUs each predictor actor holds")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--md", type=Path)
    args = ap.parse_args()
    if args.images % args.batch:
        ap.error("--images must be a multiple of --batch (the model is exported at batch --batch)")
    engines = [e for e in args.engines.split(",") if e]
    bad = [e for e in engines if e not in ENGINES]
    if bad:
        ap.error(f"unknown engine(s) {bad}; choose from {list(ENGINES)}")

    import ray

    import ember

    # The actors import this script's helpers (harness, tests.models) as the driver does. The variable replaces the
    # workers' PYTHONPATH: keep the driver's, or a Ray installed with --target (the GPU machine) fails to start them.
    parts = [str(p) for p in (harness.ROOT / "src", harness.ROOT, harness.BENCH)]
    path = ":".join(parts + [p for p in os.environ.get("PYTHONPATH", "").split(":") if p and p not in parts])
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    ray.data.DataContext.get_current().enable_progress_bars = False
    seen = int(ray.cluster_resources().get("GPU", 0))
    counts = [int(g) for g in args.gpus.split(",")] if args.gpus else list(range(1, seen + 1)) or [0]
    if max(counts) > seen:
        ap.error(f"--gpus {args.gpus}: Ray sees {seen} GPU(s)")
    report = harness.Report(f"Ray Data, ResNet-18 b{args.batch} at {args.size}x{args.size}, {args.images} images",
                            args, lead=["images/s", "images/s steady"])
    report.note(f"ember adapters: {ember.adapters()}; Ray GPUs: {seen}; actors: one per GPU (0: one actor, no GPU); "
                "images/s counts actor start and model load, steady from the first batch out")
    model = export(args.batch, args.size)
    for engine in engines:
        if engine == "torch-cuda" and harness.cuda_torch() is None:
            report.note("torch-cuda: skipped (torch.cuda is not available)")
            continue
        for gpus in counts:
            if engine == "ember-cpu" and gpus:
                continue
            name = f"{engine}, {gpus} GPU" if gpus else f"{engine}, no GPU"
            print(f"[bench_ray] {name} ...", file=sys.stderr, flush=True)
            report.add(name, run_pipeline(engine, gpus, args, model))
    ray.shutdown()
    report.finish()


if __name__ == "__main__":
    main()

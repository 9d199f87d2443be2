"""Matrix products on the matrix units (Dawn's subgroup matrices) against ember's other kernels and cuBLAS.

    python bench/bench_matrix.py [--sizes 4096x4096x4096,2048x2048x2048,...] [--reps 10] [--tiles 4x4,2x4]
        [--json PATH] [--md PATH]

Each size MxKxN is a one-node ONNX MatMul (A fed, B a constant), timed by Model.gpu_time (GPU timestamps around
one run, min of --reps) in these arms, all in one process:
- `dawn f16 matrix`: a float16 model on Dawn with EMBER_MATRIX=on (matmul_sgmat.py; "-" where the adapter offers no
  f16 -> f32 config), plus one column per --tiles choice (TM x TN accumulator tiles a subgroup, forced);
- `dawn f16 gemm`: the same model with EMBER_MATRIX=off (the register-blocked GEMM in f16);
- `native f32` / `dawn f32`: the float32 model on wgpu-native and on Dawn;
- `torch f16` / `torch f32`: torch.matmul on CUDA (cuBLAS; TF32 off), CUDA events, min of --reps after a warm-up.
Cells are TFLOP/s (2 M N K / time) and milliseconds; each row also gives the matrix kernel's relative error against
float64 on the same f16 inputs, and which arm the plan counted (model.stats()).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as onh

sys.path.insert(0, str(Path(__file__).resolve().parent))
import harness  # noqa: E402

import ember  # noqa: E402
from ember import settings  # noqa: E402
from ember.backends.wgpu import matmul_sgmat  # noqa: E402
from ember.backends.wgpu import matmul_sgmat_staged as staged  # noqa: E402

DEFAULT_SIZES = "4096x4096x4096,2048x2048x2048,1024x1024x1024,512x768x768,512x768x3072,512x3072x768"


def matmul_model(m: int, k: int, n: int, dtype: Any, b: np.ndarray) -> onnx.ModelProto:
    t = onnx.TensorProto.FLOAT16 if dtype == np.float16 else onnx.TensorProto.FLOAT
    x = oh.make_tensor_value_info("a", t, [m, k])
    y = oh.make_tensor_value_info("y", t, [m, n])
    w = onh.from_array(b.astype(dtype), "b")
    return oh.make_model(oh.make_graph([oh.make_node("MatMul", ["a", "b"], ["y"])], "mm", [x], [y], [w]),
                         opset_imports=[oh.make_opsetid("", 17)])


def torch_ms(a: np.ndarray, b: np.ndarray, dtype: str, reps: int) -> float | None:
    torch = harness.cuda_torch()
    if torch is None:
        return None
    ta = torch.from_numpy(a).to("cuda", getattr(torch, dtype))
    tb = torch.from_numpy(b).to("cuda", getattr(torch, dtype))
    for _ in range(3):
        torch.matmul(ta, tb)
    best = float("inf")
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(ta, tb)
        e.record()
        torch.cuda.synchronize()
        best = min(best, s.elapsed_time(e))
    return best


def ember_ms(model: onnx.ModelProto, a: np.ndarray, webgpu: str, reps: int, **scoped: Any) -> tuple[float, Any, dict]:
    with settings.override(**scoped):
        m = ember.load_onnx(model, backend="wgpu", webgpu=webgpu)
        out = m.run({"a": a})["y"]
        ms = m.gpu_time({"a": a}, reps=reps)
        return ms, out, m.stats()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--tiles", default="", help="extra forced tile choices TMxTN for the direct matrix kernel")
    p.add_argument("--staged", default="", help="matmul_sgmat_staged.STAGED_CHOICES indices to force, one column each "
                   "('all': every one), or literal choices SGM.SGN.TM.TN.BK.DOUBLE.PAD (2.2.4.4.32.0.8); adds a "
                   "`direct` column (the unstaged kernel's own choice)")
    p.add_argument("--json")
    p.add_argument("--md")
    args = p.parse_args(argv)
    report = harness.Report("matrix units: f16 MatMul", args)
    rng = np.random.default_rng(0)
    dawn = ember.backend("wgpu", webgpu="dawn")
    print("dawn:", dawn.runtime_info(), "workgroup storage:", dawn.limits.get("max-compute-workgroup-storage-size"))
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",") if t]
    for spec in args.sizes.split(","):
        m, k, n = (int(v) for v in spec.split("x"))
        flop = 2.0 * m * n * k
        a = rng.standard_normal((m, k)).astype(np.float16)
        b = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float16)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        cells: dict[str, Any] = {}

        def put(name: str, ms: float | None, cells: dict[str, Any] = cells, flop: float = flop) -> None:
            cells[f"{name} TFLOP/s"] = None if ms is None else flop / ms / 1e9
            cells[f"{name} ms"] = ms

        f16, f32 = matmul_model(m, k, n, np.float16, b), matmul_model(m, k, n, np.float32, b)
        ms, out, stats = ember_ms(f16, a, "dawn", args.reps, matrix="on")
        taken = stats.get("matmul.subgroup_matrix", 0) > 0
        put("dawn f16 matrix", ms if taken else None)
        cells["matrix rel err"] = float(np.abs(out.astype(np.float64) - ref).max() / np.abs(ref).max())
        saved, saved_staged, saved_choices = matmul_sgmat.TILE_CHOICES, matmul_sgmat.STAGED, staged.STAGED_CHOICES
        picks = list(range(len(saved_choices))) if args.staged == "all" else [
            int(i) if "." not in i else staged.StagedParams(*(int(v) for v in i.split(".")[:5]),
                                                            *(bool(int(v)) if j == 0 else int(v)
                                                              for j, v in enumerate(i.split(".")[5:])))
            for i in args.staged.split(",") if i]
        try:
            matmul_sgmat.STAGED = False  # the direct kernel's own tile sweep
            if picks:
                ms_d, _, st = ember_ms(f16, a, "dawn", args.reps, matrix="on")
                put("direct", ms_d if st.get("matmul.subgroup_matrix", 0) else None)
            for tm, tn in tiles:
                matmul_sgmat.TILE_CHOICES = ((tm, tn),)
                ms_t, _, st = ember_ms(f16, a, "dawn", args.reps, matrix="on")
                put(f"direct {tm}x{tn}", ms_t if st.get("matmul.subgroup_matrix", 0) else None)
            matmul_sgmat.TILE_CHOICES, matmul_sgmat.STAGED = saved, saved_staged
            for i in picks:
                p = saved_choices[i] if isinstance(i, int) else i
                name = f"staged {i}" if isinstance(i, int) else f"staged {p.sgm}x{p.sgn}/{p.tm}x{p.tn}/{p.bk}" + (
                    f"{'d' if p.double else 's'}+{p.pad}")
                staged.STAGED_CHOICES = (p,)
                ms_s, out_s, st = ember_ms(f16, a, "dawn", args.reps, matrix="on")
                # A forced choice that does not fit falls back to the direct kernel (no mark in the counters).
                put(name, ms_s if st.get("matmul.subgroup_matrix", 0) else None)
                cells[f"{name} err"] = float(np.abs(out_s.astype(np.float64) - ref).max() / np.abs(ref).max())
        finally:
            matmul_sgmat.TILE_CHOICES, matmul_sgmat.STAGED, staged.STAGED_CHOICES = saved, saved_staged, saved_choices
        put("dawn f16 gemm", ember_ms(f16, a, "dawn", args.reps, matrix="off")[0])
        put("native f32", ember_ms(f32, a.astype(np.float32), "wgpu-native", args.reps)[0])
        put("dawn f32", ember_ms(f32, a.astype(np.float32), "dawn", args.reps)[0])
        put("torch f16", torch_ms(a, b, "float16", args.reps))
        put("torch f32", torch_ms(a.astype(np.float32), b.astype(np.float32), "float32", args.reps))
        report.add(spec, cells)
        print(spec, {key: harness.fmt(v) for key, v in cells.items()}, flush=True)
    report.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())

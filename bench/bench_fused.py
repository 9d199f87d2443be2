"""Fused transformer kernels against their unfused decompositions, on the wgpu backend.

    python bench/bench_fused.py [--json PATH]

Each case is a small ONNX graph in the form exporters write (decomposed LayerNorm / RMSNorm / GELU / attention,
MatMul + bias + GELU). ember loads it twice: with fusion (the pattern lands on one kernel) and with
`fuse=False` (one kernel per node). Times are the GPU time of a whole run from timestamps around its command
buffer (`model.gpu_time`, min of 20), so host overhead does not blur the comparison.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import ember  # noqa: E402

F = TensorProto.FLOAT


def const(name: str, value: np.ndarray) -> object:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def layernorm_graph(rows: int, n: int) -> tuple:
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["p"]), helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["y0"]), helper.make_node("Mul", ["y0", "g"], ["y1"]),
             helper.make_node("Add", ["y1", "b"], ["y"])]
    inits = [const("two", 2.0), const("eps", 1e-5), const("g", np.ones(n)), const("b", np.zeros(n))]
    return nodes, inits, {"x": (rows, n)}, 13


def rmsnorm_graph(rows: int, n: int) -> tuple:
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]), helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["x", "r"], ["y0"]),
             helper.make_node("Mul", ["y0", "g"], ["y"])]
    return nodes, [const("two", 2.0), const("eps", 1e-6), const("g", np.ones(n))], {"x": (rows, n)}, 13


def matmul_gelu_graph(m: int, k: int, n: int) -> tuple:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"]), helper.make_node("Add", ["h0", "bias"], ["h"]),
             helper.make_node("Mul", ["h", "half"], ["a"]), helper.make_node("Div", ["h", "sqrt2"], ["t"]),
             helper.make_node("Erf", ["t"], ["e"]), helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["a", "e1"], ["y"])]
    inits = [const("w", rng.standard_normal((k, n)) * 0.05), const("bias", rng.standard_normal(n) * 0.1),
             const("half", 0.5), const("sqrt2", np.sqrt(2.0)), const("one", 1.0)]
    return nodes, inits, {"x": (m, k)}, 13


def attention_graph(b: int, h: int, s: int, d: int, sq: int | None = None) -> tuple:
    """softmax(q kᵀ / sqrt(d)) v as exporters write it; `sq` query rows (default s; 1 = decoding)."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Div", ["qk", "scale"], ["sc"]),
             helper.make_node("Softmax", ["sc"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    shape = (b, h, s, d)
    return nodes, [const("scale", np.sqrt(d))], {"q": (b, h, sq or s, d), "k": shape, "v": shape}, 13


def build(case: tuple) -> tuple:
    nodes, inits, inputs, opset = case
    ins = [helper.make_tensor_value_info(n, F, list(s)) for n, s in inputs.items()]
    graph = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", F, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs.items()}
    return model, feeds


def gpu_ms(model: ember.Model, feeds: dict, reps: int = 20) -> float:
    return model.gpu_time(feeds, reps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    cases = {
        "LayerNorm 4096 x 768": layernorm_graph(4096, 768),
        "RMSNorm 4096 x 4096": rmsnorm_graph(4096, 4096),
        "MatMul+bias+GELU 2048 x 768 x 3072": matmul_gelu_graph(2048, 768, 3072),
        "attention 1 x 12 x 1024 x 64": attention_graph(1, 12, 1024, 64),
        "attention 4 x 16 x 512 x 128": attention_graph(4, 16, 512, 128),
    }
    rows = []
    print(f"{'case':40} {'fused ms':>9} {'unfused ms':>11} {'speed-up':>9}  dispatches  stats")
    for name, case in cases.items():
        proto, feeds = build(case)
        fused = ember.load_onnx(proto, backend="wgpu")
        plain = ember.load_onnx(proto, backend="wgpu", fuse=False)
        want = plain.run(feeds)["y"]
        got = fused.run(feeds)["y"]
        err = float(np.abs(got - want).max() / np.abs(want).max())
        f, u = gpu_ms(fused, feeds), gpu_ms(plain, feeds)
        taken = {k: v for k, v in fused.stats().items() if v and k.endswith(".fused")}
        steps = (fused.plan_info()["steps"], plain.plan_info()["steps"])
        print(f"{name:40} {f:9.4f} {u:11.4f} {u / f:8.2f}x  {steps[0]:>3} vs {steps[1]:<3}  {taken} err {err:.1e}")
        rows.append({"case": name, "fused_ms": f, "unfused_ms": u, "dispatches": steps, "taken": taken,
                     "rel_err": err})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

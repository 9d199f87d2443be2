"""Workloads by name for every script: bench_models.py's models, chains, and small synthetic ONNX graphs.

    resolve("resnet18_b1")              # bench_models.workloads(): (path, feeds, torch module)
    resolve("chain200")                 # n elementwise nodes (per-node cost)
    resolve("layernorm:4096x768")       # a graph written the way exporters write the pattern
    expand("fused,resnet18_b1")         # presets ("fused": the five fused-vs-unfused cases) expanded

Synthetic specs, dims joined by "x": layernorm:ROWSxN, rmsnorm:ROWSxN, matmul_gelu:MxKxN, matmul:MxKxN,
attention:BxHxSxD, decode:BxHxSxD (one query row over S keys), conv:NxCxHxKxR[xSTRIDE[xPAD]] (bias constant, the
filter a constant so Winograd is eligible; add "+relu" for the BN-folded ResNet epilogue), reduce:ROWSxN
(ReduceSum over the last axis), unary:N / binary:N (Relu / Add).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from onnx import ModelProto, TensorProto, helper, numpy_helper

F = TensorProto.FLOAT
Case = tuple[list[Any], list[Any], dict[str, tuple[int, ...]], int]  # nodes, initializers, inputs, opset

PRESETS = {"fused": ["layernorm:4096x768", "rmsnorm:4096x4096", "matmul_gelu:2048x768x3072",
                     "attention:1x12x1024x64", "attention:4x16x512x128"]}


def const(name: str, value: Any) -> Any:
    return numpy_helper.from_array(np.asarray(value, np.float32), name)


def layernorm_graph(rows: int, n: int) -> Case:
    nodes = [helper.make_node("ReduceMean", ["x"], ["m"], axes=[-1]), helper.make_node("Sub", ["x", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["p"]), helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["d", "s"], ["y0"]), helper.make_node("Mul", ["y0", "g"], ["y1"]),
             helper.make_node("Add", ["y1", "b"], ["y"])]
    inits = [const("two", 2.0), const("eps", 1e-5), const("g", np.ones(n)), const("b", np.zeros(n))]
    return nodes, inits, {"x": (rows, n)}, 13


def rmsnorm_graph(rows: int, n: int) -> Case:
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]), helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Reciprocal", ["s"], ["r"]), helper.make_node("Mul", ["x", "r"], ["y0"]),
             helper.make_node("Mul", ["y0", "g"], ["y"])]
    return nodes, [const("two", 2.0), const("eps", 1e-6), const("g", np.ones(n))], {"x": (rows, n)}, 13


def matmul_gelu_graph(m: int, k: int, n: int) -> Case:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h0"]), helper.make_node("Add", ["h0", "bias"], ["h"]),
             helper.make_node("Mul", ["h", "half"], ["a"]), helper.make_node("Div", ["h", "sqrt2"], ["t"]),
             helper.make_node("Erf", ["t"], ["e"]), helper.make_node("Add", ["e", "one"], ["e1"]),
             helper.make_node("Mul", ["a", "e1"], ["y"])]
    inits = [const("w", rng.standard_normal((k, n)) * 0.05), const("bias", rng.standard_normal(n) * 0.1),
             const("half", 0.5), const("sqrt2", np.sqrt(2.0)), const("one", 1.0)]
    return nodes, inits, {"x": (m, k)}, 13


def attention_graph(b: int, h: int, s: int, d: int, sq: int | None = None) -> Case:
    """softmax(q kᵀ / sqrt(d)) v as exporters write it; `sq` query rows (default s; 1 = decoding)."""
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]), helper.make_node("Div", ["qk", "scale"], ["sc"]),
             helper.make_node("Softmax", ["sc"], ["p"], axis=-1), helper.make_node("MatMul", ["p", "v"], ["y"])]
    shape = (b, h, s, d)
    return nodes, [const("scale", np.sqrt(d))], {"q": (b, h, sq or s, d), "k": shape, "v": shape}, 13


def matmul_graph(m: int, k: int, n: int) -> Case:
    """Both operands inputs, as the GEMM kernel benchmark feeds them."""
    return [helper.make_node("MatMul", ["a", "b"], ["y"])], [], {"a": (m, k), "b": (k, n)}, 13


def conv_graph(n: int, c: int, h: int, k: int, r: int, stride: int = 1, pad: int | None = None,
               relu: bool = False) -> Case:
    """One Conv with constant filter and bias (as in a BN-folded network: Winograd may take 3x3 stride 1)."""
    rng = np.random.default_rng(0)
    pad = r // 2 if pad is None else pad
    nodes = [helper.make_node("Conv", ["x", "w", "bias"], ["c" if relu else "y"], strides=[stride, stride],
                              pads=[pad] * 4, kernel_shape=[r, r])]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"]))
    inits = [const("w", rng.standard_normal((k, c, r, r)) / np.sqrt(c * r * r)),
             const("bias", rng.standard_normal(k) * 0.1)]
    return nodes, inits, {"x": (n, c, h, h)}, 13


def reduce_graph(rows: int, n: int) -> Case:
    axes = numpy_helper.from_array(np.array([-1], np.int64), "axes")
    return [helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], [axes], {"x": (rows, n)}, 13


def unary_graph(n: int) -> Case:
    return [helper.make_node("Relu", ["x"], ["y"])], [], {"x": (n,)}, 13


def binary_graph(n: int) -> Case:
    return [helper.make_node("Add", ["a", "b"], ["y"])], [], {"a": (n,), "b": (n,)}, 13


def build(case: Case) -> tuple[ModelProto, dict[str, np.ndarray]]:
    """The case as an ONNX model (IR 10: older ONNX Runtime builds read it) and random feeds for it."""
    nodes, inits, inputs, opset = case
    ins = [helper.make_tensor_value_info(n, F, list(s)) for n, s in inputs.items()]
    graph = helper.make_graph(nodes, "g", ins, [helper.make_tensor_value_info("y", F, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    rng = np.random.default_rng(1)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in inputs.items()}
    return model, feeds


def _conv_spec(*d: int, relu: bool = False) -> Case:
    if not 5 <= len(d) <= 7:
        raise ValueError("conv:NxCxHxKxR[xSTRIDE[xPAD]]")
    return conv_graph(*d, relu=relu)


SPECS: dict[str, Callable[..., Case]] = {
    "layernorm": layernorm_graph, "rmsnorm": rmsnorm_graph, "matmul_gelu": matmul_gelu_graph,
    "matmul": matmul_graph, "attention": attention_graph,
    "decode": lambda b, h, s, d: attention_graph(b, h, s, d, sq=1),
    "conv": _conv_spec, "reduce": reduce_graph, "unary": unary_graph, "binary": binary_graph,
}


def expand(names: str) -> list[str]:
    """Comma-separated names with presets replaced by their members."""
    out: list[str] = []
    for name in (n.strip() for n in names.split(",")):
        if name:
            out += PRESETS.get(name, [name])
    return out


def synthetic(spec: str) -> tuple[ModelProto, dict[str, np.ndarray]]:
    kind, _, dims = spec.partition(":")
    relu = dims.endswith("+relu")
    dims = dims.removesuffix("+relu")
    builder = SPECS.get(kind)
    if builder is None:
        raise KeyError(f"unknown graph kind {kind!r}; known: {', '.join(SPECS)}")
    values = [int(v) for v in dims.split("x")]
    return build(builder(*values, relu=True) if relu else builder(*values))


def resolve(name: str) -> tuple[Path | ModelProto, dict[str, np.ndarray], Any]:
    """(model for load_onnx, feeds, torch module or None) for a workload name (see the module doc)."""
    if ":" in name:
        model, feeds = synthetic(name)
        return model, feeds, None
    import bench_models

    if name.startswith("chain") and name[5:].isdigit():
        path, feeds = bench_models.chain_model(int(name[5:]))
        return path, feeds, None
    loads = bench_models.workloads()
    if name not in loads:
        raise KeyError(f"unknown model {name!r}; known: {', '.join(loads)}, chainN, or a synthetic spec "
                       f"({', '.join(SPECS)}:AxB...)")
    return loads[name]()

"""Every wgpu kernel family on float16 storage (computed in float32), through one-node ONNX graphs.

Each graph runs as float16 on wgpu and as float32 in ONNX Runtime on the same (float16-exact) values, so the
only expected difference is the final rounding to float16 (2^-11 relative) plus summation order:
|ember - ORT| <= 1e-3 * |ORT| + 2e-3 * max|ORT|. A kernel that read f16 storage as f32 (or wrote it so)
would be off by orders of magnitude. Shapes cover the vec4 and scalar load paths, edge tiles, split K,
strided (transposed) operands, and the epilogues.
"""

from __future__ import annotations

import zlib

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import settings
from ember.model import shared_backend

F16, F32 = TensorProto.FLOAT16, TensorProto.FLOAT

# name: (nodes, {input: shape}, {initializer: shape}, opset)
CASES = {
    "matmul_vec4": ([("MatMul", ["a", "b"], {})], {"a": (64, 96), "b": (96, 128)}, {}, 17),
    "matmul_odd_edges": ([("MatMul", ["a", "b"], {})], {"a": (33, 29), "b": (29, 17)}, {}, 17),
    "matmul_split_k": ([("MatMul", ["a", "b"], {})], {"a": (8, 4096), "b": (4096, 8)}, {}, 17),
    "gemv_quads_split_k": ([("MatMul", ["a", "w"], {})], {"a": (1, 3072)}, {"w": (3072, 128)}, 17),
    "gemv_rows": ([("Gemm", ["a", "w", "c"], {})], {"a": (3, 300)}, {"w": (300, 37), "c": (37,)}, 17),
    "gemv_transposed": ([("Gemm", ["a", "w"], {"transB": 1})], {"a": (2, 520)}, {"w": (64, 520)}, 17),
    "matmul_batched": ([("MatMul", ["a", "b"], {})], {"a": (3, 20, 36), "b": (3, 36, 24)}, {}, 17),
    "gemm_transb_bias": ([("Gemm", ["a", "w", "c"], {"transB": 1, "alpha": 0.5})], {"a": (10, 48)},
                         {"w": (40, 48), "c": (40,)}, 17),
    "matmul_strided_a": ([("Transpose", ["a"], {"perm": [1, 0]}), ("MatMul", ["t0", "b"], {})],
                         {"a": (24, 18), "b": (24, 12)}, {}, 17),
    "conv3x3_s2_bias_relu": ([("Conv", ["x", "w", "c"], {"pads": [1, 1, 1, 1], "strides": [2, 2]}),
                              ("Relu", ["t0"], {})], {"x": (2, 5, 13, 11)}, {"w": (12, 5, 3, 3), "c": (12,)}, 17),
    "conv1x1": ([("Conv", ["x", "w"], {})], {"x": (2, 16, 7, 7)}, {"w": (24, 16, 1, 1)}, 17),
    "conv7x7_s2_stem": ([("Conv", ["x", "w", "c"], {"pads": [3, 3, 3, 3], "strides": [2, 2]}),
                         ("Relu", ["t0"], {})], {"x": (2, 3, 30, 26)}, {"w": (32, 3, 7, 7), "c": (32,)}, 17),
    "conv3x3_winograd_f2": ([("Conv", ["x", "w", "c"], {"pads": [1, 0, 2, 1]}), ("Relu", ["t0"], {})],
                            {"x": (2, 12, 11, 9)}, {"w": (16, 12, 3, 3), "c": (16,)}, 17),
    "conv3x3_winograd_f4": ([("Conv", ["x", "w", "c"], {"pads": [1, 0, 2, 1]}), ("Relu", ["t0"], {})],
                            {"x": (2, 12, 11, 9)}, {"w": (16, 12, 3, 3), "c": (16,)}, 17),
    "conv_depthwise": ([("Conv", ["x", "w"], {"group": 8, "pads": [1, 1, 1, 1]})], {"x": (1, 8, 9, 9)},
                       {"w": (8, 1, 3, 3)}, 17),
    "conv_grouped": ([("Conv", ["x", "w"], {"group": 2})], {"x": (1, 8, 6, 6)}, {"w": (6, 4, 3, 3)}, 17),
    "maxpool": ([("MaxPool", ["x"], {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]})],
                {"x": (2, 4, 11, 11)}, {}, 17),
    "avgpool": ([("AveragePool", ["x"], {"kernel_shape": [2, 2], "strides": [2, 2]})], {"x": (2, 4, 8, 8)}, {}, 17),
    "global_avgpool": ([("GlobalAveragePool", ["x"], {})], {"x": (2, 6, 7, 7)}, {}, 17),
    "reduce_mean_long": ([("ReduceMean", ["x"], {"axes": [1], "keepdims": 0})], {"x": (3, 50000)}, {}, 13),
    "reduce_sum_strided": ([("ReduceSum", ["x", "ax"], {"keepdims": 1})], {"x": (5, 64, 3)}, {"ax": None}, 17),
    "softmax": ([("Softmax", ["x"], {"axis": -1})], {"x": (6, 100)}, {}, 17),
    "layernorm": ([("LayerNormalization", ["x", "s", "b"], {"axis": -1})], {"x": (4, 96)}, {"s": (96,), "b": (96,)},
                  17),
    "elementwise_chain": ([("Mul", ["x", "y"], {}), ("Sigmoid", ["t0"], {}), ("Add", ["t1", "x"], {})],
                          {"x": (3, 40), "y": (1, 40)}, {}, 17),
    "concat_slice_transpose": ([("Concat", ["x", "y"], {"axis": 1}), ("Transpose", ["t0"], {"perm": [1, 0]})],
                               {"x": (5, 6), "y": (5, 3)}, {}, 17),
    "attention": ([("Transpose", ["k"], {"perm": [0, 1, 3, 2]}), ("MatMul", ["q", "t0"], {}),
                   ("Div", ["t1", "d"], {}), ("Softmax", ["t2"], {"axis": -1}), ("MatMul", ["t3", "v"], {})],
                  {"q": (1, 2, 20, 16), "k": (1, 2, 20, 16), "v": (1, 2, 20, 16)}, {"d": ()}, 17),
}

# Cases run with EMBER_WINOGRAD forcing a Winograd tile (f16 x / out around f32 scratch; the planner keeps the
# transformed filter U in f32, so F(4, 3) is held to the same bound as every other kernel).
WINOGRAD = {"conv3x3_winograd_f2": 2, "conv3x3_winograd_f4": 4}
MAX_TERM: dict[str, float] = {}
# The matrix-vector kernel each GEMV case takes (f16 weights in quads, one element a load, transposed in quads of
# k) and whether it splits K.
GEMV = {"gemv_quads_split_k": ("matmul_gemv.rows4", True), "gemv_rows": ("matmul_gemv.rows", True),
        "gemv_transposed": ("matmul_gemv.cols4", False)}


def build(name: str, elem: int) -> tuple:
    nodes_spec, inputs, inits, opset = CASES[name]
    rng = np.random.default_rng(zlib.crc32(name.encode()))
    dtype = np.float16 if elem == F16 else np.float32
    nodes, prev = [], None
    for i, (op, ins, attrs) in enumerate(nodes_spec):
        out = f"t{i}" if i < len(nodes_spec) - 1 else "out"
        nodes.append(helper.make_node(op, ins, [out], **attrs))
        prev = out
    assert prev == "out"
    tensors = []
    for n, shape in inits.items():
        if shape is None:  # ReduceSum's axes
            tensors.append(numpy_helper.from_array(np.array([1], np.int64), n))
        elif n == "d":
            tensors.append(numpy_helper.from_array(np.array(4.0, dtype), n))
        else:
            tensors.append(numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float16).astype(dtype),
                                                   n))
    graph = helper.make_graph(nodes, name, [helper.make_tensor_value_info(n, elem, list(s)) for n, s in inputs.items()],
                              [helper.make_tensor_value_info("out", elem, None)], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    feeds = {n: rng.standard_normal(s).astype(np.float16) for n, s in inputs.items()}
    return model, feeds


@pytest.mark.parametrize("name", sorted(CASES))
def test_f16_kernel_matches_f32_reference(name: str) -> None:
    with settings.override(winograd=WINOGRAD.get(name)):
        check_f16_kernel(name)


def check_f16_kernel(name: str) -> None:
    be = shared_backend("wgpu")
    be._require_init()
    m16, feeds = build(name, F16)
    if "shader-f16" not in be.features:
        with pytest.raises(NotImplementedError, match="shader-f16"):
            ember.load_onnx(m16, backend="wgpu").run(feeds)
        return
    m32, _ = build(name, F32)
    ref = ort.InferenceSession(m32.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {k: v.astype(np.float32) for k, v in feeds.items()})[0].astype(np.float64)
    recorded: list[str] = []
    dispatch = be.dispatch
    be.dispatch = lambda *a, **kw: (recorded.append(a[3]), dispatch(*a, **kw))[1]  # type: ignore[method-assign]
    try:
        model = ember.load_onnx(m16, backend="wgpu")
        got = model.run(feeds)["out"]
    finally:
        del be.dispatch
    if name in GEMV:
        kernel, split = GEMV[name]
        assert kernel in [r.split(":")[0] for r in recorded], recorded
        assert ("matmul_gemv:splitk_reduce" in recorded) == split, recorded
    assert got.dtype == np.float16 and got.shape == ref.shape
    err = np.abs(got.astype(np.float64) - ref)
    if name in WINOGRAD:
        assert model.plan_info(feeds).get("conv.winograd") == 1
    tol = 1e-3 * np.abs(ref) + MAX_TERM.get(name, 2e-3) * float(np.abs(ref).max())
    worst = int(np.argmax(err - tol))
    assert (err <= tol).all(), f"{name}: |ember - ORT| {err.flat[worst]:.3g} > {tol.flat[worst]:.3g} at {worst}"

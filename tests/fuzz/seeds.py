"""The small valid models the fuzzers start from, and feeds that fit them."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


def _model(nodes: list[onnx.NodeProto], inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto],
           inits: list[onnx.TensorProto]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "fuzz_seed", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)


def conv_relu_gap() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("GlobalAveragePool", ["r"], ["y"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 1, 1])], [w, b])


def matmul_add_softmax() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(5).astype(np.float32), "b")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"]),
        helper.make_node("Add", ["m", "b"], ["a"]),
        helper.make_node("Softmax", ["a"], ["y"], axis=-1),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", 6])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", 5])], [w, b])


def gather_reshape_transpose() -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    table = numpy_helper.from_array(rng.standard_normal((10, 4)).astype(np.float32), "table")
    shape = numpy_helper.from_array(np.array([2, 3, 4], dtype=np.int64), "shape")
    nodes = [
        helper.make_node("Gather", ["table", "idx"], ["g"], axis=0),
        helper.make_node("Reshape", ["g", "shape"], ["r"]),
        helper.make_node("Transpose", ["r"], ["y"], perm=[2, 0, 1]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("idx", TensorProto.INT64, [6])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 2, 3])], [table, shape])


def shape_arith() -> onnx.ModelProto:
    """Shape -> Slice -> Concat -> Expand: shape arithmetic on int64 tensors, then a data Slice."""
    i64 = np.int64
    inits = [numpy_helper.from_array(np.array(v, dtype=i64), n) for n, v in [
        ("s0", [0]), ("s1", [1]), ("ax0", [0]), ("four", [4]), ("st", [1]), ("ends", [3]), ("ax1", [1])]]
    nodes = [
        helper.make_node("Shape", ["x"], ["sh"]),
        helper.make_node("Slice", ["sh", "s0", "s1", "ax0"], ["n"]),
        helper.make_node("Concat", ["n", "four"], ["target"], axis=0),
        helper.make_node("Slice", ["x", "s1", "ends", "ax1", "st"], ["xs"]),
        helper.make_node("ReduceSum", ["xs", "ax1"], ["col"], keepdims=1),
        helper.make_node("Expand", ["col", "target"], ["y"]),
    ]
    return _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 5])],
                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])], inits)


SEEDS: dict[str, Callable[[], onnx.ModelProto]] = {
    "conv_relu_gap": conv_relu_gap,
    "matmul_add_softmax": matmul_add_softmax,
    "gather_reshape_transpose": gather_reshape_transpose,
    "shape_arith": shape_arith,
}

"""Regression tests for the faults the fuzzers found, in-process on every backend."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

from .seeds import OPSET, conv_relu_gap, shape_arith


def _load(m: onnx.ModelProto, backend: str) -> ember.Model:
    return ember.load_onnx(m.SerializeToString(), backend=backend)


def _conv_attr(m: onnx.ModelProto, name: str, values: list[int]) -> onnx.ModelProto:
    conv = m.graph.node[0]
    for a in conv.attribute:
        if a.name == name:
            conv.attribute.remove(a)
    conv.attribute.append(helper.make_attribute(name, values))
    return m


@pytest.mark.parametrize("name, values", [("pads", [1, 1]), ("pads", [1, -1, 1, 1]), ("strides", [1]),
                                          ("strides", [0, 1]), ("dilations", [1, 1, 1]), ("dilations", [0, 1])])
def test_conv_bad_window_attribute_is_value_error(backend_name: str, name: str, values: list[int]) -> None:
    # Was: IndexError (pads shorter than 2 * rank) or ZeroDivisionError (stride 0) while planning. Now shape
    # inference refuses most at load; ember's own check names the rest at the first run.
    with pytest.raises(ValueError, match=name):
        _load(_conv_attr(conv_relu_gap(), name, values), backend_name).run({"x": np.zeros((1, 3, 8, 8), np.float32)})


def test_conv_empty_batch(backend_name: str) -> None:
    # Was: AssertionError in the cpu backend's conv kernel for a batch of 0.
    out = _load(conv_relu_gap(), backend_name).run({"x": np.zeros((0, 3, 8, 8), np.float32)})["y"]
    assert out.shape == (0, 4, 1, 1)


def test_global_pool_rank1_is_value_error(backend_name: str) -> None:
    # Was: IndexError in View.permute.
    graph = helper.make_graph([helper.make_node("GlobalAveragePool", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    with pytest.raises(ValueError, match="rank"):
        _load(m, backend_name).run({"x": np.zeros(4, np.float32)})


def test_initializer_unknown_data_type_is_value_error(backend_name: str) -> None:
    # Was: KeyError from onnx.numpy_helper.
    m = conv_relu_gap()
    m.graph.initializer[0].data_type = 999
    with pytest.raises(ValueError, match="data_type 999"):
        _load(m, backend_name)


def test_non_utf8_op_type_is_value_error(backend_name: str) -> None:
    # Was: TypeError from onnx.defs.get_schema (protobuf hands an invalid UTF-8 string over as bytes).
    data = shape_arith().SerializeToString()
    assert data.count(b"Concat") == 1
    with pytest.raises(ValueError, match="UTF-8"):
        ember.load_onnx(data.replace(b"Concat", b"Conc\xe1t"), backend=backend_name)


def test_slice_step_past_the_dim(backend_name: str) -> None:
    # Was: OverflowError in numpy's as_strided (the view's stride: step * stride past int64).
    m = shape_arith()
    for i, t in enumerate(m.graph.initializer):
        if t.name == "st":
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(np.array([2**62], np.int64), "st"))
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    out = _load(m, backend_name).run({"x": x})["y"]
    np.testing.assert_allclose(out, np.broadcast_to(x[:, 1:2], (2, 4)))


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand", "Reshape"])
def test_a_shape_of_more_than_64_dims_is_not_supported(backend_name: str, op: str) -> None:
    # Was (the long run, 2026-12-02): numpy's "maximum supported dimension for an ndarray is currently 64" escaping
    # ConstantOfShape's fold. The shape is a graph input, so neither load nor shape inference sees its length.
    s = helper.make_tensor_value_info("s", TensorProto.INT64, [108])
    x = numpy_helper.from_array(np.ones(1, np.float32), "x")
    node = helper.make_node(op, ["s"] if op == "ConstantOfShape" else ["x", "s"], ["y"], name="n")
    graph = helper.make_graph([node], "g", [s], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [] if op == "ConstantOfShape" else [x])
    model = _load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), backend_name)
    with pytest.raises(NotImplementedError, match="the shape input has 108 dims; at most 64"):
        model.run({"s": np.ones(108, np.int64)})

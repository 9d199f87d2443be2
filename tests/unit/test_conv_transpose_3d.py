"""3-D ConvTranspose (ops/conv_transpose.py: a sum over the kernel's depth taps of 2-D convolutions) against ONNX
Runtime: strides, dilations, pads, output_padding, groups and a bias."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

ort = pytest.importorskip("onnxruntime")


@pytest.mark.parametrize(("attrs", "groups", "bias"), [
    ({}, 1, False),
    ({"strides": [2, 1, 2], "pads": [1, 0, 1, 0, 1, 1], "output_padding": [1, 0, 0]}, 1, True),
    ({"dilations": [2, 1, 1], "strides": [1, 2, 1]}, 2, True),
], ids=["plain", "strided_padded", "dilated_grouped"])
def test_conv_transpose_3d_matches_onnxruntime(backend_name: str, attrs: dict, groups: int, bias: bool) -> None:
    rng = np.random.default_rng(3)
    c, m = 4, 3
    x = rng.standard_normal((2, c, 3, 4, 3)).astype(np.float32)
    w = rng.standard_normal((c, m, 3, 2, 3)).astype(np.float32)
    inits = [numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(m * groups).astype(np.float32), "b"))
        ins.append("b")
    node = helper.make_node("ConvTranspose", ins, ["y"], group=groups, **attrs)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x.shape))],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    m_proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    want = ort.InferenceSession(m_proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = ember.load_onnx(m_proto, backend=backend_name).run({"x": x})["y"]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

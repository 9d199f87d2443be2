"""Plans made from templates (ember/plan/fit.py, template.py, tape.py): the fits are exact, a value off the fit's
domain is planned instead, and every plan a template makes equals a traced build of its shapes and ONNX Runtime's
results, on shapes whose sizes move as lines, parabolas and floor divisions."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.plan.fit import at, fit
from ember.plan.tape import Refused
from ember.plan.template import Mismatch

ort = pytest.importorskip("onnxruntime")


def test_fits_are_exact_polynomials_through_their_points() -> None:
    assert fit([7, 7], [2, 5]) == ("c", 7)
    line = fit([10, 16], [3, 5])  # 3v + 1
    assert [at(line, v) for v in (3, 4, 100)] == [10, 13, 301]
    square = fit([4, 9, 16], [2, 3, 4])  # v²
    assert at(square, 50) == 2500
    half = fit([1, 2], [2, 4])  # v / 2: not whole at odd v
    assert at(half, 10) == 5
    with pytest.raises(Mismatch):
        at(half, 7)
    arr = fit([np.array([2, 0, 5]), np.array([3, 0, 5])], [2, 3])  # position ids and a Shape's dims
    np.testing.assert_array_equal(at(arr, 9), [9, 0, 5])
    assert at(fit([0.5, 0.75], [2, 3]), 4) == pytest.approx(1.0)
    with pytest.raises(Refused):
        fit([np.zeros(2), np.zeros(3)], [2, 3])
    assert isinstance(fit([Fraction(1), Fraction(1)], [2, 3])[1], Fraction)


def _model(nodes: list, inputs: list, outputs: list, inits: list | None = None) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def _check_many(model: bytes, feeds: list[dict], backend: str) -> dict:
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    m = ember.load_onnx(model, backend=backend)
    with ember.settings.override(template_check=True):
        for i, f in enumerate(feeds):
            got = m.run(f)
            for name, want in zip([o.name for o in sess.get_outputs()], sess.run(None, f), strict=True):
                np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=f"feed {i}")
    return m.cache_info()


def test_strided_conv_over_image_sizes_matches_onnxruntime(backend_name: str) -> None:
    # Output sizes floor((H - 3) / 2) + 1: not a polynomial in H; the fit must never serve a size it gets wrong.
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    model = _model([helper.make_node("Conv", ["x", "w"], ["c"], strides=[2, 2]),
                    helper.make_node("Relu", ["c"], ["r"]),
                    helper.make_node("ReduceMean", ["r"], ["y"], axes=[2], keepdims=0)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "h", 9])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    feeds = [{"x": rng.standard_normal((1, 3, h, 9)).astype(np.float32)} for h in (8, 10, 12, 9, 14, 11, 21, 30)]
    info = _check_many(model, feeds, backend_name)
    assert info["builds"] + info["from_template"] == len(feeds)


def test_attention_like_scores_over_lengths_are_parabolas(backend_name: str) -> None:
    # scores = x·xᵀ over a length L: L² elements, then a softmax and a position table sliced to L.
    rng = np.random.default_rng(1)
    pos = numpy_helper.from_array(rng.standard_normal((64, 8)).astype(np.float32), "pos")
    inits = [pos, numpy_helper.from_array(np.array([0], np.int64), "zero"),
             numpy_helper.from_array(np.array([1], np.int64), "one")]
    nodes = [helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Gather", ["s", "one"], ["n"], axis=0),
             helper.make_node("Slice", ["pos", "zero", "n"], ["p"]), helper.make_node("Add", ["x", "p"], ["h"]),
             helper.make_node("Transpose", ["h"], ["ht"], perm=[0, 2, 1]),
             helper.make_node("MatMul", ["h", "ht"], ["sc"]), helper.make_node("Softmax", ["sc"], ["pr"], axis=-1),
             helper.make_node("MatMul", ["pr", "h"], ["y"])]
    model = _model(nodes, [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "L", 8])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    lengths = [5, 9, 7, 20, 33, 12, 64, 2, 1]
    info = _check_many(model, [{"x": rng.standard_normal((1, n, 8)).astype(np.float32)} for n in lengths],
                       backend_name)
    # 5, 9 and 7 fit a parabola, 20 verifies it; 2 and 1 (a dim of 0 or 1 plans apart) are their own.
    assert info["from_template"] >= 3, info


def test_two_dims_moving_apart_stay_correct(backend_name: str) -> None:
    rng = np.random.default_rng(2)
    w = numpy_helper.from_array(rng.standard_normal((6, 5)).astype(np.float32), "w")
    model = _model([helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["b", "s", 6])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w])
    shapes = [(2, 3), (2, 4), (2, 5), (2, 9), (3, 4), (4, 4), (5, 4), (6, 4), (3, 3), (2, 3), (7, 7)]
    info = _check_many(model, [{"x": rng.standard_normal((b, s, 6)).astype(np.float32)} for b, s in shapes],
                       backend_name)
    # Two lines (s at b = 2: (2, 5) verifies it, then it serves (2, 9); b at s = 4: (5, 4) verifies it, then it
    # serves (6, 4)), each fitted to two builds; the shapes off both lines are planned. A line's shapes share its
    # live plan.
    assert info["from_template"] == 4 and info["builds"] == 6 and info["plans"] == 8, info


def test_templates_off_plans_every_shape() -> None:
    rng = np.random.default_rng(3)
    model = _model([helper.make_node("Relu", ["x"], ["y"])],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n"])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    m = ember.load_onnx(model, backend="cpu")
    with ember.settings.override(templates=False):
        for n in range(2, 10):
            x = rng.standard_normal(n).astype(np.float32)
            np.testing.assert_array_equal(m.run({"x": x})["y"], np.maximum(x, 0))
    assert m.cache_info()["builds"] == 8 and m.cache_info()["from_template"] == 0

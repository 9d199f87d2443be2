"""Ops whose output shape depends on the data (NonZero, NonMaxSuppression): the graph runs in stages (plan/
stages.py), the op on the host between them, compared with ONNX Runtime on every backend."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

from .test_control_flow import compare, model, vi

ort = pytest.importorskip("onnxruntime")


def threshold_gather() -> onnx.ModelProto:
    """The detection post-processing shape: scores above a threshold -> NonZero -> GatherND -> more work."""
    nodes = [helper.make_node("Greater", ["x", "thr"], ["m"]), helper.make_node("NonZero", ["m"], ["idx"]),
             helper.make_node("Transpose", ["idx"], ["idx_t"], perm=[1, 0]),
             helper.make_node("GatherND", ["x", "idx_t"], ["sel"]), helper.make_node("Mul", ["sel", "two"], ["y"])]
    inits = [numpy_helper.from_array(np.float32(0.3), "thr"), numpy_helper.from_array(np.float32(2), "two")]
    return model(nodes, [vi("x", shape=["N", 5])], [vi("y"), vi("idx", TensorProto.INT64)], inits)


def test_nonzero_then_device_work(backend_name: str) -> None:
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.random((n, 5)).astype(np.float32)} for n in (1, 3, 4, 3)]
    feeds.append({"x": np.zeros((2, 5), np.float32)})  # nothing selected: empty outputs
    em = compare(threshold_gather(), backend_name, feeds)
    info = em.plan_info(feeds[0])
    assert info["stages"] == 2 and info["host_nodes"] == ["NonZero_1"]
    assert em.cache_info()["bytes"] > 0


def test_staged_outputs_stay_on_the_device(backend_name: str) -> None:
    em = ember.load_onnx(threshold_gather(), backend=backend_name)
    x = np.random.default_rng(1).random((3, 5)).astype(np.float32)
    got = em.run({"x": x}, keep_on_device=True)
    assert all(isinstance(v, ember.DeviceArray) for v in got.values())
    np.testing.assert_array_equal(got["y"].numpy(), em.run({"x": x})["y"])
    assert [label for label, _ in em.profile({"x": x})]


def nms_model(center_point_box: int) -> onnx.ModelProto:
    nodes = [helper.make_node("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "score_min"], ["sel"],
                              center_point_box=center_point_box),
             helper.make_node("Gather", ["sel", "two"], ["box_index"], axis=1)]
    inits = [numpy_helper.from_array(np.array([4], np.int64), "max_out"),
             numpy_helper.from_array(np.array([0.4], np.float32), "iou"),
             numpy_helper.from_array(np.array([0.2], np.float32), "score_min"),
             numpy_helper.from_array(np.array(2, np.int64), "two")]
    return model(nodes, [vi("boxes", shape=["B", "N", 4]), vi("scores", shape=["B", 3, "N"])],
                 [vi("sel", TensorProto.INT64), vi("box_index", TensorProto.INT64)], inits)


@pytest.mark.parametrize("center_point_box", [0, 1])
def test_non_max_suppression(backend_name: str, center_point_box: int) -> None:
    rng = np.random.default_rng(2)
    feeds = []
    for b, n in ((1, 10), (2, 40), (1, 1)):
        xy, wh = rng.random((b, n, 2)), rng.random((b, n, 2)) * 0.5
        boxes = np.concatenate([xy, xy + wh] if center_point_box == 0 else [xy, wh], -1).astype(np.float32)
        scores = rng.random((b, 3, n)).astype(np.float32)
        scores[0, 0, :2] = 0.9  # a tie: the lower index first
        feeds.append({"boxes": boxes, "scores": scores})
    compare(nms_model(center_point_box), backend_name, feeds)


def test_non_max_suppression_bad_boxes_name_the_node() -> None:
    m = nms_model(0)
    for i in m.graph.input:  # no declared shapes: the op's own check sees the mismatch
        i.type.tensor_type.ClearField("shape")
    em = ember.load_onnx(m, backend="cpu")
    with pytest.raises(ValueError, match=r"NonMaxSuppression .*boxes must be \[batch, n, 4\] and scores"):
        em.run({"boxes": np.zeros((1, 4, 4), np.float32), "scores": np.zeros((1, 3, 5), np.float32)})


def test_nonzero_of_constants_folds_without_stages() -> None:
    nodes = [helper.make_node("NonZero", ["c"], ["idx"]), helper.make_node("Cast", ["idx"], ["f"], to=1),
             helper.make_node("ReduceSum", ["f"], ["s"], keepdims=0), helper.make_node("Add", ["x", "s"], ["y"])]
    c = numpy_helper.from_array(np.array([[0, 1], [1, 1]], np.float32), "c")
    em = ember.load_onnx(model(nodes, [vi("x", shape=[2])], [vi("y")], [c]), backend="cpu")
    np.testing.assert_allclose(em.run({"x": np.zeros(2, np.float32)})["y"], [4.0, 4.0])  # indices 0,1,1 / 1,0,1
    assert "stages" not in em.plan_info()


@pytest.mark.parametrize("sorted_", [1, 0])
def test_unique_then_device_work(backend_name: str, sorted_: int) -> None:
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("Unique", ["r"], ["u", "first", "inverse", "counts"], sorted=sorted_),
             helper.make_node("Mul", ["u", "u"], ["y"])]
    m = model(nodes, [vi("x", shape=["N"])], [vi("y"), vi("first", TensorProto.INT64),
                                              vi("inverse", TensorProto.INT64), vi("counts", TensorProto.INT64)])
    rng = np.random.default_rng(3)
    compare(m, backend_name, [{"x": rng.integers(-3, 4, n).astype(np.float32)} for n in (1, 7, 12)])


def test_strings_run_on_the_host_and_are_listed(backend_name: str) -> None:
    """StringConcat -> LabelEncoder (string -> int) -> device work: a string input, host steps listed."""
    suffix = numpy_helper.from_array(np.array(["_x"], dtype=object), "suffix")
    nodes = [helper.make_node("StringConcat", ["s", "suffix"], ["n"]),
             helper.make_node("LabelEncoder", ["n"], ["ids"], domain="ai.onnx.ml", keys_strings=["a_x", "b_x", "c_x"],
                              values_int64s=[1, 2, 3], default_int64=0),
             helper.make_node("Cast", ["ids"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "f"], ["y"])]
    graph = helper.make_graph(nodes, "g", [vi("s", TensorProto.STRING, ["N"])], [vi("y"), vi("n", TensorProto.STRING)],
                              [suffix])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ai.onnx.ml", 2)])
    feeds = [{"s": np.array(["a", "b", "zz", "c"], dtype=object)}, {"s": np.array(["c"], dtype=object)}]
    em = ember.load_onnx(m, backend=backend_name)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for f in feeds:
        got, want = em.run(f), sess.run(None, f)
        np.testing.assert_array_equal(got["y"], want[0])
        assert list(got["n"]) == list(want[1])
    assert em.plan_info(feeds[0])["host_nodes"] == ["StringConcat_0", "LabelEncoder_1"]


def test_sequences_between_device_work(backend_name: str) -> None:
    """Relu -> SplitToSequence -> SequenceAt / ConcatFromSequence -> device work; a sequence output is a list."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("SplitToSequence", ["r"], ["seq"], axis=0, keepdims=1),
             helper.make_node("SequenceAt", ["seq", "one"], ["row"]),
             helper.make_node("ConcatFromSequence", ["seq"], ["cat"], axis=1),
             helper.make_node("Add", ["row", "row"], ["y"])]
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    seq_out = helper.make_tensor_sequence_value_info("seq", TensorProto.FLOAT, None)
    m = model(nodes, [vi("x", shape=["N", 3])], [vi("y"), vi("cat"), seq_out], [one])
    em = ember.load_onnx(m, backend=backend_name)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    x = np.random.default_rng(4).standard_normal((3, 3)).astype(np.float32)
    got, want = em.run({"x": x}), sess.run(None, {"x": x})
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-6)
    np.testing.assert_allclose(got["cat"], want[1], rtol=1e-6)
    assert isinstance(got["seq"], list) and len(got["seq"]) == 3
    for a, b in zip(got["seq"], want[2], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)

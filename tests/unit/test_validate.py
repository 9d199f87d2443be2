"""Malformed graphs are refused at load with a ValueError naming the node and the input, not at their first run;
external data and inputs whose shapes the model leaves open load."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

X = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])  # symbolic: no plan is built at load
Y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)


def model(nodes: list, outputs: list | None = None, inits: list | None = None) -> bytes:
    graph = helper.make_graph(nodes, "g", [X], outputs or [Y], inits or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


def test_input_of_no_producer() -> None:
    bad = model([helper.make_node("Add", ["x", "does_not_exist"], ["y"], name="add")])
    with pytest.raises(ValueError, match=r"node 'add'\): input\(s\) \['does_not_exist'\] is no graph input"):
        ember.load_onnx(bad, backend="cpu")


def test_graph_not_topologically_sorted() -> None:
    bad = model([helper.make_node("Relu", ["h"], ["y"], name="second"), helper.make_node("Neg", ["x"], ["h"])])
    with pytest.raises(ValueError, match=r"node 'second'\): input\(s\) \['h'\] is produced only by a later node"):
        ember.load_onnx(bad, backend="cpu")


def test_too_few_inputs() -> None:
    bad = model([helper.make_node("Gather", ["x"], ["y"], name="gather")])
    with pytest.raises(ValueError, match=r"node 'gather'\): 1 input\(s\), the schema allows 2"):
        ember.load_onnx(bad, backend="cpu")


def test_required_input_left_empty() -> None:
    bad = model([helper.make_node("Gather", ["x", ""], ["y"], name="gather")])
    with pytest.raises(ValueError, match=r"required input 1 \('indices'\) is empty"):
        ember.load_onnx(bad, backend="cpu")


def test_too_many_outputs() -> None:
    bad = model([helper.make_node("Relu", ["x"], ["y", "z"], name="relu")])
    with pytest.raises(ValueError, match=r"node 'relu'\): 2 output\(s\), the schema allows 1"):
        ember.load_onnx(bad, backend="cpu")


def test_graph_output_of_no_producer() -> None:
    bad = model([helper.make_node("Relu", ["x"], ["y"])],
                [Y, helper.make_tensor_value_info("ghost", TensorProto.FLOAT, None)])
    with pytest.raises(ValueError, match=r"graph output\(s\) \['ghost'\] are produced by no node"):
        ember.load_onnx(bad, backend="cpu")


def test_optional_inputs_may_be_empty_or_omitted() -> None:
    ok = model([helper.make_node("Clip", ["x", "", "hi"], ["y"])],
               inits=[helper.make_tensor("hi", TensorProto.FLOAT, [], [0.5])])
    ember.load_onnx(ok, backend="cpu")


def test_every_problem_listed_at_once() -> None:
    bad = model([helper.make_node("Gather", ["x"], ["h"], name="gather"),
                 helper.make_node("Add", ["h", "nowhere"], ["y"], name="add")])
    with pytest.raises(ValueError, match=r"2 problems in the graph:\n  - .*'gather'.*\n  - .*'add'.*nowhere"):
        ember.load_onnx(bad, backend="cpu")


# ----------------------------------------------------------------------------------- against the op schemas
# Each rejection is checked against ONNX Runtime rejecting the same model at session creation, and each model
# kept is one ONNX Runtime runs: ember refuses no more than it does.


def make(nodes: list, inputs: list, outputs: list, inits: list | None = None, opset: int = 17,
         value_info: list | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", inputs, outputs, inits or [], value_info=value_info or [])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def vi(name: str, dtype: int, shape: list | None) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, shape)


def ort_session(m: onnx.ModelProto | str) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 4  # ORT logs each refused model at error level; the reason is raised anyway
    return ort.InferenceSession(m if isinstance(m, str) else m.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])


def assert_refused(m: onnx.ModelProto, match: str, error: type[Exception] = ValueError) -> None:
    with pytest.raises(Exception):  # noqa: B017 (ORT's error classes are not public)
        ort_session(m)
    with pytest.raises(error, match=match):
        ember.load_onnx(m, backend="cpu")


def assert_runs_as_ort(m: onnx.ModelProto | str, feeds: dict[str, np.ndarray], **options: Any) -> None:
    got = ember.load_onnx(m, backend="cpu", **options).run(feeds)
    for want, (name, value) in zip(ort_session(m).run(None, feeds), got.items(), strict=True):
        np.testing.assert_allclose(value, want, rtol=1e-6, err_msg=name)


XF = vi("x", TensorProto.FLOAT, [2, 4])
YF = vi("y", TensorProto.FLOAT, None)
W = numpy_helper.from_array(np.ones((4, 3), np.float32), "w")


@pytest.mark.parametrize(("value", "got"), [("abc", "STRING"), ([1, 2], "INTS"), (1, "INT")])
def test_attribute_of_the_wrong_type(value: object, got: str) -> None:
    bad = make([helper.make_node("Gemm", ["x", "w"], ["y"], name="gemm", alpha=value)], [XF], [YF], [W])
    assert_refused(bad, rf"node 'gemm'\): attribute 'alpha' must be FLOAT, got {got}")


def test_int_attribute_given_as_float() -> None:
    bad = make([helper.make_node("Softmax", ["x"], ["y"], name="sm", axis=1.0)], [XF], [YF])
    assert_refused(bad, r"node 'sm'\): attribute 'axis' must be INT, got FLOAT")


def test_unknown_attribute() -> None:
    bad = make([helper.make_node("Relu", ["x"], ["y"], name="relu", slope=0.1)], [XF], [YF])
    assert_refused(bad, r"node 'relu'\): unknown attribute 'slope'; Relu-14 takes no attributes")


def test_required_attribute_missing() -> None:
    bad = make([helper.make_node("Cast", ["x"], ["y"], name="cast")], [XF], [YF])
    assert_refused(bad, r"node 'cast'\): required attribute 'to' \(INT\) is missing")


def test_inputs_of_one_type_variable_differ() -> None:
    bad = make([helper.make_node("Add", ["x", "h"], ["y"], name="add")], [XF, vi("h", TensorProto.FLOAT16, [2, 4])],
               [YF])
    assert_refused(bad, r"node 'add'\): input 1 'h' \('B'\) is tensor\(float16\), but input 0 'x' binds the "
                        r"schema's type T to tensor\(float\)")


def test_mixed_dtype_layernorm() -> None:
    scale = numpy_helper.from_array(np.ones(4, np.float16), "scale")
    bad = make([helper.make_node("LayerNormalization", ["x", "scale"], ["y"], name="ln")], [XF], [YF], [scale])
    assert_refused(bad, r"node 'ln'\): input 1 'scale' \('Scale'\) is tensor\(float16\), but input 0 'x' binds")


def test_dtype_of_a_node_output_comes_from_type_inference() -> None:
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
             helper.make_node("Add", ["x", "h"], ["y"], name="add")]
    assert_refused(make(nodes, [XF], [YF]), r"node 'add'\): input 1 'h' \('B'\) is tensor\(float16\)")


def test_type_the_constraint_does_not_allow() -> None:
    bad = make([helper.make_node("Relu", ["i"], ["y"], name="relu")], [vi("i", TensorProto.INT32, [2])],
               [vi("y", TensorProto.INT32, None)], opset=13)  # integer Relu came with opset 14
    assert_refused(bad, r"node 'relu'\): input 0 'i' \('X'\) is tensor\(int32\); the schema's type T allows "
                        r"tensor\(float16\), tensor\(float\)")
    shape = numpy_helper.from_array(np.array([8.0], np.float32), "shape")
    bad = make([helper.make_node("Reshape", ["x", "shape"], ["y"], name="reshape")], [XF], [YF], [shape])
    assert_refused(bad, r"node 'reshape'\): input 1 'shape' \('shape'\) is tensor\(float\); the schema takes "
                        r"tensor\(int64\)")


@pytest.mark.parametrize("declared_in", ["value_info", "graph output"])
def test_declared_output_type_differs_from_the_ops(declared_in: str) -> None:
    h16 = vi("h", TensorProto.FLOAT16, None)
    nodes = [helper.make_node("Add", ["x", "x"], ["h"], name="add"), helper.make_node("Relu", ["h"], ["y"])]
    bad = make(nodes, [XF], [YF], value_info=[h16]) if declared_in == "value_info" else make(nodes[:1], [XF], [h16])
    assert_refused(bad, r"node 'add'\): output 0 'h' is declared tensor\(float16\), but the op computes "
                        r"tensor\(float\)")


def test_what_ort_accepts_still_loads() -> None:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    # A declared output shape that inference contradicts: ORT (and ember) go by the computed one.
    assert_runs_as_ort(make([helper.make_node("Add", ["x", "x"], ["y"])], [XF], [vi("y", TensorProto.FLOAT, [7, 7])]),
                       {"x": x})
    # One type variable across inputs of one dtype (Where's T), inputs of other variables free to differ.
    nodes = [helper.make_node("Greater", ["x", "zero"], ["c"]), helper.make_node("Where", ["c", "x", "w"], ["y"])]
    zero = numpy_helper.from_array(np.zeros((), np.float32), "zero")
    w = numpy_helper.from_array(np.full(4, -1, np.float32), "w")
    assert_runs_as_ort(make(nodes, [XF], [YF], [zero, w]), {"x": x - 3})
    # Attributes given at their schema's types, optional ones omitted, an integer-typed op at opset 14.
    nodes = [helper.make_node("Gemm", ["x", "w"], ["g"], alpha=0.5, transB=0),
             helper.make_node("Cast", ["g"], ["i"], to=TensorProto.INT32), helper.make_node("Relu", ["i"], ["y"])]
    assert_runs_as_ort(make(nodes, [XF], [vi("y", TensorProto.INT32, None)], [W], opset=14), {"x": x})


def test_schema_problems_listed_with_the_others() -> None:
    nodes = [helper.make_node("Gather", ["x"], ["a"], name="gather"),
             helper.make_node("Relu", ["x"], ["b"], name="relu", slope=0.1),
             helper.make_node("Add", ["b", "h"], ["y"], name="add")]
    bad = make(nodes, [XF, vi("h", TensorProto.FLOAT16, [2, 4])], [YF])
    with pytest.raises(ValueError, match=r"3 problems in the graph:\n  - .*'gather'.*\n  - .*'relu'.*slope"
                                         r".*\n  - .*'add'.*float16"):
        ember.load_onnx(bad, backend="cpu")


# ------------------------------------------------------------------------------------- initializer data


def initializer(dims: list[int], raw: bytes | None = None, floats: list[float] | None = None) -> onnx.TensorProto:
    t = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=dims)
    if raw is not None:
        t.raw_data = raw
    t.float_data.extend(floats or [])
    return t


@pytest.mark.parametrize(("w", "held"), [
    (initializer([2, 2], raw=np.ones(3, np.float32).tobytes()), r"its raw_data holds 12 bytes \(3 element\(s\)\)"),
    (initializer([2, 2], raw=b"\0" * 18), r"its raw_data holds 18 bytes \(4.5 element\(s\)\)"),
    (initializer([2, 2], floats=[1.0, 2.0, 3.0]), "its float_data holds 3 entries"),
    (initializer([2, 2], floats=[1.0] * 5), "its float_data holds 5 entries"),
    (initializer([2, 2]), "its float_data holds 0 entries"),
])
def test_initializer_data_not_filling_its_dims(w: onnx.TensorProto, held: str) -> None:
    bad = make([helper.make_node("Add", ["x", "w"], ["y"])], [vi("x", TensorProto.FLOAT, [2, 2])], [YF], [w])
    assert_refused(bad, rf"initializer 'w': dims \[2, 2\] need 4 element\(s\) of float, {held}")


# ------------------------------------------------------------------------------------------ external data


@pytest.fixture
def external_model(tmp_path: Path) -> Path:
    w = numpy_helper.from_array(np.arange(8, dtype=np.float32).reshape(2, 4), "w")
    m = make([helper.make_node("Add", ["x", "w"], ["y"])], [XF], [YF], [w])
    onnx.save_model(m, tmp_path / "m.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0)
    return tmp_path / "m.onnx"


def test_external_data_next_to_the_model_file(external_model: Path) -> None:
    assert_runs_as_ort(str(external_model), {"x": np.ones((2, 4), np.float32)})


def test_external_data_dir_for_a_model_in_memory(external_model: Path) -> None:
    proto = onnx.load(external_model, load_external_data=False)
    x = np.ones((2, 4), np.float32)
    want = x + np.arange(8, dtype=np.float32).reshape(2, 4)
    for m in (proto, proto.SerializeToString()):
        with pytest.raises(ValueError, match=r"initializer 'w'\) in external files: pass external_data_dir="):
            ember.load_onnx(m, backend="cpu")
        got = ember.load_onnx(m, backend="cpu", external_data_dir=external_model.parent).run({"x": x})["y"]
        np.testing.assert_array_equal(got, want)
    assert proto.graph.initializer[0].data_location == TensorProto.EXTERNAL  # the caller's proto is left as it was


def test_missing_external_data_file(external_model: Path, tmp_path: Path) -> None:
    (tmp_path / "weights.bin").rename(tmp_path / "elsewhere.bin")
    with pytest.raises(Exception):  # noqa: B017
        ort_session(str(external_model))
    missing = re.escape(str(tmp_path / "weights.bin"))
    with pytest.raises(FileNotFoundError, match=rf"missing external data file\(s\) of .*initializer 'w': {missing}"):
        ember.load_onnx(external_model, backend="cpu")
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(FileNotFoundError, match=re.escape(str(other / "weights.bin"))):
        ember.load_onnx(external_model, backend="cpu", external_data_dir=other)
    with pytest.raises(ValueError, match="external_data_dir: .* is not a directory"):
        ember.load_onnx(external_model, backend="cpu", external_data_dir=external_model)


# ------------------------------------------------------------------------------------------- input shapes


def test_input_without_a_declared_shape_takes_the_feeds() -> None:
    x = helper.make_value_info("x", helper.make_tensor_type_proto(TensorProto.FLOAT, None))  # no `shape` field
    m = make([helper.make_node("Relu", ["x"], ["y"])], [x], [YF])
    loaded = ember.load_onnx(m, backend="cpu")
    assert loaded.inputs[0].shape is None and "x: float32[?]" in repr(loaded)
    for shape in [(2, 3), (), (4, 1, 5)]:
        assert_runs_as_ort(m, {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)})


def test_dim_value_minus_one_is_symbolic() -> None:
    m = make([helper.make_node("Relu", ["x"], ["y"])], [vi("x", TensorProto.FLOAT, [-1, 3])],
             [vi("y", TensorProto.FLOAT, [-1, 3])])
    for batch in (1, 2, 5):
        assert_runs_as_ort(m, {"x": np.linspace(-1, 1, 3 * batch, dtype=np.float32).reshape(batch, 3)})
    with pytest.raises(ValueError, match=r"'x': dim 1 must be 3, got 4"):  # ORT refuses this feed too
        ember.load_onnx(m, backend="cpu").run({"x": np.ones((2, 4), np.float32)})


@pytest.mark.skipif("wgpu" not in ember.available_backends(), reason="no wgpu adapter")
@pytest.mark.parametrize("reader", ["ReduceSum", "Relu"])
def test_a_tensor_past_32_bit_indexing_is_refused_at_load(reader: str) -> None:
    """2**32 elements: an Expand a reduction reads lazily (no buffer of its own) or one materialised. wgpu's
    kernels index with 32-bit integers, so such a tensor is a ValueError at load naming the node, never a
    kernel whose indices wrap."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    shape = numpy_helper.from_array(np.array([1 << 16, 1 << 14, 4], dtype=np.int64), "shape")
    nodes = [helper.make_node("Expand", ["x", "shape"], ["big"], name="expand"),
             helper.make_node(reader, ["big"], ["y"], name="reader")]
    graph = helper.make_graph(nodes, "g", [x], [Y], [shape])
    bad = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    with pytest.raises(ValueError, match=r"expand \(Expand\): output 'big' of shape \(65536, 16384, 4\) has "
                                         r"4294967296 elements; the wgpu backend's kernels index with 32-bit"):
        ember.load_onnx(bad, backend="wgpu")


@pytest.mark.parametrize("op, b_shape, says", [("Add", [3, 5], "Incompatible dimensions"),
                                               ("MatMul", [5, 3], "Incompatible dimensions for matrix")])
def test_shapes_that_contradict_the_op_are_refused_at_load(op: str, b_shape: list[int], says: str) -> None:
    """x is [batch, 4] (symbolic: no plan at load), so only shape inference can see that the op cannot take
    these inputs; ONNX Runtime refuses such a model at load too."""
    b = numpy_helper.from_array(np.ones(b_shape, np.float32), "b")
    bad = model([helper.make_node(op, ["x", "b"], ["y"], name="n")], inits=[b])
    with pytest.raises(ValueError, match=rf"{op} \(node 'n'\): shape inference: {says}"):
        ember.load_onnx(bad, backend="cpu")


def test_dim_minus_one_is_no_size_to_shape_inference() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [-1, 4])
    b = numpy_helper.from_array(np.ones([3, 4], np.float32), "b")
    graph = helper.make_graph([helper.make_node("Add", ["x", "b"], ["y"])], "g", [x], [Y], [b])
    m = ember.load_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), backend="cpu")
    np.testing.assert_array_equal(m.run({"x": np.zeros((3, 4), np.float32)})["y"], np.ones((3, 4), np.float32))

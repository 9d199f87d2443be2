"""Malformed graphs are refused at load with a ValueError naming the node and the input, not at their first run."""

from __future__ import annotations

import pytest
from onnx import TensorProto, helper

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

"""Ops ember runs on the host through onnx.reference, ONNX's own implementation of each op's spec: strings
(StringNormalizer, StringConcat, StringSplit, RegexFullMatch), n-gram features (TfIdfVectorizer), the mel filter
bank a spectrogram front end builds once from scalars (MelWeightMatrix), sequences and
optionals, and the ai.onnx.ml label encoder and tree ensembles. None of them is numeric work a GPU kernel would do
better, and every one is an explicit host step: they run between the graph's stages (plan/stages.py) and
`plan_info()["host_nodes"]` lists them. Values of sequence type are Python lists of arrays on the host.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from ..ir import Node
from .base import register
from .host import HostOp

# (domain, op type) -> the first opset whose version ember runs.
REFERENCE_OPS: dict[tuple[str, str], int] = {
    ("", "StringNormalizer"): 10, ("", "StringConcat"): 20, ("", "StringSplit"): 20, ("", "RegexFullMatch"): 20,
    ("", "TfIdfVectorizer"): 9, ("", "MelWeightMatrix"): 17,
    ("", "SequenceConstruct"): 11, ("", "SequenceEmpty"): 11, ("", "SequenceAt"): 11, ("", "SequenceLength"): 11,
    ("", "SequenceInsert"): 11, ("", "SequenceErase"): 11, ("", "SplitToSequence"): 11,
    ("", "ConcatFromSequence"): 11, ("", "SequenceMap"): 17,
    ("", "Optional"): 15, ("", "OptionalHasElement"): 15, ("", "OptionalGetElement"): 15,
    ("ai.onnx.ml", "LabelEncoder"): 1, ("ai.onnx.ml", "TreeEnsembleClassifier"): 1,
    ("ai.onnx.ml", "TreeEnsembleRegressor"): 1, ("ai.onnx.ml", "TreeEnsemble"): 5,
}


# Ops ember runs natively that also take strings; a node of them reading string inputs runs on the host.
STRING_CAPABLE = {("", "Equal"), ("", "Identity"), ("", "Reshape"), ("", "Concat"), ("", "Gather"),
                  ("", "Transpose"), ("", "Squeeze"), ("", "Unsqueeze"), ("", "Where")}


def needs_proto(domain: str, op_type: str) -> bool:
    """Whether the importer must keep the node's proto (the reference evaluator runs the node as ONNX wrote it)."""
    return (domain, op_type) in REFERENCE_OPS or (domain, op_type) in STRING_CAPABLE


def run_reference(node: Node, inputs: list[Any]) -> list[Any]:
    """The node run by onnx.reference on host values (strings through an op ember also runs natively)."""
    return ReferenceOp(node).compute(*inputs)


class ReferenceOp(HostOp):
    """One node run by onnx.reference.ReferenceEvaluator, built once per node from its proto."""

    always_host = True  # a cut between stages even when nothing of it is on the device

    def __init__(self, node: Node) -> None:
        self.node = node
        self.attr: dict[str, Any] = dict(node.attrs)  # the reference reads the proto's own attributes
        if getattr(node, "proto", None) is None:
            raise self.fail("runs through onnx.reference, which needs the node as imported (no proto was kept)")

    def compute(self, *inputs: Any) -> list[Any]:
        if self.node.op_type == "Optional" and not self.node.domain:
            # ember's optional is its value or None; onnx.reference wraps the value in a list of one.
            return [inputs[0] if inputs else None]
        evaluator = getattr(self.node, "_evaluator", None)
        if evaluator is None:
            evaluator = self.node._evaluator = _evaluator(self.node)  # type: ignore[attr-defined]
        feeds = {name: value for name, value in zip(self.node.inputs, inputs, strict=False) if name}
        try:
            outs = evaluator.run(None, feeds)
        except (ValueError, TypeError, IndexError, KeyError, RuntimeError) as e:
            raise ValueError(f"{self.node.describe()}: {type(e).__name__}: {e}") from e
        return [_value(o) for o in outs]


def _evaluator(node: Node) -> Any:
    from onnx.reference import ReferenceEvaluator

    proto: onnx.NodeProto = node.proto  # type: ignore[attr-defined]
    inputs = [onnx.ValueInfoProto(name=i) for i in proto.input if i]
    outputs = [onnx.ValueInfoProto(name=o) for o in proto.output if o]
    opsets = {"": node.opset} if not node.domain else {node.domain: node.opset, "": 18}
    graph = helper.make_graph([proto], "host", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets.items()])
    return ReferenceEvaluator(model)


def _value(v: Any) -> Any:
    if isinstance(v, list):
        return [_value(x) for x in v]
    return v if v is None else np.asarray(v)


for (_domain, _op), _since in REFERENCE_OPS.items():
    register(_op, _since, _domain)(type(_op, (ReferenceOp,), {}))

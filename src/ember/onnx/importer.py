"""ModelProto -> ember IR: read the model from wherever it is, decode tensors and attributes once."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ..ir import Graph, Node, ValueInfo


def read_model(model: Any) -> tuple[onnx.ModelProto, str]:
    """A ModelProto from a path, bytes or a ModelProto, and a description of where it came from."""
    if isinstance(model, onnx.ModelProto):
        return model, "the given ModelProto"
    if isinstance(model, (bytes, bytearray, memoryview)):
        source = f"{len(model)} bytes of model data"
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as e:
            raise ValueError(f"cannot parse {source} as an ONNX model: {e}") from e
        _check_nonempty(proto, source)
        return proto, source
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.exists():
            raise FileNotFoundError(f"ONNX model file not found: {path}")
        if path.is_dir():
            raise ValueError(f"{path} is a directory, not an ONNX model file")
        source = f"model file {path}"
        try:
            # External data (weights in side files) resolve relative to the model's folder.
            proto = onnx.load(str(path), load_external_data=True)
        except Exception as e:
            raise ValueError(f"cannot read {source}: {type(e).__name__}: {e}") from e
        _check_nonempty(proto, source)
        return proto, source
    raise TypeError(f"model must be a path, bytes or an onnx.ModelProto, got {type(model).__name__}")


def _check_nonempty(proto: onnx.ModelProto, source: str) -> None:
    # Protobuf parses many garbage byte strings as an empty message: treat "no graph" as corrupt.
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise ValueError(f"{source} is not a valid ONNX model (no graph found)")


def _dtype(elem_type: int) -> np.dtype | None:
    if elem_type == 0:
        return None
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))
    except Exception:
        return None


def _value_info(vi: onnx.ValueInfoProto) -> ValueInfo:
    t = vi.type.tensor_type
    shape = None
    if t.HasField("shape"):
        dims = []
        for d in t.shape.dim:
            if d.HasField("dim_value"):
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    return ValueInfo(vi.name, _dtype(t.elem_type), shape)


def _attr(a: onnx.AttributeProto) -> Any:
    if a.type == onnx.AttributeProto.TENSOR:
        return numpy_helper.to_array(a.t)
    if a.type == onnx.AttributeProto.GRAPH:
        return a.g  # subgraphs stay protos; ops that take them convert what they need
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode() for s in v]
    return v


def to_graph(proto: onnx.ModelProto) -> Graph:
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): int(o.version) for o in proto.opset_import}
    g = proto.graph
    inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    if g.sparse_initializer:
        raise NotImplementedError("sparse initializers are not supported")
    nodes = []
    for i, n in enumerate(g.node):
        dom = n.domain if n.domain != "ai.onnx" else ""
        nodes.append(Node(n.op_type, dom, list(n.input), list(n.output), {a.name: _attr(a) for a in n.attribute},
                          n.name or f"{n.op_type}_{i}", opsets.get(dom, 1)))
    # Graph inputs that also have an initializer are defaults the user may override (IR < 4 lists all
    # weights as inputs): treat them as constants, as ONNX Runtime does for non-overridable ones.
    # Some exporters also list values that nodes produce (ConstantOfShape weights) as graph inputs.
    produced = {o for n in g.node for o in n.output}
    inputs = [_value_info(v) for v in g.input if v.name not in inits and v.name not in produced]
    outputs = [_value_info(v) for v in g.output]
    vinfo = {v.name: _value_info(v) for v in g.value_info}
    return Graph(nodes, inputs, outputs, inits, vinfo, opsets, g.name)


def load(model: Any) -> tuple[Graph, str]:
    proto, source = read_model(model)
    return to_graph(proto), source

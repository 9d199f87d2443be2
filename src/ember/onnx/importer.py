"""ModelProto -> ember IR: read the model from wherever it is, decode tensors and attributes once."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import external_data_helper, helper, numpy_helper

from ..ir import Graph, Node, ValueInfo
from ..ops.reference import needs_proto
from .validate_schema import schema_problems


def read_model(model: Any, external_data_dir: str | os.PathLike | None = None) -> tuple[onnx.ModelProto, str]:
    """A ModelProto from a path, bytes or a ModelProto, its external data read in from `external_data_dir` (default:
    a model file's folder), and a description of where it came from. A given ModelProto is never modified."""
    folder = _check_dir(external_data_dir)
    if isinstance(model, onnx.ModelProto):
        return _with_external_data(model, "the given ModelProto", folder, copy=True), "the given ModelProto"
    proto, source, own_folder = read_proto(model)
    return _with_external_data(proto, source, folder or own_folder), source


def read_proto(model: Any) -> tuple[onnx.ModelProto, str, Path | None]:
    """The ModelProto in a model file or bytes, its external data not read yet; a description of where it came
    from; the model file's folder (None for bytes). FileNotFoundError for a missing file, ValueError for anything
    that is no ONNX model, TypeError for what is neither a path nor bytes."""
    if isinstance(model, (bytes, bytearray, memoryview)):
        source = f"{len(model)} bytes of model data"
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as e:
            raise ValueError(f"cannot parse {source} as an ONNX model: {e}") from e
        _check_nonempty(proto, source)
        return proto, source, None
    if isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.exists():
            raise FileNotFoundError(f"ONNX model file not found: {path}")
        if path.is_dir():
            raise ValueError(f"{path} is a directory, not an ONNX model file")
        source = f"model file {path}"
        try:
            proto = onnx.load(str(path), load_external_data=False)  # read later, with errors naming the tensor
        except Exception as e:
            note = " (ORT-format .ort models are not supported: use the .onnx model)" if path.suffix == ".ort" else ""
            raise ValueError(f"cannot read {source}: {type(e).__name__}: {e}{note}") from e
        _check_nonempty(proto, source)
        return proto, source, path.parent
    raise TypeError(f"model must be a path, bytes or an onnx.ModelProto, got {type(model).__name__}")


def _check_dir(folder: Any) -> Path | None:
    if folder is None:
        return None
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"external_data_dir: expected a folder path, got {type(folder).__name__}")
    if not Path(folder).is_dir():
        raise ValueError(f"external_data_dir: {folder} is not a directory")
    return Path(folder)


def _check_nonempty(proto: onnx.ModelProto, source: str) -> None:
    # Protobuf parses many garbage byte strings as an empty message: treat "no graph" as corrupt.
    if not proto.HasField("graph") or (not proto.graph.node and not proto.graph.output):
        raise ValueError(f"{source} is not a valid ONNX model (no graph found)")


def _tensors(graph: onnx.GraphProto | onnx.FunctionProto, where: str = "") -> Iterator[tuple[str, onnx.TensorProto]]:
    """Every tensor of a graph, its subgraphs and its nodes' attributes, each with a description for errors."""
    for t in getattr(graph, "initializer", ()):
        yield f"initializer {t.name!r}{where}", t
    for n in graph.node:
        for a in n.attribute:
            what = f"attribute {a.name!r} of node {n.name or n.op_type!r}{where}"
            if a.HasField("t"):
                yield what, a.t
            yield from ((what, t) for t in a.tensors)
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from _tensors(g, f" (in a subgraph of node {n.name or n.op_type!r})")


def _with_external_data(proto: onnx.ModelProto, source: str, folder: Path | None,
                        copy: bool = False) -> onnx.ModelProto:
    """The model with the data of its external tensors read in: FileNotFoundError naming each tensor whose file is
    missing, ValueError for any other fault (a path leaving the folder, an offset past the file's end)."""
    external = any(external_data_helper.uses_external_data(t) for _, t in _all_tensors(proto))
    if not external:
        return proto
    if copy:  # the caller's ModelProto keeps describing its files; its weights live there, so the copy is small
        own = onnx.ModelProto()
        own.CopyFrom(proto)
        proto = own
    tensors = [(what, t) for what, t in _all_tensors(proto) if external_data_helper.uses_external_data(t)]
    if folder is None:
        names = ", ".join(what for what, _ in tensors[:5]) + (", ..." if len(tensors) > 5 else "")
        raise ValueError(f"{source} keeps the data of {len(tensors)} tensor(s) ({names}) in external files: pass "
                         "external_data_dir=, the folder holding them")
    missing, problems = [], []
    for what, t in tensors:
        try:
            location = external_data_helper.ExternalDataInfo(t).location
            if not location:
                problems.append(f"{what}: its external data names no file (no 'location')")
                continue
            if not (folder / location).is_file():
                missing.append(f"{what}: {folder / location}")
                continue
            external_data_helper.load_external_data_for_tensor(t, str(folder))
        except (onnx.checker.ValidationError, OSError, ValueError) as e:
            problems.append(f"{what}: {e}")
    if missing:
        raise FileNotFoundError(_listing(f"missing external data file(s) of {source}", missing))
    if problems:
        raise ValueError(_listing(f"unreadable external data in {source}", problems))
    return proto


def _all_tensors(proto: onnx.ModelProto) -> Iterator[tuple[str, onnx.TensorProto]]:
    yield from _tensors(proto.graph)
    for f in proto.functions:
        yield from _tensors(f, f" (in function {f.name!r})")


def _listing(head: str, problems: list[str]) -> str:
    """One error for all the problems, as check_structure lists them."""
    return f"{head}: {problems[0]}" if len(problems) == 1 else \
        f"{head} ({len(problems)}):\n" + "\n".join(f"  - {p}" for p in problems)


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
            # Some exporters write -1 for a dim they leave free: it is symbolic, as in ONNX Runtime.
            if d.HasField("dim_value") and d.dim_value >= 0:
                dims.append(int(d.dim_value))
            elif d.HasField("dim_param"):
                dims.append(d.dim_param)
            else:
                dims.append(None)
        shape = tuple(dims)
    kind = vi.type.WhichOneof("value")
    if kind in ("sequence_type", "optional_type"):
        return ValueInfo(vi.name, None, None, kind.split("_")[0])
    return ValueInfo(vi.name, _dtype(t.elem_type), shape)


# Element types stored packed: bits per element in raw_data (onnx < 1.23 lacks some of them).
_PACKED_BITS = {getattr(onnx.TensorProto, name, -1): bits for name, bits in
                (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2),
                 ("FLOAT6E2M3", 6), ("FLOAT6E3M2", 6))}


def _tensor(t: onnx.TensorProto, what: str, problems: list[str]) -> np.ndarray | None:
    """The tensor's array, or None with the reason in `problems` (ONNX Runtime refuses data that does not fill
    the dims exactly, so ember does too, naming the tensor and both counts)."""
    if t.data_type == onnx.TensorProto.UNDEFINED or t.data_type not in onnx.TensorProto.DataType.values():
        problems.append(f"{what}: data_type {t.data_type} is not an ONNX tensor type")
        return None
    try:
        return numpy_helper.to_array(t)
    except (ValueError, TypeError, KeyError) as e:
        problems.append(f"{what}: {_data_mismatch(t) or f'cannot decode its data: {e}'}")
        return None


def _data_mismatch(t: onnx.TensorProto) -> str | None:
    """How the tensor's data fails to fill its dims, or None if the counts agree (or cannot be told)."""
    want = math.prod(t.dims)
    try:
        kind = onnx.TensorProto.DataType.Name(t.data_type).lower()
        bits = _PACKED_BITS.get(t.data_type)
        if t.HasField("raw_data"):
            bits = bits or 8 * np.dtype(helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
            need, got = math.ceil(want * bits / 8), len(t.raw_data)
            held = f"its raw_data holds {got} bytes ({got * 8 / bits:g} element(s))"
        else:
            field = helper.tensor_dtype_to_field(t.data_type)
            got = len(getattr(t, field))
            if bits in (2, 4):  # one byte of packed elements per int32_data entry
                need = math.ceil(want * bits / 8)
            else:  # one entry per element (6-bit types too), two per complex number
                need = want * (2 if t.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else 1)
            held = f"its {field} holds {got} entries" + (f" ({need} needed)" if need != want else "")
    except Exception:
        return None
    return None if got == need else f"dims {list(t.dims)} need {want} element(s) of {kind}, {held}"


def _attr(a: onnx.AttributeProto, what: str, problems: list[str]) -> Any:
    if a.type == onnx.AttributeProto.TENSOR:
        return _tensor(a.t, what, problems)
    if a.type == onnx.AttributeProto.GRAPH:
        return a.g  # _nodes makes it an ember Graph
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode() for s in v]
    return v


def _check_text(g: onnx.GraphProto) -> None:
    """ValueError naming what holds a string that is not valid UTF-8 (protobuf hands such a string over as bytes,
    which the ONNX schema look-ups and every name comparison would trip on)."""
    where = [f"node {i} ({n.op_type!r})" for i, n in enumerate(g.node)
             if not all(isinstance(x, str) for x in (n.op_type, n.domain, n.name, *n.input, *n.output))]
    where += [f"graph input/output/initializer {v.name!r}" for v in (*g.input, *g.output, *g.initializer)
              if not isinstance(v.name, str)]
    if where:
        raise ValueError(_listing("names that are not valid UTF-8", where))


def to_graph(proto: onnx.ModelProto) -> Graph:
    g = proto.graph
    _check_text(g)
    if not all(isinstance(o.domain, str) for o in proto.opset_import):
        raise ValueError("opset_import: a domain that is not valid UTF-8")
    opsets = {(o.domain if o.domain != "ai.onnx" else ""): int(o.version) for o in proto.opset_import}
    problems: list[str] = []
    inits: dict[str, Any] = {t.name: _tensor(t, f"initializer {t.name!r}", problems) for t in g.initializer}
    if g.sparse_initializer:
        raise NotImplementedError("sparse initializers are not supported")
    nodes = _nodes(g, opsets, problems)
    if problems:
        raise ValueError(_listing("tensor data that does not fill its dims", problems))
    # Graph inputs that also have an initializer are defaults the user may override (IR < 4 lists all
    # weights as inputs): treat them as constants, as ONNX Runtime does for non-overridable ones.
    # Some exporters also list values that nodes produce (ConstantOfShape weights) as graph inputs.
    produced = {o for n in g.node for o in n.output}
    inputs = [_value_info(v) for v in g.input if v.name not in inits and v.name not in produced]
    outputs = [_value_info(v) for v in g.output]
    vinfo = {v.name: _value_info(v) for v in g.value_info}
    return Graph(nodes, inputs, outputs, inits, vinfo, opsets, g.name)


def _nodes(g: onnx.GraphProto, opsets: dict[str, int], problems: list[str], prefix: str = "") -> list[Node]:
    """The graph's nodes; a subgraph attribute (If's branches, Loop's body) becomes an ember Graph, and what it
    reads of the enclosing graphs becomes the node's `implicit` inputs."""
    nodes = []
    for i, n in enumerate(g.node):
        dom = n.domain if n.domain != "ai.onnx" else ""
        name = n.name or f"{prefix}{n.op_type}_{i}"
        attrs = {a.name: _attr(a, f"attribute {a.name!r} of node {name!r}", problems) for a in n.attribute}
        implicit: dict[str, None] = {}
        for key, value in attrs.items():
            if isinstance(value, onnx.GraphProto):
                attrs[key] = sub = _subgraph(value, opsets, problems, f"{name}/{key}/")
                implicit.update(dict.fromkeys(sub.outer_names()))
        node = Node(n.op_type, dom, list(n.input), list(n.output), attrs, name, opsets.get(dom, 1), list(implicit))
        if needs_proto(dom, n.op_type):
            node.proto = onnx.NodeProto()
            node.proto.CopyFrom(n)
        nodes.append(node)
    return nodes


def _subgraph(g: onnx.GraphProto, opsets: dict[str, int], problems: list[str], prefix: str) -> Graph:
    """A subgraph: its inputs are the formal parameters its node binds, in order (Loop's iteration number, its
    condition, the loop-carried values), initializers included."""
    _check_text(g)
    if g.sparse_initializer:
        raise NotImplementedError("sparse initializers are not supported")
    inits = {t.name: _tensor(t, f"initializer {t.name!r} of subgraph {g.name!r}", problems) for t in g.initializer}
    return Graph(_nodes(g, opsets, problems, prefix), [_value_info(v) for v in g.input],
                 [_value_info(v) for v in g.output], inits, {v.name: _value_info(v) for v in g.value_info}, opsets,
                 g.name)


def load(model: Any, external_data_dir: str | os.PathLike | None = None) -> tuple[Graph, str, list[str]]:
    """The graph, where it came from, and what the ONNX schemas find wrong with its nodes (attribute types, dtypes:
    found on the proto, which holds what the IR drops; check_structure reports them with the graph's own)."""
    proto, source = read_model(model, external_data_dir)
    graph = to_graph(proto)
    return graph, source, schema_problems(graph, proto)

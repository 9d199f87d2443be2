"""Mutations of the seed models and of their feeds, as JSON-able recipes a worker can replay.

A model recipe: {"kind": "model", "model": <seed name>, "seed": int, "muts": [[op, int, int, ...], ...]}; a feed
recipe: {"kind": "feed", "model": <seed name>, "seed": int, "muts": [[op, int, ...], ...]}. Integers index into
the model's lists modulo their length, so every recipe applies to every seed model; the seed drives the feed
values only."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper

from .seeds import SEEDS

DIM_VALUES: list[Any] = [0, -1, 1, 2, 3, 7, 2**16, 2**31 - 1, 2**31, 2**32 + 1, 2**40, 2**62, -(2**31), "sym"]
# Dims whose product overflows 32 bits: 2**16 * 2**16 and friends come from pairs of dim mutations above.
INT_VALUES = [0, -1, 1, 2, 3, -2, 5, 100, 2**31, -(2**31) - 1, 2**62, -(2**63)]
FLOAT_VALUES = [0.0, -1.0, 0.5, 1e30, -1e30, float("nan"), float("inf")]
OP_TYPES = ["Relu", "Conv", "MatMul", "Add", "Softmax", "Gather", "Reshape", "Transpose", "Slice", "Concat",
            "Expand", "Shape", "GlobalAveragePool", "ReduceSum", "Identity", "Cast", "Sub", "Mul", "Div",
            "Unsqueeze", "Squeeze", "Flatten", "Gemm", "MaxPool", "Where", "Tile", "Pad", "NoSuchOp", ""]
DTYPES = [TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.FLOAT16, TensorProto.DOUBLE,
          TensorProto.BOOL, TensorProto.UINT8, TensorProto.INT8, TensorProto.STRING, TensorProto.BFLOAT16,
          TensorProto.COMPLEX64, TensorProto.UNDEFINED, 999]
ATTR_TYPES = [onnx.AttributeProto.FLOAT, onnx.AttributeProto.INT, onnx.AttributeProto.STRING,
              onnx.AttributeProto.TENSOR, onnx.AttributeProto.GRAPH, onnx.AttributeProto.FLOATS,
              onnx.AttributeProto.INTS, onnx.AttributeProto.STRINGS, onnx.AttributeProto.UNDEFINED]
ATTR_NAMES = ["axis", "perm", "kernel_shape", "pads", "strides", "dilations", "group", "keepdims", "to",
              "transB", "alpha", "mode", "bogus"]
OPSETS = [1, 7, 11, 13, 17, 21, 99, 0]
# Ops a new node may be, fed from tensors already in the graph (attributes: their defaults).
INSERT_OPS = {"Relu": 1, "Add": 2, "Mul": 2, "MatMul": 2, "Softmax": 1, "Transpose": 1, "Shape": 1, "Concat": 2,
              "Reshape": 2, "Expand": 2, "Gather": 2, "ReduceSum": 2, "ReduceMax": 1, "Flatten": 1, "Squeeze": 1,
              "Unsqueeze": 2, "Sigmoid": 1, "Neg": 1, "Where": 3, "Tile": 2, "Range": 3, "ConstantOfShape": 1,
              "Size": 1, "ArgMax": 1, "TopK": 2, "CumSum": 2, "Equal": 2, "Less": 2, "Sqrt": 1, "Div": 2, "Pow": 2,
              "GlobalMaxPool": 1, "Identity": 1, "NonZero": 1, "Split": 1, "LayerNormalization": 2, "Slice": 3,
              "Pad": 2, "Sub": 2, "Max": 2, "Clip": 1, "Erf": 1, "Not": 1, "Mod": 2, "ReduceMean": 1}

MODEL_OPS = ["dim", "clear_shape", "init_dims", "init_dtype", "init_values", "input_dtype", "output_dtype",
             "attr_value", "attr_type", "attr_add", "attr_del", "node_input", "node_output", "add_input",
             "drop_input", "op_type", "domain", "drop_init", "dup_node", "drop_node", "swap_nodes", "opset",
             "graph_output_name", "graph_input_name", "ir_version", "insert_node", "insert_node", "add_output"]
BYTE_OPS = ["flip", "truncate", "insert", "delete"]

FEED_OPS = ["rank_up", "rank_down", "dim", "dtype", "empty", "nan", "inf", "huge", "noncontig", "fortran",
            "list", "scalar", "none", "object", "string", "extra_name", "missing", "not_mapping", "int_range",
            "zero_d", "big_batch", "bool"]
FEED_DTYPES = [np.float32, np.float64, np.float16, np.int64, np.int32, np.int8, np.uint64, np.uint8, np.bool_,
               np.complex64]


def _pick(seq: Any, i: int) -> Any:
    return seq[i % len(seq)]


def _tensor_names(m: onnx.ModelProto) -> list[str]:
    g = m.graph
    names = [v.name for v in g.input] + [t.name for t in g.initializer]
    for n in g.node:
        names.extend(n.output)
    return names


def _value_infos(m: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    return list(m.graph.input) + list(m.graph.output) + list(m.graph.value_info)


def _set_attr_value(attr: onnx.AttributeProto, k: int) -> None:
    t = attr.type
    if t == onnx.AttributeProto.INT:
        attr.i = _pick(INT_VALUES, k) if -(2**63) <= _pick(INT_VALUES, k) < 2**63 else 0
    elif t == onnx.AttributeProto.FLOAT:
        attr.f = _pick(FLOAT_VALUES, k)
    elif t == onnx.AttributeProto.INTS:
        del attr.ints[:]
        attr.ints.extend([_pick(INT_VALUES, k + j) for j in range(k % 5)])
    elif t == onnx.AttributeProto.STRING:
        attr.s = _pick([b"", b"NOTSET", b"SAME_UPPER", b"\xff\xfe", b"constant"], k)
    else:
        attr.i = _pick(INT_VALUES, k)


def apply_model_mut(m: onnx.ModelProto, mut: list[Any]) -> None:
    op, a, b, c = mut[0], *(list(mut[1:]) + [0, 0, 0])[:3]
    g = m.graph
    nodes = g.node
    if op == "dim":
        vis = _value_infos(m)
        vi = _pick(vis, a)
        dims = vi.type.tensor_type.shape.dim
        if dims:
            d = _pick(dims, b)
            v = _pick(DIM_VALUES, c)
            if v == "sym":
                d.dim_param = "S"
            else:
                d.dim_value = v
    elif op == "clear_shape":
        _pick(_value_infos(m), a).type.tensor_type.ClearField("shape")
    elif op == "init_dims" and g.initializer:
        t = _pick(g.initializer, a)
        if t.dims and c % 3:
            t.dims[b % len(t.dims)] = _pick(DIM_VALUES[:-1], c)
        elif c % 3 == 0:
            t.dims.append(_pick([0, 1, 2, 2**32], b))
        else:
            del t.dims[:]
    elif op == "init_dtype" and g.initializer:
        _pick(g.initializer, a).data_type = _pick(DTYPES, b)
    elif op == "init_values" and g.initializer:
        t = _pick(g.initializer, a)
        arr = onnx.numpy_helper.to_array(t).copy()
        if arr.size:
            flat = arr.reshape(-1)
            if arr.dtype.kind == "f":
                flat[b % flat.size] = _pick(FLOAT_VALUES, c)
            else:
                flat[b % flat.size] = np.int64(_pick([0, -1, 1, 2, 7, 2**31, 2**40, -(2**62), 2**62, 6], c))
            t.CopyFrom(onnx.numpy_helper.from_array(arr, t.name))
    elif op in ("input_dtype", "output_dtype"):
        vis = g.input if op == "input_dtype" else g.output
        if vis:
            _pick(vis, a).type.tensor_type.elem_type = _pick(DTYPES, b)
    elif op in ("attr_value", "attr_type", "attr_del") and nodes:
        n = _pick(nodes, a)
        if n.attribute:
            attr = _pick(n.attribute, b)
            if op == "attr_value":
                _set_attr_value(attr, c)
            elif op == "attr_type":
                attr.type = _pick(ATTR_TYPES, c)
            else:
                n.attribute.remove(attr)
    elif op == "attr_add" and nodes:
        n = _pick(nodes, a)
        name = _pick(ATTR_NAMES, b)
        if not any(x.name == name for x in n.attribute):
            v: Any = _pick([0, 1, -1, [1, 1], [0, 1, 2], [2, 0, 1], 0.5, "x", [3, 3, 3, 3]], c)
            n.attribute.append(helper.make_attribute(name, v))
    elif op in ("node_input", "node_output") and nodes:
        n = _pick(nodes, a)
        slots = n.input if op == "node_input" else n.output
        if slots:
            choices = _tensor_names(m) + ["", "nowhere", "y", "x"]
            slots[b % len(slots)] = _pick(choices, c)
    elif op == "add_input" and nodes:
        _pick(nodes, a).input.append(_pick(_tensor_names(m) + ["", "nowhere"], b))
    elif op == "drop_input" and nodes:
        n = _pick(nodes, a)
        if n.input:
            del n.input[b % len(n.input)]
    elif op == "op_type" and nodes:
        _pick(nodes, a).op_type = _pick(OP_TYPES, b)
    elif op == "domain" and nodes:
        _pick(nodes, a).domain = _pick(["com.microsoft", "ai.onnx", "foo.bar", "ai.onnx.ml"], b)
    elif op == "drop_init" and g.initializer:
        del g.initializer[a % len(g.initializer)]
    elif op == "dup_node" and nodes:
        n = onnx.NodeProto()
        n.CopyFrom(_pick(nodes, a))
        nodes.insert(b % (len(nodes) + 1), n)
    elif op == "drop_node" and nodes:
        del nodes[a % len(nodes)]
    elif op == "swap_nodes" and len(nodes) > 1:
        i, j = a % len(nodes), b % len(nodes)
        ni, nj = onnx.NodeProto(), onnx.NodeProto()
        ni.CopyFrom(nodes[i])
        nj.CopyFrom(nodes[j])
        nodes[i].CopyFrom(nj)
        nodes[j].CopyFrom(ni)
    elif op == "opset":
        m.opset_import[0].version = _pick(OPSETS, a)
    elif op == "graph_output_name" and g.output:
        _pick(g.output, a).name = _pick(_tensor_names(m) + ["", "nowhere"], b)
    elif op == "graph_input_name" and g.input:
        _pick(g.input, a).name = _pick(_tensor_names(m) + ["", "nowhere"], b)
    elif op in ("insert_node", "add_output"):
        names = _tensor_names(m)
        if op == "insert_node":
            k = len(nodes)
            op_type = _pick(sorted(INSERT_OPS), a)
            ins = [_pick(names, b + j * 7) for j in range(INSERT_OPS[op_type])]
            out = f"fz_{k}"
            nodes.append(helper.make_node(op_type, ins, [out], name=out))
        else:
            out = _pick(names, a)
        elem = _pick([TensorProto.FLOAT, TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL], c)
        g.output.append(helper.make_tensor_value_info(out, elem, None))
    elif op == "ir_version":
        m.ir_version = _pick([0, 1, 3, 7, 10, 13, 99], a)


def apply_byte_mut(data: bytes, mut: list[Any]) -> bytes:
    op, a, b = mut[0], mut[1], mut[2]
    if not data:
        return data
    pos = a % len(data)
    if op == "flip":
        return data[:pos] + bytes([data[pos] ^ (1 << (b % 8))]) + data[pos + 1:]
    if op == "truncate":
        return data[:pos]
    if op == "insert":
        return data[:pos] + bytes([b % 256]) * (1 + b // 256 % 4) + data[pos:]
    return data[:pos] + data[pos + 1 + b % 8:]  # delete


def build_model(recipe: dict[str, Any]) -> bytes:
    m = SEEDS[recipe["model"]]()
    byte_muts = []
    for mut in recipe["muts"]:
        if mut[0] in BYTE_OPS:
            byte_muts.append(mut)
        else:
            apply_model_mut(m, mut)
    data = m.SerializeToString()
    for mut in byte_muts:
        data = apply_byte_mut(data, mut)
    return data


def valid_feeds(inputs: list[Any], rng: np.random.Generator) -> dict[str, Any]:
    """Feeds that fit the loaded model's declared inputs (Model.inputs): symbolic or missing dims 1..3."""
    feeds: dict[str, Any] = {}
    for info in inputs:
        shape = [d if isinstance(d, int) else int(rng.integers(1, 4)) for d in (info.shape or [2])]
        if min(shape, default=0) < 0 or np.prod(shape, dtype=object) > 2**22:
            shape = [min(max(d, 0), 64) for d in shape]  # not a feed that fits: ember must say so
        dt = np.dtype(info.dtype)
        if dt.kind == "f":
            arr: np.ndarray = rng.standard_normal(shape).astype(dt)
        elif dt.kind in "iu":
            arr = rng.integers(-4 if dt.kind == "i" else 0, 8, size=shape).astype(dt)
        elif dt.kind == "b":
            arr = rng.integers(0, 2, size=shape).astype(bool)
        else:
            arr = np.zeros(shape, dt)
        feeds[info.name] = arr
    return feeds


def mutate_feeds(feeds: dict[str, Any], muts: list[list[Any]], rng: np.random.Generator) -> Any:
    out: Any = dict(feeds)
    names = sorted(feeds)
    for mut in muts:
        op, a, b = mut[0], mut[1], mut[2]
        if not isinstance(out, dict):
            break
        if op == "extra_name":
            out[_pick(["extra", "", "x ", "X"], a)] = np.zeros(2, np.float32)
            continue
        if op == "not_mapping":
            out = _pick([list(out.values()), tuple(out.items()), None, 3, "x", np.zeros(2)], a)
            continue
        if not names:
            continue
        name = _pick(names, a)
        if op == "missing":
            out.pop(name, None)
            continue
        if name not in out:
            continue
        v = out[name]
        arr = np.asarray(v) if not isinstance(v, (list, tuple, type(None), int, float, str)) else None
        if op == "list" and arr is not None:
            out[name] = arr.tolist()
        elif op == "scalar":
            out[name] = _pick([0, 1.5, -3, True, np.float32(2.0), np.int64(7)], b)
        elif op == "none":
            out[name] = None
        elif op == "object":
            out[name] = np.array([object(), 1], dtype=object)
        elif op == "string":
            out[name] = _pick(["abc", np.array(["a", "b"]), b"xy"], b)
        elif arr is None:
            continue
        elif op == "rank_up":
            out[name] = arr[None]
        elif op == "rank_down":
            out[name] = arr.reshape(-1)[: max(arr.size // 2, 0)] if arr.ndim <= 1 else arr[0]
        elif op == "zero_d":
            out[name] = np.asarray(arr.reshape(-1)[0] if arr.size else 0, dtype=arr.dtype)
        elif op == "dim" and arr.ndim:
            shape = list(arr.shape)
            shape[b % arr.ndim] = _pick([0, 1, 2, 5, 9], b // 7)
            out[name] = np.resize(arr, shape) if arr.size else np.zeros(shape, arr.dtype)
        elif op == "big_batch" and arr.ndim:
            out[name] = np.repeat(arr, 16, axis=0)
        elif op == "dtype":
            dt = _pick(FEED_DTYPES, b)
            out[name] = arr.astype(dt) if dt is not np.complex64 else arr.astype(np.complex64)
        elif op == "bool":
            out[name] = arr.astype(bool)
        elif op == "empty" and arr.ndim:
            shape = list(arr.shape)
            shape[b % arr.ndim] = 0
            out[name] = np.zeros(shape, arr.dtype)
        elif op in ("nan", "inf", "huge") and arr.size:
            a2 = arr.copy()
            if a2.dtype.kind == "f":
                fill = {"nan": np.nan, "inf": _pick([np.inf, -np.inf], b), "huge": np.finfo(a2.dtype).max}[op]
                a2.reshape(-1)[b % a2.size] = fill
            elif a2.dtype.kind in "iu":
                a2.reshape(-1)[b % a2.size] = np.iinfo(a2.dtype).max if op == "huge" else np.iinfo(a2.dtype).min
            out[name] = a2
        elif op == "int_range" and arr.size and arr.dtype.kind in "iu":
            a2 = arr.copy()
            a2.reshape(-1)[b % a2.size] = _pick([10, -11, 2**31, -(2**40), 1000], b // 3)
            out[name] = a2
        elif op == "noncontig" and arr.ndim:
            big = np.repeat(arr, 2, axis=b % arr.ndim)
            sl = [slice(None)] * arr.ndim
            sl[b % arr.ndim] = slice(None, None, 2)
            out[name] = big[tuple(sl)]
        elif op == "fortran" and arr.ndim:
            out[name] = np.asfortranarray(arr) if arr.ndim > 1 else arr[::-1]
    del rng
    return out

"""Each default-domain node against its ONNX schema, at load: what ONNX Runtime's graph resolution rejects.

Attributes must be ones the schema names, of the schema's type, with every required one given. Inputs bound to one
type variable must share a type, each one the variable allows, and a node output's declared type (value_info or
graph output) must be the one ONNX type inference gives it. Types come from the graph inputs, initializers and
value_info, and for node outputs from ONNX type inference run on a copy of the graph without the weights' data (types
need none). A value whose type is unknown is not checked. Strict shape inference runs on that copy too, and each
node whose input shapes contradict its op is a problem (ONNX Runtime refuses those at load); the copy leaves out
the declared shapes of graph outputs and intermediates, which strict inference would hold against models ONNX
Runtime runs (an output declared with a shape it does not infer).

The checks read the proto, which holds what the IR drops (attribute types, element types ember has no dtype for).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import onnx
import onnx.defs
import onnx.shape_inference

from ..ir import Graph, Node

_VARIADIC = onnx.defs.OpSchema.FormalParameterOption.Variadic
_DEFAULT_DOMAINS = ("", "ai.onnx")


def schema_problems(graph: Graph, proto: onnx.ModelProto) -> list[str]:
    """Problems with the nodes of `graph`, the IR made from `proto` (node i of each is the same node)."""
    declared = {vi.name: t for vi in _value_infos(proto.graph) if (t := _type_str(vi.type))}
    inferred, problems = _inferred_types(proto)
    for node, pnode in zip(graph.nodes, proto.graph.node, strict=True):
        if pnode.domain not in _DEFAULT_DOMAINS:
            continue  # contrib and ember domains: the op's own implementation checks its inputs
        schema = schema_of(node.op_type, node.opset, node.domain)
        if schema is None:
            continue  # not an ONNX op at this opset: check_supported reports it
        problems += _attribute_problems(node, pnode, schema)
        problems += _input_problems(node, schema, lambda name: inferred.get(name) or declared.get(name))
        for j, name in enumerate(node.outputs):
            want, got = declared.get(name), inferred.get(name)
            if name and want and got and want != got:
                problems.append(f"{node.describe()}: output {j} {name!r} is declared {want}, but the op computes {got}"
                                " from these inputs")
    return problems


def _attribute_problems(node: Node, pnode: onnx.NodeProto, schema: onnx.defs.OpSchema) -> list[str]:
    problems = []
    for a in pnode.attribute:
        if a.ref_attr_name:
            continue  # a function body's reference to its caller's attribute
        spec = schema.attributes.get(a.name)
        if spec is None:
            known = sorted(schema.attributes)
            problems.append(f"{node.describe()}: unknown attribute {a.name!r}; {schema.name}-{schema.since_version} "
                            f"takes {known if known else 'no attributes'}")
        elif int(spec.type) != a.type:
            problems.append(f"{node.describe()}: attribute {a.name!r} must be {spec.type.name}, got "
                            f"{_attr_type_name(a.type)}")
    given = {a.name for a in pnode.attribute}
    for name, spec in sorted(schema.attributes.items()):
        if spec.required and name not in given:
            problems.append(f"{node.describe()}: required attribute {name!r} ({spec.type.name}) is missing")
    return problems


def _input_problems(node: Node, schema: onnx.defs.OpSchema, type_of: Callable[[str], str | None]) -> list[str]:
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    bound: dict[str, tuple[int, str, str]] = {}  # type variable -> (input index, value, its type) that set it
    problems = []
    formals = schema.inputs
    for i, name in enumerate(node.inputs):
        if not name or not formals or (i >= len(formals) and formals[-1].option != _VARIADIC):
            continue  # omitted optional input; too many inputs: check_structure reports that
        formal = formals[min(i, len(formals) - 1)]
        got = type_of(name)
        if got is None:
            continue
        var = formal.type_str  # a type variable ("T") or a type ("tensor(int64)")
        ok = allowed.get(var, [var])
        if got not in ok:
            wants = f"the schema's type {var} allows {', '.join(ok)}" if var in allowed else f"the schema takes {var}"
            problems.append(f"{node.describe()}: input {i} {name!r} ({formal.name!r}) is {got}; {wants}")
        elif formal.is_homogeneous:  # a heterogeneous variadic (Loop's state values) binds nothing
            first = bound.setdefault(var, (i, name, got))
            if first[2] != got:
                problems.append(f"{node.describe()}: input {i} {name!r} ({formal.name!r}) is {got}, but input "
                                f"{first[0]} {first[1]!r} binds the schema's type {var} to {first[2]}")
    return problems


def _inferred_types(proto: onnx.ModelProto) -> tuple[dict[str, str], list[str]]:
    """Types ONNX shape inference gives node outputs, on a copy of the model with no weight data and no declared
    intermediate types (so a wrong declaration shows as a mismatch instead of being taken as given); and the
    nodes whose input shapes contradict their op (an Add of [N, 4] and [3, 5]), which strict inference reports
    and ONNX Runtime refuses at load."""
    g = proto.graph
    light = onnx.ModelProto(ir_version=proto.ir_version, opset_import=proto.opset_import, functions=proto.functions)
    inits = {t.name for t in g.initializer}
    inputs = [onnx.ValueInfoProto.FromString(vi.SerializeToString()) for vi in g.input if vi.name not in inits]
    for vi in inputs:  # dim -1 is symbolic to ember and ONNX Runtime, a size of -1 to ONNX's inference
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value") and d.dim_value < 0:
                d.ClearField("dim_value")
    # Every initializer is declared as an input (IR 3 wants both); small ones keep their data too, which shape
    # arithmetic reads (Reshape targets, an empty Resize scales).
    small = [t for t in g.initializer if t.data_location != onnx.TensorProto.EXTERNAL and t.ByteSize() <= 4096]
    light.graph.initializer.extend(small)
    light.graph.input.extend(inputs +
                             [onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims) for t in g.initializer])
    light.graph.node.extend(g.node)
    # Outputs of ops ONNX has no schema for keep their declared types, so what reads them can still be checked.
    opset = next((o.version for o in proto.opset_import if o.domain in _DEFAULT_DOMAINS), 1)
    foreign = {o for n in g.node if n.domain not in _DEFAULT_DOMAINS or schema_of(n.op_type, opset) is None
               for o in n.output}
    light.graph.value_info.extend(vi for vi in g.value_info if vi.name in foreign)
    problems: list[str] = []
    try:
        try:
            result = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=True)
        except onnx.shape_inference.InferenceError as e:
            problems = _inference_problems(str(e))
            result = onnx.shape_inference.infer_shapes(light, check_type=False, strict_mode=False)
    except Exception:  # inference itself failed (an opset newer than onnx knows): check what is declared only
        return {}, problems
    types = {t.name: f"tensor({onnx.TensorProto.DataType.Name(t.data_type).lower()})" for t in small
             if t.data_type in onnx.TensorProto.DataType.values() and t.data_type != onnx.TensorProto.UNDEFINED}
    types.update((vi.name, t) for vi in _value_infos(result.graph) if (t := _type_str(vi.type)))
    return types, problems


_INFERENCE_ERROR = re.compile(r"\(op_type:([^,)]*)(?:, node name: ([^)]*))?\): (?:\[(\w+)\] )?([^\n]*)")


def _inference_problems(message: str) -> list[str]:
    """One problem per node in ONNX's strict shape-inference error ("(op_type:Add, node name: add):
    [ShapeInferenceError] Incompatible dimensions"), the whole message if it names none."""
    found = []
    for line in message.split("(op_type:")[1:]:
        m = _INFERENCE_ERROR.match("(op_type:" + line)
        if m is None or "Inference error(s)" in m.group(4):
            # Nested: an error inside an op's function body (onnx expands MeanVarianceNormalization into a Constant
            # its own strict check refuses), not in the user's graph.
            return []
        op, name, _, text = m.groups()
        if "expected to have type but instead is null" in text:
            continue  # the node reads an output inference could not type: a consequence, reported at its cause
        found.append(f"{op} (node {name or ''!r}): shape inference: {text.strip()}")
    return found


def schema_of(op_type: str, opset: int, domain: str = "") -> onnx.defs.OpSchema | None:
    """The ONNX schema of an op at an opset, None for an op ONNX does not define there."""
    if not isinstance(op_type, str) or not isinstance(domain, str):  # a name that is not valid UTF-8 parses as bytes
        return None
    try:
        return onnx.defs.get_schema(op_type, opset, domain)
    except onnx.defs.SchemaError:
        return None


def _value_infos(g: onnx.GraphProto) -> Iterator[onnx.ValueInfoProto]:
    yield from g.input
    yield from g.value_info
    yield from g.output


def _type_str(t: onnx.TypeProto) -> str | None:
    """The type as ONNX schemas spell it ("tensor(float)", "seq(tensor(int64))"); None if not known."""
    kind = t.WhichOneof("value")
    if kind == "tensor_type":
        elem = t.tensor_type.elem_type
        if elem == onnx.TensorProto.UNDEFINED or elem not in onnx.TensorProto.DataType.values():
            return None
        return f"tensor({onnx.TensorProto.DataType.Name(elem).lower()})"
    if kind in ("sequence_type", "optional_type"):
        inner = _type_str(getattr(t, kind).elem_type)
        return inner and f"{'seq' if kind == 'sequence_type' else 'optional'}({inner})"
    return None


def _attr_type_name(t: int) -> str:
    try:
        return onnx.AttributeProto.AttributeType.Name(t)
    except ValueError:
        return f"attribute type {t}"

"""Structural checks of an imported graph, at load: what ONNX Runtime rejects before running anything.

Every node input must be a graph input, an initializer or an earlier node's output (ONNX graphs are topologically
sorted), every graph output must be produced, and a node of the default domain must have the input and output
counts its schema allows, with no required input left empty. Errors are ValueErrors naming the node, the input and
what was expected, so a malformed model fails at load instead of at its first run. Every problem found is listed in
one error, as unsupported ops are, with those the importer found against the ONNX schemas (validate_schema.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx.defs

from ..ir import Graph, Node
from .validate_schema import schema_of

_OPTIONAL = onnx.defs.OpSchema.FormalParameterOption.Optional
_VARIADIC = onnx.defs.OpSchema.FormalParameterOption.Variadic


def check_structure(graph: Graph, schema_problems: Sequence[str] = ()) -> None:
    problems: list[str] = []
    _structure(graph, set(), problems)
    problems += schema_problems
    if len(problems) == 1:
        raise ValueError(problems[0])
    if problems:
        raise ValueError(f"{len(problems)} problems in the graph:\n" + "\n".join(f"  - {p}" for p in problems))


def _structure(graph: Graph, outer: set[str], problems: list[str], inside: str = "") -> None:
    """The checks of one graph; a subgraph (If's branches, Loop's body) also sees the values its enclosing graphs
    define before the node that holds it (`outer`)."""
    available = outer | {vi.name for vi in graph.inputs} | set(graph.initializers)
    produced = {o for n in graph.nodes for o in n.outputs if o}
    for node in graph.nodes:
        missing = [name for name in node.inputs if name and name not in available]
        if missing:
            where = "is produced only by a later node (the graph is not topologically sorted)" \
                if all(name in produced for name in missing) else "is no graph input, initializer or node output"
            problems.append(f"{node.describe()}{inside}: input(s) {missing} {where}")
        problems += [p.replace(": ", f"{inside}: ", 1) if inside else p for p in _arity_problems(node)]
        for key, sub in node.attrs.items():
            if isinstance(sub, Graph):
                _structure(sub, available, problems, f" (in {key} of {node.describe()}{inside})")
        available.update(o for o in node.outputs if o)
    unproduced = [vi.name for vi in graph.outputs if vi.name not in available]
    if unproduced:
        what = "subgraph" if inside else "graph"
        problems.append(f"{what} output(s) {unproduced}{inside} are produced by no node and are no input or "
                        "initializer")


def _arity_problems(node: Node) -> list[str]:
    if node.domain not in ("", "ai.onnx"):
        return []  # contrib and ember domains: the op's own implementation checks its inputs
    schema = schema_of(node.op_type, node.opset, node.domain)
    if schema is None:
        return []  # not an ONNX op at this opset: check_supported reports it
    problems = []
    given = len(node.inputs)
    if given < schema.min_input or given > schema.max_input:
        problems.append(f"{node.describe()}: {given} input(s), the schema allows "
                        f"{_range(schema.min_input, schema.max_input)}")
    outputs = len(node.outputs)
    if outputs < schema.min_output or outputs > schema.max_output:
        problems.append(f"{node.describe()}: {outputs} output(s), the schema allows "
                        f"{_range(schema.min_output, schema.max_output)}")
    for i, formal in enumerate(schema.inputs[:given]):
        if formal.option not in (_OPTIONAL, _VARIADIC) and not node.inputs[i]:
            problems.append(f"{node.describe()}: required input {i} ({formal.name!r}) is empty")
    return problems


def _range(low: int, high: int) -> str:
    return str(low) if low == high else f"{low} to {high}" if high < 2**31 - 1 else f"{low} or more"

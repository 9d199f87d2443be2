"""The one typed graph IR: values with dtype and (maybe symbolic) shape, nodes in topological order."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Dim = int | str | None  # int: fixed; str: symbolic (e.g. "batch"); None: unknown
Shape = tuple[Dim, ...]


@dataclass
class ValueInfo:
    name: str
    dtype: np.dtype | None
    shape: Shape | None  # None: rank unknown
    kind: str = "tensor"  # or "sequence", "optional" (host values: a list of arrays, an array or None)

    def __repr__(self) -> str:
        dims = "?" if self.shape is None else "x".join(str(d) for d in self.shape) or "scalar"
        return f"{self.name}: {self.dtype} [{dims}]"


@dataclass
class Node:
    op_type: str
    domain: str
    inputs: list[str]  # "" marks an omitted optional input
    outputs: list[str]
    attrs: dict[str, Any]
    name: str
    opset: int  # the model's opset version for this node's domain
    # Values of enclosing graphs that this node's subgraphs (If's branches, Loop's body) read by name: uses of
    # them as real as `inputs`, for liveness, dead-node removal and the structural checks.
    implicit: list[str] = field(default_factory=list)
    # The node as the file wrote it, kept only for ops that run through onnx.reference (ops/reference.py).
    proto: Any = None

    def subgraphs(self) -> list[Graph]:
        return [v for v in self.attrs.values() if isinstance(v, Graph)]

    def describe(self) -> str:
        dom = self.domain or "ai.onnx"
        return f"{self.op_type} (domain {dom}, opset {self.opset}, node {self.name!r})"


@dataclass
class Graph:
    nodes: list[Node]
    inputs: list[ValueInfo]  # graph inputs fed by the user (initializers excluded)
    outputs: list[ValueInfo]
    initializers: dict[str, np.ndarray]
    value_info: dict[str, ValueInfo] = field(default_factory=dict)
    opsets: dict[str, int] = field(default_factory=dict)
    name: str = ""

    def producers(self) -> dict[str, Node]:
        return {o: n for n in self.nodes for o in n.outputs if o}

    def use_counts(self) -> dict[str, int]:
        """How many times each value is read: by node inputs (a subgraph's reads of it count once for the node
        holding the subgraph), and once more per graph output it is."""
        count: dict[str, int] = {}
        for n in self.nodes:
            for i in (*n.inputs, *n.implicit):
                if i:
                    count[i] = count.get(i, 0) + 1
        for o in self.outputs:
            count[o.name] = count.get(o.name, 0) + 1
        return count

    def consumers(self) -> dict[str, list[Node]]:
        out: dict[str, list[Node]] = {}
        for n in self.nodes:
            for i in (*n.inputs, *n.implicit):
                if i:
                    out.setdefault(i, []).append(n)
        return out

    def all_nodes(self) -> Iterator[Node]:
        """Every node, those inside subgraphs too (after the node holding them)."""
        for n in self.nodes:
            yield n
            for g in n.subgraphs():
                yield from g.all_nodes()

    def outer_names(self) -> list[str]:
        """Values this graph (as a subgraph) reads that neither it nor its own subgraphs define: names of an
        enclosing graph's values, in first-read order."""
        defined = {vi.name for vi in self.inputs} | set(self.initializers)
        out: dict[str, None] = {}
        for n in self.nodes:
            for i in (*n.inputs, *n.implicit):
                if i and i not in defined:
                    out[i] = None
            defined.update(o for o in n.outputs if o)
        for vi in self.outputs:
            if vi.name not in defined:
                out[vi.name] = None
        return list(out)

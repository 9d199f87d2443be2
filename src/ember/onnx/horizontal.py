"""Horizontal fusion at load: MatMuls that read the same activation with constant weights of one K (a block's
Q, K and V projections; an MLP's gate and up) become one MatMul over the weights side by side, its result cut
back into the original outputs by Slices, which are views. A decode step is memory-bound and pays per dispatch:
one wide product reads the same bytes in one kernel. A constant bias added to every product (Linear with bias)
joins as one Add over the biases side by side, so it stays the product's epilogue."""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node

_MIN_SLICE_OPSET = 10  # Slice with its bounds as inputs


def _member(graph: Graph, readers: dict[str, list[Node]], uses: dict[str, int], outputs: set[str],
            n: Node) -> tuple[np.ndarray, np.ndarray | None, Node | None] | None:
    """(weight, bias or None, the bias Add or None) for a MatMul that can join a group, else None."""
    w = graph.initializers.get(n.inputs[1]) if n.op_type == "MatMul" and not n.domain and len(n.inputs) == 2 \
        else None
    if w is None or w.ndim != 2 or w.dtype.kind != "f":
        return None
    out = n.outputs[0]
    rs = readers.get(out, [])
    add = rs[0] if len(rs) == 1 else None
    if add is not None and uses.get(out, 0) == 1 and out not in outputs and add.op_type == "Add" \
            and not add.domain:
        other = add.inputs[1] if add.inputs[0] == out else add.inputs[0]
        b = graph.initializers.get(other)
        if b is not None and b.dtype == w.dtype and b.shape == (w.shape[1],):
            return w, b, add
    return w, None, None


def merge_parallel_matmuls(graph: Graph) -> int:
    """Merge each group of MatMuls reading one value (same weight dtype and K, all with a constant bias Add or
    none); returns the number of MatMuls removed."""
    opset = graph.opsets.get("", 0)
    if opset < _MIN_SLICE_OPSET:
        return 0
    readers, uses = graph.consumers(), graph.use_counts()
    outputs = {o.name for o in graph.outputs}
    replace: dict[int, list[Node]] = {}  # id of the group's first node -> the nodes that stand in its place
    dead: set[int] = set()
    merged = 0
    for name, nodes in readers.items():
        group = []
        for n in nodes:
            if n.inputs and n.inputs[0] == name and id(n) not in dead:
                m = _member(graph, readers, uses, outputs, n)
                if m is not None:
                    group.append((n, *m))
        if len(group) < 2:
            continue
        k, dtype, biased = group[0][1].shape[0], group[0][1].dtype, group[0][2] is not None
        group = [g for g in group if g[1].shape[0] == k and g[1].dtype == dtype and (g[2] is not None) == biased]
        if len(group) < 2:
            continue
        first = group[0][0]
        base = f"{first.name or first.outputs[0]}/merged"
        wname, out = f"{base}/weight", f"{base}/output"
        graph.initializers[wname] = np.concatenate([g[1] for g in group], axis=1)
        new = [Node("MatMul", "", [name, wname], [out], {}, f"{base}/MatMul", opset)]
        if biased:
            bname, summed = f"{base}/bias", f"{base}/biased"
            graph.initializers[bname] = np.concatenate([g[2] for g in group])
            new.append(Node("Add", "", [out, bname], [summed], {}, f"{base}/Add", opset))
            out = summed
        graph.initializers[f"{base}/axes"] = np.array([-1], np.int64)
        start = 0
        for i, (n, w, _b, add) in enumerate(group):
            bounds = [f"{base}/starts{i}", f"{base}/ends{i}"]
            graph.initializers[bounds[0]] = np.array([start], np.int64)
            graph.initializers[bounds[1]] = np.array([start + w.shape[1]], np.int64)
            start += w.shape[1]
            target = (add if add is not None else n).outputs[0]
            new.append(Node("Slice", "", [out, *bounds, f"{base}/axes"], [target], {}, f"{base}/Slice{i}", opset))
            dead.update({id(n)} | ({id(add)} if add is not None else set()))
        # The group's nodes all read `name`; the first of them in graph order is where the merged nodes go.
        replace[id(min((g[0] for g in group), key=graph.nodes.index))] = new
        merged += len(group) - 1
    if merged:
        nodes = []
        for n in graph.nodes:
            nodes.extend(replace.get(id(n), []))
            if id(n) not in dead:
                nodes.append(n)
        graph.nodes = nodes
    return merged

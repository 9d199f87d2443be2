"""Graph clean-up at load, before any plan: fold constants, drop no-op nodes, fold BatchNorm into Conv,
and rewrite x * sigmoid(x) as one SiLU node so it can join a Conv's epilogue."""

from __future__ import annotations

import numpy as np

from ..ir import Graph, Node
from ..ops import UnsupportedError, lookup

EMBER_DOMAIN = "ai.ember"


def optimize(graph: Graph) -> dict[str, int]:
    """Rewrite `graph` in place; returns how many times each rewrite applied."""
    stats = {
        "constants_folded": fold_constants(graph),
        "identities_dropped": drop_identities(graph),
        "batchnorms_folded": fold_conv_batchnorm(graph),
        "silu_fused": fuse_silu(graph),
    }
    stats["dead_nodes_removed"] = remove_dead(graph)
    return stats


def _uses(graph: Graph) -> dict[str, int]:
    count: dict[str, int] = {}
    for n in graph.nodes:
        for i in n.inputs:
            if i:
                count[i] = count.get(i, 0) + 1
    for o in graph.outputs:
        count[o.name] = count.get(o.name, 0) + 1
    return count


def _rename_input(graph: Graph, old: str, new: str) -> None:
    for n in graph.nodes:
        n.inputs = [new if i == old else i for i in n.inputs]


def fold_constants(graph: Graph) -> int:
    """Nodes whose inputs are all initializers become initializers (weights computed by ConstantOfShape,
    Constant nodes, Shape-free arithmetic on weights)."""
    from ..ops.base import T
    from ..plan.planner import _fold

    folded = 0
    keep = []
    for node in graph.nodes:
        cls = lookup(node)
        consts = [i for i in node.inputs if i]
        if cls is None or not all(i in graph.initializers for i in consts):
            keep.append(node)
            continue
        try:
            ins = [T(graph.initializers[i].dtype, graph.initializers[i].shape, value=graph.initializers[i]) if i
                   else None for i in node.inputs]
            outs = _fold(cls(node), ins)
        except (UnsupportedError, ValueError, TypeError, IndexError):
            keep.append(node)  # left for the planner, which reports the problem with the shapes in hand
            continue
        for name, t in zip(node.outputs, outs, strict=False):
            if name and t is not None:
                graph.initializers[name] = t.value
        folded += 1
    graph.nodes = keep
    return folded


def drop_identities(graph: Graph) -> int:
    outputs = {o.name for o in graph.outputs}
    dropped = 0
    keep = []
    for n in graph.nodes:
        single = len([o for o in n.outputs if o]) == 1 and n.outputs[0]
        training = n.inputs[2] if n.op_type == "Dropout" and len(n.inputs) > 2 else ""
        if (n.domain == "" and single and n.outputs[0] not in outputs
                and (n.op_type == "Identity" or (n.op_type == "Dropout" and not training))):
            _rename_input(graph, n.outputs[0], n.inputs[0])
            dropped += 1
            continue
        keep.append(n)
    graph.nodes = keep
    return dropped


def fold_conv_batchnorm(graph: Graph) -> int:
    """Conv -> BatchNormalization (inference, constant statistics) becomes one Conv with scaled weights."""
    uses = _uses(graph)
    consumers = graph.consumers()
    inits = graph.initializers
    folded = 0
    dead: set[int] = set()
    for conv in graph.nodes:
        if conv.op_type != "Conv" or conv.domain or uses.get(conv.outputs[0], 0) != 1:
            continue
        (bn,) = consumers.get(conv.outputs[0], [None])
        if bn is None or bn.op_type != "BatchNormalization" or bn.inputs[0] != conv.outputs[0]:
            continue
        if bn.attrs.get("training_mode", 0) or len([o for o in bn.outputs if o]) != 1:
            continue
        params = bn.inputs[1:5]
        w_name = conv.inputs[1]
        b_name = conv.inputs[2] if len(conv.inputs) > 2 else ""
        if not all(p in inits for p in params) or w_name not in inits or (b_name and b_name not in inits):
            continue
        w = inits[w_name]
        if w.dtype.kind != "f":
            continue
        scale, beta, mean, var = (inits[p].astype(np.float64) for p in params)
        a = scale / np.sqrt(var + bn.attrs.get("epsilon", 1e-5))
        b0 = inits[b_name].astype(np.float64) if b_name else np.zeros(w.shape[0])
        new_w, new_b = f"{w_name}__bn_{folded}", f"{bn.outputs[0]}__bias"
        inits[new_w] = (w.astype(np.float64) * a.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype)
        inits[new_b] = ((b0 - mean) * a + beta).astype(w.dtype)
        conv.inputs = [conv.inputs[0], new_w, new_b]
        conv.outputs = [bn.outputs[0]]
        dead.add(id(bn))
        folded += 1
    graph.nodes = [n for n in graph.nodes if id(n) not in dead]
    return folded


def fuse_silu(graph: Graph) -> int:
    """Mul(x, Sigmoid(x)) -> ai.ember.Silu(x): one op, so a producing Conv can apply it in its epilogue."""
    uses = _uses(graph)
    producers = graph.producers()
    fused = 0
    dead: set[int] = set()
    for mul in graph.nodes:
        if mul.op_type != "Mul" or mul.domain or len(mul.inputs) != 2:
            continue
        for x, s in (mul.inputs, mul.inputs[::-1]):
            sig = producers.get(s)
            if sig is not None and sig.op_type == "Sigmoid" and sig.inputs[0] == x and uses.get(s, 0) == 1:
                mul.op_type, mul.domain, mul.inputs, mul.attrs = "Silu", EMBER_DOMAIN, [x], {}
                mul.opset = 1
                dead.add(id(sig))
                fused += 1
                break
    graph.nodes = [n for n in graph.nodes if id(n) not in dead]
    return fused


def remove_dead(graph: Graph) -> int:
    live = {o.name for o in graph.outputs}
    keep: list[Node] = []
    for n in reversed(graph.nodes):
        if any(o in live for o in n.outputs if o):
            keep.append(n)
            live.update(i for i in n.inputs if i)
    removed = len(graph.nodes) - len(keep)
    graph.nodes = keep[::-1]
    for name in list(graph.initializers):
        if name not in live:
            del graph.initializers[name]
    return removed

"""Graph clean-up at load, before any plan: fold constants, drop no-op nodes, fold BatchNorm into Conv,
rewrite x * sigmoid(x) as one SiLU node so it can join a Conv's epilogue, and the transformer patterns
(onnx/patterns.py) into fused ai.ember nodes, keeping why a near match was rejected; then nodes that compute
the same value twice become one (an exporter's per-layer copy of the attention mask)."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ir import Graph, Node
from ..ops import Tensor, UnsupportedError, lookup
from ..ops.transformer import PATTERNS, parse_fallback
from ..plan import fold
from .horizontal import merge_parallel_matmuls
from .pattern_rotary import match_rotary
from .patterns import (
    EMBER_DOMAIN,
    Misses,
    fuse,
    match_attention,
    match_gelu,
    match_layernorm,
    match_quickgelu,
    match_rmsnorm,
)

# Each transformer pattern's matcher and the op types of its anchor nodes (onnx/patterns.py).
_PATTERNS = (("layernorm", ("ReduceMean",), match_layernorm), ("rmsnorm", ("ReduceMean",), match_rmsnorm),
             ("gelu", ("Erf", "Tanh"), match_gelu), ("quickgelu", ("Sigmoid",), match_quickgelu),
             ("attention", ("Softmax",), match_attention), ("rotary", ("Neg",), match_rotary))


class Rewrites(dict[str, int]):
    """optimize()'s counts: how often each rewrite applied, and "<pattern>.near_miss", the anchors of a pattern
    whose chain was rejected; `misses` says why, one {"pattern", "node", "reason"} per near miss in graph order."""

    misses: list[dict[str, str]]


def optimize(graph: Graph) -> Rewrites:
    """Rewrite `graph` in place; returns how many times each rewrite applied, and the near misses."""
    stats = Rewrites(constants_folded=fold_constants(graph), identities_dropped=drop_identities(graph),
                     batchnorms_folded=fold_conv_batchnorm(graph), silu_fused=fuse_silu(graph))
    misses = Misses()
    for pattern, anchors, match in _PATTERNS:
        stats[f"{pattern}_fused"] = fuse(graph, pattern, anchors, match, misses)
    stats["matmuls_merged"] = merge_parallel_matmuls(graph)
    stats["duplicates_merged"] = merge_duplicates(graph)
    stats["dead_nodes_removed"] = remove_dead(graph)
    stats.misses = misses.report(graph)
    for pattern, *_ in _PATTERNS:
        stats[f"{pattern}.near_miss"] = sum(m["pattern"] == pattern for m in stats.misses)
    return stats


def fusion_misses(rewrites: dict[str, int], plan_stats: dict[str, Any]) -> list[dict[str, str]]:
    """plan_info()'s "fusion_misses": the load-time near misses (optimize's Rewrites.misses), then the fused arms
    this plan's ops declined at plan time (their "<pattern>.fallback[<node>]: <reason>" counters)."""
    planned = [parse_fallback(k) for k in plan_stats if k.split(".", 1)[0] in PATTERNS]
    return [*getattr(rewrites, "misses", []), *(p for p in planned if p is not None)]


def _rename_input(graph: Graph, old: str, new: str) -> None:
    """Every read of `old` becomes one of `new`, inside subgraphs too (unless a subgraph defines its own `old`)."""
    for n in graph.nodes:
        _rename_in_node(n, old, new)


def _rename_in_node(n: Node, old: str, new: str) -> None:
    """Node n's reads of `old` become reads of `new`, its subgraphs' outer-scope reads included."""
    n.inputs = [new if i == old else i for i in n.inputs]
    if old in n.implicit:
        n.implicit = list(dict.fromkeys(new if i == old else i for i in n.implicit))
        for sub in n.subgraphs():
            if old not in {vi.name for vi in sub.inputs} | set(sub.initializers):
                _rename_input(sub, old, new)
                for vi in sub.outputs:  # a branch that returns the outer value itself
                    if vi.name == old:
                        vi.name = new


def fold_constants(graph: Graph) -> int:
    """Nodes whose inputs are all initializers become initializers (weights computed by ConstantOfShape,
    Constant nodes, Shape-free arithmetic on weights)."""
    folded = 0
    keep = []
    for node in graph.nodes:
        cls = lookup(node)
        consts = [i for i in node.inputs if i]
        if cls is None or cls.scoped or getattr(cls, "always_host", False) or \
                not all(i in graph.initializers for i in consts):
            keep.append(node)
            continue
        try:
            ins = [Tensor(graph.initializers[i].dtype, graph.initializers[i].shape, value=graph.initializers[i]) if i
                   else None for i in node.inputs]
            outs = fold(cls(node), ins)
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
    uses = graph.use_counts()
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
    uses = graph.use_counts()
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
            live.update(i for i in (*n.inputs, *n.implicit) if i)
    removed = len(graph.nodes) - len(keep)
    graph.nodes = keep[::-1]
    for name in list(graph.initializers):
        if name not in live:
            del graph.initializers[name]
    return removed


# Ops whose outputs differ between two identical nodes.
_NONDETERMINISTIC = {"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike", "Multinomial",
                     "Bernoulli", "Dropout"}
_SMALL_CONSTANT = 256  # elements: small initializers are keyed by value (a mask's 0 and -inf, one per layer)


def _frozen(value: Any) -> Any:
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if isinstance(value, (list, tuple)):
        return tuple(_frozen(v) for v in value)
    hash(value)
    return value


def merge_duplicates(graph: Graph) -> int:
    """Common subexpressions: small initializers with equal values become one, then each node computing what an
    earlier node computes (same op, attributes and inputs) is dropped and its outputs read from the earlier one.
    Runs after the pattern matchers, which see the graph as exported."""
    outputs = {o.name for o in graph.outputs}
    rename: dict[str, str] = {}
    by_value: dict[Any, str] = {}
    for name, value in graph.initializers.items():
        if value.size <= _SMALL_CONSTANT and value.dtype != object and name not in outputs:
            rename[name] = by_value.setdefault(("const", value.dtype.str, value.shape, value.tobytes()), name)
    rename = {k: v for k, v in rename.items() if k != v}
    seen: dict[Any, Node] = {}
    keep: list[Node] = []
    merged = 0
    for n in graph.nodes:
        if n.subgraphs():
            for old in [i for i in (*n.inputs, *n.implicit) if i in rename]:
                _rename_in_node(n, old, rename[old])
            keep.append(n)
            continue
        n.inputs = [rename.get(i, i) for i in n.inputs]
        try:
            key = (n.domain, n.op_type, n.opset, tuple(n.inputs), tuple(sorted((k, _frozen(v))
                                                                         for k, v in n.attrs.items())))
        except TypeError:
            keep.append(n)
            continue
        first = seen.get(key)
        if (first is None or n.op_type in _NONDETERMINISTIC or len(first.outputs) != len(n.outputs)
                or any(o in outputs or (o and not p) for o, p in zip(n.outputs, first.outputs, strict=True))):
            seen.setdefault(key, n)
            keep.append(n)
            continue
        for o, p in zip(n.outputs, first.outputs, strict=True):
            if o:
                rename[o] = p
        merged += 1
    graph.nodes = keep
    return merged

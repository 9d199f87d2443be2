"""The transformer patterns of the load-time rewrites: exporters spell LayerNorm, RMSNorm, GELU, QuickGELU and
attention as chains of primitive nodes; each matcher turns a chain into one ai.ember node whose op runs the fused
kernel (and counts it, see ops/transformer.py).

Each matcher starts at an anchor node that opens its pattern (a ReduceMean read by Sub(x, mean), a ReduceMean of a
square, an Erf/Tanh read by Add(·, 1), a Sigmoid of x * alpha, a Softmax whose probabilities a MatMul reads).
An anchor whose chain is then rejected is a near miss: `Misses` keeps why (the condition that failed), and
optimize() reports it as `Rewrites.misses` and counts it as "<pattern>.near_miss", so a missed fusion is visible.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from ..ir import Graph, Node

EMBER_DOMAIN = "ai.ember"
Fusion = tuple[set[str], Node, Node]  # the values whose producers die, the new node, the node it replaces
Match = Fusion | str | None  # a fusion, a near miss's reason, or not this pattern's start


class Misses:
    """Near misses by (pattern, anchor): the last reason a rescan gave; anchors a later rewrite consumed drop."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, int], tuple[str, Node, str]] = {}

    def add(self, pattern: str, anchor: Node, reason: str) -> None:
        self._by[(pattern, id(anchor))] = (pattern, anchor, reason)

    def report(self, graph: Graph) -> list[dict[str, str]]:
        order = {id(n): i for i, n in enumerate(graph.nodes)}
        live = sorted((v for v in self._by.values() if id(v[1]) in order), key=lambda v: order[id(v[1])])
        return [{"pattern": p, "node": a.name or f"{a.op_type} -> {a.outputs[0]}", "reason": r} for p, a, r in live]


class _Matcher:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.producers = graph.producers()
        self.uses = graph.use_counts()
        self.readers = graph.consumers()
        self.outputs = {o.name for o in graph.outputs}
        self.infos = {**{v.name: v for v in graph.inputs}, **graph.value_info, **{v.name: v for v in graph.outputs}}

    def node(self, name: str, *op_types: str) -> Node | None:
        n = self.producers.get(name)
        return n if n is not None and n.domain == "" and n.op_type in op_types else None

    def op_of(self, name: str) -> str:
        """What produces `name`, for a reason's text."""
        n = self.producers.get(name)
        if n is not None:
            return n.op_type
        return "a constant" if name in self.graph.initializers else "a graph input"

    def scalar(self, name: str) -> float | None:
        v = self.graph.initializers.get(name)
        return float(v.reshape(-1)[0]) if v is not None and v.size == 1 and v.dtype.kind == "f" else None

    def other(self, n: Node, name: str) -> str | None:
        """The input of a two-input node that is not `name`."""
        if len(n.inputs) != 2 or name not in n.inputs:
            return None
        return n.inputs[1] if n.inputs[0] == name else n.inputs[0]

    def single(self, name: str) -> bool:
        return self.uses.get(name, 0) == 1 and name not in self.outputs

    def reader(self, name: str, *op_types: str) -> Node | None:
        """The node of `op_types` (ONNX domain) reading `name`, if there is one."""
        return next((n for n in self.readers.get(name, []) if not n.domain and n.op_type in op_types), None)

    def shape(self, name: str) -> tuple | None:
        if name in self.graph.initializers:
            return self.graph.initializers[name].shape
        vi = self.infos.get(name)
        return None if vi is None or vi.shape is None else tuple(vi.shape)

    def last_axis(self, name: str, axis: int) -> bool:
        shape = self.shape(name)
        return axis == -1 or (shape is not None and axis == len(shape) - 1)

    def mean_axes(self, n: Node) -> list[int] | str:
        """The axes a ReduceMean keeps (keepdims) and reduces, or why they are not usable."""
        if n.attrs.get("keepdims", 1) != 1:
            return "the ReduceMean drops the reduced axis (keepdims=0)"
        if len(n.inputs) > 1 and n.inputs[1]:
            v = self.graph.initializers.get(n.inputs[1])
            return "the ReduceMean's axes are not a constant" if v is None else [int(a) for a in v.reshape(-1)]
        axes = n.attrs.get("axes")
        return "the ReduceMean reduces every axis (no axes)" if axes is None else list(axes)

    def one_axis(self, n: Node) -> int | str:
        axes = self.mean_axes(n)
        if isinstance(axes, str):
            return axes
        return axes[0] if len(axes) == 1 else f"the ReduceMean reduces axes {axes}, not one"

    def square_of(self, name: str) -> str | None:
        """x if `name` is Pow(x, 2) or Mul(x, x)."""
        n = self.node(name, "Pow", "Mul")
        if n is None:
            return None
        if n.op_type == "Pow" and self.scalar(n.inputs[1]) == 2.0:
            return n.inputs[0]
        if n.op_type == "Mul" and n.inputs[0] == n.inputs[1]:
            return n.inputs[0]
        return None

    def eps_sqrt(self, name: str) -> tuple[str, float, list[str]] | str:
        """(v, eps, names) if `name` is Sqrt(Add(v, eps)), else why not."""
        s = self.node(name, "Sqrt")
        if s is None:
            return f"the divisor is {self.op_of(name)}, not Sqrt(variance + epsilon)"
        add = self.node(s.inputs[0], "Add")
        if add is None:
            return f"the Sqrt's input is {self.op_of(s.inputs[0])}, not an Add of epsilon"
        for v, e in (add.inputs, add.inputs[::-1]):
            eps = self.scalar(e)
            if eps is not None:
                if not (self.single(s.inputs[0]) and self.single(v)):
                    return "the variance or variance + epsilon has readers outside the chain"
                return v, eps, [s.inputs[0], v]
        return "epsilon is not a constant (neither operand of the Add under the Sqrt is a constant scalar)"

    def noop_cast(self, name: str, x: str) -> str | None:
        """The output of the Cast that alone reads `name`, if that Cast is a no-op: `x` (whose dtype `name` has)
        is itself a Cast to the same type (the TorchScript export of transformers' RMSNorm casts both ways)."""
        cons = self.readers.get(name, [])
        src = self.node(x, "Cast")
        if len(cons) != 1 or not self.single(name) or src is None:
            return None
        cast = cons[0]
        if cast.op_type != "Cast" or cast.domain or cast.attrs.get("to") != src.attrs.get("to"):
            return None
        return cast.outputs[0]

    def affine_tail(self, name: str, ops: tuple[str, ...] = ("Mul", "Add")) -> tuple[str, str | None, str | None]:
        """Follow an optional Mul(·, gamma) then Add(·, beta) with constant vectors; returns (out, gamma, beta)."""
        out, gamma, beta = name, None, None
        for op_type in ops:
            cons = self.readers.get(out, [])
            if len(cons) != 1 or not self.single(out):
                break
            n = cons[0]
            if n.op_type != op_type or n.domain:
                break
            other = self.other(n, out)
            if other is None or other not in self.graph.initializers or self.graph.initializers[other].ndim > 1:
                break
            if op_type == "Mul":
                gamma = other
            else:
                beta = other
            out = n.outputs[0]
        return out, gamma, beta

    def nan_guard(self, name: str) -> tuple[str, list[str]] | None:
        """(p, [the guard's values]) if `name` is Where(IsNaN(p), 0, p) and p is read by the guard only."""
        w = self.node(name, "Where")
        if w is None or len(w.inputs) != 3 or not self.single(name):
            return None
        isnan = self.node(w.inputs[0], "IsNaN")
        p = w.inputs[2]
        if isnan is None or isnan.inputs[0] != p or self.scalar(w.inputs[1]) != 0.0 or not self.single(w.inputs[0]):
            return None
        if self.uses.get(p, 0) != 2 or p in self.outputs:
            return None
        return p, [w.inputs[0]]


def _replace(graph: Graph, dead_outputs: set[str], new: Node, anchor: Node) -> None:
    """Drop the nodes producing `dead_outputs` and put `new` where `anchor` was."""
    nodes = []
    for n in graph.nodes:
        if n is anchor:
            nodes.append(new)
        elif not (set(n.outputs) & dead_outputs):
            nodes.append(n)
    graph.nodes = nodes


def _tail_names(start: str, end: str, m: _Matcher) -> set[str]:
    """Outputs of the affine tail nodes between start (exclusive) and end (inclusive)."""
    names, cur = set(), start
    while cur != end:
        (n,) = m.readers[cur]
        cur = n.outputs[0]
        names.add(cur)
    return names


def fuse(graph: Graph, pattern: str, anchors: tuple[str, ...], match: Callable[[_Matcher, Node], Match],
         misses: Misses) -> int:
    """Apply `match` at every anchor node (ONNX domain, op type in `anchors`) until none fuses; count fusions."""
    count = 0
    while True:
        m = _Matcher(graph)
        for n in graph.nodes:
            if n.domain or n.op_type not in anchors:
                continue
            found = match(m, n)
            if isinstance(found, str):
                misses.add(pattern, n, found)
            elif found is not None:
                _replace(graph, *found)
                count += 1
                break
        else:
            return count


def match_layernorm(m: _Matcher, mean: Node) -> Match:
    """ReduceMean / Sub / Pow / ReduceMean / Add(eps) / Sqrt / Div [* gamma] [+ beta] -> ai.ember.LayerNorm,
    anchored at the first ReduceMean (read by Sub(x, mean))."""
    x, mo = mean.inputs[0], mean.outputs[0]
    sub = next((n for n in m.readers.get(mo, []) if n.op_type == "Sub" and not n.domain and n.inputs == [x, mo]),
               None)
    if sub is None:
        return None
    axis = m.one_axis(mean)
    if isinstance(axis, str):
        return axis
    if not m.single(mo):
        return "the mean has readers besides Sub(x, mean)"
    d = sub.outputs[0]
    div = next((n for n in m.readers.get(d, []) if n.op_type == "Div" and not n.domain and n.inputs[0] == d), None)
    if div is None:
        return "x - mean is not divided by the deviation (no Div(x - mean, ·) reads it)"
    es = m.eps_sqrt(div.inputs[1])
    if isinstance(es, str):
        return es
    v, eps, inner = es
    var = m.node(v, "ReduceMean")
    if var is None:
        return f"the variance is {m.op_of(v)}, not a ReduceMean"
    vaxis = m.one_axis(var)
    if isinstance(vaxis, str):
        return f"the variance: {vaxis}"
    if vaxis != axis:
        return f"the variance reduces axis {vaxis}, the mean axis {axis} (different axes)"
    sq = m.node(var.inputs[0], "Pow", "Mul")
    if sq is not None and sq.op_type == "Pow" and sq.inputs[0] == d and m.scalar(sq.inputs[1]) != 2.0:
        return "the variance's square is a Pow whose exponent is not the constant 2"
    if m.square_of(var.inputs[0]) != d:
        return "the variance is not the mean of (x - mean)² (different inputs)"
    if m.uses.get(d) != 2 or d in m.outputs:
        return f"x - mean has {m.uses.get(d, 0)} readers; the chain reads it twice (its square and the Div)"
    if not m.single(var.inputs[0]) or not m.single(div.inputs[1]):
        return "the square or the deviation has readers outside the chain"
    out, gamma, beta = m.affine_tail(div.outputs[0])
    dead = {mo, d, var.inputs[0], v, div.inputs[1], div.outputs[0], *inner} | _tail_names(div.outputs[0], out, m)
    new = Node("LayerNorm", EMBER_DOMAIN, [x, gamma or "", beta or ""], [out], {"axis": axis, "epsilon": eps},
               f"{div.name}/layernorm", 1)
    return dead, new, div


def _centred(m: _Matcher, x: str) -> bool:
    """Is x the Sub(y, ReduceMean(y)) of a LayerNorm chain (which match_layernorm reports on)?"""
    sub = m.node(x, "Sub")
    mean = m.node(sub.inputs[1], "ReduceMean") if sub is not None else None
    return mean is not None and mean.inputs[0] == sub.inputs[0]


def match_rmsnorm(m: _Matcher, mean: Node) -> Match:
    """Pow / ReduceMean / Add(eps) / Sqrt / (Reciprocal or Div(1, ·), Mul | Div) [* gamma] -> ai.ember.RMSNorm,
    anchored at the ReduceMean of the square."""
    x = m.square_of(mean.inputs[0])
    add = m.reader(mean.outputs[0], "Add")
    if x is None or add is None:
        return None
    found = _rms_chain(m, mean, x, add)
    return None if isinstance(found, str) and _centred(m, x) else found


def _rms_chain(m: _Matcher, mean: Node, x: str, add: Node) -> Match:
    axis = m.one_axis(mean)
    if isinstance(axis, str):
        return axis
    if not m.single(mean.inputs[0]):
        return "the square has readers outside the chain"
    if m.other(add, mean.outputs[0]) is None or m.scalar(m.other(add, mean.outputs[0]) or "") is None:
        return "epsilon is not a constant (the Add after the mean of squares has no constant scalar operand)"
    sqrt = m.reader(add.outputs[0], "Sqrt")
    if sqrt is None:
        return "mean(x²) + epsilon is not square-rooted (no Sqrt reads it)"
    s = sqrt.outputs[0]
    es = m.eps_sqrt(s)
    if isinstance(es, str):
        return es
    _, eps, inner = es
    if not m.single(s):
        return "the root has readers outside the chain"
    dead = {s, mean.inputs[0], mean.outputs[0], *inner}
    last = m.reader(s, "Div", "Reciprocal")
    if last is None:
        return f"the root is read by {m.readers[s][0].op_type}, not Div or Reciprocal"
    if last.op_type == "Div" and last.inputs[1] != s:
        return "the root is the Div's numerator, not its divisor"
    if last.op_type == "Reciprocal" or last.inputs[0] != x:
        numerator = None if last.op_type == "Reciprocal" else m.scalar(last.inputs[0])
        if last.op_type == "Div" and numerator is None:
            return f"the Div normalises {last.inputs[0]}, not the squared input {x} (different inputs)"
        if last.op_type == "Div" and numerator != 1.0:
            return f"the root divides {numerator:g}, not 1 (not 1/sqrt)"
        r = last.outputs[0]
        mul = m.reader(r, "Mul")
        if mul is None or not m.single(r):
            return "1/sqrt is not read by one Mul"
        if m.other(mul, r) != x:
            return f"the Mul scales {m.other(mul, r)}, not the squared input {x} (different inputs)"
        dead.add(r)
        last = mul
    start = m.noop_cast(last.outputs[0], x) or last.outputs[0]  # Cast(to=T) of a T: skipped
    out, gamma, _beta = m.affine_tail(start, ops=("Mul",))
    dead |= {last.outputs[0]} | _tail_names(last.outputs[0], out, m)
    new = Node("RMSNorm", EMBER_DOMAIN, [x, gamma or ""], [out], {"axis": axis, "epsilon": eps},
               f"{last.name}/rmsnorm", 1)
    return dead, new, last


_ELEMENTWISE = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power,
                "Tanh": np.tanh, "Sqrt": np.sqrt, "Neg": np.negative, "Reciprocal": np.reciprocal}


def _gelu_ref(x: np.ndarray, tanh: bool) -> np.ndarray:
    if tanh:
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2.0)))


def match_gelu(m: _Matcher, core: Node) -> Match:
    """Any cluster of elementwise nodes around an Erf (or Tanh) that computes GELU of one tensor -> ai.ember.Gelu.
    The cluster is checked numerically against the formula, so any operand order works. A near miss: an Erf/Tanh
    read by Add(·, 1) (GELU's shape) whose cluster is not GELU of one tensor."""
    graph = m.graph
    plus_one = any(not n.domain and n.op_type == "Add" and m.scalar(m.other(n, core.outputs[0]) or "") == 1.0
                   for n in m.readers.get(core.outputs[0], []))
    # The root x: walk up from the core through nodes whose other operands are scalar constants.
    roots, stack, seen = set(), [core.inputs[0]], set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        p = m.node(name, *_ELEMENTWISE)
        if p is None or any(i in graph.initializers and m.scalar(i) is None for i in p.inputs):
            roots.add(name)  # not elementwise, or mixing in a tensor constant (a bias): x starts here
        else:
            stack += [i for i in p.inputs if i and m.scalar(i) is None]
    if len(roots) != 1:
        return f"the {core.op_type}'s argument depends on {len(roots)} tensors {sorted(roots)}, not one" \
            if plus_one else None
    (x,) = roots
    order = {id(n): i for i, n in enumerate(graph.nodes)}
    # The forward closure from x through eligible nodes, in graph order.
    cluster: list[Node] = []
    values = {x}
    for n in graph.nodes:
        ok = n.domain == "" and (n.op_type in _ELEMENTWISE or n is core)
        if ok and all(i in values or m.scalar(i) is not None for i in n.inputs if i) and \
                any(i in values for i in n.inputs):
            cluster.append(n)
            values.add(n.outputs[0])
    probe = np.linspace(-4.0, 4.0, 41)
    tanh = core.op_type == "Tanh"
    want = _gelu_ref(probe, tanh)
    best, leaked = math.inf, ""
    for out_node in sorted(cluster, key=lambda n: -order[id(n)]):
        if order[id(out_node)] < order[id(core)]:
            break
        part = [n for n in cluster if _is_ancestor(n, out_node, cluster)]
        if core not in part:
            continue
        produced = {n.outputs[0] for n in part}
        env = {x: probe}
        try:
            with np.errstate(all="ignore"):
                for n in part:
                    args = [env[i] if i in env else m.scalar(i) for i in n.inputs]
                    fn = np.vectorize(math.erf) if n.op_type == "Erf" else _ELEMENTWISE[n.op_type]
                    env[n.outputs[0]] = fn(*args)
        except (KeyError, TypeError):
            continue
        got = env[out_node.outputs[0]]
        if not np.allclose(got, want, rtol=1e-6, atol=1e-6):
            err = float(np.nanmax(np.abs(got - want))) if np.isfinite(got).any() else math.inf
            best = min(best, err)
            continue
        escaped = [o for o in produced - {out_node.outputs[0]}
                   if m.uses.get(o, 0) != sum(o in n.inputs for n in part) or o in m.outputs]
        if escaped:
            leaked = escaped[0]
            continue
        new = Node("Gelu", EMBER_DOMAIN, [x], [out_node.outputs[0]], {"approximate": "tanh" if tanh else "none"},
                   f"{core.name}/gelu", 1)
        return produced, new, out_node
    if not plus_one:
        return None
    if leaked:
        return f"the chain computes GELU, but its intermediate {leaked} has readers outside it"
    form = "0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))" if tanh else "0.5·x·(1 + erf(x/√2))"
    return f"no node after the {core.op_type} computes {form} of {x}: the closest is off by {best:.3g} on [-4, 4]"


def _is_ancestor(n: Node, target: Node, cluster: list[Node]) -> bool:
    """Is n an ancestor of (or) target, within the cluster?"""
    if n is target:
        return True
    producers = {c.outputs[0]: c for c in cluster}
    stack, seen = list(target.inputs), set()
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        p = producers.get(name)
        if p is n:
            return True
        if p is not None:
            stack += p.inputs
    return False


def match_quickgelu(m: _Matcher, sig: Node) -> Match:
    """Mul(x, Sigmoid(Mul(x, alpha))) -> ai.ember.QuickGelu (CLIP's quick_gelu, alpha 1.702), anchored at the
    Sigmoid of a Mul that a Mul reads."""
    inner, s = m.node(sig.inputs[0], "Mul"), sig.outputs[0]
    outer = m.reader(s, "Mul")
    if inner is None or outer is None:
        return None
    x, alpha = next(((a, m.scalar(c)) for a, c in (inner.inputs, inner.inputs[::-1]) if m.scalar(c) is not None),
                    (None, None))
    if x is None or alpha is None:
        return "alpha is not a constant (the Sigmoid's input is a product of two tensors)"
    if m.other(outer, s) != x:
        return f"the Mul gates {m.other(outer, s)}, but the Sigmoid takes alpha · {x} (different inputs)"
    if not m.single(s) or not m.single(sig.inputs[0]):
        return "Sigmoid(alpha x) or alpha x has readers outside the chain"
    new = Node("QuickGelu", EMBER_DOMAIN, [x], list(outer.outputs), {"alpha": alpha}, f"{sig.name}/quickgelu", 1)
    return {sig.inputs[0], s, outer.outputs[0]}, new, outer


def _broadcasts(mask: tuple | None, scores: tuple | None) -> bool:
    """Whether a mask of this shape broadcasts to the scores' without growing them (unknown dims pass)."""
    if mask is None or scores is None or len(mask) > len(scores):
        return mask is None or scores is None
    for a, b in zip(mask[::-1], scores[::-1], strict=False):
        if isinstance(a, int) and a != 1 and isinstance(b, int) and a != b:
            return False
    return True


def match_attention(m: _Matcher, sm: Node) -> Match:
    """MatMul(Q, Kᵀ) [/ or * scale] [+ mask] -> Softmax(last axis) -> MatMul(·, V) -> ai.ember.Attention, anchored
    at the Softmax whose probabilities (through the NaN guard, or a Cast) a MatMul reads as its left operand."""
    probs, dead = sm.outputs[0], {sm.outputs[0]}
    pv = m.reader(probs, "MatMul")
    guard = m.reader(probs, "IsNaN")
    where = m.reader(guard.outputs[0], "Where") if guard is not None else None
    if where is not None:  # Where(IsNaN(p), 0, p): a row no key may see gives zeros, as the kernel
        guarded = m.nan_guard(where.outputs[0])
        pv = m.reader(where.outputs[0], "MatMul")
        if guarded is None and pv is not None:
            return "the NaN guard Where(IsNaN(p), 0, p) of the probabilities is not exact or has other readers"
        if guarded is not None:
            dead |= {where.outputs[0], *guarded[1]}
            probs = where.outputs[0]
    cast = m.reader(probs, "Cast")
    if pv is None and cast is not None and m.reader(cast.outputs[0], "MatMul") is not None:
        return "a Cast changes the probabilities' dtype between the Softmax and the MatMul with V (dtype mismatch)"
    if pv is None or pv.inputs[0] != probs:
        return None
    axis = sm.attrs.get("axis", -1 if sm.opset >= 13 else 1)
    if not m.last_axis(sm.inputs[0], axis):
        return f"the Softmax is over axis {axis}, not the last"
    if not m.single(probs):
        return "the probabilities have readers besides the MatMul with V"
    cur, mask, scale = sm.inputs[0], "", 1.0
    add = m.node(cur, "Add")
    if add is not None:
        for s_in, mk in (add.inputs, add.inputs[::-1]):
            if m.node(s_in, "MatMul", "Div", "Mul") is not None:
                cur, mask = s_in, mk  # the mask is the operand that does not lead back to the Q·Kᵀ product
                break
        else:
            return "neither operand of the Add before the Softmax is a (scaled) MatMul of Q and Kᵀ"
        if not m.single(add.outputs[0]):
            return "the masked scores have readers besides the Softmax"
        if not _broadcasts(m.shape(mask), m.shape(cur)):
            return f"the mask's shape {m.shape(mask)} does not broadcast to the scores' {m.shape(cur)}"
        dead.add(add.outputs[0])
    sc = m.node(cur, "Div", "Mul")
    if sc is not None:
        pairs = (sc.inputs, sc.inputs[::-1]) if sc.op_type == "Mul" else [sc.inputs]
        s_in, c = next(((a, c) for a, c in pairs if m.node(a, "MatMul") is not None), (None, None))
        if s_in is None or c is None:
            return f"the scores are a {sc.op_type} with no MatMul of Q and Kᵀ operand"
        value = m.scalar(c)
        if value is None:
            return f"the scale is not a constant (the scores' {sc.op_type} by {c}, {m.op_of(c)})"
        if not m.single(cur):
            return "the scaled scores have readers besides the Softmax"
        scale = 1.0 / value if sc.op_type == "Div" else value
        dead.add(cur)
        cur = s_in
    qk = m.node(cur, "MatMul")
    if qk is None:
        return f"the scores are {m.op_of(cur)}, not a MatMul of Q and Kᵀ"
    if not m.single(cur):
        return "Q·Kᵀ has readers besides the Softmax"
    dead.add(cur)
    q, kt = qk.inputs
    # torch's scaled_dot_product_attention export scales both operands by sqrt(scale): (Q * a) @ (Kᵀ * b).
    for i, operand in enumerate((q, kt)):
        mul = m.node(operand, "Mul")
        if mul is None or not m.single(operand):
            continue
        for x, c in (mul.inputs, mul.inputs[::-1]):
            value = m.scalar(c)
            if value is not None:
                scale *= value
                dead.add(operand)
                q, kt = (x, kt) if i == 0 else (q, x)
                break
    new = Node("Attention", EMBER_DOMAIN, [q, kt, pv.inputs[1], mask], list(pv.outputs), {"scale": float(scale)},
               f"{pv.name}/attention", 1)
    return dead, new, pv

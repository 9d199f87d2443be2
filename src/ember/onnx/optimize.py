"""Graph clean-up at load, before any plan: fold constants, drop no-op nodes, fold BatchNorm into Conv,
and rewrite x * sigmoid(x) as one SiLU node so it can join a Conv's epilogue."""

from __future__ import annotations

import math

import numpy as np

from ..ir import Graph, Node
from ..ops import Tensor, UnsupportedError, lookup
from ..plan import fold

EMBER_DOMAIN = "ai.ember"


def optimize(graph: Graph) -> dict[str, int]:
    """Rewrite `graph` in place; returns how many times each rewrite applied."""
    stats = {
        "constants_folded": fold_constants(graph),
        "identities_dropped": drop_identities(graph),
        "batchnorms_folded": fold_conv_batchnorm(graph),
        "silu_fused": fuse_silu(graph),
        "layernorm_fused": fuse_layernorm(graph),
        "rmsnorm_fused": fuse_rmsnorm(graph),
        "gelu_fused": fuse_gelu(graph),
        "attention_fused": fuse_attention(graph),
    }
    stats["dead_nodes_removed"] = remove_dead(graph)
    return stats


def _rename_input(graph: Graph, old: str, new: str) -> None:
    """Every read of `old` becomes one of `new`, inside subgraphs too (unless a subgraph defines its own `old`)."""
    for n in graph.nodes:
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


# ---- transformer patterns -------------------------------------------------------------------------------
# Exporters spell LayerNorm, RMSNorm and GELU as chains of primitive nodes; these rewrites turn each chain
# into one ai.ember node whose op runs the fused kernel (and counts it, see ops/transformer.py).


class _Matcher:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.producers = graph.producers()
        self.uses = graph.use_counts()

    def node(self, name: str, *op_types: str) -> Node | None:
        n = self.producers.get(name)
        return n if n is not None and n.domain == "" and n.op_type in op_types else None

    def scalar(self, name: str) -> float | None:
        v = self.graph.initializers.get(name)
        return float(v.reshape(-1)[0]) if v is not None and v.size == 1 and v.dtype.kind == "f" else None

    def other(self, n: Node, name: str) -> str | None:
        """The input of a two-input node that is not `name`."""
        if len(n.inputs) != 2 or name not in n.inputs:
            return None
        return n.inputs[1] if n.inputs[0] == name else n.inputs[0]

    def single(self, name: str) -> bool:
        return self.uses.get(name, 0) == 1 and name not in {o.name for o in self.graph.outputs}

    def nan_guard(self, name: str) -> tuple[str, list[str]] | None:
        """(p, [the guard's values]) if `name` is Where(IsNaN(p), 0, p) and p is read by the guard only."""
        w = self.node(name, "Where")
        if w is None or len(w.inputs) != 3 or not self.single(name):
            return None
        isnan = self.node(w.inputs[0], "IsNaN")
        p = w.inputs[2]
        if isnan is None or isnan.inputs[0] != p or self.scalar(w.inputs[1]) != 0.0 or not self.single(w.inputs[0]):
            return None
        if self.uses.get(p, 0) != 2 or p in {o.name for o in self.graph.outputs}:
            return None
        return p, [w.inputs[0]]

    def mean_axes(self, n: Node) -> list[int] | None:
        if n.attrs.get("keepdims", 1) != 1:
            return None
        if len(n.inputs) > 1 and n.inputs[1]:
            v = self.graph.initializers.get(n.inputs[1])
            return None if v is None else [int(a) for a in v.reshape(-1)]
        return n.attrs.get("axes")

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

    def eps_sqrt(self, name: str) -> tuple[str, float, list[str]] | None:
        """(v, eps, names) if `name` is Sqrt(Add(v, eps))."""
        s = self.node(name, "Sqrt")
        if s is None or not self.single(s.inputs[0]):
            return None
        add = self.node(s.inputs[0], "Add")
        if add is None:
            return None
        for v, e in (add.inputs, add.inputs[::-1]):
            eps = self.scalar(e)
            if eps is not None and self.single(v):
                return v, eps, [s.inputs[0], v]
        return None

    def noop_cast(self, name: str, x: str) -> str | None:
        """The output of the Cast that alone reads `name`, if that Cast is a no-op: `x` (whose dtype `name` has)
        is itself a Cast to the same type (the TorchScript export of transformers' RMSNorm casts both ways)."""
        cons = [n for n in self.graph.nodes if name in n.inputs]
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
            cons = [n for n in self.graph.nodes if out in n.inputs]
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


def _replace(graph: Graph, dead_outputs: set[str], new: Node, anchor: Node) -> None:
    """Drop the nodes producing `dead_outputs` and put `new` where `anchor` was."""
    nodes = []
    for n in graph.nodes:
        if n is anchor:
            nodes.append(new)
        elif not (set(n.outputs) & dead_outputs):
            nodes.append(n)
    graph.nodes = nodes


def fuse_layernorm(graph: Graph) -> int:
    """ReduceMean / Sub / Pow / ReduceMean / Add(eps) / Sqrt / Div [* gamma] [+ beta] -> ai.ember.LayerNorm."""
    count = 0
    while True:
        m = _Matcher(graph)
        for div in graph.nodes:
            if div.op_type != "Div" or div.domain:
                continue
            sub = m.node(div.inputs[0], "Sub")
            if sub is None or m.uses.get(div.inputs[0]) != 2:
                continue
            x, mean_name = sub.inputs
            mean = m.node(mean_name, "ReduceMean")
            if mean is None or mean.inputs[0] != x or not m.single(mean_name):
                continue
            es = m.eps_sqrt(div.inputs[1])
            if es is None:
                continue
            v, eps, inner = es
            var = m.node(v, "ReduceMean")
            if var is None or m.mean_axes(var) != m.mean_axes(mean) or m.mean_axes(mean) is None:
                continue
            if len(m.mean_axes(mean)) != 1 or m.square_of(var.inputs[0]) != div.inputs[0] or \
                    not m.single(var.inputs[0]):
                continue
            out, gamma, beta = m.affine_tail(div.outputs[0])
            axis = m.mean_axes(mean)[0]
            dead = {mean_name, div.inputs[0], var.inputs[0], v, div.inputs[1], div.outputs[0], *inner}
            dead |= _tail_names(div.outputs[0], out, graph)
            new = Node("LayerNorm", EMBER_DOMAIN, [x, gamma or "", beta or ""], [out],
                       {"axis": axis, "epsilon": eps}, f"{div.name}/layernorm", 1)
            _replace(graph, dead, new, div)
            count += 1
            break
        else:
            return count


def fuse_rmsnorm(graph: Graph) -> int:
    """Pow / ReduceMean / Add(eps) / Sqrt / (Reciprocal or Div(1, ·), Mul | Div) [* gamma] -> ai.ember.RMSNorm."""
    count = 0
    while True:
        m = _Matcher(graph)
        for last in graph.nodes:
            if last.domain or last.op_type not in ("Mul", "Div") or len(last.inputs) != 2:
                continue
            for x, r in (last.inputs, last.inputs[::-1]) if last.op_type == "Mul" else [last.inputs]:
                dead = set()
                sq_name = r
                if last.op_type == "Mul":
                    # 1/sqrt as Reciprocal(s), or as Div(1, s) (torch.rsqrt through the TorchScript exporter)
                    rec = m.node(r, "Reciprocal", "Div")
                    if rec is None or not m.single(r) or (rec.op_type == "Div" and m.scalar(rec.inputs[0]) != 1.0):
                        continue
                    dead.add(r)
                    sq_name = rec.inputs[-1]
                es = m.eps_sqrt(sq_name)
                if es is None or not m.single(sq_name):
                    continue
                v, eps, inner = es
                mean = m.node(v, "ReduceMean")
                axes = m.mean_axes(mean) if mean is not None else None
                if axes is None or len(axes) != 1 or m.square_of(mean.inputs[0]) != x or not m.single(mean.inputs[0]):
                    continue
                start = m.noop_cast(last.outputs[0], x) or last.outputs[0]  # Cast(to=T) of a T: skipped
                out, gamma, _beta = m.affine_tail(start, ops=("Mul",))
                dead |= {sq_name, v, mean.inputs[0], last.outputs[0], *inner}
                dead |= _tail_names(last.outputs[0], out, graph)
                new = Node("RMSNorm", EMBER_DOMAIN, [x, gamma or ""], [out], {"axis": axes[0], "epsilon": eps},
                           f"{last.name}/rmsnorm", 1)
                _replace(graph, dead, new, last)
                count += 1
                break
            else:
                continue
            break
        else:
            return count


def _tail_names(start: str, end: str, graph: Graph) -> set[str]:
    """Outputs of the affine tail nodes between start (exclusive) and end (inclusive)."""
    names, cur = set(), start
    while cur != end:
        (n,) = [n for n in graph.nodes if cur in n.inputs]
        cur = n.outputs[0]
        names.add(cur)
    return names


_ELEMENTWISE = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide, "Pow": np.power,
                "Tanh": np.tanh, "Sqrt": np.sqrt, "Neg": np.negative, "Reciprocal": np.reciprocal}


def _gelu_ref(x: np.ndarray, tanh: bool) -> np.ndarray:
    if tanh:
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / np.sqrt(2.0)))


def fuse_gelu(graph: Graph) -> int:
    """Any cluster of elementwise nodes around an Erf (or Tanh) that computes GELU of one tensor ->
    ai.ember.Gelu. The cluster is checked numerically against the formula, so any operand order works."""
    count = 0
    while True:
        m = _Matcher(graph)
        order = {id(n): i for i, n in enumerate(graph.nodes)}
        done = False
        for core in graph.nodes:
            if core.domain or core.op_type not in ("Erf", "Tanh"):
                continue
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
                continue
            (x,) = roots
            # The forward closure from x through eligible nodes, in graph order.
            cluster: list[Node] = []
            values = {x}
            for n in graph.nodes:
                ok = n.domain == "" and (n.op_type in _ELEMENTWISE or n is core)
                if ok and all(i in values or m.scalar(i) is not None for i in n.inputs if i) and \
                        any(i in values for i in n.inputs):
                    cluster.append(n)
                    values.add(n.outputs[0])
            if core not in cluster:
                continue
            probe = np.linspace(-4.0, 4.0, 41)
            for out_node in sorted(cluster, key=lambda n: -order[id(n)]):
                if order[id(out_node)] < order[id(core)]:
                    break
                part = [n for n in cluster if _is_ancestor(n, out_node, graph, cluster)]
                produced = {n.outputs[0] for n in part}
                if any(m.uses.get(o, 0) != sum(o in n.inputs for n in part) for o in produced - {out_node.outputs[0]}):
                    continue
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
                tanh = core.op_type == "Tanh"
                if np.allclose(got, _gelu_ref(probe, tanh), rtol=1e-6, atol=1e-6):
                    new = Node("Gelu", EMBER_DOMAIN, [x], [out_node.outputs[0]],
                               {"approximate": "tanh" if tanh else "none"}, f"{core.name}/gelu", 1)
                    _replace(graph, produced, new, out_node)
                    count += 1
                    done = True
                    break
            if done:
                break
        if not done:
            return count


def _is_ancestor(n: Node, target: Node, graph: Graph, cluster: list[Node]) -> bool:
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


def fuse_attention(graph: Graph) -> int:
    """MatMul(Q, Kᵀ) [/ or * scale] [+ mask] -> Softmax(last axis) -> MatMul(·, V)  ->  ai.ember.Attention."""
    count = 0
    while True:
        m = _Matcher(graph)
        for pv in graph.nodes:
            if pv.op_type != "MatMul" or pv.domain:
                continue
            probs, dead = pv.inputs[0], {pv.inputs[0]}
            guarded = m.nan_guard(probs)  # Where(IsNaN(p), 0, p): a row no key may see gives zeros, as the kernel
            if guarded is not None:
                probs, names = guarded
                dead.update(names)
            sm = m.node(probs, "Softmax")
            if sm is None or not (guarded is not None or m.single(probs)) or \
                    sm.attrs.get("axis", -1 if sm.opset >= 13 else 1) != -1:
                continue
            dead.add(probs)
            cur, mask, scale = sm.inputs[0], "", 1.0
            add = m.node(cur, "Add")
            if add is not None and m.single(cur):
                # The mask is the operand that does not lead back to the Q·Kᵀ product.
                for s_in, mk in (add.inputs, add.inputs[::-1]):
                    if m.node(s_in, "MatMul", "Div", "Mul") is not None:
                        cur, mask = s_in, mk
                        dead.add(add.outputs[0])
                        break
            sc = m.node(cur, "Div", "Mul")
            if sc is not None and m.single(cur):
                for s_in, c in (sc.inputs, sc.inputs[::-1]) if sc.op_type == "Mul" else [sc.inputs]:
                    value = m.scalar(c)
                    if value is not None and m.node(s_in, "MatMul") is not None:
                        scale = 1.0 / value if sc.op_type == "Div" else value
                        dead.add(sc.outputs[0])
                        cur = s_in
                        break
            qk = m.node(cur, "MatMul")
            if qk is None or not m.single(cur):
                continue
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
            new = Node("Attention", EMBER_DOMAIN, [q, kt, pv.inputs[1], mask], list(pv.outputs),
                       {"scale": float(scale)}, f"{pv.name}/attention", 1)
            _replace(graph, dead, new, pv)
            count += 1
            break
        else:
            return count

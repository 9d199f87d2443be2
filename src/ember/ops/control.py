"""If, Loop and Scan: control flow planned on the host. A plan is specialised on what the host knows while
planning, so an If whose condition is known then (a graph input such as optimum's `use_cache_branch`, which makes
the plan keyed by its value, or shape arithmetic) plans only the branch it takes, and a Loop whose trip count and
condition are known (a `for` over a dim, as torch.jit.script exports it) is unrolled. An If or Loop whose
condition comes from data computed on the device is decided at run time instead, between the graph's stages
(plan/control_runtime.py decides which at load); reaching one here means that analysis missed it:
UnsupportedError, naming the node. `control_problems` is what load_onnx checks of these nodes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..ir import Graph, Node
from .base import Context, Op, Tensor, call_op, norm_axis, register

# A subgraph planner (ember.plan's): (graph, tensors bound to its inputs, tensors to keep live) -> its outputs.
PlanGraph = Callable[..., list[Tensor]]

MAX_UNROLL = 4096  # iterations a Loop may unroll into one plan


def _host_scalar(op: Op, t: Tensor | None, what: str) -> Any:
    if not t.is_const:
        raise op.fail(f"the {what} is computed on the device; ember plans control flow on the host, so it must be "
                      "known when the plan is built (a graph input or shape arithmetic)")
    value = np.asarray(t.value)
    if value.size != 1:
        raise ValueError(f"{op.node.describe()}: the {what} must hold one element, got shape {value.shape}")
    return value.reshape(-1)[0]


@register("If", 1)
class If(Op):
    host_inputs = (0,)
    attrs = {"then_branch": None, "else_branch": None}
    scoped = True

    def run_scoped(self, ctx: Context, ins: list[Tensor | None], plan_graph: PlanGraph) -> list[Tensor]:
        cond = bool(_host_scalar(self, ins[0], "condition"))
        branch = self.attr["then_branch" if cond else "else_branch"]
        if not isinstance(branch, Graph):
            raise ValueError(f"{self.node.describe()}: attribute {'then_branch' if cond else 'else_branch'!r} must "
                             "be a graph")
        outs = plan_graph(branch, [])
        if len(outs) != len(self.node.outputs):
            raise ValueError(f"{self.node.describe()}: the {'then' if cond else 'else'} branch has {len(outs)} "
                             f"output(s), the node {len(self.node.outputs)}")
        return outs


@register("Loop", 1)
class Loop(Op):
    host_inputs = (0, 1)
    attrs = {"body": None}
    scoped = True

    def run_scoped(self, ctx: Context, ins: list[Tensor | None], plan_graph: PlanGraph) -> list[Tensor]:
        body = self.attr["body"]
        if not isinstance(body, Graph):
            raise ValueError(f"{self.node.describe()}: attribute 'body' must be a graph")
        trip = ins[0] if ins else None
        max_trip = None if trip is None else int(_host_scalar(self, trip, "trip count M"))
        cond = True if len(ins) < 2 or ins[1] is None else bool(_host_scalar(self, ins[1], "loop condition"))
        carried = list(ins[2:])
        n_scan = len(body.outputs) - 1 - len(carried)
        if len(body.inputs) != 2 + len(carried) or n_scan < 0:
            raise ValueError(f"{self.node.describe()}: the body takes {len(body.inputs)} input(s) and gives "
                             f"{len(body.outputs)} output(s); with {len(carried)} loop-carried value(s) it must take "
                             f"{2 + len(carried)} and give at least {1 + len(carried)}")
        if max_trip is None and len(ins) < 2:
            raise ValueError(f"{self.node.describe()}: neither a trip count nor a condition: the loop never ends")
        scans: list[list[Tensor]] = [[] for _ in range(n_scan)]

        def keep() -> Iterable[Tensor]:
            return [t for s in scans for t in s]

        i = 0
        while cond and (max_trip is None or i < max_trip):
            if i >= MAX_UNROLL:
                raise self.fail(f"more than {MAX_UNROLL} iterations to unroll")
            binds = [ctx.const(np.array(i, np.int64)), ctx.const(np.array(cond)), *carried]
            outs = plan_graph(body, binds, keep)
            cond = bool(_host_scalar(self, outs[0], "condition the body computes"))
            carried = outs[1:1 + len(carried)]
            for k, t in enumerate(outs[1 + len(carried):]):
                scans[k].append(t)
            i += 1
        return carried + [self._stack(ctx, body, k, s) for k, s in enumerate(scans)]

    def _stack(self, ctx: Context, body: Graph, k: int, parts: list[Tensor]) -> Tensor:
        """Scan output k: the body's values of every iteration, stacked along a new first axis."""
        if not parts:
            vi = body.outputs[1 + len(body.inputs) - 2 + k]
            if vi.shape is None or vi.dtype is None or not all(isinstance(d, int) for d in vi.shape):
                raise self.fail(f"scan output {k} of a loop that runs no iteration needs a static declared shape")
            return ctx.const(np.zeros((0, *vi.shape), vi.dtype))
        return _stack(ctx, self, parts)


@register("Scan", 9)
class Scan(Op):
    """Unrolled over the scan inputs' sequence axis (its length is known while planning: shapes are)."""

    attrs = {"body": None, "num_scan_inputs": None, "scan_input_axes": None, "scan_input_directions": None,
             "scan_output_axes": None, "scan_output_directions": None}
    scoped = True

    def run_scoped(self, ctx: Context, ins: list[Tensor | None], plan_graph: PlanGraph) -> list[Tensor]:
        body, states, xs = self._split(ins)
        m, n_out = len(xs), len(body.outputs) - len(states)
        in_axes = [norm_axis(self, a, t.rank) for a, t in zip(self._list("scan_input_axes", m, 0), xs, strict=True)]
        out_axes = self._list("scan_output_axes", n_out, 0)
        return self._scan(ctx, body, states, xs, in_axes, self._list("scan_input_directions", m, 0), out_axes,
                          self._list("scan_output_directions", n_out, 0), plan_graph)

    def _split(self, ins: list[Tensor | None]) -> tuple[Graph, list[Tensor], list[Tensor]]:
        body, m = self.attr["body"], self.attr["num_scan_inputs"]
        if not isinstance(body, Graph) or not isinstance(m, int) or not 0 < m <= len(ins):
            raise ValueError(f"{self.node.describe()}: needs a body graph and 1 to {len(ins)} num_scan_inputs")
        states, xs = list(ins[:len(ins) - m]), ins[len(ins) - m:]
        if any(t is None for t in (*states, *xs)):
            raise ValueError(f"{self.node.describe()}: a state or scan input is empty")
        n_out = len(body.outputs) - len(states)
        if len(body.inputs) != len(states) + m or n_out < 0:
            raise ValueError(f"{self.node.describe()}: the body takes {len(body.inputs)} input(s) and gives "
                             f"{len(body.outputs)}; with {len(states)} state(s) and {m} scan input(s) it must take "
                             f"{len(states) + m} and give at least {len(states)}")
        return body, states, xs  # type: ignore[return-value]

    def _scan(self, ctx: Context, body: Graph, states: list[Tensor], xs: list[Tensor], in_axes: list[int],
              in_rev: list[int], out_axes: list[int], out_rev: list[int], plan_graph: PlanGraph) -> list[Tensor]:
        lengths = {t.shape[a] for t, a in zip(xs, in_axes, strict=True)}
        if len(lengths) != 1:
            raise ValueError(f"{self.node.describe()}: the scan inputs' sequence lengths differ: {sorted(lengths)}")
        steps = lengths.pop()
        if steps > MAX_UNROLL:
            raise self.fail(f"{steps} iterations to unroll; at most {MAX_UNROLL}")
        scans: list[list[Tensor]] = [[] for _ in out_rev]

        def keep() -> Iterable[Tensor]:
            return [t for s in scans for t in s]

        for i in range(steps):
            slices = [call_op(ctx, self, "Gather", t, ctx.const(np.array(steps - 1 - i if rev else i, np.int64)),
                              axis=a)[0] for t, a, rev in zip(xs, in_axes, in_rev, strict=True)]
            outs = plan_graph(body, [*states, *slices], keep)
            states = outs[:len(states)]
            for k, t in enumerate(outs[len(states):]):
                scans[k].append(t)
        stacked = []
        for parts, rev, axis in zip(scans, out_rev, out_axes, strict=True):
            if not parts:
                raise self.fail("a Scan over an empty sequence")
            stacked.append(_stack(ctx, self, parts[::-1] if rev else parts, axis))
        return states + stacked

    def _list(self, name: str, n: int, default: int) -> list[int]:
        value = self.attr[name]
        if value is None:
            return [default] * n
        if len(value) != n:
            raise ValueError(f"{self.node.describe()}: attribute {name!r} has {len(value)} entries, {n} expected")
        return [int(v) for v in value]


@register("Scan", 8)
class Scan8(Scan):
    """Opset 8's Scan: every state and scan input has a leading batch axis (the sequence axis is the next one),
    the first input is the optional sequence_lens; each batch entry is scanned on its own, then restacked."""

    attrs = {"body": None, "num_scan_inputs": None, "directions": None}
    scoped = True

    def run_scoped(self, ctx: Context, ins: list[Tensor | None], plan_graph: PlanGraph) -> list[Tensor]:
        lens, rest = (ins[0] if ins else None), ins[1:]
        body, states, xs = self._split(rest)
        m, n_out = len(xs), len(body.outputs) - len(states)
        batch = {t.shape[0] for t in (*states, *xs) if t.rank}
        if len(batch) != 1 or any(t.rank < 1 for t in states) or any(t.rank < 2 for t in xs):
            raise ValueError(f"{self.node.describe()}: states need a batch axis and scan inputs a batch and a "
                             f"sequence axis, of one batch size; got {[t.shape for t in (*states, *xs)]}")
        n = batch.pop()
        if lens is not None:
            full = xs[0].shape[1]
            if not lens.is_const or not (np.asarray(lens.value) == full).all():
                raise self.fail(f"sequence_lens shorter than the scan inputs' length {full} is not supported")
        rev = self._list("directions", m, 0)
        per_batch = []
        for b in range(n):
            idx = ctx.const(np.array(b, np.int64))
            pick = [call_op(ctx, self, "Gather", t, idx, axis=0)[0] for t in (*states, *xs)]
            per_batch.append(self._scan(ctx, body, pick[:len(states)], pick[len(states):], [0] * m, rev,
                                        [0] * n_out, [0] * n_out, plan_graph))
        return [_stack(ctx, self, [outs[k] for outs in per_batch]) for k in range(len(body.outputs))]


def _stack(ctx: Context, op: Op, parts: list[Tensor], axis: int = 0) -> Tensor:
    """The tensors (one shape) stacked along a new axis."""
    shapes = {p.shape for p in parts}
    if len(shapes) > 1:
        raise ValueError(f"{op.node.describe()}: a scan output changes shape between iterations: {sorted(shapes)}")
    rank = parts[0].rank + 1
    axis = norm_axis(op, axis, rank)
    if all(p.is_const for p in parts):
        return ctx.const(np.stack([np.asarray(p.value) for p in parts], axis=axis))
    dims = list(parts[0].shape)
    shape = ctx.const(np.array(dims[:axis] + [1] + dims[axis:], np.int64))
    rows = [call_op(ctx, op, "Reshape", p, shape)[0] for p in parts]
    return rows[0] if len(rows) == 1 else call_op(ctx, op, "Concat", *rows, axis=axis)[0]


def control_problems(graph: Graph, inside: str = "") -> list[str]:
    """What load_onnx rejects in a graph's If and Loop nodes (and those of its subgraphs): branches that disagree
    on their outputs' count or rank, a trip count or condition that is not a scalar, a body whose inputs and
    outputs do not match the node's. Each names the node and the subgraph."""
    declared = {vi.name: vi.shape for vi in (*graph.inputs, *graph.value_info.values(), *graph.outputs)}
    declared.update({n: tuple(np.shape(v)) for n, v in graph.initializers.items()})
    problems: list[str] = []
    for node in graph.nodes:
        here = f"{node.describe()}{inside}"
        if node.op_type == "If" and not node.domain:
            problems += _if_problems(node, here)
        elif node.op_type == "Loop" and not node.domain:
            for i, what in ((0, "trip count M"), (1, "condition")):
                shape = declared.get(node.inputs[i]) if len(node.inputs) > i and node.inputs[i] else None
                if shape is not None and any(not isinstance(d, int) or d != 1 for d in shape):
                    problems.append(f"{here}: the {what} {node.inputs[i]!r} must be a scalar, got shape "
                                    f"{list(shape)}")
            body = node.attrs.get("body")
            carried = max(len(node.inputs) - 2, 0)
            if isinstance(body, Graph) and (len(body.inputs) != 2 + carried or
                                            len(body.outputs) < 1 + carried or
                                            len(body.outputs) - 1 < len(node.outputs)):
                problems.append(f"{here}: the body {body.name!r} takes {len(body.inputs)} input(s) and gives "
                                f"{len(body.outputs)} output(s); with {carried} loop-carried value(s) and "
                                f"{len(node.outputs)} node output(s) it must take {2 + carried} and give at "
                                f"least {1 + max(carried, len(node.outputs))}")
        for key, sub in node.attrs.items():
            if isinstance(sub, Graph):
                problems += control_problems(sub, f" (in {key} {sub.name!r} of {here})")
    return problems


def _if_problems(node: Node, here: str) -> list[str]:
    then, other = node.attrs.get("then_branch"), node.attrs.get("else_branch")
    if not isinstance(then, Graph) or not isinstance(other, Graph):
        return []  # the schema checks report a missing branch
    names = f"then_branch {then.name!r} and else_branch {other.name!r}"
    if len(then.outputs) != len(other.outputs) or len(then.outputs) != len(node.outputs):
        return [f"{here}: the node has {len(node.outputs)} output(s), {names} give {len(then.outputs)} and "
                f"{len(other.outputs)}"]
    problems = []
    for k, (a, b) in enumerate(zip(then.outputs, other.outputs, strict=True)):
        if a.kind == b.kind == "tensor" and a.shape is not None and b.shape is not None and \
                len(a.shape) != len(b.shape):
            problems.append(f"{here}: output {k} has rank {len(a.shape)} in the then_branch {then.name!r} "
                            f"({a.name!r}) and rank {len(b.shape)} in the else_branch {other.name!r} ({b.name!r})")
    return problems

"""If and Loop decided while the model runs: the control flow ops/control.py cannot plan on the host.

ops/control.py plans an If whose condition is known while planning (a small bool/int graph input the plan is
keyed by, shape arithmetic, constants) and unrolls a Loop whose trip count and condition are. Any other If or
Loop, one whose condition (or trip count, or the condition its body computes) comes from device data, and one
whose subgraphs hold host work (sequences, strings, data-dependent shapes), is a cut between the stages of
plan/stages.py: at that point the run reads the condition back (one small readback: a documented sync point) and
runs the branch's or the body's own StagedPlan, planned once per input-shape signature and cached, never once
per iteration. Loop-carried values pass from one iteration to the next as device arrays (device-side copies),
scan outputs are gathered on the device and stacked there at the end; only the condition and the trip count come
back to the host. A Loop without a finite trip count stops with RuntimeError past EMBER_LOOP_MAX_ITERATIONS.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from .. import settings
from ..core.dtypes import kind_of
from ..core.expr import inp
from ..core.view import View
from ..device_array import DeviceArray
from ..ir import Graph, Node
from ..ops import lookup

CONTROL = ("If", "Loop")
_SHAPE_ONLY = ("Shape", "Size")
# torch.onnx exports a `while` as a Loop whose trip count is int64's largest value: no bound in effect.
_NO_BOUND = int(np.iinfo(np.int64).max)


class SubRunner(Protocol):
    """What a StagedPlan offers the control flow it runs: a subgraph's own StagedPlan and the run's counters."""

    backend: Any
    flow: dict[str, int]

    def subplan(self, node: Node, attr: str, values: dict[str, Any]) -> tuple[Any, list[str]]: ...


# ---- which control nodes run at run time (decided at load, from the graph alone) --------------------------------

def runtime_nodes(graph: Graph) -> set[int]:
    """Ids of the graph's own If and Loop nodes (not those inside subgraphs) that run at run time."""
    known = set(graph.initializers)
    host = {n for n, v in graph.initializers.items() if np.asarray(v).dtype.kind == "O"}
    for vi in graph.inputs:
        if vi.kind != "tensor" or (vi.dtype is not None and vi.dtype.kind == "O"):
            host.add(vi.name)
        elif vi.dtype is not None and vi.dtype.kind in "biu" and vi.shape is not None and len(vi.shape) <= 1:
            known.add(vi.name)  # a flag or a count: read on the host, the plans keyed by its value
    out: set[int] = set()
    _walk(graph.nodes, known, host, out)
    return out


def _walk(nodes: list[Node], known: set[str], host: set[str], runtime: set[int] | None) -> tuple[set[str], bool]:
    """(the values known while planning after `nodes`, whether some node needs the host between plans). `host`:
    values only the host holds (sequences, optionals, strings), grown in place."""
    known = set(known)
    needs_host = False
    for node in nodes:
        outs = [o for o in node.outputs if o]
        reads = [i for i in (*node.inputs, *node.implicit) if i]
        if node.op_type in CONTROL and not node.domain:
            at_run_time, outs_known = _control(node, known, host)
            if at_run_time:
                needs_host = True
                if runtime is not None:
                    runtime.add(id(node))
                if any(vi.kind != "tensor" for g in node.subgraphs() for vi in g.outputs):
                    host.update(outs)
            elif outs_known:
                known.update(outs)
            continue
        cls = lookup(node)
        always = cls is not None and getattr(cls, "always_host", False)
        if always or any(i in host for i in reads):
            needs_host = True
            host.update(outs)
        elif cls is not None and cls.host_op and not all(i in known for i in node.inputs if i):
            needs_host = True
        elif node.op_type in _SHAPE_ONLY or all(i in known for i in reads):
            known.update(outs)
    return known, needs_host


def _control(node: Node, known: set[str], host: set[str]) -> tuple[bool, bool]:
    """(whether the node runs at run time, whether its outputs are known while planning otherwise)."""
    if node.op_type == "If":
        branches = [g for g in (node.attrs.get("then_branch"), node.attrs.get("else_branch")) if isinstance(g, Graph)]
        walked = [_walk(g.nodes, known | set(g.initializers), set(host), None) for g in branches]
        at_run_time = not node.inputs or node.inputs[0] not in known or any(h for _, h in walked)
        return at_run_time, all(vi.name in k for (k, _), g in zip(walked, branches, strict=True)
                                for vi in g.outputs)
    body = node.attrs.get("body")
    if not isinstance(body, Graph) or len(body.inputs) < 2:
        return False, False  # malformed: ops/control.py says what is wrong while planning
    ins = node.inputs
    at_run_time = any(i < len(ins) and ins[i] and ins[i] not in known for i in (0, 1))
    formal = [vi.name for vi in body.inputs]
    init = ins[2:]
    carried = [i in known for i in init]
    body_host = set(host) | {f for f, i, vi in zip(formal[2:], init, body.inputs[2:], strict=False)
                             if i in host or vi.kind != "tensor"}
    while True:  # a carried value is known while its initial value and every update of it are
        k0 = known | set(body.initializers) | set(formal[:2]) | {f for f, c in zip(formal[2:], carried, strict=False)
                                                                  if c}
        k, needs_host = _walk(body.nodes, k0, set(body_host), None)
        updated = [c and 1 + j < len(body.outputs) and body.outputs[1 + j].name in k for j, c in enumerate(carried)]
        if updated == carried:
            break
        carried = updated
    at_run_time = at_run_time or needs_host or not body.outputs or body.outputs[0].name not in k
    return at_run_time, all(carried) and all(vi.name in k for vi in body.outputs)


# ---- running them -----------------------------------------------------------------------------------------------

def run_control(runner: SubRunner, node: Node, values: dict[str, Any], get: Callable[[str], Any]) -> None:
    """Run an If or Loop node the graph cut at: its outputs into `values`."""
    outs = run_if(runner, node, values, get) if node.op_type == "If" else run_loop(runner, node, values, get)
    for name, v in zip(node.outputs, outs, strict=False):
        if name:
            values[name] = v


def _host_scalar(runner: SubRunner, node: Node, v: Any, what: str) -> Any:
    if isinstance(v, DeviceArray):
        runner.flow["readbacks"] += 1
        v = v.numpy()
    a = np.asarray(v)
    if a.size != 1:
        raise ValueError(f"{node.describe()}: the {what} must hold one element, got shape {list(a.shape)}")
    return a.reshape(-1)[0]


def run_if(runner: SubRunner, node: Node, values: dict[str, Any], get: Callable[[str], Any]) -> list[Any]:
    cond = bool(_host_scalar(runner, node, get(node.inputs[0]), "condition"))
    attr = "then_branch" if cond else "else_branch"
    branch = node.attrs[attr]
    runner.flow["if_runtime"] += 1
    sub, outer = runner.subplan(node, attr, values)
    out = sub.run({n: get(n) for n in outer}, raw=True)
    if len(branch.outputs) != len(node.outputs):
        raise ValueError(f"{node.describe()}: the {attr} has {len(branch.outputs)} output(s), the node "
                         f"{len(node.outputs)}")
    return [out[vi.name] for vi in branch.outputs]


def run_loop(runner: SubRunner, node: Node, values: dict[str, Any], get: Callable[[str], Any]) -> list[Any]:
    body: Graph = node.attrs["body"]
    ins = node.inputs
    trip = int(_host_scalar(runner, node, get(ins[0]), "trip count M")) if ins and ins[0] else None
    bounded = trip is not None and trip != _NO_BOUND
    cond = bool(_host_scalar(runner, node, get(ins[1]), "loop condition")) if len(ins) > 1 and ins[1] else True
    carried = [get(n) if n else None for n in ins[2:]]
    n_carried = len(carried)
    n_scan = len(body.outputs) - 1 - n_carried
    if len(body.inputs) != 2 + n_carried or n_scan < 0:
        raise ValueError(f"{node.describe()}: the body takes {len(body.inputs)} input(s) and gives "
                         f"{len(body.outputs)} output(s); with {n_carried} loop-carried value(s) it must take "
                         f"{2 + n_carried} and give at least {1 + n_carried}")
    limit = settings.LOOP_MAX_ITERATIONS.get()
    runner.flow["loop_runtime"] += 1
    sub, outer = runner.subplan(node, "body", values)
    fixed = {n: get(n) for n in outer}
    names = [vi.name for vi in body.inputs]
    scans: list[list[Any]] = [[] for _ in range(n_scan)]
    i = 0
    while cond and (not bounded or i < trip):
        if not bounded and i >= limit:
            raise RuntimeError(f"{node.describe()}: still running after {limit} iterations (its condition never "
                               f"turned false and it has no finite trip count); EMBER_LOOP_MAX_ITERATIONS sets "
                               "the limit")
        feeds = {names[0]: np.array(i, np.int64), names[1]: np.array(cond), **fixed}
        feeds.update(zip(names[2:], carried, strict=True))
        out = sub.run(feeds, raw=True)
        cond = bool(_host_scalar(runner, node, out[body.outputs[0].name], "condition the body computes"))
        carried = [out[vi.name] for vi in body.outputs[1:1 + n_carried]]
        for k, vi in enumerate(body.outputs[1 + n_carried:]):
            scans[k].append(out[vi.name])
        i += 1
        runner.flow["loop_iterations"] += 1
    return carried + [_stack(runner.backend, node, body, k, parts) for k, parts in enumerate(scans)]


def _stack(be: Any, node: Node, body: Graph, k: int, parts: list[Any]) -> Any:
    """Scan output k: every iteration's value stacked along a new first axis, on the device when they are."""
    if not parts:
        vi = body.outputs[len(body.inputs) - 1 + k]
        if vi.shape is None or vi.dtype is None or not all(isinstance(d, int) for d in vi.shape):
            raise ValueError(f"{node.describe()}: scan output {k} of a loop that ran no iteration needs a static "
                             f"declared shape in the body, got {vi}")
        return np.zeros((0, *vi.shape), vi.dtype)
    if any(isinstance(p, list) or p is None for p in parts):
        raise ValueError(f"{node.describe()}: scan output {k} must be a tensor, got a sequence or an optional")
    shapes = {tuple(p.shape) for p in parts}
    dtypes = {np.dtype(p.dtype) for p in parts}
    if len(shapes) > 1 or len(dtypes) > 1:
        raise ValueError(f"{node.describe()}: scan output {k} changes shape or dtype between iterations: "
                         f"{sorted(shapes)}, {sorted(map(str, dtypes))}")
    if not any(isinstance(p, DeviceArray) for p in parts):
        return np.stack([np.asarray(p) for p in parts])
    shape, dtype = shapes.pop(), dtypes.pop()
    size = math.prod(shape)
    handle = be.alloc(max(len(parts) * size, 1) * be.storage_itemsize(dtype), overwritten=True)
    out = DeviceArray(be, handle, dtype, (len(parts), *shape))
    if size:
        steps: list = []
        for j, p in enumerate(parts):
            p = p if isinstance(p, DeviceArray) else DeviceArray.from_numpy(be, np.asarray(p))
            parts[j] = p  # held until the copies ran
            steps += be.record_elementwise(inp(0, kind_of(dtype)), [View.contiguous(p.handle, dtype, shape)],
                                           View.contiguous(handle, dtype, shape, j * size))
        be.execute(steps)
    return out

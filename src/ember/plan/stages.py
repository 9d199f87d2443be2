"""Graphs with ops whose output shapes depend on data (NonZero, NonMaxSuppression: `Op.host_op`), run in stages.

A plan fixes every shape while it is built, so such a node cannot be inside one. The graph is cut at each such
node whose inputs are not all constants: the nodes between two cuts form a device stage, planned like a whole
graph (its inputs: graph inputs and earlier stages' values); each cut node runs on the host, on its inputs read
back, and its outputs feed the later stages. A StagedPlan does the same work as a Plan: its stages' plans are
built when their input shapes are first seen (they depend on the data), cached per shape, and share the model's
weight pool and folds. Values passed between device stages stay on the device. An If or Loop decided at run
time (plan/control_runtime.py) is a cut too: its branch or body runs as a StagedPlan of its own.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..device_array import DeviceArray
from ..ir import Graph, Node, ValueInfo
from ..ops import lookup
from ..ops.reference import run_reference
from .control_runtime import CONTROL, run_control, runtime_nodes
from .planner import Plan, host_value_inputs

STAGE_PLANS = 64  # plans kept per device stage (one per input-shape signature seen)


@dataclass
class Stage:
    nodes: list[Node]
    host: bool  # one host-op node, run in numpy
    inputs: list[str] = field(default_factory=list)  # values it reads from graph inputs or earlier stages
    outputs: list[str] = field(default_factory=list)  # values later stages or the graph's outputs read
    graph: Graph | None = None  # a device stage's graph, made on its first run (input dtypes come from values)
    host_inputs: set[str] = field(default_factory=set)  # its inputs used as shape arithmetic (plans keyed by them)
    plans: OrderedDict = field(default_factory=OrderedDict)


def _is_cut(node: Node, initializers: dict[str, Any]) -> bool:
    cls = lookup(node)
    if cls is None or not cls.host_op:
        return False
    return getattr(cls, "always_host", False) or not all(i in initializers for i in node.inputs if i)


def needs_stages(graph: Graph) -> bool:
    return any(vi.kind != "tensor" or (vi.dtype is not None and vi.dtype.kind == "O") for vi in graph.inputs) or \
        any(_is_cut(n, graph.initializers) for n in graph.nodes) or bool(runtime_nodes(graph))


def split(graph: Graph, runtime: set[int] | None = None) -> list[Stage]:
    """The graph's stages; `runtime`: ids of its control nodes decided at run time (runtime_nodes)."""
    runtime = runtime_nodes(graph) if runtime is None else runtime
    stages: list[Stage] = []
    # Values only the host holds (sequences, optionals, strings from host ops): an Identity of one passes it on.
    host_made = {vi.name for vi in graph.inputs if vi.kind != "tensor"}
    strings = {vi.name for vi in graph.inputs if vi.dtype is not None and vi.dtype.kind == "O"}
    strings |= {n for n, v in graph.initializers.items() if np.asarray(v).dtype.kind == "O"}
    for node in graph.nodes:
        passes_on = node.op_type == "Identity" and not node.domain and node.inputs[0] in host_made
        on_strings = node.proto is not None and any(i in strings for i in node.inputs)
        if on_strings:
            strings.update(o for o in node.outputs if o)
        if passes_on or on_strings or id(node) in runtime or _is_cut(node, graph.initializers):
            stages.append(Stage([node], host=True))
            host_made.update(o for o in node.outputs if o)
        elif stages and not stages[-1].host:
            stages[-1].nodes.append(node)
        else:
            stages.append(Stage([node], host=False))
    finals = {vi.name for vi in graph.outputs}
    for k, st in enumerate(stages):
        made = {o for n in st.nodes for o in n.outputs if o}
        read = {i for n in st.nodes for i in (*n.inputs, *n.implicit) if i}
        st.inputs = sorted(read - made - set(graph.initializers))
        later = {i for s in stages[k + 1:] for n in s.nodes for i in (*n.inputs, *n.implicit) if i}
        st.outputs = sorted(made & (later | finals))
    return stages


FLOW = ("if_runtime", "loop_runtime", "loop_iterations", "readbacks")  # plan_info()["control_flow"], per run


class StagedPlan:
    """The Plan of a staged graph for one signature of the graph's inputs (see the module docstring). `root`: the
    StagedPlan of the model's graph, for the plan of a branch or body (it counts builds and sync points)."""

    def __init__(self, graph: Graph, build: Callable[[Graph, dict[str, tuple[int, ...]], dict[str, np.ndarray]],
                                                      Plan], backend: Any, root: StagedPlan | None = None) -> None:
        self.graph, self.build, self.backend = graph, build, backend
        self.root = self if root is None else root
        self.stages = split(graph)
        self.inputs: list = []
        self.outputs: list = []  # unknown until a run: later stages' shapes depend on the data
        self.counters: dict[str, int] = {}
        self.stats: dict[str, Any] = {"stages": sum(not s.host for s in self.stages),
                                      "host_nodes": [n.name for s in self.stages if s.host for n in s.nodes]}
        self._last: list[tuple[Plan, dict[str, Any]]] = []  # each device stage's plan and feeds, last run
        self._subs: dict[tuple, StagedPlan] = {}  # (node id, attribute, kinds of its outer values) -> its plan
        self.builds = 0  # device stage plans built, this plan's and its subplans' (counted at the root)
        # Sync points of control flow decided at run time (plan/control_runtime.py), counted over the last run.
        self.flow: dict[str, int] = self.root.flow if root is not None else dict.fromkeys(FLOW, 0)
        if root is None and any(n.op_type in CONTROL for s in self.stages if s.host for n in s.nodes):
            self.stats["control_flow"] = dict(self.flow)

    # ---- what Model reads of a plan ---------------------------------------------------------------------
    @property
    def device_bytes(self) -> int:
        return sum(p.device_bytes for s in self.stages for p in s.plans.values()) + \
            sum(sub.device_bytes for sub in self._subs.values())

    @property
    def steps(self) -> list:
        return [st for p, _ in self._last for st in p.steps]

    @property
    def intermediate_bytes(self) -> int:
        return sum(p.intermediate_bytes for p, _ in self._last)

    @property
    def intermediate_bytes_without_reuse(self) -> int:
        return sum(p.intermediate_bytes_without_reuse for p, _ in self._last)

    def scratch_bytes(self) -> int:
        return sum(p.scratch_bytes() for p, _ in self._last)

    def run(self, feeds: dict[str, Any], names: list[str] | None = None,
            keep_on_device: bool = False, raw: bool = False) -> dict[str, Any]:
        """The outputs: host arrays, or DeviceArrays with keep_on_device; `raw` (a branch's or body's plan)
        leaves each as it came, a device array or a host value."""
        values: dict[str, Any] = dict(feeds)
        self._last = []
        counters: dict[str, int] = {}
        if self.root is self:
            self.flow.update(dict.fromkeys(FLOW, 0))
        for st in self.stages:
            if st.host:
                self._run_host(st.nodes[0], values)
                continue
            plan, stage_feeds = self._stage_plan(st, values)
            values.update(plan.run(stage_feeds, None, keep_on_device=True))
            self._last.append((plan, stage_feeds))
            for k, v in plan.counters.items():
                counters[k] = counters.get(k, 0) + v
        self.counters = counters
        if "control_flow" in self.stats:
            self.stats["control_flow"] = dict(self.flow)
        out = {}
        for vi in self.graph.outputs:
            if names is not None and vi.name not in names:
                continue
            v = values[vi.name] if vi.name in values else self.graph.initializers[vi.name]
            if raw or v is None or isinstance(v, list):  # an optional without a value, a sequence: host values
                out[vi.name] = v
            elif keep_on_device:
                out[vi.name] = v if isinstance(v, DeviceArray) else DeviceArray.from_numpy(self.backend, v)
            else:
                out[vi.name] = v.numpy() if isinstance(v, DeviceArray) else np.array(v)
        return out

    def _get(self, values: dict[str, Any], name: str) -> Any:
        return values[name] if name in values else self.graph.initializers[name]

    def subplan(self, node: Node, attr: str, values: dict[str, Any]) -> tuple[StagedPlan, list[str]]:
        """The StagedPlan of a subgraph of `node` (made on first use: its inputs' kinds come from the values),
        and the enclosing values to feed it besides its own inputs."""
        graph: Graph = node.attrs[attr]
        outer = [n for n in graph.outer_names() if n not in self.graph.initializers]
        kinds = tuple(_kind(values[n]) for n in outer)
        key = (id(node), attr, kinds)
        sub = self._subs.get(key)
        if sub is None:
            inits = {n: self.graph.initializers[n] for n in graph.outer_names() if n in self.graph.initializers}
            ins = [*graph.inputs, *(_value_info(n, values[n]) for n in outer)]
            sub_graph = Graph(graph.nodes, ins, graph.outputs, {**inits, **graph.initializers}, graph.value_info,
                              self.graph.opsets, f"{self.graph.name}/{node.name}/{attr}")
            sub = self._subs[key] = StagedPlan(sub_graph, self.build, self.backend, self.root)
        return sub, outer

    def _run_host(self, node: Node, values: dict[str, Any]) -> None:
        if node.op_type == "Identity" and not node.domain:
            values[node.outputs[0]] = values[node.inputs[0]]
            return
        if node.op_type in CONTROL and not node.domain:
            run_control(self, node, values, lambda name: self._get(values, name))
            return
        cls = lookup(node)
        assert cls is not None
        if not cls.host_op:  # a native op on strings: onnx.reference runs it
            args = [values.get(i, self.graph.initializers.get(i)) if i else None for i in node.inputs]
            args = [a.numpy() if isinstance(a, DeviceArray) else a for a in args]
            for name, v in zip(node.outputs, run_reference(node, args), strict=False):
                if name:
                    values[name] = v
            return
        args = []
        for i in node.inputs:
            v = values.get(i, self.graph.initializers.get(i)) if i else None
            args.append(v.numpy() if isinstance(v, DeviceArray) else v)
        for name, v in zip(node.outputs, cls(node).compute(*args), strict=False):
            if name:
                values[name] = v

    def _stage_plan(self, st: Stage, values: dict[str, Any]) -> tuple[Plan, dict[str, Any]]:
        feeds = {n: values[n] for n in st.inputs}
        if st.graph is None:
            inits = {n: self.graph.initializers[n] for n in self.graph.initializers
                     if any(n in (*node.inputs, *node.implicit) for node in st.nodes)}
            st.graph = Graph(st.nodes, [ValueInfo(n, np.dtype(v.dtype), None) for n, v in feeds.items()],
                             [ValueInfo(n, None, None) for n in st.outputs], inits, {}, self.graph.opsets,
                             f"{self.graph.name}/stage")
            st.host_inputs = host_value_inputs(st.graph)
        host = {n: (v.numpy() if isinstance(v, DeviceArray) else v) for n, v in feeds.items() if n in st.host_inputs}
        key = (tuple(tuple(v.shape) for v in feeds.values()), tuple((n, host[n].tobytes()) for n in sorted(host)))
        plan = st.plans.get(key)
        if plan is None:
            plan = self.build(st.graph, {n: tuple(v.shape) for n, v in feeds.items()}, host)
            self.root.builds += 1
            st.plans[key] = plan
            while len(st.plans) > STAGE_PLANS:
                st.plans.popitem(last=False)[1].free()
        else:
            st.plans.move_to_end(key)
        return plan, {n: v for n, v in feeds.items() if n not in host}

    def profile(self) -> list[tuple[str, float]]:
        return [row for p, _ in self._last for row in p.profile()]

    def gpu_time(self, reps: int = 5) -> float:
        return sum(p.gpu_time(reps) for p, _ in self._last)

    def free(self) -> None:
        for sub in self._subs.values():
            sub.free()
        self._subs.clear()
        for st in self.stages:
            for p in st.plans.values():
                p.free()
            st.plans.clear()
        self._last = []


def _kind(v: Any) -> str:
    return "sequence" if isinstance(v, list) else "optional" if v is None else "tensor"


def _value_info(name: str, v: Any) -> ValueInfo:
    """A subgraph input for an enclosing value: its kind and dtype, its rank (the dims left free)."""
    kind = _kind(v)
    if kind != "tensor":
        return ValueInfo(name, None, None, kind)
    return ValueInfo(name, np.dtype(v.dtype), (None,) * len(v.shape))

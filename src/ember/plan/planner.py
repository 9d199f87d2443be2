"""Compile a graph into a static plan for one input-shape signature, and replay it.

Planning walks the nodes once: a node whose inputs are all known on the host is folded (folding.py: run on the
cpu backend right away, so Shape->Gather->Concat chains over static shapes vanish); every other node records
its steps on the target backend. A run is then: write the inputs, execute the recorded steps (one submit
on wgpu), read back the outputs. Given a `WeightPool` (weights.py), a plan's constants live there, shared with
the other plans of its model; the plan owns only the buffers it writes (inputs, intermediates, outputs).
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable, Collection, Iterable, MutableMapping
from typing import Any

import numpy as np

from ..backends.base import ComputeBackend
from ..core.dtypes import kind_of
from ..core.expr import inp
from ..core.view import View
from ..device_array import DeviceArray
from ..ir import Graph
from ..ops import Context, Tensor, UnsupportedError, declare_counters, lookup
from ..ops.base import referenced_handles
from ..ops.elementwise import emit
from .folding import FoldCache, fold
from .weights import WeightPool


class Plan:
    def __init__(self, backend: ComputeBackend, ctx: Context, inputs: list[tuple[str, Tensor]],
                 outputs: list[tuple[str, Tensor]]) -> None:
        self.backend = backend
        self.steps = ctx.steps
        self.labels = ctx.labels
        self.handles = ctx.handles  # the buffers this plan owns (freed by free())
        self.pool = ctx.pool
        self.shared = list(ctx.shared)  # the pool entries it holds (released by free())
        self.inputs = inputs
        self.outputs = outputs
        # What the ops counted while planning (Context.count; the keys ember.ops.COUNTERS declares): each occurs
        # once per run of this plan.
        self.counters = dict(ctx.counters)
        # The kernel arms the backend took for these steps (select_counters), from the real steps: a traced build's
        # are stand-ins, so a template-made plan counts them here too.
        for key, n in backend.select_counters(self.steps).items():
            self.counters[key] = self.counters.get(key, 0) + n
        self.stats = dict(self.counters)  # the counters and facts others add about this plan (plan_info shows them)
        self._readback: tuple[Any, list, dict] | None = None  # prepared steps + output copies, readers
        self._resident: Any = None  # the prepared steps alone, for runs keeping their outputs on the device
        self._writers: list[tuple[str, Tensor, Any]] | None = None
        # Memory report: what the intermediates take with reuse, next to the sum of all of them.
        self.intermediate_bytes = ctx.intermediate_bytes
        self.intermediate_bytes_without_reuse = ctx.requested_bytes
        # What this plan holds on the device besides shared constants: the buffers it owns and its kernels'
        # scratch. A model's plan cache is bounded by the sum over its plans.
        self.device_bytes = sum(backend.nbytes(h) for h in self.handles) + self.scratch_bytes()

    def run(self, feeds: dict[str, Any], names: list[str] | None = None,
            keep_on_device: bool = False) -> dict[str, Any]:
        """One replay: inputs written (device arrays copied on the device), all steps in one submit, outputs
        read back, or copied into new device arrays without a host round trip."""
        be = self.backend
        pre, post = [], []
        if self._writers is None:  # per input: its writer, made once (an empty input is never written)
            self._writers = [(name, t, be.input_writer(t.view.handle, t.dtype) if t.size else None)
                             for name, t in self.inputs]
        for name, t, write in self._writers:
            value = feeds[name]
            if isinstance(value, DeviceArray):
                pre += be.record_copy(value.handle, t.view.handle, be.nbytes(value.handle))
            elif write is not None:
                write(value)
        wanted = [(n, t) for n, t in self.outputs if names is None or n in names]
        result: dict[str, Any] = {}
        if keep_on_device:
            for name, t in wanted:
                if t.view is None:  # a constant output
                    result[name] = DeviceArray.from_numpy(be, t.value)
                    continue
                nbytes = max(t.size, 1) * be.storage_itemsize(t.dtype)
                handle = be.alloc(nbytes, overwritten=True)
                post += be.record_copy(t.view.handle, handle, nbytes)
                result[name] = DeviceArray(be, handle, t.dtype, t.shape)
        if keep_on_device:
            if self._resident is None:  # the steps alone, prepared once; this run's copies ride around them
                self._resident = be.prepare(self.steps)
            be.execute_prepared(self._resident, pre, post)
            return result
        if self._readback is None:
            copies, readers = [], {}
            for name, t in self.outputs:
                if t.view is not None:
                    steps, readers[name] = be.record_readback(t.view)
                    copies += steps
            # Output copies ride in the same submit as the model; only the wanted ones are read.
            self._readback = (be.prepare(self.steps + copies), copies, readers)
        replay, copies, readers = self._readback
        be.execute_prepared(replay, pre)
        for name, t in wanted:
            result[name] = t.value.copy() if t.view is None else readers[name]()
        return result

    def scratch_bytes(self) -> int:
        """Bytes of the kernels' own buffers the steps hold (split-K partial sums, Winograd's transformed tiles:
        wgpu's Dispatch.keep; a cpu compiled kernel's packed weight), each shared buffer counted once."""
        seen: dict[int, int] = {}
        for st in self.steps:
            for b in getattr(st, "keep", ()):
                if isinstance(b, np.ndarray):
                    # A view looks into a buffer the plan or the pool counts already; an owning array is the step's.
                    seen[id(b)] = b.nbytes if b.base is None else 0
                elif b is not None:
                    seen[id(b)] = b.size  # a GPUBuffer: size in bytes
        return sum(seen.values())

    def gpu_time(self, reps: int = 5) -> float:
        """Milliseconds the device spends on one run of this plan (GPU timestamps on wgpu), min of `reps`."""
        return self.backend.gpu_time(self.steps, reps)

    def profile(self) -> list[tuple[str, float]]:
        """(label, milliseconds) per recorded step, measured one by one (GPU timestamps on wgpu)."""
        return list(zip(self.labels, self.backend.profile(self.steps), strict=True))

    def free(self) -> None:
        """Free the buffers this plan owns and let go of the shared constants it holds (the pool frees those no
        plan holds any more). The plan cannot run afterwards."""
        if self._readback is not None:
            self.backend.release_prepared(self._readback[0])
        if self._resident is not None:
            self.backend.release_prepared(self._resident)
        self._writers = self._readback = self._resident = None  # they hold the buffers being freed
        self.steps = []  # and the kernels' scratch goes with them
        for h in self.handles:
            self.backend.free(h)
        self.handles = []
        if self.shared:
            assert self.pool is not None
            self.pool.release(self.shared)
            self.shared = []


def host_value_inputs(graph: Graph, skip: Collection[int] = ()) -> set[str]:
    """Graph inputs whose values an op needs while planning (a Reshape's shape fed by the user, say).

    A plan is specialised on their values, as it is on input shapes: they are host-side shape arithmetic. `skip`:
    ids of nodes (control flow decided at run time, plan/control_runtime.py) whose inputs and subgraphs are not.
    """
    names = {vi.name for vi in graph.inputs}
    nodes = list(_nodes_outside(graph, skip))
    # Subgraphs' nodes too: a Reshape inside an If branch whose shape comes from a graph input.
    producers = {o: n for n in nodes for o in n.outputs if o}
    needed: list[str] = []
    for node in nodes:
        cls = None if id(node) in skip else lookup(node)
        needed += [node.inputs[i] for i in getattr(cls, "host_inputs", ()) if i < len(node.inputs) and node.inputs[i]]
    # Follow host values back through the nodes computing them; Shape and Size need shapes only. An If's outputs
    # are its branches' outputs: followed into them (AffineGrid's expansion splits a size input in a branch).
    out, seen = set(), set()
    while needed:
        name = needed.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in names:
            out.add(name)
        elif name in producers and producers[name].op_type not in ("Shape", "Size"):
            node = producers[name]
            needed += [i for i in node.inputs if i]
            if node.op_type == "If" and id(node) not in skip:
                needed += [vi.name for g in node.subgraphs() for vi in g.outputs]
    return out


def _nodes_outside(graph: Graph, skip: Collection[int]) -> Iterable[Any]:
    for n in graph.nodes:
        yield n
        if id(n) not in skip:
            for g in n.subgraphs():
                yield from _nodes_outside(g, ())


F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
F16_MAX = float(np.finfo(np.float16).max)


def f16_copy(value: np.ndarray) -> np.ndarray:
    """A float constant as float16, saturated as ONNX's float16 converters do: an exported mask constant such as
    float32's lowest value would become -inf, and 0 * -inf = NaN where the model meant 0."""
    return np.where(np.isfinite(value), np.clip(value, -F16_MAX, F16_MAX), value).astype(F16)


declare_counters("f16.nodes", "f16.nodes_in_f32")  # _Precision.inputs


class _Precision:
    """precision="f16": float32 data goes to float16 at the input of every op whose kernels store f16
    (`Op.f16`), and an op without f16 kernels gets float32 inputs back; both conversions are lazy
    elementwise casts, so they fuse into neighbouring elementwise kernels or Conv/MatMul epilogues.
    Constant folding and host inputs (shape arithmetic) keep their float32 values."""

    def __init__(self, ctx: Context, casts: dict | None = None) -> None:
        self.ctx = ctx
        # The model's float16 copies of its weights, by the weight's pool key: converted once, not once per plan
        # (a LLaMA-1B's 4.4 GB of float32 took seconds to convert at every new decode length).
        self.casts = casts
        # (id of the source, dtype) -> (source, converted): a weight, or a computed tensor several nodes read
        # (an attention mask read by every layer), is converted once; the source is held so its id stays unique.
        self.done: dict[tuple[int, str], tuple[Tensor, Tensor]] = {}

    def convert(self, op: Any, t: Tensor | None, dtype: np.dtype) -> Tensor | None:
        if t is None or t.dtype.kind != "f" or t.dtype == dtype or t.dtype.itemsize > 4:
            return t
        key = (id(t), dtype.str)
        if key in self.done:
            return self.done[key][1]
        lz = t.lazy
        if (lz is not None and lz.anchor is None and lz.expr.op == "in" and len(lz.inputs) == 1
                and lz.inputs[0].dtype == dtype and t.shape == lz.inputs[0].shape):
            # A float16 value widened (an op without f16 kernels, a model's own Cast to float32 around a norm)
            # and narrowed again: the value itself, exactly, with no kernel.
            return lz.inputs[0]
        if t.uses <= 1 and not t.is_const:
            # Read by this node only: a lazy cast that fuses into the node's kernel (or t's own epilogue; a graph
            # input's, such as a decoder's past KV, into the Concat growing it).
            out = emit(self.ctx, op, inp(0, "float"), [t], dtype)
            out.uses = 1
            return out
        if t.is_const:
            pool = self.ctx.pool
            weight = pool.identity_key(t.value, {}) if pool is not None and self.casts is not None else None
            hit = self.casts.get((weight, dtype.str)) if weight is not None else None
            if hit is not None:
                converted = hit
            else:
                value = np.asarray(t.value)
                converted = f16_copy(value) if dtype == F16 else value.astype(dtype)
                if weight is not None:
                    converted.flags.writeable = False
                    self.casts[(weight, dtype.str)] = converted
            out = Tensor(dtype, t.shape, value=converted)
            self.ctx.derived(converted, t, ("cast", dtype.str))  # one buffer for every plan, found without hashing
        else:
            # Pinned: the copy outlives the node that made it, and the liveness walk only sees graph values.
            out = self.ctx.new(dtype, t.shape, pinned=True)
            if t.size:
                self.ctx.record(self.ctx.backend.record_elementwise(inp(0, "float"), [self.ctx.view(t)], out.view))
        self.done[key] = (t, out)
        self.done[(id(out), t.dtype.str)] = (out, t)  # converting the copy back gives the value itself
        return out

    def inputs(self, op: Any, ins: list[Tensor | None]) -> list[Tensor | None]:
        want = F16 if getattr(op, "f16", False) else F32
        if not op.reads_data or want == F32 and not any(t is not None and t.dtype == F16 for t in ins):
            return ins
        host = set(op.host_inputs)
        if want == F16:
            keep = op.any_float
            host |= {i for i, t in enumerate(ins) if t is not None and not t.is_const
                     and (keep is True or (keep and i in keep))}
        ins = [t if i in host else self.convert(op, t, want) for i, t in enumerate(ins)]
        if want == F32:
            self.ctx.count("f16.nodes_in_f32")
        else:
            self.ctx.count("f16.nodes")
        return ins


class _Walk:
    """Plans nodes into an environment of tensors: folds a node whose inputs are all known, records the others'
    steps, and after each node returns to the free list the buffers no value still to be read lives in. A node
    holding subgraphs (If, Loop: `Op.scoped`) plans them through `subgraph`, in a scope that sees its enclosing
    graphs' values; the values every open scope still reads stay live."""

    def __init__(self, ctx: Context, mixed: _Precision | None, folds: FoldCache | None, limit: int | None) -> None:
        self.ctx, self.mixed, self.folds, self.limit = ctx, mixed, folds, limit
        self.frames: list[Callable[[], Iterable[Tensor]]] = []  # per open scope: the tensors it still reads
        self.names: dict[int, str] | None = None  # plan_graph's trace.names (None: not traced)
        self.depth = 0  # open subgraph scopes (their values' names may shadow the graph's: not learnt)
        # With `names`: the graph's nodes as planned, (node, op, how, {output: value} of the constants a node
        # that was not folded made, such as Shape's): the host program computing every constant (tape.py).
        self.program: list[tuple[Any, Any, str, dict[str, Any]]] = []

    def name(self, name: str, t: Tensor | None) -> None:
        if self.names is not None and self.depth == 0 and t is not None and t.is_const:
            self.names.setdefault(id(t), name)
            self.names.setdefault(id(t.value), name)

    def nodes(self, nodes: list[Any], env: MutableMapping[str, Tensor], uses: dict[str, int],
              live_names: set[str]) -> None:
        ctx = self.ctx
        remaining = dict(uses)  # consumers not planned yet, per value (graph outputs never reach 0)
        self.frames.append(lambda: [env[n] for n in live_names])
        try:
            for node in nodes:
                cls = lookup(node)
                if cls is None:
                    raise UnsupportedError(f"{node.describe()}: not supported")
                op = cls(node)
                ctx.node = f"{node.name} ({node.op_type})"
                # Every input is an earlier node's output, a graph input or an initializer: load_onnx checked the
                # graph (onnx/validate.py).
                ins = [env[i] if i else None for i in node.inputs]
                folded = False
                if op.scoped:
                    outs = op.run_scoped(ctx, ins, lambda g, binds, keep=None: self.subgraph(g, env, binds, keep))
                elif all(t is None or t.is_const for t in ins):
                    folded = True
                    outs = self.folds.fold(node, op, ins) if self.folds is not None else fold(op, ins)
                else:
                    outs = op.run(ctx, *(self.mixed.inputs(op, ins) if self.mixed else ins))
                if self.names is not None and self.depth == 0:
                    made = {} if folded else {n: t.value for n, t in zip(node.outputs, outs, strict=False)
                                              if n and t is not None and t.is_const}
                    self.program.append((node, op, "scoped" if op.scoped else "fold" if folded else "run", made))
                for name, t in zip(node.outputs, outs, strict=False):
                    if name:
                        self._check_size(name, t)
                        self.name(name, t)
                        env[name] = t
                        t.uses += uses.get(name, 0)
                        remaining[name] = uses.get(name, 0)
                        if remaining[name] > 0:
                            live_names.add(name)
                for name in (*node.inputs, *node.implicit):
                    if name:
                        remaining[name] -= 1
                        if remaining[name] <= 0:
                            live_names.discard(name)
                self.release()
        finally:
            self.frames.pop()

    def subgraph(self, graph: Graph, outer: MutableMapping[str, Tensor], binds: list[Tensor | None],
                 keep: Callable[[], Iterable[Tensor]] | None) -> list[Tensor]:
        """Plan a subgraph with its formal inputs bound to `binds`; its outputs. `keep`: tensors the caller
        still needs while it runs (a Loop's scan outputs so far)."""
        if len(binds) != len(graph.inputs):
            raise ValueError(f"{self.ctx.node}: the subgraph {graph.name!r} takes {len(graph.inputs)} input(s), "
                             f"{len(binds)} given")
        scope: ChainMap[str, Tensor] = ChainMap({}, outer)
        for name, arr in graph.initializers.items():
            scope[name] = Tensor(arr.dtype, arr.shape, value=arr)
        uses = graph.use_counts()
        live: set[str] = set()
        for vi, t in zip(graph.inputs, binds, strict=True):
            if t is not None:
                scope[vi.name] = t
                if uses.get(vi.name, 0) > 0:
                    live.add(vi.name)
        if keep is not None:
            self.frames.append(keep)
        self.depth += 1
        try:
            self.nodes(graph.nodes, scope, uses, live)
        finally:
            self.depth -= 1
            if keep is not None:
                self.frames.remove(keep)
        return [scope[vi.name] for vi in graph.outputs]

    def release(self) -> None:
        # Only values still to be read keep their buffers (and the buffers their lazy inputs read).
        live: set[int] = set()
        for frame in self.frames:
            for t in frame():
                referenced_handles(t, live)
        self.ctx.release_unreferenced(live)

    def _check_size(self, name: str, t: Tensor | None) -> None:
        if self.limit is not None and t is not None and not t.is_const and t.size > self.limit:
            # A lazy value (an Expand a reduction reads) indexes like a buffer but allocates none.
            raise ValueError(f"{self.ctx.node}: output {name!r} of shape {t.shape} has {t.size} elements; the "
                             f"{self.ctx.backend.name} backend's kernels index with 32-bit integers, at most "
                             f"{self.limit} elements a tensor")


def build_plan(graph: Graph, backend: ComputeBackend, shapes: dict[str, tuple[int, ...]],
               host_values: dict[str, np.ndarray] | None = None, fuse: bool = True,
               precision: str = "f32", pool: WeightPool | None = None, folds: FoldCache | None = None,
               casts: dict | None = None) -> Plan:
    """The plan for these input shapes (and `host_values`: inputs used as shape arithmetic). With a `pool`
    (the model's), constants are taken from it and uploaded there once; with `folds` (the model's), a node
    folded before on the same small host values is not run again; with `casts` (the model's), precision="f16"
    converts each weight once for all plans."""
    if pool is not None:
        pool.register(graph.initializers.values())
    ctx = Context(backend, pool)
    ctx.fuse = fuse
    try:
        inputs, outputs = plan_graph(ctx, graph, shapes, host_values, precision, casts, folds)
    except BaseException:
        for h in ctx.handles:
            backend.free(h)
        if pool is not None:
            pool.release(ctx.shared)
        raise
    return Plan(backend, ctx, inputs, outputs)


def plan_graph(ctx: Context, graph: Graph, shapes: dict[str, tuple[int, ...]], host_values: dict | None,
               precision: str, casts: dict | None, folds: FoldCache | None,
               trace: Any = None) -> tuple[list, list]:
    """Plan `graph` into `ctx`: the plan's (name, Tensor) inputs and outputs. A `trace` (tape.Tape) learns the
    graph value each constant tensor planned is (`names`, by id of the tensor and of its array) and the nodes as
    planned (`program`): template.py's host program."""
    mixed = _Precision(ctx, casts) if precision == "f16" else None
    env: dict[str, Tensor] = {name: Tensor(arr.dtype, arr.shape, value=arr) for name, arr in graph.initializers.items()}
    inputs = []
    host_values = host_values or {}
    uses = graph.use_counts()
    live_names: set[str] = set()  # values some unplanned node (or the graph's outputs) still reads
    for vi in graph.inputs:
        if vi.name in host_values:
            env[vi.name] = Tensor(vi.dtype, shapes[vi.name], value=host_values[vi.name])
            continue
        t = ctx.new(vi.dtype, shapes[vi.name], pinned=True)
        env[vi.name] = t
        inputs.append((vi.name, t))
        if uses.get(vi.name, 0) > 0:
            live_names.add(vi.name)
    walk = _Walk(ctx, mixed, folds, ctx.backend.max_elements)
    walk.names = names = None if trace is None else trace.names
    if names is not None:
        for name, t in env.items():
            walk.name(name, t)
    walk.nodes(graph.nodes, env, uses, live_names)
    if trace is not None:
        trace.program = walk.program
    outputs = []
    input_handles = {t.view.handle for _, t in inputs}
    seen: set[int] = set()
    for vi in graph.outputs:
        t = env[vi.name]
        if mixed and t.dtype.kind == "f" and t.dtype != (vi.dtype or F32) and vi.dtype in (None, F16, F32):
            # Outputs keep the dtype the model declares (float32 ones were float16 inside the plan; a
            # float16 one may have come out of an op that ran on float32 copies).
            want = vi.dtype or F32
            ctx.node = f"output {vi.name} (to {want})"
            t = mixed.convert(None, t, want)
        if t.lazy is not None:
            ctx.view(t)
        if vi.dtype is not None and t.dtype != vi.dtype:
            raise ValueError(f"output {vi.name!r}: the graph declares {vi.dtype}, ember inferred {t.dtype}")
        if t.view is not None and (not t.view.is_contiguous() or t.view.handle in input_handles
                                   or t.view.handle in seen):
            # Views of inputs or of other outputs get their own buffer, so reading one is never stale.
            copy = ctx.alloc(t.dtype, t.shape, pinned=True)
            ctx.record(ctx.backend.record_elementwise(inp(0, kind_of(t.dtype)), [t.view], copy))
            t = Tensor(t.dtype, t.shape, view=copy)
        if t.view is not None:
            seen.add(t.view.handle)
        outputs.append((vi.name, t))
    return inputs, outputs


__all__ = ["Plan", "View", "build_plan", "plan_graph"]

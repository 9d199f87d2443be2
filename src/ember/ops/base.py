"""Op registry and the context ops run in.

One class per ONNX op (as in onnx.reference), registered by (domain, op_type) with the opset version it
is valid `since`; one implementation serves every later opset with the same meaning. An op's `run`
takes input tensors and returns output tensors, recording backend steps through the context: the same
code builds a plan on any backend and folds constants on the cpu backend.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import numpy as np

from ..backends.base import ComputeBackend
from ..core.dtypes import kind_of
from ..core.expr import Expr, inp
from ..core.view import View
from ..ir import Node


@dataclass
class Lazy:
    """A value not computed yet: `expr` over `inputs`, or, with an `anchor`, a kernel (Conv, MatMul) that
    applies `expr` (over input 0 = its accumulator) as its epilogue. Elementwise consumers extend a lazy
    value instead of reading it, so a chain of elementwise nodes becomes one kernel."""

    expr: Expr
    inputs: list[Tensor]
    anchor: Callable[..., list] | None = None  # (out, act, bias View | None) -> steps
    nodes: int = 1  # graph nodes this value stands for (for the fusion counters)
    origin: str = ""  # the node that created it (profile labels)
    deps: list[View] = field(default_factory=list)  # buffers the anchor kernel will read
    # how many more tensors the anchor can add before its epilogue (MatMul: a bias, then a residual), each passed
    # to it as one more View in `inputs`' order
    takes_bias: int = 0
    flat: bool = False  # the anchor writes its result row-major at out's offset, whatever out's shape (MatMul)
    # (out, act, kernel, strides, pads, dilations) -> steps: the anchor kernel with a max pooling of its result
    # fused in (a MaxPool its only reader; the backend's conv_maxpool), or None
    pool: Callable[..., list] | None = None


@dataclass(eq=False)
class Tensor:
    """A tensor while planning: static dtype and shape, and a host value (constant), a device view, or a
    lazy expression. `uses` counts the consumers the planner has seen for it."""

    dtype: np.dtype
    shape: tuple[int, ...]
    value: np.ndarray | None = None
    view: View | None = None
    lazy: Lazy | None = None
    uses: int = 0

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def is_const(self) -> bool:
        return self.value is not None


class UnsupportedError(NotImplementedError):
    """An op (or an attribute/dtype combination of it) that a backend cannot run."""


class ConstantPool(Protocol):
    """Constants on a backend shared by several plans (ember.plan.WeightPool, one per model)."""

    backend: ComputeBackend

    def identity_key(self, value: Any, aliases: dict[int, tuple[np.ndarray, Hashable]]) -> Hashable | None: ...

    def key(self, value: Any, dtype: np.dtype, size: int,
            aliases: dict[int, tuple[np.ndarray, Hashable]]) -> tuple[Hashable, np.ndarray | None]: ...

    def acquire(self, key: Hashable, nbytes: int, make: Callable[[], np.ndarray]) -> int: ...


class Context:
    """Where an op records its work: allocation, constants on the device, and steps.

    With a `pool`, constants live there, shared with the other plans of the model (`shared` lists the entries
    this plan holds); without one (constant folding, a plan built on its own) the plan owns their buffers."""

    def __init__(self, backend: ComputeBackend, pool: ConstantPool | None = None) -> None:
        if pool is not None and pool.backend is not backend:
            # A pool's handles name buffers of its own backend: another backend's handle is another buffer.
            raise ValueError(f"the constant pool is on backend {pool.backend!r}, the plan on {backend!r}")
        self.backend = backend
        self.pool = pool
        self.shared: dict[Hashable, int] = {}  # pool keys this plan holds -> their handles
        # id(value) -> (value, key): constants made from another by a known transform (derived()); the value is
        # held so its id stays unique while planning.
        self._derived: dict[int, tuple[np.ndarray, Hashable]] = {}
        self.steps: list = []
        self.handles: list[int] = []  # allocations made while planning (owned by the plan)
        # Buffer reuse: an intermediate whose last reader has been recorded goes back to a free list.
        self.reuse = True
        self._free: list[tuple[int, int]] = []  # (nbytes, handle)
        self._in_use: set[int] = set()  # intermediate handles holding live data
        self.pinned: set[int] = set()  # allocations never reused (inputs, outputs, uploaded constants)
        self.requested_bytes = 0  # every intermediate allocation, as if none were reused
        self.intermediate_bytes = 0  # what the intermediates really take
        self._uploaded: dict[int, tuple[Tensor, View]] = {}
        self.counters: dict[str, int] = {}  # count(): occurrences per run of the plan (see COUNTERS)
        self.node = ""  # the node being planned: recorded steps are labelled with it
        self.labels: list[str] = []
        self.fuse = True  # lazy elementwise fusion and epilogues (off: one kernel per node)

    # ---- tensors ----------------------------------------------------------------------------------
    def alloc(self, dtype: Any, shape: Sequence[int], *, pinned: bool = False) -> View:
        """A buffer for a new value; `pinned` ones (inputs, weights) are never reused."""
        dtype = np.dtype(dtype)
        limit = self.backend.max_elements
        if limit is not None and math.prod(shape) > limit:
            raise ValueError(f"{self.node or 'plan'}: a {dtype} tensor of shape {tuple(shape)} has "
                             f"{math.prod(shape)} elements; this backend's kernels index with 32-bit integers, at "
                             f"most {limit} elements a tensor")
        nbytes = max(math.prod(shape), 1) * self.backend.storage_itemsize(dtype)
        handle = None
        if not pinned:
            self.requested_bytes += nbytes
            if self.reuse:
                fits = [(size, h) for size, h in self._free if nbytes <= size <= 2 * nbytes + 4096]
                if fits:
                    best = min(fits)
                    self._free.remove(best)
                    handle = best[1]
        if handle is None:
            handle = self.backend.alloc(nbytes)
            self.handles.append(handle)
            if pinned:
                self.pinned.add(handle)
            else:
                self.intermediate_bytes += nbytes
        if not pinned:
            self._in_use.add(handle)
        return View.contiguous(handle, dtype, shape)

    def release_unreferenced(self, live: set[int]) -> None:
        """Return every intermediate buffer not in `live` to the free list (its readers are recorded)."""
        for h in sorted(h for h in self._in_use if h not in live):  # in allocation order: plans line up
            self._in_use.discard(h)
            self._free.append((self.backend.nbytes(h), h))

    def new(self, dtype: Any, shape: Sequence[int], *, pinned: bool = False) -> Tensor:
        shape = tuple(int(d) for d in shape)
        return Tensor(np.dtype(dtype), shape, view=self.alloc(dtype, shape, pinned=pinned))

    def const(self, value: Any, dtype: Any = None) -> Tensor:
        arr = np.asarray(value, dtype=dtype)
        return Tensor(arr.dtype, arr.shape, value=arr)

    def view(self, t: Tensor) -> View:
        """The device view of t; a constant is uploaded once, on first use; a lazy value is computed."""
        if t.view is not None:
            return t.view
        if t.lazy is not None:
            return self.materialize(t)
        assert t.value is not None
        hit = self._uploaded.get(id(t))
        if hit is not None:
            return hit[1]
        if self.pool is not None:
            v = View.contiguous(self._shared_handle(t), t.dtype, t.shape)
        else:
            v = self.alloc(t.dtype, t.shape, pinned=True)
            self.backend.upload(v.handle, np.ascontiguousarray(t.value, t.dtype))
        # Cached here, not on t: the same constant may be planned on another backend (folding).
        self._uploaded[id(t)] = (t, v)
        return v

    def _shared_handle(self, t: Tensor) -> int:
        """The pool's buffer holding constant t, held by this plan from now on."""
        assert self.pool is not None
        key, arr = self.pool.key(t.value, t.dtype, t.size, self._derived)
        return self._hold(t, key, arr)

    def _hold(self, t: Tensor, key: Hashable, arr: np.ndarray | None) -> int:
        """The pool's entry `key` for constant t (`arr`: its contiguous array, where keying made it)."""
        assert self.pool is not None
        value = t.value
        handle = self.shared.get(key)
        if handle is None:
            nbytes = max(t.size, 1) * self.backend.storage_itemsize(t.dtype)
            handle = self.shared[key] = self.pool.acquire(
                key, nbytes, lambda: arr if arr is not None else np.ascontiguousarray(value, t.dtype))
        return handle

    def derived(self, value: np.ndarray, source: Tensor, transform: Hashable) -> None:
        """Say that constant `value` is `transform` applied to constant `source`'s value (precision="f16"'s
        float16 copy of a weight): the pool then keys it by the source's identity and `transform`, which must
        name everything else the value depends on, instead of hashing its contents."""
        if self.pool is None or source.value is None:
            return
        src = self.pool.identity_key(source.value, self._derived)
        if src is not None:
            self._derived[id(value)] = (value, ("derived", transform, src))

    def materialize(self, t: Tensor) -> View:
        lz = t.lazy
        assert lz is not None
        out = self.alloc(t.dtype, t.shape)
        if lz.anchor is not None:
            identity = lz.expr.op == "in"
            addends = [self.view(i).broadcast_to(t.shape) for i in lz.inputs]
            self.record(lz.anchor(out, None if identity else lz.expr, *addends), lz.origin)
            if lz.nodes > 1:  # the activation's nodes and the adds the kernel took
                self.count("epilogue.fused", lz.nodes - 1)
        else:
            views = [self.view(i).broadcast_to(t.shape) for i in lz.inputs]
            if t.size:
                self.record(self.backend.record_elementwise(lz.expr, views, out), lz.origin)
            self.count("elementwise.kernels")
            self.count("elementwise.nodes", lz.nodes)
        t.view, t.lazy = out, None
        return out

    def contiguous(self, t: Tensor) -> View:
        v = self.view(t)
        if v.is_contiguous():
            return v
        out = self.alloc(t.dtype, t.shape)
        self.record(self.backend.record_elementwise(inp(0, kind_of(t.dtype)), [v], out))
        return out

    def record(self, steps: list, label: str | None = None) -> None:
        self.steps.extend(steps)
        self.labels.extend([label or self.node] * len(steps))

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n


def referenced_handles(t: Tensor, out: set[int]) -> None:
    """Buffers that t's data lives in or (while lazy) will be computed from."""
    if t.view is not None:
        out.add(t.view.handle)
    if t.lazy is not None:
        out.update(v.handle for v in t.lazy.deps)
        for i in t.lazy.inputs:
            referenced_handles(i, out)


class Op:
    """Base of every op. Subclasses set op_type/since and `attrs` (schema defaults) and define run()."""

    op_type: ClassVar[str]
    domain: ClassVar[str] = ""
    since: ClassVar[int] = 1
    attrs: ClassVar[dict[str, Any]] = {}
    # Inputs whose *value* (not just shape) the op needs at plan time (e.g. Reshape's shape).
    host_inputs: ClassVar[tuple[int, ...]] = ()
    # Every kernel this op records takes float16 storage (precision="f16"); else it runs on float32 copies.
    f16: ClassVar[bool] = False
    # False: the op reads its inputs' shapes only (Shape, Size), so precision="f16" converts none of them.
    reads_data: ClassVar[bool] = True
    # Inputs (True: every one) the op reads as float16 or float32 alike (views, copies, the attention kernels):
    # under precision="f16" a computed value there keeps its dtype, so a decoder's float32 past KV reaches its
    # Concat and attention as it is rather than cast to float16 and its present back; constants still go f16.
    any_float: ClassVar[bool | tuple[int, ...]] = ()
    # The op holds subgraphs (If, Loop): the planner calls run_scoped(ctx, inputs, plan_graph) instead of run,
    # plan_graph(graph, bound_inputs, keep=None) planning a subgraph in a scope that sees the enclosing values.
    scoped: ClassVar[bool] = False
    # The op's output shape depends on its input data (NonZero): it runs on the host between the graph's stages
    # (ember.plan.stages) through compute(*numpy arrays) when its inputs come from the device.
    host_op: ClassVar[bool] = False

    def __init__(self, node: Node) -> None:
        self.node = node
        # consumed_inputs is a pre-opset-6 memory hint with no effect on results.
        unknown = set(node.attrs) - set(self.attrs) - {"consumed_inputs"}
        if unknown:
            raise UnsupportedError(f"{node.describe()}: unsupported attribute(s) {sorted(unknown)}")
        # The node's attributes, each missing one at its schema default.
        self.attr: dict[str, Any] = {**self.attrs, **{k: v for k, v in node.attrs.items() if k != "consumed_inputs"}}

    def run(self, ctx: Context, *inputs: Tensor | None) -> list[Tensor]:
        raise NotImplementedError

    def fail(self, message: str) -> UnsupportedError:
        return UnsupportedError(f"{self.node.describe()}: {message}")


def norm_axis(op: Op, axis: int, rank: int) -> int:
    """An ONNX axis attribute or input (negative: from the end) as an index into `rank` dims."""
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"{op.node.describe()}: axis {axis} is out of range for rank {rank}")
    return axis % rank if rank else 0


def host_ints(op: Op, t: Tensor | None, what: str) -> list[int] | None:
    """Values of an input that must be known while planning (shape arithmetic runs on the host)."""
    if t is None:
        return None
    if not t.is_const:
        raise op.fail(f"the {what} input must be known when the plan is built (it is computed on the device)")
    return [int(v) for v in np.asarray(t.value).reshape(-1)]


MAX_RANK = 64  # numpy's (and so the host side's) limit on dimensions


def host_shape(op: Op, t: Tensor | None, what: str = "shape") -> list[int] | None:
    """host_ints for an input that gives an output's dims (Reshape, Expand, ConstantOfShape): at most MAX_RANK."""
    dims = host_ints(op, t, what)
    if dims is not None and len(dims) > MAX_RANK:
        raise op.fail(f"the {what} input has {len(dims)} dims; at most {MAX_RANK} are supported")
    return dims


REGISTRY: dict[tuple[str, str], list[type[Op]]] = {}


def register(op_type: str, since: int = 1, domain: str = "") -> Callable[[type[Op]], type[Op]]:
    def deco(cls: type[Op]) -> type[Op]:
        sub = type(cls.__name__, (cls,), {"op_type": op_type, "since": since, "domain": domain})
        entries = REGISTRY.setdefault((domain, op_type), [])
        entries.append(sub)
        entries.sort(key=lambda c: c.since)
        return cls

    return deco


def lookup(node: Node) -> type[Op] | None:
    """The implementation valid at the node's opset: the newest registered `since` <= opset."""
    entries = REGISTRY.get((node.domain, node.op_type))
    if not entries:
        return None
    valid = [c for c in entries if c.since <= node.opset]
    return valid[-1] if valid else None


def call_op(ctx: Context, parent: Op, op_type: str, *inputs: Tensor | None, opset: int | None = None,
            **attrs: object) -> list[Tensor]:
    """Run another registered default-domain op inside this one (same context), e.g. MatMul inside QLinearMatMul;
    looked up in the registry, so an op family needs no import of another's module. `opset`: the version to look
    it up at (default: the parent's, which for a contrib op is its own domain's, not ONNX's)."""
    node = Node(op_type, "", [f"_{i}" if t is not None else "" for i, t in enumerate(inputs)], ["_y"], attrs,
                f"{parent.node.name}/{op_type}", parent.node.opset if opset is None else opset)
    cls = lookup(node)
    assert cls is not None, op_type
    return cls(node).run(ctx, *inputs)


# The counters ops may add to a plan (Context.count), each declared by the module that counts it, so a
# model can report them (as 0) before any plan has counted one.
COUNTERS: list[str] = []


def declare_counters(*keys: str) -> None:
    """Declare counters an op family adds to plans (see COUNTERS)."""
    COUNTERS.extend(k for k in keys if k not in COUNTERS)


declare_counters("elementwise.kernels", "elementwise.nodes", "epilogue.fused")  # Context.materialize
# Counted by the plan from its steps (Plan, backend.select_counters: the backend chose the kernel): products on the
# matrix units, and the same tiling emulated in plain shader code (EMBER_MATRIX=emulate).
declare_counters("matmul.subgroup_matrix", "matmul.subgroup_matrix_emulated", "conv.subgroup_matrix",
                 "conv.subgroup_matrix_emulated")

"""`ember.load_onnx` and `Model`: the user-facing ONNX runtime."""

from __future__ import annotations

import contextlib
import numbers
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Never

import numpy as np

from . import settings
from .backends import BACKEND_OPTIONS, ComputeBackend, DeviceLostError, canonical_name, check_backend_options
from .backends import backend as make_backend
from .core import progress
from .core.options import reject_unknown
from .device_array import DeviceArray
from .interop import cast_feed, host_value, shape_key
from .ir import Graph
from .onnx.importer import load
from .onnx.optimize import fusion_misses, optimize
from .onnx.validate import check_structure
from .ops import UnsupportedError, lookup
from .ops.control import control_problems
from .plan import COUNTERS, FoldCache, Plan, StagedPlan, WeightPool, build_plan, host_value_inputs, needs_stages
from .plan.control_runtime import runtime_nodes
from .plan.families import Families


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int | str | None, ...] | None  # ints, strings for symbolic dims; None: not declared
    dtype: np.dtype

    def __repr__(self) -> str:
        shape = None if self.shape is None else list(self.shape)
        return f"TensorInfo(name={self.name!r}, shape={shape}, dtype={self.dtype})"


def check_supported(graph: Graph) -> None:
    """NotImplementedError naming every node ember cannot run (not only the first)."""
    problems = []
    for node in graph.all_nodes():  # subgraphs too: an unsupported op in a branch fails at load
        cls = lookup(node)
        if cls is None:
            problems.append(f"  {node.describe()}")
            continue
        try:
            cls(node)
        except UnsupportedError as e:
            problems.append(f"  {e}")
    if problems:
        raise NotImplementedError(f"{len(problems)} unsupported node(s) in the model:\n" + "\n".join(problems))
    bad = control_problems(graph)
    if bad:
        raise ValueError(bad[0] if len(bad) == 1 else f"{len(bad)} problems in the graph:\n" +
                         "\n".join(f"  - {p}" for p in bad))


# f32: every float tensor as the model declares it. f16: float32 weights and activations stored as float16
# on the device (half the memory traffic), computed and accumulated in float32 inside each kernel; inputs
# and outputs stay float32.
PRECISIONS = ("f32", "f16")


def check_f16(be: ComputeBackend) -> None:
    be._require_init()
    if be.name != "wgpu":
        raise ValueError(f"precision='f16' needs the wgpu backend (got backend {be.name!r}, which computes in "
                         "float32); use precision='f32' there")
    if "shader-f16" not in be.features:
        raise ValueError(f"precision='f16': the adapter {be.adapter_name} lacks the WebGPU 'shader-f16' feature; "
                         "use precision='f32'")


# Device bytes a model's cached plans may hold together (their own buffers: intermediates, inputs, outputs,
# kernel scratch; the weights they share are not counted), unless load_onnx(plan_cache_bytes=...) says otherwise.
DEFAULT_PLAN_CACHE_BYTES = 1 << 30


def check_plan_cache_bytes(value: Any) -> int:
    if value is None:
        return DEFAULT_PLAN_CACHE_BYTES
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"plan_cache_bytes: expected a number of bytes (an int >= 0; 0 keeps only the plan in "
                         f"use), got {value!r}")
    return int(value)


# Every keyword option load_onnx takes (Model's, the backend's, and where external data lives).
LOAD_OPTIONS = ("fuse", "precision", "plan_cache_bytes", "autotune", *BACKEND_OPTIONS, "external_data_dir")


def check_load_options(backend: Any, fuse: Any, precision: Any, plan_cache_bytes: Any, autotune: Any, adapter: Any,
                       power_preference: Any, safe: Any = False, webgpu: Any = None) -> int:
    """TypeError/ValueError naming the option and the value given, for a value of the wrong type or out of range;
    the plan cache's limit in bytes otherwise. Whether the device can do precision='f16' is checked once it is
    open (check_f16)."""
    if isinstance(backend, ComputeBackend) and (adapter is not None or power_preference is not None
                                                or webgpu is not None):
        given = [k for k, v in (("adapter", adapter), ("power_preference", power_preference), ("webgpu", webgpu))
                 if v is not None]
        raise ValueError(f"{', '.join(given)}: pick the device of a backend given by name; the {backend.name} "
                         "backend object given has its device already")
    if not isinstance(fuse, (bool, np.bool_)):
        raise TypeError(f"fuse: expected True or False, got {fuse!r}")
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ValueError(f"precision: expected one of {list(PRECISIONS)}, got {precision!r}")
    if autotune is not None and not isinstance(autotune, bool):
        raise TypeError(f"autotune: expected True, False or None, got {autotune!r}")
    check_backend_options(adapter, power_preference, safe, webgpu)
    if safe and isinstance(backend, ComputeBackend) and backend.name == "wgpu" and not getattr(backend, "checked", 1):
        raise ValueError("safe=True: the wgpu backend object given runs trusted shader modules; give the backend "
                         "by name, or make it with ember.backend('wgpu', safe=True)")
    return check_plan_cache_bytes(plan_cache_bytes)


def _value_key(v: Any) -> Any:
    """A host input's value as part of a plan key: an array's bytes (with dtype and shape), a sequence's items'."""
    if isinstance(v, list):
        return ("sequence", tuple(_value_key(x) for x in v))
    if v is None:
        return None
    a = np.asarray(v)
    return (a.dtype.str, a.shape, a.tobytes())


class Model:
    """A loaded ONNX model bound to one backend. A plan is built per input-shape signature and cached, least
    recently used first out once the cached plans hold more than `plan_cache_bytes` of device memory; the
    weights are uploaded once, into a pool every plan of the model reads (cache_info() shows both). load_onnx
    documents the options."""

    def __init__(self, graph: Graph, backend: str | ComputeBackend, source: str, *, fuse: bool = True,
                 precision: str = "f32", autotune: bool | None = None, plan_cache_bytes: int | None = None,
                 adapter: int | str | None = None, power_preference: str | None = None, safe: bool = False,
                 webgpu: str | None = None) -> None:
        self._limit = check_load_options(backend, fuse, precision, plan_cache_bytes, autotune, adapter,
                                         power_preference, safe, webgpu)
        backend_opts = {k: v for k, v in (("adapter", adapter), ("power_preference", power_preference), ("safe", safe),
                                          ("webgpu", webgpu)) if v is not None and v is not False}
        self.graph = graph
        self.fuse = bool(fuse)
        self.autotune = autotune
        self.source = source
        # How reload() finds a device again: the backend's name and options (None: the caller's own object).
        self._backend_spec = None if isinstance(backend, ComputeBackend) else (backend, backend_opts)
        self._be = backend if isinstance(backend, ComputeBackend) else shared_backend(backend, **backend_opts)
        if precision == "f16":
            check_f16(self._be)
        self.precision = precision
        # Every plan is used under _lock (runs from several threads take turns), so the cache, the pool and the
        # counts below change under it only.
        self._lock = threading.Lock()
        self._plans: OrderedDict[tuple, Plan] = OrderedDict()  # least recently used first
        self._pool = WeightPool(self._be, graph.initializers.values())
        self._folds = FoldCache()
        self._casts: dict = {}  # precision="f16": the weights' float16 copies, shared by the plans
        self._plan_bytes = 0  # Plan.device_bytes summed over _plans
        self._builds = self._evictions = 0
        self.inputs = [TensorInfo(v.name, v.shape, v.dtype) for v in graph.inputs]  # shape None: any, from the feed
        # An output the model declares without a shape shows None until a plan knows it.
        self.outputs = [TensorInfo(v.name, v.shape, v.dtype) for v in graph.outputs]
        # Per run, each plan counter (Plan.counters) adds its count: every counter the ops declare starts at 0.
        self._stats = dict.fromkeys(COUNTERS, 0)
        self.rewrites: dict[str, int] = {}
        # An If or Loop decided at run time reads its condition from the run, not from inputs the plan is keyed by.
        self._host_inputs = host_value_inputs(graph, skip=runtime_nodes(graph))
        for vi in graph.inputs:
            if vi.dtype is None and vi.kind == "tensor":
                raise ValueError(f"input {vi.name!r}: the model declares no tensor dtype")
        # Feeds that are numpy arrays of the declared dtype and static shape, C-contiguous, pass _check_feeds in
        # a few comparisons; anything else takes the full check, which casts or says what is wrong.
        static = all(v.shape is not None and all(isinstance(d, int) for d in v.shape) for v in graph.inputs)
        self._fast_feeds = tuple((v.name, np.dtype(v.dtype), tuple(v.shape)) for v in graph.inputs) \
            if static else None
        # A graph with data-dependent shapes (NonZero) runs in stages, planned as the data comes (plan/stages.py).
        self._staged = needs_stages(graph)
        # Symbolic input dims: plans traced, and made from templates where the shapes move along a line
        # (plan/families.py).
        self._traced = not static and not self._staged
        self._families = self._new_families()
        # Everything static is compiled now, so the first run is as cheap as the others.
        if not self._host_inputs and static and not self._staged:
            plan = self._plan({v.name: tuple(v.shape) for v in graph.inputs}, {})
            # With static inputs every output shape is known now: fill in what the file left out.
            known = {name: t.shape for name, t in plan.outputs}
            self.outputs = [TensorInfo(o.name, o.shape if o.shape is not None and all(isinstance(d, (int, str))
                                                                                        for d in o.shape)
                                       else known[o.name], o.dtype) for o in self.outputs]

    def _new_families(self) -> Families | None:
        if not self._traced:
            return None
        return Families(self.graph, self._be, self._pool, self._folds, self._casts, self.fuse, self.precision)

    @property
    def backend(self) -> str:
        return self._be.name

    @property
    def compute_backend(self) -> Any:
        return self._be

    def __repr__(self) -> str:
        ins = ", ".join(f"{i.name}: {i.dtype}{list(i.shape) if i.shape is not None else '[?]'}" for i in self.inputs)
        outs = ", ".join(f"{o.name}: {o.dtype}{list(o.shape) if o.shape is not None else '[?]'}"
                         for o in self.outputs)
        return f"<ember.Model {len(self.graph.nodes)} nodes on {self.backend!r}; inputs ({ins}); outputs ({outs})>"

    def _plan(self, shapes: dict[str, tuple[int, ...]], feeds: dict[str, np.ndarray]) -> Plan:
        """The plan for these input shapes (and values of inputs used as shape arithmetic), from the cache or
        built now. Called under _lock (or from __init__)."""
        host = {n: feeds[n] for n in self._host_inputs}
        key = (tuple(shapes[v.name] for v in self.graph.inputs), tuple((n, _value_key(host[n])) for n in sorted(host)))
        plan = self._plans.get(key)
        if plan is not None:
            self._plans.move_to_end(key)
            return plan
        fam = self._families if settings.TEMPLATES.get() else None
        scope = getattr(self._be, "autotune_scope", None)
        if fam is not None:  # a template's live plan, moved to these shapes: held by the families, not the cache
            with scope(self.autotune) if scope is not None else contextlib.nullcontext():
                plan = fam.live(shapes, host)
            if plan is not None:
                self._evict(self._limit - fam.live_bytes, keep=0)
                return plan
        try:
            plan, built = self._build(shapes, host)
        except MemoryError:  # OutOfMemoryError included: the cached plans' buffers may be what is missing
            if not self._plans and not (fam is not None and fam.live_plans):
                raise
            self._evict(-1, keep=0)
            if fam is not None:
                fam.free()
            plan, built = self._build(shapes, host)
        if fam is not None and fam.holds(plan):  # the trace verified a template: its live plan serves these shapes
            self._evict(self._limit - fam.live_bytes, keep=0)
            return plan
        self._plans[key] = plan
        self._plan_bytes += plan.device_bytes
        self._builds += built
        self._evict(self._limit - (fam.live_bytes if fam is not None else 0))
        if fam is not None and fam.live_plans and self._plan_bytes + fam.live_bytes > self._limit:
            self._evictions += fam.live_plans  # older than the plan just built: made again when their shapes return
            fam.free()
        return plan

    def _build(self, shapes: dict[str, tuple[int, ...]], host: dict[str, np.ndarray]) -> tuple[Plan, bool]:
        """(the plan, whether the graph was planned for it: False for a plan made from a template)."""
        # Backends that tune kernels while recording (wgpu) take the model's on/off for this plan.
        scope = getattr(self._be, "autotune_scope", None)
        built = True
        with (scope(self.autotune) if scope is not None else contextlib.nullcontext()) as report, \
                progress.task(f"building the plan on {self._be.name}"):
            if self._staged:
                plan = StagedPlan(self.graph, self._build_stage, self._be)
            elif self._families is not None and settings.TEMPLATES.get():
                plan, built = self._families.make(shapes, host, lambda: self._build_stage(self.graph, shapes, host))
            else:
                plan = self._build_stage(self.graph, shapes, host)
        if report is not None:  # plan_info shows what tuning cost this plan: autotune.tuned, .seconds, ...
            plan.stats.update({f"autotune.{k}": v for k, v in report.items()})
        return plan, built

    def _build_stage(self, graph: Graph, shapes: dict[str, tuple[int, ...]], host: dict[str, np.ndarray]) -> Plan:
        return build_plan(graph, self._be, shapes, host, fuse=self.fuse, precision=self.precision, pool=self._pool,
                          folds=self._folds, casts=self._casts)

    def _evict(self, limit: int, keep: int = 1) -> None:
        """Free least recently used plans until the cached ones hold at most `limit` bytes, keeping the `keep`
        most recent (the plan about to run)."""
        while self._plan_bytes > limit and len(self._plans) > keep:
            _, plan = self._plans.popitem(last=False)
            self._plan_bytes -= plan.device_bytes
            self._evictions += 1
            plan.free()

    def _check_feeds(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        fast = self._fast_feeds
        if fast is not None and type(feeds) is dict and len(feeds) == len(fast):
            for name, dtype, shape in fast:
                v = feeds.get(name)
                if type(v) is not np.ndarray or v.dtype != dtype or v.shape != shape or not v.flags.c_contiguous:
                    break
            else:
                return dict(feeds)
        if not isinstance(feeds, Mapping):
            raise TypeError(f"feeds must be a mapping of input name -> array, got {type(feeds).__name__}")
        names = {i.name for i in self.inputs}
        unknown = sorted(set(feeds) - names)
        if unknown:
            raise ValueError(f"unknown input name(s) {unknown}; the model's inputs are {sorted(names)}")
        missing = [i.name for i in self.inputs if i.name not in feeds]
        if missing:
            raise ValueError(f"missing input(s) {missing}; the model's inputs are {[i.name for i in self.inputs]}")
        out = {}
        symbols: dict[str, int] = {}
        kinds = {vi.name: vi.kind for vi in self.graph.inputs}
        for info in self.inputs:
            value = feeds[info.name]
            if kinds[info.name] != "tensor":  # a sequence (list of arrays) or an optional (array or None)
                out[info.name] = host_value(info.name, value, kinds[info.name])
                continue
            if isinstance(value, DeviceArray):
                if value.backend is not self._be:
                    raise ValueError(f"input {info.name!r}: a device array of another backend object; pass "
                                     f"value.numpy() or an array from this model's backend")
                if value.dtype != info.dtype:
                    raise ValueError(f"input {info.name!r}: expected dtype {info.dtype}, got device array of "
                                     f"{value.dtype}")
                arr = value
            else:
                arr = cast_feed(info.name, value, info.dtype)
            if info.shape is not None and arr.ndim != len(info.shape):  # no declared shape: any feed's is taken
                raise ValueError(f"input {info.name!r}: expected rank {len(info.shape)} (shape {list(info.shape)}), "
                                 f"got rank {arr.ndim} (shape {list(arr.shape)})")
            declared = (None,) * arr.ndim if info.shape is None else info.shape
            for axis, (want, got) in enumerate(zip(declared, arr.shape, strict=True)):
                if isinstance(want, int) and want != got:
                    raise ValueError(f"input {info.name!r}: dim {axis} must be {want}, got {got} "
                                     f"(shape {list(arr.shape)}, expected {list(info.shape)})")
                if isinstance(want, str):
                    if symbols.setdefault(want, got) != got:
                        raise ValueError(f"input {info.name!r}: dim {axis} ({want!r}) is {got}, but another input "
                                         f"set {want!r} to {symbols[want]}")
            # np.require keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d).
            out[info.name] = arr if isinstance(arr, DeviceArray) else np.require(arr, requirements="C")
        return out

    def run(self, feeds: Mapping[str, Any], output_names: list[str] | None = None,
            keep_on_device: bool = False) -> dict[str, Any]:
        """Run the model. Feeds: numpy arrays, lists and scalars, DeviceArrays of this backend, torch tensors
        (detached, copied to the host from CUDA) and other arrays with __array__ or __dlpack__ (ember.interop),
        cast only within their kind (cast_feed). With keep_on_device, outputs are DeviceArrays (`.numpy()` reads
        them back) that can be fed to a model on the same backend without a host round trip."""
        arrays = self._check_feeds(feeds)
        if output_names is not None:
            known = [o.name for o in self.outputs]
            bad = [n for n in output_names if n not in known]
            if bad:
                raise ValueError(f"unknown output name(s) {bad}; the model's outputs are {known}")
        with self._lock, self._device_errors():
            plan = self._plan({k: shape_key(v) for k, v in arrays.items()}, arrays)
            built = plan.builds if self._staged else 0
            result = plan.run(arrays, output_names, keep_on_device)
            if self._staged:  # its stages' plans are built as the data comes: what the cache holds grows
                self._builds += plan.builds - built
                self._plan_bytes = sum(p.device_bytes for p in self._plans.values())
                self._evict(self._limit)
            for k, v in plan.counters.items():
                self._stats[k] = self._stats.get(k, 0) + v
        names = output_names if output_names is not None else [o.name for o in self.outputs]
        if self.precision == "f16" and not keep_on_device:
            bad = [n for n in names if result[n].dtype.kind == "f" and not np.isfinite(result[n]).all()]
            if bad:
                # float16 tops out at 65504: a larger activation becomes inf (then NaN) where float32 is fine.
                warnings.warn(f"precision='f16': output(s) {bad} hold inf/NaN; activations may exceed float16's "
                              "range (65504) in this model; load it with precision='f32'", RuntimeWarning,
                              stacklevel=2)
        return {n: result[n] for n in names}

    def __call__(self, *arrays: Any) -> list[np.ndarray]:
        if len(arrays) != len(self.inputs):
            raise ValueError(f"expected {len(self.inputs)} positional input(s) "
                             f"{[i.name for i in self.inputs]}, got {len(arrays)}")
        result = self.run({i.name: a for i, a in zip(self.inputs, arrays, strict=True)})
        return [result[o.name] for o in self.outputs]

    def profile(self, feeds: Mapping[str, Any], top: int | None = None) -> list[tuple[str, float]]:
        """Per-step time in ms (GPU timestamp queries on wgpu), labelled with the node that produced each step,
        slowest first. On a hardware GPU a step's time is what it adds to the whole run in the stream (the run
        timed with that step executed twice, minus the run), so the times add up to about the run's GPU time;
        on a software adapter each step is timed alone. See WgpuBackend.profile."""
        arrays = self._check_feeds(feeds)
        with self._lock, self._device_errors():
            plan = self._plan({k: v.shape for k, v in arrays.items()}, arrays)
            plan.run(arrays)  # inputs in place, pipelines warm
            rows = sorted(plan.profile(), key=lambda r: -r[1])
        return rows[:top] if top else rows

    def gpu_time(self, feeds: Mapping[str, Any], reps: int = 5) -> float:
        """Milliseconds the device spends on one run with these feeds' shapes, host work excluded (on wgpu: GPU
        timestamps around the run's command buffer, after a warm-up; min of `reps`). profile() splits it up."""
        arrays = self._check_feeds(feeds)
        with self._lock, self._device_errors():
            plan = self._plan({k: v.shape for k, v in arrays.items()}, arrays)
            plan.run(arrays)
            return plan.gpu_time(reps)

    def plan_info(self, feeds: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Facts about the plan for these feeds (or the only plan): steps, fusion counts, memory, and which input
        dims the model leaves symbolic ({input: {axis: the declared name or None}}; each set of their values gets a
        plan of its own)."""
        with self._lock:
            if feeds is not None:
                arrays = self._check_feeds(feeds)
                plan = self._plan({k: v.shape for k, v in arrays.items()}, arrays)
            elif len(self._plans) == 1:
                plan = next(iter(self._plans.values()))
            else:
                raise ValueError("this model has several (or no) plans yet: pass feeds to pick one")
            # Read under the lock: another thread's run may evict this plan once it is released.
            return {"nodes": len(self.graph.nodes), "steps": len(plan.steps), "rewrites": dict(self.rewrites),
                    "intermediate_bytes": plan.intermediate_bytes,
                    "intermediate_bytes_without_reuse": plan.intermediate_bytes_without_reuse,
                    "scratch_bytes": plan.scratch_bytes(), "device_bytes": plan.device_bytes,
                    "symbolic_dims": self._symbolic_dims(), "runtime": self._be.runtime_info(), **plan.stats,
                    "fusion_misses": fusion_misses(self.rewrites, plan.stats)}  # near misses, fallbacks: why

    def _symbolic_dims(self) -> dict[str, dict[int, str | None] | None]:
        # An input declared without a shape is symbolic in every dim, its rank included: None.
        return {vi.name: None if vi.shape is None else
                {axis: dim for axis, dim in enumerate(vi.shape) if not isinstance(dim, int)}
                for vi in self.graph.inputs if vi.shape is None or any(not isinstance(dim, int) for dim in vi.shape)}

    def cache_info(self) -> dict[str, int]:
        """The plan cache and the weight pool: live plans, plans built since load, shapes served from a template,
        graph walks (`traces`: the traced builds, and the traces that verified a template, whose shapes a template
        then served), plans evicted, device bytes the live plans hold (their own buffers and scratch), device bytes
        of the weights they share, and the bound on the plans' bytes (load_onnx's plan_cache_bytes)."""
        with self._lock:
            f = self._families
            made, live, live_bytes, traces = ((f.realized, f.live_plans, f.live_bytes, f.traces) if f is not None
                                              else (0, 0, 0, 0))
            return {"plans": len(self._plans) + live, "builds": self._builds, "from_template": made,
                    "traces": traces, "evictions": self._evictions, "bytes": self._plan_bytes + live_bytes,
                    "weight_bytes": self._pool.bytes, "limit_bytes": self._limit}

    @contextlib.contextmanager
    def _device_errors(self) -> Any:
        """Errors that mean the device is gone become one DeviceLostError naming the backend."""
        def lost() -> DeviceLostError:
            return DeviceLostError(f"{self._be.name} backend: the device was lost ({self._be.lost}); call "
                                   "model.reload() or load the model again")

        if self._be.lost is not None:
            raise lost()
        try:
            yield
        except DeviceLostError:
            raise
        except Exception as e:
            if not self._be.device_lost(e):
                raise
            raise lost() from e

    def reload(self) -> None:
        """Move the model onto a working device after a DeviceLostError: a new backend of the same name and options
        (shared with the models loaded by name after the loss), the weights uploaded again, the plans rebuilt on
        their next run. A model loaded onto a backend object of the caller's needs a new load with a new object."""
        with self._lock:
            if self._backend_spec is None:
                raise RuntimeError(f"this model runs on a {self._be.name} backend object given to load_onnx: load "
                                   "it again with a new one (ember.backend(...))")
            plans, self._plans = self._plans, OrderedDict()
            if self._be.lost is None:  # a reload of a working model: give its memory back first
                for plan in plans.values():
                    plan.free()
                if self._families is not None:
                    self._families.free()
                self._pool.close()
            name, opts = self._backend_spec
            self._be = shared_backend(name, **opts)
            self._pool = WeightPool(self._be, self.graph.initializers.values())
            self._folds, self._casts = FoldCache(), {}
            self._families = self._new_families()
            self._plan_bytes = 0

    def close(self) -> None:
        """Free the device memory of every plan and of the shared weights. Called when the model is collected; a
        later run builds (and uploads) again."""
        lock = getattr(self, "_lock", None)
        if lock is None:  # __init__ failed before any device memory was taken
            return
        with lock:
            plans, self._plans = self._plans, OrderedDict()
            self._plan_bytes = 0
            if self._be.lost is not None:  # nothing on a lost device can be freed
                return
            for plan in plans.values():
                plan.free()
            if self._families is not None:
                self._families.free()
            self._pool.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: the device may be gone already
            pass

    def stats(self) -> dict[str, int]:
        """The plans' counters summed over this model's runs: each counter adds its count in the plan per run (+1
        per occurrence per run). They say which arm ran for each fused pattern ("<pattern>.fused" /
        "<pattern>.fallback" for rmsnorm, layernorm, softmax, gelu, attention; "attention.gemm"), which kernel
        algorithm a convolution took ("conv.<algorithm>"), and how elementwise work fused; ember.plan.COUNTERS lists
        them. Per model, safe under threads."""
        with self._lock:
            return dict(self._stats)


_SHARED: dict[tuple, ComputeBackend] = {}
_SHARED_LOCK = threading.Lock()


def shared_backend(name: str, *, adapter: int | str | None = None, power_preference: str | None = None,
                   safe: bool = False, webgpu: str | None = None, **unknown: Never) -> ComputeBackend:
    """One backend object (one device) per name and options in a process: models loaded onto it share the
    device, its pipeline cache, and can pass DeviceArrays to each other. The options are ember.backend()'s."""
    reject_unknown("shared_backend()", unknown, BACKEND_OPTIONS)
    opts = {k: v for k, v in (("adapter", adapter), ("power_preference", power_preference), ("safe", safe))
            if v is not None and v is not False}
    if isinstance(name, str) and name.lower() == "auto":
        name = make_backend("auto", **opts, **({"webgpu": webgpu} if webgpu else {})).name  # EMBER_BACKEND / the best
    if canonical_name(name) == "wgpu":
        from .backends.wgpu.runtime import resolve

        # Keyed by the runtime it resolves to: "auto", None and the name it picks share one device.
        opts["webgpu"] = resolve(webgpu)
    elif webgpu is not None:
        opts["webgpu"] = webgpu  # the cpu backend refuses it, naming it
    key = (canonical_name(name), tuple(sorted(opts.items())))
    with _SHARED_LOCK:
        be = _SHARED.get(key)
        if be is None or be.lost is not None:  # a lost device is replaced by a new one
            be = _SHARED[key] = make_backend(key[0], **opts)
        return be


def load_onnx(model: Any, backend: str | ComputeBackend = "auto", *, external_data_dir: Any = None,
              fuse: bool = True, precision: str = "f32", plan_cache_bytes: int | None = None,
              autotune: bool | None = None, adapter: int | str | None = None, power_preference: str | None = None,
              safe: bool = False, webgpu: str | None = None,
              **unknown: Never) -> Model:
    """Load an ONNX model (path, bytes or onnx.ModelProto) onto a backend: "auto", "wgpu", "cpu" (models on
    the same name and options share one device), or a ComputeBackend object from ember.backend().

    Options (keyword only):
      fuse (bool, default True): graph rewrites and kernel fusion; False runs the graph node by node.
      precision ("f32" or "f16", default "f32"): "f16" (wgpu on adapters with shader-f16) stores float32 weights
        and activations as float16, computing in float32; inputs and outputs stay float32.
      plan_cache_bytes (int >= 0 or None, default None: 1 GiB): device bytes the plans cached for different input
        shapes may hold together (the weights, shared by all, not counted); past it the least recently used plans
        are freed, and rebuilt if their shapes come back. 0 keeps only the plan in use.
      autotune (bool or None, wgpu; default None: EMBER_AUTOTUNE if set, else on for hardware GPUs, off for
        software adapters): time a few GEMM/conv tile configs per shape while planning and keep the fastest,
        cached on disk per adapter (see ember/backends/wgpu/autotune.py).
      adapter (int, str or None) and power_preference ("low-power", "high-performance" or None), default None:
        pick the wgpu device, as in ember.backend(); only with a backend given by name.
      webgpu ("auto", "dawn", "wgpu-native" or None, default None: EMBER_WEBGPU, else "auto"): the WebGPU runtime
        of the wgpu backend, as in ember.backend(); only with a backend given by name.
      safe (bool, default False): for models from untrusted sources. wgpu runs the model with shader modules
        that bounds-check every access (EMBER_CHECKED_SHADERS for one model), on a device of its own, instead of
        relying on ember's host-side shape and index checks alone; slower. The cpu backend is always checked.
      external_data_dir (path or None, default None): the folder holding the files of a model that keeps its
        weights outside the .onnx file (the locations the model names are relative to it); default: a model
        file's own folder (a model given as bytes or a ModelProto has none: one with external data needs it). A
        listed file that is missing raises FileNotFoundError naming each tensor and the path looked for; a given
        ModelProto is never modified.
    An unknown option raises TypeError naming it, the closest valid one and every valid one; a value of the wrong
    type or out of range raises TypeError/ValueError naming the option, before the model is read.

    A malformed model raises ValueError at load, every problem listed at once, each naming the node, input or
    attribute with what was expected and what was found: structure (inputs nothing produces, input/output counts),
    attribute names and types and required attributes per the op's ONNX schema, dtypes the schema ties together or
    does not allow, and initializers whose data does not fill their dims. An op ember cannot run raises
    NotImplementedError."""
    reject_unknown("load_onnx()", unknown, LOAD_OPTIONS)
    check_load_options(backend, fuse, precision, plan_cache_bytes, autotune, adapter, power_preference, safe, webgpu)
    options = {"fuse": bool(fuse), "precision": precision, "plan_cache_bytes": plan_cache_bytes,
               "autotune": autotune, "adapter": adapter, "power_preference": power_preference, "safe": safe,
               "webgpu": webgpu}
    if isinstance(backend, ComputeBackend):
        backend._require_init()
    elif not (isinstance(backend, str) and backend.lower() == "auto"):
        backend = canonical_name(backend)
    with progress.task(f"loading {Path(model).name if isinstance(model, (str, os.PathLike)) else 'the model'}"):
        graph, source, schema_problems = load(model, external_data_dir)
        # Malformed first, as ONNX Runtime checks: an op's constructor in check_supported may trip on a bad attribute.
        check_structure(graph, schema_problems)
        check_supported(graph)
        rewrites = optimize(graph) if fuse else {}
        name = backend.name if isinstance(backend, ComputeBackend) else backend
        try:
            model = Model(graph, backend, source, **options)
            model.rewrites = rewrites
            return model
        except (NotImplementedError, ValueError, FileNotFoundError, TypeError, MemoryError):  # OutOfMemoryError too
            raise
        except Exception as e:
            raise RuntimeError(f"failed to load model on backend '{name}': {type(e).__name__}: {e}") from e

"""The ComputeBackend contract shared by the `cpu` and `wgpu` backends.

Every public method validates its arguments here, then asks the backend to *record* the work as steps, prepares
and executes them, and keeps them: the same call again replays them (api_cache.py). The ONNX runtime uses the same
record methods at load time to build a static plan, so a model run is a replay of steps recorded once (ember.plan).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from .. import settings
from ..core import winograd
from ..core.conv import ConvSpec
from ..core.view import View
from . import attention_arm
from .api_cache import ApiCache
from .api_types import (
    BinaryOp,
    ConvKernel,
    DeviceLostError,
    OutOfMemoryError,
    ReduceOp,
    UnaryOp,
    as_enum,
    check_dim,
    check_pair,
    check_shape,
)
from .public_ops import PublicOps

__all__ = ["BinaryOp", "ComputeBackend", "ConvKernel", "DeviceLostError", "OutOfMemoryError", "ReduceOp", "UnaryOp",
           "View", "as_enum", "check_dim", "check_pair", "check_shape"]

F32 = 4  # bytes per float32 element


class ComputeBackend(PublicOps, ABC):
    """Device memory behind opaque integer handles, and float32 compute ops over it."""

    name: str = "?"
    # The most elements a tensor may have on this backend (its kernels index with 32-bit integers); None: no
    # limit but memory. Planning checks every buffer against it, so an oversized tensor is a ValueError at load.
    max_elements: int | None = None
    # Record methods that accept runtime_sizes=True: the sizes reach the kernel at run time, so plans made from a
    # template (ember.plan.fit) at new sizes reuse the kernel (wgpu: no new pipeline).
    RUNTIME_SIZES: frozenset[str] = frozenset()
    # Whether a run returns before the device has done its work (a GPU queue): then the host can prepare the next
    # run while the device runs this one (ember.Generator's overlap).
    asynchronous: bool = False

    def probe_sizes(self, method: str, args: tuple, kwargs: dict) -> tuple | None:
        """What the RUNTIME_SIZES call `method(*args, **kwargs, runtime_sizes=True)` would record, with nothing made
        on the device: (structure, one int32 array of uniform values per dispatch, one grid per dispatch), or None.
        Two calls of one structure on the same buffers record the same kernels, so steps recorded by one run as the
        other once `sizes_writer` has given them the other's values and a grid covering its work. Where the grid
        moves with the sizes, a kernel's first value is the count of invocations doing work and a larger grid
        does no harm (the invocations past the count return)."""
        return None

    def declines(self, method: str, args: tuple, kwargs: dict) -> str | None:
        """Why the record call `method(*args, **kwargs)` would raise NotImplementedError (the backend leaves the work
        to the op's decomposition), or None. A traced build asks before taping a record call it does not make."""
        return None

    def sizes_writer(self, steps: list, grids: list[tuple[int, int, int]]) -> tuple[list, Any]:
        """(`steps`, recorded with runtime sizes, with these grids; their writer, for join_sizes_writers: here a
        function taking one array of new uniform values a dispatch)."""
        raise NotImplementedError(f"{self.name} backend: no runtime sizes")

    def join_sizes_writers(self, steps: list[list], writers: list, ranges: list[list[tuple[int, int]]]
                           ) -> tuple[list[list], Callable[[Any], None]]:
        """Several sizes_writer results as one: (their steps, maybe recorded anew, one list per writer; a function
        writing a whole vector of sizes, writer k's dispatches taking the rows ranges[k], one (lo, hi) each)."""
        def write(sizes: Any) -> None:
            for w, rs in zip(writers, ranges, strict=True):
                w([sizes[lo:hi] for lo, hi in rs])

        return steps, write

    def __init__(self) -> None:
        self._initialized = False
        self._sizes: dict[int, int] = {}  # handle -> nbytes asked for
        self._next_handle = 1
        # Models on one backend may plan and run in several threads: handles and the allocation table change under it.
        self._memory_lock = threading.RLock()
        self.lost: str | None = None  # why the device is gone (device_lost), None while it works
        self._api_cache = ApiCache()  # the public ops' steps, recorded once per call signature (api_cache.py)

    def device_lost(self, error: BaseException) -> bool:
        """Whether `error` (raised by this backend's work) means the device is gone; a backend whose device can
        be lost records why in `lost`. The cpu backend's cannot."""
        return self.lost is not None

    # ---- life cycle -------------------------------------------------------------------------------
    def init(self) -> ComputeBackend:
        """Open the device (once; later calls do nothing) and return the backend, so `backend("wgpu").init()` chains."""
        if not self._initialized:
            self._init_device()
            self._initialized = True
        return self

    def is_initialized(self) -> bool:
        """Whether init() has opened the device."""
        return self._initialized

    def _require_init(self) -> None:
        if not self._initialized:
            raise RuntimeError(f"backend '{self.name}' is not initialised: call init() first")

    def __repr__(self) -> str:
        state = "initialised" if self._initialized else "not initialised"
        return f"<ember {self.name} backend, {state}, {len(self._sizes)} live allocations>"

    # ---- memory -----------------------------------------------------------------------------------
    def alloc(self, nbytes: int, *, overwritten: bool = False) -> int:
        """A new allocation of `nbytes`, zeroed; `overwritten`: the caller writes every byte before anything reads
        it (a run's output copy), so a backend may hand out recycled memory uncleared."""
        self._require_init()
        nbytes = check_dim(nbytes, "nbytes")
        with self._memory_lock:
            handle = self._next_handle
            if overwritten:
                self._device_alloc_recycled(handle, nbytes)
            else:
                self._device_alloc(handle, nbytes)
            self._next_handle += 1
            self._sizes[handle] = nbytes
        return handle

    def free(self, handle: int) -> None:
        """Release an allocation; ValueError for a handle that is not live."""
        self._require_init()
        with self._memory_lock:
            self.nbytes(handle, "handle")
            del self._sizes[handle]
            self._api_cache.drop_handle(self, int(handle))  # before the memory goes: no entry outlives it
            self._device_free(handle)

    def api_cache_info(self) -> dict[str, int]:
        """The public ops' replay cache: hits (calls replayed), misses (recorded), evictions, entries, bound."""
        return self._api_cache.info()

    def _api_context(self, tuned: bool) -> tuple:
        """Settings read while recording a public op (its cache key holds them); `tuned`: gemm, conv, attention."""
        return ()

    def memory_info(self) -> dict[str, int]:
        """Live allocations on this backend and the bytes they were asked for."""
        return {"allocations": len(self._sizes), "bytes": sum(self._sizes.values())}

    def nbytes(self, handle: Any, arg: str = "handle") -> int:
        """Size of a live allocation; ValueError naming `arg` for anything else."""
        if isinstance(handle, bool) or not isinstance(handle, (int, np.integer)):
            raise ValueError(f"{arg}: a handle is an int from alloc(), got {type(handle).__name__}")
        size = self._sizes.get(int(handle))
        if size is None:
            state = "freed" if 0 < handle < self._next_handle else "unknown"
            raise ValueError(f"{arg}: handle {handle} is {state}")
        return size

    def _need(self, handle: int, arg: str, elems: int, itemsize: int = F32) -> None:
        size = self._sizes.get(handle) if type(handle) is int else None  # a live int handle: nbytes' answer, sooner
        if size is None:
            size = self.nbytes(handle, arg)
        if elems * itemsize > size:
            raise ValueError(f"{arg}: allocation of {size} bytes is smaller than the {elems * itemsize} bytes "
                             f"({elems} elements) this op needs")

    def copy_htod(self, dst_handle: int, src: Any) -> None:
        """Copy a host array or bytes-like object into the start of an allocation (it must fit)."""
        self._require_init()
        size = self.nbytes(dst_handle, "dst_handle")
        data = memoryview(np.ascontiguousarray(src) if isinstance(src, np.ndarray) else src).cast("B")
        if data.nbytes > size:
            raise ValueError(f"src: {data.nbytes} bytes do not fit in dst_handle's {size} bytes")
        self._device_write(dst_handle, 0, data)

    def copy_dtoh(self, dst: Any, src_handle: int) -> None:
        """Copy the start of an allocation into `dst`, a writable C-contiguous array or buffer, filling it."""
        self._require_init()
        size = self.nbytes(src_handle, "src_handle")
        if isinstance(dst, np.ndarray):
            if not dst.flags.c_contiguous or not dst.flags.writeable:
                raise ValueError("dst: must be a writable C-contiguous array")
            view = memoryview(dst.reshape(-1).view(np.uint8))
        else:
            view = memoryview(dst)
            if view.readonly:
                raise ValueError("dst: must be writable")
            view = view.cast("B")
        if view.nbytes > size:
            raise ValueError(f"dst: {view.nbytes} bytes is larger than src_handle's {size} bytes")
        if view.nbytes:
            view[:] = self._device_read(src_handle, 0, view.nbytes)

    def synchronize(self) -> None:
        """Wait until the work submitted so far has finished."""
        self._require_init()
        self._device_synchronize()

    # ---- what a backend provides --------------------------------------------------------------------
    @abstractmethod
    def _init_device(self) -> None: ...

    @abstractmethod
    def _device_alloc(self, handle: int, nbytes: int) -> None: ...

    @abstractmethod
    def _device_free(self, handle: int) -> None: ...

    def _device_alloc_recycled(self, handle: int, nbytes: int) -> None:
        """_device_alloc for memory the caller overwrites whole: here, a fresh allocation."""
        self._device_alloc(handle, nbytes)

    @abstractmethod
    def _device_write(self, handle: int, offset: int, data: memoryview) -> None: ...

    @abstractmethod
    def _device_read(self, handle: int, offset: int, nbytes: int) -> memoryview | bytes: ...

    @abstractmethod
    def _device_synchronize(self) -> None: ...

    @abstractmethod
    def execute(self, steps: list) -> None:
        """Run recorded steps in order (on wgpu: one command encoder, one submit)."""

    def prepare(self, steps: list) -> Any:
        """Steps in the form execute_prepared replays fastest; a plan prepares its steps once and replays them
        on every run. Here, the steps themselves."""
        return steps

    def execute_prepared(self, prepared: Any, before: list | tuple = (), after: list | tuple = ()) -> None:
        """Run what prepare() returned, as execute() would run the steps; `before` / `after`: steps of this run only
        (a plan's copies of device-array feeds in and of outputs out), run around it."""
        self.execute([*before, *prepared, *after] if before or after else prepared)

    def replay_prepared(self, prepared: Any) -> None:
        """execute_prepared (no `before` / `after`) for a form that already ran through it once without an error:
        the public ops' cache hits (api_cache.py). A backend may skip checks there that a first run made for every
        later one (wgpu: wgpu-py's error capture around each native call). Here, execute_prepared."""
        self.execute_prepared(prepared)

    def release_prepared(self, prepared: Any) -> None:
        """Drop whatever a backend keeps with prepare()'s result (wgpu: a command buffer encoded ahead)."""
        return None  # the steps themselves: nothing kept

    def input_writer(self, handle: int, dtype: Any) -> Callable[[np.ndarray], None]:
        """A function writing a host array of `dtype` into `handle`, for a plan's input written on every run:
        what upload() does, with the per-call decisions taken here once where a backend can."""
        return functools.partial(self.upload, handle)

    # ---- primitives for the ONNX runtime -------------------------------------------------------------
    # A backend declines a call it leaves to the ops' decomposition (a dtype its fused row or attention kernels do
    # not compute) by raising NotImplementedError while recording; the op then records the decomposition.
    # Views carry logical dtypes; a backend maps them to what it stores (wgpu: int64 as i32, bool as u32).
    # Shapes here are already checked by the caller (the graph's shape inference).

    @abstractmethod
    def record_elementwise(self, expr: Any, inputs: list[View], out: View) -> list:
        """out = expr(inputs...), every input View already broadcast to out.shape; out contiguous."""

    @abstractmethod
    def record_matmul(self, a: View, b: View, out: View, *, alpha: float = 1.0, bias: View | None = None,
                      beta: float = 1.0, act: Any = None, residual: View | None = None) -> list:
        """out = act(alpha * a @ b + beta * bias + residual) over shapes (B, M, K) @ (B, K, N) -> (B, M, N).

        a, b and bias may be strided (transposes, broadcast batch or bias dims are strides); bias may be the
        out View itself (gemm's beta * C). `act` is an elementwise Expr over input 0, or None. `residual` (of
        out's shape, not overlapping it) only where `matmul_residual` says so.
        """

    # Whether record_matmul takes `residual`: a Linear with a bias followed by a residual Add (GPT-2's projections)
    # then runs as one kernel.
    matmul_residual: bool = False

    def select_matmul_addends(self) -> int:
        """How many tensors a MatMul's epilogue adds before its activation: 1 (bias), 2 with `matmul_residual`."""
        return 2 if self.matmul_residual else 1

    def select_counters(self, steps: list) -> dict[str, int]:
        """Counters a plan's `steps` add to it, by the kernel arm the backend took for them (the matrix units'
        products: `matmul.subgroup_matrix`...): what an op cannot know, since the backend chooses. Here: none."""
        return {}

    def runtime_info(self) -> dict[str, Any]:
        """What runs the kernels (plan_info()["runtime"]): for wgpu the WebGPU runtime, its matrix configs and the
        matrix arm in use. Here: nothing beyond the backend's name."""
        return {"backend": self.name}

    def select_index_kernels(self) -> bool:
        """Whether kernels that read their inputs at computed indices (RotateHalf's two halves in one pass) beat
        the same work composed of views, copies and plain elementwise kernels. Here: no (numpy's fancy indexing
        costs more than its slices)."""
        return False

    def select_concat_kernel(self, parts: int, dtype: Any, skewed: bool) -> bool:
        """Whether a Concat of `parts` non-empty parts runs as one kernel that picks each element's source (one
        dispatch; the other parts are read again per element) rather than a copy per part. `skewed`: the parts
        but the largest hold at most 1/8 of the elements, or all of them at most 2^16 (a KV cache grown by a row;
        a coarse description, so a decode step's growing cache asks the same question every step). Here: never
        (numpy's slice copies are the faster way on the host)."""
        return False

    # Whether record_conv takes `residual` (a tensor of the output's shape added before the activation, so a
    # ResNet block's Add + Relu run in the conv's epilogue instead of a kernel of their own).
    conv_residual: bool = False

    def select_conv(self, spec: ConvSpec, weight: np.ndarray | None) -> ConvKernel:
        """Kernel selection for one convolution: the algorithm (Winograd where eligible and cheaper by this
        backend's cost model, settings.WINOGRAD overriding; else record_conv, which picks among its own direct /
        implicit-GEMM kernels), whether its epilogue takes a residual, and a fused MaxPool where one kernel
        computes both. `weight`: the filter's values when they are a model constant."""
        tile = self._winograd_tile(spec, weight)
        if tile is not None:
            assert weight is not None
            pads = spec.pads

            def record_winograd(x: View, u: View, bias: View | None, out: View, act: Any,
                                residual: View | None) -> list:
                return self.record_conv_winograd(x, u, bias, out, pads, tile, act, residual=residual)

            return ConvKernel("winograd", record_winograd, self.conv_residual,
                              weight=winograd.transform_weights(np.asarray(weight, np.float32), tile))

        def record_default(x: View, w: View, bias: View | None, out: View, act: Any, residual: View | None) -> list:
            return self.record_conv(x, w, bias, out, spec.strides, spec.pads, spec.dilations, spec.groups, act,
                                    residual=residual, const_weight=spec.const_weight)

        record_pooled = None
        if self.conv_maxpool_fits(spec.x_shape, spec.w_shape, spec.out_shape, spec.groups):
            def record_pooled(x: View, w: View, bias: View | None, out: View, act: Any, kernel: tuple,
                              pool_strides: tuple, pool_pads: tuple, pool_dilations: tuple) -> list:
                return self.record_conv_maxpool(x, w, bias, out, spec.strides, spec.pads, spec.dilations, act,
                                                spec.out_shape[2:], kernel, pool_strides, pool_pads, pool_dilations,
                                                const_weight=spec.const_weight)

        return ConvKernel("default", record_default, self.conv_residual, record_maxpool=record_pooled)

    def _winograd_tile(self, spec: ConvSpec, weight: np.ndarray | None) -> int | None:
        if not (self.winograd_tiles and weight is not None
                and winograd.eligible(spec.kernel, spec.strides, spec.dilations, spec.groups)):
            return None
        forced = settings.WINOGRAD.get()
        if forced is not None:
            if forced == 0:
                return None
            if forced not in self.winograd_tiles:
                raise ValueError(f"EMBER_WINOGRAD={forced}: expected 0 (off) or one of {self.winograd_tiles}")
            return forced
        n, k, p, q = spec.out_shape
        return self.winograd_tile(n, spec.x_shape[1], k, p, q, spec.dtype)

    @abstractmethod
    def record_conv(self, x: View, w: View, bias: View | None, out: View, stride: tuple[int, int],
                    pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int,
                    act: Any = None, residual: View | None = None, const_weight: bool = False) -> list:
        """2-D convolution, NCHW, filter (K, C/groups, R, S), pads (top, left, bottom, right):
        out = act(conv + bias + residual); `residual` only where `conv_residual` says so. `const_weight`: w holds
        the same values on every run from here on (a model's initializer), so the backend may repack it now."""

    def conv_maxpool_fits(self, xshape: tuple[int, ...], wshape: tuple[int, ...], out_shape: tuple[int, ...],
                          groups: int) -> bool:
        """Whether `record_conv_maxpool` takes this 2-D conv (a MaxPool its only reader)."""
        return False

    def record_conv_maxpool(self, x: View, w: View, bias: View | None, out: View, stride: tuple[int, int],
                            pads: tuple[int, int, int, int], dilation: tuple[int, int], act: Any,
                            conv_hw: tuple[int, int], kernel: tuple[int, int], pool_stride: tuple[int, int],
                            pool_pads: tuple[int, int, int, int], pool_dilation: tuple[int, int],
                            const_weight: bool = False) -> list:
        """out = MaxPool(act(conv(x) + bias)), the conv as record_conv's (output conv_hw), the pooling as
        record_pool's "max"; only where `conv_maxpool_fits` said so."""
        raise NotImplementedError(f"{type(self).__name__} has no fused conv + max pooling")

    # Winograd F(m, 3) convolution (core/winograd.py has the algorithm and the layouts): the output tiles m this
    # backend implements; empty when it has no Winograd kernels.
    winograd_tiles: tuple[int, ...] = ()

    def winograd_tile(self, n: int, c: int, k: int, p: int, q: int, dtype: Any) -> int | None:
        """The F(m, 3) tile to run a 3x3 stride-1 conv (N x C x P x Q output of K channels, same-size input
        when padded by 1) with, or None for the direct convolution; each backend decides by its own costs."""
        return None

    def record_conv_winograd(self, x: View, u: View, bias: View | None, out: View, pads: tuple[int, int, int, int],
                             m: int, act: Any = None, residual: View | None = None) -> list:
        """out = act(conv3x3(x) + bias + residual) by Winograd F(m, 3): x (N, C, H, W), u the transformed filter
        (alpha^2, K, C) from core/winograd.transform_weights, out (N, K, P, Q), pads (top, left, bottom, right);
        `residual` only where `conv_residual` says so."""
        raise NotImplementedError(f"{type(self).__name__} has no Winograd convolution")

    @abstractmethod
    def record_reduce_axes(self, op: str, x: View, out: View, n_reduce: int) -> list:
        """Reduce the last `n_reduce` dims of x into out (x.shape[:-n_reduce], contiguous).

        op: sum, mean, max, min, prod, sumsq, l1, l2, logsum, logsumexp, argmax, argmin, argmax_last,
        argmin_last (the arg ops need n_reduce == 1 and write int64 indices).
        """

    def select_attention(self, batch: int, heads: int, seq_q: int, seq_kv: int, itemsize: int) -> str:
        """Kernel selection for attention: "flash" (record_attention_views) or "gemm" (scores GEMM with the mask in
        its epilogue, fused softmax, second GEMM); settings.ATTENTION overrides the backend's rule."""
        return attention_arm.choose(batch, heads, seq_q, seq_kv, itemsize)

    @abstractmethod
    def record_attention_views(self, q: View, k: View, v: View, mask: View | None, out: View, scale: float,
                               causal: bool) -> list:
        """out = softmax(scale * q @ kᵀ + mask) @ v over 4-D Views (B, H, S, D), any strides.

        k and v may have fewer heads than q (grouped-query attention: q head h reads kv head h // (Hq / Hkv));
        mask is an additive float View already broadcast to (B, Hq, Sq, Skv), or None; `causal` masks keys
        j > i + Skv - Sq (bottom-right aligned). A query row that sees no key gives zeros.
        """

    @abstractmethod
    def record_pool(self, kind: str, x: View, out: View, kernel: tuple[int, int], stride: tuple[int, int],
                    pads: tuple[int, int, int, int], dilation: tuple[int, int], count_include_pad: bool,
                    p: int = 2) -> list:
        """2-D pooling over NCHW (contiguous x and out): kind "max", "avg" or "lp" (p-norm)."""

    @abstractmethod
    def record_gather(self, data: View, indices: View, axis: int, out: View) -> list:
        """out = np.take(data, indices, axis) with negative indices counted from the end (contiguous views)."""

    @abstractmethod
    def record_norm(self, kind: str, x: View, scale: View | None, bias: View | None, out: View, n: int,
                    eps: float) -> list:
        """Normalise each row of the last n elements of x (x, out contiguous): kind "layernorm"
        (x - mean) / sqrt(var + eps) * scale + bias (biased var), or "rmsnorm" x / sqrt(mean(x²) + eps) * scale
        + bias. scale and bias are Views of n elements; None means 1 and 0."""

    @abstractmethod
    def record_softmax(self, x: View, out: View, n: int, log: bool) -> list:
        """(Log)softmax over each row of the last n elements of x (x, out contiguous), max-subtracted; a row
        of all -inf (or holding NaN or +inf) gives NaN, as ONNX's reference and ONNX Runtime do."""

    # ---- loop primitives: an output element depends on a whole line of the input (scan, top-k) or on where
    # other elements go (scatter); the ONNX ops CumSum, CumProd, TopK, ScatterElements, ScatterND… build on them.
    def record_scan(self, op: str, x: View, out: View, axis: int, exclusive: bool, reverse: bool) -> list:
        """Inclusive/exclusive running "sum" or "prod" along `axis`, optionally from the end. x and out:
        contiguous Views of one shape."""
        raise NotImplementedError(f"{type(self).__name__} has no scan")

    def record_topk(self, x: View, values: View, indices: View, axis: int, k: int, largest: bool) -> list:
        """The k largest (or smallest) elements along `axis`, sorted, equal values in index order; indices are
        int64. All Views contiguous; values/indices have k along `axis`."""
        raise NotImplementedError(f"{type(self).__name__} has no top-k")

    def record_scatter(self, out: View, offsets: View, updates: View, reduction: str) -> list:
        """For each update in order, out.flat[offset] = reduce(out.flat[offset], update), reduction "none",
        "add", "mul", "max" or "min". `out` (contiguous) already holds the data; offsets (int) and updates are
        contiguous Views of one shape. Offsets are clamped into out."""
        raise NotImplementedError(f"{type(self).__name__} has no scatter")

    def record_dft(self, x: View, out: View, length: int, inverse: bool, onesided: bool) -> list:
        """Discrete Fourier transform along axis 1 of x (outer, L, inner, 1 | 2: real, or complex as re/im) over
        `length` terms (x zero-padded or cut to it) into out (outer, L', inner, 2): L' = length, or length // 2 + 1
        for a one-sided forward transform. An inverse is scaled by 1 / length; a one-sided inverse takes the half
        spectrum as Hermitian and writes the real signal, out (outer, length, inner, 1). Views contiguous."""
        raise NotImplementedError(f"{type(self).__name__} has no DFT")

    def record_matmul_nbits(self, a: View, packed: View, scales: View, zeros: View | None, out: View, *, k: int,
                            n: int, bits: int, block_size: int, bias: View | None = None, g_idx: View | None = None,
                            const_weight: bool = False) -> list:
        """out (M, N) = a (M, K) @ Wᵀ + bias, W[n, k] = (code - zeros[n, b]) * scales[n, b], b = k // block_size
        or g_idx[k] (int32, (K,)); codes of `bits` (2, 4, 8) packed low-first in int32 words, `packed` (N, words a
        column), each block's codes in whole words, the last block padded past K. scales, zeros (None: 2^(bits-1))
        (N, n_blocks) and bias (N,) in a's dtype; all contiguous. `const_weight`: packed, scales, zeros and g_idx
        hold the same values on every run (model constants), so a backend may dequantise or repack them now."""
        raise NotImplementedError(f"{type(self).__name__} has no MatMulNBits")

    # ---- tensors with logical dtypes (the runtime's view of memory) ----------------------------------
    @abstractmethod
    def storage_itemsize(self, dtype: Any) -> int:
        """Bytes one element of logical `dtype` takes on this backend."""

    @abstractmethod
    def upload(self, handle: int, array: np.ndarray) -> None:
        """Write a C-contiguous array of logical dtype, converting to the storage type."""

    @abstractmethod
    def download(self, view: View) -> np.ndarray:
        """A new host array (logical dtype) holding a view's elements."""

    @contextlib.contextmanager
    def held_submits(self) -> Iterator[None]:
        """Work submitted inside (plan runs, download_later's copies) may be held and handed to the device at once
        when the block ends: one submit for a decode step's runs and its token's read. Reads and writes inside
        stay in order. Here every call runs at once."""
        yield

    def download_later(self, view: View) -> Callable[[], np.ndarray]:
        """read(): the host array of a view (contiguous) as it is once the work submitted so far has run. The
        read is started now and waited for when read() is called, so work submitted in between (the next decode
        step) runs behind it instead of after it. Here the data is read at once."""
        data = self.download(view)
        return lambda: data

    @abstractmethod
    def record_copy(self, src: int, dst: int, nbytes: int) -> list:
        """Copy the first nbytes of allocation src into dst, on the device."""

    def record_readback(self, view: View) -> tuple[list, Any]:
        """(steps, read): steps copy `view` (contiguous) somewhere the host can read; after they ran, read()
        returns the host array. Lets a plan fold its output copies into the run's single submit."""
        return [], lambda: self.download(view)

    def gpu_time(self, steps: list, reps: int = 5) -> float:
        """Milliseconds of one run of `steps` (device time where the backend measures it; here the wall clock
        around execute + synchronize), the minimum of `reps`."""
        return min(self._wall_ms(steps) for _ in range(max(1, reps)))

    def profile(self, steps: list) -> list[float]:
        """Run steps one by one and return each one's time in milliseconds (device time where the backend can
        measure it)."""
        return [self._wall_ms([st]) for st in steps]

    def _wall_ms(self, steps: list) -> float:
        self.synchronize()
        t = time.perf_counter()
        self.execute(steps)
        self.synchronize()
        return (time.perf_counter() - t) * 1e3

    def release(self) -> None:
        """Free every live allocation (tests use it to look for leaks)."""
        for handle in list(self._sizes):
            self.free(handle)

"""cpu backend: numpy, with every step prepared at record time.

Recording builds typed strided views of the allocations once; a step is a closure that computes into its
output view, so replaying a plan allocates nothing but numpy's temporaries. This module holds the memory, the
views and the running of steps; each kind of kernel is a module of its own (conv, matmul, pooling, ...), handed
numpy views, never Views.
"""

from __future__ import annotations

import contextlib
import functools
import math
import weakref
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ...core.expr import Expr
from ...core.view import View
from ..base import ComputeBackend, OutOfMemoryError
from . import (
    attention,
    conv,
    conv_maxpool,
    elementwise,
    loops,
    matmul,
    norms,
    parallel,
    pooling,
    quant_matmul,
    reduce,
    resizable,
    spectral,
    winograd,
)
from .steps import Scratch, Step


class CpuBackend(ComputeBackend):
    name = "cpu"

    def __init__(self) -> None:
        super().__init__()
        self._mem: dict[int, np.ndarray] = {}
        self._scratch = Scratch()
        self._dequantized: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # MatMulNBits' weights

    def _init_device(self) -> None:
        pass

    # ---- memory -----------------------------------------------------------------------------------
    def _device_alloc(self, handle: int, nbytes: int) -> None:
        try:
            # 8-byte rounding keeps every typed view (int64, float64) of the allocation whole.
            self._mem[handle] = np.zeros(-(-nbytes // 8) * 8, np.uint8)
        except MemoryError as e:
            raise OutOfMemoryError(f"cpu backend: cannot allocate {nbytes} bytes") from e

    def _device_alloc_recycled(self, handle: int, nbytes: int) -> None:
        try:
            self._mem[handle] = np.empty(-(-nbytes // 8) * 8, np.uint8)  # overwritten whole: nothing to clear
        except MemoryError as e:
            raise OutOfMemoryError(f"cpu backend: cannot allocate {nbytes} bytes") from e

    def _device_free(self, handle: int) -> None:
        del self._mem[handle]

    def _device_write(self, handle: int, offset: int, data: memoryview) -> None:
        self._mem[handle][offset:offset + data.nbytes] = np.frombuffer(data, np.uint8)

    def _device_read(self, handle: int, offset: int, nbytes: int) -> memoryview:
        return memoryview(self._mem[handle][offset:offset + nbytes])

    def _device_synchronize(self) -> None:
        pass

    def storage_itemsize(self, dtype: Any) -> int:
        return np.dtype(dtype).itemsize

    def upload(self, handle: int, array: np.ndarray) -> None:
        a = np.ascontiguousarray(array)
        self._mem[handle][:a.nbytes] = a.reshape(-1).view(np.uint8)  # a size past the buffer's: ValueError

    def download(self, view: View) -> np.ndarray:
        return self.array(view).copy()

    def record_copy(self, src: int, dst: int, nbytes: int) -> list[Step]:
        a, b = self._mem[src][:nbytes], self._mem[dst][:nbytes]
        if a.shape != b.shape:
            raise ValueError(f"record_copy: {nbytes} bytes do not fit allocations {src} ({self._mem[src].nbytes} "
                             f"bytes) and {dst} ({self._mem[dst].nbytes})")
        return [functools.partial(np.copyto, b, a)]

    def prepare(self, steps: list) -> Any:
        # Steps with no parallel program of their own (a decode's: tens of small kernels) run one after the other
        # here, without execute's per-step look at them; the others through execute.
        if any(hasattr(st, "program") or hasattr(st, "access") for st in steps):
            return steps
        return _Plain(steps)

    def execute_prepared(self, prepared: Any, before: list | tuple = (), after: list | tuple = ()) -> None:
        if type(prepared) is not _Plain:
            super().execute_prepared(prepared, before, after)
            return
        for st in (*before, *after):  # a run's own copies, as a rule: plain too
            if hasattr(st, "program") or hasattr(st, "access"):
                self.execute([*before, *prepared.steps, *after])
                return
        blas = parallel.one_blas_thread() if parallel.blas_pool() is not None else None
        with blas if blas is not None else contextlib.nullcontext(), self._scratch.lock:  # as execute holds them
            for step in before:
                step()
            for step in prepared.steps:
                step()
            for step in after:
                step()

    def execute(self, steps: list) -> None:
        # Products run on the pool's threads, one OpenBLAS thread each (parallel.one_blas_thread): OpenBLAS's
        # own workers, once woken, spin between products and would take the core from the pool's.
        pool = parallel.blas_pool()
        if pool is None:
            for step in steps:
                step()
            return
        # The steps' parallel regions as one (Pool.run_program): a barrier between two, not a hand-off to the
        # workers and back. The scratch stays locked throughout (the steps' own locking is bypassed).
        # Two consecutive steps that touch disjoint memory (their `access`) share one region.
        with parallel.one_blas_thread(), self._scratch.lock:
            items: list = []
            last: tuple[parallel.Access, int] | None = None  # the previous step's access, where its items start
            for step in steps:
                program = getattr(step, "program", None)
                part = program() if program is not None else [parallel.OnCaller(step)]
                access = getattr(step, "access", None)
                if last is not None and access is not None and not access.conflicts(last[0]):
                    merged = parallel.merge_regions(items[last[1]:], part)
                    if merged is not None:
                        items[last[1]:] = merged
                        last = None  # two at most: a third would have to be checked against both
                        continue
                last = (access, len(items)) if access is not None else None
                items += part
            pool.run_program(items)

    def array(self, v: View) -> np.ndarray:
        """A numpy view (no copy) of a View."""
        return self.strided(v.handle, v.dtype, v.shape, v.strides, v.offset)

    def buffer(self, handle: int) -> np.ndarray:
        """An allocation's memory (it stays where it is; a compiled kernel pointed into it keeps this)."""
        return self._mem[handle]

    def strided(self, handle: int, dtype: np.dtype, shape: tuple[int, ...], strides: tuple[int, ...],
                offset: int) -> np.ndarray:
        """A numpy view of allocation `handle` (shape, strides and offset in elements of dtype)."""
        buf = self._mem[handle]
        item = dtype.itemsize
        try:
            # ndarray over the buffer checks that every element it can reach lies inside it.
            return np.ndarray(shape, dtype, buf, offset * item, tuple(s * item for s in strides))
        except (ValueError, TypeError):
            if math.prod(shape) == 0 and offset >= 0:  # no element to reach: any strides
                return as_strided(buf[:0].view(dtype), shape, [0] * len(shape))
            raise ValueError(f"view {shape}/{strides}+{offset} reaches outside allocation {handle} "
                             f"of {buf.nbytes} bytes") from None

    def _array_or_none(self, v: View | None) -> np.ndarray | None:
        return self.array(v) if v is not None else None

    # ---- primitives: each a module of its own -----------------------------------------------------
    # A live plan's moves re-record these from their Views' numbers (resizable.py), not from the tape.
    RUNTIME_SIZES = resizable.METHODS

    def probe_sizes(self, method: str, args: tuple, kwargs: dict) -> tuple | None:
        return resizable.probe(method, args, kwargs)

    def sizes_writer(self, steps: list, grids: list[tuple[int, int, int]]) -> tuple[list, Any]:
        return resizable.sizes_writer(steps, grids)

    def record_elementwise(self, expr: Expr, inputs: list[View], out: View, runtime_sizes: bool = False
                           ) -> list[Step]:
        if runtime_sizes:
            direct = elementwise.direct_copy(expr, inputs, out, {v.handle: self.buffer(v.handle)
                                                                 for v in (*inputs, out)})
            return resizable.record(self.strided, [*inputs, out],
                                    lambda a: elementwise.record_elementwise(expr, a[:-1], a[-1]), direct, self._mem)
        return elementwise.record_elementwise(expr, [self.array(v) for v in inputs], self.array(out))

    matmul_residual = True

    def record_matmul(self, a: View, b: View, out: View, *, alpha: float = 1.0, bias: View | None = None,
                      beta: float = 1.0, act: Expr | None = None, residual: View | None = None) -> list[Step]:
        av, bv, dst = self.array(a), self.array(b), self.array(out)
        # beta = 0 ignores the bias entirely, NaN included (BLAS semantics, as the wgpu kernels do).
        cv = self.array(bias.broadcast_to(out.shape)) if bias is not None and beta != 0.0 else None
        if residual is None:
            return matmul.record_matmul(av, bv, cv, dst, alpha, beta, act)
        rv = self.array(residual)
        if cv is None:
            return matmul.record_matmul(av, bv, rv, dst, alpha, 1.0, act)
        return matmul.record_matmul(av, bv, cv, dst, alpha, beta, None) + matmul.add_residual(dst, rv, act)

    conv_residual = True

    def record_conv(self, x: View, w: View, bias: View | None, out: View, stride: tuple[int, int],
                    pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int,
                    act: Expr | None = None, residual: View | None = None, const_weight: bool = False
                    ) -> list[Step]:
        return conv.record_conv(self.array(x), self.array(w), self._array_or_none(bias), self.array(out), stride,
                                pads, dilation, groups, act, self._array_or_none(residual), const_weight,
                                self._scratch)

    def conv_maxpool_fits(self, xshape: tuple[int, ...], wshape: tuple[int, ...], out_shape: tuple[int, ...],
                          groups: int) -> bool:
        return conv_maxpool.fits(wshape, out_shape, groups)

    def record_conv_maxpool(self, x: View, w: View, bias: View | None, out: View, stride: tuple[int, int],
                            pads: tuple[int, int, int, int], dilation: tuple[int, int], act: Expr | None,
                            conv_hw: tuple[int, int], kernel: tuple[int, int], pool_stride: tuple[int, int],
                            pool_pads: tuple[int, int, int, int], pool_dilation: tuple[int, int],
                            const_weight: bool = False) -> list[Step]:
        return conv_maxpool.record_conv_maxpool(self.array(x), self.array(w), self._array_or_none(bias),
                                                self.array(out), stride, pads, dilation, act, conv_hw, kernel,
                                                pool_stride, pool_pads, pool_dilation, const_weight, self._scratch)

    winograd_tiles = (2, 4)

    def winograd_tile(self, n: int, c: int, k: int, p: int, q: int, dtype: Any) -> int | None:
        return winograd.choose(n, c, k, p, q, dtype)

    def record_conv_winograd(self, x: View, u: View, bias: View | None, out: View, pads: tuple[int, int, int, int],
                             m: int, act: Expr | None = None, residual: View | None = None) -> list[Step]:
        return winograd.record_conv(self.array(x), self.array(u), self._array_or_none(bias), self.array(out),
                                    self._array_or_none(residual), pads, m, act, self._scratch)

    def record_reduce_axes(self, op: str, x: View, out: View, n_reduce: int) -> list[Step]:
        return reduce.record_reduce_axes(op, self.array(x), self.array(out), n_reduce)

    def record_pool(self, kind: str, x: View, out: View, kernel: tuple[int, int], stride: tuple[int, int],
                    pads: tuple[int, int, int, int], dilation: tuple[int, int], count_include_pad: bool,
                    p: int = 2) -> list[Step]:
        return pooling.record_pool(kind, self.array(x), self.array(out), kernel, stride, pads, dilation,
                                   count_include_pad, p)

    def record_gather(self, data: View, indices: View, axis: int, out: View, runtime_sizes: bool = False
                      ) -> list[Step]:
        if runtime_sizes:
            return resizable.record(self.strided, [data, indices, out],
                                    lambda a: loops.record_gather(a[0], a[1], axis, a[2]), mem=self._mem)
        return loops.record_gather(self.array(data), self.array(indices), axis, self.array(out))

    def record_attention_views(self, q: View, k: View, v: View, mask: View | None, out: View, scale: float,
                               causal: bool, runtime_sizes: bool = False) -> list[Step]:
        if q.dtype not in _FUSED_F16:
            _fused_float32(q, "attention")
        if runtime_sizes:
            masked = mask is not None
            views = [q, k, v, mask, out]
            return resizable.record(self.strided, views, lambda a: attention.record_attention(
                a[0], a[1], a[2], a[3] if masked else None, a[-1], scale, causal),
                attention.direct([self.buffer(x.handle) for x in views if x is not None],
                                 [len(x.shape) for x in views if x is not None], masked, scale, causal)
                if q.dtype == np.float32 else None, self._mem)
        return attention.record_attention(self.array(q), self.array(k), self.array(v), self._array_or_none(mask),
                                          self.array(out), scale, causal)

    def record_norm(self, kind: str, x: View, scale: View | None, bias: View | None, out: View, n: int,
                    eps: float) -> list[Step]:
        norms.check_norm(kind)
        _fused_float32(x, kind)
        norms.check_rows(x, out, n)
        return norms.record_norm(kind, self.array(x).reshape(-1, n), self._array_or_none(scale),
                                 self._array_or_none(bias), self.array(out).reshape(-1, n), n, eps)

    def record_softmax(self, x: View, out: View, n: int, log: bool) -> list[Step]:
        _fused_float32(x, "softmax")
        norms.check_rows(x, out, n)
        return norms.record_softmax(self.array(x).reshape(-1, n), self.array(out).reshape(-1, n), log)

    def record_dft(self, x: View, out: View, length: int, inverse: bool, onesided: bool) -> list[Step]:
        return [spectral.dft_step(self.array(x), self.array(out), length, inverse, onesided)]

    def record_matmul_nbits(self, a: View, packed: View, scales: View, zeros: View | None, out: View, *, k: int,
                            n: int, bits: int, block_size: int, bias: View | None = None, g_idx: View | None = None,
                            const_weight: bool = False) -> list[Step]:
        # Plans of one model (one per input shape) share the constants' handles, and so one dequantised weight.
        key = (k, bits, block_size, *((v.handle, v.offset, v.shape) if v is not None else None
                                      for v in (packed, scales, zeros, g_idx))) if const_weight else None
        return quant_matmul.record_matmul_nbits(self.array(a), self.array(packed), self.array(scales),
                                                self._array_or_none(zeros), self.array(out), k, bits, block_size,
                                                self._array_or_none(bias), self._array_or_none(g_idx),
                                                self._dequantized, key)

    def declines(self, method: str, args: tuple, kwargs: dict) -> str | None:
        where = _FUSED_INPUT.get(method)
        if where is None:
            return None
        name, pos = where
        x = kwargs.get(name, args[pos] if len(args) > pos else None)
        takes = _FUSED_F16 if method == "record_attention_views" else (np.float32,)
        return None if x is None or x.dtype in takes else _fused_reason(x, method)

    # ---- loop primitives ----------------------------------------------------------------------------
    def record_scan(self, op: str, x: View, out: View, axis: int, exclusive: bool, reverse: bool) -> list[Step]:
        return loops.record_scan(op, self.array(x), self.array(out), axis, exclusive, reverse)

    def record_topk(self, x: View, values: View, indices: View, axis: int, k: int, largest: bool) -> list[Step]:
        return loops.record_topk(self.array(x), self.array(values), self.array(indices), axis, k, largest)

    def record_scatter(self, out: View, offsets: View, updates: View, reduction: str) -> list[Step]:
        return loops.record_scatter(self.array(out), self.array(offsets), self.array(updates), reduction)


class _Plain:
    """Prepared steps that execute_prepared runs in order (prepare: none has a parallel program)."""

    __slots__ = ("steps",)

    def __init__(self, steps: list) -> None:
        self.steps = list(steps)


# The fused calls' data input (keyword, position), whose dtype decides whether the call is taken.
_FUSED_INPUT = {"record_norm": ("x", 1), "record_softmax": ("x", 0), "record_attention_views": ("q", 0)}
# Fused attention also takes float16: computed in float32 and rounded once, as ONNX Runtime does.
_FUSED_F16 = (np.float32, np.float16)


def _fused_reason(x: View, what: str) -> str:
    return f"cpu fused {what}: float32 only (float16 runs decomposed), got {x.dtype}"


def _fused_float32(x: View, what: str) -> None:
    """The fused row and attention steps compute float32; float16 stays with the ops' decomposition, per op in
    numpy's float16 as ONNX's reference computes it."""
    if x.dtype != np.float32:
        raise NotImplementedError(_fused_reason(x, what))

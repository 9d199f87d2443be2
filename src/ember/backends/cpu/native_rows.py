"""Launch code for the compiled small-row kernels (`_rows.c`, in the library native.py loads): layer and RMS norms,
attention over a few query rows (a KV-cache decode's), GELU. Each `*_step` returns a step, or None where the
kernel does not take the case (the library not built, EMBER_NATIVE_GEMM=0, a dtype or layout it does not read):
the caller runs its numpy kernel then. The kernels hold the GIL (ctypes releases it, but they are too short for
another thread to gain anything) and need no AVX-512.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import numpy as np

from .native import library

_F32 = np.dtype(np.float32)
ATTENTION_MAX_QUERIES = 8  # more query rows: numpy's products (BLAS) win over the kernel's dot products


def _load() -> ctypes.CDLL | None:
    lib = library()
    if lib is None:
        return None
    i, p, sz, d, f = ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_double, ctypes.c_float
    pd = ctypes.c_ssize_t
    try:
        lib.ember_norm_rows.restype = i
        lib.ember_norm_rows.argtypes = [i, i, i, p, pd, p, pd, p, pd, d, p, pd]
        lib.ember_attention_views.restype = i
        lib.ember_attention_views.argtypes = [p, p, f, i]
        lib.ember_copy_views.restype = i
        lib.ember_copy_views.argtypes = [p, p, i]
        lib.ember_gelu.restype = i
        lib.ember_gelu.argtypes = [i, sz, p, p]
    except AttributeError:  # a library built before _rows.c: numpy instead
        return None
    return lib


_LIB = _load()


def available() -> bool:
    return _LIB is not None


def _elements(a: np.ndarray) -> tuple[int, ...] | None:
    """a's strides in float32 elements, or None where one is not whole."""
    if any(s % 4 for s in a.strides):
        return None
    return tuple(s // 4 for s in a.strides)


def _call(fn: Callable[..., int], args: tuple, keep: tuple) -> Callable[[], None]:
    """A step calling fn(*args); `keep` holds the arrays the pointers in args point into."""

    def run(keep: tuple = keep) -> None:
        fn(*args)

    return run


def _vector(a: np.ndarray | None, n: int) -> tuple[int | None, int, np.ndarray | None]:
    """(pointer, stride in elements, the 1-D view) of a norm's scale or bias: n float32 elements read in place.
    (None, 0, None) for an absent one; raises LookupError for one the kernel cannot read in place."""
    if a is None:
        return None, 0, None
    if a.dtype != _F32 or a.size != n:
        raise LookupError
    flat = a.reshape(n)
    if flat.size > 1 and not np.shares_memory(flat, a):  # a reshape that copied: the kernel must read a itself
        raise LookupError
    step = _elements(flat)
    if step is None:
        raise LookupError
    return flat.ctypes.data, step[0], flat


def _apart(dst: np.ndarray, *srcs: np.ndarray | None) -> bool:
    """Whether dst is each source's memory exactly or none of it: the kernels read an element before they write
    its place, never after."""
    return all(s is None or not np.may_share_memory(dst, s) or (s.ctypes.data == dst.ctypes.data
                                                                and s.strides == dst.strides) for s in srcs)


def norm_step(kind: str, xv: np.ndarray, sv: np.ndarray | None, bv: np.ndarray | None, dst: np.ndarray, n: int,
              eps: float) -> Callable[[], None] | None:
    """dst = norm(xv) * sv + bv over rows of n (xv, dst: (rows, n) float32 with contiguous rows), or None."""
    if (_LIB is None or xv.dtype != _F32 or dst.dtype != _F32 or xv.ndim != 2 or xv.shape != dst.shape
            or not _apart(dst, xv) or (sv is not None and np.may_share_memory(dst, sv))
            or (bv is not None and np.may_share_memory(dst, bv))):
        return None
    xs, ys = _elements(xv), _elements(dst)
    if xs is None or ys is None or (n > 1 and (xs[1] != 1 or ys[1] != 1)):
        return None
    try:
        sp, ss, sf = _vector(sv, n)
        bp, bs, bf = _vector(bv, n)
    except LookupError:
        return None
    args = (0 if kind == "layernorm" else 1, xv.shape[0], n, xv.ctypes.data, xs[0], sp, ss, bp, bs, float(eps),
            dst.ctypes.data, ys[0])
    return _call(_LIB.ember_norm_rows, args, (xv, dst, sf, bf))


class AttentionViews:
    """The compiled attention reading its Views as a live plan's numbers (resizable.py's order: q, k, v, [mask],
    out), copied into a block of its own on each move and checked there by the kernel: a move is one copy and one
    call, the step stays."""

    def __init__(self, count: int, ranks: list[int], buffers: list[tuple[int, int]], masked: bool, causal: bool,
                 scale: float, keep: tuple = ()) -> None:
        """buffers: per view its buffer's address and bytes; keep: what holds that memory (kept with the step)."""
        assert _LIB is not None
        self.keep = keep
        self.numbers = np.zeros(count, np.int64)
        self.work = np.empty(64, _F32)
        head = [int(masked), int(causal), ATTENTION_MAX_QUERIES, self.work.ctypes.data, self.work.size]
        self.table = np.array(head + [x for r, (a, n) in zip(ranks, buffers, strict=True) for x in (r, a, n)],
                              np.int64)
        fn, nums, table, sc = _LIB.ember_attention_views, self.numbers.ctypes.data, self.table.ctypes.data, float(scale)
        self._check = lambda: fn(nums, table, sc, 0)

        def run(launch: AttentionViews = self) -> None:  # the launch stays alive with its step
            if fn(nums, table, sc, 1) != 0:
                raise RuntimeError("cpu attention kernel: the views it was moved to no longer fit")

        self.step = run

    def move(self, numbers: np.ndarray | list[int]) -> bool:
        """Point the kernel at these numbers: False (then the step must not run) where it does not take them."""
        self.numbers[:] = numbers
        got = self._check()
        if got == -2:  # more keys than the work buffer holds: a larger one
            self.work = np.empty(2 * max(self.work.size, int(self.numbers[1 + 2 * 4 + 1 + 2])), _F32)
            self.table[3], self.table[4] = self.work.ctypes.data, self.work.size
            got = self._check()
        return got == 0


class CopyViews:
    """The compiled copy reading its two Views (src, dst: 4-byte elements, up to 4 dims) as a live plan's numbers,
    as AttentionViews does."""

    def __init__(self, count: int, ranks: list[int], buffers: list[tuple[int, int]], keep: tuple = ()) -> None:
        assert _LIB is not None
        self.keep = keep
        self.numbers = np.zeros(count, np.int64)
        self.table = np.array([x for r, (a, n) in zip(ranks, buffers, strict=True) for x in (r, a, n)], np.int64)
        fn, nums, table = _LIB.ember_copy_views, self.numbers.ctypes.data, self.table.ctypes.data
        self._check = lambda: fn(nums, table, 0)

        def run(launch: CopyViews = self) -> None:
            if fn(nums, table, 1) != 0:
                raise RuntimeError("cpu copy kernel: the views it was moved to no longer fit")

        self.step = run

    def move(self, numbers: np.ndarray | list[int]) -> bool:
        self.numbers[:] = numbers
        return self._check() == 0


def attention_step(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None, out: np.ndarray,
                   scale: float, causal: bool) -> Callable[[], None] | None:
    """out = softmax(q k^T * scale + mask) v (4-D float32 views, k and v with heads dividing q's), or None."""
    views = [a for a in (q, k, v, mask, out) if a is not None]
    if _LIB is None or any(a.dtype != _F32 for a in views):
        return None
    numbers, buffers = [0], []
    for a in views:  # each array's own memory: its first element's address, its extent in bytes
        strides = _elements(a)
        if strides is None or any(st < 0 for st in strides) or 0 in a.shape:
            return None
        numbers += [*a.shape, *strides, 0]
        buffers.append((a.ctypes.data, (sum((n - 1) * st for n, st in zip(a.shape, strides, strict=True)) + 1) * 4))
    launch = AttentionViews(len(numbers), [a.ndim for a in views], buffers, mask is not None, causal, scale,
                            tuple(views))
    return launch.step if launch.move(numbers) else None


GELU = {"gelu": 0, "gelu_tanh": 1}


def gelu_step(kind: str, x: np.ndarray, dst: np.ndarray) -> Callable[[], None] | None:
    """dst = gelu(x) (kind "gelu" or "gelu_tanh"; float32, the same shape, each one run of memory), or None."""
    if (_LIB is None or kind not in GELU or x.dtype != _F32 or dst.dtype != _F32 or x.shape != dst.shape
            or not (x.flags.c_contiguous and dst.flags.c_contiguous) or not _apart(dst, x)):
        return None
    return _call(_LIB.ember_gelu, (GELU[kind], x.size, x.ctypes.data, dst.ctypes.data), (x, dst))

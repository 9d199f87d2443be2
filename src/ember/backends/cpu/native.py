"""Launch code for the cpu backend's compiled kernels (`_gemm.c`): over a weight packed once at load,
`conv_step`, a direct conv into channels-last rows (its im2col a block of columns at a time, in cache), and
`gemm_step`, C = A @ B + bias; and `depthwise_step`, a depthwise conv reading its weight as it runs.

The library is an optional part of the install (setup.py): where it was not built, or the CPU lacks AVX-512F,
or EMBER_NATIVE_GEMM=0, `available()` is False and the backend runs those convs with numpy (OpenBLAS) instead.
It is called through ctypes, which releases the GIL for the call: two pool threads run it side by side.
"""

from __future__ import annotations

import ctypes
import importlib.util
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from ... import settings

PANEL_ROWS = 32  # rows per packed panel (MR in _gemm.c)
# Products with more columns than this stay with OpenBLAS, whose packing then pays for itself (measured with
# bench/bench_cpu_native.py: BENCHMARKS.md).
MAX_COLUMNS = 64
_F32 = np.dtype(np.float32)
_calls = [0]  # runs of gemm steps, for tests (increments from two threads may rarely merge)


def library() -> ctypes.CDLL | None:
    """The compiled library, where it was built and EMBER_NATIVE_GEMM leaves it on (whatever this CPU has)."""
    if not settings.NATIVE_GEMM.get():
        return None
    try:
        spec = importlib.util.find_spec(f"{__package__}._gemm")
    except ImportError:
        return None
    if spec is None or not spec.origin or not spec.origin.endswith((".so", ".pyd", ".dylib")):
        return None
    return ctypes.CDLL(spec.origin)


def _load() -> ctypes.CDLL | None:
    lib = library()
    if lib is None:
        return None
    try:
        _declare(lib)
    except AttributeError:  # a library built from an older _gemm.c (an install not rebuilt): numpy instead
        return None
    return lib if lib.ember_gemm_supported() else None


def _declare(lib: ctypes.CDLL) -> None:
    """The exported functions' signatures (each exists on every platform: _gemm.c)."""
    i, f, p, sz = ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_size_t
    lib.ember_gemm_supported.restype = ctypes.c_int
    lib.ember_gemm_work_floats.restype = ctypes.c_size_t
    lib.ember_gemm_work_floats.argtypes = [i, i]
    lib.ember_gemm.restype = ctypes.c_int
    lib.ember_gemm.argtypes = [i, i, i, p, p, ctypes.c_ssize_t, p, ctypes.c_ssize_t, p, f, f, p]
    lib.ember_conv_work_floats.restype = ctypes.c_size_t
    lib.ember_conv_work_floats.argtypes = [i] * 3
    lib.ember_conv_cl.restype = ctypes.c_int
    lib.ember_conv_cl.argtypes = [i] * 3 + [p] + [i] * 6 + [p, i, p, f, f, p, p]
    lib.ember_depthwise_work_floats.restype = ctypes.c_size_t
    lib.ember_depthwise_work_floats.argtypes = [i] * 10
    lib.ember_depthwise.restype = ctypes.c_int
    lib.ember_depthwise.argtypes = [i] * 4 + [p, sz, sz] + [i] * 8 + [p, p, f, f, p, sz, sz, p]


_LIB = _load()


def available() -> bool:
    return _LIB is not None


def calls() -> int:
    return _calls[0]


class Packed(NamedTuple):
    """A weight (m, k) as the kernel's panels: (ceil(m / 32), k, 32) float32, rows past m zero."""

    panels: np.ndarray
    m: int
    k: int


def pack(w: np.ndarray) -> Packed:
    """w (M, K) packed for gemm_step: once, at load."""
    m, k = w.shape
    panels = -(-m // PANEL_ROWS)
    padded = np.zeros((panels * PANEL_ROWS, k), _F32)
    padded[:m] = w
    return Packed(np.ascontiguousarray(padded.reshape(panels, PANEL_ROWS, k).transpose(0, 2, 1)), m, k)


def _step(fn: Callable[..., int], args: tuple, keep: tuple) -> Callable[[], None]:
    """A step calling fn(*args); `keep` holds the arrays the pointers in args point into."""

    def run() -> None:
        if fn(*args) != 0:
            raise RuntimeError(f"{fn.__name__}: this CPU lacks AVX-512F")
        _calls[0] += 1

    run.keep = keep  # type: ignore[attr-defined]
    return run


def _bias(bias: np.ndarray | None, n: int, what: str) -> np.ndarray | None:
    """bias as n contiguous float32, or None."""
    if bias is None:
        return None
    bias = np.ascontiguousarray(bias, _F32).reshape(-1)
    if bias.shape != (n,):
        raise ValueError(f"native {what}: bias of {bias.shape[0]} for {n} {'rows' if what == 'gemm' else 'channels'}")
    return bias


def _rows(a: np.ndarray, what: str) -> int:
    """a's row stride in elements; its rows must be contiguous float32."""
    if a.dtype != _F32 or a.ndim != 2 or (a.shape[1] > 1 and a.strides[1] != 4) or a.strides[0] % 4:
        raise ValueError(f"native gemm: {what} must be a 2-D float32 array with contiguous rows, got "
                         f"{a.dtype} {a.shape} strides {a.strides}")
    return a.strides[0] // 4


def gemm_step(w: Packed, b: np.ndarray, c: np.ndarray, bias: np.ndarray | None = None, lo: float = -math.inf,
              hi: float = math.inf) -> Callable[[], None]:
    """A step computing c = clamp(w @ b + bias, lo, hi): w from pack() of an (M, K) weight, b (K, N) and c (M, N)
    float32 with contiguous rows. Its scratch is its own, made here."""
    assert _LIB is not None
    ldb, ldc = _rows(b, "b"), _rows(c, "c")
    m, k, n = w.m, w.k, b.shape[1]
    if b.shape[0] != k or c.shape != (m, n):
        raise ValueError(f"native gemm: a ({m}, {k}) weight times b {b.shape} does not give c {c.shape}")
    bias = _bias(bias, m, "gemm")
    work = np.empty(_LIB.ember_gemm_work_floats(n, k), _F32)
    args = (m, n, k, w.panels.ctypes.data, b.ctypes.data, ldb, c.ctypes.data, ldc,
            bias.ctypes.data if bias is not None else None, lo, hi, work.ctypes.data)
    return _step(_LIB.ember_gemm, args, (w.panels, b, c, bias, work))


def conv_step(w: Packed, xp: np.ndarray, kernel: tuple[int, int], stride: tuple[int, int], y: np.ndarray,
              bias: np.ndarray | None = None, lo: float = -math.inf, hi: float = math.inf) -> Callable[[], None]:
    """A step computing one image's conv into channels-last y (P, Q, K) from xp (C, Hp, Wp), its padding
    already in place: y[p, q, :] = clamp(w @ window(p, q) + bias, lo, hi), w from pack() of the (K, C*R*S)
    weight. The im2col runs a block of columns at a time inside the call (no column matrix)."""
    assert _LIB is not None
    r, s = kernel
    sh, sw = stride
    if xp.dtype != _F32 or y.dtype != _F32 or xp.ndim != 3 or y.ndim != 3 or not (
            xp.flags.c_contiguous and y.flags.c_contiguous):
        raise ValueError(f"native conv: xp (C, H, W) and y (P, Q, K) must be C-contiguous float32, got "
                         f"{xp.dtype} {xp.shape} and {y.dtype} {y.shape}")
    c, hp, wp = xp.shape
    p, q, k = y.shape
    if w.k != c * r * s or w.m != k or (p - 1) * sh + r > hp or (q - 1) * sw + s > wp:
        raise ValueError(f"native conv: a ({w.m}, {w.k}) weight with a {r}x{s} window at stride {stride} over "
                         f"{xp.shape} does not give {y.shape}")
    bias = _bias(bias, k, "conv")
    work = np.empty(_LIB.ember_conv_work_floats(w.k, p, q), _F32)
    args = (c, hp, wp, xp.ctypes.data, r, s, sh, sw, p, q, w.panels.ctypes.data, k,
            bias.ctypes.data if bias is not None else None, lo, hi, y.ctypes.data, work.ctypes.data)
    return _step(_LIB.ember_conv_cl, args, (w.panels, xp, y, bias, work))


def depthwise_step(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], pads: tuple[int, int, int, int],
                   y: np.ndarray, bias: np.ndarray | None = None, lo: float = -math.inf,
                   hi: float = math.inf) -> Callable[[], None]:
    """A step computing a depthwise conv y (N, C, P, Q) = clamp(conv(x) + bias, lo, hi): x (N, C, H, W) and y with
    contiguous planes, w (C, 1, R, S) contiguous, pads (top, left, bottom, right), column stride at most 2. The
    weight is read when the step runs (it may be computed by an earlier step)."""
    assert _LIB is not None
    n, c, h, wd = x.shape
    r, s = w.shape[2:]
    sh, sw = stride
    p, q = y.shape[2:]
    planes_ok = x.strides[2:] == (4 * wd, 4) and y.strides[2:] == (4 * q, 4)
    if (x.dtype != _F32 or y.dtype != _F32 or w.dtype != _F32 or not w.flags.c_contiguous or not planes_ok
            or w.shape[:2] != (c, 1) or y.shape[:2] != (n, c) or sw > 2
            or (p - 1) * sh + r > pads[0] + h + pads[2] or (q - 1) * sw + s > pads[1] + wd + pads[3]):
        raise ValueError(f"native depthwise: x {x.dtype} {x.shape}, weight {w.dtype} {w.shape}, y {y.dtype} "
                         f"{y.shape} at stride {stride}, pads {pads} do not fit (contiguous float32 planes, "
                         f"column stride <= 2)")
    bias = _bias(bias, c, "depthwise")
    work = np.empty(_LIB.ember_depthwise_work_floats(h, wd, r, s, sh, sw, pads[0], pads[1], p, q), _F32)
    args = (n, c, h, wd, x.ctypes.data, x.strides[0] // 4, x.strides[1] // 4, r, s, sh, sw, pads[0], pads[1], p, q,
            w.ctypes.data, bias.ctypes.data if bias is not None else None, lo, hi, y.ctypes.data, y.strides[0] // 4,
            y.strides[1] // 4, work.ctypes.data)
    return _step(_LIB.ember_depthwise, args, (x, w, bias, y, work))

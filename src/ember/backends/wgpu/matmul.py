"""Matrix products on the wgpu backend: out = act(alpha * a @ b + beta * bias + residual), batched, strided.

Two kernels:
- the generated register-blocked GEMM kernel (gemm.py), with a strided loader per operand (shader/loaders.py),
  for operands with a unit-stride dimension; its tile and K splits from plan_gemm (shader/tiles.py) or the
  autotuner.
- a simple 16 x 16 tiled kernel over arbitrary (even negative) strides, kernels/matmul_strided.wgsl, for
  operands with no unit-stride inner dimension.

Operands are bound once per distinct buffer; one that shares the output's buffer (gemm's beta * C, or an
arena) is read through the read_write output binding, since WebGPU forbids binding a buffer both read-only
and writable in one dispatch. A buffer above the adapter's max storage-buffer binding size is bound as the
aligned byte range its views touch (shader/bindings.py); a problem needing more than that is split (see
record_split).

With `runtime_sizes` the generated GEMM reads M, Z and the strides and offsets along them (A's rows, the
output's, bias's and residual's) from a uniform array (shader/lifted.py), its tile chosen without M
(tiles.plan_runtime): one pipeline for every sequence length of a template. N, K and the strides along them
stay in the source (they decide the loads' shape), as does everything on the strided kernel's and the windowed
paths: another length there is another kernel, and a live plan remakes that call.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ... import settings
from ...core.expr import Expr
from ...core.view import View
from .gemm import record_gemm_kernel
from .matmul_gemv import gemv_layout, record_gemv
from .matmul_sgmat import plan_sgmat, record_sgmat
from .program import KERNELS, WORKGROUPS_PER_DIM, grid_1d, kernel
from .shader.bindings import Bindings, binding_windows, check_no_overlap, check_view, rebase_view, require_float
from .shader.epilogue import Epilogue
from .shader.lifted import Sizes, addr, u32
from .shader.loaders import Loader, strided_loader
from .shader.tiles import Tile
from .shader.wgsl import PRELUDE

if TYPE_CHECKING:
    from .backend import WgpuBackend


def matmul_epilogue(out: View, bias: View | None, alpha: float, beta: float, act: Expr | None,
                    m_size: int, n_size: int, guard_m: bool, guard_n: bool,
                    residual: View | None = None) -> Epilogue:
    conds = ([f"m >= {u32(m_size)}"] if guard_m else []) + ([f"n >= {u32(n_size)}"] if guard_n else [])
    ep = Epilogue(addr(out.offset, list(zip("zmn", out.strides, strict=True))), alpha=alpha, beta=beta, act=act,
                  guard=" || ".join(conds) or None)
    if bias is not None and beta != 0.0:
        ep.bias_index = addr(bias.offset, list(zip("zmn", bias.strides, strict=True)))
        ep.bias_handle = bias.handle
    if residual is not None:
        ep.residual_index = addr(residual.offset, list(zip("zmn", residual.strides, strict=True)))
        ep.residual_handle = residual.handle
    return ep


# ---- the generic strided kernel --------------------------------------------------------------------------------
STRIDED_TILE = 16


def record_strided(be: WgpuBackend, a: View, b: View, out: View, ep: Epilogue, binds: Bindings) -> list:
    nb, m, k = a.shape
    n = b.shape[2]
    tn, tm = math.ceil(n / STRIDED_TILE), math.ceil(m / STRIDED_TILE)
    linear = max(tn, tm, nb) > WORKGROUPS_PER_DIM
    grid = grid_1d(tn * tm * nb) if linear else (tn, tm, nb)
    if linear:
        coords = (f"let wg = wid.y * nwg.x + wid.x;\n    if (wg >= {u32(tn * tm * nb)}) {{ return; }}\n"
                  f"    let z = wg / {u32(tn * tm)};\n    let tile_m = (wg % {u32(tn * tm)}) / {u32(tn)};\n"
                  f"    let tile_n = wg % {u32(tn)};")
    else:
        coords = "let tile_n = wid.x;\n    let tile_m = wid.y;\n    let z = wid.z;"
    a_idx = addr(a.offset, [("z", a.strides[0]), ("gm", a.strides[1]), ("ak", a.strides[2])])
    b_idx = addr(b.offset, [("z", b.strides[0]), ("bk", b.strides[1]), ("gn", b.strides[2])])
    header = "\n".join([
        f"// ember strided matmul: Z={nb} x (M={m} x K={k}) @ (K x N={n}); A strides {a.strides}, B strides "
        f"{b.strides}", "// Bindings (group 0):", *binds.comment(),
        f"// Dispatch grid: {grid}" + (" (linearised z, m tile, n tile)" if linear else " = (N tiles, M tiles, Z)")])
    src = be.kernel_source(
        "matmul_strided", HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(binds.declarations()),
        EPILOGUE=ep.function(binds), COORDS=coords, M=u32(m), N=u32(n), K=u32(k),
        KTILES=u32(math.ceil(k / STRIDED_TILE)), LOAD_A=binds.scalar(a.handle, a_idx),
        LOAD_B=binds.scalar(b.handle, b_idx))
    label = "matmul_strided"
    return [be.dispatch(be.pipeline(label, src), binds.buffers(), grid, label)]


# ---- problems above the adapter's max storage-buffer binding size ------------------------------------------------
# A problem whose windows (shader/bindings.py) are still too big is halved along N, M, Z or K, whichever shrinks
# the excess most (N first on ties), and each half recorded on its own; K halves run one after the other, the
# second adding to the first's output through bias = out, and only the last applies the activation.
def _excess(be: WgpuBackend, views: tuple[View | None, ...]) -> int:
    return sum(max(0, size - be.max_binding) for _, size in binding_windows(be, list(views)).values())


def _narrow(v: View | None, dim: int, start: int, length: int) -> View | None:
    if v is None:
        return None
    shape = v.shape[:dim] + (length,) + v.shape[dim + 1:]
    return View(v.handle, v.dtype, shape, v.strides, v.offset + start * v.strides[dim])


Part = tuple[View, View, View, View | None, View | None]  # a, b, out, bias, residual


def _halves(a: View, b: View, out: View, bias: View | None, residual: View | None, dim: str) -> list[Part]:
    """The two halves of a (B, M, K) @ (B, K, N) problem along dim z, m, n or k (k: out, bias and residual are
    shared)."""
    nb, m, k = a.shape
    size = {"z": nb, "m": m, "n": b.shape[2], "k": k}[dim]
    parts = []
    for start, length in ((0, size // 2), (size // 2, size - size // 2)):
        if dim == "z":
            parts.append(tuple(_narrow(v, 0, start, length) for v in (a, b, out, bias, residual)))
        elif dim == "m":
            parts.append((_narrow(a, 1, start, length), b, *(_narrow(v, 1, start, length)
                                                              for v in (out, bias, residual))))
        elif dim == "n":
            parts.append((a, *(_narrow(v, 2, start, length) for v in (b, out, bias, residual))))
        else:
            parts.append((_narrow(a, 2, start, length), _narrow(b, 1, start, length), out, bias, residual))
    return parts


def record_split(be: WgpuBackend, a: View, b: View, out: View, bias: View | None, alpha: float, beta: float,
                 act: Expr | None, residual: View | None = None) -> list:
    """Record a matmul whose operands need more than be.max_binding bytes of some buffer as two halves."""
    nb, m, k = a.shape
    now = _excess(be, (a, b, out, bias, residual))
    best = None
    for dim, size in (("n", b.shape[2]), ("m", m), ("z", nb), ("k", k)):
        if size >= 2:
            parts = _halves(a, b, out, bias, residual, dim)
            cost = max(_excess(be, p) for p in parts)
            if best is None or cost < best[0]:
                best = (cost, dim, parts)
    if best is None or best[0] >= now:
        raise NotImplementedError(
            f"wgpu matmul: a {a.shape} @ b {b.shape} needs more than max-storage-buffer-binding-size "
            f"({be.max_binding} bytes) of one buffer, and no split of it binds less")
    _, dim, parts = best
    if dim == "k":
        (a0, b0, *_), (a1, b1, *_) = parts
        return (record_matmul(be, a0, b0, out, alpha=alpha, bias=bias, beta=beta, residual=residual)
                + record_matmul(be, a1, b1, out, alpha=alpha, bias=out, beta=1.0, act=act))
    steps = []
    for pa, pb, po, pbias, pres in parts:
        steps += record_matmul(be, pa, pb, po, alpha=alpha, bias=pbias, beta=beta, act=act, residual=pres)
    return steps


# ---- entry point ---------------------------------------------------------------------------------------------
@kernel("record_matmul")
def record_matmul(be: WgpuBackend, a: View, b: View, out: View, *, alpha: float = 1.0, bias: View | None = None,
                  beta: float = 1.0, act: Expr | None = None, residual: View | None = None,
                  runtime_sizes: bool = False) -> list:
    """out = act(alpha * a @ b + beta * bias + residual); `residual` (a residual connection) is read-only and must
    not overlap out. `runtime_sizes`: M, Z and the strides along them from a uniform (the module docstring)."""
    if a.dtype == "float64":  # double-float: a kernel of its own (matmul_df64.py)
        return KERNELS["record_matmul_df64"](be, a, b, out, alpha=alpha, bias=bias, beta=beta, act=act,
                                             residual=residual)
    types = require_float("matmul", a=a, b=b, out=out, bias=bias, residual=residual)
    for name, v in (("a", a), ("b", b), ("out", out)):
        if len(v.shape) != 3:
            raise ValueError(f"matmul: {name} must be a 3-D view (B, rows, cols), got shape {v.shape}")
    nb, m, k = a.shape
    if b.shape[0] != nb or b.shape[1] != k or out.shape != (nb, m, b.shape[2]):
        raise ValueError(f"matmul: shapes a {a.shape} @ b {b.shape} -> out {out.shape} do not match "
                         "(B, M, K) @ (B, K, N) -> (B, M, N)")
    n = b.shape[2]
    if out.size == 0:
        return []
    alpha, beta = float(alpha), float(beta)
    if bias is not None and beta == 0.0:
        bias = None  # BLAS: beta = 0 ignores the old contents, NaN included
    if bias is not None:
        bias = bias.broadcast_to(out.shape)
    if residual is not None:
        residual = residual.broadcast_to(out.shape)
        check_no_overlap(residual, out, "residual")
    for name, v in (("a", a), ("b", b), ("out", out), ("bias", bias), ("residual", residual)):
        if v is not None:
            check_view(be, v, name)
    if any(s == 0 for d, s in zip(out.shape, out.strides, strict=True) if d > 1):
        raise ValueError(f"out: a broadcast (stride 0) output view {out.strides} would write elements twice")
    check_no_overlap(a, out, "a")
    check_no_overlap(b, out, "b")
    # bias may be out itself (gemm's beta * C; split K's running sum): the same elements, whatever the strides of
    # size-1 dims say; anything else in out's buffer must stay clear of it.
    if bias is not None and bias.handle == out.handle and (bias.offset != out.offset or any(
            s != t for d, s, t in zip(out.shape, bias.strides, out.strides, strict=True) if d > 1)):
        check_no_overlap(bias, out, "bias")

    windows = binding_windows(be, [a, b, out, bias, residual])
    if any(size > be.max_binding for _, size in windows.values()):
        return record_split(be, a, b, out, bias, alpha, beta, act, residual)
    if windows:
        a, b, out, bias, residual = (rebase_view(v, windows) for v in (a, b, out, bias, residual))
    def make_epilogue(binds: Bindings, guard_m: bool, guard_n: bool) -> Epilogue:
        for v in (bias, residual):
            if v is not None:
                binds.add(v.handle, False)
        return matmul_epilogue(out, bias, alpha, beta, act, m, n, guard_m, guard_n, residual)

    layout = gemv_layout(a, b, m) if not runtime_sizes and settings.GEMV.get() else None
    if layout is not None:
        return record_gemv(be, a, b, out, make_epilogue, layout, windows, types)
    binds = Bindings(out.handle, windows, types)
    choice = plan_sgmat(be, a, b, out, types, runtime_sizes)  # f16 on the matrix units (matmul_sgmat.py)
    if choice is not None:
        for v in (a, b, bias, residual):
            if v is not None:
                binds.add(v.handle, False)
        ep = matmul_epilogue(out, bias, alpha, beta, act, m, n, False, False, residual)
        return record_sgmat(be, a, b, out, ep, binds, choice)
    a_unit = (k == 1 or a.strides[2] == 1 or m == 1 or a.strides[1] == 1)
    b_unit = (n == 1 or b.strides[2] == 1 or k == 1 or b.strides[1] == 1)
    if not (a_unit and b_unit) or any(s < 0 for s in a.strides + b.strides):
        binds.add(a.handle, False)
        binds.add(b.handle, False)
        for v in (bias, residual):
            if v is not None:
                binds.add(v.handle, False)
        ep = matmul_epilogue(out, bias, alpha, beta, act, m, n, True, True, residual)
        return record_strided(be, a, b, out, ep, binds)

    def make_a(binds: Bindings, tile: Tile) -> Loader:
        return strided_loader("a", tile.bm, binds, a.handle, a.offset, a.strides[0], a.strides[1], a.strides[2], m, k,
                              nb)

    def make_b(binds: Bindings, tile: Tile) -> Loader:
        return strided_loader("b", tile.bn, binds, b.handle, b.offset, b.strides[0], b.strides[2], b.strides[1], n, k,
                              nb)

    rt = None
    if runtime_sizes and not windows:  # a window's byte range moves with the views, and no uniform holds it
        rt = Sizes()
        rt(nb * m)  # first: the output rows doing work, which the grid grows with (resize.probe_sizes)
        m, nb = rt(m), rt(nb)
        a, out, bias, residual = (rt.view(v, (0, 1)) for v in (a, out, bias, residual))
        b = rt.view(b, (0,))
    assert a is not None and b is not None and out is not None
    shapes = f"A {a.shape} strides {a.strides}, B {b.shape}" if rt is None else f"A (Z, M, {k}) strides {a.strides}, B"
    notes = [f"{shapes} strides {b.strides}"]
    notes += [f"{len(windows)} operand(s) bound as windows of larger buffers"] if windows else []
    return record_gemm_kernel(be, "matmul", m, n, k, nb, out.handle, make_a, make_b, make_epilogue, notes, windows,
                              types, rt=rt)


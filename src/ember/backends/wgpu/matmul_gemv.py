"""Matrix-vector products for M <= GEMV_MAX_M rows (a decode step's projections): kernels/matmul_gemv.wgsl.

The tiled GEMM computes a 64 x 64 tile of which one row is real when M = 1 and splits K over more workgroups
with a reduce kernel after; a decode step is memory-bound, so this kernel reads each weight element once, with
consecutive invocations on consecutive addresses (along n for row-major B, along k for a transposed one), and
takes the usual epilogue. Few columns (N = 768: 48 workgroups) leave most of a big GPU idle while one workgroup
walks all of K, so K is split until there are about settings.GEMV_GROUPS workgroups, the partial sums added by
gemm.record_splitk_reduce.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from ... import settings
from ...core.view import View
from .gemm import EpilogueFactory, partial_epilogue, record_splitk_reduce
from .program import grid_1d
from .shader.bindings import Bindings
from .shader.lifted import addr, u32
from .shader.wgsl import PRELUDE

if TYPE_CHECKING:
    from .backend import WgpuBackend

GEMV_MAX_M = 4  # rows: each re-reads A (small), B is read once for all of them
ROWS_COLS = 16  # row-major B: 16 columns a workgroup, 16 lanes splitting each column's K
COLS_COLS = 8  # transposed B: 8 columns a workgroup, 32 lanes reading consecutive k


def gemv_layout(a: View, b: View, m: int) -> str | None:
    """Which of B's dims is contiguous ("rows" or "cols") where the GEMV serves (B, M, K) @ (B, K, N), else None."""
    if m > GEMV_MAX_M or any(s < 0 for s in a.strides + b.strides):
        return None
    if b.strides[2] == 1:
        return "rows"
    if b.strides[1] == 1:
        return "cols"
    return None


def gemv_splits(groups: int, k: int, lanes: int) -> tuple[int, int]:
    """(K splits, K per split) giving `groups` column workgroups about settings.GEMV_GROUPS in all; every split keeps
    at least two unrolled steps (4 k) per lane, and K per split is a whole number of them."""
    target = settings.GEMV_GROUPS.get()
    step = 4 * lanes
    splits = min(-(-target // groups), k // (2 * step)) if target > groups else 1
    if splits <= 1:
        return 1, k
    per = math.ceil(math.ceil(k / splits) / step) * step
    return -(-k // per), per


def record_gemv(be: WgpuBackend, a: View, b: View, out: View, make_epilogue: EpilogueFactory, layout: str,
                windows: dict[int, tuple[int, int]] | None, types: dict[Any, str] | None) -> list:
    """The GEMV kernel, plus the split-K reduce where K is split; `make_epilogue(binds, guard_m, guard_n)` adds the
    bias and residual to the bindings it is given."""
    nb, m, k = a.shape
    n = b.shape[2]
    cols = ROWS_COLS if layout == "rows" else COLS_COLS
    lanes = 256 // cols
    # Quads of B, m <= 2 (the vec4 partial sums of M = 4 would fill 16 KiB): 4 columns per load where B's rows and
    # N are whole quads (w = 4), or 4 consecutive k of a column where its columns and K are (kq: the loop counts
    # quads of k, the vec4 accumulators' components added at the end).
    quads = m <= 2 and settings.GEMV_VEC4.get() and b.offset % 4 == 0 and b.strides[0] % 4 == 0
    w = 4 if quads and layout == "rows" and n % 4 == 0 and b.strides[1] % 4 == 0 else 1
    kq = quads and layout == "cols" and k % 4 == 0 and b.strides[2] % 4 == 0
    vec = w == 4 or kq
    kk_len = k // 4 if kq else k
    col_groups = -(-n // (cols * w))
    splits, per = gemv_splits(nb * col_groups, kk_len, lanes)
    groups = splits * nb * col_groups
    scratch = be.scratch("split-K partial sums", splits * nb * m * n * 4) if splits > 1 else None
    binds = Bindings(out.handle if scratch is None else scratch, windows, types)
    binds.add(a.handle, False)
    binds.add(b.handle, vec)
    ep = make_epilogue(binds, False, False) if scratch is None else partial_epilogue(m, n)
    if layout == "rows":  # consecutive invocations on consecutive columns
        col, lane = f"lid % {u32(cols)}", f"lid / {u32(cols)}"
    else:  # consecutive invocations on consecutive k of one column
        col, lane = f"lid / {u32(lanes)}", f"lid % {u32(lanes)}"
    grid = grid_1d(groups)
    split = f"; K split {splits} ways ({per} each) into partial sums" if splits > 1 else ""
    split += "; B read in quads" + (" of k (the loop counts quads)" if kq else "") if vec else ""
    header = "\n".join([
        f"// ember gemv ({layout}): Z={nb} x (M={m} x K={k}) @ (K x N={n}); A strides {a.strides}, B strides "
        f"{b.strides}{split}", "// Bindings (group 0):", *binds.comment(), f"// Dispatch grid: {grid}"])
    spec = dict(HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(binds.declarations()), EPILOGUE=ep.function(binds),
                M=u32(m), N=u32(n), K=u32(kk_len), Z=u32(nb), COLS=u32(cols), LANES=u32(lanes),
                COL_GROUPS=u32(col_groups), SPLITS=u32(splits), KC=u32(per), GROUPS=u32(groups), COL=col, LANE=lane,
                PARTIALS=m * 256,
                EPI_Z="z" if scratch is None else "zs", W=u32(w), VEC="vec4<f32>" if vec else "f32")
    ez = spec["EPI_Z"]
    spec["EPI_CALLS"] = (" ".join(f"epi(v.{c}, {ez}, m, n + {j}u);" for j, c in enumerate("xyzw")) if w == 4 else
                         f"epi(v.x + v.y + v.z + v.w, {ez}, m, n);" if kq else f"epi(v, {ez}, m, n);")

    def load_a(index: str) -> str:
        return binds.scalar(a.handle, addr(a.offset, [("z", a.strides[0]), ("m", a.strides[1]), (index, a.strides[2])]))

    def load_b(kk: str) -> str:
        if not vec:
            return binds.scalar(b.handle, addr(b.offset, [("z", b.strides[0]), (kk, b.strides[1]),
                                                          ("n", b.strides[2])]))
        terms = [(kk, 1), ("n", b.strides[2] // 4)] if kq else [(kk, b.strides[1] // 4), ("nq", 1)]
        return binds.quad(b.handle, addr(b.offset // 4, [("z", b.strides[0] // 4), *terms]))

    for i, kk in enumerate(("k", "k1", "k2", "k3")):  # the loads at the four k of an unrolled step
        # Quads of k: A's four k of quad kk beside B's quad.
        spec[f"LOAD_A_K{i}"] = ("vec4<f32>({})".format(", ".join(load_a(f"(4u * {kk} + {j}u)") for j in range(4)))
                                if kq else load_a(kk))
        spec[f"LOAD_B_K{i}"] = load_b(kk)
    src = be.kernel_source("matmul_gemv", **spec)
    label = f"matmul_gemv.{layout}" + ("4" if vec else "") + (f":split{splits}" if splits > 1 else "")
    steps = [be.dispatch(be.pipeline(label, src), binds.buffers(), grid, label)]
    if scratch is None:
        return steps
    return steps + record_splitk_reduce(be, "matmul_gemv", scratch, splits, nb, m, n, out.handle, make_epilogue,
                                        windows, types)

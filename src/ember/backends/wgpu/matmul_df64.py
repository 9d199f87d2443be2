"""float64 matmul (MatMul, Gemm and what lowers to them) in double-float: kernels/matmul_df64.wgsl.

matmul.record_matmul hands float64 problems here. Speed is not the point (float64 models are rare on a GPU
backend); the sum over K runs in order in df64, so results carry float64-level precision (~2^-48 relative per
step), within f32's exponent range.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.expr import Expr
from ...core.view import View
from .program import DF64, df64_library, grid_1d, kernel, storage_type
from .shader.bindings import check_view
from .shader.emit import ExprEmitter, df_literal
from .shader.wgsl import PRELUDE

if TYPE_CHECKING:
    from .backend import WgpuBackend


def _at(v: View, coords: tuple[str, str, str]) -> str:
    """The i32 element index of v at (z, row, col) in WGSL."""
    return " + ".join([f"{v.offset}", *(f"{c} * {s}" for c, s in zip(coords, v.strides, strict=True) if s)])


@kernel("record_matmul_df64")
def record_matmul_df64(be: WgpuBackend, a: View, b: View, out: View, *, alpha: float = 1.0,
                       bias: View | None = None, beta: float = 1.0, act: Expr | None = None,
                       residual: View | None = None) -> list[Any]:
    """out = act(alpha * a @ b + beta * bias + residual) over 3-D views (B, M, K) @ (B, K, N), all float64."""
    views = {"a": a, "b": b, "bias": bias, "residual": residual, "out": out}
    for name, v in views.items():
        if v is not None and storage_type(v.dtype) != DF64:
            raise NotImplementedError(f"wgpu matmul: float64 operands must all be float64; {name} is {v.dtype}")
    nb, m, k = a.shape
    n = b.shape[2]
    if b.shape[:2] != (nb, k) or out.shape != (nb, m, n):
        raise ValueError(f"matmul: shapes a {a.shape} @ b {b.shape} -> out {out.shape} do not match")
    if out.size == 0:
        return []
    if bias is not None and float(beta) == 0.0:
        bias = None
    bias = bias.broadcast_to(out.shape) if bias is not None else None
    residual = residual.broadcast_to(out.shape) if residual is not None else None
    handles: list[int] = []
    for name, v in views.items():
        if v is not None:
            check_view(be, v, name)
            if v.handle not in handles and v.handle != out.handle:
                handles.append(v.handle)
    handles.append(out.handle)
    var = {h: f"buf{i}" for i, h in enumerate(handles)}
    decls = [f"@group(0) @binding({i}) var<storage, {'read_write' if h == out.handle else 'read'}> buf{i}: "
             f"array<{DF64}>;" for i, h in enumerate(handles)]
    epi = ["    var v = acc;"]
    if float(alpha) != 1.0:
        epi.append(f"    v = df_mul(v, {df_literal(float(alpha))});")
    if bias is not None:
        term = f"{var[bias.handle]}[u32({_at(bias, ('z', 'i', 'j'))})]"
        if float(beta) != 1.0:
            term = f"df_mul({term}, {df_literal(float(beta))})"
        epi.append(f"    v = df_add(v, {term});")
    if residual is not None:
        epi.append(f"    v = df_add(v, {var[residual.handle]}[u32({_at(residual, ('z', 'i', 'j'))})]);")
    if act is not None:
        em = ExprEmitter(["v"], df_inputs=frozenset({0}))
        em.emit(act)
        epi.extend([*em.lines, f"    v = {em.as_df(act)};"])
    src = be.kernel_source("matmul_df64", PRELUDE=PRELUDE + df64_library(), BINDINGS="\n".join(decls),
                           TOTAL=out.size, N=n, M=m, K=k, A=var[a.handle], B=var[b.handle],
                           A_AT=_at(a, ("z", "i", "p")), B_AT=_at(b, ("z", "p", "j")), EPILOGUE="\n".join(epi),
                           OUT=var[out.handle], OUT_AT=_at(out, ("z", "i", "j")))
    pipeline = be.pipeline("matmul:df64", src)
    return [be.dispatch(pipeline, handles, grid_1d(-(-out.size // 256)), "matmul:df64")]

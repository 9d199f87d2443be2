"""Fused (log)softmax over contiguous rows: kernels/rows.wgsl, specialised per row length and layout.

One dispatch: TY lanes of a workgroup take a row (TX rows per workgroup when rows are short), find its max,
sum exp(x - max) and write the row; the launch and lane-reduction helpers are norm.py's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.view import View
from . import norm
from .program import grid_1d, kernel

if TYPE_CHECKING:
    from .backend import WgpuBackend

HEADER = """\
// (Log)softmax. Bindings (group 0): 0 x (read; absent when x is out's own window, read through `out`), 1 out
// (read_write).
// Two passes over the row: m = max(x) (NaN-propagating, exact in any order), s = sum(exp(x - m)), then
// out = exp(x - m) / s, or (x - m) - log(s). A row whose max is not finite (all -inf, or holding NaN or +inf)
// is all NaN: ONNX's formula exp(x - max) gives NaN there (-inf - -inf, inf - inf), and so do onnx.reference
// and ONNX Runtime (checked: Softmax and LogSoftmax, opsets 11 and 13, all -inf row -> NaN)."""
FUNCS = """\
fn is_finite(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u; }
// exp of x - m <= 0; exactly 0 below f32's smallest subnormal (and for -inf, without inf arithmetic in exp).
fn exp_le0(d: f32) -> f32 { return select(exp(d), 0.0, d < -104.0); }"""


@kernel("record_softmax")
def record_softmax(be: WgpuBackend, x: View, out: View, n: int, log: bool) -> list[Any]:
    rows = norm.check_rows(x, out, n)
    if rows == 0:
        return []
    reads = norm.Reads(out, 1)
    xname = reads.add(0, "x", x, in_place_ok=True)
    decls, handles = reads.bindings()

    tx, ty, cpl = norm.launch(be, n, rows)
    subgroups = norm.USE_SUBGROUPS and "subgroup" in be.features and ty > 1
    cached = cpl <= norm.CACHE_MAX
    load = "c[j]" if cached else reads.get(xname, "xb + i")
    body = [] if subgroups else ["    let sg = 0u;"]
    if cached:
        body += norm.cache_fill(reads, xname)
    body += ["    var mx = -inf_f32();"]
    body += norm.row_loop(["            mx = fmax_nan(mx, v);"], load, n, ty)
    body += ["    let m = row_max(mx, lid, ty, sg);", "    var a = vec2<f32>(0.0, 0.0);"]
    body += norm.row_loop(["            a = acc(a, exp_le0(v - m));"], load, n, ty)
    body += ["    let s = row_sum(total(a), lid, ty, sg);",
             "    if (!valid) { return; }",
             "    let bad = !is_finite(m);  // all -inf, or a NaN or +inf in the row: NaN, as ONNX gives"]
    if log:
        body += ["    let ls = log(s);"]
        y = "select(select((v - m) - ls, -inf_f32(), v == -inf_f32()), nan_f32(), bad)"
    else:
        y = "select(exp_le0(v - m) / s, nan_f32(), bad)"
    body += norm.row_loop([f"            {reads.put('ob + i', y)}"], load, n, ty)

    src = norm.rows_source(be, HEADER, FUNCS, "", [norm.lane_reduce("row_max", "fmax_nan(a, b)", ty, subgroups),
                                                    norm.lane_reduce("row_sum", "a + b", ty, subgroups)],
                           decls, n, tx, ty, rows, cpl, subgroups, x, out, body)
    label = "logsoftmax" if log else "softmax"
    return [be.dispatch(be.pipeline(label, src), handles, grid_1d(-(-rows // tx)), label)]

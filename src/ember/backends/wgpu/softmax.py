"""Fused (log)softmax over contiguous rows: kernels/softmax.wgsl, specialised per row length and layout.

One dispatch: TY lanes of a workgroup take a row (TX rows per workgroup when rows are short), find its max,
sum exp(x - max) and write the row; the launch and lane-reduction helpers are norm.py's.
"""

from __future__ import annotations

from typing import Any

from ..base import View
from . import norm
from .backend import WgpuBackend, grid_1d
from .elementwise import PRELUDE


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

    src = be.kernel_source(
        "softmax", PRELUDE=PRELUDE, BINDINGS=decls, N=n, TX=tx, TY=ty, ROWS=rows, CPL=cpl, WG=tx * ty,
        ROW_MAX=norm.lane_reduce("row_max", "fmax_nan(a, b)", ty, subgroups),
        ROW_SUM=norm.lane_reduce("row_sum", "a + b", ty, subgroups),
        COMPENSATED_SUM=norm.COMPENSATED_SUM,
        SG_ARGS=", @builtin(subgroup_size) sg: u32" if subgroups else "", X_OFF=x.offset, OUT_OFF=out.offset,
        BODY="\n".join(body))
    label = "logsoftmax" if log else "softmax"
    return [be.dispatch(be.pipeline(label, src), handles, grid_1d(-(-rows // tx)), label)]

"""Reductions over the last dims of a strided View: kernels/reduce.wgsl, specialised per op, shape and layout.

A reduction is a set of rows (one per output) of R elements each. The launch shape follows the layout:

* rows contiguous in memory (reducing the fastest axis): TY lanes per row read the row together,
  adjacent lanes on adjacent elements, and combine through subgroup shuffles (workgroup memory without the
  'subgroup' feature); short rows get one thread each;
* rows strided (reducing a slower axis, outputs adjacent in memory): adjacent lanes take adjacent outputs,
  so each step of the loop reads a contiguous run, with a few lanes per output when outputs are few;
* too few threads for the data (fewer than TARGET_THREADS, as with few long rows): each row is cut into
  chunks reduced by separate workgroups into a scratch buffer of partial states ([output][chunk]), then a
  second dispatch of the same kernel combines each output's contiguous row of partials.

Each lane keeps four loads in flight, which brings all three layouts near a large GPU's memory bandwidth
(BENCHMARKS.md).

Every op is a state S = (a, b), an identity, a load (element -> state), an associative combine and a final
step, so the same kernel serves sum/mean/prod/min/max/norms, logsumexp (online max + rescaled sum) and the
arg ops (value, index) with numpy's tie and NaN rules. float64 tensors reduce in double-float (kernels/df64.wgsl):
the same states with vec2<f32> components (_df_spec).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import wgpu

from ...core.view import View
from .program import DF64, df64_library, grid_1d, kernel, storage_type
from .shader.emit import df_literal
from .shader.wgsl import PRELUDE, int_literal

if TYPE_CHECKING:
    from .backend import WgpuBackend

WG_MAX = 256
USE_SUBGROUPS = True  # tests switch this off to cover the workgroup-memory path on a subgroup device
# A launch of fewer threads than this, over long rows, splits the rows into chunks (two passes): with four
# loads in flight per thread, ~2^18 threads cover the latency of a large GPU's memory.
TARGET_THREADS = 1 << 18
MIN_PER_LANE = 32  # elements each lane folds in a chunk, at least
SPLIT_MAX = 1024

OPS = ("sum", "mean", "max", "min", "prod", "sumsq", "l1", "l2", "logsum", "logsumexp", "argmax", "argmin",
       "argmax_last", "argmin_last")
ARG_OPS = ("argmax", "argmin", "argmax_last", "argmin_last")
I32_MIN, I32_MAX = -(2**31), 2**31 - 1


@dataclass(frozen=True)
class _Op:
    at: str  # state component types
    bt: str
    id_a: str
    id_b: str
    combine: str  # body of combine(p, q) -> S
    load: str  # S from `v` (the element, already of type `vt`)
    vt: str  # element type the load works on
    final: str  # expression of S `s` -> result
    ft: str  # result type
    has_b: bool


def _pow2ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _op_spec(op: str, kind: str, r_total: int) -> _Op:
    """kind: 'f' (f32 elements) or 'i' (i32)."""
    fl = kind == "f"
    if op in ARG_OPS:
        t = "f32" if fl else "i32"
        want_max = op.startswith("argmax")
        last = op.endswith("_last")
        cmp = ">" if want_max else "<"
        id_val = ("-inf_f32()" if want_max else "inf_f32()") if fl else int_literal(I32_MIN if want_max else I32_MAX)
        id_idx = "-1i" if last else int_literal(I32_MAX)
        tie = "(p.b > q.b)" if last else "(p.b < q.b)"
        if fl:
            # numpy: a NaN wins (the first one, or the last for *_last); otherwise the extreme, ties by index.
            body = (f"    let pn = is_nan(p.a);\n    let qn = is_nan(q.a);\n"
                    f"    let tie = (pn && qn) || p.a == q.a;\n"
                    f"    let better = select(select((p.a {cmp} q.a), {tie}, tie), pn, pn != qn);\n"
                    f"    if (better) {{ return p; }}\n    return q;")
        else:
            body = (f"    let better = select((p.a {cmp} q.a), {tie}, p.a == q.a);\n"
                    f"    if (better) {{ return p; }}\n    return q;")
        return _Op(t, "i32", id_val, id_idx, body, "S(v, i32(r))", t, "s.b", "i32", True)
    if op == "logsumexp":
        # (running max m, sum of exp(x - m)); a non-finite max is the answer itself (NaN, +inf, or -inf
        # when every element is -inf), as numpy gives with its max-subtracted formula.
        body = ("    let m = fmax_nan(p.a, q.a);\n"
                "    if (!is_finite(m)) { return S(m, 0.0); }\n"
                "    return S(m, p.b * exp(p.a - m) + q.b * exp(q.a - m));")
        return _Op("f32", "f32", "-inf_f32()", "0.0", body, "S(v, 1.0)", "f32",
                   "select(s.a, s.a + log(s.b), is_finite(s.a))", "f32", True)
    if op in ("l2", "logsum") or fl:
        t, vt = "f32", "f32"
    else:
        t, vt = "i32", "i32"
    zero, one = ("0.0", "1.0") if t == "f32" else ("0i", "1i")
    if op in ("max", "min"):
        if t == "f32":
            ident = "-inf_f32()" if op == "max" else "inf_f32()"
            comb = f"f{op}_nan(p.a, q.a)"
        else:
            ident = int_literal(I32_MIN if op == "max" else I32_MAX)
            comb = f"{op}(p.a, q.a)"
        return _Op(t, t, ident, zero, f"    return S({comb}, {zero});", f"S(v, {zero})", vt, "s.a", t, False)
    if op == "prod":
        return _Op(t, t, one, zero, f"    return S(p.a * q.a, {zero});", f"S(v, {zero})", vt, "s.a", t, False)
    load = {"sum": "v", "mean": "v", "logsum": "v", "sumsq": "v * v", "l2": "v * v", "l1": "abs(v)"}[op]
    final = "s.a"
    if op == "mean":
        n = max(r_total, 1)
        # Integer mean floors (numpy's sum // n, as the cpu backend does).
        final = f"(s.a / {float(n)!r}f)" if t == "f32" else f"floor_div(s.a, {n}i)"
    elif op == "l2":
        final = "safe_sqrt(s.a)"
    elif op == "logsum":
        final = "safe_log(s.a)"
    return _Op(t, t, zero, zero, f"    return S(p.a + q.a, {zero});", f"S({load}, {zero})", vt, final, t, False)


def _df_spec(op: str, r_total: int) -> _Op:
    """_op_spec for float64 elements: every state component a df64 pair, the same rules through df64.wgsl."""
    zero, one, inf = "df(0.0)", "df(1.0)", "df(inf_f32())"
    if op in ARG_OPS:
        want_max = op.startswith("argmax")
        last = op.endswith("_last")
        tie = "(p.b > q.b)" if last else "(p.b < q.b)"
        cmp = "df_gt" if want_max else "df_lt"
        body = (f"    let pn = is_nan(p.a.x);\n    let qn = is_nan(q.a.x);\n"
                f"    let tie = (pn && qn) || df_eq(p.a, q.a);\n"
                f"    let better = select(select({cmp}(p.a, q.a), {tie}, tie), pn, pn != qn);\n"
                f"    if (better) {{ return p; }}\n    return q;")
        return _Op(DF64, "i32", f"(-{inf})" if want_max else inf, "-1i" if last else int_literal(I32_MAX), body,
                   "S(v, i32(r))", DF64, "s.b", "i32", True)
    if op == "logsumexp":
        # As the f32 state: (running max, sum of exp(x - max)); the larger side's exp is 1.
        body = ("    let m = df_max(p.a, q.a);\n"
                "    if (!df_finite(m.x)) { return S(m, df(0.0)); }\n"
                "    if (df_ge(p.a, q.a)) { return S(p.a, df_add(p.b, df_mul(q.b, df_exp(df_sub(q.a, p.a))))); }\n"
                "    return S(q.a, df_add(q.b, df_mul(p.b, df_exp(df_sub(p.a, q.a)))));")
        return _Op(DF64, DF64, f"(-{inf})", zero, body, f"S(v, {one})", DF64,
                   "select(s.a, df_add(s.a, df_log(s.b)), df_finite(s.a.x))", DF64, True)
    if op in ("max", "min"):
        return _Op(DF64, DF64, f"(-{inf})" if op == "max" else inf, zero, f"    return S(df_{op}(p.a, q.a), {zero});",
                   f"S(v, {zero})", DF64, "s.a", DF64, False)
    if op == "prod":
        return _Op(DF64, DF64, one, zero, f"    return S(df_mul(p.a, q.a), {zero});", f"S(v, {zero})", DF64, "s.a",
                   DF64, False)
    load = {"sum": "v", "mean": "v", "logsum": "v", "sumsq": "df_mul(v, v)", "l2": "df_mul(v, v)",
            "l1": "df_abs(v)"}[op]
    final = {"mean": f"df_div(s.a, {df_literal(float(max(r_total, 1)))})", "l2": "df_sqrt(s.a)",
             "logsum": "df_log(s.a)"}.get(op, "s.a")
    return _Op(DF64, DF64, zero, zero, f"    return S(df_add(p.a, q.a), {zero});", f"S({load}, {zero})", DF64,
               final, DF64, False)


FLOOR_DIV = """
fn floor_div(a: i32, n: i32) -> i32 {
    let q = a / n;
    return select(q, q - 1, (a - q * n != 0) && (a < 0));  // no i32 `%`: NVIDIA's driver computes it unsigned
}
"""


def _merge(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """Drop size-1 dims and merge neighbours that are contiguous with each other."""
    dims: list[int] = []
    ss: list[int] = []
    for d, s in zip(shape, strides, strict=True):
        if d == 1:
            continue
        if dims and ss[-1] == s * d:
            dims[-1] *= d
            ss[-1] = s
        else:
            dims.append(d)
            ss.append(s)
    return dims, ss


def _offset_code(var: str, dims: list[int], strides: list[int], start: str) -> list[str]:
    """Statements computing `off` = start + the strided offset of linear index `var` over dims."""
    lines = [f"    var off: u32 = {start};"]
    if not dims:
        return lines
    if len(dims) == 1:
        term = var if strides[0] == 1 else f"{var} * {strides[0]}u"
        return [f"    let off: u32 = {start} + {term};"]
    lines.append(f"    var t: u32 = {var};")
    for d, s in zip(reversed(dims[1:]), reversed(strides[1:]), strict=True):
        lines.append(f"    off += (t % {d}u) * {s}u;")
        lines.append(f"    t = t / {d}u;")
    lines.append(f"    off += t * {strides[0]}u;")
    return lines


def _convert(value: str, src: str, dst: str) -> str:
    if src == dst:
        return value
    if src == DF64:
        return {"f32": f"{value}.x", "f16": f"f16(unpack2x16float(df_to_f16_bits({value})).x)",
                "i32": f"df_to_i32({value})", "u32": f"select(0u, 1u, {value}.x != 0.0)"}[dst]
    if dst == DF64:
        return f"df_from_i32({value})" if src == "i32" else f"df(f32({value}))"
    if dst == "u32":
        zero = "0.0" if src in ("f32", "f16") else "0i"
        return f"select(0u, 1u, {value} != {zero})"
    if dst == "i32":  # from f32: truncate, NaN -> 0
        return f"i32(select(trunc({value}), 0.0, is_nan({value})))"
    return f"{dst}({value})"  # f32 <-> f16 (f16 storage is reduced in f32), i32 -> f32


@dataclass
class _Pass:
    rows: int  # rows this dispatch reduces
    r: int  # elements per (unsplit) row
    tx: int
    ty: int
    ty_fast: bool  # lanes of a row adjacent (rows contiguous) vs rows adjacent
    split: int  # chunks per output row (1 = no split)
    chunk: int


def _launch(n_out: int, r: int, rows_contig: bool) -> tuple[int, int, bool]:
    """(TX, TY, ty_fast) for n_out rows of r elements."""
    if r <= 8:
        return min(WG_MAX, _pow2ceil(n_out)), 1, False
    if rows_contig:
        ty = min(WG_MAX, _pow2ceil(-(-r // 4)))
        tx = min(WG_MAX // ty, _pow2ceil(n_out))
        return tx, ty, True
    tx = min(WG_MAX, _pow2ceil(n_out))
    ty = min(WG_MAX // tx, _pow2ceil(-(-r // 4)))
    return tx, ty, False


def _bindings(in_a: str, in_b: str | None, out_a: str, out_b: str | None) -> str:
    lines = [f"@group(0) @binding(0) var<storage, read> src: array<{in_a}>;"]
    if in_b:
        lines.append(f"@group(0) @binding(1) var<storage, read> src_b: array<{in_b}>;")
    lines.append(f"@group(0) @binding(2) var<storage, read_write> dst: array<{out_a}>;")
    if out_b:
        lines.append(f"@group(0) @binding(3) var<storage, read_write> dst_b: array<{out_b}>;")
    return "\n".join(lines)


def _source(be: WgpuBackend, spec: _Op, p: _Pass, *, range_code: str, row_base: list[str], elem: list[str],
            load: str, store: str, bindings: str, subgroups: bool) -> str:
    wg = p.tx * p.ty
    if p.ty_fast:
        tx_of, ty_of = ("lid / TY", "lid % TY") if p.ty > 1 else ("lid", "0u")
    else:
        tx_of, ty_of = ("lid % TX", "lid / TX") if p.ty > 1 else ("lid", "0u")
    sg_args = ""
    if p.ty == 1:
        cross = "    if (valid) { store(row, s); }"
    elif subgroups and p.ty_fast:
        sg_args = ", @builtin(subgroup_size) sg_size: u32"
        shuf_b = "subgroupShuffleXor(s.b, k)" if spec.has_b else spec.id_b
        cross = "\n".join([
            "    let w = min(sg_size, TY);",
            "    for (var k = w / 2u; k > 0u; k = k / 2u) {",
            f"        s = combine(s, S(subgroupShuffleXor(s.a, k), {shuf_b}));",
            "    }",
            "    if ((ty & (w - 1u)) == 0u) { sh[lid / w] = s; }",
            "    workgroupBarrier();",
            "    if (valid && ty == 0u) {",
            "        let first = lid / w;",
            "        var acc = sh[first];",
            "        for (var i = 1u; i < TY / w; i++) { acc = combine(acc, sh[first + i]); }",
            "        store(row, acc);",
            "    }",
        ])
    else:
        step = "1u" if p.ty_fast else "TX"
        cross = "\n".join([
            "    sh[lid] = s;",
            "    workgroupBarrier();",
            "    for (var k = TY / 2u; k > 0u; k = k / 2u) {",
            f"        if (ty < k) {{ sh[lid] = combine(sh[lid], sh[lid + k * {step}]); }}",
            "        workgroupBarrier();",
            "    }",
            "    if (valid && ty == 0u) { store(row, sh[lid]); }",
        ])
    return be.kernel_source(
        "reduce", PRELUDE=PRELUDE + FLOOR_DIV + (df64_library() if DF64 in bindings else ""),
        INIT="    df_init(nwg);" if DF64 in bindings else "", AT=spec.at, BT=spec.bt, BINDINGS=bindings,
        TX=p.tx, TY=p.ty, ROWS=p.rows, WG=wg, ID_A=spec.id_a, ID_B=spec.id_b, COMBINE=spec.combine,
        ELEM="\n".join([*elem, "    return off;"]), LOAD=load, STORE=store, SG_ARGS=sg_args,
        TX_OF_LID=tx_of, TY_OF_LID=ty_of,
        RANGE="\n".join([range_code, *row_base]), CROSS=cross,
    )


def _range(p: _Pass, n_out: int, o_major: bool) -> str:
    """Code defining the row's output `o` and its element range [start, end) for pass p."""
    if p.split == 1:
        return f"    let o = row;\n    let start = 0u;\n    let end = select(0u, {p.r}u, valid);"
    if o_major:
        oc = f"    let o = row / {p.split}u;\n    let chunk = row % {p.split}u;"
    else:
        oc = f"    let o = row % {n_out}u;\n    let chunk = row / {n_out}u;"
    return (oc + f"\n    let start = chunk * {p.chunk}u;\n"
            f"    let end = select(start, min({p.r}u, start + {p.chunk}u), valid);")


@kernel("record_reduce_axes")
def record_reduce_axes(be: WgpuBackend, op: str, x: View, out: View, n_reduce: int) -> list[Any]:
    if op not in OPS:
        raise ValueError(f"op: unknown reduction {op!r}; valid: {', '.join(OPS)}")
    nd = len(x.shape)
    if not 0 <= n_reduce <= nd:
        raise ValueError(f"n_reduce: {n_reduce} is out of range for a {nd}-D input")
    outer_shape, red_shape = x.shape[:nd - n_reduce], x.shape[nd - n_reduce:]
    if tuple(out.shape) != tuple(outer_shape) and math.prod(out.shape) != math.prod(outer_shape):
        raise ValueError(f"out: shape {out.shape} does not match the kept dims {outer_shape}")
    if not out.is_contiguous():
        raise ValueError("out: the output view must be contiguous")
    if any(s < 0 for s in x.strides):
        raise NotImplementedError("wgpu reduce: negative strides")
    n_out, r = math.prod(outer_shape), math.prod(red_shape)
    if op in ARG_OPS:
        if n_reduce != 1:
            raise ValueError(f"{op} reduces exactly one axis, got n_reduce={n_reduce}")
        if r == 0 and n_out:
            raise ValueError(f"{op} of an empty axis")
    if n_out == 0:
        return []
    xt, ot = storage_type(x.dtype), storage_type(out.dtype)
    spec = _df_spec(op, r) if xt == DF64 else _op_spec(op, "f" if xt in ("f32", "f16") else "i", r)

    outer_dims, outer_strides = _merge(tuple(outer_shape), tuple(x.strides[:nd - n_reduce]))
    red_dims, red_strides = _merge(tuple(red_shape), tuple(x.strides[nd - n_reduce:]))
    # Which way is memory contiguous: along a row (reduce the fast axis) or across rows.
    rs = red_strides[-1] if red_strides else 1
    os_ = outer_strides[-1] if outer_strides else 1 << 40
    rows_contig = rs <= os_ if r > 1 else False

    tx, ty, ty_fast = _launch(n_out, r, rows_contig)
    threads = -(-n_out // tx) * tx * ty
    split = 1
    if threads < TARGET_THREADS:
        split = max(1, min(-(-TARGET_THREADS // threads), r // (ty * MIN_PER_LANE), SPLIT_MAX))
    subgroups = USE_SUBGROUPS and "subgroup" in be.features
    label = f"reduce:{op}"

    if xt == "u32":
        x_load = f"    let v = {spec.vt}(src[elem(base, r)]);\n    return {spec.load};"
    else:
        x_load = "    let v = " + _convert("src[elem(base, r)]", xt, spec.vt) + f";\n    return {spec.load};"
    x_base = [line.replace("off", "base")
              for line in _offset_code("o", outer_dims, outer_strides, f"{x.offset}u")]
    x_elem = _offset_code("r", red_dims, red_strides, "base")
    final_store = f"    let v = {spec.final};\n    dst[{out.offset}u + row] = {_convert('v', spec.ft, ot)};"
    if split == 1:
        p = _Pass(n_out, r, tx, ty, ty_fast, 1, r)
        src = _source(be, spec, p, range_code=_range(p, n_out, True), row_base=x_base, elem=x_elem, load=x_load,
                      store=final_store, bindings=_bindings(xt, None, ot, None), subgroups=subgroups)
        pipe = be.pipeline(label, src)
        return [be.dispatch(pipe, {0: x.handle, 2: out.handle}, grid_1d(-(-n_out // tx)), label)]

    # Pass 1: chunks of rows -> partial states in scratch buffers, laid out [o][chunk] so that pass 2 reads
    # contiguous rows. With strided rows the chunks are numbered chunk-major, so that adjacent lanes stay on
    # adjacent outputs for the reads.
    chunk = -(-r // split)
    split = -(-r // chunk)
    rows1 = n_out * split
    tx1, ty1, fast1 = _launch(rows1, chunk, rows_contig)
    p1 = _Pass(rows1, r, tx1, ty1, fast1, split, chunk)
    wa, wb = (8 if t == DF64 else 4 for t in (spec.at, spec.bt))
    sa = be.device.create_buffer(size=max(16, rows1 * wa), usage=wgpu.BufferUsage.STORAGE)
    sb = be.device.create_buffer(size=max(16, rows1 * wb), usage=wgpu.BufferUsage.STORAGE) if spec.has_b else None
    idx = "row" if rows_contig else f"(row % {n_out}u) * {split}u + row / {n_out}u"
    part_store = f"    let i = {idx};\n    dst[i] = s.a;" + ("\n    dst_b[i] = s.b;" if spec.has_b else "")
    src1 = _source(be, spec, p1, range_code=_range(p1, n_out, rows_contig), row_base=x_base, elem=x_elem,
                   load=x_load, store=part_store,
                   bindings=_bindings(xt, None, spec.at, spec.bt if spec.has_b else None), subgroups=subgroups)
    b1 = {0: x.handle, 2: sa}
    if sb is not None:
        b1[3] = sb
    steps = [be.dispatch(be.pipeline(label + ":1", src1), b1, grid_1d(-(-rows1 // tx1)), label + ":1")]

    # Pass 2: each output combines its `split` partial states, a contiguous row.
    base2, elem2 = [f"    let base: u32 = o * {split}u;"], ["    let off: u32 = base + r;"]
    tx2, ty2, fast2 = _launch(n_out, split, True)
    p2 = _Pass(n_out, split, tx2, ty2, fast2, 1, split)
    load2 = "    let i = elem(base, r);\n    return S(src[i], " + ("src_b[i]);" if spec.has_b else f"{spec.id_b});")
    src2 = _source(be, spec, p2, range_code=_range(p2, n_out, True), row_base=base2, elem=elem2, load=load2,
                   store=final_store, bindings=_bindings(spec.at, spec.bt if spec.has_b else None, ot, None),
                   subgroups=subgroups)
    b2 = {0: sa, 2: out.handle}
    if sb is not None:
        b2[1] = sb
    steps.append(be.dispatch(be.pipeline(label + ":2", src2), b2, grid_1d(-(-n_out // tx2)), label + ":2"))
    return steps

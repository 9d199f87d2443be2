"""Generated elementwise kernels: an Expr tree over strided, broadcast inputs -> one WGSL kernel.

Shapes and strides are baked into the source as constants (dims merged where every operand is
contiguous across them), so the common same-shape case indexes with the thread id alone and the
compiler turns the remaining divisions by constants into multiplies. The expression itself goes through the
shader library's emitter (shader/emit.py); float64 operands compute in double-float there (kernels/df64.wgsl).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core.expr import BOOL, FLOAT, INT, Expr
from ...core.view import View
from .program import DF64, as_f32, df64_library, grid_1d, kernel, sizes_buffer, sizes_decl, storage_type
from .shader.emit import ExprEmitter
from .shader.wgsl import PRELUDE

if TYPE_CHECKING:
    from .backend import WgpuBackend

WORKGROUP = 256
MAX_EXPR_NODES = 1024  # distinct nodes; each is its own `let`, so this bounds shader size, not nesting depth
# Narrow ints live in i32 words; a store wraps them to their logical width, so the next kernel reads the
# value numpy would hold (uint8 200 + 100 = 44, not 300).
_WRAP = {"int8": "(({0} << 24u) >> 24u)", "int16": "(({0} << 16u) >> 16u)", "uint8": "({0} & 255i)",
         "uint16": "({0} & 65535i)"}


def _merge_dims(shape: tuple[int, ...], strides: list[tuple[int, ...]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 dims and merge neighbours that every operand walks contiguously."""
    dims: list[int] = []
    ss: list[list[int]] = [[] for _ in strides]
    for d, i in ((d, i) for i, d in enumerate(shape) if d != 1):
        if dims and all(s_list[-1] == st[i] * d for s_list, st in zip(ss, strides, strict=True)):
            dims[-1] *= d
            for s_list, st in zip(ss, strides, strict=True):
                s_list[-1] = st[i]
            continue
        dims.append(d)
        for s_list, st in zip(ss, strides, strict=True):
            s_list.append(st[i])
    return dims, ss


def _widen(raw: str, storage: str) -> str:
    """A stored element as its kind's compute type: bools live in u32 words, f16 is computed in f32."""
    if storage == "u32":
        return f"({raw} != 0u)"
    return as_f32(raw, storage)


class _Sizes:
    """How a size reaches the kernel: as a literal, or (`lifted`, a list the values go to) read from the
    uniform array `sz`, so kernels that differ only in sizes are one pipeline."""

    def __init__(self, lifted: list[int] | None) -> None:
        self.lifted = lifted

    def i(self, x: int) -> str:  # as an i32 expression
        if self.lifted is None:
            return str(x)
        self.lifted.append(int(x))
        k = len(self.lifted) - 1
        return f"sz[{k // 4}][{k % 4}]"

    def u(self, x: int) -> str:  # as a u32 expression
        return f"{x}u" if self.lifted is None else f"u32({self.i(x)})"


def generate(expr: Expr, in_types: list[str], out_type: str, shape: tuple[int, ...],
             in_strides: list[tuple[int, ...]], in_offsets: list[int], out_strides: tuple[int, ...],
             out_offset: int, alias: list[bool], in_shapes: list[tuple[int, ...]] | None = None,
             out_dtype: Any = None, lifted: list[int] | None = None) -> str:
    """WGSL for out[...] = expr(...) over an output window of `shape` (strided or not).

    `in_shapes` are needed for inputs read by `load` (their own shapes); `out_dtype`, the logical output
    dtype, makes narrow ints wrap on store. With `lifted` (a list), sizes, strides and offsets are not in the
    source: they are appended to the list, for a uniform array bound after the output.
    """
    sz = _Sizes(lifted)
    total = math.prod(shape)
    indexed = expr.indexed()
    direct = expr.direct()
    if indexed:
        # Coordinates along every output dim, unmerged: coord(d) and computed loads refer to them.
        dims, out_ss = list(shape), list(out_strides)
        in_ss = [list(st) for st in in_strides]
    else:
        dims, ss = _merge_dims(shape, [out_strides, *in_strides])
        out_ss, in_ss = ss[0], ss[1:]
    linear = list(View.contiguous(0, np.float32, tuple(dims)).strides)
    out_plain = out_ss == linear
    df64 = DF64 in in_types or out_type == DF64
    body = ["    df_init(nwg);"] if df64 else []
    body += [f"    let gid = (wid.y * nwg.x + wid.x) * {WORKGROUP}u + lid.x;",
            f"    if (gid >= {sz.u(total)}) {{ return; }}"]
    # Coordinates only when some operand is not addressed by the output's linear index.
    plain = [st == linear or i not in direct for i, st in enumerate(in_ss)]
    if dims and (indexed or not all(plain) or not out_plain):
        body.append("    var r = i32(gid);")
        for j in range(len(dims) - 1, 0, -1):
            d = sz.i(dims[j])
            body.append(f"    let c{j} = r % {d}; r = r / {d};")
        body.append("    let c0 = r;")
    loads = []
    decls = []
    used = expr.inputs()
    for i, (t, st, off) in enumerate(zip(in_types, in_ss, in_offsets, strict=True)):
        if not alias[i] and i in used:  # an unused binding would not be in the pipeline's layout
            decls.append(f"@group(0) @binding({i}) var<storage, read> in{i}: array<{t}>;")
        if i not in direct:
            loads.append("")  # read by `load` only: see gather()
            continue
        if plain[i]:
            idx = "gid" if off == 0 else f"gid + {sz.u(off)}"  # addressed by the output's linear index
        else:
            terms = [f"c{j} * {sz.i(s)}" for j, s in enumerate(st) if s != 0]
            idx = f"u32({' + '.join([sz.i(off), *terms])})"
        raw = f"{'out' if alias[i] else f'in{i}'}[{idx}]"
        loads.append(_widen(raw, t))

    def gather(i: int, idx: list[str]) -> str:
        # Clamped indices: a trusted module must never read out of bounds, whatever the index data says.
        if alias[i]:
            raise ValueError("record_elementwise: an input read by load must not alias the output")
        assert in_shapes is not None, "load needs the input shapes"
        if math.prod(in_shapes[i]) == 0:
            return {"f32": "0.0", "f16": "0.0", "i32": "0i", "u32": "false", DF64: "df(0.0)"}[in_types[i]]  # none
        terms = [f"clamp({a}, 0i, {sz.i(max(n - 1, 0))}) * {sz.i(st)}" for a, n, st in
                 zip(idx, in_shapes[i], in_strides[i], strict=True) if n > 1 and st != 0]
        raw = f"in{i}[u32({' + '.join([sz.i(in_offsets[i]), *terms])})]"
        return _widen(raw, in_types[i])

    df_inputs = frozenset(i for i, t in enumerate(in_types) if t == DF64)
    em = ExprEmitter(loads, gather, df_inputs)
    if lifted is not None:  # integer literals too (a position offset in an index expression moves with the dims)
        literal = em.leaf

        def leaf(e: Expr) -> str:
            if e.op == "const" and e.kind == INT and -(2**31) <= int(e.value) < 2**31:
                return sz.i(int(e.value))
            return literal(e)

        em.leaf = leaf  # type: ignore[method-assign]
    value = em.emit(expr)
    body.extend(em.lines)
    if out_type == DF64:
        value = em.as_df(expr)
    elif em.is_df(expr):  # a df64 result stored narrower: hi is the f32 rounding; f16 rounds from the pair
        value = {"f32": f"{value}.x", "f16": f"f16(unpack2x16float(df_to_f16_bits({value})).x)",
                 "i32": f"df_to_i32({value})", "u32": f"select(0u, 1u, {value}.x != 0.0)"}[out_type]
    elif out_type == "u32":
        value = f"select(0u, 1u, {value})"
    elif expr.kind == BOOL:
        value = f"{out_type}(select(0, 1, {value}))"
    elif out_type == "f16" or (out_type == "f32") != (expr.kind == FLOAT):
        value = f"{out_type}({value})"  # f16 storage: computed in f32, rounded once on store
    if out_type == "i32" and out_dtype is not None and np.dtype(out_dtype).name in _WRAP:
        value = _WRAP[np.dtype(out_dtype).name].format(value)
    if out_plain:
        out_idx = "gid" if out_offset == 0 else f"gid + {sz.u(out_offset)}"
    else:
        out_idx = f"u32({' + '.join([sz.i(out_offset), *(f'c{j} * {sz.i(s)}' for j, s in enumerate(out_ss) if s)])})"
    body.append(f"    out[{out_idx}] = {value};")
    nbind = len(in_types)
    if lifted is not None:
        decls.append(sizes_decl(nbind + 1, len(lifted)))
    return "\n".join([
        PRELUDE + (df64_library() if df64 else ""),
        *decls,
        f"@group(0) @binding({nbind}) var<storage, read_write> out: array<{out_type}>;",
        f"@compute @workgroup_size({WORKGROUP})",
        "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,",
        "        @builtin(local_invocation_id) lid: vec3<u32>) {",
        *body,
        "}",
    ])


@kernel("select_concat_kernel")
def select_concat_kernel(parts: int, dtype: Any, skewed: bool) -> bool:
    """A dispatch costs more than re-reading short parts: one kernel for 2-4 parts that are small, or all but one
    small (a KV cache grown by a row). Not double-float storage, whose loads are pairs."""
    return skewed and 2 <= parts <= 4 and np.dtype(dtype) != np.float64


@kernel("record_elementwise")
def record_elementwise(be: WgpuBackend, expr: Expr, inputs: list[View], out: View,
                       runtime_sizes: bool = False) -> list[Any]:
    """`runtime_sizes`: the sizes in a uniform buffer of the dispatch's own, not in the source, so the same
    kernel at other sizes (a plan made from a template: ember/plan/fit.py) reuses its pipeline."""
    if expr.nodes() > MAX_EXPR_NODES:
        raise ValueError(f"elementwise expression of {expr.nodes()} nodes exceeds the cap of {MAX_EXPR_NODES}")
    total = out.size
    if total == 0:
        return []
    if any(s < 0 for s in out.strides) or any(s == 0 and d > 1 for s, d in zip(out.strides, out.shape, strict=True)):
        raise ValueError("record_elementwise: the output view must not overlap itself")
    alias = [v.handle == out.handle for v in inputs]
    in_types = [storage_type(v.dtype) for v in inputs]
    out_type = storage_type(out.dtype)
    for i, v in enumerate(inputs):
        if alias[i] and (in_types[i] != out_type or v.strides != out.strides or v.offset != out.offset):
            raise ValueError("record_elementwise: an input aliasing the output must have the output's layout")
    lifted: list[int] | None = [] if runtime_sizes else None
    src = generate(expr, in_types, out_type, out.shape, [v.strides for v in inputs], [v.offset for v in inputs],
                   out.strides, out.offset, alias, [v.shape for v in inputs], out.dtype, lifted)
    pipeline = be.pipeline(f"ew:{expr.op}", src)
    # Bindings are numbered by input position; an input aliasing the output is read through `out`.
    used = expr.inputs()
    bindings = {i: v.handle for i, v in enumerate(inputs) if not alias[i] and i in used}
    bindings[len(inputs)] = out.handle
    if lifted is not None:
        bindings[len(inputs) + 1] = sizes_buffer(be, lifted)
    return [be.dispatch(pipeline, bindings, grid_1d(-(-total // WORKGROUP)), f"ew:{expr.op}")]

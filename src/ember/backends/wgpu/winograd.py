"""Winograd F(m x m, 3 x 3) convolution on the wgpu backend (core/winograd.py has the algorithm and the layouts).

Three kernels per chunk of tiles, one after the other in the stream:
1. input transform (kernels/winograd_input.wgsl, body generated here): x (N, C, H, W) -> V (alpha^2, C, Tp), one
   thread per (channel, tile); B^T d B unrolled with the matrices' literals (zeros skipped, +-1 as adds).
2. alpha^2 batched products M[p] = U[p] @ V[p], (K x C) @ (C x T), through the generated tiled GEMM kernel (gemm.py)
   (Z = alpha^2; its tile / split-K plan from plan_gemm or the autotuner, like every other GEMM).
3. output transform (kernels/winograd_output.wgsl, body generated here): M (alpha^2, K, Tp) -> out (N, K, P, Q), one
   thread per (output channel, tile): A^T M A, then the conv epilogue (bias, activation, the store in out's storage
   type) for the outputs of the tile inside P x Q.

V and M are f32 scratch buffers of the kernels' own (as split-K's partial sums are): alive while the recorded steps
are. Their rows are padded to Tp = T rounded up to 4, so the GEMM reads V with aligned vec4 loads. A problem whose
V or M would exceed the adapter's max storage-buffer binding size is cut into chunks of tiles along T, which run
one after the other through the same scratch buffers.

Every index is in range by construction (shapes baked in, host-side view checks, guarded window loads and edge
stores), so the modules are trusted like the GEMM's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from ...core import winograd as winograd_math
from ...core.expr import Expr
from ...core.view import View
from .gemm import record_gemm_kernel
from .program import grid_1d, kernel
from .shader.bindings import Bindings, binding_windows, check_operands, rebase_view, require_float
from .shader.epilogue import Epilogue
from .shader.loaders import Loader, strided_loader
from .shader.tiles import Tile
from .shader.wgsl import PRELUDE, addr, float_literal, u32

if TYPE_CHECKING:
    from .backend import WgpuBackend

TRANSFORM_WORKGROUP = 128


@dataclass(frozen=True)
class WinoShape:
    n: int
    c: int
    h: int
    w: int
    k: int
    p: int
    q: int
    pt: int
    pl: int
    m: int

    @property
    def alpha(self) -> int:
        return self.m + 2

    @property
    def tiles_hw(self) -> tuple[int, int]:
        return winograd_math.tiles(self.p, self.q, self.m)

    @property
    def t(self) -> int:
        th, tw = self.tiles_hw
        return self.n * th * tw


def _round4(v: int) -> int:
    return -(-v // 4) * 4


def chunking(be: WgpuBackend, ws: WinoShape) -> tuple[int, int]:
    """(tiles per chunk, chunks): the most tiles whose V (alpha^2 x C x Tp) and M (alpha^2 x K x Tp) f32 scratch
    fit one storage binding, dealt out evenly over as few chunks as that allows."""
    per_tile = 4 * ws.alpha ** 2 * max(ws.c, ws.k)
    tp_max = be.max_binding // per_tile // 4 * 4
    if tp_max < 4:
        raise NotImplementedError(f"wgpu Winograd conv: {ws.alpha ** 2} x {max(ws.c, ws.k)} channels x 4 tiles of "
                                  f"scratch exceed max-storage-buffer-binding-size ({be.max_binding} bytes)")
    chunks = -(-ws.t // tp_max)
    return -(-ws.t // chunks), chunks


# ---- generated WGSL --------------------------------------------------------------------------------------------
def _lin(coeffs: list, names: list[str]) -> str:
    """WGSL for sum(c * name) with exact constant coefficients: zeros dropped, +-1 as adds and subtractions."""
    terms = []
    for c, name in zip(coeffs, names, strict=True):
        c = Fraction(c)
        if c == 0:
            continue
        mag = abs(c)
        terms.append((c < 0, name if mag == 1 else f"{float_literal(float(mag))} * {name}"))
    if not terms:
        return "0.0"
    neg, text = terms[0]
    out = f"-{text}" if neg else text
    for neg, t in terms[1:]:
        out += f" - {t}" if neg else f" + {t}"
    return out


def _edge_guards(size: int, pad: int, tiles: int, m: int, alpha: int, var: str) -> list[str | None]:
    """Per window row (or column) r, the WGSL condition that `var{r}` (= tile start + r) lies in [0, size), or None
    where no tile can put it outside."""
    conds: list[str | None] = []
    for r in range(alpha):
        lo, hi = r < pad, (tiles - 1) * m - pad + r >= size
        conds.append(f"u32({var}{r}) < {u32(size)}" if lo and hi else f"{var}{r} >= 0i" if lo
                     else f"{var}{r} < {size}i" if hi else None)
    return conds


def _input_body(ws: WinoShape, binds: Bindings, x_handle: Any, tp: int) -> list[str]:
    a = ws.alpha
    bt, _, _ = winograd_math.matrices(ws.m)
    th, tw = ws.tiles_hw
    rows = _edge_guards(ws.h, ws.pt, th, ws.m, a, "hr")
    cols = _edge_guards(ws.w, ws.pl, tw, ws.m, a, "wc")
    lines = []
    for r in range(a):
        if rows[r] is not None:
            lines.append(f"    let hr{r} = h0 + {r}i;")
        lines.append(f"    let xr{r} = xb + u32(h0 + {r}i) * {u32(ws.w)};")  # wraps outside the input: unused there
    for s in range(a):
        if cols[s] is not None:
            lines.append(f"    let wc{s} = w0 + {s}i;")
        lines.append(f"    let xc{s} = u32(w0 + {s}i);")
    for r in range(a):
        for s in range(a):
            load = binds.scalar(x_handle, f"xr{r} + xc{s}")
            conds = [c for c in (rows[r], cols[s]) if c is not None]
            if conds:
                lines.append(f"    var d{r}_{s} = 0.0;")
                lines.append(f"    if ({' && '.join(conds)}) {{ d{r}_{s} = {load}; }}")
            else:
                lines.append(f"    let d{r}_{s} = {load};")
    # e = B^T d, then v = e B (B = (B^T)^T: v[i][j] = sum_s e[i][s] * B^T[j][s]).
    for i in range(a):
        for s in range(a):
            lines.append(f"    let e{i}_{s} = {_lin(bt[i], [f'd{r}_{s}' for r in range(a)])};")
    for i in range(a):
        for j in range(a):
            off = (i * a + j) * ws.c * tp
            idx = "vb" if off == 0 else f"vb + {u32(off)}"
            lines.append(f"    out[{idx}] = {_lin(bt[j], [f'e{i}_{s}' for s in range(a)])};")
    return lines


def _output_body(ws: WinoShape, binds: Bindings, m_buf: Any, tp: int, residual: View | None) -> list[str]:
    a, m = ws.alpha, ws.m
    _, _, at = winograd_math.matrices(m)
    th, tw = ws.tiles_hw
    lines = []
    for p in range(a * a):
        off = p * ws.k * tp
        lines.append(f"    let m{p} = {binds.scalar(m_buf, 'mb' if off == 0 else f'mb + {u32(off)}')};")
    # f = A^T M, then y = f A.
    for i in range(m):
        for b in range(a):
            lines.append(f"    let f{i}_{b} = {_lin(at[i], [f'm{r * a + b}' for r in range(a)])};")
    for i in range(m):
        for j in range(m):
            lines.append(f"    let y{i}_{j} = {_lin(at[j], [f'f{i}_{b}' for b in range(a)])};")
    for i in range(m):
        if i >= ws.p:
            continue  # no tile's row i is inside the output
        for j in range(m):
            if j >= ws.q:
                continue
            conds = []
            if (th - 1) * m + i >= ws.p:
                conds.append(f"oh < {u32(ws.p - i)}")
            if (tw - 1) * m + j >= ws.q:
                conds.append(f"ow < {u32(ws.q - j)}")
            pix = "pix" if i * ws.q + j == 0 else f"pix + {u32(i * ws.q + j)}"
            acc = f"y{i}_{j}"
            if residual is not None:
                s0, s1, s2, s3 = residual.strides
                idx = addr(residual.offset, [("img", s0), ("k", s1), (f"(oh + {u32(i)})", s2),
                                             (f"(ow + {u32(j)})", s3)])
                acc += f" + {binds.scalar(residual.handle, idx)}"
            call = f"epi({acc}, img, k, {pix});"
            lines.append(f"    if ({' && '.join(conds)}) {{ {call} }}" if conds else f"    {call}")
    return lines


def _coords(ws: WinoShape, t0: int, tc: int, tp: int) -> dict[str, str]:
    th, tw = ws.tiles_hw
    return dict(TC=u32(tc), T0=u32(t0), TW=u32(tw), TH=u32(th), M=u32(ws.m), TP=u32(tp))


def _record_input(be: WgpuBackend, ws: WinoShape, x: View, v_buf: Any, t0: int, tc: int, tp: int,
                  windows: dict, types: dict) -> list:
    binds = Bindings(v_buf, windows, types)
    binds.add(x.handle, False)
    total = ws.c * tc
    grid = grid_1d(math.ceil(total / TRANSFORM_WORKGROUP))
    th, tw = ws.tiles_hw
    header = "\n".join([
        f"// ember Winograd F({ws.m}x{ws.m}, 3x3) input transform: x {(ws.n, ws.c, ws.h, ws.w)}, pads top/left "
        f"{(ws.pt, ws.pl)}, {th}x{tw} tiles per image; tiles [{t0}, {t0 + tc}) of {ws.t} -> V ({ws.alpha ** 2}, "
        f"{ws.c}, {tp})",
        "// Bindings (group 0):", *binds.comment(),
        f"// Dispatch grid: {grid} = ceil({total} (channel, tile) threads / {TRANSFORM_WORKGROUP}) workgroups "
        "spread over x, y"])
    src = be.kernel_source(
        "winograd_input", HEADER=header, BINDINGS="\n".join(binds.declarations()), WORKGROUP=TRANSFORM_WORKGROUP,
        TOTAL=u32(total), PT=f"{ws.pt}i", PL=f"{ws.pl}i",
        XBASE=addr(x.offset, [("img", ws.c * ws.h * ws.w), ("c", ws.h * ws.w)]),
        BODY="\n".join(_input_body(ws, binds, x.handle, tp)), **_coords(ws, t0, tc, tp))
    label = f"winograd_input:F{ws.m}"
    return [be.dispatch(be.pipeline(label, src), binds.buffers(), grid, label)]


def _record_gemm(be: WgpuBackend, ws: WinoShape, uv: View, v_buf: Any, m_buf: Any, tc: int, tp: int,
                 windows: dict, types: dict) -> list:
    z, k, c = ws.alpha ** 2, ws.k, ws.c

    def make_a(binds: Bindings, tile: Tile) -> Loader:  # U[z] (K x C), row-major
        return strided_loader("a", tile.bm, binds, uv.handle, uv.offset, k * c, c, 1, k, c, z)

    def make_b(binds: Bindings, tile: Tile) -> Loader:  # V[z] (C x T), rows Tp apart
        return strided_loader("b", tile.bn, binds, v_buf, 0, c * tp, 1, tp, tc, c, z)

    def make_epilogue(binds: Bindings, guard_m: bool, guard_n: bool) -> Epilogue:
        conds = ([f"m >= {u32(k)}"] if guard_m else []) + ([f"n >= {u32(tc)}"] if guard_n else [])
        return Epilogue(f"z * {u32(k * tp)} + m * {u32(tp)} + n", guard=" || ".join(conds) or None)

    notes = [f"Winograd F({ws.m}x{ws.m}, 3x3) products M[p] = U[p] @ V[p], p < {z}: U ({z}, {k}, {c}), "
             f"V and M rows {tp} apart"]
    return record_gemm_kernel(be, "winograd_gemm", k, tc, c, z, m_buf, make_a, make_b, make_epilogue, notes,
                                 windows, types)


def _record_output(be: WgpuBackend, ws: WinoShape, m_buf: Any, bias: View | None, residual: View | None, out: View,
                   act: Expr | None, t0: int, tc: int, tp: int, windows: dict, types: dict) -> list:
    binds = Bindings(out.handle, windows, types)
    binds.add(m_buf, False)
    if residual is not None:
        binds.add(residual.handle, False)
    pq = ws.p * ws.q
    ep = Epilogue(addr(out.offset, [("z", ws.k * pq), ("m", pq), ("n", 1)]), act=act)
    if bias is not None:
        binds.add(bias.handle, False)
        ep.bias_index = addr(bias.offset, [("m", bias.strides[0])])
        ep.bias_handle = bias.handle
    total = ws.k * tc
    grid = grid_1d(math.ceil(total / TRANSFORM_WORKGROUP))
    header = "\n".join([
        f"// ember Winograd F({ws.m}x{ws.m}, 3x3) output transform: M ({ws.alpha ** 2}, {ws.k}, {tp}), tiles "
        f"[{t0}, {t0 + tc}) of {ws.t} -> out {(ws.n, ws.k, ws.p, ws.q)}"
        + (", + bias" if bias is not None else "") + (", + residual" if residual is not None else "")
        + (", activation" if act is not None else ""),
        "// Bindings (group 0):", *binds.comment(),
        f"// Dispatch grid: {grid} = ceil({total} (channel, tile) threads / {TRANSFORM_WORKGROUP}) workgroups "
        "spread over x, y"])
    src = be.kernel_source(
        "winograd_output", HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(binds.declarations()),
        EPILOGUE=ep.function(binds), WORKGROUP=TRANSFORM_WORKGROUP, TOTAL=u32(total), Q=u32(ws.q),
        BODY="\n".join(_output_body(ws, binds, m_buf, tp, residual)), **_coords(ws, t0, tc, tp))
    label = f"winograd_output:F{ws.m}"
    return [be.dispatch(be.pipeline(label, src), binds.buffers(), grid, label)]


# ---- entry points -------------------------------------------------------------------------------------------------
def winograd_shape(x: View, u_: View, bias: View | None, out: View, pads: tuple[int, int, int, int],
                   m: int) -> WinoShape:
    if m not in winograd_math.TILES:
        raise ValueError(f"Winograd conv: m={m}; the wgpu backend implements F(m, 3) for m in {winograd_math.TILES}")
    for name, v, rank in (("x", x, 4), ("u", u_, 3), ("out", out, 4)):
        if len(v.shape) != rank:
            raise ValueError(f"Winograd conv: {name} must be {rank}-D, got shape {v.shape}")
        if not v.is_contiguous():
            raise ValueError(f"Winograd conv: {name} must be a contiguous view, got strides {v.strides} for shape "
                             f"{v.shape}")
    n, c, h, w = x.shape
    a2, k, cu = u_.shape
    if a2 != (m + 2) ** 2 or cu != c:
        raise ValueError(f"Winograd conv: u must be ({(m + 2) ** 2}, K, {c}) for F({m}, 3) on {c} channels, got "
                         f"{u_.shape}")
    pt, pl, pb, pr = (int(v) for v in pads)
    if min(pt, pl, pb, pr) < 0:
        raise ValueError(f"Winograd conv: negative pads {pads}")
    p, q = h + pt + pb - 2, w + pl + pr - 2
    if p < 1 or q < 1:
        raise ValueError(f"Winograd conv: a 3x3 filter is larger than the padded input {(h + pt + pb, w + pl + pr)}")
    if out.shape != (n, k, p, q):
        raise ValueError(f"Winograd conv: out shape {out.shape}, expected {(n, k, p, q)}")
    if bias is not None and (len(bias.shape) != 1 or bias.shape[0] != k):
        raise ValueError(f"Winograd conv: bias must have shape ({k},), got {bias.shape}")
    return WinoShape(n, c, h, w, k, p, q, pt, pl, m)


@kernel("record_conv_winograd")
def record_conv_winograd(be: WgpuBackend, x: View, u_: View, bias: View | None, out: View,
                         pads: tuple[int, int, int, int], m: int, act: Expr | None = None,
                         residual: View | None = None) -> list:
    """out = act(conv3x3(x) + bias + residual) by Winograd F(m, 3). `residual` (a residual connection): a View of
    out's shape (any non-overlapping strides, broadcast included), added before the activation, as conv.py's
    epilogue does."""
    types = require_float("Winograd conv", x=x, u=u_, bias=bias, out=out, residual=residual)
    ws = winograd_shape(x, u_, bias, out, pads, m)
    if residual is not None and residual.shape != out.shape:
        raise ValueError(f"Winograd conv: residual must have the output's shape {out.shape}, got {residual.shape}")
    check_operands(be, out, x=x, u=u_, bias=bias, residual=residual)
    if out.size == 0:
        return []
    windows = binding_windows(be, [x, u_, bias, residual, out])
    if any(size > be.max_binding for _, size in windows.values()):
        raise NotImplementedError(f"wgpu Winograd conv: an operand needs more than max-storage-buffer-binding-size "
                                  f"({be.max_binding} bytes) of one buffer")
    x, u_, bias, residual, out = (rebase_view(v, windows) for v in (x, u_, bias, residual, out))
    tc, chunks = chunking(be, ws)
    tp = _round4(tc)
    a2 = ws.alpha ** 2
    v_buf = be.scratch("Winograd transformed input", _round4(a2 * ws.c * tp) * 4)
    m_buf = be.scratch("Winograd products", _round4(a2 * ws.k * tp) * 4)
    steps = []
    for i in range(chunks):
        t0 = i * tc
        cnt = min(tc, ws.t - t0)
        steps += _record_input(be, ws, x, v_buf, t0, cnt, tp, windows, types)
        steps += _record_gemm(be, ws, u_, v_buf, m_buf, cnt, tp, windows, types)
        steps += _record_output(be, ws, m_buf, bias, residual, out, act, t0, cnt, tp, windows, types)
    return steps


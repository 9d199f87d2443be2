"""2-D convolution on the wgpu backend (NCHW, filter (K, C/groups, R, S)), bias + activation fused.

- 1x1, stride 1, no padding, one group: a batched matmul (weights broadcast over the batch).
- depthwise (C/groups == 1, groups == C): kernels/conv_depthwise.wgsl, one output per thread.
- few input channels and a large window (an image model's stem): kernels/conv_direct.wgsl, input patch and
  filter staged in workgroup memory (direct_fits says which).
- everything else: implicit GEMM with matmul.py's generated tiled kernel, per group on grid z:
  out[n, g*Kg + m, p, q] = sum_kk W[g*Kg + m, kk] * X(kk; n, p, q), M = Kg, N = batch*P*Q, K = Cg*R*S, where the
  B operand is gathered from the input on the fly (no im2col buffer): column j -> (n, p, q) is decoded once per
  thread before the K loop, row kk -> (c, r, s) once per K tile.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ... import settings
from ...core.expr import Expr
from ...core.view import View
from . import matmul as mm
from .backend import WgpuBackend, grid_1d
from .elementwise import PRELUDE
from .matmul import (
    Bindings,
    Epilogue,
    Loader,
    Tile,
    addr,
    check_operands,
    log2,
    record_matmul,
    require_float,
    strided_loader,
    u,
)

DEPTHWISE_WORKGROUP = 256

# conv_direct.wgsl: lanes are 16 output columns x 2 groups of `rt` rows, warps own 8 output channels each; the
# filter slice in workgroup memory takes kt + 4 floats a tap (padding that spreads a warp's stores over banks).
DIRECT_TQ = 16
DIRECT_MAX_CRS, DIRECT_MIN_RS, DIRECT_MIN_WORKGROUPS = 64 * 4, 9, 128


@dataclass
class ConvShape:
    n: int
    c: int
    h: int
    w: int
    k: int
    cg: int
    r: int
    s: int
    p: int
    q: int
    sh: int
    sw: int
    pt: int
    pl: int
    dh: int
    dw: int
    groups: int

    @property
    def kg(self) -> int:
        return self.k // self.groups


@dataclass
class Im2colLoader(Loader):
    """B[kk, j] = x[n, g*Cg + c, p*sh - pt + r*dh, q*sw - pl + s*dw] for kk = (c, r, s), j = (n, p, q), zero outside."""

    prefix: str
    tile_x: int
    cs: ConvShape
    x: View
    binds: Bindings

    def describe(self) -> str:
        return "B: gathered from the input (implicit im2col), scalar loads of 4 consecutive output pixels"

    def _slot(self, tile: Tile, q: int) -> tuple[str, str, str]:
        bx4 = self.tile_x // 4
        v = "lid" if q == 0 else f"(lid + {u(q * tile.threads)})"
        kr, xq = f"({v} >> {u(log2(bx4))})", f"(({v} & {u(bx4 - 1)}) << 2u)"
        return xq, kr, f"{kr} * {u(bx4)} + ({v} & {u(bx4 - 1)})"

    def prologue(self, tile: Tile) -> list[str]:
        cs, p = self.cs, self.prefix
        pq, npq, chw = cs.p * cs.q, cs.n * cs.p * cs.q, cs.c * cs.h * cs.w
        lines = []
        for q in range(self.quads(tile)):
            xq, kr, so = self._slot(tile, q)
            lines += [f"    let {p}_k{q} = {kr};", f"    let {p}_s{q} = {so};"]
            for i in range(4):
                j, t = f"{p}_j{q}_{i}", f"{p}{q}_{i}"
                lines.append(f"    let {j} = n0 + {xq} + {u(i)};")
                lines.append(f"    let {t}_ok = {j} < {u(npq)};")
                lines.append(f"    let {t}_img = {j} / {u(pq)};")
                lines.append(f"    let {t}_pq = {j} % {u(pq)};")
                lines.append(f"    let {t}_h = i32(({t}_pq / {u(cs.q)}) * {u(cs.sh)}) - {cs.pt}i;")
                lines.append(f"    let {t}_w = i32(({t}_pq % {u(cs.q)}) * {u(cs.sw)}) - {cs.pl}i;")
                # Element offset of (img, group's first channel, 0, 0); z is the group.
                lines.append(f"    let {t}_o = {addr(self.x.offset, [(f'{t}_img', chw), ('z', cs.cg * cs.h * cs.w)])};")
        return lines

    def load(self, tile: Tile, k0: str) -> list[str]:
        cs, p, binds = self.cs, self.prefix, self.binds
        rs, kk_size = cs.r * cs.s, cs.cg * cs.r * cs.s
        # Which bounds checks the shape can need (padding or a tail the last output row reaches past).
        h_lo, w_lo = cs.pt > 0, cs.pl > 0
        h_hi = (cs.p - 1) * cs.sh - cs.pt + (cs.r - 1) * cs.dh >= cs.h
        w_hi = (cs.q - 1) * cs.sw - cs.pl + (cs.s - 1) * cs.dw >= cs.w
        lines = []
        for q in range(self.quads(tile)):
            reg, kk = f"{p}r{q}", f"{p}gk{q}"
            lines.append(f"        {reg} = vec4<f32>(0.0);")
            lines.append(f"        let {kk} = {k0} + {p}_k{q};")
            ind = "        "
            if kk_size % tile.bk:
                lines.append(f"        if ({kk} < {u(kk_size)}) {{")
                ind = "            "
            c = kk if rs == 1 else f"({kk} / {u(rs)})"
            rsv = "0u" if rs == 1 else f"({kk} % {u(rs)})"
            r = "0u" if cs.r == 1 else (rsv if cs.s == 1 else f"({rsv} / {u(cs.s)})")
            s = "0u" if cs.s == 1 else (rsv if cs.r == 1 else f"({rsv} % {u(cs.s)})")
            lines.append(f"{ind}let {p}dh{q} = i32({r} * {u(cs.dh)});")
            lines.append(f"{ind}let {p}dw{q} = i32({s} * {u(cs.dw)});")
            lines.append(f"{ind}let {p}co{q} = {c} * {u(cs.h * cs.w)};")
            for i, comp in enumerate("xyzw"):
                t = f"{p}{q}_{i}"
                hh, ww = f"{p}h{q}_{i}", f"{p}w{q}_{i}"
                lines.append(f"{ind}let {hh} = {t}_h + {p}dh{q};")
                lines.append(f"{ind}let {ww} = {t}_w + {p}dw{q};")
                conds = [f"{t}_ok"]
                if h_lo and h_hi:
                    conds.append(f"u32({hh}) < {u(cs.h)}")
                elif h_lo:
                    conds.append(f"{hh} >= 0i")
                elif h_hi:
                    conds.append(f"{hh} < {cs.h}i")
                if w_lo and w_hi:
                    conds.append(f"u32({ww}) < {u(cs.w)}")
                elif w_lo:
                    conds.append(f"{ww} >= 0i")
                elif w_hi:
                    conds.append(f"{ww} < {cs.w}i")
                idx = f"{t}_o + {p}co{q} + u32({hh}) * {u(cs.w)} + u32({ww})"
                lines.append(f"{ind}if ({' && '.join(conds)}) {{ {reg}.{comp} = {binds.scalar(self.x.handle, idx)}; }}")
            if kk_size % tile.bk:
                lines.append("        }")
        return lines

    def store(self, tile: Tile, smem: str, base: str) -> list[str]:
        return [f"        {smem}[{base} + {self.prefix}_s{q}] = {self.prefix}r{q};" for q in range(self.quads(tile))]


def _conv_shape(x: View, w: View, out: View, stride: tuple[int, int], pads: tuple[int, int, int, int],
                dilation: tuple[int, int], groups: int) -> ConvShape:
    for name, v in (("x", x), ("w", w), ("out", out)):
        if len(v.shape) != 4:
            raise ValueError(f"conv: {name} must be 4-D, got shape {v.shape}")
        if not v.is_contiguous():
            raise ValueError(f"conv: {name} must be a contiguous view, got strides {v.strides} for shape {v.shape}")
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = stride, pads, dilation
    if groups < 1 or c % groups or k % groups or cg != c // groups:
        raise ValueError(f"conv: groups={groups} does not fit input channels {c}, filter {w.shape}")
    if min(sh, sw, dh, dw) < 1 or min(pt, pl, pb, pr) < 0:
        raise ValueError(f"conv: bad stride {stride}, dilation {dilation} or pads {pads}")
    p = (h + pt + pb - dh * (r - 1) - 1) // sh + 1
    q = (wd + pl + pr - dw * (s - 1) - 1) // sw + 1
    if out.shape != (n, k, p, q):
        raise ValueError(f"conv: out shape {out.shape}, expected {(n, k, p, q)}")
    return ConvShape(n, c, h, wd, k, cg, r, s, p, q, sh, sw, pt, pl, dh, dw, groups)


def record_conv(be: WgpuBackend, x: View, w: View, bias: View | None, out: View, stride: tuple[int, int],
                pads: tuple[int, int, int, int], dilation: tuple[int, int], groups: int,
                act: Expr | None = None, residual: View | None = None) -> list:
    """out = act(conv(x, w) + bias + residual): bias per output channel, residual (a residual connection) of
    out's shape, read in the epilogue of whichever kernel computes the conv."""
    types = require_float("conv", x=x, w=w, bias=bias, out=out, residual=residual)
    cs = _conv_shape(x, w, out, tuple(stride), tuple(pads), tuple(dilation), int(groups))
    if bias is not None and (len(bias.shape) != 1 or bias.shape[0] != cs.k):
        raise ValueError(f"conv: bias must have shape ({cs.k},), got {bias.shape}")
    res3 = None
    if residual is not None:
        res3 = residual.merged((cs.n, cs.k, cs.p * cs.q)) if residual.shape == out.shape else None
        if res3 is None:
            raise ValueError(f"conv: residual must have the output's shape {out.shape} with P and Q mergeable "
                             f"strides, got shape {residual.shape} strides {residual.strides}")
    check_operands(be, out, x=x, w=w, bias=bias, residual=residual)
    if out.size == 0:
        return []
    if x.size == 0 or w.size == 0:
        raise ValueError("conv: empty input or filter with a non-empty output")

    if (groups == 1 and cs.r == cs.s == 1 and (cs.sh, cs.sw) == (1, 1) and not any(pads)):
        hw = cs.h * cs.w
        a = View(w.handle, w.dtype, (cs.n, cs.k, cs.c), (0, cs.c, 1), w.offset)
        b = View(x.handle, x.dtype, (cs.n, cs.c, hw), (cs.c * hw, hw, 1), x.offset)
        o = View(out.handle, out.dtype, (cs.n, cs.k, hw), (cs.k * hw, hw, 1), out.offset)
        bv = None if bias is None else View(bias.handle, bias.dtype, (cs.n, cs.k, hw), (0, bias.strides[0], 0),
                                            bias.offset)
        return record_matmul(be, a, b, o, alpha=1.0, bias=bv, beta=1.0, act=act, residual=res3)
    if cs.cg == 1 and groups == cs.c:
        return _record_depthwise(be, cs, x, w, bias, out, act, types, res3)
    g = direct_geometry(be, cs)
    if g is not None:
        return _record_direct(be, cs, g, x, w, bias, out, act, types, res3)
    return _record_implicit_gemm(be, cs, x, w, bias, out, act, types, res3)


def _conv_epilogue(cs: ConvShape, out: View, bias: View | None, act: Expr | None, binds: Bindings,
                   guard: str | None, res3: View | None) -> Epilogue:
    """epi(acc, z = group, m = channel within the group, n = column (img, p, q))."""
    pq = cs.p * cs.q
    ep = Epilogue(addr(out.offset, [("img", cs.k * pq), ("z", cs.kg * pq), ("m", pq), ("pq", 1)]), act=act,
                  guard=guard, pre=[f"    let img = n / {u(pq)};", f"    let pq = n % {u(pq)};"])
    if bias is not None:
        ep.bias_index = addr(bias.offset, [("z", cs.kg * bias.strides[0]), ("m", bias.strides[0])])
        ep.bias_handle = bias.handle
    if res3 is not None:
        s0, s1, s2 = res3.strides
        ep.residual_index = addr(res3.offset, [("img", s0), ("z", cs.kg * s1), ("m", s1), ("pq", s2)])
        ep.residual_handle = res3.handle
    return ep


def _record_implicit_gemm(be: WgpuBackend, cs: ConvShape, x: View, w: View, bias: View | None, out: View,
                          act: Expr | None, types: dict[int, str], res3: View | None) -> list:
    m, ncols, kk = cs.kg, cs.n * cs.p * cs.q, cs.cg * cs.r * cs.s

    def make_a(binds: Bindings, tile: Tile) -> Loader:
        return strided_loader("a", tile.bm, binds, w.handle, w.offset, cs.kg * kk, kk, 1, m, kk, cs.groups)

    def make_b(binds: Bindings, tile: Tile) -> Loader:
        binds.add(x.handle, False)
        return Im2colLoader("b", tile.bn, cs, x, binds)

    def make_epilogue(binds: Bindings, guard_m: bool, guard_n: bool) -> Epilogue:
        for v in (bias, res3):
            if v is not None:
                binds.add(v.handle, False)
        conds = ([f"m >= {u(m)}"] if guard_m else []) + ([f"n >= {u(ncols)}"] if guard_n else [])
        return _conv_epilogue(cs, out, bias, act, binds, " || ".join(conds) or None, res3)

    notes = [f"implicit GEMM conv: x {(cs.n, cs.c, cs.h, cs.w)}, w {(cs.k, cs.cg, cs.r, cs.s)}, groups {cs.groups}, "
             f"stride {(cs.sh, cs.sw)}, pads top/left {(cs.pt, cs.pl)}, dilation {(cs.dh, cs.dw)} -> P x Q "
             f"{cs.p}x{cs.q}", "Z = group; M = output channels per group; N = batch*P*Q; K = Cg*R*S"]
    return mm.record_gemm_kernel(be, "conv_igemm", m, ncols, kk, cs.groups, out.handle, make_a, make_b,
                                 make_epilogue, notes, types=types)


def _per_image_epilogue(cs: ConvShape, x: View, w: View, bias: View | None, out: View, act: Expr | None,
                        types: dict[int, str], res3: View | None) -> tuple[Bindings, Epilogue]:
    """Bindings (x, w, bias, residual, out) and the epilogue of the kernels that compute whole images' outputs
    (depthwise, direct): epi(acc, z = image, m = channel, n = p*Q + q)."""
    binds = Bindings(out.handle, types=types)
    for v in (x, w, bias, res3):
        if v is not None:
            binds.add(v.handle, False)
    pq = cs.p * cs.q
    ep = Epilogue(addr(out.offset, [("z", cs.k * pq), ("m", pq), ("n", 1)]), act=act)
    if bias is not None:
        ep.bias_index = addr(bias.offset, [("m", bias.strides[0])])
        ep.bias_handle = bias.handle
    if res3 is not None:
        ep.residual_index = addr(res3.offset, list(zip("zmn", res3.strides, strict=True)))
        ep.residual_handle = res3.handle
    return binds, ep


def _record_depthwise(be: WgpuBackend, cs: ConvShape, x: View, w: View, bias: View | None, out: View,
                      act: Expr | None, types: dict[int, str], res3: View | None) -> list:
    binds, ep = _per_image_epilogue(cs, x, w, bias, out, act, types, res3)
    total = cs.n * cs.k * cs.p * cs.q
    groups = math.ceil(total / DEPTHWISE_WORKGROUP)
    grid = grid_1d(groups)
    header = "\n".join([
        f"// ember depthwise conv: x {(cs.n, cs.c, cs.h, cs.w)}, w {(cs.k, 1, cs.r, cs.s)} (multiplier "
        f"{cs.k // cs.c}), stride {(cs.sh, cs.sw)}, pads top/left {(cs.pt, cs.pl)}, dilation {(cs.dh, cs.dw)}",
        "// Bindings (group 0):", *binds.comment(),
        f"// Dispatch grid: {grid} = ceil({total} outputs / {DEPTHWISE_WORKGROUP}) workgroups spread over x, y"])
    x_idx = addr(x.offset, [("xc", cs.h * cs.w), ("hu", cs.w), ("wu", 1)])
    src = be.kernel_source(
        "conv_depthwise", HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(binds.declarations()),
        EPILOGUE=ep.function(binds), WORKGROUP=DEPTHWISE_WORKGROUP, TOTAL=u(total), P=u(cs.p), Q=u(cs.q),
        K=u(cs.k), C=u(cs.c), MULT=u(cs.k // cs.c), H=u(cs.h), W=u(cs.w), R=u(cs.r), S=u(cs.s), SH=u(cs.sh),
        SW=u(cs.sw), PT=f"{cs.pt}i", PL=f"{cs.pl}i", DH=u(cs.dh), DW=u(cs.dw),
        LOAD_X=binds.scalar(x.handle, x_idx), LOAD_W=binds.scalar(w.handle, f"{w.offset}u + wk + r * {u(cs.s)} + s"))
    return [be.dispatch(be.pipeline("conv_depthwise", src), binds.buffers(), grid, "conv_depthwise")]


# ---- direct convolution for few input channels and a large window (kernels/conv_direct.wgsl) ----------------
@dataclass(frozen=True)
class DirectGeometry:
    """Thread layout and workgroup-memory layout of conv_direct.wgsl for one conv shape."""

    rt: int  # output rows per thread (two row groups per warp)
    warps: int  # warps per workgroup, 8 output channels each
    ph: int  # patch rows a tile reads
    pw: int  # patch columns a tile reads
    phl: int  # words per column phase (columns with the same remainder modulo the stride)
    rstr: int  # words per patch row: SW phases, padded so the two row groups of a warp use different banks
    nj: int  # input values one thread loads per filter column

    @property
    def tp(self) -> int:
        return 2 * self.rt

    @property
    def kt(self) -> int:
        return 8 * self.warps

    @property
    def wstr(self) -> int:
        return self.kt + 4

    @classmethod
    def of(cls, cs: ConvShape, rt: int, warps: int) -> DirectGeometry:
        ph = (2 * rt - 1) * cs.sh + (cs.r - 1) * cs.dh + 1
        pw = (DIRECT_TQ - 1) * cs.sw + (cs.s - 1) * cs.dw + 1
        phl = -(-pw // cs.sw)
        # The warp's second row group reads rt*SH patch rows below the first: a row stride that puts it 16 banks
        # away makes the two half-warps' reads conflict-free.
        row_gap = rt * cs.sh
        rstr = next((r for r in range(cs.sw * phl, cs.sw * phl + 32) if row_gap * r % 32 == 16),
                    cs.sw * phl | 1)
        return cls(rt, warps, ph, pw, phl, rstr, (rt - 1) * cs.sh + (cs.r - 1) * cs.dh + 1)

    def smem_bytes(self, cs: ConvShape) -> int:
        return 4 * (self.ph * self.rstr + cs.r * cs.s * self.wstr)

    def grid(self, cs: ConvShape) -> tuple[int, int, int]:
        return (-(-cs.p // self.tp) * -(-cs.q // DIRECT_TQ), cs.k // self.kt, cs.n)


def direct_geometry(be: WgpuBackend, cs: ConvShape) -> DirectGeometry | None:
    """conv_direct.wgsl's layout for this conv, or None where it does not take it: it wants one group, a short
    K = C*R*S from a window of 9+ taps, output channels in whole warps, enough workgroups to fill a big GPU,
    and a patch + filter slice that fit the adapter's workgroup memory."""
    if not settings.DIRECT_CONV.get() or cs.groups != 1 or cs.k % 8:
        return None
    if cs.c * cs.r * cs.s > DIRECT_MAX_CRS or cs.r * cs.s < DIRECT_MIN_RS:
        return None
    # 4 rows a thread and 4 warps (32 channels) a workgroup. ResNet's stem on an H200 (bench_direct.py): batch 8
    # 59 us (implicit GEMM 87), batch 1 12 us (18).
    warps = 4 if cs.k % 32 == 0 else (2 if cs.k % 16 == 0 else 1)
    g = DirectGeometry.of(cs, 4, warps)
    grid = g.grid(cs)
    limit = int(be.limits.get("max-compute-workgroup-storage-size", 16384))
    if max(grid) > 65535 or g.smem_bytes(cs) > limit:
        return None
    # A grid that does not fill a big GPU once (the H200 has 132 SMs) gains nothing in whole runs: MobileNetV2's
    # stem at batch 1, 98 workgroups, per-round wall ratio 0.997 (0.990-1.002) against implicit GEMM; ResNet-18's
    # at batch 1, 196 workgroups, 0.983 (0.981-0.986), and at batch 8 (1568) GPU time 0.865 vs 0.889 ms
    # (bench_wgpu_ab.py, bench_models.py; BENCHMARKS.md "Models, session 6").
    if math.prod(grid) < DIRECT_MIN_WORKGROUPS:
        return None
    return g


def _direct_body(cs: ConvShape, g: DirectGeometry, binds: Bindings, x: View, w: View) -> dict[str, str]:
    rs, crs, hw, threads = cs.r * cs.s, cs.c * cs.r * cs.s, cs.h * cs.w, 32 * g.warps
    i1, i2, i3 = " " * 8, " " * 12, " " * 16
    # Bounds checks the patch can need: padding, or a last tile reaching past the image.
    bounds = []
    if cs.pt > 0 or (-(-cs.p // g.tp) * g.tp - 1) * cs.sh - cs.pt + (cs.r - 1) * cs.dh >= cs.h:
        bounds.append(f"u32(ih) < {u(cs.h)}")
    if cs.pl > 0 or (-(-cs.q // DIRECT_TQ) * DIRECT_TQ - 1) * cs.sw - cs.pl + (cs.s - 1) * cs.dw >= cs.w:
        bounds.append(f"u32(iw) < {u(cs.w)}")
    x_load = binds.scalar(x.handle, addr(x.offset, [("xc", hw)]) + f" + u32(ih) * {u(cs.w)} + u32(iw)")
    # Each thread moves n_patch patch words and n_filter filter words a channel. They are loaded into registers
    # one channel ahead (the global loads are in flight while the products of the current channel run) and
    # stored to workgroup memory between two barriers.
    n_patch, n_filter = g.ph * g.pw, g.kt * rs

    def each(total: int, body: list[str], ind: str) -> list[str]:
        lines = []
        for i in range(-(-total // threads)):
            guard = (i + 1) * threads > total
            lines.append(f"{ind}{{")
            lines.append(f"{ind}    let e = lid + {u(i * threads)};")
            inner = [line.replace("{i}", str(i)) for line in body]
            if guard:
                lines.append(f"{ind}    if (e < {u(total)}) {{")
                lines += [f"{ind}        {line}" for line in inner]
                lines.append(f"{ind}    }}")
            else:
                lines += [f"{ind}    {line}" for line in inner]
            lines.append(f"{ind}}}")
        return lines

    patch_at = [f"let row = e / {u(g.pw)};", f"let col = e - row * {u(g.pw)};"]
    # The filter slice w[k0 .. k0+KT, c, :, :] is KT runs of R*S contiguous words: read along the runs and
    # store tap-major one word at a time (the products read whole vec4s).
    filter_at = [f"let k = e / {u(rs)};", f"let t = e - k * {u(rs)};"]

    def load(ch: str, ind: str) -> list[str]:
        get_x = f"if ({' && '.join(bounds)}) {{ pr{{i}} = {x_load}; }}" if bounds else f"pr{{i}} = {x_load};"
        w_load = binds.scalar(w.handle, addr(w.offset, [("(k0 + k)", crs), (ch, rs), ("t", 1)]))
        return ([f"{ind}let xc = img * {u(cs.c)} + {ch};"]
                + each(n_patch, [*patch_at, "let ih = h0 + i32(row);", "let iw = w0 + i32(col);", "pr{i} = 0.0;",
                                 get_x], ind)
                + each(n_filter, [*filter_at, f"wr{{i}} = {w_load};"], ind))

    store = (each(n_patch, [*patch_at, f"xs[row * {u(g.rstr)} + (col % {u(cs.sw)}) * {u(g.phl)} + col / {u(cs.sw)}]"
                                       " = pr{i};"], i2)
             + each(n_filter, [*filter_at, f"let wi = t * {u(g.wstr)} + k;", "ws[wi >> 2u][wi & 3u] = wr{i};"], i2))
    regs = ([f"    var pr{i}: f32;" for i in range(-(-n_patch // threads))]
            + [f"    var wr{i}: f32;" for i in range(-(-n_filter // threads))])
    # The filter columns kx run as a loop, the taps ky of one column unrolled. Fully unrolled (7x the code) the
    # kernel won alone but lost in whole models, where it starts with cold instruction caches: ResNet-18 batch 1
    # GPU 0.407 against 0.383 ms with implicit GEMM; with the loop 0.392 against 0.396, batch 8 0.865 vs 0.889.
    wq = g.wstr // 4
    compute = [f"{i1}for (var kx = 0u; kx < {u(cs.s)}; kx++) {{",
               f"{i2}let xo = row0 + ((kx * {u(cs.dw)}) % {u(cs.sw)}) * {u(g.phl)} + (kx * {u(cs.dw)}) / {u(cs.sw)};",
               f"{i2}let wo = w0i + kx * {u(wq)};"]
    compute += [f"{i2}let x{j} = xs[xo + {u(j * g.rstr)}];" for j in range(g.nj)]
    for ky in range(cs.r):
        compute.append(f"{i2}{{")
        compute.append(f"{i3}let wa = ws[wo + {u(ky * cs.s * wq)}];")
        compute.append(f"{i3}let wb = ws[wo + {u(ky * cs.s * wq + 1)}];")
        for i in range(g.rt):
            a = f"vec4<f32>(x{i * cs.sh + ky * cs.dh})"
            compute.append(f"{i3}acc{i}a = fma({a}, wa, acc{i}a);")
            compute.append(f"{i3}acc{i}b = fma({a}, wb, acc{i}b);")
        compute.append(f"{i2}}}")
    compute.append(f"{i1}}}")
    decls = [f"    var acc{i}{h} = vec4<f32>(0.0);" for i in range(g.rt) for h in "ab"] + regs
    out_store = [f"    let q = tile_q * {u(DIRECT_TQ)} + ql;",
                 f"    let p0 = tile_p * {u(g.tp)} + rg * {u(g.rt)};",
                 "    let m0 = k0 + cg * 8u;",
                 f"    if (q < {u(cs.q)}) {{"]
    for i in range(g.rt):
        out_store.append(f"        if (p0 + {u(i)} < {u(cs.p)}) {{")
        out_store.append(f"            let n = (p0 + {u(i)}) * {u(cs.q)} + q;")
        out_store += [f"            epi(acc{i}{'ab'[ch // 4]}[{ch % 4}], img, m0 + {u(ch)}, n);" for ch in range(8)]
        out_store.append("        }")
    out_store.append("    }")
    return {"LOAD_FIRST": "\n".join(load("0u", "    ")), "LOAD_NEXT": "\n".join(load("(c + 1u)", i2)),
            "STORE": "\n".join(store), "STORE_FIRST": "\n".join(line[4:] for line in store),
            "COMPUTE": "\n".join(compute), "DECLS": "\n".join(decls),
            "EPILOGUE_STORE": "\n".join(out_store), "ROW0": f"rg * {u(g.rt * cs.sh * g.rstr)} + ql"}


def _record_direct(be: WgpuBackend, cs: ConvShape, g: DirectGeometry, x: View, w: View, bias: View | None,
                   out: View, act: Expr | None, types: dict[int, str], res3: View | None) -> list:
    binds, ep = _per_image_epilogue(cs, x, w, bias, out, act, types, res3)
    grid = g.grid(cs)
    header = "\n".join([
        f"// ember direct conv: x {(cs.n, cs.c, cs.h, cs.w)}, w {(cs.k, cs.c, cs.r, cs.s)}, stride {(cs.sh, cs.sw)}, "
        f"pads top/left {(cs.pt, cs.pl)}, dilation {(cs.dh, cs.dw)} -> P x Q {cs.p}x{cs.q}",
        "// Bindings (group 0):", *binds.comment(),
        f"// Dispatch grid: {grid} = (ceil(P/{g.tp}) * ceil(Q/{DIRECT_TQ}) output tiles, K/{g.kt}, N), "
        f"{32 * g.warps} threads"])
    src = be.kernel_source(
        "conv_direct", HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(binds.declarations()),
        EPILOGUE=ep.function(binds), THREADS=32 * g.warps, KT=u(g.kt), TILES_Q=u(-(-cs.q // DIRECT_TQ)),
        TP=u(g.tp), TQ=u(DIRECT_TQ), SH=u(cs.sh), SW=u(cs.sw), PT=f"{cs.pt}i", PL=f"{cs.pl}i", C=u(cs.c),
        XS_SIZE=g.ph * g.rstr,
        WS_VEC4=cs.r * cs.s * g.wstr // 4, **_direct_body(cs, g, binds, x, w))
    return [be.dispatch(be.pipeline("conv_direct", src), binds.buffers(), grid, "conv_direct")]

"""Implicit-GEMM convolution: the generated tiled GEMM kernel (gemm.py), per group on grid z, with the B operand
gathered from the input on the fly (no im2col buffer):
out[n, g*Kg + m, p, q] = sum_kk W[g*Kg + m, kk] * X(kk; n, p, q), M = Kg, N = batch*P*Q, K = Cg*R*S; column
j -> (n, p, q) is decoded once per thread before the K loop, row kk -> (c, r, s) once per K tile.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ...core.expr import Expr
from ...core.view import View
from .conv_shape import ConvShape
from .gemm import record_gemm_kernel
from .shader.bindings import Bindings
from .shader.epilogue import Epilogue
from .shader.loaders import Loader, strided_loader
from .shader.tiles import Tile
from .shader.wgsl import addr, log2, u32

if TYPE_CHECKING:
    from .backend import WgpuBackend


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
        v = "lid" if q == 0 else f"(lid + {u32(q * tile.threads)})"
        kr, xq = f"({v} >> {u32(log2(bx4))})", f"(({v} & {u32(bx4 - 1)}) << 2u)"
        return xq, kr, f"{kr} * {u32(bx4)} + ({v} & {u32(bx4 - 1)})"

    def prologue(self, tile: Tile) -> list[str]:
        cs, p = self.cs, self.prefix
        pq, npq, chw = cs.p * cs.q, cs.n * cs.p * cs.q, cs.c * cs.h * cs.w
        lines = []
        for q in range(self.quads(tile)):
            xq, kr, so = self._slot(tile, q)
            lines += [f"    let {p}_k{q} = {kr};", f"    let {p}_s{q} = {so};"]
            for i in range(4):
                j, t = f"{p}_j{q}_{i}", f"{p}{q}_{i}"
                lines.append(f"    let {j} = n0 + {xq} + {u32(i)};")
                lines.append(f"    let {t}_ok = {j} < {u32(npq)};")
                lines.append(f"    let {t}_img = {j} / {u32(pq)};")
                lines.append(f"    let {t}_pq = {j} % {u32(pq)};")
                lines.append(f"    let {t}_h = i32(({t}_pq / {u32(cs.q)}) * {u32(cs.sh)}) - {cs.pt}i;")
                lines.append(f"    let {t}_w = i32(({t}_pq % {u32(cs.q)}) * {u32(cs.sw)}) - {cs.pl}i;")
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
                lines.append(f"        if ({kk} < {u32(kk_size)}) {{")
                ind = "            "
            c = kk if rs == 1 else f"({kk} / {u32(rs)})"
            rsv = "0u" if rs == 1 else f"({kk} % {u32(rs)})"
            r = "0u" if cs.r == 1 else (rsv if cs.s == 1 else f"({rsv} / {u32(cs.s)})")
            s = "0u" if cs.s == 1 else (rsv if cs.r == 1 else f"({rsv} % {u32(cs.s)})")
            lines.append(f"{ind}let {p}dh{q} = i32({r} * {u32(cs.dh)});")
            lines.append(f"{ind}let {p}dw{q} = i32({s} * {u32(cs.dw)});")
            lines.append(f"{ind}let {p}co{q} = {c} * {u32(cs.h * cs.w)};")
            for i, comp in enumerate("xyzw"):
                t = f"{p}{q}_{i}"
                hh, ww = f"{p}h{q}_{i}", f"{p}w{q}_{i}"
                lines.append(f"{ind}let {hh} = {t}_h + {p}dh{q};")
                lines.append(f"{ind}let {ww} = {t}_w + {p}dw{q};")
                conds = [f"{t}_ok"]
                if h_lo and h_hi:
                    conds.append(f"u32({hh}) < {u32(cs.h)}")
                elif h_lo:
                    conds.append(f"{hh} >= 0i")
                elif h_hi:
                    conds.append(f"{hh} < {cs.h}i")
                if w_lo and w_hi:
                    conds.append(f"u32({ww}) < {u32(cs.w)}")
                elif w_lo:
                    conds.append(f"{ww} >= 0i")
                elif w_hi:
                    conds.append(f"{ww} < {cs.w}i")
                idx = f"{t}_o + {p}co{q} + u32({hh}) * {u32(cs.w)} + u32({ww})"
                lines.append(f"{ind}if ({' && '.join(conds)}) {{ {reg}.{comp} = {binds.scalar(self.x.handle, idx)}; }}")
            if kk_size % tile.bk:
                lines.append("        }")
        return lines

    def store(self, tile: Tile, smem: str, base: str) -> list[str]:
        return [f"        {smem}[{base} + {self.prefix}_s{q}] = {self.prefix}r{q};" for q in range(self.quads(tile))]


def conv_epilogue(cs: ConvShape, out: View, bias: View | None, act: Expr | None, binds: Bindings,
                   guard: str | None, res3: View | None) -> Epilogue:
    """epi(acc, z = group, m = channel within the group, n = column (img, p, q))."""
    pq = cs.p * cs.q
    ep = Epilogue(addr(out.offset, [("img", cs.k * pq), ("z", cs.kg * pq), ("m", pq), ("pq", 1)]), act=act,
                  guard=guard, pre=[f"    let img = n / {u32(pq)};", f"    let pq = n % {u32(pq)};"])
    if bias is not None:
        ep.bias_index = addr(bias.offset, [("z", cs.kg * bias.strides[0]), ("m", bias.strides[0])])
        ep.bias_handle = bias.handle
    if res3 is not None:
        s0, s1, s2 = res3.strides
        ep.residual_index = addr(res3.offset, [("img", s0), ("z", cs.kg * s1), ("m", s1), ("pq", s2)])
        ep.residual_handle = res3.handle
    return ep


def record_implicit_gemm(be: WgpuBackend, cs: ConvShape, x: View, w: View, bias: View | None, out: View,
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
        conds = ([f"m >= {u32(m)}"] if guard_m else []) + ([f"n >= {u32(ncols)}"] if guard_n else [])
        return conv_epilogue(cs, out, bias, act, binds, " || ".join(conds) or None, res3)

    notes = [f"implicit GEMM conv: x {(cs.n, cs.c, cs.h, cs.w)}, w {(cs.k, cs.cg, cs.r, cs.s)}, groups {cs.groups}, "
             f"stride {(cs.sh, cs.sw)}, pads top/left {(cs.pt, cs.pl)}, dilation {(cs.dh, cs.dw)} -> P x Q "
             f"{cs.p}x{cs.q}", "Z = group; M = output channels per group; N = batch*P*Q; K = Cg*R*S"]
    return record_gemm_kernel(be, "conv_igemm", m, ncols, kk, cs.groups, out.handle, make_a, make_b,
                                 make_epilogue, notes, types=types)

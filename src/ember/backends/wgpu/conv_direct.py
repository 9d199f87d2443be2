"""Direct convolution for few input channels and a large window (an image model's stem): kernels/conv_direct.wgsl,
the input patch and the filter slice staged in workgroup memory (direct_geometry says which convs it takes)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ... import settings
from ...core.expr import Expr
from ...core.view import View
from .conv_shape import ConvShape, per_image_epilogue
from .shader.bindings import Bindings
from .shader.wgsl import PRELUDE, addr, u32

if TYPE_CHECKING:
    from .backend import WgpuBackend

# conv_direct.wgsl: lanes are 16 output columns x 2 groups of `rt` rows, warps own 8 output channels each; the
# filter slice in workgroup memory takes kt + 4 floats a tap (padding that spreads a warp's stores over banks).
DIRECT_TQ = 16
DIRECT_MAX_CRS, DIRECT_MIN_RS, DIRECT_MIN_WORKGROUPS = 64 * 4, 9, 128


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
    # 4 rows a thread and 4 warps (32 channels) a workgroup: the fastest layout on an image model's stem
    # (BENCHMARKS.md).
    warps = 4 if cs.k % 32 == 0 else (2 if cs.k % 16 == 0 else 1)
    g = DirectGeometry.of(cs, 4, warps)
    grid = g.grid(cs)
    limit = int(be.limits.get("max-compute-workgroup-storage-size", 16384))
    if max(grid) > 65535 or g.smem_bytes(cs) > limit:
        return None
    # A grid that does not fill a big GPU once (the H200 has 132 SMs) gains nothing in whole runs over implicit
    # GEMM; larger grids do (BENCHMARKS.md "Models, session 6").
    if math.prod(grid) < DIRECT_MIN_WORKGROUPS:
        return None
    return g


def _direct_body(cs: ConvShape, g: DirectGeometry, binds: Bindings, x: View, w: View) -> dict[str, str]:
    rs, crs, hw, threads = cs.r * cs.s, cs.c * cs.r * cs.s, cs.h * cs.w, 32 * g.warps
    i1, i2, i3 = " " * 8, " " * 12, " " * 16
    # Bounds checks the patch can need: padding, or a last tile reaching past the image.
    bounds = []
    if cs.pt > 0 or (-(-cs.p // g.tp) * g.tp - 1) * cs.sh - cs.pt + (cs.r - 1) * cs.dh >= cs.h:
        bounds.append(f"u32(ih) < {u32(cs.h)}")
    if cs.pl > 0 or (-(-cs.q // DIRECT_TQ) * DIRECT_TQ - 1) * cs.sw - cs.pl + (cs.s - 1) * cs.dw >= cs.w:
        bounds.append(f"u32(iw) < {u32(cs.w)}")
    x_load = binds.scalar(x.handle, addr(x.offset, [("xc", hw)]) + f" + u32(ih) * {u32(cs.w)} + u32(iw)")
    # Each thread moves n_patch patch words and n_filter filter words a channel. They are loaded into registers
    # one channel ahead (the global loads are in flight while the products of the current channel run) and
    # stored to workgroup memory between two barriers.
    n_patch, n_filter = g.ph * g.pw, g.kt * rs

    def each(total: int, body: list[str], ind: str) -> list[str]:
        lines = []
        for i in range(-(-total // threads)):
            guard = (i + 1) * threads > total
            lines.append(f"{ind}{{")
            lines.append(f"{ind}    let e = lid + {u32(i * threads)};")
            inner = [line.replace("{i}", str(i)) for line in body]
            if guard:
                lines.append(f"{ind}    if (e < {u32(total)}) {{")
                lines += [f"{ind}        {line}" for line in inner]
                lines.append(f"{ind}    }}")
            else:
                lines += [f"{ind}    {line}" for line in inner]
            lines.append(f"{ind}}}")
        return lines

    patch_at = [f"let row = e / {u32(g.pw)};", f"let col = e - row * {u32(g.pw)};"]
    # The filter slice w[k0 .. k0+KT, c, :, :] is KT runs of R*S contiguous words: read along the runs and
    # store tap-major one word at a time (the products read whole vec4s).
    filter_at = [f"let k = e / {u32(rs)};", f"let t = e - k * {u32(rs)};"]

    def load(ch: str, ind: str) -> list[str]:
        get_x = f"if ({' && '.join(bounds)}) {{ pr{{i}} = {x_load}; }}" if bounds else f"pr{{i}} = {x_load};"
        w_load = binds.scalar(w.handle, addr(w.offset, [("(k0 + k)", crs), (ch, rs), ("t", 1)]))
        return ([f"{ind}let xc = img * {u32(cs.c)} + {ch};"]
                + each(n_patch, [*patch_at, "let ih = h0 + i32(row);", "let iw = w0 + i32(col);", "pr{i} = 0.0;",
                                 get_x], ind)
                + each(n_filter, [*filter_at, f"wr{{i}} = {w_load};"], ind))

    store = (each(n_patch, [*patch_at, f"xs[row * {u32(g.rstr)} + (col % {u32(cs.sw)}) * {u32(g.phl)} + col / "
                                       f"{u32(cs.sw)}] = pr{{i}};"], i2)
             + each(n_filter, [*filter_at, f"let wi = t * {u32(g.wstr)} + k;", "ws[wi >> 2u][wi & 3u] = wr{i};"], i2))
    regs = ([f"    var pr{i}: f32;" for i in range(-(-n_patch // threads))]
            + [f"    var wr{i}: f32;" for i in range(-(-n_filter // threads))])
    # The filter columns kx run as a loop, the taps ky of one column unrolled. Fully unrolled (7x the code) the
    # kernel won alone but lost in whole models, where it starts with cold instruction caches; with the loop it
    # wins there too (BENCHMARKS.md).
    wq = g.wstr // 4
    compute = [f"{i1}for (var kx = 0u; kx < {u32(cs.s)}; kx++) {{",
               f"{i2}let xo = row0 + ((kx * {u32(cs.dw)}) % {u32(cs.sw)}) * {u32(g.phl)} + (kx * {u32(cs.dw)}) / "
               f"{u32(cs.sw)};",
               f"{i2}let wo = w0i + kx * {u32(wq)};"]
    compute += [f"{i2}let x{j} = xs[xo + {u32(j * g.rstr)}];" for j in range(g.nj)]
    for ky in range(cs.r):
        compute.append(f"{i2}{{")
        compute.append(f"{i3}let wa = ws[wo + {u32(ky * cs.s * wq)}];")
        compute.append(f"{i3}let wb = ws[wo + {u32(ky * cs.s * wq + 1)}];")
        for i in range(g.rt):
            a = f"vec4<f32>(x{i * cs.sh + ky * cs.dh})"
            compute.append(f"{i3}acc{i}a = fma({a}, wa, acc{i}a);")
            compute.append(f"{i3}acc{i}b = fma({a}, wb, acc{i}b);")
        compute.append(f"{i2}}}")
    compute.append(f"{i1}}}")
    decls = [f"    var acc{i}{h} = vec4<f32>(0.0);" for i in range(g.rt) for h in "ab"] + regs
    out_store = [f"    let q = tile_q * {u32(DIRECT_TQ)} + ql;",
                 f"    let p0 = tile_p * {u32(g.tp)} + rg * {u32(g.rt)};",
                 "    let m0 = k0 + cg * 8u;",
                 f"    if (q < {u32(cs.q)}) {{"]
    for i in range(g.rt):
        out_store.append(f"        if (p0 + {u32(i)} < {u32(cs.p)}) {{")
        out_store.append(f"            let n = (p0 + {u32(i)}) * {u32(cs.q)} + q;")
        out_store += [f"            epi(acc{i}{'ab'[ch // 4]}[{ch % 4}], img, m0 + {u32(ch)}, n);" for ch in range(8)]
        out_store.append("        }")
    out_store.append("    }")
    return {"LOAD_FIRST": "\n".join(load("0u", "    ")), "LOAD_NEXT": "\n".join(load("(c + 1u)", i2)),
            "STORE": "\n".join(store), "STORE_FIRST": "\n".join(line[4:] for line in store),
            "COMPUTE": "\n".join(compute), "DECLS": "\n".join(decls),
            "EPILOGUE_STORE": "\n".join(out_store), "ROW0": f"rg * {u32(g.rt * cs.sh * g.rstr)} + ql"}


def record_direct(be: WgpuBackend, cs: ConvShape, g: DirectGeometry, x: View, w: View, bias: View | None,
                   out: View, act: Expr | None, types: dict[int, str], res3: View | None) -> list:
    binds, ep = per_image_epilogue(cs, x, w, bias, out, act, types, res3)
    grid = g.grid(cs)
    header = "\n".join([
        f"// ember direct conv: x {(cs.n, cs.c, cs.h, cs.w)}, w {(cs.k, cs.c, cs.r, cs.s)}, stride {(cs.sh, cs.sw)}, "
        f"pads top/left {(cs.pt, cs.pl)}, dilation {(cs.dh, cs.dw)} -> P x Q {cs.p}x{cs.q}",
        "// Bindings (group 0):", *binds.comment(),
        f"// Dispatch grid: {grid} = (ceil(P/{g.tp}) * ceil(Q/{DIRECT_TQ}) output tiles, K/{g.kt}, N), "
        f"{32 * g.warps} threads"])
    src = be.kernel_source(
        "conv_direct", HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(binds.declarations()),
        EPILOGUE=ep.function(binds), THREADS=32 * g.warps, KT=u32(g.kt), TILES_Q=u32(-(-cs.q // DIRECT_TQ)),
        TP=u32(g.tp), TQ=u32(DIRECT_TQ), SH=u32(cs.sh), SW=u32(cs.sw), PT=f"{cs.pt}i", PL=f"{cs.pl}i", C=u32(cs.c),
        XS_SIZE=g.ph * g.rstr,
        WS_VEC4=cs.r * cs.s * g.wstr // 4, **_direct_body(cs, g, binds, x, w))
    return [be.dispatch(be.pipeline("conv_direct", src), binds.buffers(), grid, "conv_direct")]

"""Implicit-GEMM convolution on the GPU's matrix units (kernels/conv_sgmat.wgsl): f16 x and w, f32 accumulation.

out[n, g*Kg + m, p, q] = sum_kk W[g*Kg + m, kk] * X(kk; n, p, q): per group z (grid z, as conv_igemm.py),
A = W as [Kg, KK] (KK = Cg*R*S, row-major: the filter is already that matrix), B = im2col(x) as [KK, N*P*Q],
gathered on the fly. The structure is matmul_sgmat_staged.py's single-buffered kernel: per K block of BK a
workgroup copies the A block (BM x BK: 16-byte chunks where KK and w's offset are multiples of 8, else scalar
loads) and the gathered B block (BK x BN: each invocation owns 4 consecutive output pixels, their (n, p, q)
decoded once before the K loop, and decodes (c, r, s) once per row it loads, as conv_igemm's loader does) into
workgroup arrays; the subgroups then multiply from those arrays with staged's own primitives (native
subgroupMatrixLoad / MultiplyAccumulate / Store, or the emulated ones over virtual subgroups; staged._compute,
_matrix_decls, _finish). K need not be a multiple of BK: A and B rows past KK are staged as zeros. Rows past Kg
load clamped rows, columns past N*P*Q zeros; both are masked at the store (per tile, and per element where Kg
or N*P*Q is not a multiple of the config's tile).

plan_conv_sgmat decides: EMBER_MATRIX=emulate (the emulated variant: lavapipe CI tests the indexing), "on" with
an f16 -> f32 config in be.matrix_configs (native), "auto" native only for convs of at least AUTO_MIN_VOLUME
multiply-adds (None for now: it lost on the GPU); float16 x and w, f16 or f32 out; one group, or groups
of at least one tile of output channels (depthwise stays on conv_depthwise.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import settings
from ...core.expr import Expr
from ...core.view import View
from . import matmul_sgmat as sgmat
from . import matmul_sgmat_staged as staged
from .conv_igemm import conv_epilogue
from .conv_shape import ConvShape
from .program import grid_1d
from .sgmat_text import lane_preamble
from .shader.bindings import Bindings
from .shader.wgsl import PRELUDE, u32

if TYPE_CHECKING:
    from .backend import WgpuBackend
    from .runtime import MatrixConfig

StagedParams = staged.StagedParams
VEC = staged.VEC  # f16 per 16-byte chunk of A
COLS = 4  # consecutive output pixels (B columns) an invocation gathers per row: one (c, r, s) decode for 4 loads
# Single-buffered BK = 32, the staged kernel's best at 4096^3 on the H200 (its STAGED_CHOICES), preferred first;
# the double-buffered ones are left out (one code path; a sweep on the GPU may add them back).
CHOICES: tuple[StagedParams, ...] = (
    StagedParams(2, 2, 4, 4, 32, False, 8),  # 128 x 128
    StagedParams(2, 4, 4, 4, 32, False, 8),  # 128 x 256 over 8 subgroups
    StagedParams(2, 2, 2, 4, 32, False, 8),  # 64 x 128
    StagedParams(2, 2, 2, 2, 32, False, 8),  # 64 x 64
    StagedParams(2, 2, 1, 2, 32, False, 8),  # 32 x 64
    StagedParams(2, 2, 2, 1, 32, False, 8),  # 64 x 32
    StagedParams(2, 2, 1, 1, 32, False, 8),  # 32 x 32
)
# "auto": M * N * K * groups multiply-adds at least this, native only; None: auto never takes it. Measured on the
# GPU (BENCHMARKS.md, session 17) the kernel loses to the existing conv kernels at every ResNet-18 size, batch 1
# and 8 (its im2col gather is scalar and it has no split K for the few-column convs), so auto leaves it until a
# measured crossover exists; EMBER_MATRIX=on still takes it.
AUTO_MIN_VOLUME: int | None = None
LABEL_NATIVE = "conv.subgroup_matrix"
LABEL_EMULATED = "conv.subgroup_matrix_emulated"


@dataclass(frozen=True)
class ConvSgmatChoice:
    """What plan_conv_sgmat decided: the matrix variant (sgmat.SgmatChoice; its tm / tn are p's), the block shape
    and whether A is copied in 16-byte chunks."""

    c: sgmat.SgmatChoice
    p: StagedParams
    wide_a: bool

    @property
    def label(self) -> str:
        return LABEL_NATIVE if self.c.native else LABEL_EMULATED


# ---- planning -----------------------------------------------------------------------------------------------------
def gather_fits(p: StagedParams, cfg: MatrixConfig, threads: int) -> bool:
    """B's gather layout: BN a multiple of COLS and BN / COLS column groups dividing the invocations (each one's
    pixels fixed over its rows)."""
    bn = p.block(cfg)[1]
    return bn % COLS == 0 and threads % (bn // COLS) == 0


def choose(m: int, n: int, z: int, cfg: MatrixConfig, choices: list[StagedParams]) -> StagedParams | None:
    """As matmul_sgmat.choose_tiles: the first choice giving ENOUGH_WORKGROUPS within MAX_WASTE of the padded
    block, failing that the one giving the most workgroups (the earlier on ties); any BK (the tail is zeros)."""
    best: tuple[int, StagedParams] | None = None
    for p in choices:
        bm, bn = p.block(cfg)
        gm, gn = -(-m // bm), -(-n // bn)
        if gm * bm * gn * bn / (m * n) - 1.0 > sgmat.MAX_WASTE and p != choices[-1]:
            continue
        groups = z * gm * gn
        if groups >= sgmat.ENOUGH_WORKGROUPS:
            return p
        if best is None or groups > best[0]:
            best = (groups, p)
    return None if best is None else best[1]


def plan_conv_sgmat(be: WgpuBackend | Any, cs: ConvShape, x: View, w: View, out: View,
                    types: dict[Any, str]) -> ConvSgmatChoice | None:
    """The matrix-unit kernel for this conv, or None: record_conv's other kernels."""
    mode = settings.MATRIX.get()
    if mode == "off" or "shader-f16" not in getattr(be, "features", ()):
        return None
    if mode == "emulate":
        cfg, native = sgmat.EMULATED_CONFIG, False
    else:
        cfg, native = sgmat._f16_f32_config(be), True
        if cfg is None:
            return None
    if (np.dtype(x.dtype) != np.float16 or np.dtype(w.dtype) != np.float16
            or np.dtype(out.dtype) not in (np.float16, np.float32)):
        return None
    if types.get(x.handle) != "f16" or types.get(w.handle) != "f16":  # a buffer shared with another dtype's view
        return None
    if cs.groups > 1 and (cs.cg == 1 or cs.kg < cfg.m):  # depthwise, or groups too narrow for one tile row
        return None
    m, ncols, kk = cs.kg, cs.n * cs.p * cs.q, cs.cg * cs.r * cs.s
    if x.offset + x.size >= 2**31 or w.offset + w.size >= 2**31:  # the gather's offsets are i32
        return None
    if mode == "auto" and (AUTO_MIN_VOLUME is None or m * ncols * kk * cs.groups < AUTO_MIN_VOLUME):
        return None
    subgroup, biggest = sgmat.EMULATED_SUBGROUP, None
    if native:
        measured = sgmat.subgroup_size(be, cfg)
        if measured is None:
            return None
        subgroup, biggest = measured, sgmat._max_subgroup_size(be)
    limits = dict(getattr(be, "limits", None) or {})
    ok = [p for p in CHOICES if not p.double and p.bk % cfg.k == 0 and p.bk % VEC == 0
          and staged.usable(p, cfg, False, subgroup, native, limits, biggest)
          and gather_fits(p, cfg, p.subgroups * subgroup)]
    p = choose(m, ncols, cs.groups, cfg, ok)
    if p is None:
        return None
    wide_a = kk % VEC == 0 and w.offset % VEC == 0 and w.handle != out.handle
    return ConvSgmatChoice(sgmat.SgmatChoice(native, cfg, subgroup, p.tm, p.tn, False), p, wide_a)


# ---- the kernel text ----------------------------------------------------------------------------------------------
def _guard(cond: str | None, stmt: str, ind: str) -> str:
    return f"{ind}{stmt}" if cond is None else f"{ind}if ({cond}) {{ {stmt} }}"


class _Shape:
    """The numbers the generator reads, named once."""

    def __init__(self, cs: ConvShape, ch: ConvSgmatChoice) -> None:
        cfg, p = ch.c.cfg, ch.p
        self.m, self.n, self.kk = cs.kg, cs.n * cs.p * cs.q, cs.cg * cs.r * cs.s
        self.bm, self.bn = p.block(cfg)
        self.lda, self.ldb = p.strides(cfg, False)
        self.threads = p.subgroups * ch.c.subgroup
        self.nk = -(-self.kk // p.bk)
        self.k_tail = self.kk % p.bk != 0  # the last K block reaches past KK: its rows are zeros


def _a_lines(cs: ConvShape, ch: ConvSgmatChoice, binds: Bindings, w: View, sh: _Shape) -> tuple[list, list, list]:
    """(setup, load, store) of the A block: W rows brow.. (clamped to Kg - 1) x K block k0.., zeros past KK."""
    p, t = ch.p, sh.threads
    gz = cs.kg * sh.kk  # one group's filter rows
    setup, load, store = [], [], []
    if ch.wide_a:  # chunks of VEC: BK / VEC a row
        per_row, total = p.bk // VEC, sh.bm * p.bk // VEC
        for q in range(-(-total // t)):
            ci = f"(lid + {u32(q * t)})" if q else "lid"
            row, cc = f"{ci} / {u32(per_row)}", f"{ci} % {u32(per_row)}"
            zt = f"z * {u32(gz // VEC)} + " if cs.groups > 1 else ""
            base = f" + {u32(w.offset // VEC)}" if w.offset else ""
            setup += [f"    let ga_{q} = {zt}min(brow + {row}, {u32(sh.m - 1)}) * {u32(sh.kk // VEC)}{base} + {cc};",
                      f"    let ka_{q} = ({cc}) * {u32(VEC)};  // the chunk's first column in the block",
                      f"    let sa_{q} = {row} * {u32(sh.lda)} + ka_{q};",
                      f"    var ra_{q}: vec4<u32>;"]
            inside = None if (q + 1) * t <= total else f"{ci} < {u32(total)}"
            stmt = f"ra_{q} = {binds.var(w.handle)}[ga_{q} + s * {u32(per_row)}];"
            if sh.k_tail:
                stmt = f"ra_{q} = vec4<u32>(0u); if (k0 + ka_{q} < {u32(sh.kk)}) {{ {stmt} }}"
            load.append(_guard(inside, stmt, " " * 8))
            store.append(_guard(inside, f"put_a(sa_{q}, ra_{q});", " " * 8))
        return setup, load, store
    total = sh.bm * p.bk  # scalar: consecutive invocations along K
    for q in range(-(-total // t)):
        e = f"(lid + {u32(q * t)})" if q else "lid"
        row, kc = f"{e} / {u32(p.bk)}", f"{e} % {u32(p.bk)}"
        zt = f"z * {u32(gz)} + " if cs.groups > 1 else ""
        base = f" + {u32(w.offset)}" if w.offset else ""
        setup += [f"    let ga_{q} = {zt}min(brow + {row}, {u32(sh.m - 1)}) * {u32(sh.kk)}{base} + {kc};",
                  f"    let ka_{q} = {kc};",
                  f"    let sa_{q} = {row} * {u32(sh.lda)} + ka_{q};",
                  f"    var ra_{q}: f16;"]
        inside = None if (q + 1) * t <= total else f"{e} < {u32(total)}"
        stmt = f"ra_{q} = f16({binds.scalar(w.handle, f'ga_{q} + k0')});"
        if sh.k_tail:
            stmt = f"ra_{q} = 0.0h; if (k0 + ka_{q} < {u32(sh.kk)}) {{ {stmt} }}"
        load.append(_guard(inside, stmt, " " * 8))
        store.append(_guard(inside, f"sh_a[sa_{q}] = ra_{q};", " " * 8))
    return setup, load, store


def _b_lines(cs: ConvShape, ch: ConvSgmatChoice, binds: Bindings, x: View, sh: _Shape) -> tuple[list, list, list]:
    """(setup, load, store) of the gathered B block: this invocation's COLS pixels bcol + bc.. (decoded here),
    rows rb_q = rb0 + q * step of the K block (c, r, s decoded per block), zeros outside the input and past KK."""
    p, t, hw = ch.p, sh.threads, cs.h * cs.w
    groups_n = sh.bn // COLS
    step = t // groups_n
    pq = cs.p * cs.q
    setup = [f"    let bc = (lid % {u32(groups_n)}) * {u32(COLS)};  // this invocation's first column in the block",
             f"    let rb0 = lid / {u32(groups_n)};  // and its first row; rows rb0 + q * {step}"]
    for i in range(COLS):  # (n, p, q) of column i: in range, top-left input tap, element offset of that tap
        j = f"bj_{i}"
        setup += [f"    let {j} = bcol + bc + {u32(i)};",
                  f"    let bok_{i} = {j} < {u32(sh.n)};",
                  f"    let bpq_{i} = {j} % {u32(pq)};",
                  f"    let bh_{i} = i32((bpq_{i} / {u32(cs.q)}) * {u32(cs.sh)}) - {cs.pt}i;",
                  f"    let bw_{i} = i32((bpq_{i} % {u32(cs.q)}) * {u32(cs.sw)}) - {cs.pl}i;",
                  f"    let bo_{i} = i32(({j} / {u32(pq)}) * {u32(cs.c * hw)}"
                  + (f" + z * {u32(cs.cg * hw)}" if cs.groups > 1 else "") + (f" + {u32(x.offset)}" if x.offset else "")
                  + f") + bh_{i} * {cs.w}i + bw_{i};"]
    # Which bounds checks the shape can need (padding, or a last output row / column reaching past the input).
    h_lo, w_lo = cs.pt > 0, cs.pl > 0
    h_hi = (cs.p - 1) * cs.sh - cs.pt + (cs.r - 1) * cs.dh >= cs.h
    w_hi = (cs.q - 1) * cs.sw - cs.pl + (cs.s - 1) * cs.dw >= cs.w

    def bound(v: str, lo: bool, hi: bool, size: int) -> list[str]:
        if lo and hi:
            return [f"u32({v}) < {u32(size)}"]
        return [f"{v} >= 0i"] if lo else [f"{v} < {size}i"] if hi else []

    rs = cs.r * cs.s
    load, store = [], []
    ind, i2 = " " * 8, " " * 12
    for q in range(-(-p.bk // step)):
        row = f"rb0 + {u32(q * step)}" if q else "rb0"
        setup += [f"    let sb_{q} = ({row}) * {u32(sh.ldb)} + bc;", f"    var rb_{q}: vec4<f16>;"]
        conds = ([f"{row} < {u32(p.bk)}"] if p.bk % step else []) + ([f"k0 + {row} < {u32(sh.kk)}"] if sh.k_tail
                                                                      else [])
        kv = f"(k0 + {row})"
        c = kv if rs == 1 else f"{kv} / {u32(rs)}"
        rsv = "0u" if rs == 1 else f"{kv} % {u32(rs)}"
        r = "0u" if cs.r == 1 else (rsv if cs.s == 1 else f"({rsv}) / {u32(cs.s)}")
        fs = "0u" if cs.s == 1 else (rsv if cs.r == 1 else f"({rsv}) % {u32(cs.s)}")
        body = [f"let dh_{q} = i32({r})" + (f" * {cs.dh}i;" if cs.dh > 1 else ";"),
                f"let dw_{q} = i32({fs})" + (f" * {cs.dw}i;" if cs.dw > 1 else ";"),
                f"let ro_{q} = i32(({c}) * {u32(hw)}) + dh_{q} * {cs.w}i + dw_{q};  // (c, r, s)'s offset"]
        for i, comp in enumerate("xyzw"[:COLS]):
            ok = [f"bok_{i}"] + bound(f"bh_{i} + dh_{q}", h_lo, h_hi, cs.h) + bound(f"bw_{i} + dw_{q}", w_lo, w_hi,
                                                                                     cs.w)
            val = binds.scalar(x.handle, f"u32(bo_{i} + ro_{q})")
            body.append(f"if ({' && '.join(ok)}) {{ rb_{q}.{comp} = f16({val}); }}")
        load.append(f"{ind}rb_{q} = vec4<f16>();")
        if conds:
            load += [f"{ind}if ({' && '.join(conds)}) {{", *[i2 + b for b in body], f"{ind}}}"]
        else:
            load += [f"{ind}{{", *[i2 + b for b in body], f"{ind}}}"]
        puts = " ".join(f"sh_b[sb_{q} + {u32(i)}] = rb_{q}.{comp};" for i, comp in enumerate("xyzw"[:COLS]))
        store.append(_guard(f"{row} < {u32(p.bk)}" if p.bk % step else None, puts, ind))
    return setup, load, store


def _tile_setup(ch: ConvSgmatChoice, sh: _Shape) -> list[str]:
    """As staged's: this subgroup's tiles, their output origins and offsets in the arrays; the accumulators."""
    cfg, p = ch.c.cfg, ch.p
    lines = [f"    let sg_row = (sg / {u32(p.sgn)}) * {u32(p.tm * cfg.m)};  // this subgroup's rows / columns",
             f"    let sg_col = (sg % {u32(p.sgn)}) * {u32(p.tn * cfg.n)};"]
    for i in range(p.tm):
        lines += [f"    let row_{i} = brow + sg_row + {u32(i * cfg.m)};",
                  f"    let ta_{i} = (sg_row + {u32(i * cfg.m)}) * {u32(sh.lda)};"]
    for j in range(p.tn):
        lines += [f"    let col_{j} = bcol + sg_col + {u32(j * cfg.n)};",
                  f"    let tb_{j} = sg_col + {u32(j * cfg.n)};"]
    return lines + [f"    var acc_{i}_{j} = Acc();" for i in range(p.tm) for j in range(p.tn)]


def conv_sgmat_source(be: WgpuBackend, cs: ConvShape, ch: ConvSgmatChoice, x: View, w: View, bias: View | None,
                      out: View, act: Expr | None, types: dict[Any, str],
                      res3: View | None) -> tuple[str, tuple[int, int, int], Bindings]:
    """The WGSL, dispatch grid and bindings of the kernel for `ch`."""
    c, p, cfg = ch.c, ch.p, ch.c.cfg
    sh = _Shape(cs, ch)
    base = Bindings(out.handle, types=types)
    for v in (w, x, bias, res3):
        if v is not None:
            base.add(v.handle, False)
    binds = staged.WideBindings(base, {w.handle} if ch.wide_a else set(), c.native)
    conds = ([f"m >= {u32(sh.m)}"] if sh.m % cfg.m else []) + ([f"n >= {u32(sh.n)}"] if sh.n % cfg.n else [])
    ep = conv_epilogue(cs, out, bias, act, binds, " || ".join(conds) or None, res3)
    tiles_n = -(-sh.n // sh.bn)
    tiles = -(-sh.m // sh.bm) * tiles_n
    groups = cs.groups * tiles
    grid = grid_1d(groups)
    enables, lane_args, lanes = lane_preamble(c.native, c.subgroup, p.subgroups, lid=True)
    ea, eb = p.elements(cfg, False)
    variant = "native" if c.native else f"emulated, virtual subgroups of {c.subgroup}"
    header = "\n".join([
        f"// ember subgroup-matrix implicit-GEMM conv ({variant}): x {(cs.n, cs.c, cs.h, cs.w)}, w "
        f"{(cs.k, cs.cg, cs.r, cs.s)}, groups {cs.groups}, stride {(cs.sh, cs.sw)}, pads top/left {(cs.pt, cs.pl)}, "
        f"dilation {(cs.dh, cs.dw)} -> P x Q {cs.p}x{cs.q}",
        f"// Z={cs.groups} x (M={sh.m} x K={sh.kk}) @ (K x N={sh.n}); A {'16-byte chunks' if ch.wide_a else 'scalar'}"
        f", B gathered {COLS} pixels an invocation; {sh.nk} K blocks",
        f"// config {cfg.component} -> {cfg.result} {cfg.m} x {cfg.n} x {cfg.k}, {p.describe()}, block {sh.bm} x "
        f"{sh.bn}, subgroup size {c.subgroup}, {p.workgroup_bytes(cfg, False)} bytes of workgroup memory",
        "// Bindings (group 0):", *binds.comment(), f"// Dispatch grid: {grid} (grid_1d of {groups} workgroups)"])
    a_setup, a_load, a_store = _a_lines(cs, ch, binds, w, sh)
    b_setup, b_load, b_store = _b_lines(cs, ch, binds, x, sh)
    src = be.kernel_source(
        "conv_sgmat", ENABLES=enables, HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(binds.declarations()),
        MATRIX=staged._matrix_decls(c, p), SH_A=ea, SH_B=eb, SCRATCH=p.subgroups * cfg.m * cfg.n,
        PUT=staged._put_fns(c.native), EPILOGUE=ep.function(binds), WG_X=sh.threads, LANE_ARGS=lane_args,
        LANES=lanes, GROUPS=u32(groups), TILES=u32(tiles), TILES_N=u32(tiles_n), BM=u32(sh.bm), BN=u32(sh.bn),
        SETUP="\n".join(a_setup + b_setup + _tile_setup(ch, sh)), KBLOCKS=u32(sh.nk), BK=u32(p.bk),
        LOAD="\n".join(a_load + b_load), STORE="\n".join(a_store + b_store),
        COMPUTE="\n".join(staged._compute(c, p, " " * 8)), FINISH="\n".join(staged._finish(c, p, sh.m, sh.n)))
    return src, grid, binds


def record_conv_sgmat(be: WgpuBackend, cs: ConvShape, ch: ConvSgmatChoice, x: View, w: View, bias: View | None,
                      out: View, act: Expr | None, types: dict[Any, str], res3: View | None) -> list:
    src, grid, binds = conv_sgmat_source(be, cs, ch, x, w, bias, out, act, types, res3)
    return [be.dispatch(be.pipeline(ch.label, src), binds.buffers(), grid, ch.label)]

"""The subgroup-matrix matmul with A and B staged through workgroup memory (kernels/matmul_sgmat_staged.wgsl).

matmul_sgmat.py's direct kernel has every subgroup load its tiles from the storage buffers; here a workgroup copies
each K block of A and B into workgroup arrays first, with 16-byte loads (the operands bound as array<vec4<u32>>,
8 f16 a chunk, unpacked into f16 arrays since subgroupMatrixLoad needs an array of the component type), rows padded
by `pad` f16 against bank conflicts, optionally double-buffered (the next block's chunks in registers while the
subgroups multiply the current one: one barrier per K block). Every subgroup then loads its left / right tiles
from the arrays. StagedParams is one point of the space (subgroup layout, tiles per subgroup, BK, buffering,
padding); STAGED_CHOICES lists the candidates, preferred first, and choose_staged picks as choose_tiles does.

The emulated variant runs the same arrays, barriers and offsets, its multiply-accumulate reading the workgroup
arrays where the native load would; the lavapipe CI tests it. matmul_sgmat.record_sgmat takes this kernel where
plan_staged allows (and matmul_sgmat.STAGED), else its direct one. This module imports matmul_sgmat for types
only (that one imports this): the hook passes the chooser's constants and the adapter's largest subgroup size.

Eligible beyond plan_sgmat's rules: A and B have read-only bindings of their own (not read through `out`); K a
multiple of some choice's BK; VEC-aligned chunks (A: offset, row stride, K and, batched, the batch stride; B
row-major: offset, row stride, N, batch stride; B^T: offset, its row stride b.strides[2], K, batch stride); a
choice that fits the device's workgroup storage and invocations (and, native, whose subgroup count times the
measured size is a multiple of the largest one). Blocks past M or N load clamped rows / columns and are masked at
the store, as in the direct kernel.

Sweep on a GPU by forcing the candidates: `matmul_sgmat_staged.STAGED_CHOICES = (StagedParams(2, 4, 4, 2, 32),)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...core.view import View
from .program import grid_1d
from .runtime import MatrixConfig
from .sgmat_text import finish_lines, lane_preamble
from .shader.bindings import Binding, Bindings
from .shader.epilogue import Epilogue
from .shader.wgsl import PRELUDE, u32

if TYPE_CHECKING:
    from .backend import WgpuBackend
    from .matmul_sgmat import SgmatChoice

VEC = 8  # f16 a global load: one vec4<u32> chunk, 16 bytes
DEFAULT_WORKGROUP_STORAGE = 16384  # WebGPU's default max-compute-workgroup-storage-size, where be.limits lacks it
DEFAULT_INVOCATIONS = 256  # and its default max-compute-invocations-per-workgroup


@dataclass(frozen=True)
class StagedParams:
    """One staged kernel shape: SGM x SGN subgroups a workgroup, TM x TN accumulator tiles a subgroup, K blocks of
    BK, double buffering, `pad` f16 appended to every workgroup-array row (a multiple of VEC: rows stay 16-byte
    aligned, which cooperative-matrix loads want)."""

    sgm: int
    sgn: int
    tm: int
    tn: int
    bk: int
    double: bool = True
    pad: int = 8

    @property
    def subgroups(self) -> int:
        return self.sgm * self.sgn

    def block(self, cfg: MatrixConfig) -> tuple[int, int]:
        """(BM, BN): the output block of one workgroup."""
        return self.sgm * self.tm * cfg.m, self.sgn * self.tn * cfg.n

    def strides(self, cfg: MatrixConfig, b_col: bool) -> tuple[int, int]:
        """Row strides of the A and B workgroup arrays (B^T rows of BK where b_col, else B rows of BN)."""
        return self.bk + self.pad, (self.bk if b_col else self.block(cfg)[1]) + self.pad

    def elements(self, cfg: MatrixConfig, b_col: bool) -> tuple[int, int]:
        """f16 elements of one buffer of the A and B arrays."""
        bm, bn = self.block(cfg)
        lda, ldb = self.strides(cfg, b_col)
        return bm * lda, (bn if b_col else self.bk) * ldb

    def workgroup_bytes(self, cfg: MatrixConfig, b_col: bool) -> int:
        """Workgroup memory: the staging arrays (twice, double-buffered) and the epilogue's f32 tile a subgroup."""
        ea, eb = self.elements(cfg, b_col)
        staged = (2 if self.double else 1) * (-(-ea // 2) + -(-eb // 2)) * 4  # f16 arrays round up to words
        return staged + self.subgroups * cfg.m * cfg.n * 4

    def describe(self) -> str:
        return (f"{self.sgm}x{self.sgn} subgroups of {self.tm}x{self.tn} tiles, BK={self.bk} "
                f"{'double' if self.double else 'single'}-buffered, rows +{self.pad}")


# Preferred first (choose_staged takes the first giving enough workgroups), ordered by the H200 sweep in
# BENCHMARKS.md (session 16): single buffering beat double buffering at the large blocks (the double-buffered
# arrays halve the workgroups an SM holds), not at the small ones; BK = 32 beat 16 and 64, rows padded by 8 beat 0
# and 16. The comments
# give a 16 x 16 x 16 config's block and workgroup bytes (B row-major / B^T).
STAGED_CHOICES: tuple[StagedParams, ...] = (
    StagedParams(2, 2, 4, 4, 32, False, 8),  # 128 x 128, 23040 / 24576
    StagedParams(2, 4, 4, 4, 32, False, 8),  # 128 x 256 over 8 subgroups, 35328 / 38912
    StagedParams(2, 2, 2, 4, 32, False, 8),  # 64 x 128
    StagedParams(2, 2, 2, 2, 32, False, 8),  # 64 x 64
    StagedParams(2, 2, 1, 2, 32, True, 8),  # 32 x 64: double-buffered won here (BERT's 512 x 3072 x 768)
    StagedParams(2, 2, 2, 1, 32, False, 8),  # 64 x 32
    StagedParams(2, 2, 1, 1, 32, True, 8),  # 32 x 32, 14336 / 14336
    StagedParams(2, 2, 2, 2, 16, False, 8),  # 64 x 64 for K a multiple of 16 but not of 32
)


# ---- planning -----------------------------------------------------------------------------------------------------
def usable(p: StagedParams, cfg: MatrixConfig, b_col: bool, subgroup: int, native: bool, limits: dict[str, int],
           biggest: int | None) -> bool:
    """Whether choice `p` builds on this device: K steps of the config, 16-byte chunks, workgroup memory and size."""
    bn = p.block(cfg)[1]
    if p.bk % cfg.k or p.bk % VEC or p.pad % VEC or p.pad < 0 or (not b_col and bn % VEC):
        return False
    invocations = p.subgroups * subgroup
    if invocations > min(limits.get("max-compute-invocations-per-workgroup", DEFAULT_INVOCATIONS),
                         limits.get("max-compute-workgroup-size-x", DEFAULT_INVOCATIONS)):
        return False
    if native and biggest and invocations % biggest:  # else the pipeline may run fewer, larger subgroups
        return False
    return p.workgroup_bytes(cfg, b_col) <= limits.get("max-compute-workgroup-storage-size",
                                                       DEFAULT_WORKGROUP_STORAGE)


def choose_staged(m: int, n: int, k: int, nb: int, cfg: MatrixConfig,
                  choices: tuple[StagedParams, ...] | list[StagedParams], enough: int,
                  max_waste: float) -> StagedParams | None:
    """As matmul_sgmat.choose_tiles, among the choices whose BK divides K: the first giving `enough` workgroups
    (its ENOUGH_WORKGROUPS) within `max_waste` (MAX_WASTE), failing that the one giving the most workgroups; None
    where no BK divides K."""
    fit = [p for p in choices if k % p.bk == 0]
    best: tuple[int, StagedParams] | None = None
    for p in fit:
        bm, bn = p.block(cfg)
        gm, gn = -(-m // bm), -(-n // bn)
        if gm * bm * gn * bn / (m * n) - 1.0 > max_waste and p != fit[-1]:
            continue
        groups = nb * gm * gn
        if groups >= enough:
            return p
        if best is None or groups > best[0]:
            best = (groups, p)
    return None if best is None else best[1]


def aligned(a: View, b: View, b_col: bool) -> bool:
    """Every chunk a VEC-aligned run of VEC elements inside a row: offsets, strides and row lengths multiples."""
    nb, _, k = a.shape
    n = b.shape[2]
    a_terms = [a.offset, a.strides[1], k] + ([a.strides[0]] if nb > 1 else [])
    b_terms = [b.offset, b.strides[2] if b_col else b.strides[1], k if b_col else n]
    b_terms += [b.strides[0]] if nb > 1 else []
    return all(v % VEC == 0 for v in a_terms + b_terms)


def plan_staged(be: WgpuBackend | Any, a: View, b: View, out: View, binds: Bindings, c: SgmatChoice,
                biggest: int | None, enough: int, max_waste: float) -> StagedParams | None:
    """The staged kernel's choice for a product plan_sgmat took (views rebased to their bindings), or None: the
    direct kernel. `biggest`: the adapter's largest subgroup size (native), where known."""
    if a.handle == binds.out_handle or b.handle == binds.out_handle:  # read through the scalar `out` binding
        return None
    if not aligned(a, b, c.b_col_major):
        return None
    limits = dict(getattr(be, "limits", None) or {})
    ok = [p for p in STAGED_CHOICES if usable(p, c.cfg, c.b_col_major, c.subgroup, c.native, limits, biggest)]
    nb, m, k = a.shape
    return choose_staged(m, b.shape[2], k, nb, c.cfg, ok, enough, max_waste)


# ---- the A / B bindings as vec4<u32> --------------------------------------------------------------------------------
class WideBindings(Bindings):
    """`base`'s bindings (the same numbers and buffers) with the `wide` handles declared array<vec4<u32>>: the
    kernel's 16-byte chunk loads; an epilogue operand in one of those buffers reads its element out of a chunk."""

    def __init__(self, base: Bindings, wide: set[Any], native: bool) -> None:
        super().__init__(base.out_handle, base.windows, base.types)
        self.reads = base.reads
        self.out_type = base.out_type
        self.wide = wide
        self.native = native

    def _type(self, b: Binding) -> str:
        return "vec4<u32>" if b.handle in self.wide else super()._type(b)

    def scalar(self, handle: int, index: str) -> str:
        if handle == self.out_handle or handle not in self.wide:
            return super().scalar(handle, index)
        word = f"{self.reads[handle].var}[({index}) >> 3u][(({index}) >> 1u) & 3u]"
        return f"f32({unpack(word, self.native)}[({index}) & 1u])"

    def quad(self, handle: int, index: str) -> str:
        raise NotImplementedError("a wide (vec4<u32>) binding has no vec4<f32> loads")


def unpack(word: str, native: bool) -> str:
    """WGSL: the two f16 of u32 `word`, as vec2<f16> (native: Tint's bitcast) or vec2<f32> (naga has no bitcast
    between u32 and vec2<f16>; unpack2x16float is exact)."""
    return f"bitcast<vec2<f16>>({word})" if native else f"unpack2x16float({word})"


# ---- the kernel text ------------------------------------------------------------------------------------------------
def _put_fns(native: bool) -> str:
    """put_a / put_b: one chunk's 8 f16 into sh_a / sh_b at i..i + 8."""
    fns = []
    for arr in ("sh_a", "sh_b"):
        lines = [f"fn put_{arr[-1]}(i: u32, v: vec4<u32>) {{"]
        for w, comp in enumerate("xyzw"):
            half = unpack(f"v.{comp}", True) if native else f"vec2<f16>({unpack(f'v.{comp}', False)})"
            lines += [f"    let h{w} = {half};",
                      f"    {arr}[i + {u32(2 * w)}] = h{w}.x;",
                      f"    {arr}[i + {u32(2 * w + 1)}] = h{w}.y;"]
        fns.append("\n".join(lines + ["}"]))
    return "\n".join(fns)


def _matrix_decls(c: SgmatChoice, p: StagedParams) -> str:
    cfg, cmn = c.cfg, c.cfg.m * c.cfg.n
    if c.native:
        return "\n".join([
            f"alias Left = subgroup_matrix_left<{cfg.component}, {cfg.k}, {cfg.m}>;  // {cfg.m} rows x {cfg.k} columns",
            f"alias Right = subgroup_matrix_right<{cfg.component}, {cfg.n}, {cfg.k}>;  // {cfg.k} x {cfg.n}",
            f"alias Acc = subgroup_matrix_result<{cfg.result}, {cfg.n}, {cfg.m}>;  // {cfg.m} x {cfg.n}"])
    # As matmul_sgmat's emulated mma, reading the workgroup arrays at the native loads' offsets and strides.
    lda, ldb = p.strides(cfg, c.b_col_major)
    epl = -(-cmn // c.subgroup)
    ib = f"kk + c * {u32(ldb)}" if c.b_col_major else f"kk * {u32(ldb)} + c"
    guard = f"        if (e >= {u32(cmn)}) {{ break; }}\n" if cmn % c.subgroup else ""
    return f"""alias Acc = array<f32, {epl}>;  // this lane's elements of a {cfg.m} x {cfg.n} accumulator
fn mma(lane: u32, lo: u32, ro: u32, acc: ptr<function, Acc>) {{
    for (var j = 0u; j < {u32(epl)}; j++) {{
        let e = lane + j * {u32(c.subgroup)};
{guard}        let r = e / {u32(cfg.n)};
        let c = e % {u32(cfg.n)};
        var s = (*acc)[j];
        for (var kk = 0u; kk < {u32(cfg.k)}; kk++) {{
            s += f32(sh_a[lo + r * {u32(lda)} + kk]) * f32(sh_b[ro + {ib}]);
        }}
        (*acc)[j] = s;
    }}
}}
fn store_acc(lane: u32, base: u32, acc: ptr<function, Acc>) {{  // row-major, stride {cfg.n}
    for (var j = 0u; j < {u32(epl)}; j++) {{
        let e = lane + j * {u32(c.subgroup)};
{guard}        scratch[base + e] = (*acc)[j];
    }}
}}"""


@dataclass(frozen=True)
class _Operand:
    """How one operand's block is copied: `rows` x `per_row` chunks (chunk q of an invocation is number
    lid + q * threads), its vec4 index at K block 0 row_expr + col_expr, `step` vec4s further each K block, into
    rows of `ld` f16 in the workgroup array."""

    name: str  # "a" or "b"
    var: str  # the binding
    rows: int
    per_row: int
    ld: int
    step: int
    row_expr: str  # {r}: the block row
    col_expr: str  # {cc}: the chunk within the row

    def chunks(self) -> int:
        return self.rows * self.per_row


def _operands(c: SgmatChoice, p: StagedParams, binds: Bindings, a: View, b: View, m: int, n: int,
              nb: int) -> tuple[_Operand, _Operand]:
    cfg = c.cfg
    bm, bn = p.block(cfg)
    lda, ldb = p.strides(cfg, c.b_col_major)
    za = f"z * {u32(a.strides[0] // VEC)} + " if nb > 1 and a.strides[0] else ""
    zb = f"z * {u32(b.strides[0] // VEC)} + " if nb > 1 and b.strides[0] else ""
    a_base = f" + {u32(a.offset // VEC)}" if a.offset else ""
    b_base = f" + {u32(b.offset // VEC)}" if b.offset else ""
    kc = p.bk // VEC
    op_a = _Operand("a", binds.var(a.handle), bm, kc, lda, kc,
                    f"{za}min(brow + {{r}}, {u32(m - 1)}) * {u32(a.strides[1] // VEC)}{a_base}", "{cc}")
    if c.b_col_major:  # B^T's rows of K: like A, along N
        op_b = _Operand("b", binds.var(b.handle), bn, kc, ldb, kc,
                        f"{zb}min(bcol + {{r}}, {u32(n - 1)}) * {u32(b.strides[2] // VEC)}{b_base}", "{cc}")
    else:  # B's rows of N: BK rows of BN / VEC chunks, the last chunk column clamped to N's
        ldr = b.strides[1] // VEC
        op_b = _Operand("b", binds.var(b.handle), p.bk, bn // VEC, ldb, p.bk * ldr, f"{zb}{{r}} * {u32(ldr)}{b_base}",
                        f"min(bcol / {u32(VEC)} + {{cc}}, {u32(n // VEC - 1)})")
    return op_a, op_b


def _chunk_setup(op: _Operand, threads: int) -> list[str]:
    """Per chunk q of this invocation: its vec4 index at K block 0 (g{a,b}_q), workgroup-array index (s{a,b}_q)
    and register (r{a,b}_q)."""
    lines = []
    for q in range(-(-op.chunks() // threads)):
        ci = f"(lid + {u32(q * threads)})" if q else "lid"
        r, cc = f"{ci} / {u32(op.per_row)}", f"{ci} % {u32(op.per_row)}"
        lines += [f"    let g{op.name}_{q} = {op.row_expr.format(r=r)} + {op.col_expr.format(cc=cc)};",
                  f"    let s{op.name}_{q} = {r} * {u32(op.ld)} + {cc} * {u32(VEC)};",
                  f"    var r{op.name}_{q}: vec4<u32>;"]
    return lines


def _guarded(op: _Operand, q: int, threads: int, stmt: str, ind: str) -> str:
    """`stmt` for chunk q, inside a guard where the last round of chunks does not cover every invocation."""
    if (q + 1) * threads <= op.chunks():
        return f"{ind}{stmt}"
    ci = f"lid + {u32(q * threads)}" if q else "lid"
    return f"{ind}if ({ci} < {u32(op.chunks())}) {{ {stmt} }}"


def _load(ops: tuple[_Operand, _Operand], threads: int, s: str, ind: str) -> list[str]:
    """Global -> registers: every chunk of this invocation for K block `s`."""
    def at(op: _Operand, q: int) -> str:
        return f"g{op.name}_{q}" + ("" if s == "0u" else f" + ({s}) * {u32(op.step)}")

    return [_guarded(op, q, threads, f"r{op.name}_{q} = {op.var}[{at(op, q)}];", ind)
            for op in ops for q in range(-(-op.chunks() // threads))]


def _store(ops: tuple[_Operand, _Operand], threads: int, bufs: tuple[str, str], ind: str) -> list[str]:
    """Registers -> the workgroup arrays at element offsets `bufs` (the buffer's start)."""
    return [_guarded(op, q, threads, f"put_{op.name}({buf}s{op.name}_{q}, r{op.name}_{q});", ind)
            for op, buf in zip(ops, bufs, strict=True) for q in range(-(-op.chunks() // threads))]


def _compute(c: SgmatChoice, p: StagedParams, ind: str) -> list[str]:
    """One K block from the arrays at offsets abuf / bbuf: BK / CK steps of TM left, TN right loads and TM * TN
    multiply-accumulates."""
    cfg = c.cfg
    lda, ldb = p.strides(cfg, c.b_col_major)
    b_kk = "kk" if c.b_col_major else f"kk * {u32(ldb)}"
    i2 = ind + "    "
    lines = [f"{ind}for (var kk = 0u; kk < {u32(p.bk)}; kk += {u32(cfg.k)}) {{"]
    if c.native:
        col = "true" if c.b_col_major else "false"
        lines += [f"{i2}let left_{i} = subgroupMatrixLoad<Left>(&sh_a, abuf + ta_{i} + kk, false, {u32(lda)});"
                  for i in range(p.tm)]
        lines += [f"{i2}let right_{j} = subgroupMatrixLoad<Right>(&sh_b, bbuf + tb_{j} + {b_kk}, {col}, {u32(ldb)});"
                  for j in range(p.tn)]
        lines += [f"{i2}acc_{i}_{j} = subgroupMatrixMultiplyAccumulate(left_{i}, right_{j}, acc_{i}_{j});"
                  for i in range(p.tm) for j in range(p.tn)]
    else:
        lines += [f"{i2}let left_{i} = abuf + ta_{i} + kk;" for i in range(p.tm)]
        lines += [f"{i2}let right_{j} = bbuf + tb_{j} + {b_kk};" for j in range(p.tn)]
        lines += [f"{i2}mma(lane, left_{i}, right_{j}, &acc_{i}_{j});" for i in range(p.tm) for j in range(p.tn)]
    return lines + [f"{ind}}}"]


def _setup(c: SgmatChoice, p: StagedParams, ops: tuple[_Operand, _Operand], threads: int) -> list[str]:
    """Chunk addresses; per tile row i / column j its output origin and its offset in the arrays; accumulators."""
    cfg = c.cfg
    lda, ldb = p.strides(cfg, c.b_col_major)
    lines = _chunk_setup(ops[0], threads) + _chunk_setup(ops[1], threads)
    lines += [f"    let sg_row = (sg / {u32(p.sgn)}) * {u32(p.tm * cfg.m)};  // this subgroup's rows / columns "
              "in the block",
              f"    let sg_col = (sg % {u32(p.sgn)}) * {u32(p.tn * cfg.n)};"]
    for i in range(p.tm):
        lines += [f"    let row_{i} = brow + sg_row + {u32(i * cfg.m)};",
                  f"    let ta_{i} = (sg_row + {u32(i * cfg.m)}) * {u32(lda)};"]
    for j in range(p.tn):
        tb = f"(sg_col + {u32(j * cfg.n)}) * {u32(ldb)}" if c.b_col_major else f"sg_col + {u32(j * cfg.n)}"
        lines += [f"    let col_{j} = bcol + sg_col + {u32(j * cfg.n)};", f"    let tb_{j} = {tb};"]
    return lines + [f"    var acc_{i}_{j} = Acc();" for i in range(p.tm) for j in range(p.tn)]  # zero


def _main_loop(c: SgmatChoice, p: StagedParams, ops: tuple[_Operand, _Operand], threads: int,
               k: int) -> list[str]:
    nk = k // p.bk
    ea, eb = p.elements(c.cfg, c.b_col_major)
    ind, i2 = " " * 8, " " * 12
    if not p.double:
        return [f"    for (var s = 0u; s < {u32(nk)}; s++) {{",
                *_load(ops, threads, "s", ind),
                f"{ind}workgroupBarrier();  // every subgroup is done reading the previous block",
                *_store(ops, threads, ("", ""), ind),
                f"{ind}workgroupBarrier();",
                f"{ind}let abuf = 0u;",
                f"{ind}let bbuf = 0u;",
                *_compute(c, p, ind),
                "    }"]
    return ["    // K block 0 into buffer 0; then per block s: block s + 1 into registers, s's products from buffer",
            "    // s % 2, the registers into the other buffer (last read in block s - 1, before the last barrier).",
            *_load(ops, threads, "0u", "    "),
            *_store(ops, threads, ("", ""), "    "),
            "    workgroupBarrier();",
            f"    for (var s = 0u; s < {u32(nk)}; s++) {{",
            f"{ind}let more = s + 1u < {u32(nk)};  // uniform",
            f"{ind}if (more) {{",
            *_load(ops, threads, "s + 1u", i2),
            f"{ind}}}",
            f"{ind}let abuf = (s & 1u) * {u32(ea)};",
            f"{ind}let bbuf = (s & 1u) * {u32(eb)};",
            *_compute(c, p, ind),
            f"{ind}if (more) {{",
            f"{i2}let na = {u32(ea)} - abuf;",
            f"{i2}let nb = {u32(eb)} - bbuf;",
            *_store(ops, threads, ("na + ", "nb + "), i2),
            f"{ind}}}",
            f"{ind}workgroupBarrier();",
            "    }"]


def _finish(c: SgmatChoice, p: StagedParams, m: int, n: int) -> list[str]:
    return finish_lines(c.native, c.cfg, c.subgroup, [(i, j) for i in range(p.tm) for j in range(p.tn)], m, n)


def staged_source(be: WgpuBackend, a: View, b: View, out: View, ep: Epilogue, binds: Bindings,
                  c: SgmatChoice, p: StagedParams) -> tuple[str, tuple[int, int, int]]:
    """The WGSL of the staged kernel for `c` and `p` and its dispatch grid (bindings registered by the caller;
    A's and B's declared vec4<u32> here)."""
    nb, m, k = a.shape
    n = b.shape[2]
    cfg = c.cfg
    wide = WideBindings(binds, {a.handle, b.handle}, c.native)
    bm, bn = p.block(cfg)
    tiles_n = -(-n // bn)
    tiles = -(-m // bm) * tiles_n
    groups = nb * tiles
    grid = grid_1d(groups)
    threads = p.subgroups * c.subgroup
    enables, lane_args, lanes = lane_preamble(c.native, c.subgroup, p.subgroups, lid=True)
    ea, eb = p.elements(cfg, c.b_col_major)
    nbuf = 2 if p.double else 1
    variant = "native" if c.native else f"emulated, virtual subgroups of {c.subgroup}"
    header = "\n".join([
        f"// ember subgroup-matrix matmul, staged BK={p.bk} {'double' if p.double else 'single'}-buffered, rows "
        f"+{p.pad} ({variant}): Z={nb} x (M={m} x K={k}) @ (K x N={n}); A strides {a.strides}, B strides "
        f"{b.strides} ({'column' if c.b_col_major else 'row'}-major)",
        f"// config {cfg.component} -> {cfg.result} {cfg.m} x {cfg.n} x {cfg.k}, {p.sgm} x {p.sgn} subgroups of "
        f"{p.tm} x {p.tn} accumulator tiles, block {bm} x {bn}, subgroup size {c.subgroup}, "
        f"{p.workgroup_bytes(cfg, c.b_col_major)} bytes of workgroup memory",
        "// Bindings (group 0):", *wide.comment(), f"// Dispatch grid: {grid} (grid_1d of {groups} workgroups)"])
    ops = _operands(c, p, wide, a, b, m, n, nb)
    src = be.kernel_source(
        "matmul_sgmat_staged", ENABLES=enables, HEADER=header, PRELUDE=PRELUDE,
        BINDINGS="\n".join(wide.declarations()), MATRIX=_matrix_decls(c, p), SH_A=nbuf * ea, SH_B=nbuf * eb,
        SCRATCH=p.subgroups * cfg.m * cfg.n, PUT=_put_fns(c.native), EPILOGUE=ep.function(wide), WG_X=threads,
        LANE_ARGS=lane_args, LANES=lanes, GROUPS=u32(groups), TILES=u32(tiles), TILES_N=u32(tiles_n), BM=u32(bm),
        BN=u32(bn), SETUP="\n".join(_setup(c, p, ops, threads)), MAIN="\n".join(_main_loop(c, p, ops, threads, k)),
        FINISH="\n".join(_finish(c, p, m, n)))
    return src, grid


def record_staged(be: WgpuBackend, a: View, b: View, out: View, ep: Epilogue, binds: Bindings,
                  c: SgmatChoice, p: StagedParams) -> list:
    src, grid = staged_source(be, a, b, out, ep, binds, c, p)
    return [be.dispatch(be.pipeline(c.label, src), binds.buffers(), grid, c.label)]

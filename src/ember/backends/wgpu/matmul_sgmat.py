"""f16 matrix products on the GPU's matrix units: Dawn's `chromium_experimental_subgroup_matrix` (kernels/
matmul_sgmat.wgsl), and an emulated variant of the same kernel in plain WGSL.

The first version follows what measured fastest on an H200 (f16 GEMM 4096^3, f32 accumulation): a workgroup of
2 x 2 subgroups, each loading its tiles straight from the storage buffers (staging through workgroup memory, one
buffer and two barriers per K step, was no faster) and holding TM x TN accumulator tiles: 2 x 2 gave 54 TFLOP/s,
4 x 2 71, 2 x 4 75, 4 x 4 102. So the largest of TILE_CHOICES that still gives ENOUGH_WORKGROUPS, wasting at most
MAX_WASTE of the padded block on tiles past M or N (those load a clamped origin and are masked at the store).
With STAGED, record_sgmat takes matmul_sgmat_staged.py's kernel instead where that one is eligible (A and B through
workgroup memory with 16-byte loads, double-buffered; its own parameter list STAGED_CHOICES).

The emulated variant (EMBER_MATRIX=emulate) runs the same generator with the primitives written out over virtual
subgroups of EMULATED_SUBGROUP consecutive invocations and a virtual EMULATED_CONFIG: a "loaded" matrix is its
offset, and the multiply-accumulate reads the elements at the offsets and strides subgroupMatrixLoad would, each
lane owning (CM * CN) / 32 elements of every accumulator. Any adapter runs it (lavapipe in CI), so the tiling,
offsets, strides and the epilogue are tested on every commit; only the native primitives need a matrix GPU.

Eligible (plan_sgmat; anything else takes the tiled GEMM): EMBER_MATRIX not off; A and B float16, out float16 or
float32; compile-time sizes; M, N, K multiples of the config's; A row-major, B row- or column-major, no negative
strides. Native additionally needs an f16 -> f32 config in `be.matrix_configs` (Dawn's adapter) and a measured
subgroup size (kernels/subgroup_size.wgsl); "auto" only products of at least AUTO_MIN_VOLUME multiply-adds.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ... import settings
from ...core.view import View
from . import matmul_sgmat_staged as staged
from .program import grid_1d
from .runtime import MatrixConfig
from .sgmat_text import finish_lines, lane_preamble
from .shader.bindings import Bindings
from .shader.epilogue import Epilogue
from .shader.wgsl import PRELUDE, u32

if TYPE_CHECKING:
    from .backend import WgpuBackend

TILE_CHOICES = ((4, 4), (2, 4), (4, 2), (2, 2), (1, 2), (2, 1), (1, 1))  # (TM, TN), preferred first
ENOUGH_WORKGROUPS = 128  # about one per SM of a big GPU (132 on an H200): 1024^3 ran 52 TFLOP/s at 2x4, 34 at 4x4
MAX_WASTE = 0.25  # of the padded output block computed past M, N (the last choice is taken whatever it wastes)
AUTO_MIN_VOLUME = 2**32  # M * N * K * Z: smaller products lost to the tuned GEMM on BERT
SUBGROUPS = 4  # a workgroup of 2 x 2 subgroups
EMULATED_CONFIG = MatrixConfig("f16", "f32", 16, 16, 16)
EMULATED_SUBGROUP = 32  # virtual lanes, the same on every adapter
STAGED = True  # A and B through workgroup memory where matmul_sgmat_staged allows; False: the direct kernel always
LABEL_NATIVE = "matmul.subgroup_matrix"
LABEL_EMULATED = "matmul.subgroup_matrix_emulated"
_SIZE_KEY = "_sgmat_subgroup_size"  # the measured subgroup size, cached on the backend object


@dataclass(frozen=True)
class SgmatChoice:
    """What plan_sgmat decided: the variant, its config and subgroup size, the accumulator tiles per subgroup and
    how B is loaded (column-major: B^T is contiguous, b.strides[1] == 1)."""

    native: bool
    cfg: MatrixConfig
    subgroup: int
    tm: int
    tn: int
    b_col_major: bool

    @property
    def label(self) -> str:
        return LABEL_NATIVE if self.native else LABEL_EMULATED


# ---- planning ---------------------------------------------------------------------------------------------------
def choose_tiles(m: int, n: int, nb: int, cfg: MatrixConfig,
                 choices: tuple[tuple[int, int], ...] | None = None) -> tuple[int, int]:
    """The first (TM, TN) of `choices` giving >= ENOUGH_WORKGROUPS workgroups within MAX_WASTE; failing that, the
    one giving the most workgroups (the earlier, larger one on ties)."""
    choices = choices or TILE_CHOICES
    best: tuple[int, tuple[int, int]] | None = None
    for tm, tn in choices:
        bm, bn = 2 * tm * cfg.m, 2 * tn * cfg.n
        gm, gn = -(-m // bm), -(-n // bn)
        waste = gm * bm * gn * bn / (m * n) - 1.0
        if waste > MAX_WASTE and (tm, tn) != choices[-1]:
            continue
        groups = nb * gm * gn
        if groups >= ENOUGH_WORKGROUPS:
            return tm, tn
        if best is None or groups > best[0]:
            best = (groups, (tm, tn))
    assert best is not None
    return best[1]


def _f16_f32_config(be: Any) -> MatrixConfig | None:
    for cfg in getattr(be, "matrix_configs", ()) or ():
        if cfg.component == "f16" and cfg.result == "f32":
            return cfg
    return None


def _max_subgroup_size(be: Any) -> int | None:
    """The adapter's largest subgroup size, where the runtime says it (the workgroup's x size must be a multiple
    of it in a matrix kernel)."""
    value = getattr(be, "subgroup_max_size", None)
    if value is None:
        info = getattr(getattr(be, "adapter", None), "info", None) or {}
        value = next((info[k] for k in ("subgroup_max_size", "subgroupMaxSize") if k in info), None)
    return int(value) if value else None


def plan_sgmat(be: WgpuBackend, a: View, b: View, out: View, types: dict[Any, str],
               runtime_sizes: bool) -> SgmatChoice | None:
    """The subgroup-matrix kernel for out = a @ b (3-D views, rebased to their bindings), or None: the GEMM."""
    mode = settings.MATRIX.get()
    if mode == "off" or runtime_sizes or "shader-f16" not in getattr(be, "features", ()):
        return None
    if mode == "emulate":
        cfg, native = EMULATED_CONFIG, False
    else:
        cfg, native = _f16_f32_config(be), True
        if cfg is None:
            return None
    nb, m, k = a.shape
    n = b.shape[2]
    if (np.dtype(a.dtype) != np.float16 or np.dtype(b.dtype) != np.float16
            or np.dtype(out.dtype) not in (np.float16, np.float32)):
        return None
    if types.get(a.handle) != "f16" or types.get(b.handle) != "f16":  # a buffer shared with another dtype's view
        return None
    if m % cfg.m or n % cfg.n or k % cfg.k or min(m, n, k) == 0:
        return None
    if any(s < 0 for s in a.strides + b.strides) or a.strides[2] != 1 or a.strides[1] < k:
        return None
    if b.strides[2] == 1 and b.strides[1] >= n:
        col_major = False
    elif b.strides[1] == 1 and b.strides[2] >= k:
        col_major = True
    else:
        return None
    if mode == "auto" and m * n * k * nb < AUTO_MIN_VOLUME:
        return None
    subgroup = EMULATED_SUBGROUP
    if native:
        measured = subgroup_size(be, cfg)
        biggest = _max_subgroup_size(be)
        if measured is None or (biggest and (SUBGROUPS * measured) % biggest):
            return None
        subgroup = measured
    tm, tn = choose_tiles(m, n, nb, cfg)
    return SgmatChoice(native, cfg, subgroup, tm, tn, col_major)


# ---- the subgroup size a matrix pipeline runs at ---------------------------------------------------------------
def measure_subgroup_size(be: WgpuBackend, cfg: MatrixConfig | None, enables: str = "") -> int | None:
    """Run kernels/subgroup_size.wgsl once: the subgroup size its invocations saw, None where they disagree. With
    `cfg` the kernel names that config's result type, so it is built as a matrix pipeline."""
    touch = f"_ = subgroup_matrix_result<{cfg.result}, {cfg.n}, {cfg.m}>();" if cfg is not None else ""
    src = be.kernel_source("subgroup_size", ENABLES=enables, TOUCH=touch)
    handle = be.alloc(16)
    try:
        label = "matmul.subgroup_size"
        be.execute([be.dispatch(be.pipeline(label, src), [handle], (1, 1, 1), label)])
        words = np.zeros(4, np.uint32)
        be.copy_dtoh(words, handle)
    finally:
        be.free(handle)
    largest, smallest = int(words[0]), 0xFFFFFFFF - int(words[1])
    return largest if largest == smallest and largest > 0 else None


def subgroup_size(be: WgpuBackend, cfg: MatrixConfig) -> int | None:
    """The matrix pipelines' subgroup size, measured once per backend (Dawn's adapter info has none)."""
    if _SIZE_KEY not in be.__dict__:
        try:
            size = measure_subgroup_size(be, cfg, "enable subgroups;\nenable chromium_experimental_subgroup_matrix;")
        except Exception as e:  # a probe: an adapter that cannot run it keeps the GEMM
            warnings.warn(f"wgpu: measuring the subgroup-matrix subgroup size failed ({e}); using the tiled GEMM",
                          RuntimeWarning, stacklevel=2)
            size = None
        be.__dict__[_SIZE_KEY] = size
    return be.__dict__[_SIZE_KEY]


# ---- the kernel text ------------------------------------------------------------------------------------------
def _pairs(c: SgmatChoice) -> list[tuple[int, int]]:
    return [(i, j) for i in range(c.tm) for j in range(c.tn)]


def _matrix_decls(c: SgmatChoice, binds: Bindings, a: View, b: View) -> str:
    cfg, cmn = c.cfg, c.cfg.m * c.cfg.n
    if c.native:
        return "\n".join([
            f"alias Left = subgroup_matrix_left<{cfg.component}, {cfg.k}, {cfg.m}>;  // {cfg.m} rows x {cfg.k} columns",
            f"alias Right = subgroup_matrix_right<{cfg.component}, {cfg.n}, {cfg.k}>;  // {cfg.k} x {cfg.n}",
            f"alias Acc = subgroup_matrix_result<{cfg.result}, {cfg.n}, {cfg.m}>;  // {cfg.m} x {cfg.n}"])
    # Emulated: a loaded matrix is its offset (the load reads nothing); mma reads the elements subgroupMatrixLoad
    # would: left [r, kk] at lo + r * stride + kk (row-major), right [kk, c] at ro + kk * stride + c (row-major) or
    # ro + c * stride + kk (column-major). Lane `lane` owns elements e = lane + j * SG of each accumulator.
    epl = -(-cmn // c.subgroup)
    ib = f"kk + c * {u32(b.strides[2])}" if c.b_col_major else f"kk * {u32(b.strides[1])} + c"
    guard = f"        if (e >= {u32(cmn)}) {{ break; }}\n" if cmn % c.subgroup else ""
    return f"""alias Acc = array<f32, {epl}>;  // this lane's elements of a {cfg.m} x {cfg.n} accumulator
fn mma(lane: u32, lo: u32, ro: u32, acc: ptr<function, Acc>) {{
    for (var j = 0u; j < {u32(epl)}; j++) {{
        let e = lane + j * {u32(c.subgroup)};
{guard}        let r = e / {u32(cfg.n)};
        let c = e % {u32(cfg.n)};
        var s = (*acc)[j];
        for (var kk = 0u; kk < {u32(cfg.k)}; kk++) {{
            let ia = lo + r * {u32(a.strides[1])} + kk;
            let ib = ro + {ib};
            s += {binds.scalar(a.handle, "ia")} * {binds.scalar(b.handle, "ib")};
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


def _setup(c: SgmatChoice, a: View, b: View, m: int, n: int, nb: int) -> list[str]:
    """Per tile row i / column j: its origin, whether it is inside the output, and the element offset of its
    (clamped) origin in A / B at kb = 0; then the accumulators."""
    cfg = c.cfg
    za = f"z * {u32(a.strides[0])} + " if nb > 1 and a.strides[0] else ""
    zb = f"z * {u32(b.strides[0])} + " if nb > 1 and b.strides[0] else ""
    b_col = f" * {u32(b.strides[2])}" if c.b_col_major else ""  # B's element stride along n
    a_base = f" + {u32(a.offset)}" if a.offset else ""
    b_base = f" + {u32(b.offset)}" if b.offset else ""
    lines = []
    for i in range(c.tm):
        lines += [f"    let row_{i} = row0" + (f" + {u32(i * cfg.m)};" if i else ";"),
                  f"    let a_off_{i} = {za}min(row_{i}, {u32(m - cfg.m)}) * {u32(a.strides[1])}{a_base};"]
    for j in range(c.tn):
        lines += [f"    let col_{j} = col0" + (f" + {u32(j * cfg.n)};" if j else ";"),
                  f"    let b_off_{j} = {zb}min(col_{j}, {u32(n - cfg.n)}){b_col}{b_base};"]
    lines += [f"    var acc_{i}_{j} = Acc();" for i, j in _pairs(c)]  # zero
    return lines


def _step(c: SgmatChoice, binds: Bindings, a: View, b: View) -> list[str]:
    """One K step at kb: TM left loads, TN right loads, TM * TN multiply-accumulates."""
    b_kb = "kb" if c.b_col_major else f"kb * {u32(b.strides[1])}"
    ind = " " * 8
    if c.native:
        pa, pb = f"&{binds.var(a.handle)}", f"&{binds.var(b.handle)}"
        b_stride = u32(b.strides[2] if c.b_col_major else b.strides[1])
        col = "true" if c.b_col_major else "false"
        lines = [f"{ind}let left_{i} = subgroupMatrixLoad<Left>({pa}, a_off_{i} + kb, false, {u32(a.strides[1])});"
                 for i in range(c.tm)]
        lines += [f"{ind}let right_{j} = subgroupMatrixLoad<Right>({pb}, b_off_{j} + {b_kb}, {col}, {b_stride});"
                  for j in range(c.tn)]
        lines += [f"{ind}acc_{i}_{j} = subgroupMatrixMultiplyAccumulate(left_{i}, right_{j}, acc_{i}_{j});"
                  for i, j in _pairs(c)]
        return lines
    lines = [f"{ind}let left_{i} = a_off_{i} + kb;" for i in range(c.tm)]
    lines += [f"{ind}let right_{j} = b_off_{j} + {b_kb};" for j in range(c.tn)]
    lines += [f"{ind}mma(lane, left_{i}, right_{j}, &acc_{i}_{j});" for i, j in _pairs(c)]
    return lines


def _finish(c: SgmatChoice, m: int, n: int) -> list[str]:
    return finish_lines(c.native, c.cfg, c.subgroup, _pairs(c), m, n)


def sgmat_source(be: WgpuBackend, a: View, b: View, out: View, ep: Epilogue, binds: Bindings,
                 c: SgmatChoice) -> tuple[str, tuple[int, int, int]]:
    """The WGSL of the kernel for `c` and its dispatch grid (bindings registered by the caller)."""
    nb, m, k = a.shape
    n = b.shape[2]
    cfg = c.cfg
    bm, bn = 2 * c.tm * cfg.m, 2 * c.tn * cfg.n
    tiles_n = -(-n // bn)
    tiles = -(-m // bm) * tiles_n
    groups = nb * tiles
    grid = grid_1d(groups)
    enables, lane_args, lanes = lane_preamble(c.native, c.subgroup, SUBGROUPS, lid=False)
    variant = "native" if c.native else f"emulated, virtual subgroups of {c.subgroup}"
    header = "\n".join([
        f"// ember subgroup-matrix matmul ({variant}): Z={nb} x (M={m} x K={k}) @ (K x N={n}); A strides {a.strides}, "
        f"B strides {b.strides} ({'column' if c.b_col_major else 'row'}-major)",
        f"// config {cfg.component} -> {cfg.result} {cfg.m} x {cfg.n} x {cfg.k}, {c.tm} x {c.tn} accumulator tiles "
        f"per subgroup, block {bm} x {bn}, subgroup size {c.subgroup}",
        "// Bindings (group 0):", *binds.comment(), f"// Dispatch grid: {grid} (grid_1d of {groups} workgroups)"])
    src = be.kernel_source(
        "matmul_sgmat", ENABLES=enables, HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(binds.declarations()),
        MATRIX=_matrix_decls(c, binds, a, b), SCRATCH=SUBGROUPS * cfg.m * cfg.n, EPILOGUE=ep.function(binds),
        WG_X=SUBGROUPS * c.subgroup, LANE_ARGS=lane_args, LANES=lanes, GROUPS=u32(groups), TILES=u32(tiles),
        TILES_N=u32(tiles_n), BM=u32(bm), BN=u32(bn), SG_ROWS=u32(c.tm * cfg.m), SG_COLS=u32(c.tn * cfg.n),
        K=u32(k), CK=u32(cfg.k), SETUP="\n".join(_setup(c, a, b, m, n, nb)), STEP="\n".join(_step(c, binds, a, b)),
        FINISH="\n".join(_finish(c, m, n)))
    return src, grid


def record_sgmat(be: WgpuBackend, a: View, b: View, out: View, ep: Epilogue, binds: Bindings,
                 c: SgmatChoice) -> list:
    """The staged kernel (matmul_sgmat_staged.py) where STAGED and it is eligible, else the direct one."""
    if STAGED:
        biggest = _max_subgroup_size(be) if c.native else None
        p = staged.plan_staged(be, a, b, out, binds, c, biggest, ENOUGH_WORKGROUPS, MAX_WASTE)
        if p is not None:
            return staged.record_staged(be, a, b, out, ep, binds, c, p)
    src, grid = sgmat_source(be, a, b, out, ep, binds, c)
    return [be.dispatch(be.pipeline(c.label, src), binds.buffers(), grid, c.label)]


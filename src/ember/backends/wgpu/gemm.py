"""The generated register-blocked GEMM kernel, shared by matmul, implicit-GEMM conv and Winograd's products.

`GemmProblem` generates one kernel: a BM x BN output tile per workgroup, TM x TN outputs per thread in named vec4
accumulators, A stored transposed in workgroup memory so both operands are read as vec4, two workgroup-memory
stages plus an unconditional register prefetch (one barrier per K tile; see _k_tile for why unconditional),
optionally a warp-shaped thread layout and a K loop over pairs of tiles (Tile.warp / Tile.unroll2, the "huge"
tile's code shape). Operands are loaded in "quads" of four consecutive elements along their unit-stride dimension
(vec4 loads when aligned, four scalar loads otherwise) by a loader (shader/loaders.py; conv brings an
implicit-im2col one). Shapes and strides are baked in as constants, and every guard the shape needs (edge tiles,
partial vec4s) is emitted, so every index is in range: the module can be trusted. With runtime sizes (`rt`, a
shader/lifted.py Sizes) M, Z and the strides and offsets that move with them come from a uniform array instead,
the grid is linear and its workgroups past the problem's tiles return, and M is always guarded.

`record_gemm_kernel` records it with a plan (tile, K splits) from the autotuner (plan_gemm's heuristic by
default): when the output has too few tiles to fill the GPU, K is split into partial sums in a buffer of the
kernel's own, then kernels/splitk_reduce.wgsl adds them and applies the epilogue.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import autotune
from .program import WORKGROUPS_PER_DIM, grid_1d
from .shader import tiles
from .shader.bindings import Bindings
from .shader.epilogue import Epilogue
from .shader.lifted import Sizes, u32
from .shader.loaders import Loader
from .shader.tiles import Tile
from .shader.wgsl import PRELUDE, log2

if TYPE_CHECKING:
    from .backend import WgpuBackend


@dataclass
class GemmProblem:
    """One generated tiled kernel: Z independent (M x K) @ (K x N) products (Z = batch or group).

    With splits > 1 the workgroup z index is split * Z + z: split s sums K tiles [s * per, (s + 1) * per) and the
    epilogue receives that combined index (a partial-sum epilogue; see record_gemm_kernel).
    """

    name: str
    tile: Tile
    m: int
    n: int
    k: int
    z: int
    a: Loader
    b: Loader
    epilogue: Epilogue
    binds: Bindings
    notes: list[str] = field(default_factory=list)
    splits: int = 1
    rt: Sizes | None = None  # runtime sizes: m and z (and the operands' strides) are Lifted

    def grid(self) -> tuple[tuple[int, int, int], bool]:
        tn, tm, zs = math.ceil(self.n / self.tile.bn), math.ceil(self.m / self.tile.bm), self.z * self.splits
        if max(tn, tm, zs) <= WORKGROUPS_PER_DIM and self.rt is None:
            return (tn, tm, zs), False
        return grid_1d(tn * tm * zs), True

    def source(self) -> str:
        t = self.tile
        (gx, gy, gz), linear = self.grid()
        tn, tm, zs = math.ceil(self.n / t.bn), math.ceil(self.m / t.bm), self.z * self.splits
        rt = self.rt
        nt = math.ceil(self.k / t.bk)
        per = math.ceil(nt / self.splits)  # K tiles per split
        assert math.ceil(nt / per) == self.splits, (nt, per, self.splits)
        sa, sb = t.bk * t.bm // 4, t.bk * t.bn // 4  # vec4s per stage
        zdesc = "Z" if self.splits == 1 else f"{self.splits} K splits x Z"
        head = [
            f"// ember generated tiled matmul '{self.name}': Z={self.z} x (M={self.m} x K={self.k}) @ (K x N={self.n})",
            f"// tile {t.bm}x{t.bn}, K step {t.bk}, {t.tm}x{t.tn} outputs per thread, {t.threads} threads,",
            "// two workgroup-memory stages (A stored transposed) + unconditional register prefetch"
            + (", warp-shaped thread layout" if t.warp else "") + (", K loop over pairs of tiles" if t.unroll2 else "")
            + ("." if self.splits == 1 else f"; K split {self.splits} ways ({per} K tiles each) into partial sums."),
            "// Bindings (group 0):",
            *self.binds.comment(),
            f"// Dispatch grid: {(gx, gy, gz)} = " + (
                f"(N tiles, M tiles, {zdesc})" if not linear
                else f"{tn * tm * zs} workgroups linearised ({zdesc}, M tile, N tile)") if rt is None else
            "// Dispatch grid: grid_1d(workgroups) linearised (Z, M tile, N tile), M and Z read at run time (sz);"
            " workgroups past the tiles return",
            *[f"// {n}" for n in self.notes],
            f"// {self.a.describe()}",
            f"// {self.b.describe()}",
        ]
        lines = [
            *head, PRELUDE, *self.binds.declarations(),
            f"var<workgroup> As: array<vec4<f32>, {2 * sa}>;",
            f"var<workgroup> Bs: array<vec4<f32>, {2 * sb}>;",
            self.epilogue.function(self.binds),
            f"@compute @workgroup_size({t.threads})",
            "fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,",
            "        @builtin(local_invocation_index) lid: u32) {",
        ]
        if rt is not None:  # splits == 1; the tile count from the M and Z read at run time
            mt = f"(({u32(self.m)} + {u32(t.bm - 1)}) / {u32(t.bm)})"
            lines += [
                "    let wg = wid.y * nwg.x + wid.x;",
                f"    let mn_tiles = {mt} * {u32(tn)};",
                f"    if (wg >= mn_tiles * {u32(self.z)}) {{ return; }}",
                "    let zs = wg / mn_tiles;",
                f"    let tile_m = (wg % mn_tiles) / {u32(tn)};",
                f"    let tile_n = wg % {u32(tn)};",
            ]
        elif linear:
            lines += [
                "    let wg = wid.y * nwg.x + wid.x;",
                f"    if (wg >= {u32(tn * tm * zs)}) {{ return; }}",
                f"    let zs = wg / {u32(tn * tm)};",
                f"    let tile_m = (wg % {u32(tn * tm)}) / {u32(tn)};",
                f"    let tile_n = wg % {u32(tn)};",
            ]
        else:
            lines += ["    let tile_n = wid.x;", "    let tile_m = wid.y;", "    let zs = wid.z;"]
        if self.splits == 1:
            lines += ["    let z = zs;", "    let kt0 = 0u;", f"    let nt = {u32(nt)};"]
        else:
            lines += [f"    let z = zs % {u32(self.z)};", f"    let kt0 = (zs / {u32(self.z)}) * {u32(per)};",
                      f"    let nt = min({u32(per)}, {u32(nt)} - kt0);"]
        lines += [
            f"    let m0 = tile_m * {u32(t.bm)};",
            f"    let n0 = tile_n * {u32(t.bn)};",
            *self._thread_coords(),
            *self.a.prologue(t),
            *self.b.prologue(t),
        ]
        rows, cols = t.tm, t.tn // 4
        for r in range(rows):
            for h in range(cols):
                lines.append(f"    var c{r}_{h} = vec4<f32>(0.0);")
        if nt > 0:
            for q in range(self.a.quads(t)):
                lines.append(f"    var ar{q}: vec4<f32>;")
            for q in range(self.b.quads(t)):
                lines.append(f"    var br{q}: vec4<f32>;")
            lines += ["    {", f"        let k0 = kt0 * {u32(t.bk)};", *self.a.load(t, "k0"), *self.b.load(t, "k0"),
                      *self.a.store(t, "As", "0u"), *self.b.store(t, "Bs", "0u"), "    }",
                      "    workgroupBarrier();"]
            if per > 1 and t.unroll2:
                # Pairs of K tiles with the stages as constants; an odd last tile after the loop.
                lines += ["    for (var t = 0u; t + 1u < nt; t += 2u) {",
                          *self._k_tile(0, "t + 1u", True), *self._k_tile(1, "min(t + 2u, nt - 1u)", True),
                          "    }", "    if ((nt & 1u) == 1u) {", "        let t = nt - 1u;",
                          *self._k_tile(0, "t", False), "    }"]
            else:
                lines += ["    for (var t = 0u; t < nt; t++) {", *self._k_tile(None, "min(t + 1u, nt - 1u)", per > 1),
                          "    }"]
        for r in range(rows):
            lines.append(f"    let row{r} = m0 + {u32((r // 4) * 4 * t.ty + r % 4)} + ty * 4u;")
        for h in range(cols):
            lines.append(f"    let col{h} = n0 + {u32(h * 4 * t.tx)} + tx * 4u;")
        ez = "z" if self.splits == 1 else "zs"
        for r in range(rows):
            for h in range(cols):
                for j, c in enumerate("xyzw"):
                    col = f"col{h}" if j == 0 else f"col{h} + {u32(j)}"
                    lines.append(f"    epi(c{r}_{h}.{c}, {ez}, row{r}, {col});")
        lines.append("}")
        if rt is not None:  # last: the loaders lift values (vec4 strides) while the body is written
            lines.append(rt.declaration(len(self.binds.reads) + 1))
        return "\n".join(lines) + "\n"

    def _k_tile(self, stage: int | None, nxt: str, prefetch: bool) -> list[str]:
        """One K tile of the main loop: prefetch K tile `nxt` into registers, multiply-accumulate from workgroup
        stage `stage` (None: t & 1), store the prefetched tile into the other stage, barrier.

        The prefetch is unconditional: the last tile reloads itself (`nxt` clamps to nt - 1) into the idle stage,
        in range and never read. With a branch around it (`if (t + 1 < nt)`) NVIDIA's compiler no longer
        interleaves the loads with the FMAs, which costs far more than the redundant load (BENCHMARKS.md)."""
        t = self.tile
        rows, cols = t.tm, t.tn // 4
        sa, sb = t.bk * t.bm // 4, t.bk * t.bn // 4
        if stage is None:
            lines = [f"        let sa = (t & 1u) * {u32(sa)} + ty;", f"        let sb = (t & 1u) * {u32(sb)} + tx;"]
            other = "((t + 1u) & 1u)"
        else:
            lines = [f"        let sa = {u32(stage * sa)} + ty;", f"        let sb = {u32(stage * sb)} + tx;"]
            other = u32(1 - stage)
        if prefetch:
            lines += ["        {", f"        let k0 = (kt0 + {nxt}) * {u32(t.bk)};", *self.a.load(t, "k0"),
                      *self.b.load(t, "k0"), "        }"]
        for kk in range(t.bk):
            lines.append("        {")
            for g in range(rows // 4):
                lines.append(f"        let a{g} = As[sa + {u32(kk * t.bm // 4 + g * t.ty)}];")
            for h in range(cols):
                lines.append(f"        let b{h} = Bs[sb + {u32(kk * t.bn // 4 + h * t.tx)}];")
            for r in range(rows):
                for h in range(cols):
                    lines.append(f"        c{r}_{h} += a{r // 4}.{'xyzw'[r % 4]} * b{h};")
            lines.append("        }")
        if prefetch:
            lines += ["        {", f"        let ns = {other};", *self.a.store(t, "As", f"ns * {u32(sa)}"),
                      *self.b.store(t, "Bs", f"ns * {u32(sb)}"), "        }"]
        # Braces: each K tile (two per iteration with unroll2) declares its own sa, sb, k0, ns.
        return ["        {", *lines, "        workgroupBarrier();", "        }"]

    def _thread_coords(self) -> list[str]:
        """(tx, ty) of this thread in the tile's TX x TY thread grid."""
        t = self.tile
        if t.warp:
            # A 32-thread warp covers 8 x 4 threads (lanes 0-7 along x), not a 32 x 1 strip: per K step it
            # reads 4 distinct A and 8 distinct B vec4s from workgroup memory.
            wx = t.tx // 8
            return [f"    let tx = ((lid >> 5u) & {u32(wx - 1)}) * 8u + (lid & 7u);",
                    f"    let ty = (lid >> {u32(5 + log2(wx))}) * 4u + ((lid >> 3u) & 3u);"]
        return [f"    let tx = lid & {u32(t.tx - 1)};", f"    let ty = lid >> {u32(log2(t.tx))};"]

    def record(self, be: WgpuBackend) -> list:
        (gx, gy, gz), _ = self.grid()
        src = self.source()
        label = f"{self.name}:{self.tile}" + (f":split{self.splits}" if self.splits > 1 else "")
        buffers = self.binds.buffers()
        if self.rt is not None:
            buffers[len(self.binds.reads) + 1] = self.rt.buffer(be)
        return [be.dispatch(be.pipeline(label, src), buffers, (gx, gy, gz), label)]


REDUCE_WORKGROUP = 256
# A function building one operand's loader for a tile, given the bindings it registers its buffer with.
LoaderFactory = Callable[[Bindings, Tile], Loader]
# A function building the epilogue given the bindings and whether M / N need edge guards.
EpilogueFactory = Callable[[Bindings, bool, bool], Epilogue]


def record_gemm_kernel(be: WgpuBackend, name: str, m: int, n: int, k: int, z: int, out_handle: Any,
                       make_a: LoaderFactory, make_b: LoaderFactory, make_epilogue: EpilogueFactory,
                       notes: list[str], windows: dict[int, tuple[int, int]] | None = None,
                       types: dict[Any, str] | None = None, plan: tuple[Tile, int] | None = None,
                       rt: Sizes | None = None) -> list:
    """Record the tiled kernel with `plan` = (tile, K splits), plus the split-K reduce kernel when K is split.
    Without a plan, autotune.choose picks one (plan_gemm's heuristic, or a tuned choice; see autotune.py); with
    runtime sizes (`rt`: m and z Lifted) tiles.plan_runtime, from N, K and Z only.
    `types`: WGSL storage type per handle (Bindings).
    `windows`: sub-ranges to bind of big allocations (Bindings); the loaders' offsets are relative to them."""
    if plan is None and rt is not None:
        plan = tiles.plan_runtime(be, n, k, int(z))
    if plan is None:
        plan = autotune.choose(be, name, m, n, k, z, out_handle, make_a, make_b, windows, lambda p: record_gemm_kernel(
            be, name, m, n, k, z, out_handle, make_a, make_b, make_epilogue, notes, windows, types, p), types=types)
    tile, splits = plan
    guard_m, guard_n = rt is not None or m % tile.bm != 0, n % tile.bn != 0
    if splits == 1:
        binds = Bindings(out_handle, windows, types)
        la, lb = make_a(binds, tile), make_b(binds, tile)
        ep = make_epilogue(binds, guard_m, guard_n)
        return GemmProblem(name, tile, m, n, k, z, la, lb, ep, binds, notes=notes, rt=rt).record(be)
    assert rt is None, "runtime sizes take no K splits (tiles.plan_runtime)"
    # Split K: partial sums part[s, z, m, n] in a buffer of the kernel's own, then out = epi(sum over s).
    total = z * m * n
    scratch = be.scratch("split-K partial sums", splits * total * 4)
    binds = Bindings(scratch, windows, types)  # partial sums stay f32
    la, lb = make_a(binds, tile), make_b(binds, tile)
    partial = partial_epilogue(m, n, guard_m, guard_n)
    steps = GemmProblem(name, tile, m, n, k, z, la, lb, partial, binds, notes=notes, splits=splits).record(be)
    return steps + record_splitk_reduce(be, name, scratch, splits, z, m, n, out_handle, make_epilogue, windows, types)


def partial_epilogue(m: int, n: int, guard_m: bool = False, guard_n: bool = False) -> Epilogue:
    """The first kernel's epilogue under a K split: part[zs, m, n] (zs = s * Z + z, f32), what
    record_splitk_reduce adds."""
    conds = ([f"m >= {u32(m)}"] if guard_m else []) + ([f"n >= {u32(n)}"] if guard_n else [])
    return Epilogue(f"(z * {u32(m)} + m) * {u32(n)} + n", guard=" || ".join(conds) or None)


def record_splitk_reduce(be: WgpuBackend, name: str, scratch: Any, splits: int, z: int, m: int, n: int,
                         out_handle: Any, make_epilogue: EpilogueFactory, windows: dict[int, tuple[int, int]] | None,
                         types: dict[Any, str] | None) -> list:
    """The kernel adding `splits` partial sums part[s, z, m, n] (f32, s-major, in `scratch`) into out through the
    epilogue: the second kernel of a split-K GEMM or GEMV."""
    total = z * m * n
    rbinds = Bindings(out_handle, windows, types)
    rbinds.add(scratch, False)
    ep = make_epilogue(rbinds, False, False)
    groups = math.ceil(total / REDUCE_WORKGROUP)
    grid = grid_1d(groups)
    header = "\n".join([
        f"// ember split-K reduce for '{name}': out[z, m, n] = epi(sum over {splits} splits of part[s, z, m, n]), "
        f"Z={z}, M={m}, N={n}", "// Bindings (group 0):", *rbinds.comment(),
        f"// Dispatch grid: {grid} = ceil({total} / {REDUCE_WORKGROUP}) workgroups spread over x, y"])
    src = be.kernel_source("splitk_reduce", HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(rbinds.declarations()),
                           EPILOGUE=ep.function(rbinds), WORKGROUP=REDUCE_WORKGROUP, TOTAL=u32(total), M=u32(m),
                           N=u32(n), SPLITS=u32(splits), PART=rbinds.var(scratch))
    label = f"{name}:splitk_reduce"
    return [be.dispatch(be.pipeline(label, src), rbinds.buffers(), grid, label)]

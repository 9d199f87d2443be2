"""Matrix products on the wgpu backend: out = act(alpha * a @ b + beta * bias), batched, strided.

Two kernels:
- a *generated* register-blocked kernel (`GemmProblem`): a BM x BN output tile per workgroup, TM x TN outputs per
  thread in named vec4 accumulators, A stored transposed in workgroup memory so both operands are read as
  vec4, two workgroup-memory stages plus an unconditional register prefetch (one barrier per K tile; a branch
  around the prefetch cost 13-25 % on an H200), optionally a warp-shaped thread layout and a K loop over pairs
  of tiles (Tile.warp / Tile.unroll2: the "huge" tile's 47 TFLOP/s at 4096^3). Operands are loaded in
  "quads" of four consecutive elements along their unit-stride dimension (vec4 loads when aligned, four
  scalar loads otherwise). Shapes and strides are baked in as constants, and every guard the shape needs (edge
  tiles, partial vec4s) is emitted, so every index is in range: the module can be trusted. conv.py reuses the
  generator with an implicit-im2col loader. `plan_gemm` picks the tile (128x256, 128x128, 64x64 or 32x32) and, when the
  output has too few tiles to fill the GPU, splits K: partial sums into a buffer of the kernel's own, then
  kernels/splitk_reduce.wgsl adds them and applies the epilogue.
- a simple 16 x 16 tiled kernel over arbitrary (even negative) strides, kernels/matmul_strided.wgsl, for
  operands with no unit-stride inner dimension.

Operands are bound once per distinct buffer; one that shares the output's buffer (gemm's beta * C, or an
arena) is read through the read_write output binding, since WebGPU forbids binding a buffer both read-only
and writable in one dispatch. A buffer above the adapter's max storage-buffer binding size is bound as the
aligned byte range its views touch; a problem needing more than that is split (see record_split).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...core.expr import FLOAT, Expr
from ...core.view import View
from .backend import WORKGROUPS_PER_DIM, WgpuBackend, as_f32, from_f32, grid_1d
from .elementwise import PRELUDE, _Emitter, float_literal

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)


# ---- small helpers ------------------------------------------------------------------------------------
def require_float(op: str, **views: View | None) -> dict[int, str]:
    """Each operand float32 or float16 (stored as f16, computed in f32); returns handle -> WGSL storage type."""
    types = {}
    for name, v in views.items():
        if v is None:
            continue
        if np.dtype(v.dtype) not in (F32, F16):
            raise NotImplementedError(
                f"wgpu {op}: {name} has dtype {np.dtype(v.dtype).name}; only float32 and float16 are supported")
        types[v.handle] = "f16" if np.dtype(v.dtype) == F16 else "f32"
    return types


def view_span(v: View) -> tuple[int, int]:
    """(lowest, highest) element index a non-empty view touches (strides may be negative)."""
    lo = v.offset + sum((d - 1) * s for d, s in zip(v.shape, v.strides, strict=True) if s < 0)
    hi = v.offset + sum((d - 1) * s for d, s in zip(v.shape, v.strides, strict=True) if s > 0)
    return lo, hi


def check_view(be: WgpuBackend, v: View, arg: str) -> None:
    """Host-side bounds check: trusted kernels index without clamps, so every view must fit its buffer."""
    if v.size == 0:
        return
    size = be.nbytes(v.handle, arg)
    lo, hi = view_span(v)
    if lo < 0 or (hi + 1) * np.dtype(v.dtype).itemsize > size:
        raise ValueError(f"{arg}: view (shape {v.shape}, strides {v.strides}, offset {v.offset}) reaches elements "
                         f"[{lo}, {hi}] outside its allocation of {size} bytes")


def check_no_overlap(v: View, out: View, arg: str) -> None:
    """An input that shares the output's buffer must not overlap the written window (no in-place matmul/conv)."""
    if v.handle != out.handle or v.size == 0 or out.size == 0:
        return
    lo, hi = view_span(v)
    olo, ohi = view_span(out)
    if lo <= ohi and olo <= hi:
        raise ValueError(f"{arg} overlaps the output in buffer {v.handle}; the op cannot run in place")


def u(v: int) -> str:
    return f"{int(v)}u"


def log2(v: int) -> int:
    assert v > 0 and v & (v - 1) == 0, v
    return v.bit_length() - 1


def addr(off: int, terms: list[tuple[str, int]]) -> str:
    """A u32 WGSL expression for off + sum(var * stride), in i32 arithmetic if anything is negative."""
    terms = [(var, s) for var, s in terms if s != 0]
    if off >= 0 and all(s > 0 for _, s in terms):
        parts = [var if s == 1 else f"{var} * {u(s)}" for var, s in terms]
        if off or not parts:
            parts.append(u(off))
        return " + ".join(parts)
    parts = [f"i32({var})" if s == 1 else f"i32({var}) * {s}i" for var, s in terms]
    parts.append(f"{off}i")
    return f"u32({' + '.join(parts)})"


def check_operands(be: WgpuBackend, out: View, **inputs: View | None) -> None:
    """check_view for the output and every given input, and check_no_overlap of each input with the output."""
    check_view(be, out, "out")
    for name, v in inputs.items():
        if v is not None:
            check_view(be, v, name)
            check_no_overlap(v, out, name)


def act_lines(act: Expr | None, value: str) -> tuple[list[str], str]:
    """WGSL lines applying `act` (an Expr over input 0) to `value`, through elementwise.py's emitter."""
    if act is None:
        return [], value
    if act.inputs() - {0}:
        raise ValueError(f"act: an activation reads input 0 only, got inputs {sorted(act.inputs())}")
    if act.kind != FLOAT:
        raise NotImplementedError(f"act: the activation must produce float, got {act.kind}")
    em = _Emitter([value])
    result = em.emit(act)
    return em.lines, result


@dataclass
class Binding:
    handle: Any  # an allocation handle, or a GPUBuffer of the kernel's own (split-K partial sums, Winograd scratch)
    var: str
    vec4: bool = False  # declared as array<vec4<T>>
    storage: str = "f32"  # T: f32, or f16 (read as f32)


class Bindings:
    """One binding per distinct buffer; operands in the output's buffer read through `out` (read_write).

    `windows` maps an allocation handle to the (byte offset, byte size) sub-range to bind instead of the whole
    buffer (see binding_windows); the kernel's view offsets must be relative to that sub-range. `types` maps a
    handle to its WGSL storage type (f32 when absent); kernels compute in f32 whatever is stored."""

    def __init__(self, out_handle: Any, windows: dict[int, tuple[int, int]] | None = None,
                 types: dict[Any, str] | None = None) -> None:
        self.out_handle = out_handle
        self.reads: dict[int, Binding] = {}
        self.windows = windows or {}
        self.types = types or {}
        self.out_type = self.types.get(out_handle, "f32")

    def add(self, handle: int, vec4: bool) -> bool:
        """Register a reader; returns whether it may use vec4 loads (not through the scalar output binding)."""
        if handle == self.out_handle:
            return False
        b = self.reads.get(handle)
        if b is None:
            b = self.reads[handle] = Binding(handle, f"buf{len(self.reads)}", storage=self.types.get(handle, "f32"))
        b.vec4 = b.vec4 or vec4
        return vec4

    def var(self, handle: int) -> str:
        return "out" if handle == self.out_handle else self.reads[handle].var

    def storage(self, handle: Any) -> str:
        return self.out_type if handle == self.out_handle else self.reads[handle].storage

    def scalar(self, handle: int, index: str) -> str:
        """A WGSL f32 expression loading one element at `index` (u32 expression)."""
        if handle != self.out_handle and self.reads[handle].vec4:
            return as_f32(f"{self.reads[handle].var}[({index}) >> 2u][({index}) & 3u]", self.storage(handle))
        return as_f32(f"{self.var(handle)}[{index}]", self.storage(handle))

    def quad(self, handle: int, index: str) -> str:
        """A WGSL vec4<f32> expression loading vec4 number `index` of a vec4 binding."""
        return as_f32(f"{self.reads[handle].var}[{index}]", self.storage(handle), vec4=True)

    def store(self, index: str, value: str) -> str:
        """The WGSL statement writing f32 `value` to out[index] (rounded once when out is f16)."""
        return f"out[{index}] = {from_f32(value, self.out_type)};"

    def _type(self, b: Binding) -> str:
        return f"vec4<{b.storage}>" if b.vec4 else b.storage

    def declarations(self) -> list[str]:
        lines = []
        for i, b in enumerate(self.reads.values()):
            lines.append(f"@group(0) @binding({i}) var<storage, read> {b.var}: array<{self._type(b)}>;")
        lines.append(f"@group(0) @binding({len(self.reads)}) var<storage, read_write> out: array<{self.out_type}>;")
        return lines

    def comment(self) -> list[str]:
        def name(h: Any) -> str:
            return f"allocation {h}" if isinstance(h, int) else (getattr(h, "label", "") or "scratch buffer")

        lines = [f"//   binding {i}: {b.var}, {name(b.handle)}, read-only, array<{self._type(b)}>"
                 for i, b in enumerate(self.reads.values())]
        lines.append(f"//   binding {len(self.reads)}: out, {name(self.out_handle)}, read_write, "
                     f"array<{self.out_type}>")
        return lines

    def buffers(self) -> dict[int, Any]:
        """Binding number -> handle, GPUBuffer, or (handle, byte offset, byte size) for a windowed one."""
        d = {i: self._resource(b.handle) for i, b in enumerate(self.reads.values())}
        d[len(self.reads)] = self._resource(self.out_handle)
        return d

    def _resource(self, handle: Any) -> Any:
        w = self.windows.get(handle) if isinstance(handle, int) else None
        return handle if w is None else (handle, *w)


# ---- the epilogue: out[z, m, n] = act(alpha * acc + beta * bias[z, m, n]) -----------------------------------
@dataclass
class Epilogue:
    """How an accumulator at (z, m, n) reaches memory. Index expressions are WGSL u32 expressions in z, m, n."""

    out_index: str
    alpha: float = 1.0
    bias_index: str | None = None
    bias_handle: int | None = None
    beta: float = 1.0
    act: Expr | None = None
    guard: str | None = None  # WGSL bool: true where (m, n) is outside the output
    pre: list[str] = field(default_factory=list)  # lines computing helper values from z, m, n
    residual_index: str | None = None  # a second addend (a residual connection), added before the activation
    residual_handle: int | None = None

    def function(self, binds: Bindings) -> str:
        body = [f"    if ({self.guard}) {{ return; }}"] if self.guard else []
        body += self.pre
        value = "acc" if self.alpha == 1.0 else f"{float_literal(self.alpha)} * acc"
        if self.bias_index is not None and self.beta != 0.0:
            bias = binds.scalar(self.bias_handle, self.bias_index)
            value += f" + {bias}" if self.beta == 1.0 else f" + {float_literal(self.beta)} * {bias}"
        if self.residual_index is not None:
            value += f" + {binds.scalar(self.residual_handle, self.residual_index)}"
        body.append(f"    let v: f32 = {value};")
        lines, result = act_lines(self.act, "v")
        body += lines
        body.append(f"    {binds.store(self.out_index, result)}")
        return "\n".join(["fn epi(acc: f32, z: u32, m: u32, n: u32) {", *body, "}"])


def matmul_epilogue(out: View, bias: View | None, alpha: float, beta: float, act: Expr | None,
                    m_size: int, n_size: int, guard_m: bool, guard_n: bool,
                    residual: View | None = None) -> Epilogue:
    conds = ([f"m >= {u(m_size)}"] if guard_m else []) + ([f"n >= {u(n_size)}"] if guard_n else [])
    ep = Epilogue(addr(out.offset, list(zip("zmn", out.strides, strict=True))), alpha=alpha, beta=beta, act=act,
                  guard=" || ".join(conds) or None)
    if bias is not None and beta != 0.0:
        ep.bias_index = addr(bias.offset, list(zip("zmn", bias.strides, strict=True)))
        ep.bias_handle = bias.handle
    if residual is not None:
        ep.residual_index = addr(residual.offset, list(zip("zmn", residual.strides, strict=True)))
        ep.residual_handle = residual.handle
    return ep


# ---- the generated register-blocked kernel -------------------------------------------------------------------
@dataclass(frozen=True)
class Tile:
    bm: int  # output rows per workgroup
    bn: int  # output columns per workgroup
    bk: int  # K per stage
    tm: int  # rows per thread (multiple of 4)
    tn: int  # columns per thread (multiple of 4)
    warp: bool = False  # warp-shaped thread layout (GemmProblem._thread_coords); needs TX >= 8, TY >= 4
    unroll2: bool = False  # the K loop over pairs of tiles with constant stage offsets

    @property
    def tx(self) -> int:
        return self.bn // self.tn

    @property
    def ty(self) -> int:
        return self.bm // self.tm

    @property
    def threads(self) -> int:
        return self.tx * self.ty

    def smem_bytes(self) -> int:
        return 2 * self.bk * (self.bm + self.bn) * 4

    def __str__(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}/{self.tm}x{self.tn}" + "w" * self.warp + "u" * self.unroll2

    @classmethod
    def parse(cls, s: str) -> Tile:
        """The tile str() spelled: BMxBNxBK/TMxTN plus 'w' (warp layout) and 'u' (unroll2) suffixes."""
        g = re.fullmatch(r"(\d+)x(\d+)x(\d+)/(\d+)x(\d+)(w?)(u?)", s)
        if g is None:
            raise ValueError(f"tile {s!r}: expected BMxBNxBK/TMxTN with optional 'w' and 'u' suffixes")
        *dims, w, un = g.groups()
        return cls(*(int(v) for v in dims), warp=bool(w), unroll2=bool(un))


TILES = {
    # 256 threads, 32 vec4 accumulators each, 48 KiB of workgroup memory: 47.1 TFLOP/s at 4096^3 on an H200
    # (cuBLAS fp32: 51.3), where "large" gets 42.5 (bench_gemm_tiles.py, 2026-11-30).
    "huge": Tile(128, 256, 16, 8, 16, warp=True, unroll2=True),
    "large": Tile(128, 128, 16, 8, 8),  # 256 threads, 16 vec4 accumulators each, 32 KiB
    "medium": Tile(64, 64, 16, 4, 4),   # 256 threads
    "small": Tile(32, 32, 8, 4, 4),     # 64 threads
}
# Where the adapter has only WebGPU's default 16 KiB of workgroup memory.
LARGE_16K = Tile(128, 128, 8, 8, 8)
# Planning (tuned on an H200 through Vulkan with bench/bench_kernels.py's shapes): the huge tile for long-K products
# with about one workgroup per SM or more, else the 128 x 128 tile where it gives TARGET_WORKGROUPS workgroups and
# wastes little on edges; else 64 x 64; with fewer 64 x 64 output tiles than that, K is split over more workgroups
# (partial sums + a reduce kernel applying the epilogue), each split at least MIN_SPLIT_K deep; where K is too
# short to split and the 64 x 64 tiling leaves the GPU idle, the 32 x 32 tile.
TARGET_WORKGROUPS = 256
HUGE_MIN_WORKGROUPS = 128
HUGE_MIN_K = 1024
SMALL_BELOW = 128  # unsplittable: the 32 x 32 tile when the 64 x 64 tiling has fewer workgroups than this
MIN_SPLIT_K = 128
MAX_SPLITS = 32


def plan_gemm(be: WgpuBackend, m: int, n: int, k: int, z: int) -> tuple[Tile, int]:
    """(tile, number of K splits) for Z products of (M x K) @ (K x N)."""
    limit = int(be.limits.get("max-compute-workgroup-storage-size", 16384))
    huge, large, medium, small = (TILES[t] for t in ("huge", "large", "medium", "small"))
    if large.smem_bytes() > limit:
        large = LARGE_16K

    def workgroups(t: Tile) -> int:
        return math.ceil(m / t.bm) * math.ceil(n / t.bn) * z

    def used(t: Tile) -> float:  # the fraction of the tiles' outputs inside the matrix
        return m * n / (math.ceil(m / t.bm) * t.bm * math.ceil(n / t.bn) * t.bn)

    if (huge.smem_bytes() <= limit and k >= HUGE_MIN_K and workgroups(huge) >= HUGE_MIN_WORKGROUPS
            and used(huge) >= 0.85):
        return huge, 1
    if large.smem_bytes() <= limit and workgroups(large) >= TARGET_WORKGROUPS and used(large) >= 0.85:
        return large, 1
    t = medium if medium.smem_bytes() <= limit else small
    if workgroups(t) >= TARGET_WORKGROUPS:
        return t, 1
    room = be.max_binding // max(1, 4 * z * m * n)
    splits = min(math.ceil(TARGET_WORKGROUPS / workgroups(t)), k // MIN_SPLIT_K, MAX_SPLITS, room)
    if splits >= 2:
        return t, split_count(k, t, splits)
    return (small if workgroups(t) < SMALL_BELOW else t), 1


def split_count(k: int, tile: Tile, splits: int) -> int:
    """The number of non-empty splits when K's tiles are dealt out evenly over at most `splits`."""
    nt = math.ceil(k / tile.bk)
    return math.ceil(nt / math.ceil(nt / splits))


class Loader:
    """Loads one operand's BK x BX tile (X = M for A, N for B) into workgroup memory laid out [k][x/4] as vec4."""

    prefix: str
    tile_x: int  # BM or BN

    def quads(self, tile: Tile) -> int:
        n = tile.bk * self.tile_x // 4
        assert n % tile.threads == 0, (tile, self.tile_x)
        return n // tile.threads

    def describe(self) -> str:
        return type(self).__name__

    def prologue(self, tile: Tile) -> list[str]:
        raise NotImplementedError

    def load(self, tile: Tile, k0: str) -> list[str]:
        raise NotImplementedError

    def store(self, tile: Tile, smem: str, base: str) -> list[str]:
        raise NotImplementedError


@dataclass
class StridedLoader(Loader):
    """Operand element (z, x, k) at off + z*sz + x*sx + k*sk, of extent X x K. Quads run along `quad` ('x'/'k')."""

    prefix: str
    tile_x: int
    handle: int
    off: int
    sz: int
    sx: int
    sk: int
    x_size: int
    k_size: int
    quad: str
    vec4: bool
    binds: Bindings | None = None

    def describe(self) -> str:
        op = "A" if self.prefix == "a" else "B"
        return (f"{op}: element (z, x, k) at {self.off} + z*{self.sz} + x*{self.sx} + k*{self.sk}, "
                f"{'vec4' if self.vec4 else 'scalar'} loads of 4 along {self.quad}")

    def _slot(self, tile: Tile, q: int) -> tuple[str, str, str]:
        """Quad slot q of this thread: (x within the tile, k within the tile, smem vec4 offset) of lid."""
        bx4, bk4 = self.tile_x // 4, tile.bk // 4
        v = "lid" if q == 0 else f"(lid + {u(q * tile.threads)})"
        if self.quad == "x":
            kr, xq = f"({v} >> {u(log2(bx4))})", f"(({v} & {u(bx4 - 1)}) << 2u)"
            return xq, kr, f"{kr} * {u(bx4)} + ({v} & {u(bx4 - 1)})"
        xq, kr = f"({v} >> {u(log2(bk4))})", f"(({v} & {u(bk4 - 1)}) << 2u)"
        return xq, kr, f"{kr} * {u(bx4)} + ({xq} >> 2u)"

    def prologue(self, tile: Tile) -> list[str]:
        p, lines = self.prefix, []
        x0 = "m0" if p == "a" else "n0"
        for q in range(self.quads(tile)):
            xq, kr, so = self._slot(tile, q)
            lines += [f"    let {p}_x{q} = {x0} + {xq};", f"    let {p}_k{q} = {kr};", f"    let {p}_s{q} = {so};"]
            if self.quad == "k":
                lines.append(f"    let {p}_c{q} = {xq} & 3u;")
        return lines

    def load(self, tile: Tile, k0: str) -> list[str]:
        p, binds = self.prefix, self.binds
        guard_x = self.x_size % self.tile_x != 0
        guard_k = self.k_size % tile.bk != 0
        lines = []
        for q in range(self.quads(tile)):
            reg, xv, kv = f"{p}r{q}", f"{p}_x{q}", f"{p}gk{q}"
            lines.append(f"        {reg} = vec4<f32>(0.0);")
            lines.append(f"        let {kv} = {k0} + {p}_k{q};")
            conds = [f"{xv} < {u(self.x_size)}"] if guard_x else []
            conds += [f"{kv} < {u(self.k_size)}"] if guard_k else []
            ind = "        "
            if conds:
                lines.append(f"        if ({' && '.join(conds)}) {{")
                ind = "            "
            along, along_size = (xv, self.x_size) if self.quad == "x" else (kv, self.k_size)
            if self.vec4:
                # Aligned: the quad's first element is in range, so the whole vec4 lies in the (16-byte padded)
                # buffer; components past the edge are masked to zero.
                if self.quad == "x":
                    idx = addr(self.off // 4, [("z", self.sz // 4), (f"({xv} >> 2u)", 1), (kv, self.sk // 4)])
                else:
                    idx = addr(self.off // 4, [("z", self.sz // 4), (xv, self.sx // 4), (f"({kv} >> 2u)", 1)])
                lines.append(f"{ind}{reg} = {binds.quad(self.handle, idx)};")
                if along_size % 4:
                    lines.append(f"{ind}{reg} = select(vec4<f32>(0.0), {reg}, vec4<u32>({along}) + "
                                 f"vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>({u(along_size)}));")
            else:
                base = f"{p}e{q}"
                lines.append(f"{ind}let {base} = {addr(self.off, [('z', self.sz), (xv, self.sx), (kv, self.sk)])};")
                step = self.sx if self.quad == "x" else self.sk
                for i, c in enumerate("xyzw"):
                    e = base if i == 0 else (f"{base} + {u(i * step)}" if step >= 0 else f"{base} - {u(-i * step)}")
                    load = f"{reg}.{c} = {binds.scalar(self.handle, e)};"
                    if along_size % 4 and i:
                        lines.append(f"{ind}if ({along} + {u(i)} < {u(along_size)}) {{ {load} }}")
                    else:
                        lines.append(f"{ind}{load}")
            if conds:
                lines.append("        }")
        return lines

    def store(self, tile: Tile, smem: str, base: str) -> list[str]:
        p, bx4 = self.prefix, self.tile_x // 4
        lines = []
        for q in range(self.quads(tile)):
            reg = f"{p}r{q}"
            if self.quad == "x":
                lines.append(f"        {smem}[{base} + {p}_s{q}] = {reg};")
            else:
                for i, c in enumerate("xyzw"):
                    lines.append(f"        {smem}[{base} + {p}_s{q} + {u(i * bx4)}][{p}_c{q}] = {reg}.{c};")
        return lines


def strided_loader(prefix: str, tile_x: int, binds: Bindings, handle: int, off: int, sz: int, sx: int, sk: int,
                   x_size: int, k_size: int, z_size: int) -> StridedLoader:
    """Normalise strides of size-1 dims, pick the quad direction (the unit-stride dim) and vec4 eligibility."""
    sz = 0 if z_size == 1 else sz
    sx = 0 if x_size == 1 else sx
    sk = 0 if k_size == 1 else sk
    if sk == 1 or (k_size == 1 and sx != 1):
        quad, unit_ok = "k", sk in (0, 1)
        sk = 1 if k_size == 1 else sk
        others = (off, sz, sx)
    else:
        quad, unit_ok = "x", sx in (0, 1)
        sx = 1 if x_size == 1 else sx
        others = (off, sz, sk)
    want = unit_ok and all(s % 4 == 0 and s >= 0 for s in others)
    vec4 = binds.add(handle, want)
    return StridedLoader(prefix, tile_x, handle, off, sz, sx, sk, x_size, k_size, quad, vec4, binds)


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

    def grid(self) -> tuple[tuple[int, int, int], bool]:
        tn, tm, zs = math.ceil(self.n / self.tile.bn), math.ceil(self.m / self.tile.bm), self.z * self.splits
        if max(tn, tm, zs) <= WORKGROUPS_PER_DIM:
            return (tn, tm, zs), False
        return grid_1d(tn * tm * zs), True

    def source(self) -> str:
        t = self.tile
        (gx, gy, gz), linear = self.grid()
        tn, tm, zs = math.ceil(self.n / t.bn), math.ceil(self.m / t.bm), self.z * self.splits
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
                else f"{tn * tm * zs} workgroups linearised ({zdesc}, M tile, N tile)"),
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
        if linear:
            lines += [
                "    let wg = wid.y * nwg.x + wid.x;",
                f"    if (wg >= {u(tn * tm * zs)}) {{ return; }}",
                f"    let zs = wg / {u(tn * tm)};",
                f"    let tile_m = (wg % {u(tn * tm)}) / {u(tn)};",
                f"    let tile_n = wg % {u(tn)};",
            ]
        else:
            lines += ["    let tile_n = wid.x;", "    let tile_m = wid.y;", "    let zs = wid.z;"]
        if self.splits == 1:
            lines += ["    let z = zs;", "    let kt0 = 0u;", f"    let nt = {u(nt)};"]
        else:
            lines += [f"    let z = zs % {u(self.z)};", f"    let kt0 = (zs / {u(self.z)}) * {u(per)};",
                      f"    let nt = min({u(per)}, {u(nt)} - kt0);"]
        lines += [
            f"    let m0 = tile_m * {u(t.bm)};",
            f"    let n0 = tile_n * {u(t.bn)};",
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
            lines += ["    {", f"        let k0 = kt0 * {u(t.bk)};", *self.a.load(t, "k0"), *self.b.load(t, "k0"),
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
            lines.append(f"    let row{r} = m0 + {u((r // 4) * 4 * t.ty + r % 4)} + ty * 4u;")
        for h in range(cols):
            lines.append(f"    let col{h} = n0 + {u(h * 4 * t.tx)} + tx * 4u;")
        ez = "z" if self.splits == 1 else "zs"
        for r in range(rows):
            for h in range(cols):
                for j, c in enumerate("xyzw"):
                    col = f"col{h}" if j == 0 else f"col{h} + {u(j)}"
                    lines.append(f"    epi(c{r}_{h}.{c}, {ez}, row{r}, {col});")
        lines.append("}")
        return "\n".join(lines) + "\n"

    def _k_tile(self, stage: int | None, nxt: str, prefetch: bool) -> list[str]:
        """One K tile of the main loop: prefetch K tile `nxt` into registers, multiply-accumulate from workgroup
        stage `stage` (None: t & 1), store the prefetched tile into the other stage, barrier.

        The prefetch is unconditional: the last tile reloads itself (`nxt` clamps to nt - 1) into the idle stage,
        in range and never read. A branch around it (`if (t + 1 < nt)`) cost 13-25 % on an H200 (35 -> 40-42
        TFLOP/s at 4096^3, bench_gemm_tiles.py): NVIDIA's compiler no longer interleaves the loads with the FMAs."""
        t = self.tile
        rows, cols = t.tm, t.tn // 4
        sa, sb = t.bk * t.bm // 4, t.bk * t.bn // 4
        if stage is None:
            lines = [f"        let sa = (t & 1u) * {u(sa)} + ty;", f"        let sb = (t & 1u) * {u(sb)} + tx;"]
            other = "((t + 1u) & 1u)"
        else:
            lines = [f"        let sa = {u(stage * sa)} + ty;", f"        let sb = {u(stage * sb)} + tx;"]
            other = u(1 - stage)
        if prefetch:
            lines += ["        {", f"        let k0 = (kt0 + {nxt}) * {u(t.bk)};", *self.a.load(t, "k0"),
                      *self.b.load(t, "k0"), "        }"]
        for kk in range(t.bk):
            lines.append("        {")
            for g in range(rows // 4):
                lines.append(f"        let a{g} = As[sa + {u(kk * t.bm // 4 + g * t.ty)}];")
            for h in range(cols):
                lines.append(f"        let b{h} = Bs[sb + {u(kk * t.bn // 4 + h * t.tx)}];")
            for r in range(rows):
                for h in range(cols):
                    lines.append(f"        c{r}_{h} += a{r // 4}.{'xyzw'[r % 4]} * b{h};")
            lines.append("        }")
        if prefetch:
            lines += ["        {", f"        let ns = {other};", *self.a.store(t, "As", f"ns * {u(sa)}"),
                      *self.b.store(t, "Bs", f"ns * {u(sb)}"), "        }"]
        # Braces: each K tile (two per iteration with unroll2) declares its own sa, sb, k0, ns.
        return ["        {", *lines, "        workgroupBarrier();", "        }"]

    def _thread_coords(self) -> list[str]:
        """(tx, ty) of this thread in the tile's TX x TY thread grid."""
        t = self.tile
        if t.warp:
            # A 32-thread warp covers 8 x 4 threads (lanes 0-7 along x), not a 32 x 1 strip: per K step it
            # reads 4 distinct A and 8 distinct B vec4s from workgroup memory.
            wx = t.tx // 8
            return [f"    let tx = ((lid >> 5u) & {u(wx - 1)}) * 8u + (lid & 7u);",
                    f"    let ty = (lid >> {u(5 + log2(wx))}) * 4u + ((lid >> 3u) & 3u);"]
        return [f"    let tx = lid & {u(t.tx - 1)};", f"    let ty = lid >> {u(log2(t.tx))};"]

    def record(self, be: WgpuBackend) -> list:
        (gx, gy, gz), _ = self.grid()
        src = self.source()
        label = f"{self.name}:{self.tile}" + (f":split{self.splits}" if self.splits > 1 else "")
        return [be.dispatch(be.pipeline(label, src), self.binds.buffers(), (gx, gy, gz), label)]


REDUCE_WORKGROUP = 256
# A function building one operand's loader for a tile, given the bindings it registers its buffer with.
LoaderFactory = Callable[[Bindings, Tile], Loader]
# A function building the epilogue given the bindings and whether M / N need edge guards.
EpilogueFactory = Callable[[Bindings, bool, bool], Epilogue]


def record_gemm_kernel(be: WgpuBackend, name: str, m: int, n: int, k: int, z: int, out_handle: Any,
                       make_a: LoaderFactory, make_b: LoaderFactory, make_epilogue: EpilogueFactory,
                       notes: list[str], windows: dict[int, tuple[int, int]] | None = None,
                       types: dict[Any, str] | None = None, plan: tuple[Tile, int] | None = None) -> list:
    """Record the tiled kernel with `plan` = (tile, K splits), plus the split-K reduce kernel when K is split.
    Without a plan, autotune.choose picks one (plan_gemm's heuristic, or a tuned choice; see autotune.py).
    `types`: WGSL storage type per handle (Bindings).
    `windows`: sub-ranges to bind of big allocations (Bindings); the loaders' offsets are relative to them."""
    if plan is None:
        from . import autotune

        plan = autotune.choose(be, name, m, n, k, z, out_handle, make_a, make_b, windows, lambda p: record_gemm_kernel(
            be, name, m, n, k, z, out_handle, make_a, make_b, make_epilogue, notes, windows, types, p), types=types)
    tile, splits = plan
    guard_m, guard_n = m % tile.bm != 0, n % tile.bn != 0
    if splits == 1:
        binds = Bindings(out_handle, windows, types)
        la, lb = make_a(binds, tile), make_b(binds, tile)
        ep = make_epilogue(binds, guard_m, guard_n)
        return GemmProblem(name, tile, m, n, k, z, la, lb, ep, binds, notes=notes).record(be)
    # Split K: partial sums part[s, z, m, n] in a buffer of the kernel's own, then out = epi(sum over s).
    total = z * m * n
    scratch = be.scratch("split-K partial sums", splits * total * 4)
    binds = Bindings(scratch, windows, types)  # partial sums stay f32
    la, lb = make_a(binds, tile), make_b(binds, tile)
    conds = ([f"m >= {u(m)}"] if guard_m else []) + ([f"n >= {u(n)}"] if guard_n else [])
    partial = Epilogue(f"(z * {u(m)} + m) * {u(n)} + n", guard=" || ".join(conds) or None)
    steps = GemmProblem(name, tile, m, n, k, z, la, lb, partial, binds, notes=notes, splits=splits).record(be)
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
                           EPILOGUE=ep.function(rbinds), WORKGROUP=REDUCE_WORKGROUP, TOTAL=u(total), M=u(m), N=u(n),
                           SPLITS=u(splits), PART=rbinds.var(scratch))
    label = f"{name}:splitk_reduce"
    return steps + [be.dispatch(be.pipeline(label, src), rbinds.buffers(), grid, label)]


# ---- the generic strided kernel --------------------------------------------------------------------------------
STRIDED_TILE = 16


def record_strided(be: WgpuBackend, a: View, b: View, out: View, ep: Epilogue, binds: Bindings) -> list:
    nb, m, k = a.shape
    n = b.shape[2]
    tn, tm = math.ceil(n / STRIDED_TILE), math.ceil(m / STRIDED_TILE)
    linear = max(tn, tm, nb) > WORKGROUPS_PER_DIM
    grid = grid_1d(tn * tm * nb) if linear else (tn, tm, nb)
    if linear:
        coords = (f"let wg = wid.y * nwg.x + wid.x;\n    if (wg >= {u(tn * tm * nb)}) {{ return; }}\n"
                  f"    let z = wg / {u(tn * tm)};\n    let tile_m = (wg % {u(tn * tm)}) / {u(tn)};\n"
                  f"    let tile_n = wg % {u(tn)};")
    else:
        coords = "let tile_n = wid.x;\n    let tile_m = wid.y;\n    let z = wid.z;"
    a_idx = addr(a.offset, [("z", a.strides[0]), ("gm", a.strides[1]), ("ak", a.strides[2])])
    b_idx = addr(b.offset, [("z", b.strides[0]), ("bk", b.strides[1]), ("gn", b.strides[2])])
    header = "\n".join([
        f"// ember strided matmul: Z={nb} x (M={m} x K={k}) @ (K x N={n}); A strides {a.strides}, B strides "
        f"{b.strides}", "// Bindings (group 0):", *binds.comment(),
        f"// Dispatch grid: {grid}" + (" (linearised z, m tile, n tile)" if linear else " = (N tiles, M tiles, Z)")])
    src = be.kernel_source(
        "matmul_strided", HEADER=header, PRELUDE=PRELUDE, BINDINGS="\n".join(binds.declarations()),
        EPILOGUE=ep.function(binds), COORDS=coords, M=u(m), N=u(n), K=u(k), KTILES=u(math.ceil(k / STRIDED_TILE)),
        LOAD_A=binds.scalar(a.handle, a_idx), LOAD_B=binds.scalar(b.handle, b_idx))
    label = "matmul_strided"
    return [be.dispatch(be.pipeline(label, src), binds.buffers(), grid, label)]


# ---- buffers above the adapter's max storage-buffer binding size ------------------------------------------------
# A dispatch may bind at most `be.max_binding` bytes of a buffer (lavapipe: 128 MiB; VGG19's first FC weight is
# 411 MB). A view into a bigger allocation binds just the aligned byte range it touches (a *window*: offsets
# multiples of min-storage-buffer-offset-alignment and of 16, so vec4 indexing keeps its phase; the end rounded up
# to 16 bytes, so a vec4 read of a partial last quad stays inside the binding). A problem whose windows are still
# too big is halved along N, M, Z or K, whichever shrinks the excess most (N first on ties), and each half recorded
# on its own; K halves run one after the other, the second adding to the first's output through bias = out, and
# only the last applies the activation.
Window = tuple[int, int]  # (byte offset, byte size) of a binding


def binding_windows(be: WgpuBackend, views: list[View | None]) -> dict[int, Window]:
    """For each allocation bigger than be.max_binding, the aligned byte range covering every view into it (views of
    one buffer share its binding)."""
    spans: dict[int, tuple[int, int]] = {}
    itemsize: dict[int, int] = {}
    for v in views:
        if v is None or v.size == 0:
            continue
        lo, hi = view_span(v)
        if v.handle in spans:
            lo, hi = min(lo, spans[v.handle][0]), max(hi, spans[v.handle][1])
        spans[v.handle] = (lo, hi)
        itemsize[v.handle] = np.dtype(v.dtype).itemsize
    align = max(16, int(be.limits.get("min-storage-buffer-offset-alignment", 256)))
    windows = {}
    for h, (lo, hi) in spans.items():
        size = be.buffer(h).size
        if size > be.max_binding:
            isz = itemsize[h]
            start = lo * isz // align * align
            windows[h] = (start, min(size, -(-(hi + 1) * isz // 16) * 16) - start)
    return windows


def _excess(be: WgpuBackend, views: tuple[View | None, ...]) -> int:
    return sum(max(0, size - be.max_binding) for _, size in binding_windows(be, list(views)).values())


def rebase_view(v: View | None, windows: dict[int, Window]) -> View | None:
    """v with its offset counted from the start of its buffer's window."""
    if v is None or v.handle not in windows:
        return v
    return View(v.handle, v.dtype, v.shape, v.strides, v.offset - windows[v.handle][0] // np.dtype(v.dtype).itemsize)


def _narrow(v: View | None, dim: int, start: int, length: int) -> View | None:
    if v is None:
        return None
    shape = v.shape[:dim] + (length,) + v.shape[dim + 1:]
    return View(v.handle, v.dtype, shape, v.strides, v.offset + start * v.strides[dim])


Part = tuple[View, View, View, View | None, View | None]  # a, b, out, bias, residual


def _halves(a: View, b: View, out: View, bias: View | None, residual: View | None, dim: str) -> list[Part]:
    """The two halves of a (B, M, K) @ (B, K, N) problem along dim z, m, n or k (k: out, bias and residual are
    shared)."""
    nb, m, k = a.shape
    size = {"z": nb, "m": m, "n": b.shape[2], "k": k}[dim]
    parts = []
    for start, length in ((0, size // 2), (size // 2, size - size // 2)):
        if dim == "z":
            parts.append(tuple(_narrow(v, 0, start, length) for v in (a, b, out, bias, residual)))
        elif dim == "m":
            parts.append((_narrow(a, 1, start, length), b, *(_narrow(v, 1, start, length)
                                                              for v in (out, bias, residual))))
        elif dim == "n":
            parts.append((a, *(_narrow(v, 2, start, length) for v in (b, out, bias, residual))))
        else:
            parts.append((_narrow(a, 2, start, length), _narrow(b, 1, start, length), out, bias, residual))
    return parts


def record_split(be: WgpuBackend, a: View, b: View, out: View, bias: View | None, alpha: float, beta: float,
                 act: Expr | None, residual: View | None = None) -> list:
    """Record a matmul whose operands need more than be.max_binding bytes of some buffer as two halves."""
    nb, m, k = a.shape
    now = _excess(be, (a, b, out, bias, residual))
    best = None
    for dim, size in (("n", b.shape[2]), ("m", m), ("z", nb), ("k", k)):
        if size >= 2:
            parts = _halves(a, b, out, bias, residual, dim)
            cost = max(_excess(be, p) for p in parts)
            if best is None or cost < best[0]:
                best = (cost, dim, parts)
    if best is None or best[0] >= now:
        raise NotImplementedError(
            f"wgpu matmul: a {a.shape} @ b {b.shape} needs more than max-storage-buffer-binding-size "
            f"({be.max_binding} bytes) of one buffer, and no split of it binds less")
    _, dim, parts = best
    if dim == "k":
        (a0, b0, *_), (a1, b1, *_) = parts
        return (record_matmul(be, a0, b0, out, alpha=alpha, bias=bias, beta=beta, residual=residual)
                + record_matmul(be, a1, b1, out, alpha=alpha, bias=out, beta=1.0, act=act))
    steps = []
    for pa, pb, po, pbias, pres in parts:
        steps += record_matmul(be, pa, pb, po, alpha=alpha, bias=pbias, beta=beta, act=act, residual=pres)
    return steps


# ---- entry point ---------------------------------------------------------------------------------------------
def record_matmul(be: WgpuBackend, a: View, b: View, out: View, *, alpha: float = 1.0, bias: View | None = None,
                  beta: float = 1.0, act: Expr | None = None, residual: View | None = None) -> list:
    """out = act(alpha * a @ b + beta * bias + residual); `residual` (a residual connection) is read-only and must
    not overlap out."""
    types = require_float("matmul", a=a, b=b, out=out, bias=bias, residual=residual)
    for name, v in (("a", a), ("b", b), ("out", out)):
        if len(v.shape) != 3:
            raise ValueError(f"matmul: {name} must be a 3-D view (B, rows, cols), got shape {v.shape}")
    nb, m, k = a.shape
    if b.shape[0] != nb or b.shape[1] != k or out.shape != (nb, m, b.shape[2]):
        raise ValueError(f"matmul: shapes a {a.shape} @ b {b.shape} -> out {out.shape} do not match "
                         "(B, M, K) @ (B, K, N) -> (B, M, N)")
    n = b.shape[2]
    if out.size == 0:
        return []
    alpha, beta = float(alpha), float(beta)
    if bias is not None and beta == 0.0:
        bias = None  # BLAS: beta = 0 ignores the old contents, NaN included
    if bias is not None:
        bias = bias.broadcast_to(out.shape)
    if residual is not None:
        residual = residual.broadcast_to(out.shape)
        check_no_overlap(residual, out, "residual")
    for name, v in (("a", a), ("b", b), ("out", out), ("bias", bias), ("residual", residual)):
        if v is not None:
            check_view(be, v, name)
    if any(s == 0 for d, s in zip(out.shape, out.strides, strict=True) if d > 1):
        raise ValueError(f"out: a broadcast (stride 0) output view {out.strides} would write elements twice")
    check_no_overlap(a, out, "a")
    check_no_overlap(b, out, "b")
    # bias may be out itself (gemm's beta * C; split K's running sum): the same elements, whatever the strides of
    # size-1 dims say; anything else in out's buffer must stay clear of it.
    if bias is not None and bias.handle == out.handle and (bias.offset != out.offset or any(
            s != t for d, s, t in zip(out.shape, bias.strides, out.strides, strict=True) if d > 1)):
        check_no_overlap(bias, out, "bias")

    windows = binding_windows(be, [a, b, out, bias, residual])
    if any(size > be.max_binding for _, size in windows.values()):
        return record_split(be, a, b, out, bias, alpha, beta, act, residual)
    if windows:
        a, b, out, bias, residual = (rebase_view(v, windows) for v in (a, b, out, bias, residual))
    binds = Bindings(out.handle, windows, types)
    a_unit = (k == 1 or a.strides[2] == 1 or m == 1 or a.strides[1] == 1)
    b_unit = (n == 1 or b.strides[2] == 1 or k == 1 or b.strides[1] == 1)
    if not (a_unit and b_unit) or any(s < 0 for s in a.strides + b.strides):
        binds.add(a.handle, False)
        binds.add(b.handle, False)
        for v in (bias, residual):
            if v is not None:
                binds.add(v.handle, False)
        ep = matmul_epilogue(out, bias, alpha, beta, act, m, n, True, True, residual)
        return record_strided(be, a, b, out, ep, binds)

    def make_a(binds: Bindings, tile: Tile) -> Loader:
        return strided_loader("a", tile.bm, binds, a.handle, a.offset, a.strides[0], a.strides[1], a.strides[2], m, k,
                              nb)

    def make_b(binds: Bindings, tile: Tile) -> Loader:
        return strided_loader("b", tile.bn, binds, b.handle, b.offset, b.strides[0], b.strides[2], b.strides[1], n, k,
                              nb)

    def make_epilogue(binds: Bindings, guard_m: bool, guard_n: bool) -> Epilogue:
        for v in (bias, residual):
            if v is not None:
                binds.add(v.handle, False)
        return matmul_epilogue(out, bias, alpha, beta, act, m, n, guard_m, guard_n, residual)

    notes = [f"A {a.shape} strides {a.strides}, B {b.shape} strides {b.strides}"]
    notes += [f"allocation {h} bound from byte {off}, {size} bytes" for h, (off, size) in windows.items()]
    return record_gemm_kernel(be, "matmul", m, n, k, nb, out.handle, make_a, make_b, make_epilogue, notes, windows,
                              types)


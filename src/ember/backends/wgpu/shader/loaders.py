"""Operand loaders of the generated GEMM kernel: one operand's BK x BX tile from memory to workgroup memory."""

from __future__ import annotations

from dataclasses import dataclass

from .bindings import Bindings
from .lifted import Lifted, addr, quarter, u32
from .tiles import Tile
from .wgsl import log2


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
    """Operand element (z, x, k) at off + z*sz + x*sx + k*sk, of extent X x K. Quads run along `quad` ('x'/'k').
    Any of off, sz, sx and x_size may be Lifted (read at run time): the edge guards along X are then always there."""

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
        v = "lid" if q == 0 else f"(lid + {u32(q * tile.threads)})"
        if self.quad == "x":
            kr, xq = f"({v} >> {u32(log2(bx4))})", f"(({v} & {u32(bx4 - 1)}) << 2u)"
            return xq, kr, f"{kr} * {u32(bx4)} + ({v} & {u32(bx4 - 1)})"
        xq, kr = f"({v} >> {u32(log2(bk4))})", f"(({v} & {u32(bk4 - 1)}) << 2u)"
        return xq, kr, f"{kr} * {u32(bx4)} + ({xq} >> 2u)"

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
        guard_x = isinstance(self.x_size, Lifted) or self.x_size % self.tile_x != 0
        guard_k = self.k_size % tile.bk != 0
        lines = []
        for q in range(self.quads(tile)):
            reg, xv, kv = f"{p}r{q}", f"{p}_x{q}", f"{p}gk{q}"
            lines.append(f"        {reg} = vec4<f32>(0.0);")
            lines.append(f"        let {kv} = {k0} + {p}_k{q};")
            conds = [f"{xv} < {u32(self.x_size)}"] if guard_x else []
            conds += [f"{kv} < {u32(self.k_size)}"] if guard_k else []
            ind = "        "
            if conds:
                lines.append(f"        if ({' && '.join(conds)}) {{")
                ind = "            "
            along, along_size = (xv, self.x_size) if self.quad == "x" else (kv, self.k_size)
            partial = isinstance(along_size, Lifted) or along_size % 4 != 0  # a quad may cross the edge
            if self.vec4:
                # Aligned: the quad's first element is in range, so the whole vec4 lies in the (16-byte padded)
                # buffer; components past the edge are masked to zero.
                if self.quad == "x":
                    idx = addr(quarter(self.off), [("z", quarter(self.sz)), (f"({xv} >> 2u)", 1),
                                                   (kv, quarter(self.sk))])
                else:
                    idx = addr(quarter(self.off), [("z", quarter(self.sz)), (xv, quarter(self.sx)),
                                                   (f"({kv} >> 2u)", 1)])
                lines.append(f"{ind}{reg} = {binds.quad(self.handle, idx)};")
                if partial:
                    lines.append(f"{ind}{reg} = select(vec4<f32>(0.0), {reg}, vec4<u32>({along}) + "
                                 f"vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>({u32(along_size)}));")
            else:
                base = f"{p}e{q}"
                lines.append(f"{ind}let {base} = {addr(self.off, [('z', self.sz), (xv, self.sx), (kv, self.sk)])};")
                step = self.sx if self.quad == "x" else self.sk
                for i, c in enumerate("xyzw"):
                    e = base if i == 0 else (f"{base} + {u32(i * step)}" if step >= 0 else f"{base} - {u32(-i * step)}")
                    load = f"{reg}.{c} = {binds.scalar(self.handle, e)};"
                    if partial and i:
                        lines.append(f"{ind}if ({along} + {u32(i)} < {u32(along_size)}) {{ {load} }}")
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
                    lines.append(f"        {smem}[{base} + {p}_s{q} + {u32(i * bx4)}][{p}_c{q}] = {reg}.{c};")
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


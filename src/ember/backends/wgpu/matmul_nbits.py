"""MatMulNBits on the GPU: kernels/matmul_nbits.wgsl, the block-quantised weight read packed (u32 words of codes)
and dequantised in the kernel, specialised per shape, bit width and optional input.

Two paths in one template: a GEMV for small M (decode: M = 1), where a workgroup takes COLS output columns with
256 / COLS invocations each striding over the column's words, their sums combined by a tree in workgroup memory
(no subgroups); and a tiled kernel for larger M, 64 x 64 outputs a workgroup over K steps of 16, the dequantised
slice of W staged in workgroup memory once for the tile's 64 rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...core.view import View
from .program import grid_1d, kernel, storage_type

if TYPE_CHECKING:
    from .backend import WgpuBackend

GEMV_MAX_M = 4  # up to this many rows, the GEMV (each row re-reads the weight; the tiled kernel reads it once a tile)
GEMV_COLS = 8  # output columns a GEMV workgroup: 32 invocations a column
TILE = 64


@kernel("record_matmul_nbits")
def record_matmul_nbits(be: WgpuBackend, a: View, packed: View, scales: View, zeros: View | None, out: View, *,
                        k: int, n: int, bits: int, block_size: int, bias: View | None = None,
                        g_idx: View | None = None, const_weight: bool = False) -> list[Any]:
    views = [v for v in (a, packed, scales, zeros, g_idx, bias, out) if v is not None]
    if not all(v.is_contiguous() for v in views):
        raise ValueError("wgpu MatMulNBits: views must be contiguous")
    m = a.shape[0]
    if m == 0:
        return []
    t = storage_type(a.dtype)
    if any(storage_type(v.dtype) != t for v in (scales, zeros, bias, out) if v is not None):
        raise NotImplementedError(f"wgpu MatMulNBits: a, scales, zeros, bias and out must share a dtype ({a.dtype})")
    n_blocks = scales.shape[1]
    gemv = m <= GEMV_MAX_M
    groups = m * -(-n // GEMV_COLS) if gemv else -(-m // TILE) * -(-n // TILE)
    decls = [f"@group(0) @binding(0) var<storage, read> a: array<{t}>;",
             "@group(0) @binding(1) var<storage, read> w: array<u32>;",
             f"@group(0) @binding(2) var<storage, read> scales: array<{t}>;"]
    buffers = {0: a.handle, 1: packed.handle, 2: scales.handle, 6: out.handle}
    zero_of = f"return {float(1 << (bits - 1))};"
    if zeros is not None:
        decls.append(f"@group(0) @binding(3) var<storage, read> zeros: array<{t}>;")
        buffers[3] = zeros.handle
        zero_of = f"return f32(zeros[{zeros.offset}u + i]);"
    block_of = "return k / BS;"
    if g_idx is not None:
        decls.append("@group(0) @binding(4) var<storage, read> g_idx: array<i32>;")
        buffers[4] = g_idx.handle
        block_of = f"return u32(clamp(g_idx[{g_idx.offset}u + k], 0, {n_blocks - 1}));"
    bias_of = "return 0.0;"
    if bias is not None:
        decls.append(f"@group(0) @binding(5) var<storage, read> bias: array<{t}>;")
        buffers[5] = bias.handle
        bias_of = f"return f32(bias[{bias.offset}u + n]);"
    decls.append(f"@group(0) @binding(6) var<storage, read_write> out: array<{t}>;")
    src = be.kernel_source("matmul_nbits", BINDINGS="\n".join(decls), T=t, M=m, N=n, K=k, NB=n_blocks,
                           BS=block_size, WPC=packed.shape[1], BITS=bits, GROUPS=groups, COLS=GEMV_COLS,
                           BLOCK_OF=block_of, ZERO_OF=zero_of, BIAS_OF=bias_of, A_OFF=a.offset,
                           S_OFF=scales.offset, W_OFF=packed.offset, OUT_OFF=out.offset,
                           KERNEL="gemv" if gemv else "tiled")
    label = "matmul_nbits.gemv" if gemv else "matmul_nbits.tiled"
    return [be.dispatch(be.pipeline(label, src), buffers, grid_1d(groups), label)]

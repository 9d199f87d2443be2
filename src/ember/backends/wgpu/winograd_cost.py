"""When the wgpu backend takes Winograd F(m, 3) for a 3x3 stride-1 conv (WgpuBackend.winograd_tile): a roofline
estimate of the Winograd kernels (winograd.py) against the implicit-GEMM conv, per adapter kind.

Hardware GPUs: a 3x3 stride-1 conv goes through Winograd when its direct form does at least WINOGRAD_MIN_MACS
multiply-adds (N*P*Q*C*K*9), both channel counts are at least WINOGRAD_MIN_CHANNELS, and the roofline estimate
(estimate_s) says the best F(m, 3) is WINOGRAD_MIN_GAIN times faster than the implicit-GEMM conv. ResNet-18's
3x3 stride-1 convs do 116 M MACs each at batch 1 and 925 M at batch 8: the default threshold takes batch 8 and
leaves batch 1 to the direct kernel (three launches and two scratch round trips on short convs).
Tune it on the GPU with bench/bench_kernels.py --only conv --variant winograd=0/2/4 (in models: bench_ab.py
--set winograd=0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ...core import winograd as winograd_math
from .program import kernel
from .shader import tiles
from .winograd import WinoShape, chunking

if TYPE_CHECKING:
    from .backend import WgpuBackend

WINOGRAD_MIN_MACS = 256 * 1000 * 1000
WINOGRAD_MIN_CHANNELS = 32
WINOGRAD_MIN_GAIN = 1.15
# Tiles the rule picks from, float16 models included: they get a float32 U (ops/nn.py), since with U rounded to
# f16 F(4, 3)'s output transform (entries up to 8) amplified that rounding several times over.
AUTO_TILES = (2, 4)


@dataclass(frozen=True)
class CostProfile:
    """The roofline estimate's machine: each kernel takes max(flops / gemm_flops, bytes / memory_bw) + launch_s,
    the GEMMs' flops counted over whole tiles (plan_gemm's), so a narrow product (batch 1 at 7x7: 4 tiles of
    F(4,3) in a 64-wide GEMM tile) pays its waste."""

    gemm_flops: float
    memory_bw: float
    launch_s: float
    min_macs: int
    min_gain: float


# Rough figures of a large GPU through Vulkan (the generated kernel's throughput on convs, achieved memory
# bandwidth; BENCHMARKS.md).
HARDWARE = CostProfile(20e12, 3e12, 3e-6, WINOGRAD_MIN_MACS, WINOGRAD_MIN_GAIN)
# Software adapters (lavapipe): the model's tile-padded flops matched the measured ratios
# between the kernels (BENCHMARKS.md). Only clear wins there, and only on convs big enough that a test's small
# layers keep running the direct kernels.
SOFTWARE = CostProfile(3e9, 1.5e9, 50e-6, 50 * 1000 * 1000, 1.5)


def profile(be: WgpuBackend) -> CostProfile:
    return SOFTWARE if be.adapter.info.get("adapter_type") == "CPU" else HARDWARE


def _gemm_s(be: WgpuBackend, cp: CostProfile, m: int, n: int, k: int, z: int, nbytes: float) -> float:
    tile, _ = tiles.plan_gemm(be, m, n, k, z)
    flops = 2.0 * z * math.ceil(m / tile.bm) * tile.bm * math.ceil(n / tile.bn) * tile.bn * k
    return max(flops / cp.gemm_flops, nbytes / cp.memory_bw) + cp.launch_s


def estimate_s(be: WgpuBackend, n: int, c: int, k: int, p: int, q: int, itemsize: int, m: int | None,
               cp: CostProfile | None = None) -> float:
    """Roofline seconds of a 3x3 stride-1 conv: direct (m None: the implicit GEMM) or Winograd F(m, 3)."""
    cp = cp or profile(be)
    x_bytes, out_bytes = itemsize * n * c * (p + 2) * (q + 2), itemsize * n * k * p * q
    if m is None:
        return _gemm_s(be, cp, k, n * p * q, 9 * c, 1, x_bytes + out_bytes + itemsize * 9 * k * c)
    a2 = (m + 2) ** 2
    th, tw = winograd_math.tiles(p, q, m)
    t = n * th * tw
    v_bytes, m_bytes = 4.0 * a2 * c * t, 4.0 * a2 * k * t
    transforms = (x_bytes + v_bytes + m_bytes + out_bytes) / cp.memory_bw + 2 * cp.launch_s
    return transforms + _gemm_s(be, cp, k, t, c, a2, itemsize * a2 * k * c + v_bytes + m_bytes)


@kernel("winograd_tile")
def choose_tile(be: WgpuBackend, n: int, c: int, k: int, p: int, q: int, dtype: Any) -> int | None:
    """WgpuBackend.winograd_tile: the F(m, 3) to run a 3x3 stride-1 conv with, or None for the direct conv."""
    cp = profile(be)
    if n * p * q * c * k * 9 < cp.min_macs or min(c, k) < WINOGRAD_MIN_CHANNELS:
        return None
    itemsize = np.dtype(dtype).itemsize
    direct = estimate_s(be, n, c, k, p, q, itemsize, None, cp)
    best = min(AUTO_TILES, key=lambda m: estimate_s(be, n, c, k, p, q, itemsize, m, cp))
    if estimate_s(be, n, c, k, p, q, itemsize, best, cp) * cp.min_gain > direct:
        return None
    try:
        chunking(be, WinoShape(n, c, p + 2, q + 2, k, p, q, 1, 1, best))
    except NotImplementedError:
        return None
    return best

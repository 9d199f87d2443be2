"""Tiles of the generated GEMM kernel (gemm.py) and the heuristic picking one per problem (`plan_gemm`).

Its callers (autotune.py, winograd_cost.py) look plan_gemm up through this module, so replacing it here (a test
forcing a tile) reaches all of them."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..backend import WgpuBackend


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
    # 256 threads, 32 vec4 accumulators each, 48 KiB of workgroup memory: the fastest tile on big products
    # where it fits (BENCHMARKS.md).
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


# Runtime sizes (M read from a uniform, resize.probe_sizes): one kernel for every M of a template, so the tile must
# not move with M. A live plan (ember/plan/live.py) keeps one kernel over its whole range of lengths, in both
# directions, and its check probes every length it moves to: a tile that changed at some M would be a different
# kernel there. So M has one class, planned as RUNTIME_M rows, with no K splits (their partial-sum buffer would
# be sized by M).
RUNTIME_M = 1024


def plan_runtime(be: WgpuBackend, n: int, k: int, z: int) -> tuple[Tile, int]:
    """(tile, 1) for Z products of (M x K) @ (K x N) whose M is read at run time: plan_gemm's tile at RUNTIME_M
    rows; where it would split K, the tile it splits, or the 32 x 32 one where that leaves the GPU idle."""
    tile, splits = plan_gemm(be, RUNTIME_M, n, k, z)
    if splits > 1 and math.ceil(RUNTIME_M / tile.bm) * math.ceil(n / tile.bn) * z < SMALL_BELOW:
        tile = TILES["small"]
    return tile, 1

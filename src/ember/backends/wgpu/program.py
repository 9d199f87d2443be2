"""The program layer of the wgpu backend: what a kernel records and what it needs to know about the device.

- Step types: a recorded `Dispatch` (pipeline, bind group, grid) or buffer `Copy`, and `Replay`, steps resolved
  to wgpu-native handles for the replay loop (WgpuBackend.prepare).
- Grids: `grid_1d` spreads a linear workgroup count over x and y (WORKGROUPS_PER_DIM each).
- Storage types: the WGSL element type a logical dtype is stored as (`storage_type`, NUMPY_STORAGE), the
  host's conversions to and from it (`to_storage`, `from_storage`) and the f16 <-> f32 casts around loads and
  stores (`as_f32`, `from_f32`). float64 is double-float (DF64: a vec2<f32> (hi, lo), kernels/df64.wgsl).
- The kernel table: kernel modules register their record functions by name (`@kernel("record_matmul")`), and
  WgpuBackend's ComputeBackend methods look them up in KERNELS, so the backend imports no kernel module and no
  kernel module imports the backend (the package's __init__ imports both, which fills the table).

Nothing here imports another module of the package.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from importlib import resources
from typing import Any, NamedTuple, TypeVar

import numpy as np

# WebGPU buffer sizes and copy sizes must be multiples of 4; 16 keeps vec4 loads of a tail in bounds.
BUFFER_ALIGN = 16
WORKGROUPS_PER_DIM = 65535


class Dispatch(NamedTuple):
    pipeline: Any
    bind_group: Any
    grid: tuple[int, int, int]
    label: str
    # GPUBuffers bound directly (a kernel's scratch): a bind group keeps the native buffer alive but not wgpu-py's
    # object, and backend.scratch shares a buffer only while some recorded step holds that object.
    keep: tuple = ()
    entries: tuple = ()  # the bind group's entries (resize.py binds a moved dispatch's sizes elsewhere)


class Copy(NamedTuple):
    src: Any
    src_offset: int
    dst: Any
    dst_offset: int
    size: int


class Replay(NamedTuple):
    """Steps resolved once to wgpu-native handles, so a replay's loop does no attribute lookups.

    `segments`: per compute pass a list of (pipeline, bind group, x, y, z), where pipeline / bind group are
    None when the previous dispatch of the pass set the same one; per copy a tuple of
    copyBufferToBuffer's arguments. `steps` keeps the wgpu-py objects owning those handles alive.
    `ahead`: the next run's command buffer, encoded while the GPU works on this run (0 or 1 raw handles).
    """

    steps: list
    segments: list
    ahead: list


def grid_1d(groups: int) -> tuple[int, int, int]:
    """Spread `groups` workgroups over x and y: each dimension is capped at 65,535."""
    if groups <= WORKGROUPS_PER_DIM:
        return (max(groups, 1), 1, 1)
    rows = -(-groups // WORKGROUPS_PER_DIM)
    return (-(-groups // rows), rows, 1)


def sizes_words(count: int) -> int:
    """vec4s of the uniform array holding `count` runtime sizes (at least one: WGSL has no empty arrays)."""
    return max(-(-count // 4), 1)


def sizes_buffer(be: Any, values: list[int]) -> Any:
    """The uniform buffer sizes_decl declares, holding `values`: int32s, padded to whole vec4s."""
    words = np.zeros(sizes_words(len(values)) * 4, np.int32)
    words[:len(values)] = values
    return be.uniform_buffer(words.tobytes())


def sizes_decl(binding: int, count: int) -> str:
    """The uniform array `sz` of a kernel whose sizes arrive at run time (sizes_buffer fills it):
    size k is sz[k / 4][k % 4], an i32."""
    return f"@group(0) @binding({binding}) var<uniform> sz: array<vec4<i32>, {sizes_words(count)}>;"


# ---- storage types ------------------------------------------------------------------------------------------
# float64 as double-float: two f32 words (hi, lo), hi = f32(x) rounded to nearest, lo = f32(x - hi); 8 bytes an
# element, as in IEEE float64. ~2^-48 relative precision with f32's exponent range (kernels/df64.wgsl).
DF64 = "vec2<f32>"


def storage_type(dtype: np.dtype) -> str:
    """The WGSL element type a logical dtype is stored as on the device."""
    kind = np.dtype(dtype).kind
    if kind == "f":
        if np.dtype(dtype).itemsize == 8:
            return DF64
        if np.dtype(dtype).itemsize > 8:
            raise NotImplementedError(f"wgpu backend: {np.dtype(dtype).name} tensors are not supported on the GPU")
        # float16 is stored as WGSL f16 (kernels compute in f32): needs the adapter's shader-f16 feature.
        return "f16" if np.dtype(dtype).itemsize == 2 else "f32"
    if kind == "b":
        return "u32"
    if kind in "iu":
        return "i32"  # WGSL has no 64-bit integers; int64 values are stored as i32 (checked on upload)
    raise NotImplementedError(f"wgpu backend: dtype {np.dtype(dtype).name} is not supported")


NUMPY_STORAGE = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16), "i32": np.dtype(np.int32),
                 "u32": np.dtype(np.uint32), DF64: np.dtype([("hi", np.float32), ("lo", np.float32)])}
F32_MAX = float(np.finfo(np.float32).max)


def to_storage(array: np.ndarray) -> np.ndarray:
    """A logical-dtype array as its device storage holds it: ints checked to fit int32, float64 split into
    (hi, lo) f32 pairs (a finite value past f32's range is a ValueError, not inf)."""
    st = NUMPY_STORAGE[storage_type(array.dtype)]
    if array.dtype == st:
        return array
    if array.dtype.kind in "iu" and array.size:
        lo, hi = int(array.min()), int(array.max())
        if lo < -(2**31) or hi >= 2**31:
            raise ValueError(f"wgpu backend: integer tensor values [{lo}, {hi}] do not fit in int32")
    if st.names is None:
        return array.astype(st)
    x = np.asarray(array, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        hi = x.astype(np.float32)
        big = np.isinf(hi) & np.isfinite(x)
        if big.any():
            worst = float(np.abs(x[big]).max())
            raise ValueError(f"wgpu backend: float64 tensor value {worst:.17g} exceeds float32's range "
                             f"(|x| <= {F32_MAX:.9g}), the exponent range of float64 (double-float) on the GPU")
        out = np.empty(x.shape, st)
        out["hi"] = hi
        out["lo"] = np.where(np.isfinite(x), x - hi, 0.0).astype(np.float32)
    return out


def from_storage(raw: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The logical-dtype values of device storage `raw` (to_storage's inverse): float64 is hi + lo."""
    if raw.dtype.names is None:
        return raw.astype(dtype)
    hi = raw["hi"].astype(np.float64)
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(hi) & (raw["lo"] != 0), hi + raw["lo"], hi).astype(dtype)  # -0 stays -0


@functools.cache
def df64_library() -> str:
    """kernels/df64.wgsl: the double-float functions a kernel touching float64 includes after the prelude."""
    return resources.files(__package__).joinpath("kernels", "df64.wgsl").read_text()


def as_f32(raw: str, storage: str, vec4: bool = False) -> str:
    """WGSL for a loaded float element (or vec4) as f32: kernels compute f16 storage in f32."""
    if storage != "f16":
        return raw
    return f"vec4<f32>({raw})" if vec4 else f"f32({raw})"


def from_f32(value: str, storage: str, vec4: bool = False) -> str:
    """WGSL for an f32 `value` (or vec4) converted for a store to `storage`: f16 is rounded once, here."""
    if storage != "f16":
        return value
    return f"vec4<f16>({value})" if vec4 else f"f16({value})"


# ---- the kernel table ---------------------------------------------------------------------------------------
class KernelTable(dict[str, Callable[..., Any]]):
    """Name -> the function implementing it; WgpuBackend calls KERNELS[name](backend, ...) once per recording."""

    def __missing__(self, name: str) -> Callable[..., Any]:
        raise LookupError(f"wgpu backend: no kernel registered as {name!r}; the kernel modules register theirs "
                          "when ember.backends.wgpu is imported")


KERNELS = KernelTable()
KernelFunction = TypeVar("KernelFunction", bound=Callable[..., Any])


def kernel(name: str) -> Callable[[KernelFunction], KernelFunction]:
    """Register the decorated function in KERNELS as `name` (a ComputeBackend method WgpuBackend forwards)."""

    def register(function: KernelFunction) -> KernelFunction:
        old = KERNELS.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (function.__module__, function.__qualname__):
            raise ValueError(f"wgpu backend: kernel {name!r} is registered twice ({old.__module__}, "
                             f"{function.__module__})")
        KERNELS[name] = function
        return function

    return register

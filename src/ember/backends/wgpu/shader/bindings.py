"""Bindings of a generated kernel and the host-side checks that let it run trusted.

`Bindings`: one binding per distinct buffer, the output's read_write; an operand in the output's buffer is read
through the output binding, since WebGPU forbids binding a buffer both read-only and writable in one dispatch.
The view checks (`check_view`, `check_no_overlap`) make every index a kernel computes land inside its buffer.

Buffers above the adapter's max storage-buffer binding size: a dispatch may bind at most `be.max_binding` bytes
of a buffer (lavapipe: 128 MiB; VGG19's first FC weight is 411 MB). A view into a bigger allocation binds just
the aligned byte range it touches (a *window*: offsets multiples of min-storage-buffer-offset-alignment and of
16, so vec4 indexing keeps its phase; the end rounded up to 16 bytes, so a vec4 read of a partial last quad stays
inside the binding); `rebase_view` counts a view's offset from its window's start.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ....core.view import View
from ..program import as_f32, from_f32

if TYPE_CHECKING:
    from ..backend import WgpuBackend

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)
Window = tuple[int, int]  # (byte offset, byte size) of a binding


# ---- host-side checks ---------------------------------------------------------------------------------------
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


def check_operands(be: WgpuBackend, out: View, **inputs: View | None) -> None:
    """check_view for the output and every given input, and check_no_overlap of each input with the output."""
    check_view(be, out, "out")
    for name, v in inputs.items():
        if v is not None:
            check_view(be, v, name)
            check_no_overlap(v, out, name)


# ---- bindings -------------------------------------------------------------------------------------------------
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
        # No allocation numbers: the text is the pipeline cache's key, and the same kernel over other buffers (another
        # plan's, another model's) must find the same pipeline.
        def name(h: Any) -> str:
            if isinstance(h, int):
                return "a window of a larger buffer" if h in self.windows else "a tensor"
            return getattr(h, "label", "") or "scratch buffer"

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


# ---- windows of buffers above the binding limit -------------------------------------------------------------
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


def rebase_view(v: View | None, windows: dict[int, Window]) -> View | None:
    """v with its offset counted from the start of its buffer's window."""
    if v is None or v.handle not in windows:
        return v
    return View(v.handle, v.dtype, v.shape, v.strides, v.offset - windows[v.handle][0] // np.dtype(v.dtype).itemsize)

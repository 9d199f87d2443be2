"""Sizes a generated kernel reads at run time (`runtime_sizes=True`): the GEMM's M, Z and the strides and offsets
that move with them, so one kernel serves every length of a template (ember/plan/live.py, resize.probe_sizes).

A `Lifted` is an int while the kernel is generated (its sign and zero tests may decide the text, which then
differs where they differ: another kernel, never a wrong one) and spells itself as its slot of the uniform array
`sz` (program.sizes_decl). Arithmetic on it gives a plain int, a literal in the text: a value the source bakes
in is in the source, so two probes with the same source differ only in the uniform values.
`u32` and `addr` are wgsl.py's for plain ints, character for character (the literal kernels stay as they are).
"""

from __future__ import annotations

from typing import Any

from ....core.view import View
from ..program import sizes_buffer, sizes_decl
from . import wgsl


class Lifted(int):
    """A size at slot `slot` of its kernel's uniform array."""

    slot: int
    owner: Sizes

    def __new__(cls, value: int, slot: int, owner: Sizes) -> Lifted:
        obj = super().__new__(cls, value)
        obj.slot, obj.owner = slot, owner
        return obj

    @property
    def i(self) -> str:
        """WGSL i32 expression."""
        return f"sz[{self.slot // 4}][{self.slot % 4}]"

    @property
    def u(self) -> str:
        """WGSL u32 expression."""
        return f"u32({self.i})"

    def quarter(self) -> Lifted:
        """The value / 4 (a vec4 index's stride or offset: the value is a multiple of 4), lifted too."""
        return self.owner.lift(int(self) // 4, ("quarter", self.slot))

    # Printed (a header comment, a loader's description) as its slot, so the text does not move with the value.
    __str__ = __repr__ = lambda self: self.i  # type: ignore[assignment]  # noqa: E731
    __format__ = lambda self, spec: self.i  # noqa: E731


class Sizes:
    """The values of one kernel's uniform array, in slot order. The first is the count of the work the kernel
    does, which its grid grows with (resize.probe_sizes' contract)."""

    def __init__(self) -> None:
        self.values: list[int] = []
        self._memo: dict[Any, Lifted] = {}

    def lift(self, value: int, key: Any = None) -> Lifted:
        if key is not None and key in self._memo:
            return self._memo[key]
        x = Lifted(int(value), len(self.values), self)
        self.values.append(int(value))
        if key is not None:
            self._memo[key] = x
        return x

    __call__ = lift

    def view(self, v: View | None, dims: tuple[int, ...]) -> View | None:
        """v with its offset and the strides of `dims` lifted."""
        if v is None:
            return None
        strides = tuple(self(s) if d in dims else s for d, s in enumerate(v.strides))
        return View(v.handle, v.dtype, v.shape, strides, self(v.offset))

    def declaration(self, binding: int) -> str:
        return sizes_decl(binding, len(self.values))

    def buffer(self, be: Any) -> Any:
        return sizes_buffer(be, self.values)


def quarter(x: int) -> int:
    return x.quarter() if isinstance(x, Lifted) else x // 4


def u32(v: int) -> str:
    return v.u if isinstance(v, Lifted) else wgsl.u32(v)


def addr(off: int, terms: list[tuple[str, int]]) -> str:
    """wgsl.addr with lifted strides and offset read from sz: a lifted term stays even where its value is 0 (the
    text does not move with it); u32 arithmetic where every value is >= 0, else i32."""
    if not isinstance(off, Lifted) and not any(isinstance(s, Lifted) for _, s in terms):
        return wgsl.addr(off, terms)
    terms = [(var, s) for var, s in terms if isinstance(s, Lifted) or s != 0]
    if off >= 0 and all(s >= 0 for _, s in terms):
        parts = [f"{var} * {s.u}" if isinstance(s, Lifted) else var if s == 1 else f"{var} * {wgsl.u32(s)}"
                 for var, s in terms]
        return " + ".join([*parts, u32(off)] if isinstance(off, Lifted) or off or not parts else parts)
    parts = [f"i32({var}) * {s.i}" if isinstance(s, Lifted) else f"i32({var})" if s == 1 else f"i32({var}) * {s}i"
             for var, s in terms]
    parts.append(off.i if isinstance(off, Lifted) else f"{off}i")
    return f"u32({' + '.join(parts)})"

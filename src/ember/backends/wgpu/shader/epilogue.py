"""The epilogue of the generated kernels: out[z, m, n] = act(alpha * acc + beta * bias[z, m, n] + residual)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ....core.expr import Expr
from .bindings import Bindings
from .emit import act_lines
from .wgsl import float_literal


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

"""The wgpu backend's shader library: the WGSL pieces its kernel generators share.

- wgsl: the prelude of helper functions every generated kernel may call, literals, address expressions.
- emit: the expression emitter (an Expr tree -> WGSL `let` statements), used by elementwise kernels and epilogues.
- bindings: one binding per distinct buffer, host-side view checks, windows of buffers above the binding limit.
- epilogue: how an accumulator at (z, m, n) reaches memory (alpha, bias, residual, activation, f16 rounding).
- tiles: the tiled GEMM kernel's tile shapes and the heuristic choosing one (plan_gemm).
- loaders: how an operand's tile reaches workgroup memory (strided, vec4 where aligned).

Nothing here records a dispatch or touches the device.
"""

"""RNN, GRU and LSTM, unrolled over the (static) sequence length."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ..core.expr import INT, Expr, call, inp
from ..core.view import View
from .base import Context, Op, Tensor, call_op, register
from .elementwise import emit
from .exprs import float_const, int_const
from .shape import copy_into, reshape_view, slice_view

_ALPHA = {"Affine": (1.0, 0.0), "LeakyRelu": (0.01, None), "ThresholdedRelu": (1.0, None), "ScaledTanh": (1.0, 1.0),
          "HardSigmoid": (0.2, 0.5), "Elu": (1.0, None)}


def activation(name: str, alpha: float | None, beta: float | None) -> Callable[[Expr], Expr]:
    a, b = _ALPHA.get(name, (None, None))
    a = a if alpha is None else alpha
    b = b if beta is None else beta
    simple = {"Relu": "relu", "Tanh": "tanh", "Sigmoid": "sigmoid", "Softsign": "softsign", "Softplus": "softplus"}
    if name in simple:
        return lambda x: call(simple[name], x)
    if name == "Affine":
        return lambda x: call("add", call("mul", float_const(a), x), float_const(b))
    if name == "LeakyRelu":
        return lambda x: call("where", call("lt", x, float_const(0.0)), call("mul", float_const(a), x), x)
    if name == "ThresholdedRelu":
        return lambda x: call("where", call("gt", x, float_const(a)), x, float_const(0.0))
    if name == "ScaledTanh":
        return lambda x: call("mul", float_const(a), call("tanh", call("mul", float_const(b), x)))
    if name == "HardSigmoid":
        return lambda x: call("max", float_const(0.0), call(
            "min", float_const(1.0), call("add", call("mul", float_const(a), x), float_const(b))))
    if name == "Elu":
        return lambda x: call("where", call("lt", x, float_const(0.0)),
                              call("mul", float_const(a), call("sub", call("exp", x), float_const(1.0))), x)
    raise ValueError(f"unknown recurrent activation {name!r}")


class Recurrent(Op):
    """One MatMul for the input projection of every step, then per step: H @ R^T and one or two elementwise
    kernels for the gates. sequence_lens freezes a batch row's state past its length (its Y rows are 0)."""

    attrs = {"activation_alpha": None, "activation_beta": None, "activations": None, "clip": None,
             "direction": "forward", "hidden_size": None, "layout": 0}
    n_gates: int
    default_acts: tuple[str, ...]

    def run(self, ctx: Context, x: Tensor, w: Tensor, r: Tensor, b: Tensor | None = None, lens: Tensor | None = None,
            h0: Tensor | None = None, c0: Tensor | None = None, p: Tensor | None = None) -> list[Tensor]:
        if x.dtype.kind != "f":
            raise self.fail(f"{self.node.op_type} on {x.dtype} is not supported")
        dirs = 2 if self.attr["direction"] == "bidirectional" else 1
        if self.attr["layout"]:  # batch first: x (batch, seq, in), states (batch, dirs, hidden)
            x, h0, c0 = (None if t is None else Tensor(t.dtype, (t.shape[1], t.shape[0], t.shape[2]),
                                                  view=ctx.view(t).permute((1, 0, 2))) for t in (x, h0, c0))
        seq, batch, _ = x.shape
        hid = w.shape[1] // self.n_gates
        names = list(self.attr["activations"] or self.default_acts * dirs)
        alphas, betas = list(self.attr["activation_alpha"] or []), list(self.attr["activation_beta"] or [])
        acts = []
        for name in names:  # alpha/beta lists are consumed in order by the activations that take them
            a_def, b_def = _ALPHA.get(name, (None, None))
            al = alphas.pop(0) if a_def is not None and alphas else None
            be = betas.pop(0) if b_def is not None and betas else None
            acts.append(activation(name, al, be))
        lens_col = reshape_view(ctx, lens, (batch, 1)) if lens is not None else None
        y = ctx.new(x.dtype, (seq, dirs, batch, hid))
        finals: list[list[Tensor]] = []
        for d in range(dirs):
            reverse = self.attr["direction"] == "reverse" or d == 1
            wd = slice_view(ctx, w, 0, d, d + 1)
            wt = Tensor(w.dtype, (w.shape[2], w.shape[1]),
                        view=ctx.view(reshape_view(ctx, wd, w.shape[1:])).permute((1, 0)))
            rd = reshape_view(ctx, slice_view(ctx, r, 0, d, d + 1), r.shape[1:])
            rt = Tensor(r.dtype, (hid, r.shape[1]), view=ctx.view(rd).permute((1, 0)))
            xw = call_op(ctx, self, "MatMul", x, wt)[0]  # (seq, batch, G*hid)
            bias = None
            if b is not None:
                bd = reshape_view(ctx, slice_view(ctx, b, 0, d, d + 1), (2 * self.n_gates * hid,))
                bias = [slice_view(ctx, bd, 0, k * hid, (k + 1) * hid) for k in range(2 * self.n_gates)]
            h, c = (reshape_view(ctx, slice_view(ctx, s0, 0, d, d + 1), (batch, hid)) if s0 is not None
                    else ctx.const(np.zeros((batch, hid), x.dtype)) for s0 in (h0, c0))
            pd = None
            if p is not None:
                pv = reshape_view(ctx, slice_view(ctx, p, 0, d, d + 1), (3 * hid,))
                pd = [slice_view(ctx, pv, 0, k * hid, (k + 1) * hid) for k in range(3)]
            fns = acts[d * len(self.default_acts):(d + 1) * len(self.default_acts)]
            for step in range(seq):
                t = seq - 1 - step if reverse else step
                xw_t = reshape_view(ctx, slice_view(ctx, xw, 0, t, t + 1), (batch, self.n_gates * hid))
                gx = [slice_view(ctx, xw_t, 1, k * hid, (k + 1) * hid) for k in range(self.n_gates)]
                hr = call_op(ctx, self, "MatMul", h, rt)[0]
                gh = [slice_view(ctx, hr, 1, k * hid, (k + 1) * hid) for k in range(self.n_gates)]
                h_new, c_new = self.cell(ctx, fns, gx, gh, bias, pd, h, c, rd, hid)
                out_t, h, c = self.mask(ctx, t, lens_col, h_new, h, c_new, c)
                dst = View(y.view.handle, y.dtype, (batch, hid), y.view.strides[2:],
                           t * y.view.strides[0] + d * y.view.strides[1])
                copy_into(ctx, ctx.view(out_t), dst)
            finals.append([h, c])
        outs = [y]
        for k in range(2 if self.n_gates == 4 else 1):
            st = ctx.new(x.dtype, (dirs, batch, hid))
            for d in range(dirs):
                copy_into(ctx, ctx.view(finals[d][k]), View(st.view.handle, x.dtype, (batch, hid), (hid, 1),
                                                            d * batch * hid))
            outs.append(st)
        if self.attr["layout"]:
            outs = [Tensor(o.dtype, tuple(o.shape[i] for i in perm), view=ctx.view(o).permute(perm))
                    for o, perm in zip(outs, [(2, 0, 1, 3), (1, 0, 2), (1, 0, 2)], strict=False)]
        return outs

    def pre(self, parts: list[Expr]) -> Expr:
        """A gate's pre-activation: the sum of its parts, clipped when `clip` is set."""
        e = parts[0]
        for q in parts[1:]:
            e = call("add", e, q)
        clip = self.attr["clip"]
        return call("max", float_const(-clip), call("min", float_const(clip), e)) if clip is not None else e

    def mask(self, ctx: Context, t: int, lens: Tensor | None, h_new: Tensor, h: Tensor, c_new: Tensor,
             c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if lens is None:
            return h_new, h_new, c_new
        keep = call("lt", int_const(t), inp(0, INT))
        y_t = emit(ctx, self, call("where", keep, inp(1), float_const(0.0)), [lens, h_new], h_new.dtype)
        h2 = emit(ctx, self, call("where", keep, inp(1), inp(2)), [lens, h_new, h], h.dtype)
        c2 = emit(ctx, self, call("where", keep, inp(1), inp(2)), [lens, c_new, c], c.dtype) if c_new is not c else c
        return y_t, h2, c2

    def cell(self, ctx: Context, fns: list, gx: list[Tensor], gh: list[Tensor], bias: list[Tensor] | None,
             p: list[Tensor] | None, h: Tensor, c: Tensor, rd: Tensor, hid: int) -> tuple[Tensor, Tensor]:
        raise NotImplementedError


def _parts(gx: Tensor, gh: Tensor | None, bias: list[Tensor] | None, k: int, n: int) -> tuple[list[Expr], list[Tensor]]:
    ins = [gx] + ([gh] if gh is not None else [])
    if bias is not None:
        ins += [bias[k], bias[n + k]]
    return [inp(i) for i in range(len(ins))], ins


@register("RNN", 7)
class RNN(Recurrent):
    n_gates, default_acts = 1, ("Tanh",)

    def cell(self, ctx: Context, fns: list, gx: list[Tensor], gh: list[Tensor], bias: list[Tensor] | None,
             p: list[Tensor] | None, h: Tensor, c: Tensor, rd: Tensor, hid: int) -> tuple[Tensor, Tensor]:
        parts, ins = _parts(gx[0], gh[0], bias, 0, 1)
        h_new = emit(ctx, self, fns[0](self.pre(parts)), ins, h.dtype)
        return h_new, c


@register("GRU", 7)
class GRU(Recurrent):
    attrs = {**Recurrent.attrs, "linear_before_reset": 0}
    n_gates, default_acts = 3, ("Sigmoid", "Tanh")

    def cell(self, ctx: Context, fns: list, gx: list[Tensor], gh: list[Tensor], bias: list[Tensor] | None,
             p: list[Tensor] | None, h: Tensor, c: Tensor, rd: Tensor, hid: int) -> tuple[Tensor, Tensor]:
        f, g = fns
        gates = []
        for k in (0, 1):  # z, r
            parts, ins = _parts(gx[k], gh[k], bias, k, 3)
            gates.append(emit(ctx, self, f(self.pre(parts)), ins, h.dtype))
        z, rg = gates
        if self.attr["linear_before_reset"]:
            ins = [gx[2], rg, gh[2]] + ([bias[5], bias[2]] if bias is not None else [])
            inner = call("add", inp(2), inp(3)) if bias is not None else inp(2)
            parts = [inp(0), call("mul", inp(1), inner)] + ([inp(4)] if bias is not None else [])
        else:
            rh = emit(ctx, self, call("mul", inp(0), inp(1)), [rg, h], h.dtype)
            rh_t = Tensor(rd.dtype, (hid, hid), view=ctx.view(slice_view(ctx, rd, 0, 2 * hid, 3 * hid)).permute((1, 0)))
            ghh = call_op(ctx, self, "MatMul", rh, rh_t)[0]
            ins = [gx[2], ghh] + ([bias[2], bias[5]] if bias is not None else [])
            parts = [inp(i) for i in range(len(ins))]
        hh = emit(ctx, self, g(self.pre(parts)), ins, h.dtype)
        blend = call("add", call("mul", call("sub", float_const(1.0), inp(0)), inp(1)), call("mul", inp(0), inp(2)))
        h_new = emit(ctx, self, blend, [z, hh, h], h.dtype)  # (1 - z) * h~ + z * h
        return h_new, c


@register("LSTM", 7)
class LSTM(Recurrent):
    attrs = {**Recurrent.attrs, "input_forget": 0}
    n_gates, default_acts = 4, ("Sigmoid", "Tanh", "Tanh")

    def cell(self, ctx: Context, fns: list, gx: list[Tensor], gh: list[Tensor], bias: list[Tensor] | None,
             p: list[Tensor] | None, h: Tensor, c: Tensor, rd: Tensor, hid: int) -> tuple[Tensor, Tensor]:
        f, g, hf = fns
        gate = {}
        for name, k, peep in (("i", 0, 0), ("f", 2, 2), ("c", 3, None)):  # gate order i, o, f, c; P is i, o, f
            parts, ins = _parts(gx[k], gh[k], bias, k, 4)
            if p is not None and peep is not None:
                ins += [p[peep], c]
                parts.append(call("mul", inp(len(ins) - 2), inp(len(ins) - 1)))
            gate[name] = emit(ctx, self, (g if name == "c" else f)(self.pre(parts)), ins, h.dtype)
        if self.attr["input_forget"]:
            gate["f"] = emit(ctx, self, call("sub", float_const(1.0), inp(0)), [gate["i"]], h.dtype)
        c_new = emit(ctx, self, call("add", call("mul", inp(0), inp(1)), call("mul", inp(2), inp(3))),
                     [gate["f"], c, gate["i"], gate["c"]], c.dtype)
        parts, ins = _parts(gx[1], gh[1], bias, 1, 4)
        if p is not None:
            ins += [p[1], c_new]
            parts.append(call("mul", inp(len(ins) - 2), inp(len(ins) - 1)))
        o = emit(ctx, self, f(self.pre(parts)), ins, h.dtype)
        h_new = emit(ctx, self, call("mul", inp(0), hf(inp(1))), [o, c_new], h.dtype)
        return h_new, c_new

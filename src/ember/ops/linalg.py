"""Linear algebra: Gemm and MatMul (one backend matmul, transposes and broadcasts expressed as
strides), Einsum, Det."""

from __future__ import annotations

import itertools
import math
import string

import numpy as np

from ..core.dtypes import kind_of
from ..core.expr import FLOAT, Expr, call, coord, inp, load
from ..core.view import View
from .base import Context, Op, Tensor, register
from .elementwise import anchored
from .exprs import int_const, kernel, sum_exprs
from .reduce import reduce_axes
from .shape import reshape_view


def as_3d(v: View, batch: tuple[int, ...]) -> View | None:
    """(*batch, R, C) -> (B, R, C) when the batch dims collapse to one stride; None if they do not."""
    dims = [(d, s) for d, s in zip(batch, v.strides[:-2], strict=True) if d != 1]
    for (_d0, s0), (d1, s1) in zip(dims, dims[1:], strict=False):
        if s0 != s1 * d1:
            return None
    stride = dims[-1][1] if dims else 0
    return View(v.handle, v.dtype, (math.prod(batch),) + v.shape[-2:], (stride,) + v.strides[-2:], v.offset)


@register("MatMul", 1)
class MatMul(Op):
    f16 = True
    def run(self, ctx: Context, a: Tensor, b: Tensor) -> list[Tensor]:
        if a.dtype.kind != "f" or b.dtype != a.dtype:
            raise self.fail(f"MatMul of {a.dtype} x {b.dtype} is not supported (float tensors only)")
        if a.rank == 0 or b.rank == 0:
            raise ValueError(f"{self.node.describe()}: MatMul operands must not be scalars")
        a2 = reshape_view(ctx, a, (1,) + a.shape) if a.rank == 1 else a
        b2 = reshape_view(ctx, b, b.shape + (1,)) if b.rank == 1 else b
        m, k = a2.shape[-2:]
        k2, n = b2.shape[-2:]
        if k != k2:
            raise ValueError(f"{self.node.describe()}: inner dims differ: {a.shape} @ {b.shape}")
        try:
            batch = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
        except ValueError:
            raise ValueError(f"{self.node.describe()}: batch dims of {a.shape} and {b.shape} do not broadcast") \
                from None
        shape = batch + ((m,) if a.rank > 1 else ()) + ((n,) if b.rank > 1 else ())
        if math.prod(shape) == 0:
            return [ctx.new(a.dtype, shape)]
        av = ctx.view(a2).broadcast_to(batch + (m, k))
        bv = ctx.view(b2).broadcast_to(batch + (k, n))
        bsz = math.prod(batch)
        a3 = as_3d(av, batch) if bsz > 1 else View(av.handle, av.dtype, (1, m, k), (0,) + av.strides[-2:],
                                                      av.offset)
        b3 = as_3d(bv, batch) if bsz > 1 else View(bv.handle, bv.dtype, (1, k, n), (0,) + bv.strides[-2:],
                                                      bv.offset)
        if a3 is None:
            a3 = as_3d(ctx.contiguous(Tensor(a.dtype, av.shape, view=av)).broadcast_to(av.shape), batch)
        if b3 is None:
            b3 = as_3d(ctx.contiguous(Tensor(b.dtype, bv.shape, view=bv)).broadcast_to(bv.shape), batch)
        if bsz > 1 and b3.strides[0] == 0 and a3.strides[0] == m * a3.strides[1] and a3.strides[2] == 1 \
                and a3.strides[1] == k:
            # A shared right operand: fold the batch into M, one big matmul instead of B small ones.
            a3 = View(a3.handle, a3.dtype, (1, bsz * m, k), (0, k, 1), a3.offset)
            b3 = View(b3.handle, b3.dtype, (1, k, n), (0,) + b3.strides[1:], b3.offset)
            o3 = (1, bsz * m, n), (0, n, 1)
        else:
            o3 = (bsz, m, n), (m * n, n, 1)

        def record(out: View, act: Expr | None, bias: View | None = None, residual: View | None = None,
                   a3: View = a3, b3: View = b3, o3: tuple = o3) -> list:
            o = View(out.handle, out.dtype, o3[0], o3[1], out.offset)
            return ctx.backend.record_matmul(a3, b3, o, act=act, bias=in_3d(ctx, bias, o3[0]),
                                             residual=in_3d(ctx, residual, o3[0]))

        return [anchored(ctx, a.dtype, shape, record, [a3, b3], takes_bias=ctx.backend.select_matmul_addends(),
                         flat=True)]


def in_3d(ctx: Context, v: View | None, shape: tuple[int, int, int]) -> View | None:
    """An addend of the product's output, as the matmul's 3-D view (copied where its strides do not fold)."""
    if v is None:
        return None
    r = v.reshaped(shape)
    return r if r is not None else ctx.contiguous(Tensor(v.dtype, v.shape, view=v)).reshaped(shape)


@register("Gemm", 1)
class Gemm(Op):
    f16 = True
    attrs = {"alpha": 1.0, "beta": 1.0, "transA": 0, "transB": 0, "broadcast": 0}

    def run(self, ctx: Context, a: Tensor, b: Tensor, c: Tensor | None = None) -> list[Tensor]:
        if a.rank != 2 or b.rank != 2:
            raise ValueError(f"{self.node.describe()}: Gemm needs 2-D A and B, got {a.shape} and {b.shape}")
        av, bv = ctx.view(a), ctx.view(b)
        if self.attr["transA"]:
            av = av.permute((1, 0))
        if self.attr["transB"]:
            bv = bv.permute((1, 0))
        (m, k), (k2, n) = av.shape, bv.shape
        if k != k2:
            raise ValueError(f"{self.node.describe()}: inner dims differ: {av.shape} @ {bv.shape}")
        bias = None
        if c is not None and self.attr["beta"] != 0:
            try:
                cv = ctx.view(c).broadcast_to((m, n))
            except ValueError:
                raise ValueError(f"{self.node.describe()}: C of shape {c.shape} does not broadcast to {(m, n)}") \
                    from None
            bias = View(cv.handle, cv.dtype, (1, m, n), (0,) + cv.strides, cv.offset)
        if m * n == 0:
            return [ctx.new(a.dtype, (m, n))]
        a3 = View(av.handle, av.dtype, (1, m, k), (0,) + av.strides, av.offset)
        b3 = View(bv.handle, bv.dtype, (1, k, n), (0,) + bv.strides, bv.offset)

        def record(out: View, act: Expr | None, *addends: View) -> list:
            c, beta, more = bias, self.attr["beta"], list(addends)
            if c is None and more:  # an Add after a Gemm without C: the bias slot, not scaled by beta
                c, beta = in_3d(ctx, more.pop(0), (1, m, n)), 1.0
            return ctx.backend.record_matmul(a3, b3, View(out.handle, out.dtype, (1, m, n), (0, n, 1), out.offset),
                                             alpha=self.attr["alpha"], bias=c, beta=beta, act=act,
                                             residual=in_3d(ctx, more[0] if more else None, (1, m, n)))

        takes = ctx.backend.select_matmul_addends() - (bias is not None)
        return [anchored(ctx, a.dtype, (m, n), record, [a3, b3, bias], takes_bias=takes, flat=True)]


@register("Einsum", 12)
class Einsum(Op):
    """Every operand as a strided view over all the equation's letters (a repeated letter is a diagonal: the
    strides add; a missing one is a broadcast: stride 0), one product kernel, then a sum over the letters
    the output drops."""

    attrs = {"equation": ""}

    def run(self, ctx: Context, *xs: Tensor) -> list[Tensor]:
        eq = self.attr["equation"].replace(" ", "")
        lhs, arrow, rhs = eq.partition("->")
        terms = lhs.split(",")
        if len(terms) != len(xs):
            raise ValueError(f"{self.node.describe()}: {len(terms)} operands in {eq!r}, {len(xs)} inputs")
        # "..." becomes fresh letters, right-aligned across operands (the dims it stands for broadcast).
        n_ell = max([x.rank - (len(t) - 3) for t, x in zip(terms, xs, strict=True) if "..." in t], default=0)
        ell = "".join(ch for ch in string.ascii_letters if ch not in eq)[:n_ell]
        spans = [t.replace("...", ell[n_ell - (x.rank - (len(t) - 3)):]) if "..." in t else t
                 for t, x in zip(terms, xs, strict=True)]
        if not arrow:  # implicit output: the broadcast dims, then the letters used once, in order
            once = sorted(ch for ch in set("".join(terms)) if ch.isalpha() and "".join(terms).count(ch) == 1)
            rhs = ell + "".join(once)
        else:
            rhs = rhs.replace("...", ell)
        sizes: dict[str, int] = {}
        for t, x in zip(spans, xs, strict=True):
            if len(t) != x.rank:
                raise ValueError(f"{self.node.describe()}: term {t!r} does not match input rank {x.rank}")
            for ch, d in zip(t, x.shape, strict=True):
                if ch in sizes and sizes[ch] != d and 1 not in (d, sizes[ch]):
                    raise ValueError(f"{self.node.describe()}: letter {ch!r} has sizes {sizes[ch]} and {d}")
                sizes[ch] = max(sizes.get(ch, 1), d)
        summed = [ch for ch in sizes if ch not in rhs]
        order = list(rhs) + summed
        full = tuple(sizes[ch] for ch in order)
        views = []
        for t, x in zip(spans, xs, strict=True):
            v = ctx.view(x)
            strides = [sum(s for ch2, s, d in zip(t, v.strides, x.shape, strict=True) if ch2 == ch and d != 1)
                       for ch in order]
            views.append(View(v.handle, v.dtype, full, tuple(strides), v.offset))
        kind = kind_of(xs[0].dtype)
        prod = inp(0, kind)
        for i in range(1, len(xs)):
            prod = call("mul", prod, inp(i, kind))
        y = kernel(ctx, prod, views, xs[0].dtype, full)
        if summed:
            y = reduce_axes(ctx, "sum", y, list(range(len(rhs), len(order))))
        return [y]


@register("Det", 11)
class Det(Op):
    """Determinants of small matrices (n <= 5) by the Leibniz sum over permutations, one kernel over the
    batch; larger ones would need an LU primitive."""

    def run(self, ctx: Context, x: Tensor) -> list[Tensor]:
        m = x.shape[-1]
        if x.rank < 2 or x.shape[-2] != m or x.dtype.kind != "f":
            raise ValueError(f"{self.node.describe()}: Det needs float square matrices, got {x.shape}")
        if m > 5:
            raise self.fail(f"Det of {m} x {m} matrices is not supported (up to 5 x 5)")
        lead = [coord(d) for d in range(x.rank - 2)]
        cell = [[load(0, *lead, int_const(r), int_const(c), kind=FLOAT) for c in range(m)] for r in range(m)]
        terms = []
        for perm in itertools.permutations(range(m)):
            inversions = sum(1 for a in range(m) for b in range(a + 1, m) if perm[a] > perm[b])
            t = cell[0][perm[0]]
            for r in range(1, m):
                t = call("mul", t, cell[r][perm[r]])
            terms.append(call("neg", t) if inversions % 2 else t)
        return [kernel(ctx, sum_exprs(terms), [x], x.dtype, x.shape[:-2])]

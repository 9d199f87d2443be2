"""ConvTranspose and Col2Im, the adjoints of convolution and of im2col."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import numpy as np

from ..core.expr import FLOAT, Expr, call, coord, load
from .base import Context, Op, Tensor, call_op, host_ints, register
from .conv import to_2d
from .exprs import all_exprs, contiguous_strides, flat_offset, float_const, int_const, kernel, sum_exprs


def _half_floor(v: int) -> int:
    return v // 2  # floor: a negative total padding (output_shape larger than the full result) pads the end


@register("ConvTranspose", 1)
class ConvTranspose(Op):
    """A convolution of the stride-dilated, padded input with the flipped, channel-swapped kernel:
    one index kernel spreads x over the zero grid (skipped for stride 1), then the backend's conv runs."""

    attrs = {"auto_pad": "NOTSET", "dilations": None, "group": 1, "kernel_shape": None, "output_padding": None,
             "output_shape": None, "pads": None, "strides": None}

    def run(self, ctx: Context, x: Tensor, w: Tensor, b: Tensor | None = None) -> list[Tensor]:
        r = x.rank - 2
        if r not in (1, 2, 3):
            raise self.fail(f"{r}-D ConvTranspose is not supported (1-D to 3-D are)")
        if x.dtype.kind != "f" or w.dtype != x.dtype:
            raise self.fail(f"ConvTranspose on {x.dtype} is not supported")
        g = self.attr["group"]
        n, c = x.shape[:2]
        if w.shape[0] != c or c % g:
            raise ValueError(f"{self.node.describe()}: input {x.shape}, weight {w.shape} and group {g} disagree")
        cg, mg = c // g, w.shape[1]
        ksize, size = w.shape[2:], x.shape[2:]
        strides = list(self.attr["strides"] or [1] * r)
        dil = list(self.attr["dilations"] or [1] * r)
        opad = list(self.attr["output_padding"] or [0] * r)
        keff = [(k - 1) * d + 1 for k, d in zip(ksize, dil, strict=True)]
        full = [s * (m - 1) + op + ke for s, m, op, ke in zip(strides, size, opad, keff, strict=True)]
        mode = self.attr["auto_pad"]
        if self.attr["output_shape"] is not None or mode in ("SAME_UPPER", "SAME_LOWER"):
            out_sp = list(self.attr["output_shape"] or [m * s for m, s in zip(size, strides, strict=True)])[-r:]
            total = [f - o for f, o in zip(full, out_sp, strict=True)]
            if mode == "SAME_UPPER":
                head = [_half_floor(t) for t in total]
            else:
                head = [t - _half_floor(t) for t in total]
            tail = [t - h for t, h in zip(total, head, strict=True)]
        else:
            pads = list(self.attr["pads"] or [0] * (2 * r))
            head, tail = pads[:r], pads[r:]
            out_sp = [f - h - t for f, h, t in zip(full, head, tail, strict=True)]
        lo = [ke - 1 - h for ke, h in zip(keff, head, strict=True)]
        hi = [ke - 1 - t + op for ke, t, op in zip(keff, tail, opad, strict=True)]
        if min(out_sp) <= 0:
            raise ValueError(f"{self.node.describe()}: output size {out_sp} is empty")
        # Weights (C, M/g, k...) -> (M, C/g, k...) flipped: on the host for a constant (folded once).
        if w.is_const:
            wv = w.value.reshape(g, cg, mg, *ksize).swapaxes(1, 2).reshape(g * mg, cg, *ksize)
            wt = ctx.const(np.ascontiguousarray(np.flip(wv, axis=tuple(range(2, 2 + r)))))
        else:
            o, ci = coord(0), coord(1)
            src = [call("add", call("mul", call("div", o, int_const(mg)), int_const(cg)), ci),
                   call("mod", o, int_const(mg))]
            src += [call("sub", int_const(k - 1), coord(2 + i)) for i, k in enumerate(ksize)]
            wt = kernel(ctx, load(0, *src, kind=FLOAT), [w], w.dtype, (g * mg, cg, *ksize))
        if all(s == 1 for s in strides) and min(lo + hi) >= 0 and r < 3:
            z, conv_pads = x, lo + hi  # stride 1: the conv pads the input itself
        else:
            spread = [(m - 1) * s + 1 for m, s in zip(size, strides, strict=True)]
            z_sp = [sp + a + e for sp, a, e in zip(spread, lo, hi, strict=True)]
            idx, ok = [coord(0), coord(1)], []
            for i in range(r):
                pos = call("sub", coord(2 + i), int_const(lo[i])) if lo[i] else coord(2 + i)
                idx.append(call("div", pos, int_const(strides[i])) if strides[i] > 1 else pos)
                ok += [call("ge", pos, int_const(0)), call("lt", pos, int_const(spread[i]))]
                if strides[i] > 1:
                    ok.append(call("eq", call("mod", pos, int_const(strides[i])), int_const(0)))
            valid = ok[0]
            for e in ok[1:]:
                valid = call("and", valid, e)
            z = kernel(ctx, call("where", valid, load(0, *idx, kind=FLOAT), float_const(0.0)), [x], x.dtype,
                          (n, c, *z_sp))
            conv_pads = [0] * (2 * r)
        if r == 3:
            return [self._depth_taps(ctx, z, wt, b, dil, g)]
        out = ctx.new(x.dtype, (n, g * mg, *out_sp))
        one = [1] * r
        if r == 1:
            conv_pads, dil, one = [0, conv_pads[0], 0, conv_pads[1]], [1, *dil], [1, 1]
        bias = ctx.contiguous(b) if b is not None else None
        ctx.record(ctx.backend.record_conv(ctx.contiguous(to_2d(ctx, z)), ctx.contiguous(to_2d(ctx, wt)), bias,
                                           to_2d(ctx, out).view, tuple(one), tuple(conv_pads), tuple(dil), g))
        return [out]


    def _depth_taps(self, ctx: Context, z: Tensor, wt: Tensor, b: Tensor | None, dil: list[int], g: int) -> Tensor:
        """The stride-1 3-D convolution of the spread input z with the flipped kernel wt, as a sum over the
        kernel's depth taps of 2-D convolutions: depth folded into the batch, tap i reading depth d + i * dil."""
        n, c, dz, hz, wz = z.shape
        m, kd = wt.shape[0], wt.shape[2]
        do = dz - (kd - 1) * dil[0]
        zt = call_op(ctx, self, "Transpose", z, perm=[0, 2, 1, 3, 4])[0]
        acc = None
        for i in range(kd):
            part = call_op(ctx, self, "Slice", zt, ctx.const(np.array([i * dil[0]], np.int64)),
                           ctx.const(np.array([i * dil[0] + do], np.int64)), ctx.const(np.array([1], np.int64)))[0]
            part = call_op(ctx, self, "Reshape", part, ctx.const(np.array([n * do, c, hz, wz], np.int64)))[0]
            tap = call_op(ctx, self, "Gather", wt, ctx.const(np.array(i, np.int64)), axis=2)[0]
            y = call_op(ctx, self, "Conv", part, tap, group=g, dilations=dil[1:])[0]
            acc = y if acc is None else call_op(ctx, self, "Add", acc, y)[0]
        assert acc is not None
        ho, wo = acc.shape[2:]
        acc = call_op(ctx, self, "Reshape", acc, ctx.const(np.array([n, do, m, ho, wo], np.int64)))[0]
        out = call_op(ctx, self, "Transpose", acc, perm=[0, 2, 1, 3, 4])[0]
        if b is not None:
            out = call_op(ctx, self, "Add", out, call_op(ctx, self, "Reshape", b, ctx.const(
                np.array([m, 1, 1, 1], np.int64)))[0])[0]
        return out


@register("Col2Im", 18)
class Col2Im(Op):
    """Sum the sliding blocks back into the image: for each output pixel, the k taps of the block grid that
    cover it (unrolled), each a computed load from the (N, C * prod(block), L) input."""

    host_inputs = (1, 2)
    attrs = {"dilations": None, "pads": None, "strides": None}

    def run(self, ctx: Context, x: Tensor, image: Tensor, block: Tensor) -> list[Tensor]:
        img, blk = host_ints(self, image, "image_shape"), host_ints(self, block, "block_shape")
        r = len(img)
        dil = list(self.attr["dilations"] or [1] * r)
        pads = list(self.attr["pads"] or [0] * (2 * r))
        strides = list(self.attr["strides"] or [1] * r)
        nblocks = [(img[i] + pads[i] + pads[i + r] - dil[i] * (blk[i] - 1) - 1) // strides[i] + 1 for i in range(r)]
        ksize = math.prod(blk)
        n, ck, length = x.shape
        if ck % ksize or length != math.prod(nblocks):
            raise ValueError(f"{self.node.describe()}: input {x.shape} does not match blocks {blk} over {img}")
        terms = []
        for kk in itertools.product(*(range(b) for b in blk)):
            ok: list[Expr] = []
            bidx: list[Expr] = []
            for i in range(r):
                pos = call("sub", call("add", coord(2 + i), int_const(pads[i])), int_const(kk[i] * dil[i]))
                if strides[i] > 1:
                    ok.append(call("eq", call("mod", pos, int_const(strides[i])), int_const(0)))
                    pos = call("div", pos, int_const(strides[i]))
                ok += [call("ge", pos, int_const(0)), call("lt", pos, int_const(nblocks[i]))]
                bidx.append(pos)
            chan = call("add", call("mul", coord(1), int_const(ksize)), int_const(_linear_index(kk, blk)))
            v = load(0, coord(0), chan, flat_offset(bidx, nblocks), kind=FLOAT)
            cond = all_exprs(ok)
            terms.append(call("where", cond, v, float_const(0.0)) if cond is not None else v)
        return [kernel(ctx, sum_exprs(terms), [x], x.dtype, (n, ck // ksize, *img))]


def _linear_index(idx: Sequence[int], shape: Sequence[int]) -> int:
    return int(sum(i * s for i, s in zip(idx, contiguous_strides(shape), strict=True)))

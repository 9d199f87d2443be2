"""Index-driven ops: gathers, one-hots, masks, resamplers. Each is one generated elementwise kernel whose
Expr reads its inputs at computed positions (`coord`/`load`), so they run the same way on every backend.

Where the positions depend on attributes and shapes only (Resize), the per-axis index and weight tables
are computed on the host at plan time and read by the kernel; where they depend on data (GatherElements,
GridSample), the kernel computes them.
"""

from __future__ import annotations

import itertools
import math
import string
from collections.abc import Sequence

import numpy as np

from ..core.expr import BOOL, FLOAT, INT, Expr, call, const, coord, inp, load
from ..core.view import View
from .base import Context, Op, T, kind_of, register
from .reduce import reduce_axes
from .shape import host_ints, norm_axis, reshape_view, slice_view


# ---- helpers ---------------------------------------------------------------------------------------------
def kernel(ctx: Context, expr: Expr, inputs: Sequence[T | View], dtype: np.dtype, shape: Sequence[int]) -> T:
    """A new tensor computed by one elementwise kernel. Inputs read through `inp` must already have `shape`
    (pass broadcast Views); inputs read through `load` keep their own shapes."""
    out = ctx.new(dtype, shape)
    if out.size:
        views = [t if isinstance(t, View) else ctx.view(t) for t in inputs]
        ctx.record(ctx.backend.record_elementwise(expr, views, out.view))
    return out


def ic(v: int) -> Expr:
    return const(int(v), INT)


def fc(v: float) -> Expr:
    return const(float(v), FLOAT)


def zero(kind: str) -> Expr:
    return const(0, kind)


def wrap_index(e: Expr, dim: int) -> Expr:
    """ONNX negative indices count from the end."""
    return call("where", call("lt", e, zero(e.kind)), call("add", e, const(dim, e.kind)), e)


def check_indices(op: Op, t: T, dim: int) -> None:
    """Constant indices are checked at plan time (ONNX makes out-of-range ones an error); device-resident ones
    cannot be, and the kernels clamp them, so a read or write never leaves its tensor."""
    if t.is_const and t.size:
        v = np.asarray(t.value)
        bad = (v < -dim) | (v >= dim)
        if bad.any():
            raise ValueError(f"{op.node.describe()}: index {v[bad].reshape(-1)[0]} is out of range for a dim of {dim}")


def coords(rank: int) -> list[Expr]:
    return [coord(d) for d in range(rank)]


def sum_exprs(terms: list[Expr]) -> Expr:
    acc = terms[0]
    for t in terms[1:]:
        acc = call("add", acc, t)
    return acc


def all_exprs(terms: list[Expr]) -> Expr | None:
    acc = None
    for t in terms:
        acc = t if acc is None else call("and", acc, t)
    return acc


# ---- gathers -----------------------------------------------------------------------------------------------
@register("GatherElements", 11)
class GatherElements(Op):
    attrs = {"axis": 0}

    def run(self, ctx: Context, data: T, indices: T) -> list[T]:
        axis = norm_axis(self, self.a["axis"], data.rank)
        if indices.rank != data.rank:
            raise ValueError(f"{self.node.describe()}: indices rank {indices.rank} != data rank {data.rank}")
        check_indices(self, indices, data.shape[axis])
        k = wrap_index(call("to_int", inp(1, kind_of(indices.dtype))), data.shape[axis])
        idx = [k if d == axis else coord(d) for d in range(data.rank)]
        return [kernel(ctx, load(0, *idx, kind=kind_of(data.dtype)), [data, indices], data.dtype, indices.shape)]


@register("GatherND", 11)
class GatherND(Op):
    attrs = {"batch_dims": 0}

    def run(self, ctx: Context, data: T, indices: T) -> list[T]:
        b, q, m = self.a["batch_dims"], indices.rank, indices.shape[-1]
        if b + m > data.rank:
            raise ValueError(f"{self.node.describe()}: index depth {m} + batch_dims {b} > data rank {data.rank}")
        shape = indices.shape[:-1] + data.shape[b + m:]
        lead = coords(q - 1)
        ik = kind_of(indices.dtype)
        idx = lead[:b] + [wrap_index(load(1, *lead, ic(j), kind=ik), data.shape[b + j]) for j in range(m)]
        idx += [coord(q - 1 + t) for t in range(data.rank - b - m)]
        return [kernel(ctx, load(0, *idx, kind=kind_of(data.dtype)), [data, indices], data.dtype, shape)]


@register("Compress", 9)
class Compress(Op):
    """The condition is shape arithmetic (it decides the output's shape), so it must be known at plan time."""

    host_inputs = (1,)
    attrs = {"axis": None}

    def run(self, ctx: Context, x: T, condition: T) -> list[T]:
        if not condition.is_const:
            raise self.fail("the condition input must be known when the plan is built")
        if self.a["axis"] is None:
            x = reshape_view(ctx, x, (x.size,))
            axis = 0
        else:
            axis = norm_axis(self, self.a["axis"], x.rank)
        keep = np.flatnonzero(np.asarray(condition.value).reshape(-1)[: x.shape[axis]]).astype(np.int32)
        shape = x.shape[:axis] + (len(keep),) + x.shape[axis + 1:]
        idx = [load(1, coord(axis), kind=INT) if d == axis else coord(d) for d in range(x.rank)]
        return [kernel(ctx, load(0, *idx, kind=kind_of(x.dtype)), [x, ctx.const(keep)], x.dtype, shape)]


@register("ReverseSequence", 10)
class ReverseSequence(Op):
    attrs = {"batch_axis": 1, "time_axis": 0}

    def run(self, ctx: Context, x: T, lens: T) -> list[T]:
        ba, ta = self.a["batch_axis"], self.a["time_axis"]
        length = load(1, coord(ba), kind=INT)
        t = coord(ta)
        src = call("where", call("lt", t, length), call("sub", call("sub", length, ic(1)), t), t)
        idx = [src if d == ta else coord(d) for d in range(x.rank)]
        return [kernel(ctx, load(0, *idx, kind=kind_of(x.dtype)), [x, lens], x.dtype, x.shape)]


# ---- masks and one-hots ---------------------------------------------------------------------------------------
@register("Trilu", 14)
class Trilu(Op):
    host_inputs = (1,)
    attrs = {"upper": 1}

    def run(self, ctx: Context, x: T, k: T | None = None) -> list[T]:
        kk = host_ints(self, k, "k")[0] if k is not None else 0
        r = x.rank
        diff = call("sub", coord(r - 1), coord(r - 2))
        keep = call("ge" if self.a["upper"] else "le", diff, ic(kk))
        kind = kind_of(x.dtype)
        return [kernel(ctx, call("where", keep, inp(0, kind), zero(kind)), [x], x.dtype, x.shape)]


@register("OneHot", 9)
class OneHot(Op):
    host_inputs = (1,)
    attrs = {"axis": -1}

    def run(self, ctx: Context, indices: T, depth: T, values: T) -> list[T]:
        if not depth.is_const:
            raise self.fail("the depth input must be known when the plan is built")
        d = int(np.asarray(depth.value).reshape(-1)[0])
        rank = indices.rank + 1
        axis = norm_axis(self, self.a["axis"], rank)
        shape = indices.shape[:axis] + (d,) + indices.shape[axis:]
        kind = kind_of(indices.dtype)
        v = load(0, *[coord(i) for i in range(rank) if i != axis], kind=kind)
        pos = coord(axis) if kind == INT else call("to_float", coord(axis))
        hit = call("eq", pos, wrap_index(v, d))
        vk = kind_of(values.dtype)
        e = call("where", hit, load(1, ic(1), kind=vk), load(1, ic(0), kind=vk))
        return [kernel(ctx, e, [indices, values], values.dtype, shape)]


@register("Hardmax", 1)
class Hardmax(Op):
    attrs = {"axis": None}

    def run(self, ctx: Context, x: T) -> list[T]:
        legacy = self.node.opset < 13
        axis = self.a["axis"]
        axis = norm_axis(self, (1 if legacy else -1) if axis is None else axis, x.rank)
        src = x
        if legacy:  # before opset 13 the input is coerced to 2-D at `axis`
            src = reshape_view(ctx, x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
            axis = 1
        am = reduce_axes(ctx, "argmax", src, [axis], np.dtype(np.int64))
        first = load(0, *[coord(d) for d in range(src.rank) if d != axis], kind=INT)
        kind = kind_of(x.dtype)
        e = call("where", call("eq", coord(axis), first), const(1, kind), zero(kind))
        return [reshape_view(ctx, kernel(ctx, e, [am], x.dtype, src.shape), x.shape)]


# ---- pads and crops ---------------------------------------------------------------------------------------------
def pad_source(mode: str, c: Expr, before: int, n: int) -> Expr:
    """The input index that output index `c` reads in a reflect/edge/wrap pad (edge: load clamps)."""
    i = call("sub", c, ic(before)) if before else c
    if mode == "edge":
        return i
    if mode == "wrap":
        return call("mod", i, ic(n))
    if n == 1:
        return ic(0)
    period = 2 * (n - 1)  # reflect: a triangle wave over the input, as numpy.pad's "reflect"
    m = call("mod", i, ic(period))
    return call("where", call("ge", m, ic(n)), call("sub", ic(period), m), m)


def padded(ctx: Context, x: T, mode: str, before: list[int], after: list[int]) -> T:
    shape = [d + b + e for d, b, e in zip(x.shape, before, after, strict=True)]
    idx = [pad_source(mode, coord(a), before[a], x.shape[a]) for a in range(x.rank)]
    return kernel(ctx, load(0, *idx, kind=kind_of(x.dtype)), [x], x.dtype, shape)


@register("CenterCropPad", 18)
class CenterCropPad(Op):
    host_inputs = (1,)
    attrs = {"axes": None}

    def run(self, ctx: Context, x: T, shape: T) -> list[T]:
        want = host_ints(self, shape, "shape")
        axes = [norm_axis(self, a, x.rank) for a in (self.a["axes"] or range(x.rank))]
        src, before, out_shape = x, [0] * x.rank, list(x.shape)
        for a, s in zip(axes, want, strict=True):
            dim = x.shape[a]
            if s < dim:  # crop: the extra element of an odd difference comes off the end
                start = (dim - s) // 2
                src = slice_view(ctx, src, a, start, start + s)
            elif s > dim:
                before[a] = (s - dim) // 2
            out_shape[a] = s
        idx = [call("sub", coord(a), ic(before[a])) if before[a] else coord(a) for a in range(x.rank)]
        inside = all_exprs([call("and", call("ge", i, ic(0)), call("lt", i, ic(src.shape[a])))
                            for a, i in enumerate(idx) if src.shape[a] != out_shape[a]])
        kind = kind_of(x.dtype)
        e = load(0, *idx, kind=kind)
        if inside is not None:
            e = call("where", inside, e, zero(kind))
        return [kernel(ctx, e, [src], x.dtype, out_shape)]


# ---- Resize / Upsample --------------------------------------------------------------------------------------------
def _cubic(r: np.ndarray, a: float) -> np.ndarray:
    return np.stack([((a * (r + 1) - 5 * a) * (r + 1) + 8 * a) * (r + 1) - 4 * a,
                     ((a + 2) * r - (a + 3)) * r * r + 1,
                     ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                     ((a * (2 - r) - 5 * a) * (2 - r) + 8 * a) * (2 - r) - 4 * a], axis=-1)


def _cubic_antialias(r: float, scale: float, a: float) -> np.ndarray:
    scale = min(scale, 1.0)
    start = int(np.floor(-2 / scale) + 1)
    x = np.abs(scale * (np.arange(start, 2 - start) - r))
    c = np.where(x <= 1, (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1,
                 np.where(x < 2, a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a, 0.0))
    return c / c.sum()


def _linear_antialias(r: float, scale: float) -> np.ndarray:
    scale = min(scale, 1.0)
    start = int(np.floor(-1 / scale) + 1)
    c = np.clip(1 - np.abs((np.arange(start, start + 2 - 2 * start) - r) * scale), 0, 1)
    return c / c.sum()


def _nearest(r: np.ndarray, mode: str) -> np.ndarray:
    whole = r == 1  # an integer source coordinate takes the right-hand neighbour (ratio 1)
    right = {"round_prefer_floor": r > 0.5, "round_prefer_ceil": r >= 0.5, "floor": np.zeros_like(whole),
             "ceil": np.ones_like(whole)}[mode] | whole
    return np.stack([~right, right], axis=-1).astype(np.float64)


def resize_table(a: dict, in_len: int, out_len: int, scale: float,
                 roi: tuple[float, float] | None) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(indices (out, taps), weights (out, taps), extrapolated (out,) or None) for one axis, as onnx.reference
    computes them: the source coordinate by coordinate_transformation_mode, then the mode's taps."""
    mode, ctm = a["mode"], a["coordinate_transformation_mode"]
    y = np.arange(out_len, dtype=np.float64)
    out_w = scale * in_len
    extrap = None
    if ctm == "align_corners":
        x = np.zeros(out_len) if out_w == 1 else y * (in_len - 1) / (out_w - 1)
    elif ctm == "asymmetric":
        x = y / scale
    elif ctm == "tf_crop_and_resize":
        assert roi is not None
        x = (np.full(out_len, (roi[1] - roi[0]) * (in_len - 1) / 2) if out_w == 1
             else y * (roi[1] - roi[0]) * (in_len - 1) / (out_w - 1))
        x = x + roi[0] * (in_len - 1)
        extrap = (x < 0) | (x > in_len - 1)
    elif ctm == "pytorch_half_pixel":
        x = np.full(out_len, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif ctm == "half_pixel_symmetric":
        x = in_len / 2 * (1 - out_len / out_w) + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"unknown coordinate_transformation_mode {ctm!r}")
    xi = np.floor(x)
    ratio = np.where(x == xi, 1.0, x - xi)
    if mode == "nearest":
        coeffs = _nearest(ratio, a["nearest_mode"])
    elif mode == "linear":
        coeffs = (np.stack([_linear_antialias(r, scale) for r in ratio]) if a["antialias"]
                  else np.stack([1 - ratio, ratio], axis=-1))
    else:
        cc = a["cubic_coeff_a"]
        coeffs = (np.stack([_cubic_antialias(r, scale, cc) for r in ratio]) if a["antialias"]
                  else _cubic(ratio, cc))
    n = coeffs.shape[1]
    # The n source positions nearest x (ties to the smaller), as the reference's edge-padded neighbour search.
    pad = math.ceil(n / 2)
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        off = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        off = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (p + off)[:, None] + np.arange(n)[None, :] - pad
    if a["exclude_outside"]:
        coeffs = np.where((idx < 0) | (idx >= in_len), 0.0, coeffs)
        s = coeffs.sum(axis=-1, keepdims=True)
        coeffs = coeffs / np.where(s == 0, 1.0, s)
    return np.clip(idx, 0, in_len - 1), coeffs, extrap


class ResizeBase(Op):
    attrs = {"mode": "nearest", "coordinate_transformation_mode": "half_pixel", "cubic_coeff_a": -0.75,
             "exclude_outside": 0, "extrapolation_value": 0.0, "nearest_mode": "round_prefer_floor",
             "antialias": 0, "axes": None, "keep_aspect_ratio_policy": "stretch", "scales": None}

    def plan_sizes(self, x: T, roi: list[float] | None, scales: list[float] | None, sizes: list[int] | None,
                   ) -> tuple[list[float], list[int], list[tuple[float, float]] | None]:
        """Per-dim scales, output sizes and rois, as onnx.reference's _interpolate_nd derives them."""
        r = x.rank
        axes = [norm_axis(self, a, r) for a in self.a["axes"]] if self.a["axes"] else list(range(r))
        if scales:
            sc = [1.0] * r
            for i, d in enumerate(axes):
                sc[d] = float(np.float32(scales[i]))
            out = [int(s * n) for s, n in zip(sc, x.shape, strict=True)]
        elif sizes:
            out = list(x.shape)
            for i, d in enumerate(axes):
                out[d] = sizes[i]
            sc = [o / n for o, n in zip(out, x.shape, strict=True)]
            policy = self.a["keep_aspect_ratio_policy"]
            if policy != "stretch":
                s = (min if policy == "not_larger" else max)(sc[d] for d in axes)
                sc = [s if i in axes else 1.0 for i in range(r)]
                out = [int(s * x.shape[i] + 0.5) if i in axes else x.shape[i] for i in range(r)]
        else:
            raise self.fail("neither scales nor sizes is given")
        rois = None
        if roi:
            rois = [(0.0, 1.0)] * r
            for i, d in enumerate(axes):
                rois[d] = (roi[i], roi[len(axes) + i])
        return sc, out, rois

    def resize(self, ctx: Context, x: T, sc: list[float], out: list[int],
               rois: list[tuple[float, float]] | None) -> T:
        a = self.a
        if a["mode"] not in ("nearest", "linear", "cubic"):
            raise self.fail(f"mode {a['mode']!r} is not supported")
        if a["mode"] != "nearest" and x.dtype.kind != "f":
            raise self.fail(f"{a['mode']} Resize of {x.dtype} is not supported")
        tables = {}
        for d in range(x.rank):
            roi = rois[d] if rois else None
            if math.isclose(sc[d], 1.0) and out[d] == x.shape[d] and (
                    roi is None or (math.isclose(roi[0], 0.0) and math.isclose(roi[1], 1.0))):
                continue  # identity along this axis
            idx, w, ex = resize_table(a, x.shape[d], out[d], sc[d], roi)
            if idx.shape[1] > 1 and np.all(np.count_nonzero(w, axis=1) == 1) and np.all(w.max(axis=1) == 1.0):
                idx, w = idx[np.arange(len(idx)), w.argmax(axis=1)][:, None], np.ones((len(idx), 1))
            tables[d] = (idx, w, ex)
        kind = kind_of(x.dtype)
        fill = const(a["extrapolation_value"], kind)
        if all(t[0].shape[1] == 1 for t in tables.values()):
            # Nearest (or single-tap) on every axis: one gather kernel, values copied exactly.
            ins: list[T] = [x]
            idx = coords(x.rank)
            outside = []
            for d, (ti, _, ex) in tables.items():
                ins.append(ctx.const(ti[:, 0].astype(np.int32)))
                idx[d] = load(len(ins) - 1, coord(d), kind=INT)
                if ex is not None and ex.any():
                    ins.append(ctx.const(ex))
                    outside.append(load(len(ins) - 1, coord(d), kind=BOOL))
            e = load(0, *idx, kind=kind)
            if outside:
                e = call("where", _any(outside), fill, e)
            return kernel(ctx, e, ins, x.dtype, out)
        cur = x
        for d, (ti, w, ex) in tables.items():
            # Separable: one pass per resized axis, each a weighted sum over that axis's taps.
            shape = list(cur.shape)
            shape[d] = out[d]
            ins = [cur, ctx.const(ti.astype(np.int32)), ctx.const(w.astype(np.float32))]
            terms = []
            for t in range(ti.shape[1]):
                idx = coords(cur.rank)
                idx[d] = load(1, coord(d), ic(t), kind=INT)
                terms.append(call("mul", load(0, *idx, kind=FLOAT), load(2, coord(d), ic(t), kind=FLOAT)))
            e = sum_exprs(terms)
            if ex is not None and ex.any():
                ins.append(ctx.const(ex))
                e = call("where", load(3, coord(d), kind=BOOL), fill, e)
            cur = kernel(ctx, e, ins, x.dtype, shape)
        return cur if tables else kernel(ctx, inp(0, kind), [x], x.dtype, x.shape)


def _any(terms: list[Expr]) -> Expr:
    acc = terms[0]
    for t in terms[1:]:
        acc = call("or", acc, t)
    return acc


def _floats(op: Op, t: T | None, what: str) -> list[float] | None:
    if t is None or t.size == 0:
        return None
    if not t.is_const:
        raise op.fail(f"the {what} input must be known when the plan is built")
    return [float(v) for v in np.asarray(t.value).reshape(-1)]


@register("Resize", 10)
class Resize(ResizeBase):
    host_inputs = (1, 2, 3)

    def run(self, ctx: Context, x: T, *rest: T | None) -> list[T]:
        if self.node.opset < 11:  # Resize-10: (X, scales), asymmetric coordinates
            self.a = {**self.a, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
            roi, scales, sizes = None, _floats(self, rest[0], "scales"), None
        else:
            roi_t, scales_t, sizes_t = (list(rest) + [None] * 3)[:3]
            roi = _floats(self, roi_t, "roi")
            scales = _floats(self, scales_t, "scales")
            sizes = host_ints(self, sizes_t, "sizes") if sizes_t is not None and sizes_t.size else None
        sc, out, rois = self.plan_sizes(x, roi, scales, sizes)
        return [self.resize(ctx, x, sc, out, rois)]


@register("Upsample", 7)
class Upsample(ResizeBase):
    host_inputs = (1,)

    def run(self, ctx: Context, x: T, scales: T | None = None) -> list[T]:
        self.a = {**self.a, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        if self.a["mode"] == "bilinear":
            self.a["mode"] = "linear"
        sc_list = _floats(self, scales, "scales") if scales is not None else list(self.a["scales"])
        sc, out, rois = self.plan_sizes(x, None, sc_list, None)
        return [self.resize(ctx, x, sc, out, rois)]


# ---- GridSample / AffineGrid -------------------------------------------------------------------------------------
def _reflect(x: Expr, lo: float, hi: float) -> Expr:
    """Reflect x about the borders until it lies in [lo, hi] (onnx.reference's _gs_reflect)."""
    rng = fc(hi - lo)

    def side(dx: Expr, near: float, far: float) -> Expr:
        n = call("floor", call("div", dx, rng))
        r = call("sub", dx, call("mul", n, rng))
        even = call("eq", call("mod", n, fc(2.0)), fc(0.0))
        toward = call("add", fc(near), r) if near < far else call("sub", fc(near), r)
        away = call("sub", fc(far), r) if near < far else call("add", fc(far), r)
        return call("where", even, toward, away)

    below = side(call("sub", fc(lo), x), lo, hi)
    above = side(call("sub", x, fc(hi)), hi, lo)
    return call("where", call("lt", x, fc(lo)), below, call("where", call("gt", x, fc(hi)), above, x))


def _cubic_taps(f: Expr, a: float = -0.75) -> list[Expr]:
    def m(*xs: Expr) -> Expr:
        acc = xs[0]
        for v in xs[1:]:
            acc = call("mul", acc, v)
        return acc

    def ad(x: Expr, y: Expr) -> Expr:
        return call("add", x, y)

    def sb(x: Expr, y: Expr) -> Expr:
        return call("sub", x, y)

    x1 = ad(f, fc(1.0))
    g = sb(fc(1.0), f)
    x3 = sb(fc(2.0), f)
    return [sb(m(ad(m(sb(m(fc(a), x1), fc(5 * a)), x1), fc(8 * a)), x1), fc(4 * a)),
            ad(m(sb(m(fc(a + 2), f), fc(a + 3)), f, f), fc(1.0)),
            ad(m(sb(m(fc(a + 2), g), fc(a + 3)), g, g), fc(1.0)),
            sb(m(ad(m(sb(m(fc(a), x3), fc(5 * a)), x3), fc(8 * a)), x3), fc(4 * a))]


@register("GridSample", 16)
class GridSample(Op):
    attrs = {"mode": "linear", "padding_mode": "zeros", "align_corners": 0}

    def run(self, ctx: Context, x: T, grid: T) -> list[T]:
        mode = {"bilinear": "linear", "bicubic": "cubic"}.get(self.a["mode"], self.a["mode"])
        pad, align = self.a["padding_mode"], bool(self.a["align_corners"])
        if x.dtype.kind != "f" or grid.dtype.kind != "f":
            raise self.fail("GridSample needs float tensors")
        nd = x.rank - 2
        dims = x.shape[2:]
        out_shape = x.shape[:2] + grid.shape[1:-1]
        gidx = [coord(0)] + [coord(2 + k) for k in range(nd)]
        taps_per_dim: list[list[tuple[Expr, Expr | None]]] = []
        for i, n in enumerate(dims):
            g = load(1, *gidx, ic(nd - 1 - i), kind=FLOAT)  # the grid's last dim lists x (width) first
            if align:
                v = call("mul", call("div", call("add", g, fc(1.0)), fc(2.0)), fc(n - 1))
                lo, hi = 0.0, n - 1.0
            else:
                v = call("div", call("sub", call("mul", call("add", g, fc(1.0)), fc(n)), fc(1.0)), fc(2.0))
                lo, hi = -0.5, n - 0.5
            if mode == "nearest":
                v = call("round", v)  # half to even, as PyTorch
            out_of = call("or", call("lt", v, fc(lo)), call("gt", v, fc(hi)))
            if pad == "border":
                v = call("where", out_of, call("max", fc(0.0), call("min", v, fc(n - 1.0))), v)
            elif pad == "reflection":
                v = call("where", out_of, _reflect(v, lo, hi), v)
            if mode == "nearest":
                taps = [(call("to_int", v), None)]
            else:
                x0 = call("floor", v)
                f = call("sub", v, x0)
                base = call("to_int", x0)
                if mode == "linear":
                    taps = [(base, call("sub", fc(1.0), f)), (call("add", base, ic(1)), f)]
                else:
                    taps = [(call("add", base, ic(k - 1)), w) for k, w in enumerate(_cubic_taps(f))]
            fixed = []
            for t, w in taps:  # a tap outside the input: 0 (zeros), clamped (border), reflected (reflection)
                valid = None
                if pad == "zeros":
                    valid = call("and", call("ge", t, ic(0)), call("lt", t, ic(n)))
                elif pad == "reflection":
                    t = call("to_int", _reflect(call("to_float", t), lo, hi))
                fixed.append((t, w, valid))
            taps_per_dim.append(fixed)
        terms = []
        for combo in itertools.product(*taps_per_dim):
            val = load(0, coord(0), coord(1), *[t for t, _, _ in combo], kind=FLOAT)
            valid = all_exprs([ok for _, _, ok in combo if ok is not None])
            if valid is not None:
                val = call("where", valid, val, fc(0.0))
            for _, w, _ in combo:
                if w is not None:
                    val = call("mul", val, w)
            terms.append(val)
        return [kernel(ctx, sum_exprs(terms), [x, grid], x.dtype, out_shape)]


@register("AffineGrid", 20)
class AffineGrid(Op):
    host_inputs = (1,)
    attrs = {"align_corners": 0}

    def run(self, ctx: Context, theta: T, size: T) -> list[T]:
        full = host_ints(self, size, "size")
        dims = full[2:]
        nd = len(dims)
        out_shape = (full[0], *dims, nd)
        # Base coordinate along spatial dim i, in [-1, 1]; x (the last dim) pairs with theta column 0.
        base = []
        for i, n in enumerate(dims):
            c = call("to_float", coord(1 + i))
            if self.a["align_corners"]:
                b = call("sub", call("mul", c, fc(2.0 / (n - 1))), fc(1.0)) if n > 1 else fc(-1.0)
            else:
                b = call("sub", call("mul", call("add", call("mul", c, fc(2.0)), fc(1.0)), fc(1.0 / n)), fc(1.0))
            base.append(b)
        row = coord(1 + nd)
        terms = [call("mul", load(0, coord(0), row, ic(j), kind=FLOAT), base[nd - 1 - j]) for j in range(nd)]
        terms.append(load(0, coord(0), row, ic(nd), kind=FLOAT))
        return [kernel(ctx, sum_exprs(terms), [theta], theta.dtype, out_shape)]


# ---- Einsum -------------------------------------------------------------------------------------------------------
@register("Einsum", 12)
class Einsum(Op):
    """Every operand as a strided view over all the equation's letters (a repeated letter is a diagonal: the
    strides add; a missing one is a broadcast: stride 0), one product kernel, then a sum over the letters
    the output drops."""

    attrs = {"equation": ""}

    def run(self, ctx: Context, *xs: T) -> list[T]:
        eq = self.a["equation"].replace(" ", "")
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


# ---- scatters: a copy of the data, an offsets kernel, then the backend's scatter primitive ----------------------
def scatter(ctx: Context, data: T, offsets: Expr, offset_inputs: Sequence[T | View], updates: T,
            reduction: str) -> T:
    """out = data, then out.flat[offsets] (reduction)= updates, offsets an int Expr over the updates' shape."""
    if reduction not in ("none", "add", "mul", "max", "min"):
        raise ValueError(f"unknown scatter reduction {reduction!r}")
    out = kernel(ctx, inp(0, kind_of(data.dtype)), [data], data.dtype, data.shape)
    if updates.size and out.size:
        offs = kernel(ctx, offsets, offset_inputs, np.dtype(np.int32), updates.shape)
        ctx.record(ctx.backend.record_scatter(out.view, offs.view, ctx.contiguous(updates), reduction))
    return out


def _strides(shape: Sequence[int]) -> list[int]:
    return list(View.contiguous(0, np.float32, tuple(shape)).strides)


def _linear(idx: Sequence[Expr], shape: Sequence[int]) -> Expr:
    terms = [call("mul", e, ic(s)) if s != 1 else e for e, s, d in zip(idx, _strides(shape), shape, strict=True)
             if d != 1]
    return sum_exprs(terms) if terms else ic(0)


@register("ScatterElements", 11)
class ScatterElements(Op):
    attrs = {"axis": 0, "reduction": "none"}

    def run(self, ctx: Context, data: T, indices: T, updates: T) -> list[T]:
        axis = norm_axis(self, self.a["axis"], data.rank)
        if indices.shape != updates.shape or indices.rank != data.rank:
            raise ValueError(f"{self.node.describe()}: indices {indices.shape} and updates {updates.shape} "
                             f"do not match data {data.shape}")
        check_indices(self, indices, data.shape[axis])
        k = wrap_index(call("to_int", inp(0, kind_of(indices.dtype))), data.shape[axis])
        off = _linear([k if d == axis else coord(d) for d in range(data.rank)], data.shape)
        return [scatter(ctx, data, off, [indices], updates, self.a["reduction"])]


@register("Scatter", 9)
class Scatter(ScatterElements):
    """The pre-opset-11 name of ScatterElements."""


@register("ScatterND", 11)
class ScatterND(Op):
    attrs = {"reduction": "none"}

    def run(self, ctx: Context, data: T, indices: T, updates: T) -> list[T]:
        q, m = indices.rank, indices.shape[-1]
        if updates.shape != indices.shape[:-1] + data.shape[m:]:
            raise ValueError(f"{self.node.describe()}: updates {updates.shape} do not match indices "
                             f"{indices.shape} and data {data.shape}")
        lead = coords(q - 1)
        ik = kind_of(indices.dtype)
        idx = [wrap_index(call("to_int", load(0, *lead, ic(j), kind=ik)), data.shape[j]) for j in range(m)]
        idx += [coord(q - 1 + t) for t in range(data.rank - m)]
        return [scatter(ctx, data, _linear(idx, data.shape), [indices], updates, self.a["reduction"])]


@register("TensorScatter", 24)
class TensorScatter(Op):
    """A KV-cache write: update[b, ..., s, ...] goes to cache position write_indices[b] + s along `axis`
    (modulo the cache length in circular mode)."""

    attrs = {"mode": "linear", "axis": -2}

    def run(self, ctx: Context, cache: T, update: T, write_indices: T | None = None) -> list[T]:
        axis = norm_axis(self, self.a["axis"], cache.rank)
        length = cache.shape[axis]
        pos = coord(axis)
        ins: list[T] = []
        if write_indices is not None:
            ins.append(write_indices)
            pos = call("add", call("to_int", load(0, coord(0), kind=kind_of(write_indices.dtype))), pos)
        if self.a["mode"] == "circular":
            pos = call("mod", pos, ic(length))
        idx = [pos if d == axis else coord(d) for d in range(cache.rank)]
        return [scatter(ctx, cache, _linear(idx, cache.shape), ins, update, "none")]


@register("Col2Im", 18)
class Col2Im(Op):
    """Sum the sliding blocks back into the image: for each output pixel, the k taps of the block grid that
    cover it (unrolled), each a computed load from the (N, C * prod(block), L) input."""

    host_inputs = (1, 2)
    attrs = {"dilations": None, "pads": None, "strides": None}

    def run(self, ctx: Context, x: T, image: T, block: T) -> list[T]:
        img, blk = host_ints(self, image, "image_shape"), host_ints(self, block, "block_shape")
        r = len(img)
        dil = list(self.a["dilations"] or [1] * r)
        pads = list(self.a["pads"] or [0] * (2 * r))
        strides = list(self.a["strides"] or [1] * r)
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
                pos = call("sub", call("add", coord(2 + i), ic(pads[i])), ic(kk[i] * dil[i]))
                if strides[i] > 1:
                    ok.append(call("eq", call("mod", pos, ic(strides[i])), ic(0)))
                    pos = call("div", pos, ic(strides[i]))
                ok += [call("ge", pos, ic(0)), call("lt", pos, ic(nblocks[i]))]
                bidx.append(pos)
            chan = call("add", call("mul", coord(1), ic(ksize)), ic(_linear_index(kk, blk)))
            v = load(0, coord(0), chan, _linear(bidx, nblocks), kind=FLOAT)
            cond = all_exprs(ok)
            terms.append(call("where", cond, v, fc(0.0)) if cond is not None else v)
        return [kernel(ctx, sum_exprs(terms), [x], x.dtype, (n, ck // ksize, *img))]


def _linear_index(idx: Sequence[int], shape: Sequence[int]) -> int:
    return int(sum(i * s for i, s in zip(idx, _strides(shape), strict=True)))


# ---- MaxPool's Indices output and MaxUnpool ------------------------------------------------------------------------
def pool_argmax(ctx: Context, x: T, out_shape: Sequence[int], ksize: Sequence[int], strides: Sequence[int],
                dil: Sequence[int], pads: Sequence[int], storage_order: int, values: bool = False) -> T:
    """The flat input index of each max-pool window's maximum (the first, in window order, among equals), or
    with `values` the maximum itself (any dtype): the window's taps unrolled in one index kernel."""
    r = x.rank - 2
    size = x.shape[2:]
    kind = kind_of(x.dtype)
    # Flat index within the (n, c) plane: row-major, or column-major for storage_order 1.
    plane = _strides(size) if not storage_order else [math.prod(size[:i]) for i in range(r)]
    best: Expr | None = None
    found: Expr = const(False, BOOL)
    idx: Expr = ic(-1)
    for kk in itertools.product(*(range(k) for k in ksize)):
        pos, ok = [], []
        for i in range(r):
            p = call("add", call("mul", coord(2 + i), ic(strides[i])), ic(kk[i] * dil[i] - pads[i]))
            pos.append(p)
            ok += [call("ge", p, ic(0)), call("lt", p, ic(size[i]))]
        v = load(0, coord(0), coord(1), *pos, kind=kind)
        flat = sum_exprs([call("mul", p, ic(s)) for p, s in zip(pos, plane, strict=True)])
        valid = all_exprs(ok)
        take = valid if best is None else call("and", valid, call("or", call("not", found), call("gt", v, best)))
        best = v if best is None else call("where", take, v, best)
        idx = call("where", take, flat, idx)
        found = call("or", found, valid)
    if values:
        assert best is not None
        return kernel(ctx, best, [x], x.dtype, out_shape)
    base = call("mul", call("add", call("mul", coord(0), ic(x.shape[1])), coord(1)), ic(math.prod(size)))
    return kernel(ctx, call("add", base, idx), [x], np.dtype(np.int64), out_shape)


@register("MaxUnpool", 9)
class MaxUnpool(Op):
    host_inputs = (2,)
    attrs = {"kernel_shape": None, "pads": None, "strides": None}

    def run(self, ctx: Context, x: T, indices: T, output_shape: T | None = None) -> list[T]:
        r = x.rank - 2
        if output_shape is not None:
            shape = host_ints(self, output_shape, "output_shape")
        else:
            k, st = self.a["kernel_shape"], self.a["strides"] or [1] * r
            pads = self.a["pads"] or [0] * (2 * r)
            shape = [*x.shape[:2], *((x.shape[2 + i] - 1) * st[i] + k[i] - pads[i] - pads[i + r] for i in range(r))]
        zeros = ctx.const(np.zeros(shape, x.dtype))
        return [scatter(ctx, zeros, call("to_int", inp(0, INT)), [indices], x, "none")]

"""Resize and Upsample. The per-axis index and weight tables depend on attributes and shapes only, so
they are computed on the host at plan time (as onnx.reference computes them) and read by the kernel."""

from __future__ import annotations

import math

import numpy as np

from ..core.dtypes import kind_of
from ..core.expr import BOOL, FLOAT, INT, call, const, coord, inp, load
from .base import Context, Op, Tensor, host_ints, norm_axis, register
from .exprs import any_exprs, coords, int_const, kernel, sum_exprs


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

    def plan_sizes(self, x: Tensor, roi: list[float] | None, scales: list[float] | None, sizes: list[int] | None,
                   ) -> tuple[list[float], list[int], list[tuple[float, float]] | None]:
        """Per-dim scales, output sizes and rois, as onnx.reference's _interpolate_nd derives them."""
        r = x.rank
        axes = [norm_axis(self, a, r) for a in self.attr["axes"]] if self.attr["axes"] else list(range(r))
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
            policy = self.attr["keep_aspect_ratio_policy"]
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

    def resize(self, ctx: Context, x: Tensor, sc: list[float], out: list[int],
               rois: list[tuple[float, float]] | None) -> Tensor:
        a = self.attr
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
            ins: list[Tensor] = [x]
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
                e = call("where", any_exprs(outside), fill, e)
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
                idx[d] = load(1, coord(d), int_const(t), kind=INT)
                terms.append(call("mul", load(0, *idx, kind=FLOAT), load(2, coord(d), int_const(t), kind=FLOAT)))
            e = sum_exprs(terms)
            if ex is not None and ex.any():
                ins.append(ctx.const(ex))
                e = call("where", load(3, coord(d), kind=BOOL), fill, e)
            cur = kernel(ctx, e, ins, x.dtype, shape)
        return cur if tables else kernel(ctx, inp(0, kind), [x], x.dtype, x.shape)


def _floats(op: Op, t: Tensor | None, what: str) -> list[float] | None:
    if t is None or t.size == 0:
        return None
    if not t.is_const:
        raise op.fail(f"the {what} input must be known when the plan is built")
    return [float(v) for v in np.asarray(t.value).reshape(-1)]


@register("Resize", 10)
class Resize(ResizeBase):
    host_inputs = (1, 2, 3)

    def run(self, ctx: Context, x: Tensor, *rest: Tensor | None) -> list[Tensor]:
        if self.node.opset < 11:  # Resize-10: (X, scales), asymmetric coordinates
            self.attr = {**self.attr, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
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

    def run(self, ctx: Context, x: Tensor, scales: Tensor | None = None) -> list[Tensor]:
        self.attr = {**self.attr, "coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}
        if self.attr["mode"] == "bilinear":
            self.attr["mode"] = "linear"
        sc_list = _floats(self, scales, "scales") if scales is not None else list(self.attr["scales"])
        sc, out, rois = self.plan_sizes(x, None, sc_list, None)
        return [self.resize(ctx, x, sc, out, rois)]

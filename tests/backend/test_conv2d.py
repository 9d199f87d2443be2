"""conv2d_forward and record_conv on every backend, against a float64 numpy oracle (fresh inputs every run)."""

from __future__ import annotations

import numpy as np
import pytest

import ember
from ember.backends.base import View
from ember.core.expr import call, const, eval_numpy, inp

from .helpers import download, poisoned, rel_err, upload

TOL = 1e-4
F32 = np.dtype(np.float32)


def conv_ref(x: np.ndarray, w: np.ndarray, bias: np.ndarray | None = None, stride=(1, 1), pads=(0, 0, 0, 0),
             dilation=(1, 1), groups: int = 1, act=None) -> np.ndarray:
    x, w = x.astype(np.float64), w.astype(np.float64)
    n, c, h, wd = x.shape
    k, cg, r, s = w.shape
    (sh, sw), (pt, pl, pb, pr), (dh, dw) = stride, pads, dilation
    p = (h + pt + pb - dh * (r - 1) - 1) // sh + 1
    q = (wd + pl + pr - dw * (s - 1) - 1) // sw + 1
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    kg = k // groups
    out = np.zeros((n, k, p, q))
    for g in range(groups):
        for i in range(r):
            for j in range(s):
                rows = slice(i * dh, i * dh + (p - 1) * sh + 1, sh)
                cols = slice(j * dw, j * dw + (q - 1) * sw + 1, sw)
                patch = xp[:, g * cg:(g + 1) * cg, rows, cols]
                out[:, g * kg:(g + 1) * kg] += np.einsum("ncpq,kc->nkpq", patch, w[g * kg:(g + 1) * kg, :, i, j])
    if bias is not None:
        out += bias.astype(np.float64).reshape(1, k, 1, 1)
    if act is not None:
        out = eval_numpy(act, [out], np.float64)
    return out


def out_hw(h: int, w: int, r: int, s: int, stride, pads, dilation) -> tuple[int, int]:
    return ((h + pads[0] + pads[2] - dilation[0] * (r - 1) - 1) // stride[0] + 1,
            (w + pads[1] + pads[3] - dilation[1] * (s - 1) - 1) // stride[1] + 1)


# ---- the public op ----------------------------------------------------------------------------------------------
PUBLIC = [
    # (N, C, H, W), (K, R, S), stride, padding
    ((1, 3, 9, 9), (4, 1, 1), (1, 1), (0, 0)),
    ((2, 5, 7, 11), (6, 1, 1), (2, 2), (0, 0)),
    ((1, 6, 8, 8), (3, 1, 1), (1, 2), (1, 0)),
    ((1, 3, 13, 13), (5, 3, 3), (1, 1), (1, 1)),
    ((2, 4, 10, 7), (8, 3, 3), (2, 2), (1, 1)),
    ((1, 7, 9, 12), (5, 3, 3), (2, 1), (0, 2)),
    ((1, 3, 23, 23), (8, 7, 7), (2, 2), (3, 3)),
    ((2, 2, 15, 9), (3, 7, 7), (1, 1), (0, 3)),
    ((1, 3, 29, 31), (16, 7, 7), (3, 2), (2, 1)),
    ((1, 1, 1, 1), (1, 1, 1), (1, 1), (0, 0)),
    ((3, 16, 17, 17), (33, 3, 3), (1, 1), (1, 1)),
]


@pytest.mark.parametrize("xshape,fshape,stride,padding", PUBLIC)
def test_conv2d_forward(be: ember.ComputeBackend, rng: np.random.Generator, xshape, fshape, stride, padding) -> None:
    n, c, h, w = xshape
    k, r, s = fshape
    x = rng.standard_normal(xshape).astype(np.float32)
    f = rng.standard_normal((k, c, r, s)).astype(np.float32)
    p, q = out_hw(h, w, r, s, stride, (padding[0], padding[1]) * 2, (1, 1))
    hx, hf, ho = upload(be, x), upload(be, f), poisoned(be, n * k * p * q)
    try:
        be.conv2d_forward(hx, xshape, hf, (k, c, r, s), ho, (n, k, p, q), stride, padding)
        got = download(be, ho, (n, k, p, q))
    finally:
        for hh in (hx, hf, ho):
            be.free(hh)
    assert rel_err(got, conv_ref(x, f, stride=stride, pads=(padding[0], padding[1]) * 2)) <= TOL


# ---- record_conv: groups, depthwise, dilation, asymmetric pads, bias, act --------------------------------------------
def run_conv(be: ember.ComputeBackend, rng: np.random.Generator, xshape, k: int, rs, stride=(1, 1), pads=(0, 0, 0, 0),
             dilation=(1, 1), groups: int = 1, bias: bool = True, act=None) -> None:
    n, c, h, w = xshape
    r, s = rs
    x = rng.standard_normal(xshape).astype(np.float32)
    f = rng.standard_normal((k, c // groups, r, s)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32) if bias else None
    p, q = out_hw(h, w, r, s, stride, pads, dilation)
    hx, hf, ho = upload(be, x), upload(be, f), poisoned(be, n * k * p * q)
    hb = upload(be, b) if bias else None
    try:
        steps = be.record_conv(View.contiguous(hx, F32, xshape), View.contiguous(hf, F32, f.shape),
                               View.contiguous(hb, F32, (k,)) if bias else None,
                               View.contiguous(ho, F32, (n, k, p, q)), stride, pads, dilation, groups, act,
                               const_weight=True)
        be.execute(steps)
        got = download(be, ho, (n, k, p, q))
    finally:
        for hh in (hx, hf, ho, hb):
            if hh is not None:
                be.free(hh)
    ref = conv_ref(x, f, b, stride, pads, dilation, groups, act)
    err = rel_err(got, ref)
    assert err <= TOL, (xshape, k, rs, stride, pads, dilation, groups, err)


RELU = call("relu", inp(0))
SILU = call("mul", inp(0), call("sigmoid", inp(0)))
CLIP = call("min", call("max", inp(0), const(0.0)), const(6.0))


@pytest.mark.parametrize("xshape,k,rs,stride,pads,dilation,groups", [
    ((2, 8, 9, 9), 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2),      # grouped
    ((1, 12, 10, 8), 6, (3, 3), (2, 1), (0, 1, 2, 0), (1, 1), 3),    # grouped, asymmetric pads
    ((2, 6, 11, 11), 12, (5, 3), (1, 2), (2, 1, 2, 1), (2, 1), 2),   # grouped + dilation
    ((1, 16, 8, 8), 32, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 4),    # grouped 1x1
    ((2, 5, 12, 12), 7, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1),    # dilated
    ((1, 3, 14, 10), 4, (3, 3), (1, 1), (0, 3, 1, 0), (3, 2), 1),    # dilated, asymmetric
    ((1, 4, 6, 6), 5, (2, 4), (3, 2), (1, 0, 0, 2), (1, 1), 1),      # non-square filter
    ((1, 4, 23, 19), 8, (5, 5), (2, 2), (2, 1, 3, 2), (2, 1), 1),    # strided, many taps, dilated
    ((2, 3, 30, 28), 6, (7, 5), (3, 2), (3, 0, 1, 4), (2, 3), 1),    # stride 3, dilation 2 and 3
])
def test_conv_grouped_dilated(be: ember.ComputeBackend, rng: np.random.Generator, xshape, k, rs, stride, pads,
                              dilation, groups) -> None:
    run_conv(be, rng, xshape, k, rs, stride, pads, dilation, groups, act=RELU)


@pytest.mark.parametrize("xshape,mult,rs,stride,pads,dilation", [
    ((2, 8, 12, 12), 1, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 5, 9, 13), 1, (3, 3), (2, 2), (1, 0, 1, 2), (1, 1)),
    ((1, 4, 16, 16), 2, (5, 5), (1, 1), (2, 2, 2, 2), (1, 1)),       # channel multiplier 2
    ((1, 3, 11, 11), 3, (3, 3), (1, 2), (2, 2, 2, 2), (2, 2)),       # multiplier 3, dilation 2
    ((2, 32, 7, 7), 1, (7, 7), (1, 1), (3, 3, 3, 3), (1, 1)),
])
def test_conv_depthwise(be: ember.ComputeBackend, rng: np.random.Generator, xshape, mult, rs, stride, pads,
                        dilation) -> None:
    c = xshape[1]
    run_conv(be, rng, xshape, c * mult, rs, stride, pads, dilation, groups=c, act=CLIP)


@pytest.mark.parametrize("act", [None, RELU, SILU, CLIP])
@pytest.mark.parametrize("rs,stride,pads", [((1, 1), (1, 1), (0, 0, 0, 0)), ((3, 3), (2, 2), (1, 1, 1, 1)),
                                            ((1, 1), (2, 2), (0, 0, 0, 0))])
def test_conv_bias_act(be: ember.ComputeBackend, rng: np.random.Generator, act, rs, stride, pads) -> None:
    run_conv(be, rng, (2, 9, 10, 10), 11, rs, stride, pads, act=act)


def test_conv_without_bias(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    run_conv(be, rng, (1, 4, 8, 8), 6, (3, 3), pads=(1, 1, 1, 1), bias=False)
    run_conv(be, rng, (1, 4, 8, 8), 6, (1, 1), bias=False, act=RELU)
    run_conv(be, rng, (1, 4, 8, 8), 4, (3, 3), groups=4, bias=False)


def test_conv_many_workgroups(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Output channels and pixels spanning many tiles, aligned (vec4 weight loads) and not."""
    run_conv(be, rng, (2, 16, 30, 30), 72, (3, 3), pads=(1, 1, 1, 1), act=RELU)  # C*R*S = 144, 4-aligned
    run_conv(be, rng, (1, 9, 33, 31), 40, (3, 3), (2, 2), (1, 1, 1, 1))           # C*R*S = 81
    run_conv(be, rng, (4, 32, 14, 14), 64, (1, 1), act=RELU)                      # the matmul route


def test_conv_long_reduction(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Few output tiles, long reduction: split K on the GPU, bias and act applied after the partial sums."""
    run_conv(be, rng, (1, 256, 5, 5), 16, (3, 3), pads=(1, 1, 1, 1), act=SILU)        # K = C*R*S = 2304
    run_conv(be, rng, (2, 64, 7, 7), 24, (3, 3), (2, 2), (1, 1, 1, 1), groups=2)     # grouped, split over z too


@pytest.mark.parametrize("xshape,k,rs,stride,pads,dilation,act", [
    ((1, 33, 7, 7), 96, (3, 3), (1, 1), (1, 0, 2, 1), (1, 1), RELU),     # odd channels, asymmetric pads
    ((2, 40, 11, 13), 128, (3, 3), (2, 2), (0, 1, 1, 2), (1, 1), None),  # batch 2, stride 2, odd sizes
    ((1, 27, 9, 8), 128, (3, 3), (2, 1), (2, 1, 0, 3), (2, 1), CLIP),    # dilated, mixed strides
    ((1, 96, 15, 15), 192, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), RELU),  # strided 1x1
])
def test_conv_weight_heavy(be: ember.ComputeBackend, rng: np.random.Generator, xshape, k, rs, stride, pads, dilation,
                           act) -> None:
    """More output channels than output positions and products large enough to split: the cpu backend splits
    these by input channels (each thread its im2col part and a partial product, summed after)."""
    run_conv(be, rng, xshape, k, rs, stride, pads, dilation, act=act)
    run_conv(be, rng, xshape, k, rs, stride, pads, dilation, bias=False)


# ---- the error contract ----------------------------------------------------------------------------------------
def test_conv2d_errors(be: ember.ComputeBackend) -> None:
    hx, hf, ho = be.alloc(4 * 2 * 3 * 5 * 5), be.alloc(4 * 4 * 3 * 3 * 3), be.alloc(4 * 2 * 4 * 5 * 5)
    args = dict(input=hx, input_shape=(2, 3, 5, 5), filter=hf, filter_shape=(4, 3, 3, 3), output=ho,
                output_shape=(2, 4, 5, 5), stride=(1, 1), padding=(1, 1))
    try:
        be.conv2d_forward(**args)
        for name, value, match in [
            ("output_shape", (2, 4, 3, 3), "^output_shape"), ("output_shape", (2, 4, 5), "^output_shape"),
            ("input_shape", (2, 3, 5), "^input_shape"), ("input_shape", (2, 0, 5, 5), r"^input_shape\[1\]"),
            ("filter_shape", (4, 2, 3, 3), "^filter_shape"), ("stride", (0, 1), r"^stride\[0\]"),
            ("stride", (1, 1, 1), "^stride"), ("padding", -1, r"^padding\[0\]"),
            ("input_shape", (2, 3, 6, 5), "^input:"), ("filter_shape", (5, 3, 3, 3), "^filter:"),
            ("filter", 10_000, "^filter: handle"), ("output", None, "^output: a handle"),
        ]:
            bad = {**args, name: value}
            if name == "input_shape" and value == (2, 3, 6, 5):
                bad["output_shape"] = (2, 4, 6, 5)  # consistent shapes: the input allocation is what is too small
            if name == "filter_shape" and value == (5, 3, 3, 3):
                bad["output_shape"] = (2, 5, 5, 5)
            with pytest.raises(ValueError, match=match):
                be.conv2d_forward(**bad)
        with pytest.raises(ValueError, match="larger than the padded input"):
            be.conv2d_forward(**{**args, "filter_shape": (4, 3, 9, 9), "padding": (0, 0), "output_shape": (2, 4, 1, 1)})
        small = be.alloc(4 * 10)
        with pytest.raises(ValueError, match="^output:"):
            be.conv2d_forward(**{**args, "output": small})
        be.free(small)
        with pytest.raises(ValueError, match="^output: handle .* is freed"):
            be.conv2d_forward(**{**args, "output": small})
    finally:
        for h in (hx, hf, ho):
            be.free(h)


def test_record_conv_rejects_bad_views(wgpu_be: ember.ComputeBackend) -> None:
    be = wgpu_be  # a wgpu-only check: runs on wgpu, never skipped
    hx, hf, ho = be.alloc(4 * 100), be.alloc(4 * 100), be.alloc(4 * 100)
    try:
        x = View.contiguous(hx, F32, (1, 2, 4, 4))
        f = View.contiguous(hf, F32, (2, 2, 3, 3))
        o = View.contiguous(ho, F32, (1, 2, 2, 2))
        with pytest.raises(ValueError, match="contiguous"):
            be.record_conv(x.permute((0, 1, 3, 2)), f, None, o, (1, 1), (0, 0, 0, 0), (1, 1), 1)
        with pytest.raises(ValueError, match="out shape"):
            be.record_conv(x, f, None, View.contiguous(ho, F32, (1, 2, 3, 3)), (1, 1), (0, 0, 0, 0), (1, 1), 1)
        with pytest.raises(ValueError, match="groups"):
            be.record_conv(x, f, None, o, (1, 1), (0, 0, 0, 0), (1, 1), 2)
        with pytest.raises(ValueError, match="overlaps the output"):
            be.record_conv(x, f, None, View.contiguous(hx, F32, (1, 2, 2, 2)), (1, 1), (0, 0, 0, 0), (1, 1), 1)
        with pytest.raises(NotImplementedError, match="float64"):
            be.record_conv(View.contiguous(hx, np.float64, (1, 2, 4, 4)), f, None, o, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    finally:
        for h in (hx, hf, ho):
            be.free(h)


@pytest.mark.parametrize("xshape,k,rs,stride,pads,groups,layout", [
    ((2, 32, 9, 9), 24, (3, 3), (1, 1), (1, 1, 1, 1), 1, "contiguous"),       # implicit GEMM
    ((1, 256, 5, 5), 16, (3, 3), (1, 1), (1, 1, 1, 1), 1, "contiguous"),      # split K: the reduce kernel adds it
    ((2, 32, 7, 7), 48, (1, 1), (1, 1), (0, 0, 0, 0), 1, "contiguous"),       # the 1x1 matmul route
    ((2, 8, 12, 12), 8, (3, 3), (1, 1), (1, 1, 1, 1), 8, "contiguous"),       # depthwise
    ((2, 12, 8, 8), 12, (3, 3), (1, 1), (1, 1, 1, 1), 1, "channel-broadcast"),  # a (1, K, 1, 1) addend
    ((2, 12, 8, 8), 12, (3, 3), (1, 1), (1, 1, 1, 1), 1, "offset"),           # a view inside a bigger buffer
])
def test_wgpu_conv_residual_epilogue(wgpu_be: ember.ComputeBackend, rng: np.random.Generator, xshape, k, rs, stride,
                                pads, groups, layout) -> None:
    """out = relu(conv + bias + residual) with the residual read in the conv kernel's epilogue (ResNet's Add+Relu)."""
    be = wgpu_be
    n, c, h, w = xshape
    p, q = out_hw(h, w, *rs, stride, pads, (1, 1))
    x = rng.standard_normal(xshape).astype(np.float32)
    f = rng.standard_normal((k, c // groups, *rs)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    if layout == "channel-broadcast":
        res = rng.standard_normal((1, k, 1, 1)).astype(np.float32)
        store, rview = res, lambda hr: View(hr, F32, (n, k, p, q), (0, 1, 0, 0), 0)
    elif layout == "offset":
        res = rng.standard_normal((n, k, p, q)).astype(np.float32)
        store = np.concatenate([np.full(7, np.nan, np.float32), res.ravel()])
        rview = lambda hr: View.contiguous(hr, F32, (n, k, p, q), 7)  # noqa: E731
    else:
        res = rng.standard_normal((n, k, p, q)).astype(np.float32)
        store, rview = res, lambda hr: View.contiguous(hr, F32, (n, k, p, q))  # noqa: E731
    hx, hf, hb, hr, ho = upload(be, x), upload(be, f), upload(be, b), upload(be, store), poisoned(be, n * k * p * q)
    try:
        steps = be.record_conv(View.contiguous(hx, F32, xshape), View.contiguous(hf, F32, f.shape),
                               View.contiguous(hb, F32, (k,)), View.contiguous(ho, F32, (n, k, p, q)), stride, pads,
                               (1, 1), groups, RELU, residual=rview(hr))
        be.execute(steps)
        got = download(be, ho, (n, k, p, q))
    finally:
        for hh in (hx, hf, hb, hr, ho):
            be.free(hh)
    ref = np.maximum(conv_ref(x, f, b, stride, pads, (1, 1), groups) + res.astype(np.float64), 0.0)
    assert rel_err(got, ref) <= TOL


def test_wgpu_conv_residual_errors(wgpu_be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    be = wgpu_be
    hx, hf, ho, hr = upload(be, np.ones((1, 4, 6, 6), np.float32)), upload(be, np.ones((4, 4, 3, 3), np.float32)), \
        be.alloc(4 * 4 * 36), be.alloc(4 * 4 * 36)
    try:
        args = (View.contiguous(hx, F32, (1, 4, 6, 6)), View.contiguous(hf, F32, (4, 4, 3, 3)), None,
                View.contiguous(ho, F32, (1, 4, 6, 6)), (1, 1), (1, 1, 1, 1), (1, 1), 1)
        with pytest.raises(ValueError, match="residual must have the output's shape"):
            be.record_conv(*args, residual=View.contiguous(hr, F32, (1, 4, 3, 12)))
        with pytest.raises(ValueError, match="residual overlaps the output"):
            be.record_conv(*args, residual=View.contiguous(ho, F32, (1, 4, 6, 6)))
    finally:
        for hh in (hx, hf, ho, hr):
            be.free(hh)

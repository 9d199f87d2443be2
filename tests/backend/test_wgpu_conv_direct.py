"""The wgpu direct conv (kernels/conv_direct.wgsl: few input channels, a large window, e.g. an image model's
stem) against a float64 oracle, next to implicit GEMM on the same problem; and which convs it takes."""

from __future__ import annotations

import math

import numpy as np
import pytest

import ember
from ember.backends.base import View
from ember.backends.wgpu import conv_direct, conv_igemm, conv_shape

from .helpers import rel_err
from .test_conv2d import CLIP, F32, RELU, TOL, conv_ref, out_hw

F16 = np.dtype(np.float16)


def put(be: ember.ComputeBackend, a: np.ndarray) -> int:
    h = be.alloc(a.nbytes)
    be.upload(h, a)
    return h


MIN_WORKGROUPS = conv_direct.DIRECT_MIN_WORKGROUPS  # the shipped threshold, before the fixture lowers it


@pytest.fixture(autouse=True)
def small_problems_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel only takes convs with many workgroups (conv_direct.DIRECT_MIN_WORKGROUPS); test shapes are small."""
    monkeypatch.setattr(conv_direct, "DIRECT_MIN_WORKGROUPS", 0)


def shape_of(xshape, k: int, rs, stride, pads, dilation, groups: int = 1) -> conv_shape.ConvShape:
    n, c, h, w = xshape
    p, q = out_hw(h, w, *rs, stride, pads, dilation)
    return conv_shape.ConvShape(n, c, h, w, k, c // groups, *rs, p, q, *stride, pads[0], pads[1], *dilation, groups)


@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("xshape,k,rs,stride,pads,dilation,residual", [
    ((2, 3, 40, 36), 64, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), False),   # ResNet's stem, tail tiles both ways
    ((1, 3, 33, 35), 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1), False),   # MobileNetV2's stem
    ((1, 4, 21, 19), 96, (5, 5), (1, 1), (2, 1, 0, 3), (1, 1), True),    # 3 channel tiles, asymmetric pads
    ((3, 2, 17, 23), 8, (3, 5), (2, 3), (0, 2, 1, 0), (2, 1), False),    # one warp, dilated, mixed strides
    ((1, 6, 9, 40), 16, (5, 7), (1, 2), (0, 0, 0, 0), (1, 2), True),     # two warps, no padding, patch edges
])
def test_direct_conv_matches_reference(wgpu_be: ember.ComputeBackend, rng: np.random.Generator, xshape, k, rs,
                                       stride, pads, dilation, residual: bool, dtype: np.dtype) -> None:
    """The direct kernel runs (its dispatch label says so) and agrees with float64; implicit GEMM, which it
    replaced for these shapes, still does too. float16 storage is computed in float32: the output's rounding
    (2^-11) is the expected difference."""
    if dtype == F16 and "shader-f16" not in wgpu_be.features:
        pytest.fail("the adapter lacks shader-f16, which the float16 kernels need")
    be = wgpu_be
    n, c, h, w = xshape
    p, q = out_hw(h, w, *rs, stride, pads, dilation)
    cs = shape_of(xshape, k, rs, stride, pads, dilation)
    assert conv_direct.direct_geometry(be, cs) is not None
    x = rng.standard_normal(xshape).astype(dtype)
    f = rng.standard_normal((k, c, *rs)).astype(dtype)
    b = rng.standard_normal(k).astype(dtype)
    res = rng.standard_normal((n, k, p, q)).astype(dtype)
    act = RELU if residual else CLIP
    ref = conv_ref(x, f, b, stride, pads, dilation) + (res.astype(np.float64) if residual else 0.0)
    ref = np.maximum(ref, 0.0) if residual else np.clip(ref, 0.0, 6.0)
    hx, hf, hb, hr = (put(be, a) for a in (x, f, b, res))
    ho = be.alloc(n * k * p * q * dtype.itemsize)
    views = (View.contiguous(hx, dtype, xshape), View.contiguous(hf, dtype, f.shape), View.contiguous(hb, dtype, (k,)),
             View.contiguous(ho, dtype, (n, k, p, q)))
    rv = View.contiguous(hr, dtype, (n, k, p, q)) if residual else None
    nan = np.full((n, k, p, q), np.nan, dtype)
    try:
        be.upload(ho, nan)
        steps = be.record_conv(*views, stride, pads, dilation, 1, act, residual=rv)
        assert [s.label for s in steps] == ["conv_direct"]
        be.execute(steps)
        got_direct = be.download(views[3]).astype(np.float64)
        be.upload(ho, nan)
        types = {v.handle: "f16" if dtype == F16 else "f32" for v in (*views, rv) if v is not None}
        res3 = rv.merged((n, k, p * q)) if rv is not None else None
        be.execute(conv_igemm.record_implicit_gemm(be, cs, *views, act, types, res3))
        got_gemm = be.download(views[3]).astype(np.float64)
    finally:
        for hh in (hx, hf, hb, hr, ho):
            be.free(hh)
    tol = TOL if dtype == F32 else 2e-3
    assert rel_err(got_direct, ref) <= tol
    assert rel_err(got_gemm, ref) <= tol


@pytest.mark.parametrize("xshape,k,rs,stride,groups,why", [
    ((1, 32, 16, 16), 64, (3, 3), (1, 1), 1, "K = C*R*S above 256: implicit GEMM's own ground"),
    ((1, 8, 16, 16), 64, (1, 3), (1, 1), 1, "a window under 9 taps"),
    ((1, 4, 16, 16), 12, (3, 3), (1, 1), 1, "output channels not in whole warps of 8"),
    ((1, 4, 16, 16), 16, (3, 3), (1, 1), 2, "grouped"),
])
def test_direct_conv_declines(wgpu_be: ember.ComputeBackend, xshape, k, rs, stride, groups, why: str) -> None:
    cs = shape_of(xshape, k, rs, stride, (1, 1, 1, 1), (1, 1), groups)
    assert conv_direct.direct_geometry(wgpu_be, cs) is None, why


def test_direct_conv_wants_a_grid_that_fills_the_gpu(wgpu_be: ember.ComputeBackend,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """ResNet-18's stem at batch 1 (196 workgroups) takes the kernel; MobileNetV2's (98) stays on implicit GEMM,
    where whole runs measured no gain (conv_direct.DIRECT_MIN_WORKGROUPS)."""
    monkeypatch.setattr(conv_direct, "DIRECT_MIN_WORKGROUPS", MIN_WORKGROUPS)
    resnet = shape_of((1, 3, 224, 224), 64, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1))
    g = conv_direct.direct_geometry(wgpu_be, resnet)
    assert g is not None and math.prod(g.grid(resnet)) == 196
    mbv2 = shape_of((1, 3, 224, 224), 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1))
    assert conv_direct.direct_geometry(wgpu_be, mbv2) is None
    assert conv_direct.direct_geometry(wgpu_be, shape_of((8, 3, 224, 224), 32, (3, 3), (2, 2), (1, 1, 1, 1), (1, 1)))


def test_direct_conv_layout_fits_workgroup_memory(wgpu_be: ember.ComputeBackend) -> None:
    """The stem's layout: 4 warps of 8 channels, conflict-free patch rows, within the adapter's limit."""
    cs = shape_of((8, 3, 224, 224), 64, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1))
    g = conv_direct.direct_geometry(wgpu_be, cs)
    assert g is not None and (g.rt, g.warps, g.kt) == (4, 4, 32)
    assert g.grid(cs) == (7 * 14, 2, 8)
    assert g.rt * 2 * g.rstr % 32 == 16  # the warp's two row groups 16 banks apart
    assert g.smem_bytes(cs) <= int(wgpu_be.limits["max-compute-workgroup-storage-size"])

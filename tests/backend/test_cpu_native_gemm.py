"""The cpu backend's compiled kernels (backends/cpu/_gemm.c, native.py): the GEMM and the direct conv against
float64 oracles over panel, column-block, K-slice and column-chunk edges; their error contracts; and the convs
that take them (split by input channels; a stem with its max pooling; depthwise), with them and without."""

from __future__ import annotations

import numpy as np
import pytest

from ember.backends.base import View
from ember.backends.cpu import CpuBackend, native, parallel
from ember.backends.cpu import conv as cpu_conv
from ember.core.expr import call, const, inp

from . import test_cpu_conv_maxpool as stem
from . import test_cpu_split as split
from .helpers import download, poisoned, upload
from .test_conv2d import F32, conv_ref, out_hw

NO_NATIVE = "the compiled kernels are not built here, or this CPU lacks AVX-512F"
needs_native = pytest.mark.skipif(not native.available(), reason=NO_NATIVE)


@needs_native
@pytest.mark.parametrize("m,k,n", [
    (512, 2304, 49),   # ResNet-18 layer 4 at batch 1, one thread's input channels
    (32, 256, 7),      # exactly one panel, one K slice, one column block
    (33, 257, 8),      # one past each
    (100, 37, 13),     # short K, tails everywhere
    (1, 5, 1),
    (64, 600, 450),    # several K slices and column chunks (196 columns each)
    (96, 1152, 196),
])
def test_gemm_matches_float64(rng: np.random.Generator, m: int, k: int, n: int) -> None:
    w = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n + 3), dtype=np.float32)[:, :n]  # rows strided, as im2col columns can be
    c = np.full((m, n + 5), np.nan, np.float32)[:, :n]
    bias = rng.standard_normal(m, dtype=np.float32)
    before = native.calls()
    native.gemm_step(native.pack(w), b, c, bias)()
    assert native.calls() == before + 1
    ref = w.astype(np.float64) @ b.astype(np.float64) + bias[:, None]
    scale = np.abs(w).astype(np.float64) @ np.abs(b).astype(np.float64) + np.abs(bias)[:, None]
    assert np.all(np.abs(c - ref) <= 2e-6 * scale)


@needs_native
def test_gemm_relu_keeps_nan(rng: np.random.Generator) -> None:
    w = rng.standard_normal((40, 20), dtype=np.float32)
    b = rng.standard_normal((20, 9), dtype=np.float32)
    b[3, 4] = np.nan
    c = np.empty((40, 9), np.float32)
    native.gemm_step(native.pack(w), b, c, lo=0.0)()
    ref = np.maximum(w.astype(np.float64) @ b.astype(np.float64), 0)
    assert np.isnan(c[:, 4]).all()
    keep = np.ones(9, bool)
    keep[4] = False
    np.testing.assert_allclose(c[:, keep], ref[:, keep], rtol=1e-5, atol=1e-5)
    assert (c[:, keep] >= 0).all()


@needs_native
def test_gemm_rejects_bad_operands(rng: np.random.Generator) -> None:
    w = native.pack(rng.standard_normal((40, 20), dtype=np.float32))
    b = np.zeros((20, 9), np.float32)
    c = np.zeros((40, 9), np.float32)
    with pytest.raises(ValueError, match="b must be a 2-D float32 array with contiguous rows"):
        native.gemm_step(w, b.astype(np.float64), c)
    with pytest.raises(ValueError, match="c must be a 2-D float32 array with contiguous rows"):
        native.gemm_step(w, b, np.zeros((9, 40), np.float32).T)
    with pytest.raises(ValueError, match=r"a \(40, 20\) weight times b \(20, 9\) does not give c \(41, 9\)"):
        native.gemm_step(w, b, np.zeros((41, 9), np.float32))
    with pytest.raises(ValueError, match=r"a \(40, 20\) weight times b \(21, 9\)"):
        native.gemm_step(w, np.zeros((21, 9), np.float32), c)
    with pytest.raises(ValueError, match="bias of 39 for 40 rows"):
        native.gemm_step(w, b, c, np.zeros(39, np.float32))


# test_cpu_split's convs with more output channels than positions and products large enough to split: split
# by input channels.
CHANNEL_SPLITS = split.CONVS[2:6]


@pytest.mark.parametrize("path", ["direct", "gemm", "numpy"])
@pytest.mark.parametrize("conv", CHANNEL_SPLITS)
def test_weight_heavy_convs_on_every_path(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, conv,
                                          path: str) -> None:
    """Convs with more output channels than positions: split by output channels through the compiled direct conv
    (the default where it is available); split by input channels with the compiled GEMM where the direct conv is
    off (cpu_conv.DIRECT_NATIVE; it also declines dilated convs); through numpy without the library. The same
    result every way."""
    if path != "numpy" and not native.available():
        pytest.skip(NO_NATIVE)
    if path == "numpy":
        monkeypatch.setattr(native, "_LIB", None)
    monkeypatch.setattr(cpu_conv, "DIRECT_NATIVE", path == "direct")
    monkeypatch.setattr(parallel, "pool", lambda: split._POOL)
    before = native.calls()
    split.test_conv_split_matches_reference(*conv, rng=rng)
    assert (native.calls() > before) == (path != "numpy")


def test_channel_splits_are_covered() -> None:
    assert len(CHANNEL_SPLITS) >= 4


@needs_native
@pytest.mark.parametrize("c,h,w,k,rs,stride,pad", [
    (3, 40, 38, 64, 7, 2, 3),   # a ResNet stem
    (3, 20, 17, 40, 3, 1, 1),   # stride 1, channels past a panel
    (5, 13, 11, 33, 5, 2, 2),
    (2, 9, 12, 8, 3, 3, 0),     # stride 3: gathered one by one
    (16, 30, 30, 16, 3, 1, 1),  # 144 taps, one K slice
    (30, 12, 12, 32, 3, 1, 1),  # 270 taps: two K slices
])
def test_direct_conv_matches_float64(rng: np.random.Generator, c, h, w, k, rs, stride, pad) -> None:
    x = rng.standard_normal((1, c, h, w), dtype=np.float32)
    f = rng.standard_normal((k, c, rs, rs), dtype=np.float32)
    b = rng.standard_normal(k, dtype=np.float32)
    xp = np.zeros((c, h + 2 * pad, w + 2 * pad), np.float32)
    xp[:, pad:pad + h, pad:pad + w] = x[0]
    p, q = (h + 2 * pad - rs) // stride + 1, (w + 2 * pad - rs) // stride + 1
    y = np.full((p, q, k), np.nan, np.float32)
    before = native.calls()
    native.conv_step(native.pack(f.reshape(k, -1)), xp, (rs, rs), (stride, stride), y, b, lo=0.0)()
    assert native.calls() == before + 1
    ref = np.maximum(conv_ref(x, f, b, (stride, stride), (pad,) * 4, (1, 1)), 0)[0].transpose(1, 2, 0)
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


@needs_native
def test_direct_conv_rejects_bad_operands(rng: np.random.Generator) -> None:
    w = native.pack(rng.standard_normal((8, 27), dtype=np.float32))
    xp = np.zeros((3, 10, 10), np.float32)
    with pytest.raises(ValueError, match="must be C-contiguous float32"):
        native.conv_step(w, xp.astype(np.float64), (3, 3), (1, 1), np.zeros((8, 8, 8), np.float32))
    with pytest.raises(ValueError, match=r"a \(8, 27\) weight with a 3x3 window at stride \(2, 2\)"):
        native.conv_step(w, xp, (3, 3), (2, 2), np.zeros((8, 8, 8), np.float32))
    with pytest.raises(ValueError, match="bias of 7 for 8 channels"):
        native.conv_step(w, xp, (3, 3), (1, 1), np.zeros((8, 8, 8), np.float32), np.zeros(7, np.float32))


@pytest.mark.parametrize("native_on", [True, False], ids=["native", "numpy"])
@pytest.mark.parametrize("case", [0, 1, 2], ids=["resnet-stem", "batch2-odd", "no-act"])
def test_stem_with_pool_with_and_without_it(monkeypatch: pytest.MonkeyPatch, case: int, native_on: bool) -> None:
    """A conv + MaxPool step (record_conv_maxpool) runs its bands through the compiled direct conv where it is
    available, else through im2col and numpy; the same result either way."""
    if native_on and not native.available():
        pytest.skip(NO_NATIVE)
    if not native_on:
        monkeypatch.setattr(native, "_LIB", None)
    before = native.calls()
    stem.test_conv_maxpool_fused(*stem.CASES[case], with_bias=True)
    assert (native.calls() > before) == native_on


@pytest.mark.parametrize("const_weight", [False, True])
def test_a_weight_that_changes_is_read_every_run(rng: np.random.Generator, const_weight: bool) -> None:
    """record_conv packs a weight for the compiled kernels only where the caller says it stays the same
    (const_weight: a model's initializer). A weight written between runs (a graph input, or one a step computes,
    as ConvTranspose's flipped filter) is read afresh every run."""
    be = CpuBackend().init()
    x = rng.standard_normal((1, 16, 9, 9)).astype(np.float32)
    f1, f2 = (rng.standard_normal((32, 16, 3, 3)).astype(np.float32) for _ in range(2))
    hx, hf, ho = upload(be, x), upload(be, f1), poisoned(be, 32 * 81)
    steps = be.record_conv(View.contiguous(hx, F32, x.shape), View.contiguous(hf, F32, f1.shape), None,
                           View.contiguous(ho, F32, (1, 32, 9, 9)), (1, 1), (1, 1, 1, 1), (1, 1), 1,
                           const_weight=const_weight)
    before = native.calls()
    be.execute(steps)
    np.testing.assert_allclose(download(be, ho, (1, 32, 9, 9)), conv_ref(x, f1, None, (1, 1), (1,) * 4, (1, 1)),
                               rtol=1e-4, atol=1e-4)
    assert (native.calls() > before) == (const_weight and native.available())
    if not const_weight:
        be.upload(hf, f2)
        be.execute(steps)
        np.testing.assert_allclose(download(be, ho, (1, 32, 9, 9)), conv_ref(x, f2, None, (1, 1), (1,) * 4, (1, 1)),
                                   rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("native_on", [True, False], ids=["native", "numpy"])
@pytest.mark.parametrize("xshape,rs,stride,pads,act", [
    ((1, 32, 17, 19), (3, 3), (1, 1), (1, 1, 1, 1), "relu6"),  # MobileNet's, odd sizes: row tails
    ((2, 24, 20, 18), (3, 3), (2, 2), (1, 1, 1, 1), "relu"),   # stride 2, batch 2
    ((1, 8, 40, 37), (5, 5), (2, 1), (2, 1, 2, 3), None),      # 5x5, mixed strides, asymmetric pads
    ((1, 16, 9, 9), (3, 3), (1, 1), (0, 0, 0, 0), "sigmoid"),  # not a clamp: numpy applies it after
])
def test_depthwise_with_and_without_it(monkeypatch: pytest.MonkeyPatch, rng: np.random.Generator, native_on: bool,
                                       xshape, rs, stride, pads, act) -> None:
    """Depthwise convs run through the compiled kernel where it is available (bias and a clamp fused, the weight
    read at run time: here rewritten between runs), else through numpy; NaN in the input stays NaN."""
    if native_on and not native.available():
        pytest.skip(NO_NATIVE)
    if not native_on:
        monkeypatch.setattr(native, "_LIB", None)
    acts = {"relu": call("relu", inp(0)), "relu6": call("min", call("max", inp(0), const(0.0)), const(6.0)),
            "sigmoid": call("sigmoid", inp(0)), None: None}
    n, c, h, w = xshape
    p, q = out_hw(h, w, *rs, stride, pads, (1, 1))
    x = rng.standard_normal(xshape).astype(np.float32) * 3
    x[0, 1, 2, 3] = np.nan
    b = rng.standard_normal(c).astype(np.float32)
    be = CpuBackend().init()
    hx, hf, hb, ho = upload(be, x), be.alloc(c * rs[0] * rs[1] * 4), upload(be, b), poisoned(be, n * c * p * q)
    steps = be.record_conv(View.contiguous(hx, F32, xshape), View.contiguous(hf, F32, (c, 1, *rs)),
                           View.contiguous(hb, F32, (c,)), View.contiguous(ho, F32, (n, c, p, q)), stride, pads,
                           (1, 1), c, acts[act])
    for _ in range(2):
        f = rng.standard_normal((c, 1, *rs)).astype(np.float32)
        be.upload(hf, f)
        before = native.calls()
        be.execute(steps)
        got = download(be, ho, (n, c, p, q))
        assert (native.calls() > before) == (native_on and act != "sigmoid")
        ref = conv_ref(x, f, b, stride, pads, (1, 1), c)
        ref = {"relu": np.maximum(ref, 0), "relu6": np.clip(ref, 0, 6), "sigmoid": 1 / (1 + np.exp(-ref)),
               None: ref}[act]
        assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.isnan(got).any()
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.nanmax(np.abs(ref)))

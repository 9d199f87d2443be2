"""The cpu backend's Winograd F(2,3) / F(4,3) convolution: record_conv_winograd against ops.winograd.reference
and a direct float64 conv, its cost model, and Conv picking it inside a model (checked against ONNX Runtime)."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import settings
from ember.backends.base import View
from ember.backends.cpu import CpuBackend
from ember.core import winograd
from ember.core.expr import call, const, eval_numpy, inp

from .helpers import download, poisoned, rel_err, upload
from .test_conv2d import F32, conv_ref

# Measured: F(2,3) ~2e-7, F(4,3) ~3e-6 relative to max|out| at C = 16 (its transforms round more).
TOL = {2: 1e-5, 4: 5e-5}
RELU = call("relu", inp(0))

CASES = [
    # (N, C, H, W), K, pads (top, left, bottom, right), bias, act
    ((1, 3, 8, 8), 4, (1, 1, 1, 1), True, None),
    ((2, 5, 7, 9), 3, (1, 0, 2, 1), True, RELU),  # odd sizes, asymmetric pads, batch > 1
    ((1, 4, 1, 1), 2, (1, 1, 1, 1), True, None),  # 1x1 spatial: one tile of padding around one pixel
    ((3, 16, 14, 14), 32, (1, 1, 1, 1), False, RELU),
    ((1, 6, 11, 13), 5, (0, 0, 0, 0), True, None),  # no padding: output smaller than the input
    ((2, 8, 6, 5), 7, (2, 1, 0, 3), False, None),  # padding wider than the filter's reach on some sides
    ((1, 7, 3, 17), 9, (1, 1, 1, 1), True, call("min", call("max", inp(0), const(0.0)), const(6.0))),  # relu6
    ((1, 2, 5, 5), 3, (1, 1, 1, 1), True, call("sigmoid", inp(0))),
    # More output channels than tiles: the output channels split over the threads, after one input transform.
    ((1, 16, 6, 6), 64, (1, 1, 1, 1), True, RELU),
    ((2, 8, 5, 7), 96, (0, 1, 2, 1), True, None),
    ((1, 7, 5, 6), 40, (1, 1, 1, 1), True, RELU),  # ... and the input transform over uneven channel ranges
]


def _record(be: CpuBackend, x: np.ndarray, u: np.ndarray, b: np.ndarray | None, pads: tuple, m: int, act,
            out_shape: tuple) -> tuple[list, int]:
    hx, hu, ho = upload(be, x), upload(be, u), poisoned(be, int(np.prod(out_shape)))
    bias = View.contiguous(upload(be, b), F32, b.shape) if b is not None else None
    steps = be.record_conv_winograd(View.contiguous(hx, F32, x.shape), View.contiguous(hu, F32, u.shape), bias,
                                    View.contiguous(ho, F32, out_shape), pads, m, act)
    return steps, ho


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(("xshape", "k", "pads", "with_bias", "act"), CASES,
                         ids=[f"{c[0]}-k{c[1]}-p{c[2]}" for c in CASES])
def test_matches_reference_and_direct(m: int, xshape: tuple, k: int, pads: tuple, with_bias: bool, act,
                                      rng: np.random.Generator) -> None:
    be = CpuBackend().init()
    n, c, h, w = xshape
    x = rng.standard_normal(xshape).astype(np.float32)
    f = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32) if with_bias else None
    p, q = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    u = winograd.transform_weights(f, m)
    steps, ho = _record(be, x, u, b, pads, m, act, (n, k, p, q))
    direct = conv_ref(x, f, b, (1, 1), pads, act=act)
    spec = winograd.reference(x, u.astype(np.float64), pads, m, (p, q))
    if b is not None:
        spec = spec + b.astype(np.float64).reshape(1, k, 1, 1)
    if act is not None:
        spec = eval_numpy(act, [spec], np.float64)
    for _ in range(2):  # a replay gives the same (the scratch is reused)
        be.execute(steps)
        got = download(be, ho, (n, k, p, q))
        assert rel_err(got, spec) <= TOL[m]
        assert rel_err(got, direct) <= TOL[m]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(("xshape", "k", "pads"), [
    ((1, 6, 16, 16), 5, (1, 1, 1, 1)),  # sizes a multiple of m: phases group into one copy per group pair
    ((2, 3, 13, 10), 4, (3, 0, 1, 2)),  # odd sizes, one pad wider than the filter's reach
    ((1, 5, 9, 23), 3, (0, 2, 2, 0)),
])
def test_transform_products_in_chunks(m: int, xshape: tuple, k: int, pads: tuple, rng: np.random.Generator,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The B^T / A^T products split into many chunks along their runs give the same conv (chunk edges anywhere
    in the runs: 8 to 12 elements each, against runs of hundreds)."""
    from ember.backends.cpu import winograd as cpu_winograd

    monkeypatch.setattr(cpu_winograd, "CHUNK", 50)
    be = CpuBackend().init()
    n, c, h, w = xshape
    x = rng.standard_normal(xshape).astype(np.float32)
    f = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    p, q = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    u = winograd.transform_weights(f, m)
    steps, ho = _record(be, x, u, b, pads, m, RELU, (n, k, p, q))
    spec = eval_numpy(RELU, [winograd.reference(x, u.astype(np.float64), pads, m, (p, q))
                             + b.astype(np.float64).reshape(1, k, 1, 1)], np.float64)
    for _ in range(2):
        be.execute(steps)
        assert rel_err(download(be, ho, (n, k, p, q)), spec) <= TOL[m]


def test_phase_groups() -> None:
    """Phases with the same span of grid positions group into one run (one strided copy each)."""
    from ember.backends.cpu.winograd import _phase_groups, _phase_span

    for m, pad, size, grid in [(4, 1, 56, 15), (2, 1, 56, 29), (4, 0, 13, 5), (4, 3, 9, 5), (2, 2, 1, 3)]:
        groups = _phase_groups(m, pad, size, grid)
        assert [ph for g0, count, _, _ in groups for ph in range(g0, g0 + count)] == list(range(m))
        for g0, count, lo, hi in groups:
            assert all(_phase_span(ph, m, pad, size, grid) == (lo, hi) for ph in range(g0, g0 + count))
    # ResNet's 56x56, pads 1, F(4,3): phase 0 starts a grid position later (padding), 1-3 share a span.
    assert [(g0, count) for g0, count, _, _ in _phase_groups(4, 1, 56, 15)] == [(0, 1), (1, 3)]


def test_shared_scratch_between_convs(rng: np.random.Generator) -> None:
    """Winograd and im2col convs share one scratch buffer: each must redo its padding zeros on every run, and a
    step recorded before the buffer grew must move to the grown one."""
    be = CpuBackend().init()

    def conv(xshape: tuple, k: int, pads: tuple, m: int | None):
        n, c, h, w = xshape
        x = rng.standard_normal(xshape).astype(np.float32)
        f = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
        p, q = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
        if m is None:
            hx, hf, ho = upload(be, x), upload(be, f), poisoned(be, n * k * p * q)
            steps = be.record_conv(View.contiguous(hx, F32, xshape), View.contiguous(hf, F32, f.shape), None,
                                   View.contiguous(ho, F32, (n, k, p, q)), (1, 1), pads, (1, 1), 1)
        else:
            steps, ho = _record(be, x, winograd.transform_weights(f, m), None, pads, m, None, (n, k, p, q))
        return steps, lambda: download(be, ho, (n, k, p, q)), conv_ref(x, f, None, (1, 1), pads)

    small2 = conv((1, 4, 9, 9), 3, (1, 1, 1, 1), 2)
    dense = conv((1, 8, 12, 12), 5, (0, 0, 0, 0), None)  # fills the scratch with data where padding goes
    small4 = conv((2, 3, 6, 7), 4, (2, 1, 1, 2), 4)
    for _ in range(2):
        be.execute(small2[0] + dense[0] + small4[0])
        for _, got, ref in (small2, dense, small4):
            assert rel_err(got(), ref) <= TOL[4]
    big = conv((2, 16, 24, 24), 16, (1, 1, 1, 1), 2)  # grows the scratch
    be.execute(big[0] + small4[0] + dense[0] + small2[0] + big[0])
    for _, got, ref in (big, small2, dense, small4):
        assert rel_err(got(), ref) <= TOL[4]


def test_cost_model() -> None:
    be = CpuBackend()
    assert be.winograd_tiles == (2, 4)
    # float16 (native float16 models) runs the direct conv, as does any non-float32 dtype.
    assert be.winograd_tile(1, 64, 64, 56, 56, np.float16) is None
    assert be.winograd_tile(1, 64, 64, 56, 56, np.float64) is None
    # ResNet-18's first stage at batch 1 and 8: Winograd wins on this machine's measurements, F(4,3) up to 128
    # channels where it has 40 tiles of its own; F(2,3) at 256 channels (its transformed filter stays smaller).
    for n in (1, 8):
        assert be.winograd_tile(n, 64, 64, 56, 56, np.float32) == 4
        assert be.winograd_tile(n, 128, 128, 28, 28, np.float32) == 4
        assert be.winograd_tile(n, 256, 256, 14, 14, np.float32) == 2
    assert be.winograd_tile(1, 128, 128, 14, 14, np.float32) == 2  # 16 tiles of 4x4: too few for F(4,3)
    # A handful of channels: the transforms cost more than the products save.
    assert be.winograd_tile(1, 3, 8, 32, 32, np.float32) is None
    # 7x7 at batch 1: too few tiles to spread the (larger) transformed filter over; at batch 8 enough.
    assert be.winograd_tile(1, 512, 512, 7, 7, np.float32) is None
    assert be.winograd_tile(8, 512, 512, 7, 7, np.float32) == 2


# ---- inside a model -----------------------------------------------------------------------------------------
def _residual_block(dtype: int = TensorProto.FLOAT, c: int = 8, size: int = 12) -> onnx.ModelProto:
    """x -> Conv3x3(+b) -> Relu -> Conv3x3(+b) -> Add(x) -> Relu: a ResNet basic block, 3x3 convs only."""
    rng = np.random.default_rng(7)
    npdt = onnx.helper.tensor_dtype_to_np_dtype(dtype)
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / (3 * c ** 0.5)).astype(npdt), "w1"),
             numpy_helper.from_array(rng.standard_normal(c).astype(npdt), "b1"),
             numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / (3 * c ** 0.5)).astype(npdt), "w2"),
             numpy_helper.from_array(rng.standard_normal(c).astype(npdt), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Add", ["c2", "x"], ["s"]),
             helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "block", [helper.make_tensor_value_info("x", dtype, ["n", c, size, size])],
                              [helper.make_tensor_value_info("y", dtype, ["n", c, size, size])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _conv_plus_channel_offset(c: int = 32, size: int = 14) -> onnx.ModelProto:
    """x -> Conv3x3 (no bias) -> Add(a (1, C, 1, 1) constant) -> Relu: the Add is a broadcast residual."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array((rng.standard_normal((c, c, 3, 3)) / (3 * c ** 0.5)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal((1, c, 1, 1)).astype(np.float32), "off")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1], kernel_shape=[3, 3]),
             helper.make_node("Add", ["c", "off"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    shape = [1, c, size, size]
    graph = helper.make_graph(nodes, "offset", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("forced", [None, 0])
def test_broadcast_add_after_conv(forced: int | None) -> None:
    model = _conv_plus_channel_offset()
    x = np.random.default_rng(2).standard_normal((1, 32, 14, 14)).astype(np.float32)
    want = _ort(model, x)
    with settings.override(winograd=forced):
        em = ember.load_onnx(model, backend="cpu")
    got = em.run({"x": x})["y"]
    assert float(np.abs(got.astype(np.float64) - want).max()) <= 1e-4 * float(np.abs(want).max()) + 1e-5
    assert em.stats()["conv.winograd"] == (0 if forced == 0 else 1)


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("forced", [None, 2, 4, 0])
@pytest.mark.parametrize("batch", [1, 3])
def test_model_matches_onnxruntime(forced: int | None, batch: int) -> None:
    model = _residual_block(c=32, size=14)
    x = np.random.default_rng(batch).standard_normal((batch, 32, 14, 14)).astype(np.float32)
    want = _ort(model, x)
    em = ember.load_onnx(model, backend="cpu")
    for run in (1, 2):
        with settings.override(winograd=forced):  # the plan is built on the first run
            got = em.run({"x": x})["y"]
        tol = 1e-4 * float(np.abs(want).max()) + 1e-5  # tests/models' tolerance
        assert float(np.abs(got.astype(np.float64) - want).max()) <= tol
        # Both convs are 3x3 stride 1 with constant weights: 2 per run unless EMBER_WINOGRAD=0.
        assert em.stats()["conv.winograd"] == (0 if forced == 0 else 2 * run)


def test_float16_model_takes_the_direct_conv() -> None:
    model = _residual_block(TensorProto.FLOAT16)
    x = np.random.default_rng(3).standard_normal((1, 8, 12, 12)).astype(np.float16)
    with settings.override(winograd=None):
        em = ember.load_onnx(model, backend="cpu")
    got = em.run({"x": x})["y"]
    want = _ort(model, x)
    assert float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max()) <= 2e-2 * float(np.abs(want).max())
    assert em.stats()["conv.winograd"] == 0


@pytest.mark.parametrize("env", ["3", "1", "yes", "-2", "2.0"])
def test_bad_env_value_raises(env: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_WINOGRAD", env)
    model = _residual_block()
    x = np.zeros((1, 8, 12, 12), np.float32)
    with pytest.raises(ValueError, match="EMBER_WINOGRAD"):
        ember.load_onnx(model, backend="cpu").run({"x": x})


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(("h", "w", "k"), [(9, 11, 48), (20, 18, 16)])  # output channels split; tile-row bands
def test_stale_scratch_never_reaches_the_output(m: int, h: int, w: int, k: int, rng: np.random.Generator) -> None:
    """The shared scratch holds whatever the last conv left (here NaN and huge values): tiles the products
    skip and padding must be rewritten, so neither a NaN nor a floating-point warning comes out."""
    be = CpuBackend().init()
    x = rng.standard_normal((1, 32, h, w)).astype(np.float32)
    f = rng.standard_normal((k, 32, 3, 3)).astype(np.float32)
    u = winograd.transform_weights(f, m)
    steps, ho = _record(be, x, u, None, (1, 1, 1, 1), m, RELU, (1, k, h, w))
    ref = conv_ref(x, f, None, (1, 1), (1, 1, 1, 1), act=RELU)
    for fill in (np.nan, 3e38):
        be._scratch.buf.view(np.float32)[:] = fill
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            be.execute(steps)
        assert rel_err(download(be, ho, (1, k, h, w)), ref) <= TOL[m]


# ---- a residual in the epilogue (CpuBackend.conv_residual: Conv + Add [+ Relu] as one kernel) ---------------
RESIDUAL_CASES = [
    # (N, C, H, W), K, pads, residual shape (broadcast to the output), act
    ((1, 32, 20, 18), 16, (1, 1, 1, 1), None, RELU),  # tile-row bands; residual of the output's shape
    ((1, 16, 6, 6), 64, (1, 1, 1, 1), (1, 64, 1, 1), RELU),  # output channels split; a broadcast residual
    ((3, 8, 7, 9), 5, (1, 0, 2, 1), None, None),  # images split, no activation
]


# A residual of the output's own shape may also be the output buffer itself (the runtime never plans that; the
# contract allows it): it must be read before the conv writes over it.
RESIDUAL_PARAMS = [pytest.param(*case, aliased, id=f"{case[0]}-k{case[1]}{'-aliased' if aliased else ''}")
                   for case in RESIDUAL_CASES for aliased in (False, True) if not (aliased and case[3])]


@pytest.mark.parametrize("m", [2, 4])
@pytest.mark.parametrize(("xshape", "k", "pads", "rshape", "act", "aliased"), RESIDUAL_PARAMS)
def test_residual_epilogue(m: int, xshape: tuple, k: int, pads: tuple, rshape, act, aliased: bool,
                           rng: np.random.Generator) -> None:
    """out = act(conv + bias + residual), the residual any view broadcasting to the output's shape."""
    be = CpuBackend().init()
    n, c, h, w = xshape
    p, q = h + pads[0] + pads[2] - 2, w + pads[1] + pads[3] - 2
    x = rng.standard_normal(xshape).astype(np.float32)
    f = rng.standard_normal((k, c, 3, 3)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    res = rng.standard_normal(rshape or (n, k, p, q)).astype(np.float32)
    u = winograd.transform_weights(f, m)
    hx, hu, hb, hr = upload(be, x), upload(be, u), upload(be, b), upload(be, res)
    ho = hr if aliased else poisoned(be, n * k * p * q)
    rv = View.contiguous(hr, F32, res.shape).broadcast_to((n, k, p, q))
    steps = be.record_conv_winograd(View.contiguous(hx, F32, x.shape), View.contiguous(hu, F32, u.shape),
                                    View.contiguous(hb, F32, (k,)), View.contiguous(ho, F32, (n, k, p, q)), pads, m,
                                    act, residual=rv)
    ref = conv_ref(x, f, b, (1, 1), pads) + res.astype(np.float64)
    if act is not None:
        ref = eval_numpy(act, [ref], np.float64)
    be.execute(steps)
    assert rel_err(download(be, ho, (n, k, p, q)), ref) <= TOL[m]
    if not aliased:  # a replay gives the same
        be.execute(steps)
        assert rel_err(download(be, ho, (n, k, p, q)), ref) <= TOL[m]


@pytest.mark.parametrize(("xshape", "wshape", "stride", "pads", "groups"), [
    ((1, 16, 20, 20), (32, 3, 3), (1, 1), (1, 1, 1, 1), 1),  # im2col, row bands
    ((1, 64, 4, 4), (128, 3, 3), (1, 1), (1, 1, 1, 1), 1),  # im2col, output channels split
    ((1, 64, 24, 24), (64, 1, 1), (1, 1), (0, 0, 0, 0), 1),  # 1x1
    ((2, 24, 10, 10), (24, 3, 3), (2, 2), (1, 1, 1, 1), 24),  # depthwise
])
@pytest.mark.parametrize("aliased", [False, True])
def test_residual_epilogue_direct(xshape, wshape, stride, pads, groups, aliased: bool,
                                  rng: np.random.Generator) -> None:
    """The direct conv adds the residual in one pass after its products; a residual that is the output
    buffer itself (the runtime never plans one, but the contract allows it) is copied away first."""
    be = CpuBackend().init()
    n, c, h, w = xshape
    k, r, s = wshape
    p, q = (h + pads[0] + pads[2] - r) // stride[0] + 1, (w + pads[1] + pads[3] - s) // stride[1] + 1
    x = rng.standard_normal(xshape).astype(np.float32)
    f = rng.standard_normal((k, c // groups, r, s)).astype(np.float32)
    res = rng.standard_normal((n, k, p, q)).astype(np.float32)
    hx, hf, hr = upload(be, x), upload(be, f), upload(be, res)
    ho = hr if aliased else poisoned(be, n * k * p * q)
    steps = be.record_conv(View.contiguous(hx, F32, xshape), View.contiguous(hf, F32, f.shape), None,
                           View.contiguous(ho, F32, (n, k, p, q)), stride, pads, (1, 1), groups, RELU,
                           residual=View.contiguous(hr, F32, res.shape))
    ref = np.maximum(conv_ref(x, f, None, stride, pads, groups=groups) + res, 0)
    be.execute(steps)
    assert rel_err(download(be, ho, (n, k, p, q)), ref) <= TOL[2]

"""Winograd F(2,3) / F(4,3) convolution on wgpu (backends/wgpu/winograd.py), against float64 oracles.

record_conv_winograd against ops/winograd.reference (the shared layouts' specification) and a direct float64 conv:
odd sizes, asymmetric and large pads, 1x1 spatial, batch > 1, bias + activations, a residual, split-K products,
f16 storage, outputs at an offset, chunking along T past the binding limit, the error contract; a small ONNX model
with EMBER_WINOGRAD forcing each tile against ONNX Runtime; and the tile choice (winograd_tile). The output is
poisoned with NaN first, so an output a kernel forgets to write shows.
"""

from __future__ import annotations

import gc

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import settings
from ember.backends.base import View
from ember.backends.wgpu import autotune, winograd_cost
from ember.backends.wgpu import winograd as ww
from ember.core import winograd as wg
from ember.core.expr import call, const, eval_numpy, inp

from .test_conv2d import conv_ref

F32, F16 = np.dtype(np.float32), np.dtype(np.float16)
# Relative to max|ref|: F(4, 3)'s transforms (entries up to 8 and 1/24) amplify f32 rounding more than F(2, 3)'s.
TOL = {2: 2e-6, 4: 3e-5}
RELU = call("relu", inp(0))
SILU = call("mul", inp(0), call("sigmoid", inp(0)))
CLIP = call("min", call("max", inp(0), const(0.0)), const(6.0))


@pytest.fixture
def be(wgpu_be: ember.ComputeBackend) -> ember.ComputeBackend:
    return wgpu_be


def put(be: ember.ComputeBackend, a: np.ndarray, dtype: np.dtype = F32, pad: int = 0) -> View:
    """a in a new allocation of `dtype` storage, `pad` poison elements before and after it."""
    a = np.ascontiguousarray(a, dtype)
    full = np.concatenate([np.full(pad, np.nan, dtype), a.reshape(-1), np.full(pad, np.nan, dtype)])
    h = be.alloc(max(full.size * dtype.itemsize, 4))
    be.upload(h, full)
    return View.contiguous(h, dtype, a.shape, pad)


def whole(be: ember.ComputeBackend, v: View, pad: int) -> np.ndarray:
    return be.download(View.contiguous(v.handle, v.dtype, (v.size + 2 * pad,)))


def run(be: ember.ComputeBackend, x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pads: tuple, m: int,
        act=None, dtype: np.dtype = F32, residual: np.ndarray | None = None, pad: int = 0,
        u_dtype: np.dtype | None = None) -> np.ndarray:
    n, c, h, wd = x.shape
    k = w.shape[0]
    p, q = h + pads[0] + pads[2] - 2, wd + pads[1] + pads[3] - 2
    views = [put(be, x, dtype), put(be, wg.transform_weights(w, m), u_dtype or dtype)]
    views.append(put(be, b, dtype) if b is not None else None)
    views.append(put(be, residual, dtype) if residual is not None else None)
    out = put(be, np.full((n, k, p, q), np.nan), dtype, pad)
    try:
        xv, uv, bv, rv = views
        be.execute(be.record_conv_winograd(xv, uv, bv, out, pads, m, act, residual=rv))
        got = whole(be, out, pad)
    finally:
        for v in [*views, out]:
            if v is not None:
                be.free(v.handle)
    if pad:
        assert np.isnan(got[:pad]).all() and np.isnan(got[-pad:]).all(), "wrote outside the output view"
    return got[pad:got.size - pad].reshape(n, k, p, q)


def oracle(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, pads: tuple, act=None,
           residual: np.ndarray | None = None) -> np.ndarray:
    ref = conv_ref(x, w, b, pads=pads)
    if residual is not None:
        ref = ref + residual.astype(np.float64)
    return eval_numpy(act, [ref], np.float64) if act is not None else ref


def rel(got: np.ndarray, ref: np.ndarray) -> float:
    assert got.shape == ref.shape
    assert np.isfinite(got).all(), "NaN/inf in the output (an output not written?)"
    return float(np.abs(got.astype(np.float64) - ref).max() / max(np.abs(ref).max(), 1e-30))


CASES = [
    # (N, C, H, W), K, pads (top, left, bottom, right)
    ((1, 3, 7, 7), 4, (1, 1, 1, 1)),
    ((2, 5, 9, 11), 6, (1, 2, 0, 1)),       # asymmetric pads, odd sizes, batch 2
    ((1, 4, 1, 1), 3, (1, 1, 1, 1)),        # 1x1 spatial: one tile, mostly padding
    ((3, 16, 17, 13), 33, (0, 0, 0, 0)),    # no padding, partial tiles at both edges
    ((2, 8, 6, 5), 7, (3, 0, 4, 2)),        # pads wider than a tile step: several tile rows start outside
    ((1, 2, 3, 9), 5, (0, 1, 0, 1)),        # a 1-row output
    ((2, 64, 12, 12), 64, (1, 1, 1, 1)),    # vec4 loads of U, several GEMM tiles
]


@pytest.mark.parametrize("m", wg.TILES)
@pytest.mark.parametrize("xshape,k,pads", CASES)
def test_matches_reference_and_direct(be: ember.ComputeBackend, rng: np.random.Generator, m: int, xshape, k: int,
                                      pads) -> None:
    x = rng.standard_normal(xshape).astype(np.float32)
    w = rng.standard_normal((k, xshape[1], 3, 3)).astype(np.float32)
    b = rng.standard_normal(k).astype(np.float32)
    got = run(be, x, w, b, pads, m, RELU, pad=5)
    ref = oracle(x, w, b, pads, RELU)
    p, q = ref.shape[2:]
    spec = np.maximum(wg.reference(x, wg.transform_weights(w, m), pads, m, (p, q)) + b.reshape(1, k, 1, 1), 0.0)
    # Errors relative to the pre-activation magnitude: after Relu a few outputs (1x1 spatial, 3 channels) can all
    # be near 0, and max|ref| then says nothing about the conv's scale (a fresh-input flake otherwise).
    scale = float(np.abs(oracle(x, w, b, pads)).max())
    assert rel(got, spec) * max(np.abs(spec).max(), 1e-30) <= TOL[m] * scale
    assert rel(got, ref) * max(np.abs(ref).max(), 1e-30) <= TOL[m] * scale


@pytest.mark.parametrize("m", wg.TILES)
@pytest.mark.parametrize("act", [None, SILU, CLIP])
def test_epilogues(be: ember.ComputeBackend, rng: np.random.Generator, m: int, act) -> None:
    x = rng.standard_normal((2, 6, 10, 9)).astype(np.float32)
    w = rng.standard_normal((5, 6, 3, 3)).astype(np.float32)
    assert rel(run(be, x, w, None, (1, 1, 1, 1), m, act), oracle(x, w, None, (1, 1, 1, 1), act)) <= TOL[m]


@pytest.mark.parametrize("m", wg.TILES)
def test_residual(be: ember.ComputeBackend, rng: np.random.Generator, m: int) -> None:
    """A residual connection added before the activation (a ResNet block's Add + Relu), f32 and f16."""
    x = rng.standard_normal((2, 8, 7, 10)).astype(np.float32)
    w = rng.standard_normal((6, 8, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    res = rng.standard_normal((2, 6, 7, 10)).astype(np.float32)
    got = run(be, x, w, b, (1, 1, 1, 1), m, RELU, residual=res)
    assert rel(got, oracle(x, w, b, (1, 1, 1, 1), RELU, res)) <= TOL[m]


def test_split_k_products(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """Few tiles, many channels: plan_gemm splits the products' K (= C) into partial sums."""
    from ember.backends.wgpu.shader import tiles

    x = rng.standard_normal((1, 256, 5, 5)).astype(np.float32)
    w = (rng.standard_normal((16, 256, 3, 3)) / 16).astype(np.float32)
    b = rng.standard_normal(16).astype(np.float32)
    for m in wg.TILES:
        th, tw = wg.tiles(5, 5, m)
        assert tiles.plan_gemm(be, 16, th * tw, 256, (m + 2) ** 2)[1] > 1  # the case this test is for
        assert rel(run(be, x, w, b, (1, 1, 1, 1), m, SILU), oracle(x, w, b, (1, 1, 1, 1), SILU)) <= TOL[m]


@pytest.mark.parametrize("u_dtype", [F16, F32])
@pytest.mark.parametrize("m", wg.TILES)
def test_f16_storage(be: ember.ComputeBackend, rng: np.random.Generator, m: int, u_dtype: np.dtype) -> None:
    """x, bias, residual and out stored as f16, U as f16 or f32 (what the planner gives f16 models; computed in
    f32, V and M scratch f32): off by the f16 rounding of the output, and of U where it is f16."""
    if "shader-f16" not in be.features:
        pytest.fail("the adapter lacks shader-f16 (lavapipe has it)")
    x = rng.standard_normal((2, 12, 9, 8)).astype(np.float16)
    w = (rng.standard_normal((10, 12, 3, 3)) * 0.3).astype(np.float16)
    b = rng.standard_normal(10).astype(np.float16)
    res = rng.standard_normal((2, 10, 9, 8)).astype(np.float16)
    got = run(be, x, w, b, (1, 1, 1, 1), m, RELU, dtype=F16, residual=res, pad=3, u_dtype=u_dtype)
    assert got.dtype == F16
    ref = oracle(x.astype(np.float32), w.astype(np.float32), b, (1, 1, 1, 1), RELU, res)
    err = np.abs(got.astype(np.float64) - ref)
    # f16 has 11 significant bits: the output's rounding (2^-11 relative) plus U's where U is f16. F(2, 3) stays
    # near the direct f16 conv (lavapipe, C = 12..256: 3-5e-4 of max|ref| vs 2-3e-4); F(4, 3)'s output transform
    # (entries up to 8) amplifies an f16 U's rounding ten times (3-5e-3): the planner keeps U in f32.
    scale = {2: 3e-3, 4: 1.2e-2 if u_dtype == F16 else 3e-3}[m]
    assert (err <= 1e-3 * np.abs(ref) + scale * np.abs(ref).max()).all(), float(err.max() / np.abs(ref).max())


@pytest.mark.parametrize("m", wg.TILES)
def test_chunks_along_t(be: ember.ComputeBackend, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                        m: int) -> None:
    """V and M above the max storage-buffer binding size: the tiles go through the scratch in several chunks."""
    x = rng.standard_normal((2, 6, 9, 10)).astype(np.float32)
    w = rng.standard_normal((6, 6, 3, 3)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    monkeypatch.setattr(be, "max_binding", 8192)
    ws = ww.winograd_shape(View.contiguous(1, F32, x.shape), View.contiguous(2, F32, ((m + 2) ** 2, 6, 6)), None,
                           View.contiguous(3, F32, (2, 6, 9, 10)), (1, 1, 1, 1), m)
    tc, chunks = ww.chunking(be, ws)
    assert chunks >= 3 and (tc - 1) * chunks < ws.t <= tc * chunks
    assert 4 * (m + 2) ** 2 * 6 * -(-tc // 4) * 4 <= 8192
    assert rel(run(be, x, w, b, (1, 1, 1, 1), m, RELU), oracle(x, w, b, (1, 1, 1, 1), RELU)) <= TOL[m]
    monkeypatch.setattr(be, "max_binding", 1024)
    with pytest.raises(NotImplementedError, match="max-storage-buffer-binding-size"):
        ww.chunking(be, ws)


def test_autotuned_products(be: ember.ComputeBackend, rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch,
                            tmp_path) -> None:
    """The products go through the GEMM autotuner like other GEMMs (output: a scratch buffer, not an allocation)."""
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    # 6.5 MFLOP of products: above what lavapipe tunes, below a hardware GPU's floor (lowered to the same here).
    monkeypatch.setattr(autotune, "MIN_TUNE_FLOP_GPU", autotune.MIN_TUNE_FLOP)
    be._autotuner = None
    x = rng.standard_normal((2, 32, 20, 20)).astype(np.float32)
    w = rng.standard_normal((32, 32, 3, 3)).astype(np.float32)
    try:
        with be.autotune_scope(True) as report:
            got = run(be, x, w, None, (1, 1, 1, 1), 2)
        assert report["tuned"] == 1
        assert rel(got, oracle(x, w, None, (1, 1, 1, 1))) <= TOL[2]
        with be.autotune_scope(True) as report:
            got = run(be, x, w, None, (1, 1, 1, 1), 2)
        assert report["hits"] == 1 and report["tuned"] == 0
        assert rel(got, oracle(x, w, None, (1, 1, 1, 1))) <= TOL[2]
    finally:
        be._autotuner = None


def test_errors(be: ember.ComputeBackend) -> None:
    hx, hu, ho = be.alloc(4 * 2 * 4 * 4), be.alloc(4 * 16 * 3 * 2), be.alloc(4 * 3 * 4 * 4)
    try:
        x = View.contiguous(hx, F32, (1, 2, 4, 4))
        uv = View.contiguous(hu, F32, (16, 3, 2))
        o = View.contiguous(ho, F32, (1, 3, 4, 4))
        pads = (1, 1, 1, 1)
        be.record_conv_winograd(x, uv, None, o, pads, 2)  # the valid call the others spoil
        with pytest.raises(ValueError, match="m=3"):
            be.record_conv_winograd(x, uv, None, o, pads, 3)
        with pytest.raises(ValueError, match="u must be"):
            be.record_conv_winograd(x, uv, None, o, pads, 4)
        with pytest.raises(ValueError, match="out shape"):
            be.record_conv_winograd(x, uv, None, View.contiguous(ho, F32, (1, 3, 3, 3)), pads, 2)
        with pytest.raises(ValueError, match="contiguous"):
            be.record_conv_winograd(x.permute((0, 1, 3, 2)), uv, None, o, pads, 2)
        with pytest.raises(ValueError, match="bias must have shape"):
            be.record_conv_winograd(x, uv, View.contiguous(hu, F32, (2,)), o, pads, 2)
        with pytest.raises(ValueError, match="larger than the padded input"):
            be.record_conv_winograd(View.contiguous(hx, F32, (1, 2, 1, 4)), uv, None,
                                    View.contiguous(ho, F32, (1, 3, 0, 2)), (0, 0, 0, 0), 2)
        with pytest.raises(ValueError, match="overlaps the output"):
            be.record_conv_winograd(x, View.contiguous(hu, F32, (16, 2, 2)), None,
                                    View.contiguous(hx, F32, (1, 2, 4, 4)), pads, 2)
        with pytest.raises(ValueError, match="outside its allocation"):
            be.record_conv_winograd(View.contiguous(hx, F32, (2, 2, 4, 4)), uv, None,
                                    View.contiguous(ho, F32, (2, 3, 4, 4)), pads, 2)
        with pytest.raises(ValueError, match="residual must have"):
            be.record_conv_winograd(x, uv, None, o, pads, 2, residual=View.contiguous(hu, F32, (1, 3, 2, 2)))
        with pytest.raises(NotImplementedError, match="float64"):
            be.record_conv_winograd(View.contiguous(hx, np.float64, (1, 2, 2, 2)), uv, None,
                                    View.contiguous(ho, F32, (1, 3, 2, 2)), pads, 2)
    finally:
        for h in (hx, hu, ho):
            be.free(h)


# ---- through an ONNX model ----------------------------------------------------------------------------------------
def conv_model(rng: np.random.Generator) -> tuple:
    """Conv(pads 1) + bias -> Relu -> Conv(asymmetric pads, no bias): two Winograd-eligible convs."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8, 10, 9])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32) * 0.3, n)
             for n, s in (("w1", (12, 8, 3, 3)), ("b1", (12,)), ("w2", (6, 12, 3, 3)))]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2"], ["y"], pads=[0, 1, 2, 1])]
    graph = helper.make_graph(nodes, "wino", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    return model, {"x": rng.standard_normal((2, 8, 10, 9)).astype(np.float32)}


@pytest.mark.parametrize("env", ["2", "4", "0"])
def test_onnx_model_matches_onnxruntime(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                        monkeypatch: pytest.MonkeyPatch, env: str) -> None:
    monkeypatch.setenv("EMBER_WINOGRAD", env)
    model, feeds = conv_model(rng)
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    em = ember.load_onnx(model, backend="wgpu")
    got = em.run(feeds)["y"]
    err = float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())
    assert err <= (TOL[int(env)] if env != "0" else 1e-5) * 4, err  # two convs in a row
    info = em.plan_info(feeds)
    assert info.get("conv.winograd", 0) == (2 if env != "0" else 0)
    assert (em.stats()["conv.winograd"] > 0) == (env != "0")
    # V and M (split-K partial sums too, where a product splits) are reported; the direct convs here use none.
    assert (info["scratch_bytes"] > 0) == (env != "0")


# ---- the tile choice ---------------------------------------------------------------------------------------------
def test_winograd_tile_rule(wgpu_be: ember.ComputeBackend, monkeypatch: pytest.MonkeyPatch) -> None:
    be = wgpu_be
    assert be.winograd_tiles == (2, 4)
    # Small convs and few channels: the direct kernel, on any adapter.
    assert be.winograd_tile(1, 8, 8, 10, 10, F32) is None
    assert be.winograd_tile(8, 16, 256, 56, 56, F32) is None
    for cp in (winograd_cost.HARDWARE, winograd_cost.SOFTWARE):
        monkeypatch.setattr(winograd_cost, "profile", lambda _be, cp=cp: cp)
        # ResNet-18's 3x3 stride-1 convs at batch 8: Winograd; F(4, 3) where its tiles fill the output.
        assert be.winograd_tile(8, 64, 64, 56, 56, F32) == 4
        assert be.winograd_tile(8, 128, 128, 28, 28, F32) == 4
        assert be.winograd_tile(8, 128, 128, 28, 28, F16) == 4  # with U in f32 (ops/nn.py), as for f32
        # 7x7 outputs at batch 1: 4 tiles of F(4, 3) in a GEMM tile of 64 columns; not F(4, 3).
        assert be.winograd_tile(1, 512, 512, 7, 7, F32) != 4
        # Below the threshold: direct.
        assert be.winograd_tile(1, 32, 32, 8, 8, F32) is None
    monkeypatch.setattr(winograd_cost, "profile", lambda _be: winograd_cost.HARDWARE)
    assert winograd_cost.HARDWARE.min_macs > 1 * 56 * 56 * 64 * 64 * 9  # ResNet-18 batch 1 stays direct by default
    assert be.winograd_tile(1, 64, 64, 56, 56, F32) is None


def _split_k_convs(be: ember.ComputeBackend, rng: np.random.Generator, count: int) -> tuple[list, ...]:
    """`count` F(2,3) conv problems with split-K products (256 channels at 5x5): the inputs and filters, and
    their device views (x, transformed filter, NaN-poisoned out)."""
    xs = [rng.standard_normal((1, 256, 5, 5)).astype(np.float32) for _ in range(count)]
    ws = [rng.standard_normal((16, 256, 3, 3)).astype(np.float32) for _ in range(count)]
    hx = [put(be, x) for x in xs]
    hu = [put(be, wg.transform_weights(w, 2)) for w in ws]
    outs = [put(be, np.full((1, 16, 5, 5), np.nan)) for _ in range(count)]
    return xs, ws, hx, hu, outs


def _check_split_k_convs(be: ember.ComputeBackend, xs: list, ws: list, outs: list) -> None:
    for x, w, o in zip(xs, ws, outs, strict=True):
        ref = oracle(x, w, None, (1, 1, 1, 1))
        assert rel(whole(be, o, 0).reshape(ref.shape), ref) <= 1e-5


def test_scratch_shared_between_convs(be: ember.ComputeBackend, rng: np.random.Generator,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Convs recorded one after another share V, M and the split-K partial sums (backend.scratch): the second,
    no bigger, binds the very buffers the first does; both still compute their own results in one stream."""
    # Sharing on (the default; EMBER_SHARED_SCRATCH=0 turns it off), past the private budget from the start.
    xs, ws, hx, hu, outs = _split_k_convs(be, rng, 2)
    try:
        with settings.override(shared_scratch=True, scratch_private_mb=0):
            first = be.record_conv_winograd(hx[0], hu[0], None, outs[0], (1, 1, 1, 1), 2)
            second = be.record_conv_winograd(hx[1], hu[1], None, outs[1], (1, 1, 1, 1), 2)
        gc.collect()  # what shares a buffer is held by the steps alone

        def scratch(steps: list) -> list:
            return [id(b) for st in steps for b in st.keep]

        assert len(scratch(first)) >= 4 and scratch(first) == scratch(second)
        be.execute(first + second)
        _check_split_k_convs(be, xs, ws, outs)
    finally:
        for v in [*hx, *hu, *outs]:
            be.free(v.handle)


def test_scratch_private_within_budget(be: ember.ComputeBackend, rng: np.random.Generator,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Within settings.SCRATCH_PRIVATE_MB each conv gets buffers of its own (sharing costs GPU time); once the private
    scratch alive would pass it, later convs share one buffer per role. Results are right either way."""
    gc.collect()
    xs, ws, hx, hu, outs = _split_k_convs(be, rng, 4)

    def scratch(steps: list) -> list:
        return [b for st in steps for b in st.keep]

    try:
        probe = be.record_conv_winograd(hx[0], hu[0], None, outs[0], (1, 1, 1, 1), 2)
        need = sum({id(b): b.size for b in scratch(probe)}.values())
        del probe
        gc.collect()
        # Room for two convs' private scratch (plus what other tests' steps may still hold), not more.
        held = be._private_bytes[0]
        with settings.override(shared_scratch=True, scratch_private_mb=(held + 2 * need) / (1 << 20)):
            steps = [be.record_conv_winograd(x, u_, None, o, (1, 1, 1, 1), 2)
                     for x, u_, o in zip(hx, hu, outs, strict=True)]
        ids = [{id(b) for b in scratch(s)} for s in steps]
        assert not ids[0] & ids[1] and not ids[2] & (ids[0] | ids[1]), "within the budget, buffers of their own"
        assert ids[3] == ids[2], "past the budget, later convs share one buffer per role"
        be.execute([st for s in steps for st in s])
        _check_split_k_convs(be, xs, ws, outs)
    finally:
        for v in [*hx, *hu, *outs]:
            be.free(v.handle)


def test_scratch_freed_with_the_steps(be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """V and M (and split-K partial sums) live while recorded steps use them: dropping the steps frees them."""
    from .test_leaks import gpu_buffers, live

    x = rng.standard_normal((1, 256, 5, 5)).astype(np.float32)  # split-K products too
    w = rng.standard_normal((16, 256, 3, 3)).astype(np.float32)
    gc.collect()
    before, buffers = live(be), gpu_buffers()
    for m in wg.TILES:
        run(be, x, w, None, (1, 1, 1, 1), m)
    gc.collect()
    assert live(be) == before and gpu_buffers() == buffers

"""The subgroup-matrix implicit-GEMM conv (conv_sgmat.py): its emulated variant against a float64 numpy conv on every
adapter (the gather, K tail, masking, groups and epilogue of the native kernel), a float16 ONNX model against ONNX
Runtime, which convs take it, and the native WGSL text for a fake config.

Most cases run an 8 x 8 x 8 emulated config and a forced block choice: the same generator, and lavapipe compiles
the small kernels in well under a second each (the 16 x 16 x 16 4 x 4 kernel takes it 20 s).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import settings
from ember.backends.base import View
from ember.backends.wgpu import conv_sgmat
from ember.backends.wgpu import matmul_sgmat as sgmat
from ember.backends.wgpu.conv_sgmat import StagedParams
from ember.backends.wgpu.conv_shape import check_conv_shape
from ember.backends.wgpu.runtime import MatrixConfig
from ember.core.expr import call, inp

from .test_conv2d import conv_ref

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
EPS16 = 2.0**-11  # f16's unit roundoff: the one rounding of an f16 output
ACC_TOL = 1e-5  # f32 accumulation of exact f16 products, relative to sum |terms|: far below any indexing error
CFG8 = MatrixConfig("f16", "f32", 8, 8, 8)
CFG16 = MatrixConfig("f16", "f32", 16, 16, 16)
SMALL = StagedParams(2, 2, 1, 1, 32, False, 8)
LABELS = {conv_sgmat.LABEL_NATIVE, conv_sgmat.LABEL_EMULATED}


def _buffer(be: ember.ComputeBackend, values: np.ndarray) -> int:
    h = be.alloc(max(values.nbytes, 16))
    be.upload(h, values)
    return h


def run_conv(be: ember.ComputeBackend, rng: np.random.Generator, xshape: tuple, k: int, rs: tuple,
             stride: tuple = (1, 1), pads: tuple = (0, 0, 0, 0), dilation: tuple = (1, 1), groups: int = 1, *,
             out_dtype: np.dtype = F32, bias: bool = False, residual: bool = False, relu: bool = False,
             offset: int = 0) -> tuple[list[str], float]:
    """record_conv on f16 views (x and w at element `offset` of their buffers); returns the dispatch labels and the
    worst |got - ref| / bound (<= 1 passes), asserting nothing was written past the output."""
    n, c = xshape[:2]
    x = rng.standard_normal(xshape).astype(np.float16)
    w = rng.standard_normal((k, c // groups, *rs)).astype(np.float16)
    ref = conv_ref(x, w, None, stride, pads, dilation, groups)
    scale = conv_ref(np.abs(x), np.abs(w), None, stride, pads, dilation, groups)
    tail = 4096
    # NaN before (the offset) and after x and w: a K-tail row or a pixel past the output that is not zeroed reads
    # one, and 0 * NaN would still poison the sum.
    before, after = np.full(offset, np.nan, np.float16), np.full(256, np.nan, np.float16)
    hs = [_buffer(be, np.concatenate([before, x.ravel(), after])),
          _buffer(be, np.concatenate([before, w.ravel(), after])),
          _buffer(be, np.full(ref.size + tail, np.nan, out_dtype))]
    views: dict[str, Any] = {}
    if bias:
        vec = rng.standard_normal(k).astype(np.float16)
        hs.append(_buffer(be, vec))
        views["bias"] = View.contiguous(hs[-1], F16, (k,))
        ref, scale = ref + vec.astype(np.float64)[None, :, None, None], scale + np.abs(vec)[None, :, None, None]
    if residual:
        res = rng.standard_normal(ref.shape).astype(np.float16)
        hs.append(_buffer(be, res))
        views["residual"] = View.contiguous(hs[-1], F16, res.shape)
        ref, scale = ref + res, scale + np.abs(res)
    try:
        steps = be.record_conv(View(hs[0], F16, xshape, View.contiguous(0, F16, xshape).strides, offset),
                               View(hs[1], F16, w.shape, View.contiguous(0, F16, w.shape).strides, offset),
                               views.get("bias"), View.contiguous(hs[2], out_dtype, ref.shape), stride, pads,
                               dilation, groups, call("relu", inp(0)) if relu else None,
                               residual=views.get("residual"), const_weight=True)
        be.execute(steps)
        flat = be.download(View.contiguous(hs[2], out_dtype, (ref.size + tail,)))
    finally:
        for h in hs:
            be.free(h)
    assert np.isnan(flat[ref.size:].astype(np.float32)).all(), "wrote past the output"
    if relu:
        ref = np.maximum(ref, 0.0)
    got = flat[:ref.size].reshape(ref.shape).astype(np.float64)
    assert np.isfinite(got).all()
    bound = ACC_TOL * scale + (EPS16 * np.abs(ref) if out_dtype == F16 else 0.0) + 1e-30
    return [s.label for s in steps], float((np.abs(got - ref) / bound).max())


# ---- the emulated kernel against the oracle -------------------------------------------------------------------------
CASES = {  # name: (xshape, k, (r, s), stride, pads, dilation, groups, (config, lanes, choice or None), options)
    "3x3_s1_p1": ((1, 16, 10, 10), 24, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, (CFG8, 32, SMALL), {}),
    "stem_7x7_s2_p3_k147": ((1, 3, 20, 20), 16, (7, 7), (2, 2), (3, 3, 3, 3), (1, 1), 1,
                            (CFG8, 32, StagedParams(2, 2, 2, 2, 32, False, 8)),
                            dict(out_dtype=F16, bias=True, relu=True)),
    "down_1x1_s2_ragged_m": ((2, 32, 9, 9), 20, (1, 1), (2, 2), (0, 0, 0, 0), (1, 1), 1, (CFG8, 32, SMALL),
                             dict(out_dtype=F16)),
    "dilation_2": ((1, 8, 12, 12), 16, (3, 3), (1, 1), (2, 2, 2, 2), (2, 2), 1, (CFG8, 32, SMALL), {}),
    "batch2_bias_relu_4x4_tiles": ((2, 16, 8, 8), 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1,
                                   (CFG8, 32, StagedParams(2, 2, 4, 4, 32, False, 8)), dict(bias=True, relu=True)),
    "residual_f16_subgroup_16": ((2, 16, 7, 7), 16, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, (CFG8, 16, SMALL),
                                 dict(out_dtype=F16, residual=True, relu=True, bias=True)),
    "ragged_asym_scalar_a": ((1, 5, 9, 13), 13, (3, 2), (2, 1), (0, 1, 2, 0), (1, 1), 1, (CFG8, 32, SMALL),
                             dict(bias=True)),
    "no_padding_tail_reach": ((1, 8, 11, 10), 8, (3, 3), (2, 3), (0, 0, 0, 0), (1, 1), 1, (CFG8, 32, SMALL), {}),
    "groups_2": ((1, 16, 8, 8), 32, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 2, (CFG8, 32, SMALL),
                 dict(bias=True, residual=True)),
    "1x1_s1_before_matmul_offsets": ((1, 16, 6, 6), 16, (1, 1), (1, 1), (0, 0, 0, 0), (1, 1), 1, (CFG8, 32, SMALL),
                                     dict(offset=3)),
    "8_subgroups_guarded_rows": ((1, 8, 6, 6), 8, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1,
                                 (MatrixConfig("f16", "f32", 4, 4, 8), 32, StagedParams(2, 4, 1, 1, 32, False, 8)),
                                 dict(out_dtype=F16)),
    "plans_choice_16x16x16": ((1, 32, 8, 8), 40, (3, 3), (1, 1), (1, 1, 1, 1), (1, 1), 1, (CFG16, 32, None),
                              dict(bias=True)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_emulated_matches_oracle(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                 monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    xshape, k, rs, stride, pads, dilation, groups, (cfg, lanes, choice), opts = CASES[name]
    monkeypatch.setattr(sgmat, "EMULATED_CONFIG", cfg)
    monkeypatch.setattr(sgmat, "EMULATED_SUBGROUP", lanes)
    if choice is not None:
        monkeypatch.setattr(conv_sgmat, "CHOICES", (choice,))
    with settings.override(matrix="emulate"):
        labels, worst = run_conv(wgpu_be, rng, xshape, k, rs, stride, pads, dilation, groups, **opts)
    assert labels == [conv_sgmat.LABEL_EMULATED]
    assert worst <= 1.0, f"{name}: error {worst:.3g} x the bound"


# ---- which convs take it --------------------------------------------------------------------------------------------
def test_off_and_auto_take_existing_kernels(wgpu_be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    """off never takes it; auto not below AUTO_MIN_VOLUME (nor at all without matrix units): the kernels of before."""
    shapes = [((1, 16, 10, 10), 24, (3, 3), (1, 1), (1, 1, 1, 1)), ((1, 3, 20, 20), 16, (7, 7), (2, 2), (3, 3, 3, 3)),
              ((1, 16, 9, 9), 16, (1, 1), (2, 2), (0, 0, 0, 0))]
    for xshape, k, rs, stride, pads in shapes:
        seen = {}
        for mode in ("off", "auto"):
            with settings.override(matrix=mode):
                labels, worst = run_conv(wgpu_be, rng, xshape, k, rs, stride, pads, out_dtype=F16)
            assert not LABELS & set(labels) and worst <= 1.0, (mode, labels, worst)
            seen[mode] = labels
        assert seen["off"] == seen["auto"]


def test_depthwise_and_f32_keep_their_kernels(wgpu_be: ember.ComputeBackend, rng: np.random.Generator) -> None:
    with settings.override(matrix="emulate"):
        labels, _ = run_conv(wgpu_be, rng, (1, 8, 6, 6), 8, (3, 3), pads=(1, 1, 1, 1), groups=8)
        assert labels == ["conv_depthwise"]
    x, w, o = View(1, F32, (1, 8, 6, 6), (288, 36, 6, 1)), View(2, F32, (8, 8, 3, 3), (72, 9, 3, 1)), \
        View(3, F32, (1, 8, 4, 4), (128, 16, 4, 1))
    cs = check_conv_shape(x, w, o, (1, 1), (0, 0, 0, 0), (1, 1), 1)
    with settings.override(matrix="emulate"):
        assert conv_sgmat.plan_conv_sgmat(wgpu_be, cs, x, w, o, {1: "f32", 2: "f32", 3: "f32"}) is None


class FakeDawn:
    """What plan_conv_sgmat reads of a backend with matrix units (the subgroup size already measured)."""

    def __init__(self, configs: tuple[MatrixConfig, ...] = (CFG16,), subgroup: int | None = 32) -> None:
        self.matrix_configs = configs
        self.features = {"shader-f16", "subgroup"}
        self.limits = {"max-compute-workgroup-storage-size": 49152, "max-compute-invocations-per-workgroup": 1024,
                       "max-compute-workgroup-size-x": 1024}
        self.subgroup_max_size = 32
        self.__dict__["_sgmat_subgroup_size"] = subgroup


def _plan(be: Any, n: int, c: int, h: int, k: int, r: int, stride: int = 1, pad: int = 0, groups: int = 1,
          dtype: np.dtype = F16, w_offset: int = 0) -> conv_sgmat.ConvSgmatChoice | None:
    p = (h + 2 * pad - r) // stride + 1
    x = View.contiguous(1, dtype, (n, c, h, h))
    w = View(2, dtype, (k, c // groups, r, r), View.contiguous(0, dtype, (k, c // groups, r, r)).strides, w_offset)
    out = View.contiguous(3, F16, (n, k, p, p))
    cs = check_conv_shape(x, w, out, (stride, stride), (pad,) * 4, (1, 1), groups)
    types = {1: "f16" if dtype == F16 else "f32", 2: "f16" if dtype == F16 else "f32", 3: "f16"}
    return conv_sgmat.plan_conv_sgmat(be, cs, x, w, out, types)


def test_native_planning(monkeypatch: pytest.MonkeyPatch) -> None:
    be = FakeDawn()
    with settings.override(matrix="auto"):
        assert _plan(be, 8, 256, 14, 256, 3, pad=1) is None  # auto takes no conv while AUTO_MIN_VOLUME is None
        monkeypatch.setattr(conv_sgmat, "AUTO_MIN_VOLUME", 2**28)
        big = _plan(be, 8, 256, 14, 256, 3, pad=1)  # 256 x 1568 x 2304: above the volume
        assert big is not None and big.c.native and big.label == conv_sgmat.LABEL_NATIVE and big.wide_a
        assert big.c.cfg == CFG16 and big.c.subgroup == 32 and big.p in conv_sgmat.CHOICES
        assert _plan(be, 1, 64, 14, 64, 3, pad=1) is None  # 64 x 196 x 576: below
    with settings.override(matrix="on"):
        stem = _plan(be, 1, 3, 32, 64, 7, 2, 3)
        assert stem is not None and not stem.wide_a  # K = 147: scalar A loads
        assert _plan(be, 1, 16, 8, 16, 3, w_offset=4) is not None and not _plan(be, 1, 16, 8, 16, 3, w_offset=4).wide_a
        assert _plan(be, 1, 16, 8, 16, 3, dtype=F32) is None
        assert _plan(be, 1, 32, 8, 32, 3, groups=32) is None  # depthwise
        assert _plan(be, 1, 32, 8, 16, 3, groups=2) is None  # 8 channels a group: less than a tile row
        assert _plan(be, 1, 64, 8, 64, 3, groups=2) is not None
        assert _plan(FakeDawn((MatrixConfig("f16", "f16", 16, 16, 16),)), 1, 16, 8, 16, 3) is None  # f16 accumulation
        assert _plan(FakeDawn(subgroup=None), 1, 16, 8, 16, 3) is None  # subgroup size unmeasured
    with settings.override(matrix="off"):
        assert _plan(be, 8, 256, 14, 256, 3, pad=1) is None


def test_block_choice() -> None:
    ok = list(conv_sgmat.CHOICES)
    assert conv_sgmat.choose(512, 8 * 28 * 28, 1, CFG16, ok) == ok[0]  # 4 x 49 blocks of 128 x 128: enough
    small = conv_sgmat.choose(512, 49, 1, CFG16, ok)  # N = 49 wastes >25% in any block: the most workgroups
    assert small is not None and small.block(CFG16) == (32, 32)


# ---- a float16 ONNX model ------------------------------------------------------------------------------------------
def _resnet_block(elem: int, w1: np.ndarray, b1: np.ndarray, w2: np.ndarray, b2: np.ndarray) -> Any:
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], kernel_shape=[7, 7], strides=[2, 2], pads=[3] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("Add", ["c2", "r1"], ["s"]), helper.make_node("Relu", ["s"], ["y"])]
    graph = helper.make_graph(nodes, "conv_sgmat", [helper.make_tensor_value_info("x", elem, [2, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", elem, None)],
                              [numpy_helper.from_array(v, name) for v, name in
                               ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_f16_onnx_model_matches_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stem conv + a residual 3x3 conv in float16 under EMBER_MATRIX=emulate, against ONNX Runtime in float32 on
    the same (f16-exact) values: the difference is ember's roundings to f16 plus summation order."""
    monkeypatch.setattr(sgmat, "EMULATED_CONFIG", CFG8)
    monkeypatch.setattr(conv_sgmat, "CHOICES", (SMALL,))
    rng = np.random.default_rng(11)
    w1 = (rng.standard_normal((16, 3, 7, 7)) / np.sqrt(147)).astype(np.float16)
    w2 = (rng.standard_normal((16, 16, 3, 3)) / np.sqrt(144)).astype(np.float16)
    b1, b2 = (rng.standard_normal(16) * 0.1).astype(np.float16), (rng.standard_normal(16) * 0.1).astype(np.float16)
    x = rng.standard_normal((2, 3, 16, 16)).astype(np.float16)
    with settings.override(matrix="emulate"):
        model = ember.load_onnx(_resnet_block(TensorProto.FLOAT16, w1, b1, w2, b2), backend="wgpu")
        got = model.run({"x": x})["y"]
        assert model.stats()["conv.subgroup_matrix_emulated"] >= 1
        assert model.stats()["conv.subgroup_matrix"] == 0
    m32 = _resnet_block(TensorProto.FLOAT, *(v.astype(np.float32) for v in (w1, b1, w2, b2)))
    ref = ort.InferenceSession(m32.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.float32)})[0].astype(np.float64)
    assert got.dtype == np.float16 and got.shape == ref.shape
    err = np.abs(got.astype(np.float64) - ref)
    assert (err <= 1e-3 * np.abs(ref) + 2e-3 * float(np.abs(ref).max())).all(), float(err.max())
    with settings.override(matrix="off"):
        off = ember.load_onnx(_resnet_block(TensorProto.FLOAT16, w1, b1, w2, b2), backend="wgpu")
        off.run({"x": x})
        assert off.stats()["conv.subgroup_matrix_emulated"] == 0 and off.stats()["conv.subgroup_matrix"] == 0


# ---- the native kernel: on the matrix units where the adapter has them, else the existing kernels ------------------
NATIVE = ["3x3_s1_p1", "stem_7x7_s2_p3_k147", "down_1x1_s2_ragged_m", "residual_f16_subgroup_16", "groups_2"]


@pytest.mark.parametrize("name", NATIVE)
def test_native_or_existing_matches_oracle(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                           name: str) -> None:
    """EMBER_MATRIX=on: with an f16 -> f32 config (Dawn on a GPU with matrix units) the native kernel runs (the
    plan's block); without one the same convs take the kernels of before and must be right too."""
    xshape, k, rs, stride, pads, dilation, groups, _, opts = CASES[name]
    with settings.override(matrix="on"):
        labels, worst = run_conv(wgpu_be, rng, xshape, k, rs, stride, pads, dilation, groups, **opts)
    cfg = sgmat._f16_f32_config(wgpu_be)
    if cfg is not None and sgmat.subgroup_size(wgpu_be, cfg) is not None:  # type: ignore[arg-type]
        assert labels == [conv_sgmat.LABEL_NATIVE]
    else:
        assert not LABELS & set(labels)
    assert worst <= 1.0, f"{name}: error {worst:.3g} x the bound ({labels})"


# ---- the native WGSL text -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("wide", [True, False])
def test_native_source_text(wgpu_be: ember.ComputeBackend, wide: bool) -> None:
    cfg = MatrixConfig("f16", "f32", 8, 16, 4)  # distinct M, N, K: each lands in its slot
    c, k = (16, 48) if wide else (3, 48)  # K = 144 (chunks) or 27 (scalar, one partial block)
    x = View.contiguous(11, F16, (2, c, 10, 10))
    w = View.contiguous(12, F16, (k, c, 3, 3))
    out = View.contiguous(13, F32, (2, k, 5, 5))
    bias = View.contiguous(14, F16, (k,))
    cs = check_conv_shape(x, w, out, (2, 2), (1, 1, 1, 1), (1, 1), 1)
    p = StagedParams(2, 2, 2, 2, 32, False, 8)  # block 32 x 64, 128 invocations
    ch = conv_sgmat.ConvSgmatChoice(sgmat.SgmatChoice(True, cfg, 32, 2, 2, False), p, wide)
    types = {11: "f16", 12: "f16", 13: "f32", 14: "f16"}
    src, grid, binds = conv_sgmat.conv_sgmat_source(wgpu_be, cs, ch, x, w, bias, out, call("relu", inp(0)), types,
                                                    None)  # type: ignore[arg-type]
    assert src.startswith("enable f16;\nenable subgroups;\nenable chromium_experimental_subgroup_matrix;\n"
                          "diagnostic(off, chromium_experimental.subgroup_matrix_uniformity);\n")
    assert "${" not in src and "fn mma(" not in src and "unpack2x16float" not in src
    assert "alias Left = subgroup_matrix_left<f16, 4, 8>;" in src
    assert "alias Right = subgroup_matrix_right<f16, 16, 4>;" in src
    assert "alias Acc = subgroup_matrix_result<f32, 16, 8>;" in src
    assert "@compute @workgroup_size(128)" in src and "@builtin(subgroup_id) sg: u32" in src
    kind = "array<vec4<u32>>" if wide else "array<f16>"
    assert f"@group(0) @binding(0) var<storage, read> buf0: {kind};" in src  # W
    assert "@group(0) @binding(1) var<storage, read> buf1: array<f16>;" in src  # x, gathered
    assert "var<workgroup> sh_a: array<f16, 1280>;" in src  # 32 rows x (32 + 8)
    assert "var<workgroup> sh_b: array<f16, 2304>;" in src  # 32 rows x (64 + 8)
    assert "subgroupMatrixLoad<Left>(&sh_a, abuf + ta_1 + kk, false, 40u)" in src
    assert "subgroupMatrixLoad<Right>(&sh_b, bbuf + tb_1 + kk * 72u, false, 72u)" in src
    assert src.count("subgroupMatrixMultiplyAccumulate(") == 4 and "kk += 4u" in src
    if wide:  # rows of 144 f16 = 18 chunks, 4 a block; K = 144 = 4.5 blocks: the tail chunks are zeros
        assert "let ga_0 = min(brow + lid / 4u, 47u) * 18u + lid % 4u;" in src
        assert "ra_0 = vec4<u32>(0u); if (k0 + ka_0 < 144u) { ra_0 = buf0[ga_0 + s * 4u]; }" in src
        assert "let h0 = bitcast<vec2<f16>>(v.x);" in src and "put_a(sa_0, ra_0);" in src
        assert "for (var s = 0u; s < 5u; s++)" in src
    else:
        assert "let ga_0 = min(brow + lid / 32u, 47u) * 27u + lid % 32u;" in src
        assert "ra_0 = 0.0h; if (k0 + ka_0 < 27u) { ra_0 = f16(f32(buf0[ga_0 + k0])); }" in src
        assert "for (var s = 0u; s < 1u; s++)" in src
    # B: 16 groups of 4 pixels, 8 rows apart; (n, p, q) of 5 x 5 outputs, stride 2, pad 1.
    assert "let bc = (lid % 16u) * 4u;" in src and "let rb0 = lid / 16u;" in src
    assert "let bh_2 = i32((bpq_2 / 5u) * 2u) - 1i;" in src
    assert f"let bo_3 = i32((bj_3 / 25u) * {c * 100}u) + bh_3 * 10i + bw_3;" in src
    # Padding at the top / left only: the last output's taps (4 * 2 - 1 + 2 = 9) stay inside the 10 rows / columns.
    assert "if (bok_1 && bh_1 + dh_2 >= 0i && bw_1 + dw_2 >= 0i) { rb_2.y = f16(f32(buf1[u32(bo_1 + ro_2)])); }" in src
    assert src.count("subgroupMatrixStore(&scratch, base, acc_") == 4
    assert "if (n >= 50u) { return; }" in src  # 2 x 25 pixels: not a multiple of CN = 16
    assert grid == (2 * 1, 1, 1) and "if (g >= 2u) { return; }" in src  # 48 channels / 32, 50 pixels / 64
    assert "var<workgroup> scratch: array<f32, 512>;" in src  # 4 subgroups x 8 x 16
    assert len(binds.buffers()) == 4

"""The subgroup-matrix matmul (matmul_sgmat.py): its emulated variant against a float64 oracle on every adapter (the
tiling, offsets, strides and epilogue of the native kernel), which products take it, and the native WGSL text.

The native variant needs Dawn and matrix units; here its text is generated for a fake config and checked as a
string (no compiler for the extension is available locally).
"""

from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember
from ember import settings
from ember.backends.base import View
from ember.backends.wgpu import matmul as wgpu_matmul
from ember.backends.wgpu import matmul_sgmat as sgmat
from ember.backends.wgpu.matmul import matmul_epilogue
from ember.backends.wgpu.runtime import MatrixConfig
from ember.backends.wgpu.shader.bindings import Bindings
from ember.core.expr import call, inp

F16, F32 = np.dtype(np.float16), np.dtype(np.float32)
EPS16 = 2.0**-11  # f16's unit roundoff: the one rounding of an f16 output
ACC_TOL = 1e-5  # f32 accumulation of exact f16 products, relative to sum |terms|: far below any indexing error
GELU_ERF = np.vectorize(math.erf)


def _buffer(be: ember.ComputeBackend, values: np.ndarray) -> int:
    h = be.alloc(max(values.nbytes, 16))
    be.upload(h, values)
    return h


def _act_numpy(act: str | None, x: np.ndarray) -> np.ndarray:
    if act == "relu":
        return np.maximum(x, 0.0)
    if act == "gelu":
        return 0.5 * x * (1.0 + GELU_ERF(x / np.sqrt(2.0)))
    return x


def run_case(be: ember.ComputeBackend, rng: np.random.Generator, nb: int, m: int, n: int, k: int, *,
             b_col: bool = False, out_dtype: np.dtype = F32, bias: str | None = None, residual: bool = False,
             act: str | None = None, alpha: float = 1.0, beta: float = 1.0, pad: int = 0, offset: int = 0,
             b_shared: bool = False, runtime_sizes: bool = False) -> tuple[list[str], float]:
    """record_matmul on f16 views (padded rows `pad`, element offsets `offset`, B shared over the batch with
    `b_shared`); returns the dispatch labels and the worst |got - ref| / bound over the output (<= 1 passes),
    asserting the output's padding and the rows after it are untouched."""
    a = rng.standard_normal((nb, m, k)).astype(np.float16)
    b = rng.standard_normal((1 if b_shared else nb, k, n)).astype(np.float16)
    lda = k + pad
    a_buf = np.full(offset + nb * m * lda, np.nan, np.float16)
    a_buf[offset:].reshape(nb, m, lda)[:, :, :k] = a
    # B stored row-major (rows of n) or as B^T (rows of k), with padding, the batch dim broadcast when shared.
    rows, cols = (n, k) if b_col else (k, n)
    ldb = cols + pad
    b_buf = np.full(offset + b.shape[0] * rows * ldb, np.nan, np.float16)
    b_buf[offset:].reshape(b.shape[0], rows, ldb)[:, :, :cols] = np.transpose(b, (0, 2, 1)) if b_col else b
    b_batch = 0 if b_shared else rows * ldb
    b_strides = (b_batch, 1, ldb) if b_col else (b_batch, ldb, 1)
    ldo = n + pad
    tail = 128 * ldo  # poisoned rows after the output: where a tile past M that was not masked would write
    out_np = np.full(nb * m * ldo + tail, np.nan, out_dtype)
    hs = [_buffer(be, a_buf), _buffer(be, b_buf), _buffer(be, out_np)]
    kw: dict = {"alpha": alpha, "beta": beta, "runtime_sizes": runtime_sizes}
    ref = alpha * np.matmul(a.astype(np.float64), b.astype(np.float64))
    scale = abs(alpha) * np.matmul(np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64)))
    if bias is not None:  # per column (a Linear's bias) or per row (stride 0 along n), f16
        vec = rng.standard_normal(n if bias == "n" else m).astype(np.float16)
        hs.append(_buffer(be, vec))
        kw["bias"] = View(hs[-1], F16, (nb, m, n), (0, 0, 1) if bias == "n" else (0, 1, 0))
        add = vec.astype(np.float64)[None, None, :] if bias == "n" else vec.astype(np.float64)[None, :, None]
        ref, scale = ref + beta * add, scale + abs(beta) * np.abs(add)
    if residual:
        res = rng.standard_normal((nb, m, n)).astype(np.float16)
        hs.append(_buffer(be, res))
        kw["residual"] = View.contiguous(hs[-1], F16, res.shape)
        ref, scale = ref + res, scale + np.abs(res)
    if act is not None:
        kw["act"] = call(act, inp(0))
    try:
        steps = be.record_matmul(View(hs[0], F16, (nb, m, k), (m * lda, lda, 1), offset),
                                 View(hs[1], F16, (nb, k, n), b_strides, offset),
                                 View(hs[2], out_dtype, (nb, m, n), (m * ldo, ldo, 1)), **kw)
        be.execute(steps)
        flat = be.download(View.contiguous(hs[2], out_dtype, (nb * m * ldo + tail,)))
    finally:
        for h in hs:
            be.free(h)
    raw = flat[:nb * m * ldo].reshape(nb, m, ldo)
    assert np.isnan(raw[:, :, n:].astype(np.float32)).all(), "wrote past N"
    assert np.isnan(flat[nb * m * ldo:].astype(np.float32)).all(), "wrote past M"
    ref = _act_numpy(act, ref)
    got = raw[:, :, :n].astype(np.float64)
    bound = ACC_TOL * scale + (EPS16 * np.abs(ref) if out_dtype == F16 else 0.0) + 1e-30
    assert np.isfinite(got).all()
    return [s.label for s in steps], float((np.abs(got - ref) / bound).max())


# ---- the emulated kernel against the oracle -------------------------------------------------------------------------
CASES = {  # name: (nb, m, n, k, tiles or None (plan's choice), options)
    "square_f32": (1, 64, 64, 64, None, {}),
    "batch_col_major_bias_relu_f16": (3, 48, 80, 32, (1, 1), dict(b_col=True, out_dtype=F16, bias="n", act="relu")),
    "edge_blocks_residual_f16": (2, 96, 160, 48, (2, 4), dict(out_dtype=F16, residual=True, alpha=0.5, pad=5)),
    "tall_row_bias_gelu": (1, 160, 96, 16, (4, 2), dict(b_col=True, bias="m", beta=-2.0, act="gelu")),
    "mostly_masked_4x4_shared_b": (2, 32, 48, 128, (4, 4), dict(b_shared=True)),
    "padded_offsets_col_major_f16": (2, 32, 32, 64, (2, 1), dict(b_col=True, out_dtype=F16, pad=3, offset=7)),
    "wide_1x2_bias_residual": (1, 16, 272, 32, (1, 2), dict(bias="n", residual=True, act="relu", pad=1)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_emulated_matches_oracle(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                 monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    nb, m, n, k, tiles, opts = CASES[name]
    if tiles is not None:
        monkeypatch.setattr(sgmat, "TILE_CHOICES", (tiles,))
    with settings.override(matrix="emulate"):
        labels, worst = run_case(wgpu_be, rng, nb, m, n, k, **opts)
    assert labels == [sgmat.LABEL_EMULATED]
    assert worst <= 1.0, f"{name}: error {worst:.3g} x the bound"


@pytest.mark.parametrize("cm,cn,ck,lanes", [(8, 8, 8, 16), (16, 8, 16, 32), (8, 16, 8, 64), (4, 4, 8, 32)])
def test_emulated_other_configs(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                monkeypatch: pytest.MonkeyPatch, cm: int, cn: int, ck: int, lanes: int) -> None:
    """Configs other than 16 x 16 x 16 (Apple's 8 x 8 x 8; M != N, which would catch an m/n mix-up; 4 x 4, fewer
    elements than lanes) and other subgroup sizes: nothing in the generator assumes 16 or 32."""
    monkeypatch.setattr(sgmat, "EMULATED_CONFIG", MatrixConfig("f16", "f32", cm, cn, ck))
    monkeypatch.setattr(sgmat, "EMULATED_SUBGROUP", lanes)
    monkeypatch.setattr(sgmat, "TILE_CHOICES", ((2, 1),))
    with settings.override(matrix="emulate"):
        labels, worst = run_case(wgpu_be, rng, 2, 5 * cm, 3 * cn, 4 * ck, b_col=cm == 8, out_dtype=F16, bias="n",
                                 act="relu")
    assert labels == [sgmat.LABEL_EMULATED]
    assert worst <= 1.0


# ---- which products take it -----------------------------------------------------------------------------------------
def _labels(be: ember.ComputeBackend, a: View, b: View, out: View, **kw: object) -> list[str]:
    return [s.label for s in be.record_matmul(a, b, out, **kw)]


def test_eligibility(wgpu_be: ember.ComputeBackend) -> None:
    be = wgpu_be
    h = be.alloc(1 << 20)
    try:
        def views(m: int, n: int, k: int, dtype: np.dtype = F16, a_strides: tuple | None = None) -> tuple:
            a = View(h, dtype, (1, m, k), a_strides or (0, k, 1), 0)
            return a, View(h, dtype, (1, k, n), (0, n, 1), 4096), View(h, dtype, (1, m, n), (0, n, 1), 16384)

        def gemm(*args: View, **kw: object) -> bool:
            return not any(label.startswith(sgmat.LABEL_NATIVE) for label in _labels(be, *args, **kw))

        with settings.override(matrix="emulate"):
            assert _labels(be, *views(32, 32, 32)) == [sgmat.LABEL_EMULATED]
            assert gemm(*views(40, 32, 32))  # ragged M
            assert gemm(*views(32, 40, 32))  # ragged N
            assert gemm(*views(32, 32, 24))  # ragged K
            assert gemm(*views(32, 32, 32), runtime_sizes=True)
            assert gemm(*views(32, 32, 32, F32))  # f32 inputs
            assert gemm(*views(32, 32, 32, a_strides=(0, 1, 32)))  # A column-major
        has_units = any(c.component == "f16" and c.result == "f32" for c in getattr(be, "matrix_configs", ()))
        with settings.override(matrix="on"):  # every eligible product, where the adapter has matrix units
            assert gemm(*views(32, 32, 32)) != has_units
        for mode in ("off", "auto"):  # auto: a 32^3 product is below AUTO_MIN_VOLUME
            with settings.override(matrix=mode):
                assert gemm(*views(32, 32, 32)), mode
    finally:
        be.free(h)


class FakeDawn:
    """What plan_sgmat reads of a backend with matrix units (the subgroup size already measured)."""

    def __init__(self, configs: tuple[MatrixConfig, ...], subgroup: int | None = 32) -> None:
        self.matrix_configs = configs
        self.features = {"shader-f16", "subgroup"}
        self.__dict__["_sgmat_subgroup_size"] = subgroup


def test_native_planning() -> None:
    cfg = MatrixConfig("f16", "f32", 16, 16, 16)
    big = View(1, F16, (1, 4096, 4096), (0, 4096, 1))
    out = View(3, F16, (1, 4096, 4096), (0, 4096, 1))
    bt = View(2, F16, (1, 4096, 4096), (0, 1, 4096))  # B^T contiguous: column-major loads
    types = {1: "f16", 2: "f16", 3: "f16"}
    be = FakeDawn((MatrixConfig("i8", "i32", 8, 8, 32), cfg))
    with settings.override(matrix="auto"):
        choice = sgmat.plan_sgmat(be, big, bt, out, types, False)
        assert choice == sgmat.SgmatChoice(True, cfg, 32, 4, 4, True) and choice.label == sgmat.LABEL_NATIVE
        small = View(1, F16, (1, 256, 256), (0, 256, 1))
        assert sgmat.plan_sgmat(be, small, View(2, F16, (1, 256, 256), (0, 256, 1)),
                                View(3, F16, (1, 256, 256), (0, 256, 1)), types, False) is None  # below the volume
    with settings.override(matrix="on"):
        small_choice = sgmat.plan_sgmat(be, small, View(2, F16, (1, 256, 256), (0, 256, 1)),
                                        View(3, F16, (1, 256, 256), (0, 256, 1)), types, False)
        assert small_choice is not None and not small_choice.b_col_major
        assert sgmat.plan_sgmat(FakeDawn((MatrixConfig("f16", "f16", 16, 16, 16),)), big, bt, out, types,
                                False) is None  # no f32 accumulation
        assert sgmat.plan_sgmat(FakeDawn((cfg,), subgroup=None), big, bt, out, types, False) is None  # unmeasured


def test_tile_choice() -> None:
    cfg = MatrixConfig("f16", "f32", 16, 16, 16)
    assert sgmat.choose_tiles(4096, 4096, 1, cfg) == (4, 4)
    assert sgmat.choose_tiles(2048, 2048, 1, cfg) == (4, 4)  # 16 x 16 blocks: enough
    assert sgmat.choose_tiles(1024, 1024, 1, cfg) == (2, 4)  # (4, 4)'s 8 x 8 blocks are too few; 16 x 8 enough
    assert sgmat.choose_tiles(512, 512, 1, cfg) == (1, 2)  # the larger choices give too few workgroups
    assert sgmat.choose_tiles(64, 64, 1, cfg) == (1, 1)  # as many workgroups as it gets
    assert sgmat.choose_tiles(16, 16, 1, cfg) == (1, 1)  # the last choice, whatever it wastes
    apple = MatrixConfig("f16", "f32", 8, 8, 8)
    assert sgmat.choose_tiles(4096, 4096, 1, apple) == (4, 4)


# ---- the native WGSL text ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("b_col", [False, True])
def test_native_source_text(wgpu_be: ember.ComputeBackend, b_col: bool) -> None:
    be, cfg = wgpu_be, MatrixConfig("f16", "f32", 8, 16, 4)  # distinct M, N, K: each lands in its slot
    nb, m, n, k = 2, 48, 64, 40
    a = View(11, F16, (nb, m, k), (m * 48, 48, 1), 3)
    b = View(12, F16, (nb, k, n), (0, 1, 44) if b_col else (0, 72, 1), 5)
    out = View(13, F32, (nb, m, n), (m * n, n, 1))
    bias = View(14, F16, (nb, m, n), (0, 0, 1))
    binds = Bindings(13, {}, {11: "f16", 12: "f16", 13: "f32", 14: "f16"})
    for v in (a, b, bias):
        binds.add(v.handle, False)
    ep = matmul_epilogue(out, bias, 1.0, 1.0, call("relu", inp(0)), m, n, False, False, None)
    choice = sgmat.SgmatChoice(True, cfg, 32, 2, 2, b_col)
    src, grid = sgmat.sgmat_source(be, a, b, out, ep, binds, choice)
    assert src.startswith("enable f16;\nenable subgroups;\nenable chromium_experimental_subgroup_matrix;\n"
                          "diagnostic(off, chromium_experimental.subgroup_matrix_uniformity);\n")
    assert "${" not in src
    assert "alias Left = subgroup_matrix_left<f16, 4, 8>;" in src  # <T, K, M>: M rows x K columns
    assert "alias Right = subgroup_matrix_right<f16, 16, 4>;" in src  # <T, N, K>
    assert "alias Acc = subgroup_matrix_result<f32, 16, 8>;" in src  # <T, N, M>
    assert "@compute @workgroup_size(128)" in src and "@builtin(subgroup_id) sg: u32" in src
    assert src.count("subgroupMatrixMultiplyAccumulate(") == 4
    assert "subgroupMatrixLoad<Left>(&buf0, a_off_1 + kb, false, 48u)" in src
    right = ("subgroupMatrixLoad<Right>(&buf1, b_off_1 + kb, true, 44u)" if b_col
             else "subgroupMatrixLoad<Right>(&buf1, b_off_1 + kb * 72u, false, 72u)")
    assert right in src
    assert ("let b_off_1 = min(col_1, 48u) * 44u + 5u;" if b_col else "let b_off_1 = min(col_1, 48u) + 5u;") in src
    assert "let a_off_1 = z * 2304u + min(row_1, 40u) * 48u + 3u;" in src
    assert src.count("subgroupMatrixStore(&scratch, base, acc_") == 4
    assert "var<workgroup> scratch: array<f32, 512>;" in src  # 4 subgroups x 8 x 16
    assert "kb += 4u" in src and "fn mma(" not in src
    # 2 x 2 subgroups of 2 x 2 tiles: a 32 x 64 block; 48 rows -> 2 block rows, 64 columns -> 1, times Z = 2.
    assert grid == (4, 1, 1) and "if (g >= 4u) { return; }" in src


def test_subgroup_size_kernel(wgpu_be: ember.ComputeBackend) -> None:
    """The measuring kernel runs (without the matrix touch, which wgpu-native cannot compile) where the adapter
    has subgroups; the answer is a power of two the adapter allows."""
    if "subgroup" not in wgpu_be.features:
        with pytest.raises(Exception):  # noqa: B017 - whatever the compiler says: no subgroup builtins here
            sgmat.measure_subgroup_size(wgpu_be, None)
        return
    size = sgmat.measure_subgroup_size(wgpu_be, None)
    assert size is not None and size & (size - 1) == 0 and 1 <= size <= 128


# ---- a float16 ONNX model ------------------------------------------------------------------------------------------
def _linear(elem: int, w: np.ndarray, c: np.ndarray) -> object:
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "c"], ["y"])], "sgmat",
        [helper.make_tensor_value_info("x", elem, [2, 64, 48])], [helper.make_tensor_value_info("y", elem, None)],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(c, "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_f16_onnx_model_matches_onnxruntime(monkeypatch: pytest.MonkeyPatch) -> None:
    """MatMul + Add in float16 under EMBER_MATRIX=emulate, against ONNX Runtime in float32 on the same (f16-exact)
    values, as test_wgpu_f16_kernels does: the difference is ember's one rounding to f16 plus summation order."""
    rng = np.random.default_rng(7)
    w = (rng.standard_normal((48, 80)) * 0.25).astype(np.float16)
    c = rng.standard_normal(80).astype(np.float16)
    x = rng.standard_normal((2, 64, 48)).astype(np.float16)
    calls: list[str] = []
    real = wgpu_matmul.record_sgmat

    def counted(*args: object) -> list:
        steps = real(*args)
        calls.extend(s.label for s in steps)
        return steps

    monkeypatch.setattr(wgpu_matmul, "record_sgmat", counted)
    with settings.override(matrix="emulate"):
        got = ember.load_onnx(_linear(TensorProto.FLOAT16, w, c), backend="wgpu").run({"x": x})["y"]
    assert calls == [sgmat.LABEL_EMULATED]
    m32 = _linear(TensorProto.FLOAT, w.astype(np.float32), c.astype(np.float32))
    ref = ort.InferenceSession(m32.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x.astype(np.float32)})[0].astype(np.float64)
    assert got.dtype == np.float16 and got.shape == ref.shape
    err = np.abs(got.astype(np.float64) - ref)
    assert (err <= 1e-3 * np.abs(ref) + 2e-3 * float(np.abs(ref).max())).all(), float(err.max())


# ---- the native kernel: on the matrix units where the adapter has them, else the GEMM, both against the oracle -----
@pytest.mark.parametrize("name", sorted(CASES))
def test_native_or_gemm_matches_oracle(wgpu_be: ember.ComputeBackend, rng: np.random.Generator,
                                       monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """EMBER_MATRIX=on: with an f16 -> f32 config (Dawn on a GPU with matrix units) the native kernel runs, its tile
    forced as in the emulated gate; without one the same products take the tiled GEMM and must be right too."""
    nb, m, n, k, tiles, opts = CASES[name]
    if tiles is not None:
        monkeypatch.setattr(sgmat, "TILE_CHOICES", (tiles,))
    with settings.override(matrix="on"):
        labels, worst = run_case(wgpu_be, rng, nb, m, n, k, **opts)
    has_units = any(c.component == "f16" and c.result == "f32" for c in getattr(wgpu_be, "matrix_configs", ()))
    if has_units:
        assert labels == [sgmat.LABEL_NATIVE]
    else:
        assert sgmat.LABEL_NATIVE not in labels and sgmat.LABEL_EMULATED not in labels
    assert worst <= 1.0, f"{name}: error {worst:.3g} x the bound ({labels})"


def test_model_stats_count_the_matrix_arm() -> None:
    """model.stats() and plan_info() count the products that ran on the (emulated) matrix kernel, per run."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((48, 32)) * 0.25).astype(np.float16)
    c = rng.standard_normal(32).astype(np.float16)
    x = rng.standard_normal((2, 64, 48)).astype(np.float16)
    with settings.override(matrix="emulate"):
        model = ember.load_onnx(_linear(TensorProto.FLOAT16, w, c), backend="wgpu")
        model.run({"x": x})
        model.run({"x": x})
        assert model.stats()["matmul.subgroup_matrix_emulated"] == 2
        assert model.stats()["matmul.subgroup_matrix"] == 0
        info = model.plan_info()
        assert info["matmul.subgroup_matrix_emulated"] == 1
        assert info["runtime"]["matrix"].startswith("emulated")
    with settings.override(matrix="off"):
        off = ember.load_onnx(_linear(TensorProto.FLOAT16, w, c), backend="wgpu")
        off.run({"x": x})
        assert off.stats()["matmul.subgroup_matrix_emulated"] == 0

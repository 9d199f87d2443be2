"""Index-driven, loss, bit, scan/top-k/scatter and resampling ops on every backend, against onnx.reference.

Each case is a one-node model built with onnx.helper; inputs whose values are shape arithmetic (k, sizes, axes)
are initializers, the rest are fed at run time.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import ember
from ember.backends.base import View
from ember.core.expr import FLOAT, INT, call, const, coord, load

R = np.random.default_rng(1234)


def f32(*shape: int) -> np.ndarray:
    return R.standard_normal(shape).astype(np.float32)


def run_case(backend_name: str, op: str, feeds: dict[str, np.ndarray], consts: dict[str, np.ndarray] | None = None,
             outputs: int = 1, opset: int = 21, rtol: float = 1e-5, atol: float = 1e-6,
             domain: str = "", order: list[str] | None = None, oracle: str = "reference", **attrs: Any) -> None:
    consts = consts or {}
    names = order or [*feeds, *consts]
    out_names = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, out_names, domain=domain, **attrs)
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in feeds.items()]
    # onnxruntime wants declared output types; onnx.reference infers them.
    out_type = onnx.TensorProto.FLOAT if oracle == "ort" else onnx.TensorProto.UNDEFINED
    outs = [helper.make_tensor_value_info(n, out_type, None) for n in out_names]
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    model = helper.make_model(helper.make_graph([node], "t", ins, outs, inits), opset_imports=opsets)
    if oracle == "ort":  # where onnx.reference is wrong (grouped ConvTranspose)
        import onnxruntime as ort

        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    else:
        want = ReferenceEvaluator(model).run(None, feeds)
    got = ember.load_onnx(model, backend=backend_name).run(feeds)
    for name, w in zip(out_names, want, strict=True):
        g = got[name]
        assert g.shape == np.shape(w), (name, g.shape, np.shape(w))
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{op} output {name}")


# ---- Expr: coord and load -------------------------------------------------------------------------------------
def test_coord_and_clamped_load(be: ember.ComputeBackend) -> None:
    """out[i, j] = x[idx[i, j], j - 1] + i: computed, clamped (out-of-range) indices and coordinates."""
    x = f32(4, 3)
    idx = np.array([[0, 3, -5], [9, 1, 2]], np.int32)
    hx, hi, ho = be.alloc(x.nbytes), be.alloc(idx.nbytes), be.alloc(2 * 3 * 4)
    try:
        xv, iv, ov = (View.contiguous(hx, np.float32, x.shape), View.contiguous(hi, np.int32, idx.shape),
                      View.contiguous(ho, np.float32, (2, 3)))
        be.upload(hx, x)
        be.upload(hi, idx)
        e = call("add", load(0, call("add", const(0, INT), load(1, coord(0), coord(1), kind=INT)),
                             call("sub", coord(1), const(1, INT)), kind=FLOAT), call("to_float", coord(0)))
        be.execute(be.record_elementwise(e, [xv, iv], ov))
        got = be.download(ov)
    finally:
        for h in (hx, hi, ho):
            be.free(h)
    rows, cols = np.clip(idx, 0, 3), np.clip(np.arange(3) - 1, 0, 2)[None, :]
    np.testing.assert_allclose(got, x[rows, cols] + np.arange(2)[:, None], rtol=1e-6)


def test_narrow_ints_wrap(backend_name: str) -> None:
    """uint8 and int8 sums wrap in every kernel (wgpu keeps them in i32 words)."""
    for dt in (np.uint8, np.int8):
        a = np.array([100, 120, -3 % 256 if dt == np.uint8 else -3], dt)
        nodes = [helper.make_node("Add", ["a", "a"], ["t"]), helper.make_node("Add", ["t", "a"], ["y"])]
        vt = helper.np_dtype_to_tensor_dtype(np.dtype(dt))
        g = helper.make_graph(nodes, "t", [helper.make_tensor_value_info("a", vt, [3])],
                              [helper.make_tensor_value_info("y", vt, [3])])
        m = ember.load_onnx(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), backend=backend_name)
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(m(a)[0], a + a + a)


# ---- gathers, masks, pads ----------------------------------------------------------------------------------------
def test_gather_elements(backend_name: str) -> None:
    idx = np.array([[0, -1, 2], [1, 0, -3]], np.int64)
    run_case(backend_name, "GatherElements", {"x": f32(2, 3), "i": idx}, axis=1)
    run_case(backend_name, "GatherElements", {"x": f32(3, 3), "i": np.array([[1, 2, 0], [2, 0, 0]])}, axis=0)


def test_gather_nd(backend_name: str) -> None:
    run_case(backend_name, "GatherND", {"x": f32(2, 3, 4), "i": np.array([[1, -1], [0, 2]], np.int64)})
    run_case(backend_name, "GatherND", {"x": f32(2, 3, 4), "i": np.array([[[2]], [[0]]], np.int64)}, batch_dims=1)


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-1, 0, 2])
def test_trilu(backend_name: str, upper: int, k: int) -> None:
    run_case(backend_name, "Trilu", {"x": f32(2, 4, 5)}, {"k": np.array(k, np.int64)}, upper=upper, opset=14)


def test_onehot(backend_name: str) -> None:
    ind = np.array([[0, -1, 3], [7, 2, -4]], np.int64)
    run_case(backend_name, "OneHot", {"i": ind}, {"depth": np.array(4, np.int64),
                                                  "v": np.array([-2.0, 5.0], np.float32)}, axis=1, opset=11)


def test_hardmax(backend_name: str) -> None:
    x = np.array([[1, 3, 3, 0], [2, 2, 1, 5]], np.float32)
    run_case(backend_name, "Hardmax", {"x": x}, axis=1, opset=13)
    run_case(backend_name, "Hardmax", {"x": f32(2, 3, 4)}, axis=0, opset=13)


@pytest.mark.parametrize("mode", ["reflect", "edge", "wrap"])
def test_pad_modes(backend_name: str, mode: str) -> None:
    run_case(backend_name, "Pad", {"x": f32(3, 4)}, {"pads": np.array([2, 1, 1, 3], np.int64)}, mode=mode, opset=19)


def test_center_crop_pad_compress_reverse(backend_name: str) -> None:
    run_case(backend_name, "CenterCropPad", {"x": f32(5, 2, 3)}, {"s": np.array([2, 5, 3], np.int64)}, opset=18)
    run_case(backend_name, "Compress", {"x": f32(3, 4)}, {"c": np.array([1, 0, 1], bool)}, axis=0, opset=11)
    run_case(backend_name, "Compress", {"x": f32(3, 4)}, {"c": np.array([0, 1, 1, 0, 1], bool)}, opset=11)
    run_case(backend_name, "ReverseSequence", {"x": f32(4, 3, 2), "l": np.array([4, 1, 2], np.int64)},
             batch_axis=1, time_axis=0, opset=10)


# ---- resampling ---------------------------------------------------------------------------------------------------
RESIZE = [
    dict(mode="nearest", coordinate_transformation_mode="half_pixel", nearest_mode="round_prefer_ceil"),
    dict(mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor"),
    dict(mode="linear", coordinate_transformation_mode="half_pixel"),
    dict(mode="linear", coordinate_transformation_mode="align_corners"),
    dict(mode="linear", coordinate_transformation_mode="pytorch_half_pixel"),
    dict(mode="cubic", coordinate_transformation_mode="half_pixel", exclude_outside=1, cubic_coeff_a=-0.5),
    dict(mode="cubic", coordinate_transformation_mode="asymmetric"),
    dict(mode="linear", coordinate_transformation_mode="half_pixel", antialias=1),
]


@pytest.mark.parametrize("attrs", RESIZE, ids=lambda a: "-".join(str(v) for v in a.values()))
@pytest.mark.parametrize("scales", [[1, 1, 1.7, 0.6], [1, 1, 0.5, 2.5]])
def test_resize_scales(backend_name: str, attrs: dict, scales: list) -> None:
    run_case(backend_name, "Resize", {"x": f32(1, 2, 5, 4)},
             {"roi": np.zeros(0, np.float32), "scales": np.array(scales, np.float32)}, rtol=1e-4, atol=1e-5,
             opset=19, **attrs)


def test_resize_sizes_and_crop(backend_name: str) -> None:
    run_case(backend_name, "Resize", {"x": f32(1, 1, 4, 6)},
             {"roi": np.zeros(0, np.float32), "scales": np.zeros(0, np.float32),
              "sizes": np.array([3, 5], np.int64)}, mode="linear", axes=[2, 3],
             keep_aspect_ratio_policy="not_larger", opset=19, rtol=1e-4, atol=1e-5)
    run_case(backend_name, "Resize", {"x": f32(1, 1, 4, 4)},
             {"roi": np.array([0, 0, 0.4, 0.6, 1, 1, 1.2, 1.7], np.float32), "scales": np.zeros(0, np.float32),
              "sizes": np.array([1, 1, 3, 3], np.int64)}, mode="linear",
             coordinate_transformation_mode="tf_crop_and_resize", extrapolation_value=10.0, opset=19, rtol=1e-4)


def test_upsample(backend_name: str) -> None:
    run_case(backend_name, "Upsample", {"x": f32(1, 1, 2, 3)}, {"s": np.array([1, 1, 2, 3], np.float32)},
             mode="nearest", opset=9)


@pytest.mark.parametrize("mode", ["linear", "nearest", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample(backend_name: str, mode: str, padding: str, align: int) -> None:
    grid = R.uniform(-1.4, 1.4, (2, 3, 4, 2)).astype(np.float32)
    run_case(backend_name, "GridSample", {"x": f32(2, 2, 4, 5), "g": grid}, mode=mode, padding_mode=padding,
             align_corners=align, opset=20, rtol=1e-4, atol=1e-5)


def test_affine_grid(backend_name: str) -> None:
    for size, theta in (([2, 3, 4, 5], f32(2, 2, 3)), ([1, 2, 3, 4, 2], f32(1, 3, 4))):
        for align in (0, 1):
            run_case(backend_name, "AffineGrid", {"t": theta}, {"s": np.array(size, np.int64)}, align_corners=align,
                     opset=20, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("eq,shapes", [("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]), ("ii->i", [(4, 4)]),
                                       ("...ij->...ji", [(2, 3, 4)]), ("ij,j", [(3, 4), (4,)]),
                                       ("abc,cd->", [(2, 3, 4), (4, 2)])])
def test_einsum(backend_name: str, eq: str, shapes: list) -> None:
    feeds = {f"x{i}": f32(*s) for i, s in enumerate(shapes)}
    run_case(backend_name, "Einsum", feeds, equation=eq, opset=12, rtol=1e-4, atol=1e-5)


# ---- scatters, scans, top-k ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements(backend_name: str, reduction: str) -> None:
    idx = np.array([[1, 0, -1], [0, 2, 2]], np.int64) if reduction == "none" else np.array([[1, 1, -1], [1, 2, 2]])
    run_case(backend_name, "ScatterElements", {"x": f32(3, 3), "i": idx, "u": f32(2, 3)}, axis=1,
             reduction=reduction, opset=18)


@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_nd(backend_name: str, reduction: str) -> None:
    idx = np.array([[0, 1], [2, 0]] if reduction == "none" else [[0, 1], [0, 1]], np.int64)
    run_case(backend_name, "ScatterND", {"x": f32(3, 2, 4), "i": idx, "u": f32(2, 4)}, reduction=reduction, opset=18)


def test_tensor_scatter(backend_name: str) -> None:
    run_case(backend_name, "TensorScatter", {"c": f32(2, 3, 5, 4), "u": f32(2, 3, 2, 4),
                                             "w": np.array([4, 1], np.int64)}, mode="circular", opset=24)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
def test_cumsum(backend_name: str, exclusive: int, reverse: int) -> None:
    run_case(backend_name, "CumSum", {"x": f32(3, 4, 2)}, {"a": np.array(1, np.int64)}, exclusive=exclusive,
             reverse=reverse, opset=14)
    x = np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    run_case(backend_name, "CumSum", {"x": x}, {"a": np.array(-1, np.int64)}, exclusive=exclusive,
             reverse=reverse, opset=14)


@pytest.mark.parametrize("largest", [0, 1])
def test_topk(backend_name: str, largest: int) -> None:
    x = np.array([[3, 1, 3, 2, 1, 3], [0, 5, 5, 1, 0, 2]], np.float32)
    run_case(backend_name, "TopK", {"x": x}, {"k": np.array([4], np.int64)}, outputs=2, largest=largest, opset=11)
    run_case(backend_name, "TopK", {"x": f32(5, 3, 2)}, {"k": np.array([2], np.int64)}, outputs=2, axis=0,
             largest=largest, opset=11)


# ---- losses ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
@pytest.mark.parametrize("weighted", [False, True])
def test_losses(backend_name: str, reduction: str, weighted: bool) -> None:
    t = np.array([[2, 0, 1], [1, 3, 2]], np.int64)
    feeds = {"x": f32(2, 4, 3), "t": t}
    if weighted:
        feeds["w"] = R.uniform(0.5, 2, 4).astype(np.float32)
    run_case(backend_name, "NegativeLogLikelihoodLoss", feeds, reduction=reduction, ignore_index=1, opset=13)
    run_case(backend_name, "SoftmaxCrossEntropyLoss", feeds, outputs=2, reduction=reduction, opset=13,
             rtol=1e-5, atol=1e-5)


# ---- bit ops and casts --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int32, np.uint16])
def test_bit_ops(backend_name: str, dtype: type) -> None:
    info = np.iinfo(dtype)
    a = np.array([1, 7, 100, info.max, info.min + 1, 3], dtype)
    s = np.array([1, 3, 2, 1, 0, info.bits], dtype)
    for direction in ("LEFT", "RIGHT"):
        if info.kind == "u":
            run_case(backend_name, "BitShift", {"a": a, "s": s}, direction=direction, opset=11)
        else:  # BitShift's schema takes unsigned types only; ONNX Runtime refuses the model too
            with pytest.raises(ValueError, match=r"BitShift.*allows tensor\(uint8\)"):
                run_case(backend_name, "BitShift", {"a": a, "s": s}, direction=direction, opset=11)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        run_case(backend_name, op, {"a": a, "b": a[::-1].copy()}, opset=18)
    run_case(backend_name, "BitwiseNot", {"a": a}, opset=18)


def test_bitcast(backend_name: str) -> None:
    run_case(backend_name, "BitCast", {"x": f32(2, 3)}, to=onnx.TensorProto.INT32, opset=26)
    run_case(backend_name, "BitCast", {"x": np.array([-1, 5, -128], np.int8)}, to=onnx.TensorProto.UINT8, opset=26)


# ---- normalisations, windows, quantisation, pooling ------------------------------------------------------------
def test_normalizations(backend_name: str) -> None:
    x = f32(2, 6, 3, 2)
    for p in (1, 2):  # onnx.reference's L1 sums x, not |x|: positive inputs keep it a valid oracle
        run_case(backend_name, "LpNormalization", {"x": np.abs(x)}, axis=1, p=p, opset=1, rtol=1e-5)
    run_case(backend_name, "MeanVarianceNormalization", {"x": x}, opset=13, rtol=1e-4, atol=1e-5)
    run_case(backend_name, "GroupNormalization", {"x": x, "s": f32(6), "b": f32(6)}, num_groups=3, opset=21,
             rtol=1e-4, atol=1e-5)
    run_case(backend_name, "Swish", {"x": x}, alpha=0.7, opset=24, rtol=1e-5)


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
def test_windows(backend_name: str, op: str, periodic: int) -> None:
    run_case(backend_name, op, {}, {"n": np.array(10, np.int64)}, periodic=periodic, opset=17, atol=1e-6)


def test_quantize(backend_name: str) -> None:
    x = (f32(3, 4) * 3).astype(np.float32)
    run_case(backend_name, "DynamicQuantizeLinear", {"x": x}, outputs=3, opset=11)
    run_case(backend_name, "QuantizeLinear", {"x": x, "s": np.array([0.05, 0.1, 0.02], np.float32),
                                              "z": np.array([3, -2, 0], np.int8)}, axis=0, opset=19)
    q = np.array([[0, 255, 3], [128, 9, 1]], np.uint8)
    run_case(backend_name, "DequantizeLinear", {"x": q, "s": np.array(0.5, np.float32),
                                                "z": np.array(128, np.uint8)}, opset=19)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool", "LpPool"])
def test_pool_3d(backend_name: str, op: str) -> None:
    extra = {"count_include_pad": 1} if op == "AveragePool" else {}
    run_case(backend_name, op, {"x": f32(1, 2, 5, 6, 4)}, kernel_shape=[2, 3, 2], strides=[2, 1, 2],
             pads=[1, 0, 1, 0, 1, 1], opset=18, rtol=1e-4, atol=1e-5, **extra)


def test_ml_ops(backend_name: str) -> None:
    run_case(backend_name, "Binarizer", {"x": f32(3, 4)}, domain="ai.onnx.ml", threshold=0.2)
    run_case(backend_name, "ArrayFeatureExtractor", {"x": f32(3, 5), "i": np.array([4, 0, 2], np.int64)},
             domain="ai.onnx.ml")


@pytest.mark.parametrize("attrs", [dict(strides=[2, 3], pads=[1, 0, 0, 2], output_padding=[1, 0]),
                                   dict(strides=[1, 1], pads=[1, 1, 0, 2], dilations=[2, 1]),
                                   dict(strides=[3, 2], output_shape=[10, 8]),
                                   dict(strides=[2, 2], auto_pad="SAME_UPPER", group=2)],
                         ids=["strided", "dilated", "output_shape", "same_upper_grouped"])
def test_conv_transpose(backend_name: str, attrs: dict) -> None:
    g = attrs.get("group", 1)
    w = f32(4, 6 // g, 3, 2)
    run_case(backend_name, "ConvTranspose", {"x": f32(2, 4, 3, 4)}, {"w": w, "b": f32(6)}, opset=11, rtol=1e-4,
             atol=1e-5, oracle="ort" if g > 1 else "reference", **attrs)
    run_case(backend_name, "ConvTranspose", {"x": f32(1, 4, 5)}, {"w": f32(4, 2, 3)}, strides=[2], pads=[1, 0],
             opset=11, rtol=1e-4, atol=1e-5)


def test_integer_matmul_exact(backend_name: str) -> None:
    """K = 600 uint8 extremes: the float32 products run in chunks short enough to stay exact."""
    a = np.where(R.random((3, 600)) < 0.5, 0, 255).astype(np.uint8)
    b = np.where(R.random((600, 2)) < 0.5, 0, 255).astype(np.uint8)
    run_case(backend_name, "MatMulInteger", {"a": a, "b": b}, {"az": np.array(0, np.uint8)}, opset=10, rtol=0)
    run_case(backend_name, "QLinearMatMul", {"a": a[:, :40], "sa": np.array(0.02, np.float32),
                                             "za": np.array(128, np.uint8), "b": b[:40],
                                             "sb": np.array(0.03, np.float32), "zb": np.array(100, np.uint8),
                                             "sy": np.array(5.0, np.float32), "zy": np.array(10, np.uint8)},
             opset=10, rtol=0, atol=1)


@pytest.mark.parametrize("with_state", [False, True])
def test_causal_conv_with_state(backend_name: str, with_state: bool) -> None:
    feeds = {"x": f32(2, 3, 5), "w": f32(3, 1, 4), "b": f32(3)}
    if with_state:
        feeds["s"] = f32(2, 3, 3)
    run_case(backend_name, "CausalConvWithState", feeds, outputs=2, activation="silu", opset=27, rtol=1e-5,
             atol=1e-5)


def recurrent_model(op: str, order: list[str], feeds: dict, consts: dict, outputs: int,
                    **attrs: Any) -> onnx.ModelProto:
    outs = [f"y{i}" for i in range(outputs)]
    ins = [helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
           for k, v in feeds.items()]
    g = helper.make_graph([helper.make_node(op, order, outs, **attrs)], "t", ins,
                          [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in outs],
                          [numpy_helper.from_array(v, k) for k, v in consts.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])


@pytest.mark.parametrize("op,gates", [("RNN", 1), ("GRU", 3), ("LSTM", 4)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent(backend_name: str, op: str, gates: int, direction: str) -> None:
    """Against onnxruntime (onnx.reference ignores sequence_lens, clip and activations); layout 1 against
    onnxruntime's layout 0 on transposed tensors (onnxruntime has no layout 1)."""
    import onnxruntime as ort

    dirs, seq, batch, n_in, hid = (2 if direction == "bidirectional" else 1), 4, 3, 5, 6
    consts = {"w": f32(dirs, gates * hid, n_in) * 0.5, "r": f32(dirs, gates * hid, hid) * 0.5,
              "b": f32(dirs, 2 * gates * hid) * 0.5}
    feeds = {"x": f32(seq, batch, n_in), "lens": np.array([4, 2, 3], np.int32), "h0": f32(dirs, batch, hid)}
    order = ["x", "w", "r", "b", "lens", "h0"]
    attrs: dict[str, Any] = {"clip": 2.5, "hidden_size": hid, "direction": direction}
    if op == "LSTM":
        feeds["c0"] = f32(dirs, batch, hid)
        consts["p"] = f32(dirs, 3 * hid) * 0.5
        order += ["c0", "p"]
    if op == "GRU":
        attrs["linear_before_reset"] = 1
    if op == "RNN":
        attrs.update(activations=["LeakyRelu"] * dirs, activation_alpha=[0.3] * dirs)
    n_out = 3 if op == "LSTM" else 2
    model = recurrent_model(op, order, feeds, consts, n_out, **attrs)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ember.load_onnx(model, backend=backend_name)(*feeds.values())
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    # layout 1: batch first (x, h0, c0; Y is (batch, seq, dirs, hidden), Y_h/Y_c (batch, dirs, hidden))
    feeds1 = {k: (v.transpose(1, 0, 2) if v.ndim == 3 else v) for k, v in feeds.items()}
    got1 = ember.load_onnx(recurrent_model(op, order, feeds1, consts, n_out, layout=1, **attrs),
                           backend=backend_name)(*feeds1.values())
    np.testing.assert_allclose(got1[0], want[0].transpose(2, 0, 1, 3), rtol=1e-4, atol=1e-5)
    for g, w in zip(got1[1:], want[1:], strict=True):
        np.testing.assert_allclose(g, w.transpose(1, 0, 2), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("storage_order", [0, 1])
def test_maxpool_indices_and_unpool(backend_name: str, storage_order: int) -> None:
    x = f32(2, 3, 7, 6)
    x[0, 0, :2, :2] = 5.0  # ties: the first in window order wins
    run_case(backend_name, "MaxPool", {"x": x}, outputs=2, kernel_shape=[5, 4], strides=[2, 1], pads=[2, 1, 2, 2],
             storage_order=storage_order, opset=12)
    values, idx = f32(1, 2, 2, 3), np.array([[[[0, 3, 5], [13, 14, 19]], [[20, 24, 27], [36, 42, 47]]]], np.int64)
    run_case(backend_name, "MaxUnpool", {"x": values, "i": idx}, kernel_shape=[2, 2], strides=[2, 2], opset=11)


def test_col2im(backend_name: str) -> None:
    run_case(backend_name, "Col2Im", {"x": f32(2, 3 * 6, 4 * 2)}, {"img": np.array([6, 7], np.int64),
                                                                   "blk": np.array([2, 3], np.int64)},
             strides=[2, 2], pads=[1, 0, 1, 1], dilations=[1, 2], opset=18, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group,offset_group", [(1, 1), (2, 2), (1, 2)])
def test_deform_conv(backend_name: str, group: int, offset_group: int) -> None:
    x, w = f32(2, 4, 5, 6), f32(4, 4 // group, 2, 3)
    oh, ow = 3, 1  # strides (2, 2), pads (1, 0, 1, 0), dilations (1, 2): (5 + 2 - 2) // 2 + 1, (6 - 5) // 2 + 1
    offset = (f32(2, offset_group * 6 * 2, oh, ow) * 1.5).astype(np.float32)
    mask = R.uniform(0, 1, (2, offset_group * 6, oh, ow)).astype(np.float32)
    run_case(backend_name, "DeformConv", {"x": x, "w": w, "o": offset, "b": f32(4), "m": mask}, group=group,
             offset_group=offset_group, strides=[2, 2], pads=[1, 0, 1, 0], dilations=[1, 2], opset=19, rtol=1e-4,
             atol=1e-5)


@pytest.mark.parametrize("m", [1, 2, 3, 4, 5])
def test_det(backend_name: str, m: int) -> None:
    run_case(backend_name, "Det", {"x": f32(3, m, m)}, opset=11, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("rule", ["linear", "gated", "delta", "gated_delta"])
def test_linear_attention(backend_name: str, rule: str) -> None:
    b, t, hq, hkv, dk, dv = 2, 3, 4, 2, 4, 3
    feeds = {"q": f32(b, t, hq * dk), "k": f32(b, t, hkv * dk) * 0.5, "v": f32(b, t, hkv * dv),
             "s": f32(b, hkv, dk, dv)}
    order = ["q", "k", "v", "s"]
    if rule in ("gated", "gated_delta"):
        feeds["g"] = -np.abs(f32(b, t, hkv * dk))
        order.append("g")
    else:
        order.append("")
    if rule in ("delta", "gated_delta"):
        feeds["beta"] = R.uniform(0, 1, (b, t, hkv)).astype(np.float32)
        order.append("beta")
    run_case(backend_name, "LinearAttention", feeds, outputs=2, order=order, update_rule=rule, q_num_heads=hq,
             kv_num_heads=hkv, opset=27, rtol=1e-4, atol=1e-5)


def test_maxpool_int(backend_name: str) -> None:
    x = R.integers(0, 255, (1, 2, 5, 5)).astype(np.uint8)
    run_case(backend_name, "MaxPool", {"x": x}, kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 1, 1], opset=12)

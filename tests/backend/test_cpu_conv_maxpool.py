"""Conv (+ its epilogue) followed by a MaxPool that is its only reader: the cpu backend runs both in one step
(record_conv_maxpool: bands of the conv's rows, each pooled in place). Against float64 references: the conv
from test_conv2d.conv_ref, the pooling written out window by window here; and the plan must fuse where it can
and not where the conv's output is read elsewhere."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import ember
from ember.backends.cpu import parallel

from .test_conv2d import conv_ref

_POOL = parallel.Pool(1)  # the caller and one worker: the bands split even where EMBER_CPU_THREADS=1


@pytest.fixture(autouse=True)
def two_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parallel, "pool", lambda: _POOL)
    monkeypatch.setattr(parallel, "SPLIT_MACS", 0)  # every conv here splits into bands


def pool_ref(x: np.ndarray, kernel, stride, pads, dilation=(1, 1), ceil: bool = False) -> np.ndarray:
    """MaxPool in float64, one window at a time (padding never wins; a window of padding only is -inf)."""
    n, c, h, w = x.shape
    (kh, kw), (sh, sw), (pt, pl, pb, pr), (dh, dw) = kernel, stride, pads, dilation
    out = []
    for size, k, s, d, lo, hi in ((h, kh, sh, dh, pt, pb), (w, kw, sw, dw, pl, pr)):
        span = size + lo + hi - ((k - 1) * d + 1)
        o = (-(-span // s) if ceil else span // s) + 1
        if ceil and (o - 1) * s >= size + lo:
            o -= 1
        out.append(o)
    y = np.full((n, c, *out), -np.inf)
    for i in range(out[0]):
        for j in range(out[1]):
            rows = [i * sh + a * dh - pt for a in range(kh)]
            cols = [j * sw + b * dw - pl for b in range(kw)]
            rows = [r for r in rows if 0 <= r < h]
            cols = [q for q in cols if 0 <= q < w]
            if rows and cols:
                y[:, :, i, j] = x[:, :, rows][:, :, :, cols].max(axis=(2, 3))
    return y


def build(x_shape, w, b, conv: dict, pool: dict, act: str | None, conv_out: bool) -> onnx.ModelProto:
    nodes = [helper.make_node("Conv", ["x", "w"] + (["b"] if b is not None else []), ["c"], **conv)]
    last = "c"
    if act:
        nodes.append(helper.make_node(act, ["c"], ["a"]))
        last = "a"
    nodes.append(helper.make_node("MaxPool", [last], ["y"], **pool))
    outs = [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]
    if conv_out:
        outs.append(helper.make_tensor_value_info(last, onnx.TensorProto.FLOAT, None))
    inits = [numpy_helper.from_array(w, "w")] + ([numpy_helper.from_array(b, "b")] if b is not None else [])
    graph = helper.make_graph(nodes, "conv_pool", [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                                  x_shape)], outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


CASES = [
    # x shape, (K, R, S), conv attrs, pool attrs, act
    ((1, 3, 45, 38), (16, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3]),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), "Relu"),  # a ResNet stem
    ((2, 3, 33, 29), (8, 7, 7), dict(strides=[2, 2], pads=[3, 2, 1, 3]),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), "Relu"),  # batch 2, odd sizes and pads
    ((1, 4, 30, 31), (12, 3, 3), dict(pads=[1, 1, 1, 1]),
     dict(kernel_shape=[2, 2], strides=[2, 2]), None),  # no epilogue, no pool padding
    ((1, 5, 27, 26), (9, 3, 3), dict(strides=[1, 2], pads=[0, 1, 2, 1]),
     dict(kernel_shape=[3, 2], strides=[2, 1], pads=[1, 0, 0, 1], ceil_mode=1), "Sigmoid"),  # ceil mode
    ((1, 6, 24, 24), (10, 3, 3), dict(pads=[1, 1, 1, 1], dilations=[2, 1]),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[2, 2, 2, 2], dilations=[2, 2]), "Relu"),  # dilated both
    ((1, 2, 14, 14), (4, 3, 3), dict(pads=[1, 1, 1, 1]),
     dict(kernel_shape=[2, 2], strides=[3, 3], pads=[1, 1, 1, 1]), "Relu"),  # windows reading a pad row only
    ((1, 3, 20, 23), (8, 3, 3), dict(pads=[1, 1, 1, 1]),
     dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 2, 2, 2]), "Relu"),  # edge columns both sides
    ((1, 3, 17, 19), (8, 3, 3), dict(pads=[1, 0, 1, 0]),
     dict(kernel_shape=[1, 3], strides=[1, 1], pads=[0, 1, 0, 1]), None),  # one row per window, stride 1
    ((1, 3, 17, 19), (8, 3, 3), dict(pads=[1, 0, 1, 0]),
     dict(kernel_shape=[4, 1], strides=[3, 2], pads=[2, 0, 1, 0], ceil_mode=1), "Relu"),  # one column per window
]


@pytest.mark.parametrize("with_bias", [True, False])
@pytest.mark.parametrize("xs,ws,conv,pool,act", CASES)
def test_conv_maxpool_fused(xs, ws, conv, pool, act, with_bias: bool) -> None:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((ws[0], xs[1], *ws[1:])) * 0.2).astype(np.float32)
    b = rng.standard_normal(ws[0]).astype(np.float32) if with_bias else None
    model = ember.load_onnx(build(xs, w, b, conv, pool, act, False).SerializeToString(), backend="cpu")
    got = model.run({"x": x})["y"]
    pads = tuple(conv.get("pads", [0, 0, 0, 0]))
    c = conv_ref(x, w, b, tuple(conv.get("strides", [1, 1])), pads, tuple(conv.get("dilations", [1, 1])))
    if act == "Relu":
        c = np.maximum(c, 0)
    elif act == "Sigmoid":
        c = 1 / (1 + np.exp(-c))
    want = pool_ref(c, tuple(pool["kernel_shape"]), tuple(pool["strides"]), tuple(pool.get("pads", [0, 0, 0, 0])),
                    tuple(pool.get("dilations", [1, 1])), bool(pool.get("ceil_mode", 0)))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    assert model.plan_info({"x": x}).get("conv.maxpool") == 1


def test_conv_read_elsewhere_is_not_fused() -> None:
    """The conv's output is also a graph output: computed whole, the pooling separate."""
    rng = np.random.default_rng(8)
    xs, conv, pool = CASES[0][0], CASES[0][2], CASES[0][3]
    x = rng.standard_normal(xs).astype(np.float32)
    w = (rng.standard_normal((16, 3, 7, 7)) * 0.2).astype(np.float32)
    model = ember.load_onnx(build(xs, w, None, conv, pool, "Relu", True).SerializeToString(), backend="cpu")
    out = model.run({"x": x})
    c = np.maximum(conv_ref(x, w, None, (2, 2), (3, 3, 3, 3)), 0)
    np.testing.assert_allclose(out["a"], c, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out["y"], pool_ref(c, (3, 3), (2, 2), (1, 1, 1, 1)), rtol=1e-4, atol=1e-5)
    assert not model.plan_info({"x": x}).get("conv.maxpool")


def test_nan_propagates_through_fused_pool() -> None:
    rng = np.random.default_rng(9)
    xs, conv, pool = CASES[0][0], CASES[0][2], CASES[0][3]
    x = rng.standard_normal(xs).astype(np.float32)
    x[0, 1, 20, 20] = np.nan
    w = (rng.standard_normal((16, 3, 7, 7)) * 0.2).astype(np.float32)
    got = ember.load_onnx(build(xs, w, None, conv, pool, "Relu", False).SerializeToString(),
                          backend="cpu").run({"x": x})["y"]
    want = pool_ref(np.maximum(conv_ref(x, w, None, (2, 2), (3, 3, 3, 3)), 0), (3, 3), (2, 2), (1, 1, 1, 1))
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got).any()
    np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-4, atol=1e-5)

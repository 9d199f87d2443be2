"""com.microsoft Attention and EmbedLayerNormalization (ops/ms_attention.py) against ONNX Runtime CPU on every
backend: the mask as lengths, as a raw 2-D/3-D mask, unidirectional with past and present, attention_bias,
different value heads; the unsupported mask formats named."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

ort = pytest.importorskip("onnxruntime")
H, HEADS, HIN = 16, 2, 12
F, I32 = TensorProto.FLOAT, TensorProto.INT32


def attention_model(mask: str | None = None, past: bool = False, unidirectional: int = 0, bias_input: bool = False,
                    sizes: list[int] | None = None) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    sizes = sizes or [H, H, H]
    w = numpy_helper.from_array((rng.standard_normal((HIN, sum(sizes))) * 0.3).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(sum(sizes)).astype(np.float32) * 0.1, "b")
    ins = [helper.make_tensor_value_info("x", F, ["B", "S", HIN])]
    names = ["x", "w", "b"]
    if mask == "lengths":
        ins.append(helper.make_tensor_value_info("m", I32, ["B"]))
    elif mask == "raw2d":
        ins.append(helper.make_tensor_value_info("m", I32, ["B", "T"]))
    elif mask == "raw3d":
        ins.append(helper.make_tensor_value_info("m", I32, ["B", "S", "T"]))
    names.append("m" if mask else "")
    if past:
        ins.append(helper.make_tensor_value_info("past", F, [2, "B", HEADS, "P", H // HEADS]))
    names.append("past" if past else "")
    if bias_input:
        ins.append(helper.make_tensor_value_info("ab", F, [1, HEADS, "S", "T"]))
        names.append("ab")
    while names and not names[-1]:
        names.pop()
    outs = ["y"] + (["present"] if past else [])
    attrs: dict = {"num_heads": HEADS, "unidirectional": unidirectional}
    if sizes != [H, H, H]:
        attrs["qkv_hidden_sizes"] = sizes
    node = helper.make_node("Attention", names, outs, domain="com.microsoft", name="att", **attrs)
    graph = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(o, F, None) for o in outs], [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft",
                                                                                                    1)])


def compare(m: onnx.ModelProto, backend: str, cases: list[dict]) -> None:
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    em = ember.load_onnx(m, backend=backend)
    for f in cases:
        for o, w in zip(em.outputs, sess.run(None, f), strict=True):
            np.testing.assert_allclose(em.run(f)[o.name], w, rtol=1e-5, atol=1e-5, err_msg=o.name)


def x(rng: np.random.Generator, b: int, s: int) -> np.ndarray:
    return rng.standard_normal((b, s, HIN)).astype(np.float32)


def test_mask_as_lengths_and_raw(backend_name: str) -> None:
    rng = np.random.default_rng(1)
    compare(attention_model("lengths"), backend_name, [{"x": x(rng, 2, 5), "m": np.array([5, 3], np.int32)}])
    raw = np.ones((2, 5), np.int32)
    raw[1, 2:] = 0
    compare(attention_model("raw2d"), backend_name, [{"x": x(rng, 2, 5), "m": raw}])
    raw3 = np.tril(np.ones((5, 5), np.int32))[None].repeat(2, 0)
    compare(attention_model("raw3d"), backend_name, [{"x": x(rng, 2, 5), "m": raw3}])


def test_unidirectional_with_past_and_present(backend_name: str) -> None:
    rng = np.random.default_rng(2)
    past = rng.standard_normal((2, 2, HEADS, 4, H // HEADS)).astype(np.float32)
    compare(attention_model(past=True, unidirectional=1), backend_name,
            [{"x": x(rng, 2, 1), "past": past}, {"x": x(rng, 2, 3), "past": past}])


def test_attention_bias_and_value_heads_of_another_size(backend_name: str) -> None:
    rng = np.random.default_rng(3)
    compare(attention_model(bias_input=True), backend_name,
            [{"x": x(rng, 1, 4), "ab": rng.standard_normal((1, HEADS, 4, 4)).astype(np.float32)}])
    compare(attention_model(sizes=[H, H, 8]), backend_name, [{"x": x(rng, 2, 3)}])


def test_left_padding_mask_index_is_named() -> None:
    m = attention_model("lengths")
    m.graph.input[1].type.tensor_type.shape.dim[0].dim_param = "M"  # 2 * batch entries: ends, then starts
    em = ember.load_onnx(m, backend="cpu")
    with pytest.raises(NotImplementedError, match=r"Attention .*node 'att'\): a mask_index of shape \[4\]"):
        em.run({"x": np.zeros((2, 3, HIN), np.float32), "m": np.array([3, 3, 0, 0], np.int32)})


def mha_model(mask: str | None = None, past: bool = False, bias: bool = False, cross4d: bool = False,
              unidirectional: int = 0) -> onnx.ModelProto:
    hd = H // HEADS
    ins = [helper.make_tensor_value_info("q", F, ["B", "S", H])]
    if cross4d:
        ins += [helper.make_tensor_value_info(n, F, ["B", HEADS, "L", hd]) for n in ("k", "v")]
    else:
        ins += [helper.make_tensor_value_info(n, F, ["B", "L", H]) for n in ("k", "v")]
    names = ["q", "k", "v", "bias" if bias else ""]
    inits = [numpy_helper.from_array(np.random.default_rng(4).standard_normal(3 * H).astype(np.float32), "bias")] \
        if bias else []
    if mask == "lengths":
        ins.append(helper.make_tensor_value_info("m", I32, ["B"]))
    elif mask == "raw2d":
        ins.append(helper.make_tensor_value_info("m", I32, ["B", "T"]))
    names.append("m" if mask else "")
    names.append("")  # attention_bias
    if past:
        ins += [helper.make_tensor_value_info(n, F, ["B", HEADS, "P", hd]) for n in ("pk", "pv")]
        names += ["pk", "pv"]
    while not names[-1]:
        names.pop()
    outs = ["y"] + (["present_k", "present_v"] if past else [])
    node = helper.make_node("MultiHeadAttention", names, outs, domain="com.microsoft", num_heads=HEADS,
                            unidirectional=unidirectional)
    graph = helper.make_graph([node], "g", ins, [helper.make_tensor_value_info(o, F, None) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft",
                                                                                                    1)])


@pytest.mark.parametrize("variant", [{}, {"bias": True}, {"mask": "lengths"}, {"mask": "raw2d"},
                                     {"past": True, "unidirectional": 1}, {"cross4d": True}],
                         ids=lambda v: "-".join(f"{k}" for k in v) or "plain")
def test_multi_head_attention(backend_name: str, variant: dict) -> None:
    rng = np.random.default_rng(5)
    b, s, length = 2, 3, 3 if variant.get("past") else 5
    f = {"q": rng.standard_normal((b, s, H)).astype(np.float32)}
    shape = (b, HEADS, length, H // HEADS) if variant.get("cross4d") else (b, length, H)
    f |= {n: rng.standard_normal(shape).astype(np.float32) for n in ("k", "v")}
    if variant.get("mask") == "lengths":
        f["m"] = np.array([5, 2], np.int32)
    elif variant.get("mask") == "raw2d":
        f["m"] = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], np.int32)
    if variant.get("past"):
        f |= {n: rng.standard_normal((b, HEADS, 4, H // HEADS)).astype(np.float32) for n in ("pk", "pv")}
    compare(mha_model(**variant), backend_name, [f])

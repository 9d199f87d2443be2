"""com.microsoft GroupQueryAttention (ops/gqa.py) against ONNX Runtime CPU on every backend: prefill and decode
with a past, grouped heads, rotary inside, a local window, softcap, packed QKV, and batches whose entries have
different valid lengths (ONNX Runtime's present layout: valid past, new tokens, zeros)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

ort = pytest.importorskip("onnxruntime")
HQ, HKV, D = 4, 2, 16  # ONNX Runtime's CPU kernel wants head sizes that are multiples of 16


def gqa_model(rotary: bool = False, window: int = -1, softcap: float = 0.0, packed: bool = False) -> onnx.ModelProto:
    ins = ["q", "" if packed else "k", "" if packed else "v", "pk", "pv", "sk", "tot"] + (["cos", "sin"] if rotary
                                                                                           else [])
    attrs: dict = {"num_heads": HQ, "kv_num_heads": HKV, "do_rotary": int(rotary), "local_window_size": window}
    if softcap:
        attrs["softcap"] = softcap
    node = helper.make_node("GroupQueryAttention", ins, ["y", "present_k", "present_v"], domain="com.microsoft",
                            name="gqa", **attrs)
    f = TensorProto.FLOAT
    vis = [helper.make_tensor_value_info("q", f, ["B", "S", (HQ + 2 * HKV) * D if packed else HQ * D])]
    if not packed:
        vis += [helper.make_tensor_value_info(n, f, ["B", "S", HKV * D]) for n in ("k", "v")]
    vis += [helper.make_tensor_value_info(n, f, ["B", HKV, "P", D]) for n in ("pk", "pv")]
    vis += [helper.make_tensor_value_info("sk", TensorProto.INT32, ["B"]),
            helper.make_tensor_value_info("tot", TensorProto.INT32, [])]
    inits = []
    if rotary:
        angle = np.arange(64)[:, None] / (10000 ** (np.arange(D // 2)[None] / (D // 2)))
        inits = [numpy_helper.from_array(np.cos(angle).astype(np.float32), "cos"),
                 numpy_helper.from_array(np.sin(angle).astype(np.float32), "sin")]
    outs = [helper.make_tensor_value_info(n, f, None) for n in ("y", "present_k", "present_v")]
    return helper.make_model(helper.make_graph([node], "g", vis, outs, inits),
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])


def feeds(rng: np.random.Generator, b: int, s: int, p: int, packed: bool = False,
          lengths: list[int] | None = None) -> dict[str, np.ndarray]:
    f = {"q": rng.standard_normal((b, s, (HQ + 2 * HKV if packed else HQ) * D)).astype(np.float32)}
    if not packed:
        f |= {n: rng.standard_normal((b, s, HKV * D)).astype(np.float32) for n in ("k", "v")}
    f |= {n: rng.standard_normal((b, HKV, p, D)).astype(np.float32) for n in ("pk", "pv")}
    f["sk"] = np.array(lengths if lengths is not None else [p + s] * b, np.int32) - 1
    f["tot"] = np.array(p + s, np.int32)
    return f


@pytest.mark.parametrize("variant", [{}, {"rotary": True}, {"window": 3}, {"softcap": 2.0}, {"packed": True},
                                     {"rotary": True, "packed": True}], ids=lambda v: "-".join(v) or "plain")
def test_gqa_matches_onnxruntime(backend_name: str, variant: dict) -> None:
    m = gqa_model(**variant)
    sess = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    em = ember.load_onnx(m, backend=backend_name)
    rng = np.random.default_rng(0)
    cases = [feeds(rng, 1, 5, 0, variant.get("packed", False)), feeds(rng, 2, 1, 5, variant.get("packed", False)),
             feeds(rng, 1, 3, 4, variant.get("packed", False))]
    if not variant.get("packed"):
        cases.append(feeds(rng, 3, 1, 6, lengths=[7, 5, 6]))  # entries of different valid lengths
    for f in cases:
        want = sess.run(None, f)
        got = em.run(f)
        for name, w in zip(("y", "present_k", "present_v"), want, strict=True):
            np.testing.assert_allclose(got[name], w, rtol=1e-5, atol=1e-5, err_msg=f"{name} {f['q'].shape}")


def test_shared_past_and_present_buffer_is_refused() -> None:
    em = ember.load_onnx(gqa_model(), backend="cpu")
    f = feeds(np.random.default_rng(1), 1, 1, 8)
    f["tot"] = np.array(6, np.int32)  # fits in the 8-long past: ONNX Runtime's shared-buffer mode
    with pytest.raises(NotImplementedError, match=r"past \(8\) and present share one max-length buffer"):
        em.run(f)


def test_heads_that_do_not_group_are_refused_at_load() -> None:
    m = gqa_model()
    for a in m.graph.node[0].attribute:
        if a.name == "kv_num_heads":
            a.i = 3
    with pytest.raises(ValueError, match=r"num_heads \(4\) must be a positive multiple of kv_num_heads \(3\)"):
        ember.load_onnx(m, backend="cpu")


def test_total_sequence_length_that_disagrees_is_named() -> None:
    em = ember.load_onnx(gqa_model(), backend="cpu")
    f = feeds(np.random.default_rng(2), 1, 2, 3)
    f["tot"] = np.array(9, np.int32)
    with pytest.raises(ValueError, match=r"total_sequence_length is 9, but past \(3\) \+ new \(2\) = 5"):
        em.run(f)

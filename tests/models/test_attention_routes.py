"""The two fast arms of ember's attention: the flash kernel (short sequences) and GEMM + fused softmax + GEMM
with the scale and the mask in the first GEMM's epilogue (long sequences, where the tiled GEMMs are faster).

Both arms must give ONNX Runtime's numbers for every mask form (none, additive, boolean, causal, GQA); the
threshold is lowered here so that CI-sized shapes take the GEMM arm, and the counters prove which arm ran.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ember
from ember import settings
from ember.backends import attention_arm

CASES = {
    # name: (q, k, v shapes, mask shape and dtype or None, attributes)
    "plain": ((2, 3, 40, 16), (2, 3, 40, 16), (2, 3, 40, 16), None, {}),
    "causal": ((1, 2, 33, 8), (1, 2, 33, 8), (1, 2, 33, 8), None, {"is_causal": 1}),
    "additive_mask": ((2, 2, 24, 8), (2, 2, 30, 8), (2, 2, 30, 8), ((2, 1, 24, 30), TensorProto.FLOAT), {}),
    "bool_mask_gqa": ((1, 4, 20, 8), (1, 2, 20, 8), (1, 2, 20, 8), ((20, 20), TensorProto.BOOL), {}),
    "mask_and_causal": ((1, 2, 16, 8), (1, 2, 16, 8), (1, 2, 16, 8), ((1, 2, 16, 16), TensorProto.FLOAT),
                        {"is_causal": 1}),
}


def case(name: str) -> tuple:
    qs, ks, vs, mask, attrs = CASES[name]
    ins = [("q", qs, TensorProto.FLOAT), ("k", ks, TensorProto.FLOAT), ("v", vs, TensorProto.FLOAT)]
    if mask is not None:
        ins.append(("mask", mask[0], mask[1]))
    node = helper.make_node("Attention", [n for n, _, _ in ins], ["y"], **attrs)
    graph = helper.make_graph([node], name, [helper.make_tensor_value_info(n, t, s) for n, s, t in ins],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    rng = np.random.default_rng(5)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s, t in ins if t == TensorProto.FLOAT}
    if mask is not None:
        if mask[1] == TensorProto.BOOL:
            feeds["mask"] = rng.random(mask[0]) < 0.7
            feeds["mask"][:, 0] = True  # every query sees a key: ONNX Runtime gives NaN rows otherwise
        else:
            feeds["mask"] = np.where(rng.random(mask[0]) < 0.2, -np.inf, rng.standard_normal(mask[0])).astype(
                np.float32)
            feeds["mask"][..., 0] = 0.0
    return model, feeds


def reference(model: object, feeds: dict) -> np.ndarray:
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # an ONNX Runtime without an Attention-23 kernel
        if "Attention" not in str(e):
            raise
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(model).run(None, feeds)[0]
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("arm", ["fused", "gemm"])
@pytest.mark.parametrize("name", list(CASES))
def test_attention_arms_match_onnxruntime(name: str, arm: str, backend_name: str) -> None:
    model, feeds = case(name)
    want = reference(model, feeds)
    with settings.override(attention="gemm" if arm == "gemm" else None):
        m = ember.load_onnx(model, backend=backend_name)
    got = m.run(feeds)["y"]
    err = float(np.abs(got - want).max())
    assert err <= 1e-4 * float(np.abs(want).max()) + 1e-5, err
    stats = m.stats()
    assert stats[f"attention.{arm}"] == 1 and stats["attention.fallback"] == 0, stats


def test_flash_pays_rule() -> None:
    assert attention_arm.flash_pays(1, 12, 128, 128, 4)  # BERT-sized: the flash kernel
    assert not attention_arm.flash_pays(4, 16, 512, 1024, 4)  # long: the GEMMs
    assert not attention_arm.flash_pays(1, 8, 1, 4096, 4)  # decoding over a long cache: the GEMMs spread it
    assert attention_arm.flash_pays(1, 8, 1, 512, 4)  # decoding over a short one: one kernel
    assert attention_arm.flash_pays(64, 64, 8192, 8192, 4)  # a 1 TB scores buffer: never materialised


def test_forced_arm_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_ATTENTION", "sparse")
    model, _ = case(next(iter(CASES)))
    with pytest.raises(ValueError, match=r"EMBER_ATTENTION='sparse': expected one of \('flash', 'gemm'\)"):
        ember.load_onnx(model, backend="cpu")

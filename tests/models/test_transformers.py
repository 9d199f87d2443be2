"""Transformer blocks exported from torch land on ember's fused kernels, match ONNX Runtime, and count it."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

from . import transformers as tr

CASES = {
    # name: (builder, inputs, expected fused counts per run); Softmax is inside the fused attention
    "bert2": (lambda: tr.build_bert(layers=2), lambda: tr.bert_inputs(2, 48),
              {"layernorm.fused": 4, "gelu.fused": 2, "attention.fused": 2}),
    "llama": (tr.build_llama_layer, lambda: tr.llama_inputs(2, 40),
              {"rmsnorm.fused": 2, "attention.fused": 1}),
    "llama_gqa": (lambda: tr.build_llama_layer(kv_heads=2), lambda: tr.llama_inputs(1, 24),
                  {"rmsnorm.fused": 2, "attention.fused": 1}),
}


def ort_run(path: str, feeds: dict) -> np.ndarray:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


@pytest.fixture(scope="module")
def exported() -> dict:
    out = {}
    for name, (build, inputs, counts) in CASES.items():
        feeds = inputs()
        out[name] = (tr.export(build(), feeds, name), feeds, counts)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_block_matches_ort_and_takes_fused_arms(exported, name, backend_name) -> None:
    path, feeds, counts = exported[name]
    model = ember.load_onnx(path, backend=backend_name)
    want = ort_run(path, feeds)
    got = model.run(feeds)["y"]
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max() + 1e-5
    stats = model.stats()
    for key, n in counts.items():
        pattern = key.split(".")[0]
        assert stats[key] == n, (key, stats)
        assert stats[f"{pattern}.fallback"] == 0, stats
    model.run(feeds)
    assert all(model.stats()[k] == 2 * v for k, v in stats.items())  # +1 per occurrence per run


def test_counters_are_per_model_and_thread_safe(exported, backend_name) -> None:
    path, feeds, counts = exported["bert2"]
    a = ember.load_onnx(path, backend=backend_name)
    b = ember.load_onnx(path, backend=backend_name)
    runs, threads = 3, 4

    def work() -> None:
        for _ in range(runs):
            a.run(feeds)

    pool = [threading.Thread(target=work) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    per_run = {k: v for k, v in a.stats().items()}
    assert per_run["layernorm.fused"] == counts["layernorm.fused"] * runs * threads
    assert all(v == 0 for v in b.stats().values())  # the other model counted nothing


def _single_op_model(node: onnx.NodeProto, inputs: dict[str, np.ndarray], out_shape: list, opset: int,
                     inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    ins = [helper.make_tensor_value_info(k, TensorProto.FLOAT, list(v.shape)) for k, v in inputs.items()]
    outs = [helper.make_tensor_value_info(node.output[0], TensorProto.FLOAT, out_shape)]
    init = [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()]
    return helper.make_model(helper.make_graph([node], "g", ins, outs, init),
                             opset_imports=[helper.make_opsetid("", opset)])


def test_onnx_layernorm_gelu_rmsnorm_ops_directly(backend_name) -> None:
    rng = np.random.default_rng()
    x = (rng.standard_normal((3, 5, 64)) * 3 + 1).astype(np.float32)
    g, b = rng.random(64).astype(np.float32) + 0.5, rng.standard_normal(64).astype(np.float32)
    cases = [
        (helper.make_node("LayerNormalization", ["x", "g", "b"], ["y"], epsilon=1e-5), 17, "layernorm",
         lambda: ((x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)) * g + b),
        (helper.make_node("Gelu", ["x"], ["y"]), 20, "gelu",
         lambda: 0.5 * x * (1 + np.vectorize(__import__("math").erf)(x / np.sqrt(2)))),
        (helper.make_node("Gelu", ["x"], ["y"], approximate="tanh"), 20, "gelu",
         lambda: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))),
        (helper.make_node("RMSNormalization", ["x", "g"], ["y"], epsilon=1e-6), 23, "rmsnorm",
         lambda: x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * g),
    ]
    for node, opset, pattern, ref in cases:
        inits = {k: v for k, v in (("g", g), ("b", b)) if k in node.input}
        model = ember.load_onnx(_single_op_model(node, {"x": x}, list(x.shape), opset, inits), backend=backend_name)
        got = model.run({"x": x})["y"]
        want = ref()
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max(), node.op_type
        assert model.stats()[f"{pattern}.fused"] == 1 and model.stats()[f"{pattern}.fallback"] == 0

"""Pattern recognition: tiny models, each holding one spelling of a transformer pattern, exported from torch at test
time (or, for the ONNX Attention op, built with onnx.helper), run on every backend, compared with ONNX Runtime CPU,
and counted: the fused arm once per occurrence per run and no fallback.

The spellings are the ones the blocks in transformers.py do not use: GELU in its tanh form and as torch.nn.GELU,
RMSNorm dividing by the root rather than multiplying by its reciprocal, attention scaled by a Mul with 1/√d and no
mask, and ONNX's own Attention-23 (4-D and 3-D with grouped-query heads).
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import ember

from . import transformers as tr
from .zoo import _cached

# Exports are cached by name (and transformers.py's digest): this file's digest in the name keeps them current.
VERSION = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:8]


def torch_modules() -> dict[str, Any]:
    import torch

    nn = torch.nn

    class LinearGeluTanh(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 32)

        def forward(self, x: Any) -> Any:
            h = self.fc(x)
            return 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h**3)))

    class LinearGeluErf(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 32)
            self.act = nn.GELU()

        def forward(self, x: Any) -> Any:
            return self.act(self.fc(x))

    class RMSNormDiv(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(24))

        def forward(self, x: Any) -> Any:
            return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight

    class AttentionMulScale(nn.Module):
        heads, hd = 2, 8

        def __init__(self) -> None:
            super().__init__()
            self.q, self.k, self.v = (nn.Linear(16, 16) for _ in range(3))

        def forward(self, x: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = (p(x).reshape(b, s, self.heads, self.hd).transpose(1, 2) for p in (self.q, self.k, self.v))
            scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(self.hd))
            return (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, 16)

    return {"gelu_tanh": LinearGeluTanh, "gelu_erf": LinearGeluErf, "rmsnorm_div": RMSNormDiv,
            "attention_mul": AttentionMulScale}


def build(name: str) -> Any:
    import torch

    torch.manual_seed(0)
    model = torch_modules()[name]().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.5)
    return model


INPUT_SHAPES = {"gelu_tanh": (2, 5, 16), "gelu_erf": (2, 5, 16), "rmsnorm_div": (3, 7, 24),
                "attention_mul": (2, 6, 16)}
EXPECTED = {"gelu_tanh": {"gelu.fused": 1}, "gelu_erf": {"gelu.fused": 1}, "rmsnorm_div": {"rmsnorm.fused": 1},
            "attention_mul": {"attention.fused": 1}}


def feeds_for(shape: tuple[int, ...]) -> dict[str, np.ndarray]:
    return {"x": (2.0 * np.random.default_rng(7).standard_normal(shape)).astype(np.float32)}


def run_and_check(path: Path, feeds: dict[str, np.ndarray], backend_name: str, expected: dict[str, int],
                  want: np.ndarray) -> ember.Model:
    """Run twice on ember: matches `want`, the expected fused counts (+1 per occurrence per run), no fallback."""
    model = ember.load_onnx(path, backend=backend_name)
    for run in (1, 2):
        got = model.run(feeds)["y"]
        diff = float(np.abs(got - want).max())
        assert diff <= 1e-4 * float(np.abs(want).max()) + 1e-5, (run, diff, float(np.abs(want).max()))
        stats = model.stats()
        for key, n in expected.items():
            assert stats[key] == run * n, (key, stats, [f"{n.op_type}:{n.domain}" for n in model.graph.nodes])
        fallbacks = {k: v for k, v in stats.items() if k.endswith(".fallback") and v}
        assert not fallbacks, fallbacks
    return model


@pytest.mark.parametrize("name", list(EXPECTED))
def test_torch_pattern(name: str, backend_name: str) -> None:
    feeds = feeds_for(INPUT_SHAPES[name])
    path = tr.export(build(name), feeds, f"pattern-{name}-{VERSION}")
    want = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    model = run_and_check(path, feeds, backend_name, EXPECTED[name], want)
    if name == "gelu_tanh":
        # The GELU lands in the Linear's MatMul epilogue (with the bias), not a kernel of its own.
        assert model.plan_info()["epilogue.fused"] >= 1, model.plan_info()


# ---- ONNX Attention-23, built directly -------------------------------------------------------------------------------
ATTENTION_CASES = {
    # name: (q shape, k shape, v shape, attributes)
    "attn23_4d_causal": ((2, 3, 7, 8), (2, 3, 7, 8), (2, 3, 7, 8), {"is_causal": 1}),
    "attn23_4d_causal_gqa": ((1, 4, 6, 16), (1, 2, 6, 16), (1, 2, 6, 16), {"is_causal": 1}),
    "attn23_3d_gqa": ((2, 5, 4 * 8), (2, 9, 2 * 8), (2, 9, 2 * 8), {"q_num_heads": 4, "kv_num_heads": 2}),
    "attn23_3d_gqa_causal": ((1, 6, 6 * 4), (1, 6, 2 * 4), (1, 6, 2 * 4),
                             {"q_num_heads": 6, "kv_num_heads": 2, "is_causal": 1}),
}


def attention23(name: str) -> Path:
    qs, ks, vs, attrs = ATTENTION_CASES[name]

    def write(path: Path) -> None:
        node = helper.make_node("Attention", ["q", "k", "v"], ["y"], **attrs)
        ys = qs  # every case has the same head size for q and v
        graph = helper.make_graph(
            [node], name,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in (("q", qs), ("k", ks), ("v", vs))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, ys)])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
        model.ir_version = 10
        onnx.checker.check_model(model)
        onnx.save(model, str(path))

    return _cached(f"pattern-{name}-{VERSION}", write)


def attention23_reference(path: Path, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """ONNX Runtime CPU; onnx's ReferenceEvaluator only where this ONNX Runtime has no Attention-23 kernel."""
    try:
        sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as e:  # NOT_IMPLEMENTED: no kernel for Attention(23)
        if "Attention" not in str(e):
            raise
        from onnx.reference import ReferenceEvaluator

        return ReferenceEvaluator(str(path)).run(None, feeds)[0]
    return sess.run(None, feeds)[0]


@pytest.mark.parametrize("name", list(ATTENTION_CASES))
def test_onnx_attention23(name: str, backend_name: str) -> None:
    qs, ks, vs, _ = ATTENTION_CASES[name]
    rng = np.random.default_rng(11)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in (("q", qs), ("k", ks), ("v", vs))}
    path = attention23(name)
    run_and_check(path, feeds, backend_name, {"attention.fused": 1}, attention23_reference(path, feeds))

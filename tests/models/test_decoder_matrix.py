"""Decoders with a KV cache in the fusion matrix (issue 15): GPT-2, LLaMA and Qwen2 from transformers configs
(random weights, vector parameters jittered), exported with `use_cache=True` by tests/models/decoders.py
(`past_<layer>_<k|v>` in, `present_<layer>_<k|v>` out) with both torch exporters, run a prefill and two decode
steps with each runtime's presents fed back to it, on ember and ONNX Runtime CPU alike, at the architecture
matrix's tolerance, logits and presents alike (batch 2, the second row's last two prompt tokens padded). Every run
takes the fused attention / RMSNorm / LayerNorm / GELU arms and reports no near miss.

ONNX Runtime's own transformer optimizer (onnxruntime.transformers.optimizer) rewrites a GPT-2 export and a RoBERTa
with eager attention into com.microsoft SkipLayerNormalization / FastGelu / BiasGelu / Attention ops: the optimized
models give ONNX Runtime's numbers on ember, and their fused ops count as ember's fused arms.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import onnx
import pytest

import ember

from . import architectures as arch_mod
from . import decoders
from .decoders import Decoder
from .test_architectures import PATTERNS, SIZES, _close, _compare, native_counts

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

DECODERS = {"gpt2": Decoder("gpt2", jitter=True), "llama": Decoder("llama", kv_heads=2, jitter=True),
            "qwen2": Decoder("qwen2", kv_heads=2, jitter=True)}
# Fused blocks per run: 2 norms per layer + the final one; GPT-2's gelu_new (tanh) per layer; attention per layer.
EXPECTED = {"gpt2": {"layernorm": 5, "gelu": 2, "attention": 2}, "llama": {"rmsnorm": 5, "attention": 2},
            "qwen2": {"rmsnorm": 5, "attention": 2}}
PROMPT = np.array([[3, 141, 59, 26, 5], [77, 12, 410, 9, 240]], np.int64)
STEPS = 2  # decode steps after the prompt


def _runs(cfg: Decoder, exporter: str) -> list[np.ndarray]:
    """The input_ids of each run: the prompt at once, then one token per step. The TorchScript exporter bakes the
    traced sequence length of 1 into LLaMA's and Qwen2's attention (ONNX Runtime fails a longer prompt too): their
    exports read the prompt a token a run."""
    if exporter == "torchscript" and cfg.arch != "gpt2":
        return [PROMPT[:, i:i + 1] for i in range(PROMPT.shape[1])]
    return [PROMPT]


def decode(model: ember.Model, sess: Any, cfg: Decoder, exporter: str, label: str) -> tuple[int, dict]:
    """Prefill and STEPS greedy steps on both runtimes, each fed its own presents; asserts every run's outputs and
    tokens agree. Returns the number of runs and the last run's feeds."""
    names = cfg.output_names()
    batch = PROMPT.shape[0]
    mask = np.ones((batch, PROMPT.shape[1]), np.int64)
    mask[1, -2:] = 0
    past_e: dict[str, Any] = cfg.past(batch, 0)
    past_o = dict(past_e)
    runs, total, feeds, token = _runs(cfg, exporter), 0, {}, PROMPT[:, :1]
    for step in range(len(runs) + STEPS):
        ids = runs[step] if step < len(runs) else token
        total += ids.shape[1]
        step_mask = mask[:, :total] if total <= mask.shape[1] else \
            np.concatenate([mask, np.ones((batch, total - mask.shape[1]), np.int64)], axis=1)
        feeds = {"input_ids": ids, "attention_mask": step_mask, **past_e}
        out_o = dict(zip(names, sess.run(names, {**feeds, **past_o}), strict=True))
        out_e = model.run(feeds)
        _close(out_e, out_o, f"{label} run {step}")
        assert out_e["present_0_k"].shape == (batch, cfg.kv_heads, total, cfg.head_dim)
        token = out_o["logits"][:, -1:].argmax(-1)
        assert (out_e["logits"][:, -1:].argmax(-1) == token).all(), f"{label} run {step}: tokens differ"
        past_e = {f"past{n[len('present'):]}": out_e[n] for n in names[1:]}
        past_o = {f"past{n[len('present'):]}": out_o[n] for n in names[1:]}
    return len(runs) + STEPS, feeds


def assert_fused(model: ember.Model, path: str | None, expected: dict[str, int], runs: int,
                 feeds: dict[str, np.ndarray]) -> None:
    """Each block rewritten (or a native op of the export), each run taking the fused arms, no near miss."""
    native = native_counts(path) if path else dict.fromkeys(PATTERNS, 0)
    stats = model.stats()
    for pattern in PATTERNS:
        if path:
            assert model.rewrites[f"{pattern}_fused"] + native[pattern] == expected.get(pattern, 0), \
                (pattern, model.rewrites, native)
        assert model.rewrites[f"{pattern}.near_miss"] == 0, model.rewrites.misses
        assert stats[f"{pattern}.fallback"] == 0, (pattern, stats)
        if pattern != "attention":
            assert stats[f"{pattern}.fused"] == expected.get(pattern, 0) * runs, (pattern, stats)
    assert stats["attention.fused"] + stats["attention.gemm"] == expected.get("attention", 0) * runs, stats
    assert model.plan_info(feeds)["fusion_misses"] == []


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("name", list(DECODERS))
def test_decoder_with_cache_matches_ort_and_fuses(name: str, exporter: str) -> None:
    cfg = DECODERS[name]
    path = str(decoders.export(cfg, exporter))
    model = ember.load_onnx(path, backend="cpu")
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    runs, feeds = decode(model, sess, cfg, exporter, f"{name}/{exporter}")
    assert_fused(model, path, EXPECTED[name], runs, feeds)


def test_decoder_with_cache_on_wgpu(wgpu_be: ember.ComputeBackend) -> None:
    """Qwen2 (grouped-query attention, RMSNorm) with its cache on wgpu (lavapipe here: one export), fused alike."""
    cfg = DECODERS["qwen2"]
    path = str(decoders.export(cfg, "dynamo"))
    model = ember.load_onnx(path, backend=wgpu_be)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    runs, feeds = decode(model, sess, cfg, "dynamo", "qwen2/dynamo on wgpu")
    assert_fused(model, path, EXPECTED["qwen2"], runs, feeds)


def _contrib_counts(model: onnx.ModelProto) -> dict[str, int]:
    return dict(Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft"))


def _ort_optimized(path: str, model_type: str) -> onnx.ModelProto:
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    return optimizer.optimize_model(path, model_type=model_type, num_heads=4, hidden_size=64, opt_level=0).model


def test_ort_optimized_gpt2_with_cache_runs_fused() -> None:
    """GPT-2 through the optimizer (model_type "gpt2"): SkipLayerNormalization (the LayerNorm after each residual
    add) and FastGelu; its attention stays the export's own, which ember fuses."""
    cfg = DECODERS["gpt2"]
    optimized = _ort_optimized(str(decoders.export(cfg, "torchscript")), "gpt2")
    assert _contrib_counts(optimized) == {"SkipLayerNormalization": 4, "FastGelu": 2}
    data = optimized.SerializeToString()
    model = ember.load_onnx(data, backend="cpu")
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    runs, feeds = decode(model, sess, cfg, "torchscript", "gpt2/ort-optimized")
    assert model.rewrites["attention_fused"] == 2
    assert_fused(model, None, EXPECTED["gpt2"], runs, feeds)


def test_ort_optimized_roberta_runs_fused() -> None:
    """RoBERTa with eager attention through the optimizer (model_type "bert"): com.microsoft Attention with the
    padding mask, SkipLayerNormalization and BiasGelu, on ember equal to ONNX Runtime, all counted as fused."""
    arch = arch_mod.ROBERTA_EAGER
    optimized = _ort_optimized(str(arch_mod.export(arch, "torchscript")), "bert")
    assert _contrib_counts(optimized) == {"Attention": 2, "SkipLayerNormalization": 4, "BiasGelu": 2}
    data = optimized.SerializeToString()
    model = ember.load_onnx(data, backend="cpu")
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch, length in SIZES["text"]:
        _compare(model, sess, arch.feeds(batch, length), f"roberta_eager/ort-optimized batch {batch}")
    assert_fused(model, None, {"layernorm": 5, "gelu": 2, "attention": 2}, len(SIZES["text"]), arch.feeds(1, 7))

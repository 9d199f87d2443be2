"""Fusion that survives what real exporters write: transformers models exported by torch.onnx (both exporters)
get ember's fused attention, proven by the counters, and give ONNX Runtime's numbers (padded batches included).
The TorchScript export of scaled_dot_product_attention scales Q and Kᵀ by sqrt(scale) each and guards the softmax
with Where(IsNaN(p), 0, p); the matcher takes both (onnx/optimize.py, fuse_attention)."""

from __future__ import annotations

import numpy as np
import pytest

import ember

from . import decoders, encoders

ort = pytest.importorskip("onnxruntime")


def test_hf_bert_sdpa_export_fuses_attention(backend_name: str) -> None:
    path = str(encoders.export())
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    model = ember.load_onnx(path, backend=backend_name)
    assert model.rewrites["attention_fused"] == encoders.BERT.layers
    padded = encoders.BERT.feeds(2, 8)
    padded["attention_mask"][1, 3:] = 0
    for feeds in (encoders.BERT.feeds(2, 8), padded):
        got = next(iter(model.run(feeds).values()))
        np.testing.assert_allclose(got, sess.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    assert model.stats()["attention.fused"] + model.stats()["attention.gemm"] == 2 * encoders.BERT.layers


@pytest.mark.parametrize("exporter", ["torchscript", "dynamo"])
@pytest.mark.parametrize("cfg", [decoders.GPT2, decoders.LLAMA], ids=["gpt2", "llama"])
def test_hf_decoder_exports_fuse_attention(cfg: decoders.Decoder, exporter: str) -> None:
    model = ember.load_onnx(str(decoders.export(cfg, exporter)), backend="cpu")
    assert model.rewrites["attention_fused"] == cfg.layers

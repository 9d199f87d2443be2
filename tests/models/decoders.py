"""Decoder LLMs as `transformers` builds them from a config (random weights, no downloads), exported to ONNX with a
KV cache: `input_ids`, `attention_mask`, `past_<layer>_<k|v>` in; `logits`, `present_<layer>_<k|v>` out; batch,
sequence and past length dynamic. Exported by either of torch.onnx.export's exporters and cached
(tests/models/zoo.py's cache), so a test run pays for an export once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .zoo import _cached, _quiet_export


@dataclass(frozen=True)
class Decoder:
    """A decoder's config: the architecture ("gpt2", "llama", "qwen2", "phi" or "gpt_neox") and its sizes;
    `jitter`: every vector parameter (norm gammas and betas, biases) moved off its initial value, so a fused norm
    that dropped its affine tail shows in the outputs."""

    arch: str
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 4
    ff: int = 128
    vocab: int = 500
    positions: int = 256
    jitter: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def input_names(self) -> list[str]:
        return ["input_ids", "attention_mask"] + [f"past_{i}_{kv}" for i in range(self.layers) for kv in "kv"]

    def output_names(self) -> list[str]:
        return ["logits"] + [f"present_{i}_{kv}" for i in range(self.layers) for kv in "kv"]

    def past(self, batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
        """A random KV cache of `length` positions (what a prompt of that length would have left)."""
        rng = np.random.default_rng(seed)
        shape = (batch, self.kv_heads, length, self.head_dim)
        return {f"past_{i}_{kv}": rng.standard_normal(shape).astype(np.float32)
                for i in range(self.layers) for kv in "kv"}


GPT2 = Decoder("gpt2")
LLAMA = Decoder("llama", heads=4, kv_heads=2)
QWEN2 = Decoder("qwen2", heads=4, kv_heads=2)
PHI = Decoder("phi")
GPT_NEOX = Decoder("gpt_neox")


def build(cfg: Decoder, seed: int = 0) -> Any:
    """The transformers model for `cfg`, in eval mode, with seeded random weights."""
    import torch
    import transformers

    torch.manual_seed(seed)
    if cfg.arch == "gpt2":
        config = transformers.GPT2Config(n_layer=cfg.layers, n_embd=cfg.hidden, n_head=cfg.heads, n_inner=cfg.ff,
                                         vocab_size=cfg.vocab, n_positions=cfg.positions)
        model = transformers.GPT2LMHeadModel(config)
    elif cfg.arch in ("llama", "qwen2"):  # the same config fields, under each family's class names
        prefix = {"llama": "Llama", "qwen2": "Qwen2"}[cfg.arch]
        config = getattr(transformers, f"{prefix}Config")(
            num_hidden_layers=cfg.layers, hidden_size=cfg.hidden, num_attention_heads=cfg.heads,
            num_key_value_heads=cfg.kv_heads, intermediate_size=cfg.ff, vocab_size=cfg.vocab,
            max_position_embeddings=cfg.positions)
        model = getattr(transformers, f"{prefix}ForCausalLM")(config)
    elif cfg.arch in ("phi", "gpt_neox"):  # rotary over part of each head (Phi's half, GPT-NeoX's quarter)
        cls = {"phi": "Phi", "gpt_neox": "GPTNeoX"}[cfg.arch]
        extra = {"num_key_value_heads": cfg.kv_heads} if cfg.arch == "phi" else {}
        config = getattr(transformers, f"{cls}Config")(
            num_hidden_layers=cfg.layers, hidden_size=cfg.hidden, num_attention_heads=cfg.heads,
            intermediate_size=cfg.ff, vocab_size=cfg.vocab, max_position_embeddings=cfg.positions, **extra)
        model = getattr(transformers, f"{cls}ForCausalLM")(config)
    else:
        raise ValueError(f"unknown decoder architecture {cfg.arch!r}")
    if cfg.jitter:
        with torch.no_grad():
            for p in model.parameters():
                if p.ndim == 1:
                    p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def _flat_cache_module(model: Any, layers: int) -> Any:
    """`model` taking and returning its KV cache as flat tensors (what an ONNX graph's inputs and outputs are)."""
    import torch
    from transformers import DynamicCache

    class FlatCache(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, *past: Any) -> tuple:
            cache = DynamicCache()
            for i in range(layers):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache,
                             use_cache=True)
            flat = []
            for layer in out.past_key_values.layers:
                flat += [layer.keys, layer.values]
            return (out.logits, *flat)

    return FlatCache().eval()


def export(cfg: Decoder, exporter: str = "torchscript", seed: int = 0) -> Path:
    """The cached ONNX export of `cfg` by torch.onnx.export's "torchscript" (dynamo=False) or "dynamo" exporter."""
    if exporter not in ("torchscript", "dynamo"):
        raise ValueError(f"unknown exporter {exporter!r}")
    spec = {k: v for k, v in asdict(cfg).items() if k != "jitter" or v}  # the older keys without jitter stand
    key = hashlib.sha256(json.dumps([spec, exporter, seed]).encode()).hexdigest()[:8]

    def write(path: Path) -> None:
        import torch

        module = _flat_cache_module(build(cfg, seed), cfg.layers)
        past = {k: torch.from_numpy(v) for k, v in cfg.past(1, 3).items()}
        args = (torch.tensor([[1]]), torch.ones(1, 4, dtype=torch.int64), *past.values())
        names_in, names_out = cfg.input_names(), cfg.output_names()
        with _quiet_export(), torch.no_grad():
            if exporter == "torchscript":
                axes = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "total"},
                        "logits": {0: "batch", 1: "seq"}}
                axes |= {n: {0: "batch", 2: "past"} for n in names_in[2:]}
                axes |= {n: {0: "batch", 2: "total"} for n in names_out[1:]}
                torch.onnx.export(module, args, str(path), input_names=names_in, output_names=names_out,
                                  dynamic_axes=axes, opset_version=17, dynamo=False)
            else:
                # An example dim of 1 would be specialised to 1: batch 2, two new tokens.
                past = {k: torch.from_numpy(v) for k, v in cfg.past(2, 3).items()}
                args = (torch.tensor([[1, 2], [3, 4]]), torch.ones(2, 5, dtype=torch.int64), *past.values())
                dyn = torch.export.Dim.DYNAMIC
                # The cache is forward's *past: one entry holding a tuple.
                shapes = ({0: dyn, 1: dyn}, {0: dyn, 1: dyn}, tuple({0: dyn, 2: dyn} for _ in names_in[2:]))
                program = torch.onnx.export(module, args, input_names=names_in, output_names=names_out,
                                            dynamic_shapes=shapes, opset_version=18, dynamo=True)
                program.save(str(path))

    return _cached(f"decoder-{cfg.arch}-{exporter}-{key}", write)

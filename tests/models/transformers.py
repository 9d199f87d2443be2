"""Transformer blocks defined in torch for tests and benchmarks: a BERT encoder and a LLaMA-style decoder layer.

Written as plain ops (no fused torch kernels), so the exported graphs hold the patterns ember must
recognise: LayerNorm as ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div, RMSNorm as Pow/ReduceMean/Add/Sqrt/
Reciprocal/Mul, GELU via Erf, attention as MatMul/Div/Add(mask)/Softmax/MatMul with Transpose/Reshape.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any

import numpy as np

from .zoo import _cached, _quiet_export


def _torch() -> Any:
    import torch

    return torch


def build_bert(layers: int = 2, hidden: int = 256, heads: int = 4, ff: int = 1024, seed: int = 0) -> Any:
    torch = _torch()
    nn = torch.nn

    class LayerNorm(nn.Module):
        # Spelled out so the export shows the decomposed pattern, not a LayerNormalization node.
        def __init__(self, d: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))
            self.bias = nn.Parameter(torch.zeros(d))

        def forward(self, x: Any) -> Any:
            mean = x.mean(-1, keepdim=True)
            var = (x - mean).pow(2).mean(-1, keepdim=True)
            return (x - mean) / torch.sqrt(var + 1e-12) * self.weight + self.bias

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv = nn.Linear(hidden, 3 * hidden)
            self.out = nn.Linear(hidden, hidden)
            self.ln1, self.ln2 = LayerNorm(hidden), LayerNorm(hidden)
            self.fc1, self.fc2 = nn.Linear(hidden, ff), nn.Linear(ff, hidden)

        def forward(self, x: Any, mask: Any) -> Any:
            b, s, _ = x.shape
            q, k, v = self.qkv(x).split(hidden, dim=-1)
            q, k, v = (t.reshape(b, s, heads, hidden // heads).transpose(1, 2) for t in (q, k, v))
            scores = q @ k.transpose(-1, -2) / math.sqrt(hidden // heads) + mask
            ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, hidden)
            x = self.ln1(x + self.out(ctx))
            h = self.fc1(x)
            h = 0.5 * h * (1.0 + torch.erf(h / math.sqrt(2.0)))
            return self.ln2(x + self.fc2(h))

    class Bert(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = nn.ModuleList(Layer() for _ in range(layers))

        def forward(self, x: Any, mask: Any) -> Any:
            for layer in self.layers:
                x = layer(x, mask)
            return x

    torch.manual_seed(seed)
    model = Bert().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
        for m in model.modules():
            if isinstance(m, LayerNorm):
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
    return model


def build_llama_layer(hidden: int = 256, heads: int = 8, kv_heads: int = 8, ff: int = 688, seed: int = 0) -> Any:
    """RMSNorm, rotary embedding, causal attention, SwiGLU MLP."""
    torch = _torch()
    nn = torch.nn
    hd = hidden // heads

    class RMSNorm(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.ones(d))

        def forward(self, x: Any) -> Any:
            return x * torch.reciprocal(torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)) * self.weight

    def rotate(x: Any) -> Any:
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return torch.cat((-x2, x1), dim=-1)

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.n1, self.n2 = RMSNorm(hidden), RMSNorm(hidden)
            self.q = nn.Linear(hidden, hidden, bias=False)
            self.k = nn.Linear(hidden, kv_heads * hd, bias=False)
            self.v = nn.Linear(hidden, kv_heads * hd, bias=False)
            self.o = nn.Linear(hidden, hidden, bias=False)
            self.gate = nn.Linear(hidden, ff, bias=False)
            self.up = nn.Linear(hidden, ff, bias=False)
            self.down = nn.Linear(ff, hidden, bias=False)

        def forward(self, x: Any, cos: Any, sin: Any, mask: Any) -> Any:
            b, s, _ = x.shape
            h = self.n1(x)
            q = self.q(h).reshape(b, s, heads, hd).transpose(1, 2)
            k = self.k(h).reshape(b, s, kv_heads, hd).transpose(1, 2)
            v = self.v(h).reshape(b, s, kv_heads, hd).transpose(1, 2)
            q, k = q * cos + rotate(q) * sin, k * cos + rotate(k) * sin
            if kv_heads != heads:
                k = k.repeat_interleave(heads // kv_heads, dim=1)
                v = v.repeat_interleave(heads // kv_heads, dim=1)
            scores = q @ k.transpose(-1, -2) / math.sqrt(hd) + mask
            a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, hidden)
            x = x + self.o(a)
            h = self.n2(x)
            g = self.gate(h)
            return x + self.down(g * torch.sigmoid(g) * self.up(h))

    torch.manual_seed(seed)
    model = Layer().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.05)
        model.n1.weight.uniform_(0.5, 1.5)
        model.n2.weight.uniform_(0.5, 1.5)
    return model


def bert_inputs(batch: int, seq: int, hidden: int = 256, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, seq, hidden)).astype(np.float32)
    mask = np.zeros((batch, 1, 1, seq), np.float32)
    mask[:, :, :, seq - seq // 8:] = -10000.0  # padded tail, as a BERT attention mask is
    return {"x": x, "mask": mask}


def llama_inputs(batch: int, seq: int, hidden: int = 256, heads: int = 8, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    hd = hidden // heads
    pos = np.arange(seq)[:, None] / (10000 ** (np.arange(0, hd, 2) / hd))[None, :]
    ang = np.concatenate([pos, pos], axis=-1)
    mask = np.triu(np.full((seq, seq), -np.inf, np.float32), 1)
    return {
        "x": rng.standard_normal((batch, seq, hidden)).astype(np.float32),
        "cos": np.cos(ang).astype(np.float32)[None, None],
        "sin": np.sin(ang).astype(np.float32)[None, None],
        "mask": mask[None, None],
    }


def export(model: Any, inputs: dict[str, np.ndarray], name: str, opset: int = 17) -> Path:
    """Export with the TorchScript exporter into the model cache, at the inputs' (static) shapes."""
    torch = _torch()

    def write(path: Path) -> None:
        args = tuple(torch.from_numpy(v) for v in inputs.values())
        with _quiet_export():
            torch.onnx.export(model, args, str(path), dynamo=False, opset_version=opset,
                              input_names=list(inputs), output_names=["y"])

    shapes = "_".join("x".join(map(str, v.shape)) for v in inputs.values())
    # The module's structure and weights are part of the key: a builder that changed (bench_models' MobileNetV2
    # once got random BatchNorm statistics) must not find its older export under the same name.
    h = hashlib.sha256(Path(__file__).read_bytes() + shapes.encode() + repr(model).encode())
    for key, value in model.state_dict().items():
        h.update(key.encode())
        h.update(value.detach().cpu().contiguous().numpy().tobytes())
    return _cached(f"{name}-{h.hexdigest()[:8]}", write)


def reference(model: Any, inputs: dict[str, np.ndarray]) -> np.ndarray:
    torch = _torch()
    with torch.no_grad():
        return model(*(torch.from_numpy(v) for v in inputs.values())).numpy()

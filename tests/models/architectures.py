"""Real architectures as `transformers` builds them from tiny configs (random weights, no downloads), exported by
both of torch.onnx.export's exporters: "torchscript" (dynamo=False, opset 17; "torchscript-opset14" at opset 14)
and "dynamo" (dynamo=True, opset 18; "dynamo-opset23" at opset 23).

Each `Arch` names its transformers class and config, its ONNX inputs and outputs and which of their axes are
dynamic; `export(arch, exporter)` writes the export once into tests/models/zoo.py's cache. When the torch exporter
itself fails, the error text is cached beside it and `export` raises `ExportFailed` with it (the tests xfail with
that exact text), so a broken combination costs one attempt, not one per run.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import zoo
from .zoo import _cached, _quiet_export

EXPORTERS = ("torchscript", "dynamo", "torchscript-opset14", "dynamo-opset23")
OPSET = {"torchscript": 17, "dynamo": 18, "torchscript-opset14": 14, "dynamo-opset23": 23}


class ExportFailed(RuntimeError):
    """torch.onnx.export failed for this architecture and exporter; the text is the exporter's error."""


@dataclass(frozen=True)
class Arch:
    """One architecture: `model` is the transformers class, `config` its config class and keyword arguments."""

    name: str
    model: str
    config: str
    kwargs: dict[str, Any]
    kind: str  # "text" (input_ids [+ attention_mask]), "image" (pixel_values) or "audio" (input_features)
    outputs: tuple[str, ...] = ("last_hidden_state",)
    mask: bool = True  # text models: an attention_mask input
    vocab: int = 500
    image: tuple[int, int, int] = (3, 32, 32)
    model_kwargs: dict[str, Any] = field(default_factory=dict)  # the constructor's, e.g. add_pooling_layer=False
    forward_kwargs: dict[str, Any] = field(default_factory=dict)  # forward's, e.g. use_cache=False

    @property
    def inputs(self) -> tuple[str, ...]:
        if self.kind == "text":
            return ("input_ids", "attention_mask") if self.mask else ("input_ids",)
        return ("pixel_values",) if self.kind == "image" else ("input_features",)

    @property
    def dynamic_length(self) -> bool:
        return self.kind == "text"

    def feeds(self, batch: int, length: int = 0, seed: int = 0) -> dict[str, np.ndarray]:
        """Random inputs; text masks pad the last quarter of every row after the first."""
        rng = np.random.default_rng(seed)
        if self.kind == "text":
            ids = rng.integers(3, self.vocab, (batch, length)).astype(np.int64)
            out = {"input_ids": ids}
            if self.mask:
                mask = np.ones((batch, length), np.int64)
                mask[1:, length - length // 4:] = 0
                out["attention_mask"] = mask
            return out
        if self.kind == "image":
            return {"pixel_values": rng.standard_normal((batch, *self.image)).astype(np.float32)}
        mels, frames = self.kwargs["num_mel_bins"], 2 * self.kwargs["max_source_positions"]
        return {"input_features": rng.standard_normal((batch, mels, frames)).astype(np.float32)}

    def key(self, exporter: str, seed: int) -> str:
        spec = ["jitter-1d", self.model, self.config, self.kwargs, self.model_kwargs, self.forward_kwargs,
                self.inputs, self.outputs, exporter, seed]
        return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:8]


_TEXT = {"vocab_size": 500}
ARCHS: dict[str, Arch] = {a.name: a for a in (
    Arch("distilbert", "DistilBertModel", "DistilBertConfig",
         {**_TEXT, "n_layers": 2, "dim": 64, "n_heads": 4, "hidden_dim": 128, "max_position_embeddings": 64}, "text"),
    Arch("roberta", "RobertaModel", "RobertaConfig",
         {**_TEXT, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
          "max_position_embeddings": 66}, "text", model_kwargs={"add_pooling_layer": False}),
    Arch("qwen2", "Qwen2ForCausalLM", "Qwen2Config",
         {**_TEXT, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "intermediate_size": 128, "max_position_embeddings": 64, "use_cache": False}, "text",
         outputs=("logits",), forward_kwargs={"use_cache": False}),
    Arch("vit", "ViTModel", "ViTConfig",
         {"image_size": 32, "patch_size": 8, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
          "intermediate_size": 128}, "image", model_kwargs={"add_pooling_layer": False}),
    Arch("clip_text", "CLIPTextModel", "CLIPTextConfig",
         {**_TEXT, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128,
          "max_position_embeddings": 32}, "text"),
    Arch("t5_encoder", "T5EncoderModel", "T5Config",
         {**_TEXT, "num_layers": 2, "d_model": 64, "d_kv": 16, "d_ff": 128, "num_heads": 4}, "text"),
    Arch("convnext", "ConvNextModel", "ConvNextConfig",
         {"num_channels": 3, "hidden_sizes": [16, 32], "depths": [1, 1], "num_stages": 2, "image_size": 32},
         "image", outputs=("last_hidden_state", "pooler_output")),
    Arch("whisper_encoder", "WhisperEncoder", "WhisperConfig",
         {"num_mel_bins": 8, "max_source_positions": 16, "d_model": 64, "encoder_layers": 2,
          "encoder_attention_heads": 4, "encoder_ffn_dim": 128, "decoder_layers": 1, "decoder_attention_heads": 4,
          "decoder_ffn_dim": 128, "vocab_size": 500}, "audio"),
    Arch("swin", "SwinModel", "SwinConfig",
         {"image_size": 32, "patch_size": 2, "embed_dim": 16, "depths": [1, 1], "num_heads": [2, 4], "window_size": 4},
         "image", model_kwargs={"add_pooling_layer": False}),
)}

# Not in the matrix: RoBERTa with transformers' eager attention, the pattern ONNX Runtime's transformer optimizer
# fuses into com.microsoft Attention (test_decoder_matrix.py runs its output).
ROBERTA_EAGER = Arch("roberta_eager", "RobertaModel", "RobertaConfig",
                     {**ARCHS["roberta"].kwargs, "attn_implementation": "eager"}, "text",
                     model_kwargs={"add_pooling_layer": False})


def build(arch: Arch, seed: int = 0) -> Any:
    """The transformers model, eval mode, seeded random weights."""
    import torch
    import transformers

    torch.manual_seed(seed)
    config = getattr(transformers, arch.config)(**arch.kwargs)
    if arch.model == "WhisperEncoder":
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        model = WhisperEncoder(config)
    else:
        model = getattr(transformers, arch.model)(config, **arch.model_kwargs)
    # Norms start as gamma 1, beta 0 (and ConvNeXt's layer scale as 1e-6): jitter every vector parameter, so a
    # fused norm that dropped its affine tail, or a block skipped, shows in the outputs.
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim == 1:
                p.add_(0.2 * torch.randn_like(p))
    return model.eval()


def _module(arch: Arch, model: Any) -> Any:
    """`model` with positional ONNX inputs and a tuple of the named outputs."""
    import torch

    class Positional(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> tuple:
            out = self.model(**dict(zip(arch.inputs, args, strict=True)), **arch.forward_kwargs)
            return tuple(getattr(out, name) for name in arch.outputs)

    return Positional().eval()


def export(arch: Arch, exporter: str = "torchscript", seed: int = 0) -> Path:
    """The cached export of `arch` by `exporter`; raises ExportFailed with the exporter's error if it fails."""
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}")
    name = f"arch-{arch.name}-{exporter}-{arch.key(exporter, seed)}"
    failed = zoo.CACHE_DIR / f"{name}-{zoo._cache_key()}.failed"
    if failed.exists():
        raise ExportFailed(failed.read_text())

    def write(path: Path) -> None:
        import torch

        module = _module(arch, build(arch, seed))
        # Batch 2 (and length 12): torch.export specialises an example dim of 1 to a constant.
        args = tuple(torch.from_numpy(v) for v in arch.feeds(2, 12, seed).values())
        dyn_axes = {0: "batch", 1: "sequence"} if arch.dynamic_length else {0: "batch"}
        with _quiet_export(), torch.no_grad():
            if exporter.startswith("torchscript"):
                axes = {n: dyn_axes for n in arch.inputs}
                axes |= {n: {0: "batch"} for n in arch.outputs}
                options: dict[str, Any] = {"dynamic_axes": axes, "dynamo": False}
            else:
                dyn = torch.export.Dim.DYNAMIC
                options = {"dynamic_shapes": (tuple({a: dyn for a in dyn_axes} for _ in arch.inputs),), "dynamo": True}
            try:
                program = torch.onnx.export(module, args, str(path) if exporter.startswith("torchscript") else None,
                                            input_names=list(arch.inputs), output_names=list(arch.outputs),
                                            opset_version=OPSET[exporter], **options)
            except Exception as e:  # the exporter's own failure (a builder's bug propagates as itself)
                raise ExportFailed(f"{type(e).__name__}: {e}".strip()) from e
            if program is not None:
                program.save(str(path))

    try:
        return _cached(name, write)
    except ExportFailed as e:  # remembered, so the next run does not retry it
        zoo.CACHE_DIR.mkdir(parents=True, exist_ok=True)
        failed.write_text(str(e))
        raise

"""A BERT encoder as `transformers` builds it from a config (random weights, no downloads), exported to ONNX by
torch.onnx.export with dynamic batch and sequence axes: `input_ids`, `attention_mask`, `token_type_ids` (int64,
batch x sequence) in, `last_hidden_state` out. Cached (tests/models/zoo.py's cache)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .zoo import _cached, _quiet_export


@dataclass(frozen=True)
class Encoder:
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    ff: int = 128
    vocab: int = 500
    positions: int = 512

    def feeds(self, batch: int, length: int, seed: int = 0) -> dict[str, np.ndarray]:
        """Random ids, a mask whose last eighth is padding, token types 0 then 1."""
        rng = np.random.default_rng(seed)
        mask = np.ones((batch, length), np.int64)
        mask[:, length - length // 8:] = 0
        types = np.zeros((batch, length), np.int64)
        types[:, length // 2:] = 1
        return {"input_ids": rng.integers(0, self.vocab, (batch, length)).astype(np.int64), "attention_mask": mask,
                "token_type_ids": types}


BERT = Encoder()


def export(cfg: Encoder = BERT, seed: int = 0) -> Path:
    """The cached export of a transformers BertModel with `cfg`'s sizes (torchscript exporter, opset 17)."""
    key = hashlib.sha256(json.dumps([asdict(cfg), seed]).encode()).hexdigest()[:8]

    def write(path: Path) -> None:
        import torch
        import transformers

        torch.manual_seed(seed)
        config = transformers.BertConfig(num_hidden_layers=cfg.layers, hidden_size=cfg.hidden,
                                         num_attention_heads=cfg.heads, intermediate_size=cfg.ff,
                                         vocab_size=cfg.vocab, max_position_embeddings=cfg.positions)
        bert: Any = transformers.BertModel(config, add_pooling_layer=False).eval()

        class Keywords(torch.nn.Module):  # forward's positional order is not the ONNX inputs' order
            def __init__(self) -> None:
                super().__init__()
                self.bert = bert

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
                return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                                 token_type_ids=token_type_ids).last_hidden_state

        model = Keywords().eval()
        feeds = {k: torch.from_numpy(v) for k, v in cfg.feeds(2, 16).items()}
        axes = {name: {0: "batch", 1: "sequence"} for name in [*feeds, "last_hidden_state"]}
        with _quiet_export(), torch.no_grad():
            torch.onnx.export(model, (feeds["input_ids"], feeds["attention_mask"], feeds["token_type_ids"]), str(path),
                              input_names=list(feeds), output_names=["last_hidden_state"], dynamic_axes=axes,
                              opset_version=17, dynamo=False)

    return _cached(f"encoder-bert-{key}", write)

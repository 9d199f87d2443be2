"""ONNX Runtime's com.microsoft contrib ops (src/ember/ops/contrib.py) on every backend, against ONNX Runtime's CPU
kernels: small one-node models with a symbolic batch, each run at two batch sizes, then the error cases, then a tiny
BERT through onnxruntime.transformers' optimizer."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import ember

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)]
TOL = {"rtol": 1e-4, "atol": 1e-4}
_TYPES = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64}


def model_of(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[Any, list[Any]]], outputs: list[str],
             inits: dict[str, np.ndarray] | None = None) -> onnx.ModelProto:
    """A model of `nodes`: `inputs` maps a graph input to (dtype, dims: ints or names), `inits` are initializers."""
    ins = [helper.make_tensor_value_info(n, _TYPES[np.dtype(dt)], dims) for n, (dt, dims) in inputs.items()]
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs]
    tensors = [onnx.numpy_helper.from_array(v, k) for k, v in (inits or {}).items()]
    return helper.make_model(helper.make_graph(nodes, "contrib", ins, outs, tensors), opset_imports=OPSETS)


def check(model: onnx.ModelProto, feeds: list[dict[str, np.ndarray]], backend_name: str) -> ember.Model:
    """Each feed through ONNX Runtime CPU and ember (one loaded model: the batch is symbolic); every output close."""
    data = model.SerializeToString()
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    m = ember.load_onnx(data, backend=backend_name)
    for feed in feeds:
        want = dict(zip(names, sess.run(None, feed), strict=True))
        got = m.run(feed)
        for name in names:
            assert got[name].shape == want[name].shape, name
            np.testing.assert_allclose(got[name], want[name], **TOL, err_msg=name)
    return m


def randn(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ---- SkipLayerNormalization / SkipSimplifiedLayerNormalization ---------------------------------------------------
@pytest.mark.parametrize(("seq", "hidden", "skip", "beta", "bias", "outputs"), [
    (5, 16, "full", True, True, (1, 0, 0, 0)),
    (3, 32, "full", False, False, (1, 0, 0, 1)),        # the residual sum as an output (the next layer's skip)
    (7, 64, "seq", True, False, (1, 1, 1, 1)),          # every output; skip (S, H) broadcast over the batch
    (4, 24, "one", False, True, (1, 0, 1, 0)),          # skip (1, S, H)
])
def test_skip_layer_norm(backend_name: str, seq: int, hidden: int, skip: str, beta: bool, bias: bool,
                         outputs: tuple[int, ...]) -> None:
    rng = np.random.default_rng(seq)
    skip_dims = {"full": ["batch", seq, hidden], "seq": [seq, hidden], "one": [1, seq, hidden]}[skip]
    inits = {"gamma": randn(rng, hidden)}
    if beta:
        inits["beta"] = randn(rng, hidden)
    if bias:
        inits["bias"] = randn(rng, hidden)
    out_names = [n if keep else "" for n, keep in zip(["y", "mean", "inv_std", "sum"], outputs, strict=True)]
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta" if beta else "",
                                                      "bias" if bias else ""], out_names, domain=MS, epsilon=1e-5)
    model = model_of([node], {"x": (np.float32, ["batch", seq, hidden]), "skip": (np.float32, skip_dims)},
                     [n for n in out_names if n], inits)

    def feed(b: int) -> dict[str, np.ndarray]:
        sd = [b if d == "batch" else d for d in skip_dims]
        return {"x": randn(rng, b, seq, hidden), "skip": randn(rng, *sd)}

    check(model, [feed(2), feed(1)] if skip != "full" else [feed(2), feed(3)], backend_name)


def test_skip_layer_norm_2d_and_default_epsilon(backend_name: str) -> None:
    rng = np.random.default_rng(1)
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma", "beta"], ["y"], domain=MS)
    model = model_of([node], {"x": (np.float32, ["tokens", 32]), "skip": (np.float32, ["tokens", 32])}, ["y"],
                     {"gamma": randn(rng, 32), "beta": randn(rng, 32)})
    check(model, [{"x": randn(rng, n, 32), "skip": randn(rng, n, 32)} for n in (6, 1)], backend_name)


@pytest.mark.parametrize(("seq", "hidden", "bias", "outputs"), [
    (5, 16, True, (1, 0, 0, 0)),
    (3, 64, False, (1, 0, 0, 1)),
    (6, 32, True, (1, 0, 1, 1)),   # inv_std_var and the sum (ONNX Runtime >= 1.19 adds the bias into it)
])
def test_skip_simplified_layer_norm(backend_name: str, seq: int, hidden: int, bias: bool,
                                    outputs: tuple[int, ...]) -> None:
    rng = np.random.default_rng(seq)
    inits = {"gamma": randn(rng, hidden)}
    if bias:
        inits["bias"] = randn(rng, hidden)
    out_names = [n if keep else "" for n, keep in zip(["y", "mean", "inv_std", "sum"], outputs, strict=True)]
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma", "bias" if bias else ""],
                            out_names, domain=MS, epsilon=1e-6)
    model = model_of([node], {"x": (np.float32, ["batch", seq, hidden]),
                              "skip": (np.float32, ["batch", seq, hidden])}, [n for n in out_names if n], inits)
    check(model, [{"x": randn(rng, b, seq, hidden), "skip": randn(rng, b, seq, hidden)} for b in (2, 1)],
          backend_name)


@pytest.mark.parametrize(("axis", "inv"), [(-1, False), (-1, True), (1, False), (-2, True)])
def test_simplified_layer_norm(backend_name: str, axis: int, inv: bool) -> None:
    # ONNX Runtime registers SimplifiedLayerNormalization in the ONNX domain (the form its fusions write).
    rng = np.random.default_rng(3)
    seq, hidden = 4, 24
    scale_shape = (hidden,) if axis == -1 else (seq, hidden)
    outs = ["y", "inv_std"] if inv else ["y"]
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "scale"], outs, axis=axis, epsilon=1e-6)
    model = model_of([node], {"x": (np.float32, ["batch", seq, hidden])}, outs, {"scale": randn(rng, *scale_shape)})
    check(model, [{"x": randn(rng, b, seq, hidden)} for b in (3, 1)], backend_name)


# ---- GELU family ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("op", "bias", "attrs"), [
    ("Gelu", False, {}),
    ("BiasGelu", True, {}),
    ("FastGelu", False, {}),
    ("FastGelu", True, {}),
    ("QuickGelu", False, {}),
    ("QuickGelu", False, {"alpha": 1.0}),
])
def test_gelu_family(backend_name: str, op: str, bias: bool, attrs: dict[str, Any]) -> None:
    rng = np.random.default_rng(4)
    hidden = 40
    node = helper.make_node(op, ["x", "b"] if bias else ["x"], ["y"], domain=MS, **attrs)
    model = model_of([node], {"x": (np.float32, ["batch", 3, hidden])}, ["y"],
                     {"b": randn(rng, hidden)} if bias else None)
    check(model, [{"x": 3 * randn(rng, b, 3, hidden)} for b in (2, 5)], backend_name)


def test_matmul_bias_gelu_chain(backend_name: str) -> None:
    """MatMul -> BiasGelu -> FusedMatMul, the optimizer's feed-forward block: the activation is an epilogue."""
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]),
             helper.make_node("BiasGelu", ["h", "b1"], ["a"], domain=MS),
             helper.make_node("FusedMatMul", ["a", "w2"], ["y"], domain=MS, alpha=0.5, transB=1)]
    model = model_of(nodes, {"x": (np.float32, ["batch", 6, 16])}, ["y"],
                     {"w1": randn(rng, 16, 32), "b1": randn(rng, 32), "w2": randn(rng, 8, 32)})
    m = check(model, [{"x": randn(rng, b, 6, 16)} for b in (2, 1)], backend_name)
    stats = m.stats()
    # The bias and the GELU ride in the first matmul's epilogue, alpha in the second's: no elementwise kernel.
    assert stats["elementwise.kernels"] == 0 and stats["epilogue.fused"] > 0, stats


# ---- FusedMatMul ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("a_shape", "b_shape", "trans_a", "trans_b", "alpha"), [
    (("batch", 5, 8), (8, 6), 0, 0, 1.0),
    (("batch", 8, 5), (8, 6), 1, 0, 0.125),
    (("batch", 5, 8), (6, 8), 0, 1, 2.0),
    (("batch", 2, 8, 5), ("batch", 2, 6, 8), 1, 1, -0.5),
    (("batch", 4, 7), ("batch", 4, 7), 0, 1, 0.25),       # both operands device tensors: scaled q kᵀ
])
def test_fused_matmul(backend_name: str, a_shape: tuple[Any, ...], b_shape: tuple[Any, ...], trans_a: int,
                      trans_b: int, alpha: float) -> None:
    rng = np.random.default_rng(6)
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, alpha=alpha, transA=trans_a,
                            transB=trans_b)
    b_input = "batch" in b_shape
    inputs = {"a": (np.float32, list(a_shape))}
    if b_input:
        inputs["b"] = (np.float32, list(b_shape))
    model = model_of([node], inputs, ["y"], None if b_input else {"b": randn(rng, *b_shape)})

    def feed(n: int) -> dict[str, np.ndarray]:
        f = {"a": randn(rng, *[n if d == "batch" else d for d in a_shape])}
        if b_input:
            f["b"] = randn(rng, *[n if d == "batch" else d for d in b_shape])
        return f

    check(model, [feed(2), feed(3)], backend_name)


# ---- RotaryEmbedding -----------------------------------------------------------------------------------------------
def caches(positions: int, half: int) -> tuple[np.ndarray, np.ndarray]:
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    angles = np.arange(positions)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


@pytest.mark.parametrize(("layout", "interleaved", "rotary_dim", "positions"), [
    ("3d", 0, 0, "ids"),
    ("3d", 1, 0, "ids"),
    ("3d", 0, 8, "start"),        # partial rotation: the last 8 dims of each 16-dim head pass through
    ("3d", 1, 12, "ids"),
    ("4d", 0, 0, "start"),
    ("4d", 1, 0, "ids"),
    ("4d", 0, 10, "ids"),
    ("3d", 0, 0, "const"),        # position ids folded into the plan (a constant start)
])
def test_rotary_embedding(backend_name: str, layout: str, interleaved: int, rotary_dim: int,
                          positions: str) -> None:
    rng = np.random.default_rng(7)
    heads, head, seq, max_pos = 3, 16, 5, 32
    rot = rotary_dim or head
    cos, sin = caches(max_pos, rot // 2)
    attrs: dict[str, Any] = {"interleaved": interleaved}
    if rotary_dim:
        attrs["rotary_embedding_dim"] = rotary_dim
    if rotary_dim or layout == "3d":
        attrs["num_heads"] = heads
    x_dims = ["batch", seq, heads * head] if layout == "3d" else ["batch", heads, seq, head]
    inputs: dict[str, tuple[Any, list[Any]]] = {"x": (np.float32, x_dims)}
    inits = {"cos": cos, "sin": sin}
    if positions == "ids":
        inputs["pos"] = (np.int64, ["batch", seq])
    elif positions == "start":
        inputs["pos"] = (np.int64, [1])
    else:
        inits["pos"] = np.array([4], np.int64)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, **attrs)
    model = model_of([node], inputs, ["y"], inits)

    def feed(b: int) -> dict[str, np.ndarray]:
        f = {"x": randn(rng, *[b if d == "batch" else d for d in x_dims])}
        if positions == "ids":
            f["pos"] = rng.integers(0, max_pos, (b, seq)).astype(np.int64)
        elif positions == "start":
            f["pos"] = np.array([b + 3], np.int64)
        return f

    check(model, [feed(2), feed(1)], backend_name)


# ---- errors --------------------------------------------------------------------------------------------------------
def run_cpu(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> dict[str, Any]:
    return ember.load_onnx(model.SerializeToString(), backend="cpu").run(feeds)


def test_skip_layer_norm_wrong_rank() -> None:
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma"], ["y"], domain=MS, name="sln")
    model = model_of([node], {"x": (np.float32, [1, 2, 3, 8]), "skip": (np.float32, [1, 2, 3, 8])}, ["y"],
                     {"gamma": np.ones(8, np.float32)})
    x = np.zeros((1, 2, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"SkipLayerNormalization \(domain com.microsoft.*'sln'.*expected 3-D"):
        run_cpu(model, {"x": x, "skip": x})


def test_skip_layer_norm_bad_gamma() -> None:
    node = helper.make_node("SkipLayerNormalization", ["x", "skip", "gamma"], ["y"], domain=MS, name="sln")
    model = model_of([node], {"x": (np.float32, [1, 3, 8]), "skip": (np.float32, [1, 3, 8])}, ["y"],
                     {"gamma": np.ones(6, np.float32)})
    x = np.zeros((1, 3, 8), np.float32)
    with pytest.raises(ValueError, match=r"'sln'.*'gamma' has shape \(6,\), expected \(8,\)"):
        run_cpu(model, {"x": x, "skip": x})


def test_skip_simplified_mean_output_unsupported() -> None:
    node = helper.make_node("SkipSimplifiedLayerNormalization", ["x", "skip", "gamma"], ["y", "mean"], domain=MS,
                            name="ssln")
    model = model_of([node], {"x": (np.float32, [1, 3, 8]), "skip": (np.float32, [1, 3, 8])}, ["y", "mean"],
                     {"gamma": np.ones(8, np.float32)})
    x = np.zeros((1, 3, 8), np.float32)
    with pytest.raises(NotImplementedError, match=r"'ssln'.*the mean output is not supported"):
        run_cpu(model, {"x": x, "skip": x})


def test_fused_matmul_trans_batch_unsupported() -> None:
    node = helper.make_node("FusedMatMul", ["a", "b"], ["y"], domain=MS, name="fmm", transBatchA=1)
    model = model_of([node], {"a": (np.float32, [2, 3, 4]), "b": (np.float32, [4, 5])}, ["y"])
    with pytest.raises(NotImplementedError, match=r"FusedMatMul \(domain com.microsoft.*'fmm'.*transBatchA=1"):
        ember.load_onnx(model.SerializeToString(), backend="cpu")


@pytest.mark.parametrize(("attrs", "message"), [
    ({"is_packed_batching": 1}, "is_packed_batching=1"),
    ({"interleaved": 2}, "interleaved=2"),
])
def test_rotary_unsupported_attribute(attrs: dict[str, int], message: str) -> None:
    cos, sin = caches(8, 4)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, name="rope", **attrs)
    model = model_of([node], {"x": (np.float32, [1, 2, 2, 8]), "pos": (np.int64, [1])}, ["y"],
                     {"cos": cos, "sin": sin})
    with pytest.raises(NotImplementedError, match=rf"RotaryEmbedding .*'rope'.*{message}"):
        ember.load_onnx(model.SerializeToString(), backend="cpu")


def test_rotary_wrong_rank_and_positions() -> None:
    cos, sin = caches(8, 4)
    node = helper.make_node("RotaryEmbedding", ["x", "pos", "cos", "sin"], ["y"], domain=MS, name="rope")
    model = model_of([node], {"x": (np.float32, [2, 8]), "pos": (np.int64, [1])}, ["y"], {"cos": cos, "sin": sin})
    with pytest.raises(ValueError, match=r"'rope'.*expected 3-D .* or 4-D"):
        run_cpu(model, {"x": np.zeros((2, 8), np.float32), "pos": np.zeros(1, np.int64)})
    model = model_of([node], {"x": (np.float32, [1, 2, 3, 8])}, ["y"],
                     {"cos": cos, "sin": sin, "pos": np.array([6], np.int64)})
    with pytest.raises(ValueError, match=r"'rope'.*positions 6\.\.8 are outside the caches' 8 rows"):
        run_cpu(model, {"x": np.zeros((1, 2, 3, 8), np.float32)})


@pytest.mark.parametrize(("op", "inputs", "outputs", "message"), [
    ("SkipLayerNormalization", ["x", "x"], ["y"], r"2 input\(s\); the op takes 3 to 5"),
    ("SkipLayerNormalization", ["x", "", "g"], ["y"], r"required input\(s\) \[1\] are empty"),
    ("BiasGelu", ["x"], ["y"], r"1 input\(s\); the op takes 2"),
    ("RotaryEmbedding", ["x", "p", "c"], ["y"], r"3 input\(s\); the op takes 4"),
    ("QuickGelu", ["x"], ["y", "z"], r"2 output\(s\); the op has 1 to 1"),
])
def test_arity_checked_at_load(op: str, inputs: list[str], outputs: list[str], message: str) -> None:
    # ONNX's schemas do not cover com.microsoft, so load-time validation leaves the counts to the op.
    node = helper.make_node(op, inputs, outputs, domain=MS, name="n")
    model = model_of([node], {"x": (np.float32, [2, 8]), "p": (np.int64, [1]), "c": (np.float32, [4, 4]),
                              "g": (np.float32, [8])}, outputs)
    with pytest.raises(ValueError, match=rf"{op} \(domain com.microsoft, opset 1, node 'n'\): {message}"):
        ember.load_onnx(model.SerializeToString(), backend="cpu")


def test_bias_gelu_bad_bias() -> None:
    node = helper.make_node("BiasGelu", ["x", "b"], ["y"], domain=MS, name="bg")
    model = model_of([node], {"x": (np.float32, [2, 8])}, ["y"], {"b": np.zeros(4, np.float32)})
    with pytest.raises(ValueError, match=r"'bg'.*the bias has shape \(4,\); expected \(8,\)"):
        run_cpu(model, {"x": np.zeros((2, 8), np.float32)})


# ---- a BERT through ONNX Runtime's transformer optimizer -----------------------------------------------------------
BERT_CFG = dict(layers=2, hidden=32, heads=2, ff=64, vocab=100, positions=64)
# The com.microsoft ops the optimizer's default BERT fusions emit that ember does not implement: the fused attention
# (on an eager-attention export; it does not match the SDPA export's mask pattern) and the embedding layer.
OPTIMIZER_FUSED = ["Attention", "EmbedLayerNormalization"]


def _optimize(path: Any, heads: int, hidden: int, fuse_attention: bool = True) -> onnx.ModelProto:
    optimizer = pytest.importorskip("onnxruntime.transformers.optimizer")
    from onnxruntime.transformers.fusion_options import FusionOptions

    options = FusionOptions("bert")
    options.enable_attention = fuse_attention
    options.enable_embed_layer_norm = fuse_attention
    return optimizer.optimize_model(str(path), model_type="bert", num_heads=heads, hidden_size=hidden, opt_level=0,
                                    optimization_options=options).model


def _eager_bert() -> Any:
    """tests/models/encoders.py's BERT with transformers' eager attention (the pattern the optimizer fuses)."""
    from ..models.encoders import Encoder
    from ..models.zoo import _cached, _quiet_export

    cfg = Encoder(**BERT_CFG)

    def write(path: Any) -> None:
        import torch
        import transformers

        torch.manual_seed(0)
        config = transformers.BertConfig(num_hidden_layers=cfg.layers, hidden_size=cfg.hidden,
                                         num_attention_heads=cfg.heads, intermediate_size=cfg.ff, vocab_size=cfg.vocab,
                                         max_position_embeddings=cfg.positions, attn_implementation="eager")
        bert: Any = transformers.BertModel(config, add_pooling_layer=False).eval()

        class Keywords(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.bert = bert

            def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
                return self.bert(input_ids=input_ids, attention_mask=attention_mask,
                                 token_type_ids=token_type_ids).last_hidden_state

        feeds = {k: torch.from_numpy(v) for k, v in cfg.feeds(2, 16).items()}
        axes = {name: {0: "batch", 1: "sequence"} for name in [*feeds, "last_hidden_state"]}
        with _quiet_export(), torch.no_grad():
            torch.onnx.export(Keywords().eval(), tuple(feeds.values()), str(path), input_names=list(feeds),
                              output_names=["last_hidden_state"], dynamic_axes=axes, opset_version=17, dynamo=False)

    return _cached("contrib-bert-eager", write), cfg


def _contrib_ops(model: onnx.ModelProto) -> list[str]:
    return sorted({n.op_type for n in model.graph.node if n.domain == MS})


@pytest.fixture(scope="module")
def _bert_deps() -> None:
    pytest.importorskip("onnxruntime.transformers.optimizer")
    pytest.importorskip("transformers")
    pytest.importorskip("torch")


def test_bert_sdpa_export_through_optimizer(backend_name: str, _bert_deps: None) -> None:
    """The suite's BERT export (SDPA attention): the optimizer fuses the layer norms and GELUs only."""
    from ..models.encoders import Encoder, export

    cfg = Encoder(**BERT_CFG)
    model = _optimize(export(cfg), cfg.heads, cfg.hidden)
    assert _contrib_ops(model) == ["BiasGelu", "SkipLayerNormalization"]
    check(model, [cfg.feeds(2, 8), cfg.feeds(1, 5, seed=1)], backend_name)


def test_bert_eager_export_without_attention_fusion(backend_name: str, _bert_deps: None) -> None:
    path, cfg = _eager_bert()
    model = _optimize(path, cfg.heads, cfg.hidden, fuse_attention=False)
    assert _contrib_ops(model) == ["BiasGelu", "SkipLayerNormalization"]
    check(model, [cfg.feeds(2, 8), cfg.feeds(1, 5, seed=1)], backend_name)


def test_bert_eager_export_fully_fused(backend_name: str, _bert_deps: None) -> None:
    """The optimizer's full fusion (EmbedLayerNormalization, com.microsoft Attention with the mask as lengths):
    equal to ONNX Runtime on the same optimized graph, padded batches included."""
    path, cfg = _eager_bert()
    model = _optimize(path, cfg.heads, cfg.hidden)
    assert _contrib_ops(model) == sorted(["BiasGelu", "SkipLayerNormalization", *OPTIMIZER_FUSED])
    padded = cfg.feeds(2, 8)
    padded["attention_mask"][1, 5:] = 0
    check(model, [cfg.feeds(2, 8), cfg.feeds(1, 5, seed=1), padded], backend_name)

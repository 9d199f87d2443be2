"""Exporter-proof fusion on real architectures (issue 15): each `transformers` architecture of
tests/models/architectures.py, exported by torch.onnx's TorchScript exporter (opsets 14 and 17) and its dynamo
exporter (opsets 18 and 23), gives ONNX Runtime CPU's outputs on ember (two batch sizes, and two lengths for text,
padded rows included), and takes the fused LayerNorm / RMSNorm / GELU / QuickGELU / attention arms the block has,
proven by `model.rewrites` (chains rewritten) plus the native ops the export holds (opset 14 spells LayerNorm as a
chain; opset 23 writes LayerNormalization, RMSNormalization, Gelu and Attention), and by `model.stats()` (every run
takes the fused arm). No near miss is reported: `model.rewrites["<pattern>.near_miss"]` is 0 and
`plan_info()["fusion_misses"]` is empty.

Every architecture runs under all four exporters (no subset per new opset): the exports are cached
(architectures.export), and the two new opsets double the matrix's own time at most, a small part of the CI's.

A combination whose torch export fails xfails with the exporter's exact error. Blocks ember does not fuse yet are
listed in MISSES (not asserted as expected counts): the test records them so a matcher fix shows up as a count
that no longer matches MISSES.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import ember

from . import architectures as arch_mod
from .architectures import ARCHS, EXPORTERS, Arch

ort = pytest.importorskip("onnxruntime")

PATTERNS = ("layernorm", "rmsnorm", "gelu", "quickgelu", "attention")

# Fused blocks per forward, the same for every exporter: LayerNorm (the ONNX op or the rewritten chain), RMSNorm,
# GELU, attention. Text encoders: the embeddings' LayerNorm + 2 per layer; decoders' RMSNorm: 2 per layer + final.
EXPECTED: dict[str, dict[str, int]] = {
    "distilbert": {"layernorm": 5, "gelu": 2, "attention": 2},
    "roberta": {"layernorm": 5, "gelu": 2, "attention": 2},
    "qwen2": {"rmsnorm": 5, "attention": 2},
    "vit": {"layernorm": 5, "gelu": 2, "attention": 2},
    "clip_text": {"layernorm": 5, "quickgelu": 2, "attention": 2},  # quick_gelu: x * Sigmoid(1.702 x)
    "t5_encoder": {"rmsnorm": 5, "attention": 2},
    "convnext": {"layernorm": 5, "gelu": 2},  # stem, downsample, one per block, the pooler's
    "whisper_encoder": {"layernorm": 5, "gelu": 4, "attention": 2},  # GELU after both convolutions too
    "swin": {"layernorm": 7, "gelu": 2, "attention": 2},  # embeddings, 2 per block, patch merging, final
}

# Blocks ember leaves unfused today: (architecture, exporter or "*") -> what is missed (not asserted). None now.
MISSES: dict[tuple[str, str], str] = {}

# Native ops (ONNX domain) each pattern's fused arm runs without a rewrite.
NATIVE = {"LayerNormalization": "layernorm", "RMSNormalization": "rmsnorm", "Gelu": "gelu", "Attention": "attention"}

# Exports ONNX Runtime cannot run at batch > 1: (architecture, exporter) -> its error. The dynamo exporter at opset
# 23 writes Qwen2's rotary caches for one batch row without position_ids (RotaryEmbedding-23 wants them per row);
# ember broadcasts them, as torch does: those batches are compared with the torch model itself.
ORT_REFUSES = {("qwen2", "dynamo-opset23"): "'cos_cache' and 'sin_cache' are expected to have the same shape"}

SIZES = {"text": [(1, 7), (3, 12)], "image": [(1, 0), (3, 0)], "audio": [(1, 0), (3, 0)]}


def _export_or_xfail(arch: Arch, exporter: str) -> str:
    try:
        return str(arch_mod.export(arch, exporter))
    except arch_mod.ExportFailed as e:
        pytest.xfail(reason=str(e))


def _close(got: dict[str, np.ndarray], refs: dict[str, np.ndarray], label: str) -> None:
    assert set(got) == set(refs), label
    for name, ref in refs.items():
        atol = 1e-4 * float(np.abs(ref).max()) + 1e-5
        np.testing.assert_allclose(np.asarray(got[name]), ref, rtol=1e-4, atol=atol, err_msg=f"{label} {name}")


def _compare(model: ember.Model, sess: object, feeds: dict[str, np.ndarray], label: str) -> None:
    refs = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True))
    _close(model.run(feeds), refs, label)


def _torch_outputs(arch: Arch, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The exported torch model's own outputs (the weights export() used)."""
    import torch

    with torch.no_grad():
        outs = arch_mod._module(arch, arch_mod.build(arch))(*(torch.from_numpy(v) for v in feeds.values()))
    return {name: t.numpy() for name, t in zip(arch.outputs, outs, strict=True)}


def native_counts(path: str) -> dict[str, int]:
    """How many nodes of each pattern the export holds as native ONNX ops."""
    counts = dict.fromkeys(PATTERNS, 0)
    for n in onnx.load(path, load_external_data=False).graph.node:
        if n.domain in ("", "ai.onnx") and n.op_type in NATIVE:
            counts[NATIVE[n.op_type]] += 1
    return counts


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", list(ARCHS))
def test_architecture_matches_ort_and_fuses(name: str, exporter: str, record_property: object) -> None:
    arch = ARCHS[name]
    path = _export_or_xfail(arch, exporter)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    model = ember.load_onnx(path, backend="cpu")
    sizes = SIZES[arch.kind]
    for batch, length in sizes:
        label = f"{name}/{exporter} batch {batch} length {length}"
        feeds = arch.feeds(batch, length)
        refused = ORT_REFUSES.get((name, exporter))
        if refused and batch > 1:
            with pytest.raises(Exception, match=refused):
                sess.run(None, feeds)
            _close(model.run(feeds), _torch_outputs(arch, feeds), label)
        else:
            _compare(model, sess, feeds, label)
    rewrites = {k: v for k, v in model.rewrites.items() if v and k != "constants_folded"}
    stats = {k: v for k, v in model.stats().items() if v and k.split(".")[0] in (*PATTERNS, "softmax")}
    record_property("rewrites", rewrites)
    record_property("stats", stats)
    miss = MISSES.get((name, exporter)) or MISSES.get((name, "*"))
    if miss:
        record_property("miss", miss)

    expected, runs, native = EXPECTED[name], len(sizes), native_counts(path)
    for pattern in PATTERNS:
        # Each block is a rewritten chain or a native op; the model reports no near miss of any pattern.
        assert rewrites.get(f"{pattern}_fused", 0) + native[pattern] == expected.get(pattern, 0), \
            (pattern, rewrites, native)
        assert model.rewrites[f"{pattern}.near_miss"] == 0, model.rewrites.misses
    # Every run takes the fused arms: nothing falls back, and nothing says why it would.
    for pattern in ("layernorm", "rmsnorm", "gelu", "quickgelu"):
        assert stats.get(f"{pattern}.fused", 0) == expected.get(pattern, 0) * runs, (pattern, stats)
        assert stats.get(f"{pattern}.fallback", 0) == 0, (pattern, stats)
    assert stats.get("attention.fused", 0) + stats.get("attention.gemm", 0) == expected.get("attention", 0) * runs
    assert stats.get("attention.fallback", 0) == 0, stats
    assert model.plan_info(arch.feeds(*sizes[0]))["fusion_misses"] == []
    if expected.get("rmsnorm") and not native["rmsnorm"]:  # each fused RMSNorm took its gamma (through Qwen2's
        from ember.onnx.importer import load  # TorchScript no-op Cast too)
        from ember.onnx.optimize import optimize

        graph = load(path, None)[0]
        optimize(graph)
        assert all(n.inputs[1] for n in graph.nodes if n.op_type == "RMSNorm")


@pytest.mark.parametrize(("name", "exporter"), [("distilbert", "torchscript"), ("vit", "dynamo"),
                                              ("clip_text", "torchscript-opset14"), ("vit", "dynamo-opset23")])
def test_architecture_on_wgpu(name: str, exporter: str, wgpu_be: ember.ComputeBackend) -> None:
    """One architecture per exporter on wgpu (lavapipe here: small sizes), outputs only: the opset-14 chains
    (LayerNorm, QuickGELU) and opset 23's native Gelu and Attention included."""
    arch = ARCHS[name]
    path = _export_or_xfail(arch, exporter)
    sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    model = ember.load_onnx(path, backend=wgpu_be)
    batch, length = SIZES[arch.kind][0]
    _compare(model, sess, arch.feeds(batch, length), f"{name}/{exporter} on wgpu")


def _rsqrt_rmsnorm(numerator: float, casts: bool = False) -> bytes:
    """x * (numerator / Sqrt(ReduceMean(x²) + eps)) * gamma: what TorchScript writes for T5's and Qwen2's
    `x * torch.rsqrt(var + eps)` when numerator is 1 (torch.rsqrt becomes Div(1, Sqrt)); with `casts`, Qwen2's
    Cast(to=float) of x before and of the normalized x before the gamma Mul."""
    from onnx import TensorProto, helper, numpy_helper

    gamma = np.random.default_rng(1).standard_normal(24).astype(np.float32)
    consts = {"two": 2.0, "eps": 1e-6, "num": numerator}
    inits = [numpy_helper.from_array(np.array(v, np.float32), k) for k, v in consts.items()]
    inits += [numpy_helper.from_array(gamma, "gamma"), numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    xc, nc = ("xc", "nc") if casts else ("x", "n")
    nodes = [helper.make_node("Pow", [xc, "two"], ["sq"]), helper.make_node("ReduceMean", ["sq", "axes"], ["var"]),
             helper.make_node("Add", ["var", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["s"]),
             helper.make_node("Div", ["num", "s"], ["inv"]), helper.make_node("Mul", [xc, "inv"], ["n"]),
             helper.make_node("Mul", ["gamma", nc], ["y"])]
    if casts:
        nodes = [helper.make_node("Cast", ["x"], ["xc"], to=TensorProto.FLOAT), *nodes[:-1],
                 helper.make_node("Cast", ["n"], ["nc"], to=TensorProto.FLOAT), nodes[-1]]
    x, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 7, 24]) for n in "xy")
    graph = helper.make_graph(nodes, "rsqrt_rmsnorm", [x], [y], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10).SerializeToString()


@pytest.mark.parametrize(("numerator", "casts", "fused"), [(1.0, False, 1), (1.0, True, 1), (2.0, False, 0)],
                         ids=["div_one", "div_one_casts", "div_two"])
def test_rmsnorm_with_div_one_over_sqrt_fuses(numerator: float, casts: bool, fused: int) -> None:
    """RMSNorm's 1/sqrt spelt Div(1, Sqrt(·)) fuses with its gamma, through a no-op Cast before the gamma Mul too;
    Div(2, Sqrt(·)) is not an RMSNorm."""
    from ember.onnx.importer import load
    from ember.onnx.optimize import optimize

    data = _rsqrt_rmsnorm(numerator, casts)
    model = ember.load_onnx(data, backend="cpu")
    assert model.rewrites["rmsnorm_fused"] == fused
    x = np.random.default_rng(0).standard_normal((3, 7, 24)).astype(np.float32)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(model.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    assert model.stats().get("rmsnorm.fused", 0) == fused
    if fused:
        graph = load(data, None)[0]
        optimize(graph)
        assert [(n.op_type, n.inputs[1]) for n in graph.nodes if n.op_type != "Cast"] == [("RMSNorm", "gamma")]

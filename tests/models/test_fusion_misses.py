"""Near misses are visible (issue 15): a graph that nearly holds a LayerNorm, RMSNorm, GELU, QuickGELU or attention
chain, rejected by one condition, reports that condition by name in `plan_info()["fusion_misses"]` (anchored at the
node that opens the pattern) and counts "<pattern>.near_miss" in `model.rewrites`; a fused arm an op declines at
plan time says why too (its "<pattern>.fallback[<node>]: <reason>" counter). Each graph still runs unfused and
gives ONNX Runtime's numbers. CLIP's quick_gelu (x * Sigmoid(1.702 x)) fuses, as does com.microsoft QuickGelu.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import ember

ort = pytest.importorskip("onnxruntime")

F32, F64 = TensorProto.FLOAT, TensorProto.DOUBLE
H = 8  # the normalised / hidden size


def build(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, list[int]]], outputs: dict[str, int],
          inits: dict[str, Any], opset: int = 18) -> bytes:
    """A model of `nodes` with shape inference's value_info, as exporters write it."""
    tensors = [numpy_helper.from_array(np.asarray(v, np.float32 if np.asarray(v).dtype.kind == "f" else None), k)
               for k, v in inits.items()]
    graph = helper.make_graph(nodes, "near_miss", [helper.make_tensor_value_info(k, t, s) for k, (t, s) in
                                                   inputs.items()],
                              [helper.make_tensor_value_info(k, t, None) for k, t in outputs.items()], tensors)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model).SerializeToString()


def node(op: str, ins: list[str], outs: list[str], name: str = "", **attrs: Any) -> onnx.NodeProto:
    return helper.make_node(op, ins, outs, name=name or outs[0], **attrs)


@dataclass
class Case:
    nodes: list[onnx.NodeProto]
    inputs: dict[str, tuple[int, list[int]]]
    inits: dict[str, Any] = field(default_factory=dict)
    outputs: dict[str, int] = field(default_factory=lambda: {"y": F32})
    misses: list[tuple[str, str, str]] = field(default_factory=list)  # (pattern, anchor node, reason's start)
    planned: list[tuple[str, str, str]] = field(default_factory=list)  # the same, of arms declined at plan time
    fused: dict[str, int] = field(default_factory=dict)  # rewrites that still apply


def layernorm(d_square: str = "d", eps: str = "eps", divide: bool = True) -> list[onnx.NodeProto]:
    """x -> (x - mean) / sqrt(var + eps) * gamma + beta over the last axis (its constants: ln_inits), with one
    ingredient changed: the squared value, epsilon's name, or a Mul by the reciprocal for the Div."""
    tail = [node("Div", ["d", "s"], ["n"])] if divide else \
        [node("Reciprocal", ["s"], ["r"]), node("Mul", ["d", "r"], ["n"])]
    return [node("ReduceMean", ["x", "axes"], ["mu"], "mean"), node("Sub", ["x", "mu"], ["d"]),
            node("Pow", [d_square, "exp"], ["sq"]), node("ReduceMean", ["sq", "vaxes"], ["var"], "var"),
            node("Add", ["var", eps], ["ve"]), node("Sqrt", ["ve"], ["s"]), *tail,
            node("Mul", ["n", "gamma"], ["g"]), node("Add", ["g", "beta"], ["y"])]


def ln_inits(exponent: float = 2.0, var_axes: tuple[int, ...] = (-1,), eps: bool = True) -> dict[str, Any]:
    rng = np.random.default_rng(1)
    out = {"axes": np.array([-1], np.int64), "vaxes": np.array(var_axes, np.int64), "exp": exponent,
           "gamma": rng.standard_normal(H), "beta": rng.standard_normal(H)}
    return {**out, "eps": 1e-5} if eps else out


def rmsnorm(numerator: float | None = None, normalised: str = "x", axes: tuple[int, ...] = (-1,),
            eps: str = "eps") -> tuple[list[onnx.NodeProto], dict[str, Any]]:
    """x * 1/sqrt(mean(x²) + eps) * gamma; Div(numerator, root) then Mul when numerator is given, else Div."""
    head = [node("Pow", ["x", "two"], ["sq"]), node("ReduceMean", ["sq", "axes"], ["ms"], "ms"),
            node("Add", ["ms", eps], ["ve"]), node("Sqrt", ["ve"], ["s"])]
    tail = [node("Div", [normalised, "s"], ["n"])] if numerator is None else \
        [node("Div", ["num", "s"], ["r"]), node("Mul", [normalised, "r"], ["n"])]
    inits = {"two": 2.0, "axes": np.array(axes, np.int64), "num": numerator or 1.0,
             "gamma": np.random.default_rng(2).standard_normal(H)}
    if eps == "eps":
        inits["eps"] = 1e-6
    return [*head, *tail, node("Mul", ["n", "gamma"], ["y"])], inits


def gelu(divisor: float = 1.4142135623730951, leak: bool = False, two: bool = False) -> Case:
    nodes = [node("Mul", ["x", "z"] if two else ["x", "one_x"], ["xz"]), node("Div", ["xz", "root"], ["u"]),
             node("Erf", ["u"], ["e"], "erf"), node("Add", ["e", "one"], ["p"]), node("Mul", ["xz", "p"], ["h"]),
             node("Mul", ["h", "half"], ["y"])]
    inputs = {"x": (F32, [2, 5, H]), **({"z": (F32, [2, 5, H])} if two else {})}
    return Case(nodes, inputs, {"one_x": 1.0, "root": divisor, "one": 1.0, "half": 0.5},
                outputs={"y": F32, **({"u": F32} if leak else {})})


def quickgelu(alpha: str = "alpha", gated: str = "x") -> Case:
    nodes = [node("Mul", ["x", alpha], ["ax"]), node("Sigmoid", ["ax"], ["sg"], "sig"),
             node("Mul", [gated, "sg"], ["y"])]
    inputs = {"x": (F32, [2, 5, H]), **({alpha: (F32, [1])} if alpha != "alpha" else {}),
              **({gated: (F32, [2, 5, H])} if gated != "x" else {})}
    return Case(nodes, inputs, {"alpha": 1.702} if alpha == "alpha" else {})


QKV = {"q": (F32, [1, 2, 4, H]), "kt": (F32, [1, 2, H, 4]), "v": (F32, [1, 2, 4, H])}


def attention(scale: str = "scale", axis: int = -1, mask: list[int] | None = None, cast: bool = False,
              probs_out: bool = False) -> Case:
    nodes = [node("MatMul", ["q", "kt"], ["qk"]), node("Div", ["qk", scale], ["sc"])]
    inputs = dict(QKV)
    scores = "sc"
    if mask is not None:
        nodes.append(node("Add", ["sc", "mask"], ["sm_in"]))
        inputs["mask"] = (F32, mask)
        scores = "sm_in"
    if scale != "scale":
        inputs[scale] = (F32, [1])
    nodes.append(node("Softmax", [scores], ["p"], "softmax", axis=axis))
    if cast:
        nodes += [node("Cast", ["p"], ["p64"], to=F64), node("Cast", ["v"], ["v64"], to=F64),
                  node("MatMul", ["p64", "v64"], ["y"])]
    else:
        nodes.append(node("MatMul", ["p", "v"], ["y"]))
    return Case(nodes, inputs, {"scale": float(np.sqrt(H))} if scale == "scale" else {},
                outputs={"y": F64 if cast else F32, **({"p": F32} if probs_out else {})})


LN_IN = {"x": (F32, [2, 5, H])}
Z_IN = {"z": (F32, [2, 5, H])}
DIFFERENT = "(different inputs)"
INNER_AXIS = "the chain reduces axis 1 of a rank-3 input, not the last"


def ln_case(inits: dict[str, Any], reason: str, **kw: Any) -> Case:
    """A LayerNorm chain whose near miss is reported at its first ReduceMean ("mean")."""
    nodes = kw.pop("nodes", layernorm())
    return Case(nodes, {**LN_IN, **kw.pop("inputs", {})}, inits, misses=[("layernorm", "mean", reason)], **kw)


def rms_case(reason: str, inputs: dict[str, tuple[int, list[int]]] | None = None, **kw: Any) -> Case:
    """An RMSNorm chain whose near miss is reported at its ReduceMean of the square ("ms")."""
    nodes, inits = rmsnorm(**kw)
    return Case(nodes, {**LN_IN, **(inputs or {})}, inits, misses=[("rmsnorm", "ms", reason)])


def with_misses(case: Case, anchor: str, pattern: str, reason: str) -> Case:
    case.misses = [(pattern, anchor, reason)]
    return case


EPS_IN = {"e_in": (F32, [1])}
CASES: dict[str, Case] = {
    "ln_eps_input": ln_case(ln_inits(eps=False), "epsilon is not a constant", nodes=layernorm(eps="e_in"),
                            inputs=EPS_IN),
    "ln_cube": ln_case(ln_inits(exponent=3.0), "the variance's square is a Pow whose exponent is not the constant 2"),
    # The variance of x, not of x - mean: neither a LayerNorm nor an RMSNorm of the divided value.
    "ln_var_of_x": Case(layernorm(d_square="x"), LN_IN, ln_inits(),
                        misses=[("layernorm", "mean", f"the variance is not the mean of (x - mean)² {DIFFERENT}"),
                                ("rmsnorm", "var", f"the Div normalises d, not the squared input x {DIFFERENT}")]),
    # The variance over another axis: no LayerNorm, but an RMSNorm of x - mean over axis 1, which runs decomposed.
    "ln_var_axes": ln_case(ln_inits(var_axes=(1,)), "the variance reduces axis 1, the mean axis -1 (different axes)",
                           fused={"rmsnorm_fused": 1},
                           planned=[("rmsnorm", "n/rmsnorm", INNER_AXIS)]),
    # Multiplied by the reciprocal: no LayerNorm, but the rest is an RMSNorm of x - mean, which fuses.
    "ln_reciprocal": ln_case(ln_inits(), "x - mean is not divided by the deviation", nodes=layernorm(divide=False),
                             fused={"rmsnorm_fused": 1}),
    "rms_div_two": rms_case("the root divides 2, not 1 (not 1/sqrt)", numerator=2.0),
    "rms_eps_input": rms_case("epsilon is not a constant", EPS_IN, eps="e_in"),
    "rms_other_input": rms_case(f"the Div normalises z, not the squared input x {DIFFERENT}", Z_IN, normalised="z"),
    "rms_two_axes": rms_case("the ReduceMean reduces axes [1, 2], not one", axes=(1, 2)),
    "gelu_constant": with_misses(gelu(divisor=1.5), "erf", "gelu", "no node after the Erf computes "
                                 "0.5·x·(1 + erf(x/√2)) of x: the closest is off by"),
    "gelu_leak": with_misses(gelu(leak=True), "erf", "gelu",
                             "the chain computes GELU, but its intermediate u has readers outside it"),
    "gelu_two_tensors": with_misses(gelu(two=True), "erf", "gelu",
                                    "the Erf's argument depends on 2 tensors ['x', 'z'], not one"),
    "quickgelu_alpha_input": with_misses(quickgelu(alpha="a_in"), "sig", "quickgelu", "alpha is not a constant"),
    "quickgelu_other_input": with_misses(quickgelu(gated="z"), "sig", "quickgelu",
                                         f"the Mul gates z, but the Sigmoid takes alpha · x {DIFFERENT}"),
    "attention_scale_input": with_misses(attention(scale="s_in"), "softmax", "attention",
                                         "the scale is not a constant (the scores' Div by s_in, a graph input)"),
    "attention_axis": with_misses(attention(axis=2), "softmax", "attention",
                                  "the Softmax is over axis 2, not the last"),
    "attention_mask_grows": with_misses(attention(mask=[3, 1, 1, 4]), "softmax", "attention",
                                        "the mask's shape (3, 1, 1, 4) does not broadcast to the scores' (1, 2, 4, 4)"),
    "attention_cast": with_misses(attention(cast=True), "softmax", "attention", "a Cast changes the probabilities' "
                                  "dtype between the Softmax and the MatMul with V (dtype mismatch)"),
    "attention_probs_read": with_misses(attention(probs_out=True), "softmax", "attention",
                                        "the probabilities have readers besides the MatMul with V"),
}


def reference(data: bytes, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """ONNX Runtime CPU on the graph as written: its own LayerNorm fusion takes the Pow(x - mean, 3) chain for a
    LayerNorm (giving numbers where the graph gives NaN), so its graph optimizations are off."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"]).run(None, feeds)


def feeds_of(case: Case, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {k: rng.standard_normal(shape).astype(np.float32) for k, (_, shape) in case.inputs.items()}
    for k in ("e_in", "s_in"):  # positive: an epsilon, a scale
        if k in out:
            out[k] = np.abs(out[k]) + (1e-5 if k == "e_in" else 2.0)
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_near_miss_reports_the_failed_condition(name: str) -> None:
    case = CASES[name]
    data = build(case.nodes, case.inputs, case.outputs, case.inits)
    model = ember.load_onnx(data, backend="cpu")
    feeds = feeds_of(case)
    refs = reference(data, feeds)
    got = model.run(feeds)
    for out, ref in zip(case.outputs, refs, strict=True):
        np.testing.assert_allclose(got[out], ref, rtol=1e-5, atol=1e-5, err_msg=out)
    misses, want = model.plan_info()["fusion_misses"], case.misses + case.planned
    assert [(m["pattern"], m["node"]) for m in misses] == [(p, n) for p, n, _ in want], misses
    for miss, (_, _, reason) in zip(misses, want, strict=True):
        assert miss["reason"].startswith(reason), (miss, reason)
    for pattern in ("layernorm", "rmsnorm", "gelu", "quickgelu", "attention"):
        want = sum(p == pattern for p, _, _ in case.misses)
        assert model.rewrites[f"{pattern}.near_miss"] == want, (pattern, model.rewrites)
        assert model.rewrites[f"{pattern}_fused"] == case.fused.get(f"{pattern}_fused", 0), model.rewrites


@pytest.mark.parametrize("name", ["layernorm", "rmsnorm", "gelu", "quickgelu", "attention"])
def test_the_unchanged_chain_fuses_without_a_near_miss(name: str) -> None:
    """Each near miss above is one change from a chain that fuses (the controls)."""
    rms_nodes, rms_inits = rmsnorm()
    case = {"layernorm": Case(layernorm(), LN_IN, ln_inits()), "rmsnorm": Case(rms_nodes, LN_IN, rms_inits),
            "gelu": gelu(), "quickgelu": quickgelu(), "attention": attention(mask=[1, 1, 1, 4])}[name]
    data = build(case.nodes, case.inputs, case.outputs, case.inits)
    model = ember.load_onnx(data, backend="cpu")
    feeds = feeds_of(case)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    np.testing.assert_allclose(model.run(feeds)["y"], ref, rtol=1e-5, atol=1e-5)
    assert model.rewrites[f"{name}_fused"] == 1 and model.rewrites[f"{name}.near_miss"] == 0
    assert model.plan_info()["fusion_misses"] == []
    stats = model.stats()
    assert stats[f"{name}.fused"] + stats.get(f"{name}.gemm", 0) == 1 and stats[f"{name}.fallback"] == 0, stats


def _layernorm_op(dtype: int, stats: bool) -> bytes:
    outs = ["y", "mean", "inv"] if stats else ["y"]
    n = helper.make_node("LayerNormalization", ["x", "gamma", "beta"], outs, name="ln", axis=-1, epsilon=1e-5)
    np_t = np.float64 if dtype == F64 else np.float32
    rng = np.random.default_rng(3)
    inits = [numpy_helper.from_array(rng.standard_normal(H).astype(np_t), k) for k in ("gamma", "beta")]
    graph = helper.make_graph([n], "ln", [helper.make_tensor_value_info("x", dtype, [2, 5, H])],
                              [helper.make_tensor_value_info(o, dtype, None) for o in outs], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.mark.parametrize(("dtype", "stats", "reason"), [
    (F64, False, "the input is float64, not float32 or float16"),
    (F32, True, "the Mean / InvStdDev outputs are read (the fused kernel keeps no statistics)"),
], ids=["float64", "stats_outputs"])
def test_a_declined_fused_arm_says_why(dtype: int, stats: bool, reason: str) -> None:
    data = _layernorm_op(dtype, stats)
    model = ember.load_onnx(data, backend="cpu")
    x = np.random.default_rng(0).standard_normal((2, 5, H)).astype(np.float64 if dtype == F64 else np.float32)
    refs = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})
    for got, ref in zip(model.run({"x": x}).values(), refs, strict=True):
        np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    assert model.plan_info()["fusion_misses"] == [{"pattern": "layernorm", "node": "ln", "reason": reason}]
    s = model.stats()
    assert s["layernorm.fallback"] == 1 and s["layernorm.fused"] == 0
    assert s[f"layernorm.fallback[ln]: {reason}"] == 1


def test_a_chain_over_an_inner_axis_runs_its_decomposition_and_says_why(backend_name: str) -> None:
    """A LayerNorm chain whose ReduceMeans reduce axis 1 of a 3-D input fuses into one node, which normalises that
    axis alone (the fused kernel's trailing dims would be axes 1 and 2): equal to ONNX Runtime, reported."""
    nodes = layernorm()
    inits = {**ln_inits(), "axes": np.array([1], np.int64), "vaxes": np.array([1], np.int64)}
    inits["gamma"], inits["beta"] = inits["gamma"][:1], inits["beta"][:1]  # scalars broadcast on any axis
    data = build(nodes, LN_IN, {"y": F32}, inits)
    model = ember.load_onnx(data, backend=backend_name)
    x = np.random.default_rng(4).standard_normal((2, 5, H)).astype(np.float32)
    ref = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(model.run({"x": x})["y"], ref, rtol=1e-5, atol=1e-5)
    assert model.rewrites["layernorm_fused"] == 1
    (miss,) = model.plan_info()["fusion_misses"]
    assert (miss["pattern"], miss["reason"]) == ("layernorm", INNER_AXIS)
    assert model.stats()["layernorm.fallback"] == 1


def _quickgelu_model(contrib: bool) -> bytes:
    """Linear -> x * Sigmoid(1.702 x) (CLIP's quick_gelu as torch exports it) or com.microsoft QuickGelu."""
    rng = np.random.default_rng(5)
    w = numpy_helper.from_array(rng.standard_normal((H, 16)).astype(np.float32), "w")
    if contrib:
        act = [helper.make_node("QuickGelu", ["h"], ["y"], domain="com.microsoft", alpha=1.702)]
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        inits = [w]
    else:
        act = [node("Mul", ["h", "alpha"], ["ah"]), node("Sigmoid", ["ah"], ["sg"]), node("Mul", ["h", "sg"], ["y"])]
        opsets = [helper.make_opsetid("", 17)]
        inits = [w, numpy_helper.from_array(np.array(1.702, np.float32), "alpha")]
    graph = helper.make_graph([node("MatMul", ["x", "w"], ["h"]), *act], "quickgelu",
                              [helper.make_tensor_value_info("x", F32, ["batch", 5, H])],
                              [helper.make_tensor_value_info("y", F32, None)], inits)
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


@pytest.mark.parametrize("contrib", [False, True], ids=["chain", "com_microsoft"])
def test_quickgelu_fuses(backend_name: str, contrib: bool) -> None:
    data = _quickgelu_model(contrib)
    model = ember.load_onnx(data, backend=backend_name)
    sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = 3 * np.random.default_rng(batch).standard_normal((batch, 5, H)).astype(np.float32)
        np.testing.assert_allclose(model.run({"x": x})["y"], sess.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
    assert model.rewrites["quickgelu_fused"] == (0 if contrib else 1)
    stats = model.stats()
    assert stats["quickgelu.fused"] == 2 and stats["quickgelu.fallback"] == 0 and stats["gelu.fused"] == 0, stats
    # The activation rides in the MatMul's epilogue: no elementwise kernel of its own.
    assert stats["elementwise.kernels"] == 0, stats

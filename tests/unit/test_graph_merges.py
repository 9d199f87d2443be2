"""The load-time rewrites that cut a decode step's kernels: RotateHalf (transformers' rotate_half rotary),
MatMuls side by side (one wide product for Q/K/V and gate/up), common subexpressions, and the run-time ones:
Reshape as a view of strided data, a MatMul's result reshaped while still lazy, a residual Add in the product's
epilogue, a Concat as one kernel. Each graph is built with onnx.helper, run on every backend and compared with
ONNX Runtime CPU; the counts say the rewrite happened."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import ember
from ember.core.view import View

F = TensorProto.FLOAT


def _model(nodes: list, inputs: list, outputs: list, inits: dict[str, np.ndarray], opset: int = 17) -> bytes:
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return model.SerializeToString()


def _compare(model: bytes, feeds: dict[str, np.ndarray], backend: str, tol: float = 1e-5) -> ember.Model:
    m = ember.load_onnx(model, backend=backend)
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    want = sess.run(names, feeds)
    got = m.run(feeds)
    for name, w in zip(names, want, strict=True):
        g = np.asarray(got[name])
        assert g.shape == w.shape, (name, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=tol, atol=tol * max(1.0, float(np.abs(w).max())))
    return m


def _const(name: str, value: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, np.int64)))


def _rotary(shape: tuple, cos_shape: tuple, slice_axis: int, cat_axis: int, bounds: tuple, dyn_end: bool) -> bytes:
    """x * cos + Concat(-x[a2:b2], x[a1:b1]) * sin, the slices along slice_axis, the Concat along cat_axis; with
    `dyn_end` the second slice's end is computed from x's shape (as the TorchScript exporter writes it)."""
    a1, b1, a2, b2 = bounds
    nodes = [_const("a1", [a1]), _const("b1", [b1]), _const("a2", [a2]), _const("ax", [slice_axis])]
    if dyn_end:
        nodes += [helper.make_node("Shape", ["x"], ["shp"]), _const("i", [slice_axis]),
                  helper.make_node("Gather", ["shp", "i"], ["b2"])]
    else:
        nodes.append(_const("b2", [b2]))
    nodes += [helper.make_node("Slice", ["x", "a1", "b1", "ax"], ["x1"]),
              helper.make_node("Slice", ["x", "a2", "b2", "ax"], ["x2"]),
              helper.make_node("Neg", ["x2"], ["nx2"]),
              helper.make_node("Concat", ["nx2", "x1"], ["rot"], axis=cat_axis),
              helper.make_node("Mul", ["x", "cos"], ["xc"]),
              helper.make_node("Mul", ["rot", "sin"], ["rs"]),
              helper.make_node("Add", ["xc", "rs"], ["y"])]
    ins = [helper.make_tensor_value_info("x", F, list(shape)), helper.make_tensor_value_info("cos", F, list(cos_shape)),
           helper.make_tensor_value_info("sin", F, list(cos_shape))]
    return _model(nodes, ins, [helper.make_tensor_value_info("y", F, None)], {})


ROTARY = {
    "hf-half": ((2, 3, 5, 8), (2, 1, 5, 8), -1, -1, (0, 4, 4, 2**62), False),
    "hf-shape-end": ((2, 3, 5, 8), (1, 1, 5, 8), 3, -1, (0, 4, 4, 0), True),
    "uneven": ((1, 2, 3, 10), (10,), -1, 3, (1, 4, 3, 100), False),  # x[3:] then x[1:4]: 7 + 3 columns
    # slices of axis 2 concatenated on axis 1, the halves (2, 2, 1) broadcast against x * cos (2, 2, 2)
    "other-axes": ((2, 1, 2), (1, 2, 1), 2, 1, (0, 1, 1, 2), False),
}


@pytest.mark.parametrize("case", sorted(ROTARY))
def test_rotate_half_matches_onnxruntime(backend_name: str, case: str) -> None:
    shape, cos_shape, sa, ca, bounds, dyn = ROTARY[case]
    rng = np.random.default_rng(0)
    model = _rotary(shape, cos_shape, sa, ca, bounds, dyn)
    feeds = {"x": rng.standard_normal(shape).astype(np.float32),
             "cos": rng.standard_normal(cos_shape).astype(np.float32),
             "sin": rng.standard_normal(cos_shape).astype(np.float32)}
    m = _compare(model, feeds, backend_name)
    assert m.rewrites["rotary_fused"] == 1
    # One kernel on wgpu; on cpu the two halves' copies and the mix (numpy's slices beat computed indices there).
    assert m.plan_info(feeds)["steps"] == (1 if backend_name == "wgpu" else 3)
    assert m.plan_info(feeds)["rotary.fused"] == 1


def test_rotate_half_near_miss_names_why() -> None:
    """Every second column as the second half (a step of 2): not rotate_half; the near miss says which check failed."""
    model = onnx.load_from_string(_rotary((2, 3, 5, 8), (2, 1, 5, 8), -1, -1, (0, 8, 4, 8), False))
    for n in model.graph.node:
        if n.op_type == "Slice" and n.output[0] == "x1":
            n.input.append("two")
    model.graph.node.insert(0, _const("two", [2]))
    m = ember.load_onnx(model.SerializeToString(), backend="cpu")
    assert m.rewrites["rotary_fused"] == 0
    assert [x["reason"] for x in m.rewrites.misses if x["pattern"] == "rotary"] == \
        ["the Slice's steps are not a constant 1"]


def _parallel(biased: list[bool], k: int = 12, widths: tuple = (8, 4, 4)) -> tuple[bytes, dict]:
    rng = np.random.default_rng(1)
    nodes, inits, outs = [helper.make_node("Relu", ["x"], ["h"])], {}, []
    for i, (b, n) in enumerate(zip(biased, widths, strict=False)):
        inits[f"w{i}"] = rng.standard_normal((k, n)).astype(np.float32)
        nodes.append(helper.make_node("MatMul", ["h", f"w{i}"], [f"p{i}"]))
        out = f"p{i}"
        if b:
            inits[f"b{i}"] = rng.standard_normal(n).astype(np.float32)
            nodes.append(helper.make_node("Add", [f"b{i}", f"p{i}"], [f"y{i}"]))
            out = f"y{i}"
        nodes.append(helper.make_node("Tanh", [out], [f"o{i}"]))
        outs.append(helper.make_tensor_value_info(f"o{i}", F, None))
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3, k])], outs, inits)
    return model, {"x": rng.standard_normal((2, 3, k)).astype(np.float32)}


@pytest.mark.parametrize("biased, merged", [([False, False, False], 2), ([True, True, True], 2),
                                            ([True, False, True], 1)])
def test_parallel_matmuls_merge(backend_name: str, biased: list[bool], merged: int) -> None:
    model, feeds = _parallel(biased)
    m = _compare(model, feeds, backend_name)
    assert m.rewrites["matmuls_merged"] == merged


def test_duplicates_merge(backend_name: str) -> None:
    """Two copies of one mask computation (an exporter's per layer), with equal constants under different names."""
    inits = {"zero_a": np.zeros(1, np.float32), "zero_b": np.zeros(1, np.float32),
             "low_a": np.full(1, -1e9, np.float32), "low_b": np.full(1, -1e9, np.float32)}
    nodes = [helper.make_node("Greater", ["x", "zero_a"], ["c"]),
             helper.make_node("Where", ["c", "zero_a", "low_a"], ["m1"]),
             helper.make_node("Where", ["c", "zero_b", "low_b"], ["m2"]),
             helper.make_node("Add", ["m1", "x"], ["o1"]), helper.make_node("Mul", ["m2", "x"], ["o2"])]
    outs = [helper.make_tensor_value_info(n, F, None) for n in ("o1", "o2")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [4, 5])], outs, inits)
    x = np.random.default_rng(2).standard_normal((4, 5)).astype(np.float32)
    m = _compare(model, {"x": x}, backend_name)
    assert m.rewrites["duplicates_merged"] == 1


def test_linear_residual_and_reshape_in_one_kernel(backend_name: str) -> None:
    """GPT-2's Conv1D: Gemm on the rows, Reshape back to 3-D, then the residual Add and a GELU: one kernel each
    for the two Linears, and the attention-style Split -> Reshape -> Transpose reads need no copy."""
    rng = np.random.default_rng(3)
    d = 16
    inits = {"w1": rng.standard_normal((d, 3 * d)).astype(np.float32), "b1": rng.standard_normal(3 * d).astype(
        np.float32), "w2": rng.standard_normal((d, d)).astype(np.float32), "b2": rng.standard_normal(d).astype(
        np.float32), "rows": np.array([-1, d], np.int64), "back": np.array([1, 5, d], np.int64),
        "heads": np.array([1, 5, 4, 4], np.int64), "flat": np.array([1, 5, 3 * d], np.int64)}
    nodes = [helper.make_node("Reshape", ["x", "rows"], ["x2"]),
             helper.make_node("Gemm", ["x2", "w1", "b1"], ["qkv2"]),
             helper.make_node("Reshape", ["qkv2", "flat"], ["qkv"]),
             helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=2, num_outputs=3),
             helper.make_node("Reshape", ["k", "heads"], ["kh"]),
             helper.make_node("Transpose", ["kh"], ["kt"], perm=[0, 2, 1, 3]),
             helper.make_node("Reshape", ["v", "rows"], ["v2"]),
             helper.make_node("Gemm", ["v2", "w2", "b2"], ["p2"]),
             helper.make_node("Reshape", ["p2", "back"], ["p"]),
             helper.make_node("Add", ["p", "x"], ["r"]),
             helper.make_node("Gelu", ["r"], ["y"])]
    outs = [helper.make_tensor_value_info(n, F, None) for n in ("y", "kt", "q")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [1, 5, d])], outs, inits, opset=20)
    feeds = {"x": rng.standard_normal((1, 5, d)).astype(np.float32)}
    m = _compare(model, feeds, backend_name, tol=1e-4)
    info = m.plan_info(feeds)
    # Two Gemms (GELU and the residual in the second's epilogue) and the copies of the graph outputs kt and q,
    # which are strided views of the first Gemm's result.
    # Two Gemms (the residual Add and the GELU in the second's epilogue; cpu adds the residual in a step of its
    # own after the product's bias) and the copies of the graph outputs kt and q, strided views of the first's.
    assert info["steps"] == (4 if backend_name == "wgpu" else 5), info
    assert info["epilogue.fused"] == 2
    m_plain = ember.load_onnx(model, backend=backend_name, fuse=False)
    assert m_plain.plan_info(feeds)["steps"] > info["steps"]


def test_concat_of_a_grown_cache(backend_name: str) -> None:
    """A KV cache grown by one row (Concat on axis 2), as every decode step does: one kernel on wgpu."""
    rng = np.random.default_rng(4)
    nodes = [helper.make_node("Concat", ["past", "new"], ["present"], axis=2)]
    ins = [helper.make_tensor_value_info("past", F, [1, 2, 37, 8]), helper.make_tensor_value_info("new", F,
                                                                                                    [1, 2, 1, 8])]
    model = _model(nodes, ins, [helper.make_tensor_value_info("present", F, None)], {})
    feeds = {"past": rng.standard_normal((1, 2, 37, 8)).astype(np.float32),
             "new": rng.standard_normal((1, 2, 1, 8)).astype(np.float32)}
    m = _compare(model, feeds, backend_name, tol=0)
    assert m.plan_info(feeds)["steps"] == (1 if backend_name == "wgpu" else 2)


def _numpy_can_view(a: np.ndarray, shape: tuple) -> bool:
    b = a.view()
    try:
        b.shape = shape
    except AttributeError:
        return False
    return True


@st.composite
def _views(draw: st.DrawFn) -> tuple[View, tuple]:
    rank = draw(st.integers(1, 4))
    base = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 4, 6]), min_size=rank, max_size=rank)))
    v = View.contiguous(0, np.float64, base, draw(st.integers(0, 4))).permute(draw(st.permutations(range(rank))))
    axis = draw(st.integers(0, rank - 1))
    if v.shape[axis] > 1 and draw(st.booleans()):
        start = draw(st.integers(0, v.shape[axis] - 1))
        length = draw(st.integers(1, v.shape[axis] - start))
        shape = list(v.shape)
        shape[axis] = length
        v = View(0, v.dtype, tuple(shape), v.strides, v.offset + start * v.strides[axis])
    if draw(st.booleans()):
        at = draw(st.integers(0, v.shape.__len__()))
        v = View(0, v.dtype, v.shape[:at] + (1,) + v.shape[at:], v.strides[:at] + (draw(st.integers(0, 9)),)
                 + v.strides[at:], v.offset)
    size = v.size
    target, rest = [], size
    for _ in range(draw(st.integers(0, 3))):
        f = draw(st.sampled_from([d for d in range(1, rest + 1) if rest % d == 0]))
        target.append(f)
        rest //= f
    target.append(rest)
    return v, tuple(draw(st.permutations(target)))


@settings(max_examples=400, deadline=None)
@given(_views())
def test_view_reshaped_is_numpys_view_rule(case: tuple[View, tuple]) -> None:
    v, shape = case
    buf = np.arange(4096, dtype=np.float64)

    def realize(w: View) -> np.ndarray:
        return np.lib.stride_tricks.as_strided(buf[w.offset:], w.shape, [s * 8 for s in w.strides])

    a = realize(v)
    r = v.reshaped(shape)
    assert (r is not None) == _numpy_can_view(a, shape)
    if r is not None:
        np.testing.assert_array_equal(realize(r), a.reshape(shape))
        assert r.shape == shape


def test_is_contiguous_ignores_strides_of_size_one_dims() -> None:
    assert View(0, np.float32, (1, 4, 1, 3), (99, 3, 7, 1)).is_contiguous()
    assert not View(0, np.float32, (2, 3), (1, 2)).is_contiguous()
    assert View(0, np.float32, (1, 1, 768), (2304, 2304, 1), 768).is_contiguous()  # a Split of a fused QKV row


def test_duplicates_merge_into_subgraphs(backend_name: str) -> None:
    """A constant merged with an equal one is renamed inside the If branches that read it from the outer graph."""
    inits = {"one_a": np.ones(1, np.float32), "one_b": np.ones(1, np.float32)}
    then_g = helper.make_graph([helper.make_node("Add", ["x", "one_b"], ["t"])], "then", [],
                               [helper.make_tensor_value_info("t", F, [3])])
    else_g = helper.make_graph([helper.make_node("Sub", ["x", "one_b"], ["e"])], "else", [],
                               [helper.make_tensor_value_info("e", F, [3])])
    nodes = [helper.make_node("Mul", ["x", "one_a"], ["y0"]),
             helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
             helper.make_node("Greater", ["s", "one_a"], ["c0"]),
             helper.make_node("Squeeze", ["c0"], ["c"]),
             helper.make_node("If", ["c"], ["y1"], then_branch=then_g, else_branch=else_g)]
    outs = [helper.make_tensor_value_info(n, F, None) for n in ("y0", "y1")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [3])], outs, inits)
    for x in (np.array([1.0, 2.0, 3.0], np.float32), np.array([-1.0, 0.5, 0.0], np.float32)):
        m = _compare(model, {"x": x}, backend_name)
    assert m.rewrites["duplicates_merged"] == 0  # two equal constants are one name, not a node
    assert "one_b" not in m.graph.initializers


def test_parallel_matmuls_merge_in_float16(wgpu_be: ember.ComputeBackend) -> None:
    model, feeds = _parallel([True, True, True])
    m = ember.load_onnx(model, backend="wgpu", precision="f16")
    sess = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    for name, want in zip([o.name for o in sess.get_outputs()], sess.run(None, feeds), strict=True):
        np.testing.assert_allclose(np.asarray(m.run(feeds)[name]), want, atol=2e-2, rtol=2e-2)
    assert m.rewrites["matmuls_merged"] == 2
